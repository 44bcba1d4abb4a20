"""The one wire: every request specadapt sends to a server goes through this package.

Modules:
  ``sse``     ``SSEParser``/``SSEError``: server-sent events framing (pure).
  ``openai``  the OpenAI shapes every caller shares (pure): ``first_choice``, the /tokenize body and
              answer, the server's error sentence of a non-2xx body.
  ``http``    ``Wire`` (httpx): sync GET/POST, async JSON POST, low-volume event streams, and the one
              mapping of transport faults and statuses to specadapt's errors.
  ``stream``  ``StreamClient``/``connect`` (aiohttp): the load client's streamed requests.

Two HTTP libraries, each used only here. aiohttp carries the load client's streams: measured under
the same SSE parser (docs/benchmarks.md, "Probe client load: sustainable concurrency", 2026-12-01,
2-core x86_64), httpx as the transport cost 0.17-0.18 ms of CPU per chunk and sustained 802 chunks/s
at 512 streams, aiohttp 0.047 ms and 2,643 chunks/s. httpx carries everything else (sync GETs and
POSTs, async JSON posts, low-volume streams), so that tests fake every JSON call with one transport,
``httpx.MockTransport``, which serves both the sync and the async client.

This ``__init__`` imports neither library: pure code may import ``sse`` and ``openai`` alone.
"""

from __future__ import annotations

import ssl

Verify = bool | str | ssl.SSLContext
"""TLS verification as httpx reads it: on (certifi's bundle), a CA bundle path, a context, or off."""

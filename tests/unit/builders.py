"""What the unit tests build again and again: a request record and a server's description, with
every field a test is not about filled in once here. A test passes only the fields it is about
(``request(side="on", tokens=[...])``, ``server(dtype="float32")``); files whose records need a
shape of their own (chunk times from latencies, a clock) wrap these.

Import as ``from builders import request, server`` (tests/unit is on pytest's import path)."""

from __future__ import annotations

from typing import Any

from specadapt.records import RequestRecord, ServerInfo


def request(**fields: Any) -> RequestRecord:
    """A finished (ok) request of prompt "p", category "c", on the chat API, unless ``fields`` say otherwise."""
    return RequestRecord(**{"prompt_id": "p", "category": "c", "api": "chat", "ok": True, **fields})


def server(**fields: Any) -> ServerInfo:
    """A vLLM server at http://127.0.0.1:1 serving model "m", unless ``fields`` say otherwise."""
    return ServerInfo(**{"backend": "vllm", "base_url": "http://127.0.0.1:1", "model_id": "m", **fields})

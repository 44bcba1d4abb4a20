"""Triage of a divergence by asking a server: the spec-off server's top logprobs at the position
(its verdict: analysis/identity.py), and token ids made readable through its /detokenize."""

from __future__ import annotations

from typing import Any

import httpx

from specadapt.adapters.base import Server
from specadapt.analysis.identity import TOP_LOGPROBS, token_id, triage_from_logprobs
from specadapt.load.client import build_body
from specadapt.records import Divergence, Prompt, RequestSettings, Triage


def post_json(server: Server, path: str, body: dict[str, Any], timeout_s: float,
              headers: dict[str, str] | None = None) -> httpx.Response:
    """One non-streamed POST to ``server`` with its auth and TLS settings (and ``headers`` besides)."""
    return httpx.post(server.base_url + path, json=body, headers={**server.headers(), **(headers or {})},
                      timeout=timeout_s, verify=server.verify)


def _triage_body(prompt: Prompt, model: str, settings: RequestSettings, n_tokens: int) -> tuple[str, dict]:
    req = settings.model_copy(update={"logprobs": True, "top_logprobs": TOP_LOGPROBS})
    path, body = build_body(prompt, model, req)
    body.update(stream=False, max_tokens=n_tokens)
    body.pop("stream_options", None)
    return path, body


def server_triage(server: Server, prompt: Prompt, settings: RequestSettings, div: Divergence,
                  off_tokens: list[str], threshold: float, timeout_s: float = 120.0) -> Triage:
    """Ask the spec-off server for its top logprobs at the divergence and classify."""
    if div.token_index < 0:
        return Triage(verdict="unknown", source="none", threshold=threshold,
                      note="the servers returned no tokens (no logprobs), so no position to triage")
    i = div.token_index
    path, body = _triage_body(prompt, server.model_id, settings, i + 1)
    try:
        data = post_json(server, path, body, timeout_s).json()
        choice = data["choices"][0]
    except (httpx.HTTPError, ValueError, KeyError, IndexError) as exc:
        return Triage(verdict="unknown", source="none", threshold=threshold,
                      note=f"could not get logprobs from the spec-off server: {type(exc).__name__}")
    return triage_from_logprobs(choice, prompt.api, div, off_tokens, threshold)


def readable_tokens(server: Server, divergences: list[Divergence]) -> None:
    """Replace "token_id:N" in divergences by the token's text, via the server's POST /detokenize
    (vLLM); left as ids where the server cannot say."""
    for d in divergences:
        d.off_token = _readable(server, d.off_token)
        d.on_token = _readable(server, d.on_token)


def _readable(server: Server, token: str | None) -> str | None:
    """"token_id:N" -> "text (id N)" when the server can detokenize N; anything else unchanged."""
    tid = token_id(token or "")
    if tid is None:
        return token
    try:
        resp = post_json(server, "/detokenize", {"model": server.model_id, "tokens": [tid]}, 10)
        text = resp.json()["prompt"] if resp.status_code == 200 else None
    except (httpx.HTTPError, ValueError, KeyError):
        text = None
    return f"{text} (id {tid})" if isinstance(text, str) else token



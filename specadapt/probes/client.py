"""Async streaming OpenAI client: one request, every chunk's arrival time and token count.

Tokens per chunk. Under speculative decoding one SSE chunk can carry several tokens
(k accepted + the bonus token), so a per-chunk inter-token latency would be several
times too large. We ask for ``stream_options: {include_usage, continuous_usage_stats}``
(vLLM then puts the cumulative ``usage.completion_tokens`` on every chunk) and
``logprobs`` (one entry per token). The count of a chunk is, in order of preference:
  1. ``usage``: the difference of cumulative completion_tokens: exact, counts tokens
     that detokenize to nothing, and is what the server's own counters count;
  2. ``logprobs``: the number of logprob entries in the chunk (servers without
     continuous usage);
  3. ``chunks``: 1 per chunk with text (the last resort; flagged in the report).
A usage difference needs the count before the chunk: once a token chunk came without
usage (a server that puts usage on the last chunk only), the chunks after it are counted
by (2) or (3) until usage is back on every chunk; the final ``usage.completion_tokens`` is
still the request's output token count when present.

Clock. Every time comes from ``clock`` (integer nanoseconds; default ``time.perf_counter_ns``,
CLOCK_MONOTONIC on Linux: the clock of the runner's ``run_t0_ns`` and of the scripted
server's log). It is read at the first send (t0), when each SSE event has been parsed
(the chunk's arrival) and after ``[DONE]`` or the end of the stream (E2E). A test passes a
fake clock that its transport advances as it hands out bytes, and gets exact times.

Faults never raise: each failed request gets ``error`` (one line) and ``error_kind``.
Retries are off by default because a retried request's latency is not a server's
latency; with ``retries`` > 0, a request that got HTTP 429/500/502/503/504 or could not
connect, before any token, is sent again (its times then run from the first send, and
the report keeps such requests apart).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

import httpx
from httpx_sse import SSEError, aconnect_sse

from specadapt.records import (
    ErrorKind,
    Prompt,
    RequestRecord,
    RequestSettings,
    TokenSource,
)

RETRYABLE_STATUS = (429, 500, 502, 503, 504)

Clock = Callable[[], int]
"""A monotonic clock in integer nanoseconds."""


def build_body(prompt: Prompt, model: str, settings: RequestSettings) -> tuple[str, dict[str, Any]]:
    """(path, JSON body) for one streamed, by default greedy, request."""
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": prompt.max_tokens or settings.max_tokens,
        "temperature": settings.temperature,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    if settings.seed is not None:
        body["seed"] = settings.seed
    body.update(settings.extra_body)
    if prompt.api == "chat":
        body["messages"] = [m.model_dump() for m in prompt.messages or []]
        if settings.logprobs:
            body["logprobs"] = True
            body["top_logprobs"] = settings.top_logprobs
        return "/v1/chat/completions", body
    body["prompt"] = prompt.prompt
    if settings.logprobs:
        body["logprobs"] = settings.top_logprobs
    return "/v1/completions", body


def _chunk_logprobs(choice: dict[str, Any], api: str) -> tuple[list[str], list[float], list[dict[str, float]]]:
    lp = choice.get("logprobs")
    if not lp:
        return [], [], []
    if api == "chat":
        entries = lp.get("content") or []
        tokens = [e.get("token", "") for e in entries]
        values = [float(e.get("logprob", 0.0)) for e in entries]
        tops = [{t["token"]: float(t["logprob"]) for t in e.get("top_logprobs") or []} for e in entries]
        return tokens, values, tops
    tokens = list(lp.get("tokens") or [])
    values = [float(v) if v is not None else 0.0 for v in lp.get("token_logprobs") or []]
    tops = [{k: float(v) for k, v in (t or {}).items()} for t in lp.get("top_logprobs") or []]
    return tokens, values, tops


def _delta_text(choice: dict[str, Any], api: str) -> str:
    if api == "chat":
        return (choice.get("delta") or {}).get("content") or ""
    return choice.get("text") or ""


async def stream_request(client: httpx.AsyncClient, prompt: Prompt, model: str, settings: RequestSettings,
                         run_t0_ns: int, repeat: int = 0, warmup: bool = False, *,
                         clock: Clock = time.perf_counter_ns) -> RequestRecord:
    """Send one streamed request and record it; never raises for server or network faults.

    ``run_t0_ns`` and ``clock`` must be the same clock: ``sent_at_ns`` is their difference."""
    path, body = build_body(prompt, model, settings)
    t0 = clock()
    earlier: list[str] = []
    for attempt in range(1, settings.retries + 2):
        rec = RequestRecord(prompt_id=prompt.id, category=prompt.category, api=prompt.api, repeat=repeat,
                            warmup=warmup, sent_at_ns=t0 - run_t0_ns, attempts=attempt, retried_errors=earlier)
        await _attempt(client, path, body, rec, t0, settings.request_timeout_s, clock)
        if rec.ok or attempt > settings.retries or not _retryable(rec):
            return rec
        earlier = [*earlier, rec.error or ""]
        await asyncio.sleep(settings.retry_backoff_s * attempt)
    raise AssertionError("unreachable")


async def _attempt(client: httpx.AsyncClient, path: str, body: dict[str, Any], rec: RequestRecord, t0: int,
                   timeout_s: float, clock: Clock) -> None:
    try:
        await asyncio.wait_for(_consume(client, path, body, rec, t0, clock), timeout=timeout_s)
    except asyncio.TimeoutError:
        rec.error, rec.error_kind = f"timed out after {timeout_s:g} s", "timeout"
    except (httpx.HTTPError, SSEError) as exc:
        rec.error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else 'no detail'}"[:300]
        rec.error_kind = _kind_of(exc)
    rec.ok = rec.error is None and rec.output_tokens > 0
    if rec.error is None and rec.output_tokens == 0:
        rec.error, rec.error_kind = "stream ended without any output token", "no_tokens"


def _kind_of(exc: Exception) -> ErrorKind:
    if isinstance(exc, httpx.TimeoutException):
        return "timeout"
    if isinstance(exc, httpx.ConnectError):
        return "connect"
    if isinstance(exc, (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)):
        return "disconnect"
    if isinstance(exc, SSEError):
        return "malformed"
    return "other"


def _retryable(rec: RequestRecord) -> bool:
    """Only faults before any token: a resend then cannot double-count output."""
    if rec.chunk_ns:
        return False
    return rec.error_kind == "connect" or (rec.error_kind == "http_status" and rec.status_code in RETRYABLE_STATUS)


async def _consume(client: httpx.AsyncClient, path: str, body: dict[str, Any], rec: RequestRecord, t0: int,
                   clock: Clock) -> None:
    usage_base: int | None = 0  # completion_tokens before this chunk; None once a token chunk lacked usage
    usage_total: int | None = None
    done = False
    async with aconnect_sse(client, "POST", path, json=body) as source:
        resp = source.response
        rec.status_code = resp.status_code
        if resp.status_code != 200:
            detail = (await resp.aread()).decode(errors="replace")[:200].replace("\n", " ")
            rec.error, rec.error_kind = f"HTTP {resp.status_code}: {detail}", "http_status"
            return
        async for event in source.aiter_sse():
            now = clock()
            if event.data.strip() == "[DONE]":
                done = True
                break
            try:
                chunk = json.loads(event.data)
            except ValueError:
                rec.error, rec.error_kind = f"malformed SSE data: {event.data[:80]!r}", "malformed"
                return
            if "error" in chunk and not chunk.get("choices"):
                rec.error = f"server error in stream: {str(chunk['error'])[:200]}"
                rec.error_kind = "server_error"
                return
            usage = chunk.get("usage") or {}
            choices = chunk.get("choices") or []
            text, tokens, values, tops, finish = "", [], [], [], None
            for choice in choices[:1]:
                text = _delta_text(choice, rec.api)
                tokens, values, tops = _chunk_logprobs(choice, rec.api)
                finish = choice.get("finish_reason")
            n, source_kind = _count_tokens(usage, usage_base, tokens, text)
            if usage.get("completion_tokens") is not None:
                usage_total = usage_base = int(usage["completion_tokens"])
            elif n > 0:
                usage_base = None
            if usage.get("prompt_tokens") is not None:
                rec.prompt_tokens = int(usage["prompt_tokens"])
            if n > 0 and choices:
                rec.chunk_ns.append(now - t0)
                rec.chunk_tokens.append(n)
                rec.token_source = _weaker(rec.token_source, source_kind)
            rec.text += text
            rec.tokens += tokens
            rec.token_logprobs += values
            rec.top_logprobs += tops
            if finish:
                rec.finish_reason = finish
        rec.e2e_ns = clock() - t0
    rec.output_tokens = usage_total or sum(rec.chunk_tokens)
    if not done:
        rec.error, rec.error_kind = "stream ended without [DONE]", "no_done"


def _count_tokens(usage: dict[str, Any], before: int | None, tokens: list[str],
                  text: str) -> tuple[int, TokenSource]:
    if usage.get("completion_tokens") is not None and before is not None:
        return int(usage["completion_tokens"]) - before, "usage"
    if tokens:
        return len(tokens), "logprobs"
    return (1 if text else 0), "chunks"


_RANK = {"usage": 0, "logprobs": 1, "chunks": 2}


def _weaker(current: TokenSource | None, new: TokenSource) -> TokenSource:
    """The least exact source seen in a request is the one the request is labelled with."""
    if current is None or _RANK[new] > _RANK[current]:
        return new
    return current

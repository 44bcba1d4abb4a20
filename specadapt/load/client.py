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
server's log). It is read at the first send (t0), when each SSE event has been framed
(the chunk's arrival: the read that brought its last byte) and after ``[DONE]`` or the end
of the stream (E2E). A test passes a fake clock that its transport advances as it hands
out bytes, and gets exact times.

Layers. The parsing is pure and fed bytes: ``specadapt.wire.sse.SSEParser`` frames events
(``data:`` lines, multi-line data, comments, CRLF/CR/LF line ends, events split over reads or
several in one read) and ``StreamState`` turns each event's data into the record (orjson). The
transport is the wire's ``specadapt.wire.stream.StreamClient`` (aiohttp: the body is read as it
arrives, no per-line machinery of a general HTTP library), made by ``specadapt.wire.stream.connect``
(``load.spread.client_for`` for a server); anything with its ``post_stream`` method
(``specadapt.wire.stream.Transport``) can stand in for it (the unit tests' scripted transport), and
``wire.stream.error_kind``/``describe`` turn its faults into the record's. About 0.05 ms of CPU per
chunk at 500 streams and more, 10 us of it parsing (docs/benchmarks.md), against 0.17-0.18 ms with
httpx as the transport.

Speculation per request. Where the answer itself states the request's drafted and accepted
draft tokens (vLLM ``metrics.speculative_decoding`` on the final usage chunk, llama.cpp
``timings``, SGLang ``sglext.spec_tokens_details``), the record keeps them (``spec_drafted``,
``spec_accepted``, ``spec_steps``), their histograms where given (``spec_histogram``, vLLM and SGLang) and
vLLM's per-pass lists (``spec_step_accepted``/``_drafted``: the ``detailed`` level). analysis/passes.py
turns them, with the chunks, into the passes of each answer.

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
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import orjson

from specadapt.records import Prompt, RequestRecord, RequestSettings, TokenSource
from specadapt.wire.sse import SSEError, SSEParser, is_done
from specadapt.wire.stream import STREAM_ERRORS, Transport, describe, error_kind

RETRYABLE_STATUS = (429, 500, 502, 503, 504)

Clock = Callable[[], int]
"""A monotonic clock in integer nanoseconds."""

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(coro)`` on uvloop's event loop when uvloop is installed (a faster loop:
    less client CPU per chunk), else on asyncio's own."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


# ------------------------------------------------------------------------------ request body

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


def complete_body(prompt: Prompt, model: str, settings: RequestSettings, max_tokens: int) -> tuple[str, dict[str, Any]]:
    """(path, JSON body) of the same request not streamed, ``max_tokens`` tokens: the one-shot requests of
    triage and the canaries."""
    path, body = build_body(prompt, model, settings)
    body.update(stream=False, max_tokens=max_tokens)
    body.pop("stream_options", None)
    return path, body


# ------------------------------------------------------------------------------ events to the record (pure)

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


def _count_tokens(usage: dict[str, Any], before: int | None, tokens: list[str],
                  text: str) -> tuple[int, TokenSource]:
    if usage.get("completion_tokens") is not None and before is not None:
        return int(usage["completion_tokens"]) - before, "usage"
    if tokens:
        return len(tokens), "logprobs"
    return (1 if text else 0), "chunks"


_RANK = {"usage": 0, "logprobs": 1, "chunks": 2}


def _spec_counts(answer: dict[str, Any], rec: RequestRecord) -> None:
    """The request's own drafted/accepted counts where the server's answer states them: vLLM's
    ``metrics.speculative_decoding`` (``--per-request-spec-decode-metrics``; streamed on the final usage
    chunk), SGLang's ``sglext.spec_tokens_details`` (``"return_spec_tokens_details": true`` in the request;
    streamed on a chunk of its own with no choices, after the content) or llama.cpp's ``timings.draft_n`` /
    ``draft_n_accepted``. Anything else leaves ``rec`` as it is."""
    metrics = answer.get("metrics")
    spec = metrics.get("speculative_decoding") if isinstance(metrics, dict) else None
    if isinstance(spec, dict) and isinstance(spec.get("num_draft_tokens"), int):
        rec.spec_drafted = spec["num_draft_tokens"]
        accepted = spec.get("num_accepted_draft_tokens")
        rec.spec_accepted = accepted if isinstance(accepted, int) else None
        steps = spec.get("num_spec_steps")
        rec.spec_steps = steps if isinstance(steps, int) else None
        rec.spec_step_accepted = _ints(spec.get("per_step_accepted"))
        rec.spec_step_drafted = _ints(spec.get("per_step_drafted"))
        rec.spec_histogram = _ints(spec.get("acceptance_histogram"))
        k = spec.get("num_spec_tokens")
        rec.spec_k = k if isinstance(k, int) else None
        return
    ext = answer.get("sglext")
    details = ext.get("spec_tokens_details") if isinstance(ext, dict) else None
    if isinstance(details, dict) and _int(details.get("spec_verify_ct")) is not None:
        _sglang_counts(details, rec)
        return
    timings = answer.get("timings")
    if isinstance(timings, dict) and isinstance(timings.get("draft_n"), int):
        rec.spec_drafted = timings["draft_n"]
        accepted = timings.get("draft_n_accepted")
        rec.spec_accepted = accepted if isinstance(accepted, int) else None


def _sglang_counts(details: dict[str, Any], rec: RequestRecord) -> None:
    """SGLang's ``SpecTokensDetails`` (python/sglang/srt/entrypoints/openai/protocol.py, filled from the
    request's ``meta_info`` by ``spec_tokens_details_from_meta_info`` in entrypoints/openai/utils.py):
    ``spec_verify_ct`` verify passes, ``spec_num_correct_drafts`` accepted draft tokens (the pass's own token
    not counted), ``spec_num_proposed_drafts`` drafted (SGLang states it as passes x (draft tokens - 1)),
    ``spec_correct_drafts_histogram`` (index j: passes that accepted j drafts; [] when SGLang had none).
    SGLang gives no per-pass list and no draft length of its own."""
    rec.spec_steps = _int(details.get("spec_verify_ct"))
    rec.spec_accepted = _int(details.get("spec_num_correct_drafts"))
    rec.spec_drafted = _int(details.get("spec_num_proposed_drafts"))
    rec.spec_histogram = _ints(details.get("spec_correct_drafts_histogram")) or None


def _int(value: Any) -> int | None:
    """``value`` when it is an integer (not a bool), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _ints(value: Any) -> list[int] | None:
    """``value`` when it is a list of integers, else None."""
    if isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return list(value)
    return None


def _weaker(current: TokenSource | None, new: TokenSource) -> TokenSource:
    """The least exact source seen in a request is the one the request is labelled with."""
    if current is None or _RANK[new] > _RANK[current]:
        return new
    return current


def _loads(data: bytes) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(data)  # what orjson refuses but Python's json reads (NaN, Infinity); ValueError if not


class StreamState:
    """One attempt's stream: fed raw body bytes (``feed``), it frames the events, reads the
    clock once per event and fills ``rec``. ``feed`` returns True when the stream is over
    for the client (``[DONE]``, a malformed event or an error event); ``close`` writes the
    end of the record (always call it, also after a timeout or a transport error)."""

    __slots__ = ("rec", "t0", "clock", "parser", "usage_base", "usage_total", "done", "ended", "chunks",
                 "_text", "_prompt_tokens", "_chat")

    def __init__(self, rec: RequestRecord, t0: int, clock: Clock):
        self.rec, self.t0, self.clock = rec, t0, clock
        self.parser = SSEParser()
        self.usage_base: int | None = 0  # completion_tokens before this chunk; None once a token chunk lacked usage
        self.usage_total: int | None = None
        self.done = False   # [DONE] seen
        self.ended = False  # the stream reached its end ([DONE] or EOF), not a failure
        self.chunks = 0     # SSE events read
        self._text: list[str] = []
        self._prompt_tokens: int | None = None
        self._chat = rec.api == "chat"

    def feed(self, raw: bytes) -> bool:
        for data in self.parser.feed(raw):
            try:
                if self.event(data, self.clock()):
                    return True
            except (AttributeError, KeyError, TypeError, ValueError):  # JSON, but not of a chunk's shape
                self.rec.error = f"malformed SSE data: {data.decode(errors='replace')[:80]!r}"
                self.rec.error_kind = "malformed"
                return True
        return False

    def event(self, data: bytes, now: int) -> bool:
        """One event's data, arrived at ``now``; True when the stream is over for the client."""
        self.chunks += 1
        rec = self.rec
        if is_done(data):
            self.done = True
            return True
        chunk = _loads(data)  # ValueError: malformed (feed)
        if not isinstance(chunk, dict):
            raise TypeError("an SSE chunk is a JSON object")
        choices = chunk.get("choices") or []
        if "error" in chunk and not choices:
            rec.error = f"server error in stream: {str(chunk['error'])[:200]}"
            rec.error_kind = "server_error"
            return True
        usage = chunk.get("usage") or {}
        text, tokens, values, tops, finish = "", [], [], [], None
        if choices:
            choice = choices[0]
            api = "chat" if self._chat else "completions"
            text = _delta_text(choice, api)
            if choice.get("logprobs"):
                tokens, values, tops = _chunk_logprobs(choice, api)
            finish = choice.get("finish_reason")
        completion = usage.get("completion_tokens")
        n, source_kind = _count_tokens(usage, self.usage_base, tokens, text)
        if completion is not None:
            self.usage_total = self.usage_base = int(completion)
        elif n > 0:
            self.usage_base = None
        if usage.get("prompt_tokens") is not None:
            self._prompt_tokens = int(usage["prompt_tokens"])
        if "metrics" in chunk or "timings" in chunk or "sglext" in chunk:
            _spec_counts(chunk, rec)
        if n > 0 and choices:
            rec.chunk_ns.append(now - self.t0)
            rec.chunk_tokens.append(n)
            if rec.token_source != source_kind:
                rec.token_source = _weaker(rec.token_source, source_kind)
        if text:
            self._text.append(text)
        if tokens:
            rec.tokens.extend(tokens)
            rec.token_logprobs.extend(values)
            rec.top_logprobs.extend(tops)
        if finish:
            rec.finish_reason = finish
        return False

    def end_of_stream(self) -> None:
        """[DONE] or the end of the body: the E2E time."""
        self.ended = True
        self.rec.e2e_ns = self.clock() - self.t0

    def close(self) -> None:
        rec = self.rec
        if self._text:
            rec.text += "".join(self._text)
            self._text = []
        if self._prompt_tokens is not None:
            rec.prompt_tokens = self._prompt_tokens
        if self.ended:
            rec.output_tokens = self.usage_total or sum(rec.chunk_tokens)
            if not self.done:
                rec.error, rec.error_kind = "stream ended without [DONE]", "no_done"


# ------------------------------------------------------------------------------ one request

async def stream_request(client: Transport, prompt: Prompt, model: str, settings: RequestSettings,
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


async def _attempt(client: Transport, path: str, body: dict[str, Any], rec: RequestRecord, t0: int,
                   timeout_s: float, clock: Clock) -> None:
    state = StreamState(rec, t0, clock)
    try:
        async with asyncio.timeout(timeout_s):
            await _consume(client, path, body, state)
    except STREAM_ERRORS as exc:  # before TimeoutError: aiohttp's socket timeouts are both
        rec.error, rec.error_kind = describe(exc), error_kind(exc)
    except TimeoutError:
        if not state.done:  # after [DONE] the request is complete: only the wait for the body's end ran out
            rec.error, rec.error_kind = f"timed out after {timeout_s:g} s", "timeout"
    finally:
        state.close()
    _counted(client, state.chunks)
    rec.ok = rec.error is None and rec.output_tokens > 0
    if rec.error is None and rec.output_tokens == 0:
        rec.error, rec.error_kind = "stream ended without any output token", "no_tokens"


def _counted(client: Any, chunks: int) -> None:
    """Add to the client's own count of events read (``ClientLoad``), where it keeps one."""
    if hasattr(client, "chunks_read"):
        client.chunks_read += chunks


def _retryable(rec: RequestRecord) -> bool:
    """Only faults before any token: a resend then cannot double-count output."""
    if rec.chunk_ns:
        return False
    return rec.error_kind == "connect" or (rec.error_kind == "http_status" and rec.status_code in RETRYABLE_STATUS)


async def _consume(client: Transport, path: str, body: dict[str, Any], state: StreamState) -> None:
    rec = state.rec
    async with client.post_stream(path, body) as resp:
        rec.status_code = resp.status
        if resp.status != 200:
            detail = (await resp.read()).decode(errors="replace")[:200].replace("\n", " ")
            rec.error, rec.error_kind = f"HTTP {resp.status}: {detail}", "http_status"
            return
        if "text/event-stream" not in resp.content_type:
            raise SSEError(f"Expected response header Content-Type to contain 'text/event-stream', "
                           f"got {resp.content_type!r}")
        feed = state.feed
        async for raw in resp.chunks():
            if feed(raw):
                break
        if rec.error is None:
            state.end_of_stream()
        if state.done:
            await resp.finish()


__all__ = ["Clock", "RETRYABLE_STATUS", "StreamState", "build_body", "complete_body", "run", "stream_request"]

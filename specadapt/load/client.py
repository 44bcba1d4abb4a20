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

Layers. The parsing is pure and fed bytes: ``SSEParser`` frames events (``data:`` lines,
multi-line data, comments, CRLF/CR/LF line ends, events split over reads or several in
one read) and ``StreamState`` turns each event's data into the record (orjson). The
transport is ``StreamClient`` (aiohttp: the body is read as it arrives, no per-line
machinery of a general HTTP library), made by ``connect`` (``load.spread.client_for`` for a server); anything with
its ``post_stream`` method can stand in for it (the unit tests' scripted transport).
About 0.05 ms of CPU per chunk at 500 streams and more, 10 us of it parsing
(docs/benchmarks.md), against 0.2-0.4 ms with httpx + httpx-sse.

Speculation per request. Where the answer itself states the request's drafted and accepted
draft tokens (vLLM ``metrics.speculative_decoding`` on the final usage chunk, llama.cpp
``timings``), the record keeps them (``spec_drafted``, ``spec_accepted``, ``spec_steps``).

Faults never raise: each failed request gets ``error`` (one line) and ``error_kind``.
Retries are off by default because a retried request's latency is not a server's
latency; with ``retries`` > 0, a request that got HTTP 429/500/502/503/504 or could not
connect, before any token, is sent again (its times then run from the first send, and
the report keeps such requests apart).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any, Protocol, TypeVar

import aiohttp
import orjson

from specadapt.records import (
    ErrorKind,
    Prompt,
    RequestRecord,
    RequestSettings,
    TokenSource,
)

RETRYABLE_STATUS = (429, 500, 502, 503, 504)
DRAIN_S = 0.05
"""After [DONE], how long to wait for the end of the body (to keep the connection)."""

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


# ------------------------------------------------------------------------------ SSE framing (pure)

class SSEError(ValueError):
    """The answer is not an event stream."""


class SSEParser:
    """Server-sent events framing, fed raw bytes as they arrive; ``feed`` returns the data
    of each event the bytes completed (bytes; multi-line data joined with ``\\n``).

    Follows the WHATWG rules that matter here: lines end with CRLF, LF or CR; a blank line
    ends an event; an event without a ``data`` field is not dispatched; ``:`` starts a
    comment; one space after ``data:`` is dropped; ``event``/``id``/``retry`` and unknown
    fields are ignored; a leading UTF-8 BOM is dropped; an unfinished event at the end of
    the stream is dropped."""

    __slots__ = ("_tail", "_cr", "_data", "_started")

    def __init__(self) -> None:
        self._tail = b""          # an unfinished line
        self._cr = False          # the last byte seen was CR (it may be half of a CRLF)
        self._data: list[bytes] = []
        self._started = False

    def feed(self, chunk: bytes) -> list[bytes]:
        if self._cr:
            chunk = b"\r" + chunk
            self._cr = False
        if not self._started and chunk:
            self._started = True
            if chunk.startswith(b"\xef\xbb\xbf"):
                chunk = chunk[3:]
        if b"\r" in chunk:
            if chunk.endswith(b"\r"):
                chunk, self._cr = chunk[:-1], True
            chunk = chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        if b"\n" not in chunk:
            self._tail += chunk
            return []
        lines = (self._tail + chunk).split(b"\n") if self._tail else chunk.split(b"\n")
        self._tail = lines.pop()
        events: list[bytes] = []
        data = self._data
        for line in lines:
            if not line:
                if data:
                    events.append(data[0] if len(data) == 1 else b"\n".join(data))
                    data.clear()
            elif line.startswith(b"data:"):
                data.append(line[6:] if line[5:6] == b" " else line[5:])
            elif line == b"data":
                data.append(b"")
            # comments (":..."), event:, id:, retry: and unknown fields carry nothing we use
        return events


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
    chunk) or llama.cpp's ``timings.draft_n`` / ``draft_n_accepted``. Anything else leaves ``rec`` as it is."""
    metrics = answer.get("metrics")
    spec = metrics.get("speculative_decoding") if isinstance(metrics, dict) else None
    if isinstance(spec, dict) and isinstance(spec.get("num_draft_tokens"), int):
        rec.spec_drafted = spec["num_draft_tokens"]
        accepted = spec.get("num_accepted_draft_tokens")
        rec.spec_accepted = accepted if isinstance(accepted, int) else None
        steps = spec.get("num_spec_steps")
        rec.spec_steps = steps if isinstance(steps, int) else None
        return
    timings = answer.get("timings")
    if isinstance(timings, dict) and isinstance(timings.get("draft_n"), int):
        rec.spec_drafted = timings["draft_n"]
        accepted = timings.get("draft_n_accepted")
        rec.spec_accepted = accepted if isinstance(accepted, int) else None


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
        if data == b"[DONE]" or data.strip() == b"[DONE]":
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
        if "metrics" in chunk or "timings" in chunk:
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


# ------------------------------------------------------------------------------ transport

class WireResponse(Protocol):
    """What ``stream_request`` reads of one HTTP answer."""

    status: int
    content_type: str

    async def read(self) -> bytes: ...

    def chunks(self) -> AsyncIterator[bytes]: ...

    async def finish(self) -> None:
        """After ``[DONE]``: let the body end so that the connection can be reused."""


class Transport(Protocol):
    """What ``stream_request`` sends with: ``StreamClient``, or a test's scripted stand-in.
    Faults are raised as aiohttp exceptions (``aiohttp.ClientError`` and its subclasses)."""

    def post_stream(self, path: str, body: dict[str, Any]) -> contextlib.AbstractAsyncContextManager[WireResponse]:
        ...


class _AiohttpResponse:
    __slots__ = ("_resp", "status", "content_type")

    def __init__(self, resp: aiohttp.ClientResponse):
        self._resp, self.status = resp, resp.status
        self.content_type = resp.headers.get("content-type", "")

    async def read(self) -> bytes:
        return await self._resp.read()

    def chunks(self) -> AsyncIterator[bytes]:
        return self._resp.content.iter_any()

    async def finish(self) -> None:
        # The body's last bytes (the end of the chunked encoding) usually follow [DONE] at once; a
        # connection released before them is closed, and the next request pays a new connect.
        content = self._resp.content
        if not content.is_eof():
            with contextlib.suppress(TimeoutError, aiohttp.ClientError):
                async with asyncio.timeout(DRAIN_S):
                    await content.wait_eof()


class StreamClient:
    """An aiohttp session bound to one server: base URL, headers (auth), TLS, a connection
    per stream. Holds no global state; make one per event loop with ``connect``."""

    def __init__(self, session: aiohttp.ClientSession, base_url: str):
        self.session, self.base_url = session, base_url.rstrip("/")
        self.chunks_read = 0  # SSE events read by stream_request through this client (ClientLoad)

    @contextlib.asynccontextmanager
    async def post_stream(self, path: str, body: dict[str, Any]) -> AsyncIterator[WireResponse]:
        async with self.session.post(self.base_url + path, data=orjson.dumps(body),
                                     headers={"Content-Type": "application/json"}) as resp:
            yield _AiohttpResponse(resp)

    async def get_json(self, path: str) -> Any:
        """A plain GET of a JSON document (the scripted server's log)."""
        async with self.session.get(self.base_url + path) as resp:
            resp.raise_for_status()
            return orjson.loads(await resp.read())

    async def aclose(self) -> None:
        await self.session.close()


def ssl_for(verify: bool | str | ssl.SSLContext) -> ssl.SSLContext | bool:
    """aiohttp's ``ssl`` argument for a ``Server.verify`` (httpx's meaning: on with the
    certifi bundle, a CA bundle path, a context, or off)."""
    if isinstance(verify, ssl.SSLContext):
        return verify
    if verify is False:
        return False
    if isinstance(verify, str):
        return ssl.create_default_context(cafile=verify)
    try:
        import certifi
        return ssl.create_default_context(cafile=certifi.where())
    except ImportError:  # pragma: no cover - certifi comes with httpx and aiohttp
        return ssl.create_default_context()


@contextlib.asynccontextmanager
async def connect(base_url: str, *, headers: dict[str, str] | None = None,
                  verify: bool | str | ssl.SSLContext = True, concurrency: int = 100,
                  request_timeout_s: float = 300.0, connect_timeout_s: float = 10.0) -> AsyncIterator[StreamClient]:
    """A ``StreamClient`` for ``base_url``: at most ``concurrency`` connections, no pool wait
    limit (the caller's semaphore bounds the streams), connect and per-read timeouts."""
    connector = aiohttp.TCPConnector(limit=max(1, concurrency), ssl=ssl_for(verify), ttl_dns_cache=None)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout_s, sock_read=request_timeout_s)
    session = aiohttp.ClientSession(connector=connector, headers=headers or {}, timeout=timeout,
                                    auto_decompress=False, raise_for_status=False,
                                    json_serialize=lambda o: orjson.dumps(o).decode())
    try:
        yield StreamClient(session, base_url)
    finally:
        await session.close()


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
    except (aiohttp.ClientError, SSEError) as exc:  # before TimeoutError: aiohttp's socket timeouts are both
        rec.error = f"{type(exc).__name__}: {_first_line(exc)}"[:300]
        rec.error_kind = _kind_of(exc)
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


def _first_line(exc: BaseException) -> str:
    text = str(exc)
    return text.splitlines()[0] if text.strip() else "no detail"


def _kind_of(exc: BaseException) -> ErrorKind:
    if isinstance(exc, (TimeoutError, aiohttp.ServerTimeoutError)):
        return "timeout"
    if isinstance(exc, aiohttp.ClientConnectorError):
        return "connect"
    if isinstance(exc, (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError, aiohttp.ClientOSError,
                        aiohttp.ServerConnectionError)):
        return "disconnect"
    if isinstance(exc, SSEError):
        return "malformed"
    return "other"


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


__all__ = ["Clock", "RETRYABLE_STATUS", "SSEError", "SSEParser", "StreamClient", "StreamState", "Transport",
           "WireResponse", "build_body", "connect", "run", "ssl_for", "stream_request"]

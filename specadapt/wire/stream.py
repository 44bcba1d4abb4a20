"""aiohttp for the load client's streamed requests: ``connect`` makes a ``StreamClient`` bound to
one server (base URL, auth headers, TLS, a connection per stream) whose ``post_stream`` hands out
the body as it arrives, with no per-line machinery of a general HTTP library (about 0.05 ms of CPU
per chunk at 500 streams and more, against 0.17-0.18 ms with httpx as the transport:
docs/benchmarks.md). ``error_kind`` and ``describe`` turn the faults it raises into a record's
``error_kind`` and one line, so that no caller names an aiohttp exception."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator
from typing import Any, Protocol

import aiohttp
import orjson

from specadapt.records import ErrorKind
from specadapt.wire import Verify
from specadapt.wire.sse import SSEError

DRAIN_S = 0.05
"""After [DONE], how long to wait for the end of the body (to keep the connection)."""

STREAM_ERRORS: tuple[type[BaseException], ...] = (aiohttp.ClientError, SSEError)
"""What a ``Transport`` raises for a fault of the request (aiohttp's socket timeouts are also
TimeoutError: catch these first)."""


class WireResponse(Protocol):
    """What ``load.client.stream_request`` reads of one HTTP answer."""

    status: int
    content_type: str

    async def read(self) -> bytes: ...

    def chunks(self) -> AsyncIterator[bytes]: ...

    async def finish(self) -> None:
        """After ``[DONE]``: let the body end so that the connection can be reused."""


class Transport(Protocol):
    """What ``load.client.stream_request`` sends with: ``StreamClient``, or a test's scripted
    stand-in. Faults are raised as aiohttp exceptions (``aiohttp.ClientError`` and its
    subclasses; ``STREAM_ERRORS``)."""

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


def ssl_for(verify: Verify) -> ssl.SSLContext | bool:
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
                  verify: Verify = True, concurrency: int = 100,
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


def error_kind(exc: BaseException) -> ErrorKind:
    """A request record's ``error_kind`` for a fault raised by a ``Transport``."""
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


def describe(exc: BaseException) -> str:
    """A request record's ``error`` for a fault: the exception's name and the first line of its text."""
    text = str(exc)
    first = text.splitlines()[0] if text.strip() else "no detail"
    return f"{type(exc).__name__}: {first}"[:300]


__all__ = ["DRAIN_S", "STREAM_ERRORS", "StreamClient", "Transport", "WireResponse", "connect", "describe",
           "error_kind", "ssl_for"]

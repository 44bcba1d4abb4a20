"""httpx for every request that is not the load client's stream: sync GETs and POSTs, async JSON
posts, low-volume streams. One ``Wire`` per server, built once from its base URL, auth headers,
TLS verify and timeouts; every fault leaves it as a specadapt error:

    connect refused, DNS, TLS, timeout, broken connection   ServerUnreachable (``describe_http_error``)
    401, 403                                                UsageError ("pass --api-key ...")
    any other 4xx                                           RequestRefused (status, the server's message)
    5xx and other non-2xx                                   ServerError (status and message in the line)
    2xx with a body that is not JSON (or not an event stream)  NotAServer

``get``, ``post`` and ``apost`` map only the faults below HTTP and return the answer whatever its
status, for callers that read the status themselves (``answer_json`` then maps it as above).
``transport``: an ``httpx.MockTransport`` (it serves the sync and the async client alike) answers
every request in the tests.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, Protocol

import httpx
import orjson

from specadapt.errors import NotAServer, RequestRefused, ServerError, ServerUnreachable, UsageError
from specadapt.wire import Verify
from specadapt.wire.openai import error_message
from specadapt.wire.sse import SSEParser, is_done

Transport = httpx.BaseTransport | httpx.AsyncBaseTransport
"""What a test passes as ``transport``: ``httpx.MockTransport(handler)`` serves both clients."""


class ServerLike(Protocol):
    """What ``Wire.for_server`` reads of a server (adapters.base.Server has it; also ``transport``
    where the server has one)."""

    verify: Verify

    @property
    def base_url(self) -> str: ...

    def headers(self) -> dict[str, str]: ...


def check_url(url: str) -> str:
    """Normalise a base URL (no trailing slash, no /v1) or raise UsageError."""
    url = url.strip().rstrip("/")
    if url.endswith("/v1"):
        url = url[: -len("/v1")]
    try:
        parsed = httpx.URL(url) if "://" in url else None
    except httpx.InvalidURL:
        parsed = None
    if parsed is None or parsed.scheme not in ("http", "https") or not parsed.host:
        raise UsageError(f"--url {url!r} is not an http(s) URL: give e.g. http://127.0.0.1:8000")
    return url


def describe_http_error(url: str, exc: httpx.HTTPError) -> str:
    """One line for a fault below HTTP (no answer): TLS, connect, timeout, anything else."""
    if isinstance(exc, httpx.ConnectError) and "CERTIFICATE_VERIFY_FAILED" in str(exc):
        return (f"the TLS certificate of {url} could not be verified ({_reason(exc)}): pass --ca-bundle "
                "with the CA that signed it, or --insecure to skip verification")
    if isinstance(exc, httpx.ConnectError):
        return f"cannot connect to {url}: {_reason(exc)}; is the server running and the URL right?"
    if isinstance(exc, httpx.TimeoutException):
        return f"{url} did not answer in time ({type(exc).__name__})"
    return f"HTTP error talking to {url}: {type(exc).__name__}: {_reason(exc)}"


def fault_kind(exc: BaseException) -> str:
    """"timeout" for a ServerUnreachable (or httpx fault) that was a timeout, else "connect"."""
    cause = exc.__cause__ if isinstance(exc, ServerUnreachable) else exc
    return "timeout" if isinstance(cause, httpx.TimeoutException) else "connect"


def _reason(exc: Exception) -> str:
    text = str(exc) or type(exc).__name__
    return text.splitlines()[0][:200]


def answer_json(url: str, path: str, status: int, content: bytes) -> Any:
    """The JSON of a 2xx answer, or the error its status means (see the module docstring)."""
    if status in (401, 403):
        raise UsageError(f"{url}{path} answered {status}: the server wants an API key; "
                         "pass --api-key or set SPECADAPT_API_KEY")
    if 400 <= status < 500:
        msg = error_message(content)
        raise RequestRefused(f"{url}{path} refused the request (HTTP {status}: {msg})", status, msg)
    if not 200 <= status < 300:
        raise ServerError(f"{url}{path} failed (HTTP {status}: {error_message(content)})")
    try:
        return orjson.loads(content)
    except orjson.JSONDecodeError as exc:
        raise NotAServer(f"{url} answered {path} with something that is not JSON") from exc


class Wire:
    """Requests to one server. Sync calls share one ``httpx.Client``; async calls one
    ``httpx.AsyncClient`` per event loop with ``concurrency`` connections. ``timeout_s``: the
    read timeout (sync: every phase, as httpx's single figure); ``connect_timeout_s``: the connect
    timeout (default: ``timeout_s`` sync, 10 s async). Close with ``close``/``aclose`` or use it as
    a (sync or async) context manager."""

    def __init__(self, base_url: str, headers: dict[str, str] | None = None, *, verify: Verify = True,
                 timeout_s: float = 10.0, connect_timeout_s: float | None = None, concurrency: int = 1,
                 transport: Transport | None = None):
        self.base_url = base_url.rstrip("/")
        self.headers = dict(headers or {})
        self.verify = verify
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.concurrency = max(1, concurrency)
        self.transport = transport
        self._client: httpx.Client | None = None
        self._aclient: httpx.AsyncClient | None = None
        self._aloop: asyncio.AbstractEventLoop | None = None

    @classmethod
    def for_server(cls, server: ServerLike, **kw: Any) -> Wire:
        """A Wire with ``server``'s base URL, auth headers and TLS setting, and its ``transport``
        attribute where it has one (the test seam of ``adapters.http.OpenAIServer``; a test's fake
        server sets it to an ``httpx.MockTransport``) unless ``transport`` is given."""
        if kw.get("transport") is None:
            kw["transport"] = getattr(server, "transport", None)
        return cls(server.base_url, server.headers(), verify=server.verify, **kw)

    def __repr__(self) -> str:  # never shows the headers (the API key)
        return f"Wire({self.base_url!r})"

    # --- timeouts and clients
    def _sync_timeout(self, timeout_s: float | None) -> httpx.Timeout:
        t = self.timeout_s if timeout_s is None else timeout_s
        return httpx.Timeout(t, connect=self.connect_timeout_s if self.connect_timeout_s is not None else t)

    def _async_timeout(self, timeout_s: float | None) -> httpx.Timeout:
        t = self.timeout_s if timeout_s is None else timeout_s
        connect = self.connect_timeout_s if self.connect_timeout_s is not None else 10.0
        return httpx.Timeout(connect=connect, read=t, write=30.0, pool=None)

    def _per_call(self, timeout_s: float | None, *, sync: bool) -> Any:
        if timeout_s is None:
            return httpx.USE_CLIENT_DEFAULT
        return self._sync_timeout(timeout_s) if sync else self._async_timeout(timeout_s)

    @property
    def client(self) -> httpx.Client:
        if self._client is None:
            transport = self.transport if isinstance(self.transport, httpx.BaseTransport) else None
            self._client = httpx.Client(base_url=self.base_url, headers=self.headers, verify=self.verify,
                                        timeout=self._sync_timeout(None), transport=transport)
        return self._client

    @property
    def aclient(self) -> httpx.AsyncClient:
        """The async client of the running event loop (a new one on another loop)."""
        loop = asyncio.get_running_loop()
        if self._aclient is None or self._aloop is not loop:
            transport = self.transport if isinstance(self.transport, httpx.AsyncBaseTransport) else None
            limits = httpx.Limits(max_connections=self.concurrency, max_keepalive_connections=self.concurrency)
            self._aclient = httpx.AsyncClient(base_url=self.base_url, headers=self.headers, verify=self.verify,
                                              timeout=self._async_timeout(None), limits=limits, transport=transport)
            self._aloop = loop
        return self._aclient

    def _unreachable(self, exc: httpx.HTTPError) -> ServerUnreachable:
        return ServerUnreachable(describe_http_error(self.base_url, exc))

    # --- sync
    def get(self, path: str, *, timeout_s: float | None = None) -> httpx.Response:
        """GET ``path``: the answer whatever its status; ServerUnreachable when there is none."""
        try:
            return self.client.get(path, timeout=self._per_call(timeout_s, sync=True))
        except httpx.HTTPError as exc:
            raise self._unreachable(exc) from exc

    def status(self, path: str, *, timeout_s: float | None = None) -> int | None:
        """The status of a GET of ``path`` (a path, or a whole URL on a Wire with base URL ""), or None
        when there is no answer (a health poll)."""
        try:
            return self.get(path, timeout_s=timeout_s).status_code
        except ServerUnreachable:
            return None

    def get_json(self, path: str) -> Any | None:
        """JSON body of a 200 answer, or None for any other status or a non-JSON body (a probe of an
        endpoint the server may not have); UsageError for 401/403."""
        resp = self.get(path)
        if resp.status_code in (401, 403):
            answer_json(self.base_url, path, resp.status_code, b"")
        if resp.status_code != 200:
            return None
        try:
            return resp.json()
        except ValueError:
            return None

    def post(self, path: str, body: dict[str, Any], *, headers: dict[str, str] | None = None,
             timeout_s: float | None = None) -> httpx.Response:
        """POST ``body`` as JSON: the answer whatever its status; ServerUnreachable when there is none."""
        try:
            return self.client.post(path, content=orjson.dumps(body), headers=_json_headers(headers),
                                    timeout=self._per_call(timeout_s, sync=True))
        except httpx.HTTPError as exc:
            raise self._unreachable(exc) from exc

    def post_json(self, path: str, body: dict[str, Any], *, headers: dict[str, str] | None = None,
                  timeout_s: float | None = None) -> Any:
        """POST ``body`` and return the JSON of the 2xx answer; every other outcome raises (module docstring)."""
        resp = self.post(path, body, headers=headers, timeout_s=timeout_s)
        return answer_json(self.base_url, path, resp.status_code, resp.content)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def __enter__(self) -> Wire:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- async
    async def apost(self, path: str, body: dict[str, Any], *, headers: dict[str, str] | None = None,
                    timeout_s: float | None = None) -> httpx.Response:
        """Async ``post``: the answer whatever its status; ServerUnreachable when there is none."""
        try:
            return await self.aclient.post(
                path, content=orjson.dumps(body), headers=_json_headers(headers),
                timeout=self._per_call(timeout_s, sync=False))
        except httpx.HTTPError as exc:
            raise self._unreachable(exc) from exc

    async def apost_json(self, path: str, body: dict[str, Any], *, headers: dict[str, str] | None = None,
                         timeout_s: float | None = None) -> Any:
        """Async ``post_json``: the JSON of the 2xx answer; every other outcome raises."""
        resp = await self.apost(path, body, headers=headers, timeout_s=timeout_s)
        return answer_json(self.base_url, path, resp.status_code, resp.content)

    async def stream_events(self, path: str, body: dict[str, Any], *, headers: dict[str, str] | None = None,
                            timeout_s: float | None = None) -> AsyncIterator[dict[str, Any]]:
        """POST ``body`` and yield each SSE event's data as a dict (framed by ``SSEParser``), up to
        ``[DONE]`` or the end of the body. A non-2xx answer raises as ``post_json`` does; an answer
        that is not an event stream, or an event that is not a JSON object, raises NotAServer."""
        url = self.base_url
        try:
            async with self.aclient.stream(
                    "POST", path, content=orjson.dumps(body), headers=_json_headers(headers),
                    timeout=self._per_call(timeout_s, sync=False)) as resp:
                if not 200 <= resp.status_code < 300:
                    answer_json(url, path, resp.status_code, await resp.aread())
                ctype = resp.headers.get("content-type", "")
                if "text/event-stream" not in ctype:
                    raise NotAServer(f"{url} answered {path} with {ctype or 'no content type'!s}, not an event stream")
                parser = SSEParser()
                async for raw in resp.aiter_bytes():
                    for data in parser.feed(raw):
                        if is_done(data):
                            return
                        yield _event(url, path, data)
        except httpx.HTTPError as exc:
            raise self._unreachable(exc) from exc

    async def aclose(self) -> None:
        self.close()
        if self._aclient is not None:
            client, self._aclient, self._aloop = self._aclient, None, None
            await client.aclose()

    async def __aenter__(self) -> Wire:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def _json_headers(headers: dict[str, str] | None) -> dict[str, str]:
    return {"Content-Type": "application/json", **(headers or {})}


def _event(url: str, path: str, data: bytes) -> dict[str, Any]:
    try:
        event = orjson.loads(data)
    except orjson.JSONDecodeError:
        event = None
    if not isinstance(event, dict):
        raise NotAServer(f"{url} streamed an event on {path} that is not a JSON object: "
                         f"{data.decode(errors='replace')[:80]!r}")
    return event


__all__ = ["ServerLike", "Transport", "Wire", "answer_json", "check_url", "describe_http_error", "fault_kind"]

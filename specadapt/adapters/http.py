"""Small synchronous HTTP helpers for adapters: one place that turns httpx errors into ours."""

from __future__ import annotations

from typing import Any

import httpx

from specadapt.adapters.base import ServerBase, Verify
from specadapt.adapters.hardware import server_hardware
from specadapt.errors import NotAServer, ServerUnreachable, UsageError
from specadapt.records import ServerInfo


def check_url(url: str) -> str:
    """Normalise a base URL (no trailing slash, no /v1) or raise UsageError."""
    url = url.strip().rstrip("/")
    if url.endswith("/v1"):
        url = url[: -len("/v1")]
    parsed = httpx.URL(url) if "://" in url else None
    if parsed is None or parsed.scheme not in ("http", "https") or not parsed.host:
        raise UsageError(f"--url {url!r} is not an http(s) URL: give e.g. http://127.0.0.1:8000")
    return url


def describe_http_error(url: str, exc: httpx.HTTPError) -> str:
    if isinstance(exc, httpx.ConnectError) and "CERTIFICATE_VERIFY_FAILED" in str(exc):
        return (f"the TLS certificate of {url} could not be verified ({_reason(exc)}): pass --ca-bundle "
                "with the CA that signed it, or --insecure to skip verification")
    if isinstance(exc, httpx.ConnectError):
        return f"cannot connect to {url}: {_reason(exc)}; is the server running and the URL right?"
    if isinstance(exc, httpx.TimeoutException):
        return f"{url} did not answer in time ({type(exc).__name__})"
    return f"HTTP error talking to {url}: {type(exc).__name__}: {_reason(exc)}"


def _reason(exc: Exception) -> str:
    text = str(exc) or type(exc).__name__
    return text.splitlines()[0][:200]


class HttpGetter:
    """GETs against one base URL with auth headers; errors become SpecadaptErrors."""

    def __init__(self, base_url: str, headers: dict[str, str], timeout_s: float = 10.0,
                 verify: Verify = True, transport: httpx.BaseTransport | None = None):
        self.base_url = base_url
        self._client = httpx.Client(base_url=base_url, headers=headers, timeout=timeout_s, verify=verify,
                                    transport=transport)

    def get(self, path: str) -> httpx.Response:
        try:
            return self._client.get(path)
        except httpx.HTTPError as exc:
            raise ServerUnreachable(describe_http_error(self.base_url, exc)) from exc

    def get_json(self, path: str) -> Any | None:
        """JSON body of a 200 answer, or None for any other status or a non-JSON body."""
        resp = self.get(path)
        if resp.status_code == 401 or resp.status_code == 403:
            raise UsageError(
                f"{self.base_url}{path} answered {resp.status_code}: the server wants an API key; "
                "pass --api-key or set SPECADAPT_API_KEY")
        if resp.status_code != 200:
            return None
        try:
            return resp.json()
        except ValueError:
            return None

    def models(self) -> list[dict[str, Any]]:
        """``/v1/models`` data, or NotAServer if this is not an OpenAI-compatible server."""
        body = self.get_json("/v1/models")
        if not isinstance(body, dict) or not isinstance(body.get("data"), list) or not body["data"]:
            raise NotAServer(
                f"{self.base_url} does not look like an OpenAI-compatible server "
                "(GET /v1/models gave no model list); check the URL and port")
        return body["data"]

    def close(self) -> None:
        self._client.close()


class OpenAIServer(ServerBase):
    """What every OpenAI-compatible server adapter shares: the base URL, the bearer token
    (kept private: never in repr, logs or reports), a GET helper and the served model id.
    A subclass adds ``describe()`` and ``read_counters()`` to be a full Server."""

    backend = "openai"

    def __init__(self, base_url: str, api_key: str | None = None, verify: Verify = True,
                 launched: bool = False, transport: httpx.BaseTransport | None = None):
        self._base_url = check_url(base_url)
        self._api_key = api_key
        self.verify = verify
        self.launched = launched
        self._http = HttpGetter(self._base_url, self.headers(), verify=verify, transport=transport)
        self._model_id: str | None = None

    def __repr__(self) -> str:  # never shows the API key
        return f"{type(self).__name__}({self._base_url!r})"

    @property
    def base_url(self) -> str:
        return self._base_url

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}

    def _server_info(self, **fields: Any) -> ServerInfo:
        """A ServerInfo for this server (backend, base URL, the hardware where known and, when specadapt
        started it, the launch)."""
        hardware, note = server_hardware(self._base_url, started_here=self.launched or self.launch is not None)
        info = ServerInfo(backend=self.backend, base_url=self._base_url, launch=self.launch, hardware=hardware,
                          **fields)
        if note:
            info.notes.append(note)
        return info

    @property
    def model_id(self) -> str:
        if self._model_id is None:
            self._model_id = str(self._http.models()[0]["id"])
        return self._model_id

    def close(self) -> None:
        self._http.close()

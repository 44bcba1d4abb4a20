"""What the OpenAI-compatible adapters share: the base URL, the bearer token and the server's
``Wire`` (specadapt/wire/http.py: every request and the one mapping of its faults)."""

from __future__ import annotations

from typing import Any

from specadapt.adapters.base import ServerBase, Verify
from specadapt.adapters.hardware import server_hardware
from specadapt.errors import NotAServer
from specadapt.records import ServerInfo
from specadapt.wire.http import Transport, Wire, check_url

GET_TIMEOUT_S = 10.0


def served_models(wire: Wire) -> list[dict[str, Any]]:
    """``/v1/models`` data, or NotAServer if this is not an OpenAI-compatible server."""
    body = wire.get_json("/v1/models")
    if not isinstance(body, dict) or not isinstance(body.get("data"), list) or not body["data"]:
        raise NotAServer(
            f"{wire.base_url} does not look like an OpenAI-compatible server "
            "(GET /v1/models gave no model list); check the URL and port")
    return body["data"]


class OpenAIServer(ServerBase):
    """What every OpenAI-compatible server adapter shares: the base URL, the bearer token
    (kept private: never in repr, logs or reports), the server's ``Wire`` and the served model id.
    A subclass adds ``describe()`` and ``read_counters()`` to be a full Server. ``transport``: the
    wire's transport seam (a test's ``httpx.MockTransport``)."""

    backend = "openai"

    def __init__(self, base_url: str, api_key: str | None = None, verify: Verify = True,
                 launched: bool = False, transport: Transport | None = None):
        self._base_url = check_url(base_url)
        self._api_key = api_key
        self.verify = verify
        self.launched = launched
        self.transport = transport  # every Wire made for this server uses it (Wire.for_server)
        self._http = Wire(self._base_url, self.headers(), verify=verify, timeout_s=GET_TIMEOUT_S, transport=transport)
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

    def _models(self) -> list[dict[str, Any]]:
        return served_models(self._http)

    @property
    def model_id(self) -> str:
        if self._model_id is None:
            self._model_id = str(self._models()[0]["id"])
        return self._model_id

    def close(self) -> None:
        self._http.close()


__all__ = ["OpenAIServer", "served_models"]

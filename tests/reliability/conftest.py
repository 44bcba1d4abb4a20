"""One scripted SSE server (a real process on loopback) shared by the reliability tests."""

from __future__ import annotations

import httpx
import pytest

from specadapt.adapters.vllm import VLLMServer
from specadapt.testing import scripted_server


@pytest.fixture(scope="session")
def scripted(tmp_path_factory):
    """The ManagedProcess of a running scripted server (its base URL: .plan.base_url)."""
    with scripted_server(tmp_path_factory.mktemp("scripted") / "server.log") as mp:
        yield mp


@pytest.fixture
def scripted_url(scripted):
    httpx.post(scripted.plan.base_url + "/_script/metrics", json={"mode": "vllm"})
    return scripted.plan.base_url


@pytest.fixture
def set_metrics(scripted_url):
    def _set(mode: str) -> None:
        assert httpx.post(scripted_url + "/_script/metrics", json={"mode": mode}).status_code == 200
    yield _set
    _set("vllm")


@pytest.fixture
def server(scripted_url):
    """The scripted server through the vLLM adapter (it serves /version and vLLM metric names)."""
    s = VLLMServer(scripted_url)
    yield s
    s.close()

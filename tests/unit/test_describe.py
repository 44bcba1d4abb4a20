"""VLLMServer.describe() on recorded /metrics text behind a scripted transport."""

from pathlib import Path

import httpx
import pytest

from specadapt.adapters.vllm import VLLMServer
from specadapt.errors import NotAServer, UsageError

FIX = Path(__file__).parent.parent / "fixtures" / "vllm"
MODELS = {"object": "list", "data": [{"id": "smol", "root": "/models/smol", "max_model_len": 2048}]}


def server_with(routes: dict, api_key=None, seen=None):
    def handler(request: httpx.Request) -> httpx.Response:
        if seen is not None:
            seen.append(request)
        route = routes.get(request.url.path)
        if route is None:
            return httpx.Response(404, json={"detail": "Not Found"})
        if isinstance(route, httpx.Response):
            return route
        if isinstance(route, str):
            return httpx.Response(200, text=route)
        return httpx.Response(200, json=route)

    return VLLMServer("http://vllm.test:8000/v1/", api_key=api_key, transport=httpx.MockTransport(handler))


def test_spec_on_is_detected_with_k_from_positions():
    info = server_with({"/v1/models": MODELS, "/version": {"version": "0.32.0"},
                        "/metrics": (FIX / "metrics-spec-ngram-k4.txt").read_text()}).describe()
    assert info.base_url == "http://vllm.test:8000"
    assert (info.version, info.model_id, info.max_model_len) == ("0.32.0", "smol", 2048)
    assert info.spec_enabled is True and info.num_speculative_tokens == 4
    assert "vllm:spec_decode_num_accepted_tokens_per_pos_total" in info.spec_counters
    assert any("VLLM_SERVER_DEV_MODE" in n for n in info.notes)


def test_spec_off_is_said_plainly():
    info = server_with({"/v1/models": MODELS, "/version": {"version": "0.32.0"},
                        "/metrics": (FIX / "metrics-spec-off.txt").read_text()}).describe()
    assert info.spec_enabled is False and info.spec_counters == []
    assert any("speculative decoding is off" in n for n in info.notes)


def test_stats_disabled_means_cannot_tell():
    info = server_with({"/v1/models": MODELS, "/version": {"version": "0.32.0"},
                        "/metrics": "# nothing from vllm here\npython_info 1\n"}).describe()
    assert info.spec_enabled is None
    assert any("cannot tell" in n for n in info.notes)


def test_server_info_gives_the_method_when_dev_mode_is_on():
    info = server_with({"/v1/models": MODELS, "/version": {"version": "0.32.0"},
                        "/metrics": (FIX / "metrics-spec-ngram-k4.txt").read_text(),
                        "/server_info": {"vllm_config": {"speculative_config": {"method": "ngram",
                                                                                "num_speculative_tokens": 4}}}}).describe()
    assert info.spec_method == "ngram" and info.num_speculative_tokens == 4


def test_openai_server_that_is_not_vllm():
    with pytest.raises(NotAServer, match="not vLLM"):
        server_with({"/v1/models": MODELS}).describe()


def test_not_an_openai_server():
    with pytest.raises(NotAServer, match="does not look like an OpenAI-compatible server"):
        server_with({"/": "<html>"}).describe()


def test_api_key_is_sent_as_bearer_and_never_shown():
    seen = []
    srv = server_with({"/v1/models": MODELS, "/version": {"version": "0.32.0"}, "/metrics": ""},
                      api_key="sk-planted-123", seen=seen)
    srv.describe()
    assert all(r.headers["authorization"] == "Bearer sk-planted-123" for r in seen)
    assert "sk-planted" not in repr(srv)


def test_401_says_to_pass_a_key():
    with pytest.raises(UsageError, match="--api-key or set SPECADAPT_API_KEY"):
        server_with({"/v1/models": httpx.Response(401, json={"error": "Unauthorized"})}).describe()

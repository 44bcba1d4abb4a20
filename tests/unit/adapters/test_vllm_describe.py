"""VLLMServer.describe() on recorded /metrics text and /server_info answers behind a scripted
transport; what running servers expose, compared apart from speculation."""

import json
from pathlib import Path

import httpx
import pytest

from specadapt.adapters import sglang
from specadapt.adapters.reference import ReferenceServer
from specadapt.adapters.vllm import PER_SERVER_ENV, VLLMServer, server_settings
from specadapt.analysis.sides import side_differences
from specadapt.errors import NotAServer, UsageError

FIX = Path(__file__).parents[2] / "fixtures" / "vllm"
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


# --- connect mode: what the servers expose about themselves (recorded from real vLLM 0.32.0 servers,
# tests/fixtures/vllm/README.md), compared apart from speculation ----------------------------------------

RECORDED_MODELS = json.loads((FIX / "models.json").read_text())


def recorded(name: str) -> dict:
    return json.loads((FIX / name).read_text())


def recorded_server(server_info: dict | None, metrics: str = "metrics-spec-off.txt", seen=None) -> VLLMServer:
    routes = {"/v1/models": RECORDED_MODELS, "/version": {"version": "0.32.0"}, "/metrics": (FIX / metrics).read_text()}
    if server_info is not None:
        routes["/server_info"] = server_info
    return server_with(routes, seen=seen)


def test_dev_mode_server_info_gives_dtype_and_settings_without_speculation():
    raw = recorded("server-info-ngram-k4.json")
    seen = []
    info = recorded_server(raw, "metrics-spec-ngram-k4.txt", seen).describe()
    assert [str(r.url.params) for r in seen if r.url.path == "/server_info"] == ["config_format=json"]
    assert (info.version, info.model_root, info.max_model_len) == ("0.32.0", RECORDED_MODELS["data"][0]["root"], 2048)
    assert info.dtype == "bfloat16"  # the servers were started with --dtype=bfloat16
    assert info.spec_method == "ngram" and info.num_speculative_tokens == 4  # from speculative_config, really there
    config = raw["vllm_config"]
    assert info.server_flags["model_config.dtype"] == config["model_config"]["dtype"] == "torch.bfloat16"
    assert info.server_flags["scheduler_config.max_num_seqs"] == config["scheduler_config"]["max_num_seqs"]
    assert info.server_flags["cache_config.enable_prefix_caching"] is config["cache_config"]["enable_prefix_caching"]
    assert info.server_flags["performance_mode"] == config["performance_mode"]
    assert info.server_flags["env.VLLM_SERVER_DEV_MODE"] is True
    assert info.server_flags["env.VLLM_CPU_KVCACHE_SPACE"] == raw["vllm_env"]["VLLM_CPU_KVCACHE_SPACE"]
    assert not any("speculative" in k for k in info.server_flags)
    envs = {k for k in info.server_flags if k.startswith("env.")}
    assert envs == {f"env.{k}" for k in raw["vllm_env"]} - {f"env.{k}" for k in PER_SERVER_ENV}


def test_the_recorded_spec_off_and_spec_on_servers_differ_in_speculation_only():
    raw_off, raw_on = recorded("server-info-off.json"), recorded("server-info-ngram-k4.json")
    # as recorded, they did differ outside speculation in one per-server name (and in speculative_config)
    assert [k for k in raw_off["vllm_env"] if raw_off["vllm_env"][k] != raw_on["vllm_env"][k]] == list(PER_SERVER_ENV)
    off = recorded_server(raw_off).describe()
    on = recorded_server(raw_on, "metrics-spec-ngram-k4.txt").describe()
    assert off.spec_enabled is False and on.spec_enabled is True
    assert side_differences(off, on) == []


def test_a_setting_that_differs_between_running_servers_is_one_line():
    raw_on = recorded("server-info-ngram-k4.json")
    raw_on["vllm_env"]["VLLM_CPU_KVCACHE_SPACE"] = 4
    raw_on["vllm_config"]["model_config"]["dtype"] = "torch.float32"
    off = recorded_server(recorded("server-info-off.json")).describe()
    on = recorded_server(raw_on, "metrics-spec-ngram-k4.txt").describe()
    assert side_differences(off, on) == [
        "dtype: bfloat16 on the spec-off side, float32 on the spec-on side",
        "server setting env.VLLM_CPU_KVCACHE_SPACE: 1 on the spec-off side, 4 on the spec-on side",
        "server setting model_config.dtype: torch.bfloat16 on the spec-off side, torch.float32 on the spec-on side"]


def test_dev_mode_on_one_server_only_is_said():
    off = recorded_server(None).describe()
    on = recorded_server(recorded("server-info-ngram-k4.json"), "metrics-spec-ngram-k4.txt").describe()
    assert (off.dtype, off.server_flags) == (None, {})
    assert side_differences(off, on) == [
        "only the spec-on server exposes its settings (vLLM: /server_info with VLLM_SERVER_DEV_MODE=1): they were "
        "started differently, and the settings cannot be compared"]


def test_the_text_form_of_an_older_vllm_still_gives_dtype_and_settings():
    raw = recorded("server-info-text-off.json")
    assert isinstance(raw["vllm_config"], str)  # what GET /server_info gives without config_format=json
    dtype, flags = server_settings(raw)
    assert dtype == "bfloat16"
    assert {k: v for k, v in flags.items() if not k.startswith("env.")} == {
        "vllm_config.dtype": "torch.bfloat16", "vllm_config.max_seq_len": "2048", "vllm_config.seed": "0",
        "vllm_config.enforce_eager": "False", "vllm_config.quantization": "None", "vllm_config.kv_cache_dtype": "auto",
        "vllm_config.enable_prefix_caching": "True", "vllm_config.enable_chunked_prefill": "True",
        "vllm_config.tensor_parallel_size": "1", "vllm_config.pipeline_parallel_size": "1"}
    assert "vllm_config.dtype" not in server_settings({"vllm_config": "kv_cache_dtype=fp8, x=1"})[1]


def test_settings_are_only_read_from_a_mapping_and_secrets_become_stars():
    assert server_settings(None) == (None, {}) and server_settings(["x"]) == (None, {})
    dtype, flags = server_settings({"vllm_config": {"model_config": "not a mapping", "performance_mode": "x"},
                                    "vllm_env": {"VLLM_HF_TOKEN": "hf_planted", "VLLM_DISABLED_KERNELS": ["a"],
                                                 "VLLM_MAX_TOKENS_PER_EXPERT_FP4_MOE": 8}})
    assert dtype is None
    assert flags == {"performance_mode": "x", "env.VLLM_HF_TOKEN": "***", "env.VLLM_DISABLED_KERNELS": '["a"]',
                     "env.VLLM_MAX_TOKENS_PER_EXPERT_FP4_MOE": 8}
    assert server_settings({"vllm_env": {"VLLM_X": 1}}) == (None, {"env.VLLM_X": 1})  # no vllm_config at all
    # a mapping value is compact JSON with sorted keys: the same mapping in another order reads the same
    orders = [server_settings({"vllm_config": {"performance_mode": m}})[1] for m in ({"b": 1, "a": 2}, {"a": 2, "b": 1})]
    assert orders[0] == orders[1] == {"performance_mode": '{"a":2,"b":1}'}


def test_the_reference_server_gives_its_engine_settings_from_version():
    version = {"version": "0.1.0", "server": "specadapt-reference", "speculative_method": "ngram",
               "num_speculative_tokens": 4, "num_speculative_tokens_per_batch_size": [[1, 4]], "max_num_seqs": 16,
               "max_model_len": 2048}
    srv = ReferenceServer("http://ref.test:1", transport=httpx.MockTransport(
        lambda r: httpx.Response(200, json={"/v1/models": MODELS, "/version": version}[r.url.path])
        if r.url.path in ("/v1/models", "/version") else httpx.Response(404)))
    info = srv.describe()
    assert (info.dtype, info.server_flags) == (None, {"server": "specadapt-reference", "max_num_seqs": 16})


def test_sglang_gives_dtype_and_its_server_arguments_without_speculation():
    si = {**json.loads((FIX.parent / "sglang" / "server-info-off.json").read_text()), "dtype": "bfloat16",
          "speculative_algorithm": "EAGLE", "speculative_num_steps": 3, "mem_fraction_static": 0.8, "port": 30000}
    srv = sglang.SGLangServer("http://sgl.test:1", transport=httpx.MockTransport(
        lambda r: httpx.Response(200, json={"/v1/models": MODELS, "/server_info": si}[r.url.path])
        if r.url.path in ("/v1/models", "/server_info") else httpx.Response(404)))
    info = srv.describe()
    assert info.dtype == "bfloat16"
    assert info.server_flags == {"dtype": "bfloat16", "tp_size": 1, "dp_size": 1, "mem_fraction_static": 0.8}

"""SGLang adapter and flag checks on real upstream payloads where upstream publishes one, and on
payloads constructed in upstream's shapes where it does not (origins: tests/fixtures/sglang/README.md)."""
from __future__ import annotations
import json
from pathlib import Path
import httpx
import pytest
from specadapt.adapters import sglang as S
from specadapt.analysis.acceptance import acceptance_summary
from specadapt.configs import sglang as cfg
from specadapt.configs.spec import SpecConfig
from specadapt.errors import NotAServer, UsageError
from specadapt.adapters.hardware import NOT_KNOWN, STARTED_HERE

FIX = Path(__file__).parents[2] / "fixtures" / "sglang"


def server(routes: dict) -> S.SGLangServer:
    def handler(request: httpx.Request) -> httpx.Response:
        body = routes.get(request.url.path)
        if body is None:
            return httpx.Response(404)
        return httpx.Response(200, text=body) if isinstance(body, str) else httpx.Response(200, json=body)
    return S.SGLangServer("http://sgl.test:30000", transport=httpx.MockTransport(handler))


def load(name):
    text = (FIX / name).read_text()
    return json.loads(text) if name.endswith(".json") else text


def test_describe_eagle3_with_gauges_said_to_be_gauges():
    info = server({"/v1/models": load("models.json"), "/server_info": load("server-info-eagle3.json"),
                   "/metrics": load("metrics-spec.txt")}).describe()
    assert (info.version, info.max_model_len) == ("0.5.4", 8192)
    assert info.spec_enabled is True and info.spec_method == "EAGLE3" and info.num_speculative_tokens == 3
    assert info.spec_counters == [S.G_LENGTH, S.G_RATE]
    note = next(n for n in info.notes if "gauges" in n)
    assert "avg_spec_accept_length 3.000" in note and "sglang:spec_accept_length 3.100" in note
    assert "per-run acceptance stays unknown" in note


# A real answer: /get_server_info of SGLang 0.5.2rc1 serving qwen/qwen2.5-0.5b-instruct, spec off
# (tests/fixtures/sglang/README.md). Expected values below are read off that file by hand.
REAL_OFF = "get-server-info-docs-native-api-off.json"


def test_older_route_and_spec_off_on_a_real_answer():
    info = server({"/v1/models": load("models.json"), "/get_server_info": load(REAL_OFF)}).describe()
    assert info.spec_enabled is False and info.spec_method is None and info.num_speculative_tokens is None
    assert info.spec_signal == "speculative_algorithm on /server_info"
    assert (info.version, info.model_root, info.dtype) == ("0.5.2rc1", "qwen/qwen2.5-0.5b-instruct", "auto")
    assert info.max_model_len is None  # "context_length": null: the server was left to the model's own length
    assert info.metrics_available is False and info.spec_counters == []
    assert not any("gauges" in n for n in info.notes)


def test_real_server_info_flags_and_its_integer_algorithm_in_internal_states():
    si = load(REAL_OFF)
    assert S.server_flags(si) == {
        "dtype": "auto", "kv_cache_dtype": "auto", "quantization": None, "tp_size": 1, "dp_size": 1, "pp_size": 1,
        "mem_fraction_static": 0.874, "chunked_prefill_size": 8192, "max_prefill_tokens": 16384,
        "schedule_policy": "fcfs", "attention_backend": None, "sampling_backend": "flashinfer",
        "disable_radix_cache": False, "disable_cuda_graph": False, "enable_torch_compile": False,
        "random_seed": 843178346}
    # the scheduler's own copy is an enum number, not a name; only the top-level field is read
    assert si["speculative_algorithm"] is None and si["internal_states"][0]["speculative_algorithm"] == 1
    assert S.accept_lengths(si) == []  # spec off: no avg_spec_accept_length in internal_states


def test_real_production_metrics_give_token_counters_and_no_spec_gauges():
    text = load("metrics-docs-production-metrics.txt")
    snap = server({"/metrics": text}).read_counters()
    assert (snap.prompt_tokens, snap.generation_tokens) == (8128902.0, 7557572.0)
    assert not snap.has_spec_counters
    info = server({"/v1/models": load("models.json"), "/get_server_info": load(REAL_OFF),
                   "/metrics": text}).describe()
    assert info.metrics_available is True and info.spec_counters == []


def test_not_sglang():
    with pytest.raises(NotAServer, match="not SGLang"):
        server({"/v1/models": load("models.json")}).describe()


def test_counters_are_tokens_only_so_acceptance_is_unknown():
    s = server({"/metrics": load("metrics-spec.txt")})
    snap = s.read_counters()
    assert snap.generation_tokens == 5000.0 and snap.prompt_tokens == 1200.0
    acc = acceptance_summary(snap, snap)
    assert acc.known is False


def test_accept_lengths_per_dp_rank():
    assert S.accept_lengths(load("server-info-eagle3.json")) == [3.1, 2.9]
    assert S.accept_lengths({"avg_spec_accept_length": 2.0}) == [2.0]
    assert S.accept_lengths(None) == []


@pytest.mark.parametrize("spec,flags", [
    (SpecConfig(method="eagle3", k=3, draft="/h"),
     ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", "/h", "--speculative-num-steps", "3",
      "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4"]),
    (SpecConfig(method="draft_model", k=5, draft="/small"),
     ["--speculative-algorithm", "STANDALONE", "--speculative-draft-model-path", "/small",
      "--speculative-num-steps", "5", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "6"]),
    (SpecConfig(method="ngram", k=4),
     ["--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", "5"]),
    (SpecConfig(method="eagle3", k=3, draft="/h", native_extras={"sglang": {"--speculative-eagle-topk": 4,
                                                                           "--speculative-num-draft-tokens": 8}}),
     ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", "/h", "--speculative-num-steps", "3",
      "--speculative-eagle-topk", "4", "--speculative-num-draft-tokens", "8"]),
])
def test_launch_plan_flags(spec, flags):
    plan = S.launch_plan(S.SGLangLaunch(model="/m", spec_config=spec, port=30001, python="py", tp=2))
    assert plan.argv[:3] == ["py", "-m", "sglang.launch_server"]
    assert plan.argv[-len(flags):] == flags
    a = plan.argv
    assert a[a.index("--tp-size") + 1] == "2" and "--enable-metrics" in a and plan.health_path == "/health"
    assert cfg.check_sglang_spec(cfg.flags_to_dict(a)) == []


def test_off_plan_has_no_spec_flags():
    plan = S.launch_plan(S.SGLangLaunch(model="/m", port=30002))
    assert not any(a.startswith("--speculative") for a in plan.argv) and plan.spec_enabled is False


def test_refusals_name_the_fix():
    with pytest.raises(UsageError, match="needs a draft model path"):
        cfg.sglang_spec_flags(SpecConfig(method="eagle3", k=3))
    with pytest.raises(UsageError, match="no 'medusa'"):
        cfg.sglang_spec_flags(SpecConfig(method="medusa", k=3, draft="/m"))
    with pytest.raises(UsageError, match="num-draft-tokens"):  # extra args are checked too
        S.launch_plan(S.SGLangLaunch(model="/m", spec_config=SpecConfig(method="eagle", k=2, draft="/h"),
                                     extra_args=["--speculative-num-draft-tokens=9"]))


@pytest.mark.parametrize("flags,fragment,severity", [
    ({"--speculative-algorithm": "EAGLE"}, "needs --speculative-draft-model-path", "error"),
    ({"--speculative-algorithm": "NGRAM", "--speculative-draft-model-path": "/x"}, "remove", "error"),
    ({"--speculative-algorithm": "MEDUSA"}, "not one specadapt checks", "error"),
    ({"--speculative-num-steps": "3"}, "does nothing", "warning"),
    ({"--speculative-algorithm": "EAGLE3", "--speculative-draft-model-path": "/h", "--speculative-num-steps": "3",
      "--speculative-eagle-topk": "1", "--speculative-num-draft-tokens": "3"}, "must be", "warning"),
    ({"--speculative-algorithm": "EAGLE3", "--speculative-draft-model-path": "/h", "--speculative-num-steps": "0"},
     ">= 1", "error"),
])
def test_flag_rules(flags, fragment, severity):
    problems = cfg.check_sglang_spec(flags)
    assert any(fragment in p.message and p.severity == severity for p in problems), problems


# ------------------------------------------------------------------ read_live (specadapt watch)

def test_live_read_of_the_docs_example_has_the_batch_queue_and_ttft():
    """The published /metrics example: 162 running, 2826 queued, TTFT sum and count as printed;
    no acceptance counters (SGLang has only gauges), so the watcher names it 'no counters'."""
    snap = server({"/metrics": load("metrics-docs-production-metrics.txt")}).read_live()
    assert (snap.running, snap.waiting) == (162.0, 2826.0)
    assert (snap.ttft.sum, snap.ttft.count) == (2.3518979474117756e+06, 11008.0)
    assert snap.tpot is None  # the fixture's inter-token histogram was trimmed
    assert not snap.counters.has_spec_counters and snap.counters.generation_tokens == 7.557572e+06


@pytest.mark.parametrize("name", ["sglang:inter_token_latency_seconds", "sglang:time_per_output_token_seconds"])
def test_live_read_takes_the_inter_token_histogram_by_either_name(name):
    """Constructed: the histogram names of python/sglang/srt/metrics/collector.py @ 00ae9c15 and
    of older releases; two DP ranks' label sets summed."""
    text = "".join(f"# TYPE {name} histogram\n{name}_sum{{dp_rank=\"{r}\"}} {s}\n{name}_count{{dp_rank=\"{r}\"}} {n}\n"
                   f'{name}_bucket{{dp_rank="{r}",le="+Inf"}} {n}\n' for r, s, n in ((0, 0.5, 10), (1, 0.25, 6)))
    text += '# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs{dp_rank="0"} 3\n' \
            'sglang:num_running_reqs{dp_rank="1"} 4\n'
    snap = server({"/metrics": text}).read_live()
    assert (snap.tpot.sum, snap.tpot.count, snap.running, snap.waiting) == (0.75, 16.0, 7.0, None)


def test_live_read_without_metrics_is_counters_unknown_not_an_error():
    snap = server({}).read_live()
    assert (snap.running, snap.ttft, snap.tpot) == (None, None, None)
    assert not snap.counters.has_spec_counters and snap.counters.generation_tokens is None


# SGLang adapter edges: when speculation counts as off, which acceptance figures describe() reads
URL = "http://sgl.test:30000"
MODEL = "meta-llama/Llama-3.1-8B-Instruct"  # the id in models.json
GAUGES = ("SGLang reports acceptance as gauges averaged over its own recent window, not counters: "
          "the per-run acceptance stays unknown")
NO_GAUGES = GAUGES + "; start SGLang with --enable-metrics for sglang:spec_accept_length"
# constructed: FastAPI's default 404 body, what SGLang answers on /metrics when started without
# --enable-metrics (its Prometheus route is only mounted with that flag)
NOT_FOUND = httpx.Response(404, json={"detail": "Not Found"})




def server_sglang_adapter(routes: dict, seen: list | None = None, **kw) -> S.SGLangServer:
    def handler(request: httpx.Request) -> httpx.Response:
        if seen is not None:
            seen.append(request)
        body = routes.get(request.url.path)
        if body is None:
            return httpx.Response(404)
        if isinstance(body, httpx.Response):
            return body
        return httpx.Response(200, text=body) if isinstance(body, str) else httpx.Response(200, json=body)
    return S.SGLangServer(URL, transport=httpx.MockTransport(handler), **kw)


def eagle3(**changes) -> dict:
    """server-info-eagle3.json (constructed, see the README) with some keys changed."""
    return {**load("server-info-eagle3.json"), **changes}


def gauge_note(info) -> str:
    notes = [n for n in info.notes if n.startswith("SGLang reports acceptance")]
    assert len(notes) == 1, info.notes
    return notes[0]


# ------------------------------------------------------------------ speculation on or off

@pytest.mark.parametrize("algo,enabled", [("EAGLE3", True), ("NGRAM", True), ("NONE", False), (None, False),
                                          ("", False)])
def test_speculative_algorithm_decides_on_or_off(algo, enabled):
    # constructed: speculative_algorithm as SGLang's ServerArgs spells it (None when off; its enum's
    # off member is NONE, server_args.py / speculative/spec_info.py), the rest from the eagle3 fixture
    info = server_sglang_adapter({"/v1/models": load("models.json"), "/server_info": eagle3(speculative_algorithm=algo)}).describe()
    assert info.spec_enabled is enabled
    assert info.spec_signal == "speculative_algorithm on /server_info"
    if enabled:
        assert (info.spec_method, info.num_speculative_tokens) == (algo, 3)
    else:
        assert (info.spec_method, info.num_speculative_tokens) == (None, None)
        assert not any(n.startswith("SGLang reports acceptance") for n in info.notes)


def test_no_step_count_leaves_k_unknown():
    # constructed: speculation on, speculative_num_steps null (ServerArgs' default, left so for NGRAM,
    # which drafts by --speculative-num-draft-tokens): k stays unknown rather than guessed
    si = eagle3(speculative_algorithm="NGRAM", speculative_num_steps=None)
    info = server_sglang_adapter({"/v1/models": load("models.json"), "/server_info": si}).describe()
    assert (info.spec_enabled, info.spec_method, info.num_speculative_tokens) == (True, "NGRAM", None)


# ------------------------------------------------------------------ acceptance figures

def test_gauges_note_word_for_word_with_every_figure():
    info = server_sglang_adapter({"/v1/models": load("models.json"), "/server_info": load("server-info-eagle3.json"),
                   "/metrics": load("metrics-spec.txt")}).describe()
    # internal_states 3.1 and 2.9 -> mean 3.0; /metrics: one sample each, 3.1 and 0.55
    assert gauge_note(info) == (GAUGES + "; as read now: avg_spec_accept_length 3.000 on /server_info, "
                                "sglang:spec_accept_length 3.100, sglang:spec_accept_rate 0.550")


# constructed: metrics-spec.txt's gauges for two DP ranks (dp_rank label as SGLang's collector sets it)
TWO_RANKS = """\
# TYPE sglang:spec_accept_rate gauge
sglang:spec_accept_rate{dp_rank="0",engine_type="unified",model_name="llama",tp_rank="0"} 0.6
sglang:spec_accept_rate{dp_rank="1",engine_type="unified",model_name="llama",tp_rank="0"} 0.4
# TYPE sglang:spec_accept_length gauge
sglang:spec_accept_length{dp_rank="0",engine_type="unified",model_name="llama",tp_rank="0"} 3.0
sglang:spec_accept_length{dp_rank="1",engine_type="unified",model_name="llama",tp_rank="0"} 2.0
"""


def test_gauges_of_several_ranks_are_averaged():
    si = eagle3(internal_states=[{"avg_spec_accept_length": 3.2}, {"avg_spec_accept_length": 2.6}])
    info = server_sglang_adapter({"/v1/models": load("models.json"), "/server_info": si, "/metrics": TWO_RANKS}).describe()
    # (3.2 + 2.6) / 2 = 2.9; (3.0 + 2.0) / 2 = 2.5; (0.6 + 0.4) / 2 = 0.5
    assert gauge_note(info) == (GAUGES + "; as read now: avg_spec_accept_length 2.900 on /server_info, "
                                "sglang:spec_accept_length 2.500, sglang:spec_accept_rate 0.500")
    assert info.spec_counters == [S.G_LENGTH, S.G_RATE] and info.metrics_available is True


def test_no_figure_at_all_says_how_to_get_one():
    # speculation on, no per-rank length yet (SGLang adds it after the first accepted draft), and
    # /metrics not mounted: the note points at --enable-metrics
    si = eagle3(internal_states=[{"last_gen_throughput": 0.0, "load": 0}])
    info = server_sglang_adapter({"/v1/models": load("models.json"), "/server_info": si, "/metrics": NOT_FOUND}).describe()
    assert gauge_note(info) == NO_GAUGES
    assert info.metrics_available is False and info.spec_counters == []


def test_metrics_404_is_no_metrics_not_a_parse_error():
    s = server_sglang_adapter({"/metrics": NOT_FOUND})
    assert s.metrics_samples() == {}
    snap = s.read_counters()
    assert (snap.generation_tokens, snap.prompt_tokens) == (None, None)


def test_counter_source_says_acceptance_is_a_gauge():
    snap = server_sglang_adapter({"/metrics": load("metrics-spec.txt")}).read_counters()
    assert snap.source == "GET /metrics (SGLang: acceptance is a gauge, not a counter)"


def test_per_rank_lengths_win_over_a_top_level_one():
    # constructed: older releases put avg_spec_accept_length at the top of /get_server_info (SGLang's
    # test_eagle_infer.py read server_info["avg_spec_accept_length"]); newer ones per rank in
    # internal_states. When both are there the per-rank figures are the ones read.
    si = {"avg_spec_accept_length": 9.0, "internal_states": [{"avg_spec_accept_length": 2.5},
                                                               {"avg_spec_accept_length": 3.5}]}
    assert S.accept_lengths(si) == [2.5, 3.5]
    # the top-level one alone (the older shape) is read; a non-number is dropped
    assert S.accept_lengths({"avg_spec_accept_length": 2.25, "version": "0.4.3"}) == [2.25]
    assert S.accept_lengths({"internal_states": [{"avg_spec_accept_length": "n/a"}]}) == []


# ------------------------------------------------------------------ identity of the server

def test_describe_names_the_served_model():
    s = server_sglang_adapter({"/v1/models": load("models.json"), "/server_info": load("server-info-off.json")})
    info = s.describe()
    assert info.model_id == MODEL and s.model_id == MODEL
    assert (info.backend, info.base_url, info.model_root) == ("sglang", URL, MODEL)


def test_not_sglang_word_for_word():
    with pytest.raises(NotAServer) as exc:
        server_sglang_adapter({"/v1/models": load("models.json")}).describe()
    assert str(exc.value) == (f"{URL} is an OpenAI-compatible server but not SGLang (no /server_info or "
                              "/get_server_info); pick the matching --backend")


def test_connect_mode_defaults_and_api_key():
    seen: list[httpx.Request] = []
    s = server_sglang_adapter({"/v1/models": load("models.json"), "/server_info": load("server-info-off.json")}, seen=seen,
               api_key="sk-sgl")
    assert s.verify is True and s.launched is False
    info = s.describe()
    assert info.hardware is None and NOT_KNOWN in info.notes  # given by URL on another host
    assert seen and all(r.headers["authorization"] == "Bearer sk-sgl" for r in seen)


def test_a_launched_server_runs_here():
    s = server_sglang_adapter({"/v1/models": load("models.json"), "/server_info": load("server-info-off.json")}, launched=True)
    assert s.launched is True
    info = s.describe()
    assert info.hardware is not None and info.hardware.source == STARTED_HERE and NOT_KNOWN not in info.notes


# ------------------------------------------------------------------ launch plan

def test_full_launch_plan():
    opts = S.SGLangLaunch(model="/m", python="py", host="0.0.0.0", port=30005, dtype="bfloat16",
                          max_model_len=4096, spec_config=SpecConfig(method="ngram", k=4, ngram_max=3),
                          extra_args=["--mem-fraction-static", "0.8"])
    plan = S.launch_plan(opts)
    spec = ["--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", "5"]
    assert plan.argv == ["py", "-m", "sglang.launch_server", "--model-path", "/m", "--host", "0.0.0.0",
                         "--port", "30005", "--dtype", "bfloat16", "--context-length", "4096", "--enable-metrics",
                         *spec, "--mem-fraction-static", "0.8"]
    assert (plan.backend, plan.host, plan.port, plan.model, plan.health_path) == (
        "sglang", "0.0.0.0", 30005, "/m", "/health")
    assert plan.spec_enabled is True and plan.spec_args == spec
    assert plan.notes == ["the n-gram window is not written: SGLang's NGRAM window flags differ between releases"]
    assert S.SGLangBackend().launch_plan(opts) == plan


@pytest.mark.parametrize("spec,notes", [
    (SpecConfig(method="ngram", k=4, ngram_min=2),
     ["the n-gram window is not written: SGLang's NGRAM window flags differ between releases"]),
    (SpecConfig(method="ngram", k=4), []),
    (None, []),
])
def test_ngram_window_note(spec, notes):
    assert S.launch_plan(S.SGLangLaunch(model="/m", port=30006, spec_config=spec)).notes == notes


def test_refusal_from_the_flag_check_drops_its_final_full_stop():
    # the check's sentence ends with "."; the UsageError continues it after "--spec-config: "
    with pytest.raises(UsageError) as exc:
        S.launch_plan(S.SGLangLaunch(model="/m", port=30007, extra_args=["--speculative-algorithm", "EAGLE"]))
    assert str(exc.value) == ("--spec-config: EAGLE needs --speculative-draft-model-path: add the draft model "
                              "or EAGLE head")


# ------------------------------------------------------------------ the backend

def test_backend_connect_passes_key_and_verification():
    s = S.SGLangBackend().connect("http://sgl.test:30000/v1", api_key="sk-1")
    assert isinstance(s, S.SGLangServer) and s.base_url == URL
    assert s.headers() == {"Authorization": "Bearer sk-1"} and s.verify is True and s.launched is False
    assert S.SGLangBackend().connect(URL, verify=False).verify is False


def test_backend_connect_launched_marks_it_launched():
    opts = S.SGLangLaunch(model="/m", port=30008)
    s = S.SGLangBackend().connect_launched(opts, "http://127.0.0.1:30008")
    assert isinstance(s, S.SGLangServer) and s.base_url == "http://127.0.0.1:30008" and s.launched is True


@pytest.mark.parametrize("model", [None, ""])
def test_backend_needs_a_model(model):
    with pytest.raises(UsageError) as exc:
        S.SGLangBackend().resolve_model(model)
    assert str(exc.value) == "--backend sglang needs --model (an HF model directory or id)"


def test_backend_takes_the_model_as_given():
    assert S.SGLangBackend().resolve_model("Qwen/Qwen2.5-0.5B-Instruct") == "Qwen/Qwen2.5-0.5B-Instruct"


def test_backend_version_is_the_installed_distribution(tmp_path, monkeypatch):
    dist = tmp_path / "sglang-0.5.4.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: sglang\nVersion: 0.5.4\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert S.SGLangBackend().version() == "0.5.4"


def test_backend_version_without_sglang(monkeypatch):
    monkeypatch.setattr(S.metadata, "version", _not_installed)
    assert S.SGLangBackend().version() is None


def _not_installed(name):
    raise S.metadata.PackageNotFoundError(name)


def test_every_compare_request_asks_sglang_for_its_own_speculation():
    """SGLang's per-request details come only when asked (return_spec_tokens_details); compare merges the
    server's extras into both sides' request bodies, the user's own extra keys kept."""
    from specadapt.load.client import build_body
    from specadapt.orchestration.compare import side_settings
    from specadapt.records import Prompt, RequestSettings

    settings = side_settings(S.SGLangServer("http://sgl.test:30000"), RequestSettings(extra_body={"top_k": 1}))
    for prompt in (Prompt(id="c", messages=[{"role": "user", "content": "hi"}]), Prompt(id="p", prompt="once")):
        _, body = build_body(prompt, "m", settings)
        assert body["return_spec_tokens_details"] is True and body["top_k"] == 1


def test_sglang_asks_for_its_answers_own_speculation_not_for_token_ids():
    server = S.SGLangServer("http://sgl.test:30000")
    assert server.spec_extras == {"return_spec_tokens_details": True} and server.identity_extras == {}

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

FIX = Path(__file__).parent.parent / "fixtures" / "sglang"


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

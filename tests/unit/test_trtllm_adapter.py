"""TensorRT-LLM adapter on real published payloads where there are any, and on payloads constructed
in upstream's documented shapes where there are not (origins: tests/fixtures/trtllm/README.md):
describe() signals, drained /metrics accumulated, the background poller, launch plans and their
YAML against the config validators."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import httpx
import pytest
import yaml

from specadapt.adapters import trtllm as T
from specadapt.adapters.metrics import parse_samples
from specadapt.analysis.acceptance import acceptance_summary
from specadapt.configs import trtllm as cfg
from specadapt.configs.files import validate_file
from specadapt.configs.spec import SpecConfig
from specadapt.configs.trtllm import read_trtllm_form
from specadapt.errors import NotAServer, UsageError

FIX = Path(__file__).parent.parent / "fixtures" / "trtllm"
SCHEMA = FIX / "trtllm-speculative.schema.json"  # speculative_config part, origin in README.md


def fx(name: str):
    text = (FIX / name).read_text()
    return json.loads(text) if name.endswith(".json") else text


class FakeTrtllm:
    """A scripted trtllm-serve: /metrics returns the queued entries once (drains on read)."""

    def __init__(self, prometheus: str | None = None, completion: dict | None = None):
        self.queue: list = []
        self.lock = threading.Lock()
        self.prometheus = prometheus
        self.completion = completion
        self.metrics_reads = 0
        self.on_completion: list = []

    def push(self, entries):
        with self.lock:
            self.queue.extend(entries)

    def handler(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/v1/models":
            return httpx.Response(200, json=fx("models.json"))
        if path == "/version":
            return httpx.Response(200, json=fx("version.json"))
        if path == "/metrics":
            with self.lock:
                out, self.queue = self.queue, []
                self.metrics_reads += 1
            return httpx.Response(200, json=out)
        if path == "/prometheus/metrics" and self.prometheus is not None:
            return httpx.Response(200, text=self.prometheus)
        if path == "/v1/completions" and self.completion is not None:
            for entries in self.on_completion:
                self.push(entries)
            return httpx.Response(200, json=self.completion)
        return httpx.Response(404, json={"detail": "Not Found"})

    def server(self, **kw) -> T.TRTLLMServer:
        return T.TRTLLMServer("http://trt.test:8000", transport=httpx.MockTransport(self.handler), **kw)


# ------------------------------------------------------------------ describe()

def test_prometheus_config_info_wins_and_says_what_it_cannot_tell():
    fake = FakeTrtllm(prometheus=fx("prometheus-spec-eagle3.txt"))
    info = fake.server().describe()
    assert (info.version, info.model_id) == ("1.2.1", "TinyLlama-1.1B-Chat-v1.0")
    assert info.spec_enabled is True and info.spec_method == "Eagle3" and info.num_speculative_tokens == 3
    assert info.spec_signal == "trtllm_speculative_config_info on /prometheus/metrics"
    assert any("cannot tell whether drafts are being accepted" in n for n in info.notes)
    assert T.PROM_DRAFT_TOKENS in info.spec_counters


def test_iteration_stats_detect_spec_and_estimate_k():
    fake = FakeTrtllm()
    fake.push(fx("metrics-iter-spec-eagle3-k3.json"))
    server = fake.server()
    info = server.describe()
    assert info.spec_enabled is True and info.num_speculative_tokens == 3 and info.spec_method is None
    assert info.spec_signal == "specDecodingStats in /metrics iteration stats"
    assert any("method is not named" in n for n in info.notes)
    # what describe() drained is not lost: it is in the totals the counters come from
    assert server.totals.draft_tokens == 12 and server.totals.accepted_tokens == 8


def test_iteration_stats_without_spec_mean_off():
    fake = FakeTrtllm()
    fake.push(fx("metrics-iter-no-spec.json"))
    info = fake.server().describe()
    assert info.spec_enabled is False and info.spec_counters == []


def test_docs_example_entry_is_read_as_stats_without_spec():
    fake = FakeTrtllm()
    fake.push(fx("metrics-docs-example.json"))
    server = fake.server()
    info = server.describe()
    assert server.totals.iterations == 1 and info.spec_enabled is False


def test_idle_server_falls_back_to_avg_decoded_tokens_per_iter():
    fake = FakeTrtllm(completion=fx("completion-avg-decoded.json"))
    info = fake.server().describe()
    assert info.spec_enabled is True
    assert info.spec_signal == "avg_decoded_tokens_per_iter in a completion response"
    assert any("2.67" in n and "method and k are not exposed" in n for n in info.notes)


def test_real_completion_with_avg_one_cannot_tell():
    """A real /v1/completions answer (TensorRT-LLM docs, spec off): avg_decoded_tokens_per_iter is 1.0."""
    body = fx("completion-docs-mistral-large-3.json")
    assert T.avg_decoded_tokens_per_iter(body) == 1.0
    info = FakeTrtllm(completion=body).server().describe()
    assert info.spec_enabled is None
    assert info.spec_signal == "avg_decoded_tokens_per_iter in a completion response"
    assert any("= 1.00" in n and "cannot tell speculation off from nothing accepted" in n for n in info.notes)


def test_real_1_1_server_with_empty_metrics_and_unprefixed_prometheus_names():
    """Real answers of a TensorRT-LLM 1.1.0 server started with enable_iter_perf_stats and
    return_perf_metrics: GET /metrics gave [] and /prometheus/metrics names carry no trtllm_
    prefix (and model_name/engine_type "undefined"). None of them is a speculation signal."""
    assert fx("metrics-iter-empty-issue-aibrix-2004.json") == []  # what the empty fake queue answers too
    text = fx("prometheus-1.1-issue-aibrix-2004.txt")
    samples = parse_samples(text)
    assert sorted(samples) == ["e2e_request_latency_seconds_bucket", "e2e_request_latency_seconds_sum"]
    assert samples["e2e_request_latency_seconds_sum"] == [
        ({"engine_type": "undefined", "model_name": "undefined"}, 3.4878239994868636)]
    assert [labels["le"] for labels, _ in samples["e2e_request_latency_seconds_bucket"]] == ["0.3", "0.5", "0.8"]
    assert T.spec_info_from_prometheus(text) is None
    fake = FakeTrtllm(prometheus=text)
    fake.push(fx("metrics-iter-empty-issue-aibrix-2004.json"))
    server = fake.server()
    info = server.describe()
    assert info.metrics_available is True and info.spec_counters == [] and info.spec_enabled is None
    assert any("cannot tell whether speculative decoding is on" in n for n in info.notes)
    snap = server.read_counters()
    assert server.totals.iterations == 0 and snap.generation_tokens is None and snap.prompt_tokens is None


def test_probe_request_that_produces_stats_uses_them():
    fake = FakeTrtllm(completion=fx("completion-avg-decoded.json"))
    fake.on_completion.append(fx("metrics-iter-spec-eagle3-k3.json"))
    info = fake.server().describe()
    assert info.spec_signal == "specDecodingStats in /metrics iteration stats" and info.spec_enabled is True


def test_nothing_at_all_is_stated():
    info = FakeTrtllm().server().describe()
    assert info.spec_enabled is None
    assert any("cannot tell whether speculative decoding is on" in n for n in info.notes)


def test_vllm_is_not_taken_for_trtllm():
    def handler(request):
        if request.url.path == "/v1/models":
            return httpx.Response(200, json=fx("models.json"))
        return httpx.Response(404)
    with pytest.raises(NotAServer, match="not trtllm-serve"):
        T.TRTLLMServer("http://x.test", transport=httpx.MockTransport(handler)).describe()


# ------------------------------------------------------------------ counters

def test_counters_accumulate_across_drains_and_match_the_vllm_fields():
    fake = FakeTrtllm()
    server = fake.server()
    before = server.read_counters()
    entries = fx("metrics-iter-spec-eagle3-k3.json")
    fake.push(entries[:2])
    server.read_counters()  # drains the first two; they must not be lost
    fake.push(entries[2:])
    after = server.read_counters()
    assert (after.drafts, after.draft_tokens, after.accepted_tokens) == (4.0, 12.0, 8.0)
    acc = acceptance_summary(before, after)
    assert acc.known and acc.acceptance_rate == pytest.approx(8 / 12)
    # 1 + accepted/drafts; upstream's acceptanceLength per entry is 2.5 and 3.5 (mean 3.0)
    assert acc.mean_acceptance_length == pytest.approx(3.0)


def test_no_metrics_route_means_no_spec_counters():
    def handler(request):
        return httpx.Response(404)
    snap = T.TRTLLMServer("http://x.test", transport=httpx.MockTransport(handler)).read_counters()
    assert not snap.has_spec_counters and "no iteration stats" in snap.source


def test_empty_stats_list_means_zero_drafts_not_unknown_counters():
    snap = FakeTrtllm().server().read_counters()
    assert snap.has_spec_counters and snap.draft_tokens == 0
    assert acceptance_summary(snap, snap).reason == "no drafts were proposed during the run"


def test_prometheus_only_gives_tokens_but_not_length():
    fake = FakeTrtllm(prometheus=fx("prometheus-spec-eagle3.txt"))
    snap = fake.server().read_counters()
    assert (snap.draft_tokens, snap.accepted_tokens, snap.drafts) == (60.0, 36.0, None)
    assert snap.generation_tokens == 80.0 and "acceptance length unknown" in snap.source


def test_background_poller_keeps_what_a_bounded_queue_would_lose():
    fake = FakeTrtllm()
    server = fake.server(poll_interval_s=0.02)
    before = server.read_counters()
    server.start_run()
    entries = fx("metrics-iter-spec-eagle3-k3.json")
    for _ in range(5):
        fake.push(entries)
        deadline = time.monotonic() + 2
        while fake.queue and time.monotonic() < deadline:  # the poller empties it, not us
            time.sleep(0.01)
        assert fake.queue == []
    server.end_run()
    after = server.read_counters()
    assert after.draft_tokens - before.draft_tokens == 60 and after.drafts - before.drafts == 20
    assert server._poller is None


def test_run_hooks_are_noops_on_servers_whose_counters_do_not_drain():
    from specadapt.adapters.vllm import VLLMServer

    server = VLLMServer("http://v.test:8000")
    assert server.start_run() is None and server.end_run() is None


def test_stream_field_is_read_by_the_adapter():
    chunk = {"choices": [{"index": 0, "delta": {"content": "x"}, "avg_decoded_tokens_per_iter": 3.0}]}
    assert T.avg_decoded_tokens_per_iter(chunk) == 3.0
    assert T.avg_decoded_tokens_per_iter({"choices": [{"text": "x"}]}) is None


# ------------------------------------------------------------------ launch plans

def _plan(tmp_path, **kw):
    opts = T.TRTLLMLaunch(model="/models/llama", config_dir=str(tmp_path), port=8301, **kw)
    plan = T.launch_plan(opts)
    return plan, yaml.safe_load(Path(plan.argv[plan.argv.index(plan.argv[-1])]).read_text())


def test_spec_off_plan_still_enables_iteration_stats_and_says_so(tmp_path):
    plan, doc = _plan(tmp_path)
    assert plan.argv[:2] == ["trtllm-serve", "/models/llama"] and plan.argv[-2] == "--config"
    assert plan.health_path == "/health" and plan.spec_enabled is False
    assert doc == {"enable_iter_perf_stats": True}
    assert any("enable_iter_perf_stats: true" in n for n in plan.notes)


def test_neutral_ngram_becomes_trtllm_ngram(tmp_path):
    plan, doc = _plan(tmp_path, spec_config=SpecConfig(method="ngram", k=4, ngram_max=3))
    assert doc["speculative_config"] == {"decoding_type": "NGram", "max_draft_len": 4,
                                         "max_matching_ngram_size": 3}
    assert doc["disable_overlap_scheduler"] is True and plan.spec_enabled


def test_native_eagle3_keeps_user_keys_and_old_versions_get_the_old_flag(tmp_path):
    sc = {"decoding_type": "Eagle3", "max_draft_len": 3, "speculative_model": "/d", "eagle3_one_model": True}
    plan, doc = _plan(tmp_path, spec_config=read_trtllm_form(sc), version="1.1.0", tp=2, max_model_len=4096)
    assert doc["speculative_config"] == sc
    a = plan.argv
    assert a[a.index("--tp_size") + 1] == "2" and a[a.index("--max_seq_len") + 1] == "4096"
    assert a[-2] == "--extra_llm_api_options"
    assert a[a.index("--host") + 1] == "127.0.0.1" and a[a.index("--port") + 1] == "8301"


def test_bad_config_is_refused_before_starting(tmp_path):
    with pytest.raises(UsageError, match="^--spec-config: .*--draft"):
        _plan(tmp_path, spec_config=SpecConfig(method="eagle3", k=3))
    with pytest.raises(UsageError, match="^--spec-config: TensorRT-LLM \\(tensorrt backend\\) does not support "
                                         "method 'eagle3'"):
        _plan(tmp_path, spec_config=SpecConfig(method="eagle3", k=3, draft="/d"), engine="tensorrt")


@pytest.mark.parametrize("spec", [
    None,
    SpecConfig(method="ngram", k=4),
    SpecConfig(method="eagle3", k=3, draft="/heads/eagle3"),
    read_trtllm_form({"decoding_type": "MTP", "max_draft_len": 2}),
    read_trtllm_form({"decoding_type": "Draft_Target", "max_draft_len": 4, "speculative_model": "/draft"}),
    read_trtllm_form({"decoding_type": "NGram", "max_draft_len": 4, "is_keep_all": False}),
])
def test_written_yaml_passes_the_validators_and_the_published_schema(tmp_path, spec):
    plan, doc = _plan(tmp_path, spec_config=spec)
    report = validate_file(Path(plan.argv[-1]))
    assert report.ok, report
    assert cfg.check_trtllm_config(doc) == []  # no warnings either: iteration stats are on
    if doc.get("speculative_config"):
        assert cfg.schema_problems(doc, cfg.load_schema(SCHEMA)) == []


def test_trtllm_serve_next_to_the_given_python_is_used(tmp_path):
    (tmp_path / "trtllm-serve").write_text("#!/bin/sh\n")
    plan = T.launch_plan(T.TRTLLMLaunch(model="m", python=str(tmp_path / "python"), config_dir=str(tmp_path)))
    assert plan.argv[0] == str(tmp_path / "trtllm-serve")


def test_backend_needs_an_explicit_model():
    with pytest.raises(UsageError, match="needs --model"):
        T.TRTLLMBackend().resolve_model(None)
    assert T.TRTLLMBackend().version() is None  # not installable here


def test_cli_refuses_a_bad_launch_option_in_one_line():
    from click.testing import CliRunner

    from specadapt.cli import cli

    result = CliRunner().invoke(cli, ["probe", "--backend", "trtllm", "--model", "/m", "--dtype", "fp7"])
    assert result.exit_code == 2 and "--backend trtllm: dtype:" in result.output
    assert "Traceback" not in result.output

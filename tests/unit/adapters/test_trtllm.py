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
from specadapt.adapters.hardware import NOT_KNOWN
from specadapt.analysis.watch import interval_between
from specadapt.records import CounterSnapshot

FIX = Path(__file__).parents[2] / "fixtures" / "trtllm"
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


# TensorRT-LLM adapter edges: when speculation counts as on, off or unknown (the Prometheus info
URL = "http://trt.test:8000"  # not loopback: describe() starts its notes with NOT_KNOWN
MODEL = "TinyLlama-1.1B-Chat-v1.0"  # the id in models.json
SPEC_K3 = fx("metrics-iter-spec-eagle3-k3.json")  # 1 prefill entry, then 2 entries of 6 drafts / 2 requests
NO_SPEC = fx("metrics-iter-no-spec.json")  # 2 entries without specDecodingStats
PROM = fx("prometheus-spec-eagle3.txt")
SPEC_KEYS = ["numDraftTokens", "numAcceptedTokens", "numRequestsWithDraftTokens", "acceptanceLength"]

# what describe() tells the user, word for word
PROM_NOTE = ("speculation read from trtllm_speculative_config_info on /prometheus/metrics: the configured "
             "method and k only; it cannot tell whether drafts are being accepted")
ITER_NOTE = ("speculation read from specDecodingStats in /metrics iteration stats: drafts were proposed; the "
             "method is not named there and k is estimated as draft tokens per drafting request")
CANNOT_TELL = ("cannot tell whether speculative decoding is on: no trtllm_speculative_config_info, no iteration "
               "stats on /metrics (start with enable_iter_perf_stats: true) and no avg_decoded_tokens_per_iter "
               "in a completion")
AVG_UNSURE = ("avg_decoded_tokens_per_iter in a completion response = 1.00 (one 16-token request sent to find "
              "out): 1.0 cannot tell speculation off from nothing accepted")


def off_note(n: int) -> str:
    return (f"{n} iteration entries on /metrics carry no specDecodingStats with drafts: speculation looks off "
            "(or only prefill ran since the last read)")


def avg_on_note(shown: str) -> str:
    return (f"avg_decoded_tokens_per_iter in a completion response = {shown} (one 16-token request sent to find "
            "out): tokens were accepted, so speculation is on; method and k are not exposed")


def spec_stats(drafted, accepted, requests, length, **more) -> dict:
    """One iteration entry with specDecodingStats. Constructed: keys from SpecDecodingStats in
    cpp/include/tensorrt_llm/executor/types.h (tests/fixtures/trtllm/README.md); the entry around it
    as in metrics-iter-spec-eagle3-k3.json."""
    stats = {"numDraftTokens": drafted, "numAcceptedTokens": accepted, "numRequestsWithDraftTokens": requests,
             "acceptanceLength": length, "iterLatencyMS": 0.0, "draftOverhead": 0.0, **more}
    return {"iter": 20, "iterLatencyMS": 9.0, "numActiveRequests": 1, "specDecodingStats": stats}


# Constructed: the iteration entry PyExecutor writes when no scheduled request carried draft tokens
# (a prefill-only step of a spec-on server): tensorrt_llm/_torch/pyexecutor/py_executor.py fills
# specdec_stats with the zero sums and sets acceptance_length = 0.0 when num_requests_with_draft is 0.
NO_DRAFTS = spec_stats(0, 0, 0, 0.0)


class Recording(FakeTrtllm):
    """FakeTrtllm that also keeps every request, and can answer a route differently."""

    def __init__(self, *a, models=None, metrics_status=200, completion_status=200, **kw):
        super().__init__(*a, **kw)
        self.requests: list[httpx.Request] = []
        self.models = models
        self.metrics_status = metrics_status
        self.completion_status = completion_status

    def handler(self, request):
        self.requests.append(request)
        path = request.url.path
        if path == "/v1/models" and self.models is not None:
            return httpx.Response(200, json=self.models)
        if path == "/metrics" and self.metrics_status != 200:
            return httpx.Response(self.metrics_status, json={"detail": "Not Found"})
        if path == "/v1/completions" and self.completion_status != 200:
            return httpx.Response(self.completion_status, json=self.completion)
        return super().handler(request)


def prom_with(old: str, new: str) -> str:
    """The constructed prometheus-spec-eagle3.txt with one label of trtllm_speculative_config_info changed."""
    assert old in PROM
    return PROM.replace(old, new)


# ------------------------------------------------------------------ IterStatsTotals.add

def test_totals_of_the_eagle3_entries_exactly():
    totals = T.IterStatsTotals()
    assert totals.add(SPEC_K3) == 3
    # prefill entry: an iteration, not a spec iteration; then 2 x (6 drafted, 2 requests), accepted 3 + 5
    assert totals.model_dump() == {"iterations": 3, "spec_iterations": 2, "drafts": 4, "draft_tokens": 12,
                                   "accepted_tokens": 8, "max_draft_per_request": 3.0, "last_active": 2.0,
                                   "last_queued": None}
    assert totals.add(SPEC_K3[1:]) == 2  # a second drain adds on
    assert totals.model_dump() == {"iterations": 5, "spec_iterations": 4, "drafts": 8, "draft_tokens": 24,
                                   "accepted_tokens": 16, "max_draft_per_request": 3.0, "last_active": 2.0,
                                   "last_queued": None}


def test_entry_without_drafts_is_skipped_and_the_next_one_still_counts():
    # k=1, one request, its one draft rejected: 1 drafted, 0 accepted, acceptance length 1.0
    one_rejected = spec_stats(1, 0, 1, 1.0)
    totals = T.IterStatsTotals()
    assert totals.add([NO_DRAFTS, one_rejected]) == 2
    assert totals.model_dump() == {"iterations": 2, "spec_iterations": 1, "drafts": 1, "draft_tokens": 1,
                                   "accepted_tokens": 0, "max_draft_per_request": 1.0, "last_active": 1.0,
                                   "last_queued": None}


def test_entry_without_a_request_count_adds_tokens_but_no_drafts():
    # constructed: specDecodingStats without numRequestsWithDraftTokens: tokens add up, the number of
    # drafts (and so the per-request figure) stays unknown rather than guessed
    entry = spec_stats(3, 2, 0, 0.0)
    del entry["specDecodingStats"]["numRequestsWithDraftTokens"]
    totals = T.IterStatsTotals()
    totals.add([entry])
    assert totals.model_dump() == {"iterations": 1, "spec_iterations": 1, "drafts": 0, "draft_tokens": 3,
                                   "accepted_tokens": 2, "max_draft_per_request": None, "last_active": 1.0,
                                   "last_queued": None}


def test_draft_tokens_per_request_is_the_plain_ratio():
    # 1 draft token over 2 requests: 0.5, with no floor at 1 (upstream never sends fewer tokens than
    # requests, since it counts a request only when it drafted; the ratio is still the ratio)
    totals = T.IterStatsTotals()
    totals.add([spec_stats(1, 0, 2, 1.0)])
    assert totals.max_draft_per_request == 0.5


def test_something_that_is_not_an_entry_is_skipped_not_the_rest():
    totals = T.IterStatsTotals()
    assert totals.add(["not an entry", SPEC_K3[1]]) == 1
    assert (totals.iterations, totals.spec_iterations, totals.draft_tokens) == (1, 1, 6)


# ------------------------------------------------------------------ iteration_entries, avg_decoded_tokens_per_iter

def test_iteration_entries_take_one_dict_a_list_and_json_strings():
    entry = SPEC_K3[1]
    assert T.iteration_entries(entry) == [entry]
    # entries may come as JSON strings; what is not JSON or not an object is dropped, the rest kept
    body = [json.dumps(SPEC_K3[0]), "{not json", entry, 3, None, json.dumps(NO_SPEC[0])]
    assert T.iteration_entries(body) == [SPEC_K3[0], entry, NO_SPEC[0]]
    assert T.iteration_entries("[]") == [] and T.iteration_entries(None) == []


def test_avg_decoded_from_the_first_choice_that_has_it_else_the_body():
    assert T.avg_decoded_tokens_per_iter({"choices": [None, {"avg_decoded_tokens_per_iter": 2}]}) == 2.0
    assert T.avg_decoded_tokens_per_iter({"choices": [], "avg_decoded_tokens_per_iter": 1.5}) == 1.5
    assert T.avg_decoded_tokens_per_iter({"avg_decoded_tokens_per_iter": 2}) == 2.0
    assert T.avg_decoded_tokens_per_iter({"avg_decoded_tokens_per_iter": "2.5"}) is None
    assert T.avg_decoded_tokens_per_iter("") is None


# ------------------------------------------------------------------ describe(): the Prometheus info metric

@pytest.mark.parametrize(("value", "enabled"), [
    ("true", True), ("True", True), ("1", True), (" Yes ", True), ("YES", True),
    ("false", False), ("0", False), ("no", False),
])
def test_spec_enabled_label_spellings(value, enabled):
    text = prom_with('spec_enabled="true"', f'spec_enabled="{value}"')
    info = FakeTrtllm(prometheus=text).server().describe()
    assert info.spec_enabled is enabled and info.spec_signal == "trtllm_speculative_config_info on /prometheus/metrics"


def test_prometheus_info_is_the_whole_answer_and_leaves_metrics_undrained():
    fake = Recording(prometheus=PROM)
    fake.push(SPEC_K3)
    server = fake.server()
    info = server.describe()
    assert (info.spec_enabled, info.spec_method, info.num_speculative_tokens) == (True, "Eagle3", 3)
    assert info.notes == [NOT_KNOWN, PROM_NOTE]
    assert info.metrics_available is True
    assert info.spec_counters == [T.PROM_DRAFT_TOKENS, T.PROM_ACCEPTED]
    # /metrics was not read: its entries wait for read_counters()
    assert fake.metrics_reads == 0 and server.totals.iterations == 0 and len(fake.queue) == 3


def test_info_metric_without_k_or_method():
    # upstream (openai_server.py) sets spec_num_tokens only when max_draft_len is not None and
    # spec_method only when decoding_type is not None
    text = prom_with(',spec_method="Eagle3",spec_num_tokens="3"', "")
    info = FakeTrtllm(prometheus=text).server().describe()
    assert (info.spec_enabled, info.spec_method, info.num_speculative_tokens) == (True, None, None)
    assert info.notes == [NOT_KNOWN, PROM_NOTE]


def test_info_metric_k_that_is_not_a_whole_number_is_unknown():
    info = FakeTrtllm(prometheus=prom_with('spec_num_tokens="3"', 'spec_num_tokens="None"')).server().describe()
    assert info.num_speculative_tokens is None and info.spec_method == "Eagle3"


# ------------------------------------------------------------------ describe(): iteration stats

def test_iteration_stats_say_on_with_k_and_the_counters_they_carry():
    fake = FakeTrtllm()  # no /prometheus/metrics
    fake.push(SPEC_K3)
    info = fake.server().describe()
    assert (info.spec_enabled, info.spec_method, info.num_speculative_tokens) == (True, None, 3)
    assert info.metrics_available is True and info.spec_counters == SPEC_KEYS
    assert info.notes == [NOT_KNOWN, ITER_NOTE]


def test_iteration_stats_without_drafts_say_off_in_words():
    fake = FakeTrtllm()
    fake.push(NO_SPEC)
    info = fake.server().describe()
    assert info.spec_enabled is False and info.spec_counters == [] and info.metrics_available is True
    assert info.notes == [NOT_KNOWN, off_note(2)]


def test_zero_draft_spec_stats_count_as_no_drafts():
    fake = FakeTrtllm()
    fake.push([NO_DRAFTS])
    info = fake.server().describe()
    assert info.spec_enabled is False and info.notes == [NOT_KNOWN, off_note(1)]


def test_only_entries_since_the_last_read_decide():
    """describe() after read_counters() looks at what is new on /metrics, not at the totals so far."""
    fake = FakeTrtllm()
    server = fake.server()
    fake.push(SPEC_K3)
    server.read_counters()  # 2 spec iterations already in the totals
    fake.push(NO_SPEC)
    assert server.describe().spec_enabled is False
    fake.push(SPEC_K3)
    info = server.describe()
    assert info.spec_enabled is True and info.spec_counters == SPEC_KEYS


def test_spec_stats_without_a_request_count_say_on_but_k_unknown():
    entry = spec_stats(3, 2, 0, 0.0)
    del entry["specDecodingStats"]["numRequestsWithDraftTokens"]
    fake = FakeTrtllm()
    fake.push([entry])
    info = fake.server().describe()
    assert info.spec_enabled is True and info.num_speculative_tokens is None


# ------------------------------------------------------------------ describe(): the completion probe

def test_the_probe_request_is_one_greedy_16_token_completion():
    fake = Recording(completion=fx("completion-docs-mistral-large-3.json"))
    fake.server().describe()
    posts = [r for r in fake.requests if r.method == "POST"]
    assert [r.url.path for r in posts] == ["/v1/completions"]
    assert json.loads(posts[0].content) == {"model": MODEL, "prompt": "The capital of France is",
                                            "max_tokens": 16, "temperature": 0.0}


def test_avg_just_above_one_means_accepted():
    # constructed: completion-avg-decoded.json with 16 tokens in 13 steps (16 / 13 = 1.23)
    body = fx("completion-avg-decoded.json")
    body["choices"][0]["avg_decoded_tokens_per_iter"] = 16 / 13
    info = FakeTrtllm(completion=body).server().describe()
    assert info.spec_enabled is True
    assert info.notes == [NOT_KNOWN, avg_on_note("1.23")]


def test_avg_of_one_is_stated_as_undecided_and_nothing_else():
    info = FakeTrtllm(completion=fx("completion-docs-mistral-large-3.json")).server().describe()
    assert info.spec_enabled is None and info.notes == [NOT_KNOWN, AVG_UNSURE]


def test_stats_the_probe_produced_are_the_whole_answer():
    fake = FakeTrtllm(completion=fx("completion-avg-decoded.json"))
    fake.on_completion.append(SPEC_K3)
    info = fake.server().describe()
    assert info.notes == [NOT_KNOWN, ITER_NOTE] and info.num_speculative_tokens == 3


def test_an_error_answer_is_not_read_as_a_completion():
    fake = Recording(completion=fx("completion-avg-decoded.json"), completion_status=500)
    info = fake.server().describe()
    assert info.spec_enabled is None and info.spec_signal is None
    assert info.notes == [NOT_KNOWN, CANNOT_TELL]


def test_no_signal_at_all_in_words():
    info = FakeTrtllm().server().describe()
    assert info.notes == [NOT_KNOWN, CANNOT_TELL] and info.metrics_available is False


# ------------------------------------------------------------------ describe(): identity and launch config

def test_not_trtllm_serve_in_words():
    def handler(request):
        if request.url.path == "/v1/models":
            return httpx.Response(200, json=fx("models.json"))
        return httpx.Response(404)
    with pytest.raises(NotAServer) as exc:
        T.TRTLLMServer("http://x.test", transport=httpx.MockTransport(handler)).describe()
    assert str(exc.value) == ("http://x.test is an OpenAI-compatible server but not trtllm-serve (no GET /version); "
                              "pick the matching --backend")


def test_model_root_is_kept_when_the_models_answer_has_one():
    # constructed: trtllm-serve's own ModelCard (tensorrt_llm/serve/openai_protocol.py) has no root;
    # this is models.json with the root field of vLLM's ModelCard, as a router in front may answer
    models = fx("models.json")
    models["data"][0]["root"] = "/models/tinyllama"
    info = Recording(models=models).server().describe()
    assert (info.model_id, info.model_root) == (MODEL, "/models/tinyllama")
    assert FakeTrtllm().server().describe().model_root is None  # models.json as trtllm-serve gives it


EAGLE3_SC = {"decoding_type": "Eagle3", "max_draft_len": 4, "speculative_model": "/d"}


def test_launched_config_fills_method_and_k_when_no_signal_gives_them():
    info = FakeTrtllm().server(spec_config=EAGLE3_SC).describe()
    assert (info.spec_method, info.num_speculative_tokens, info.spec_enabled) == ("Eagle3", 4, None)


def test_launched_config_does_not_override_what_the_server_says():
    fake = FakeTrtllm()
    fake.push(SPEC_K3)
    info = fake.server(spec_config=EAGLE3_SC).describe()
    assert (info.spec_method, info.num_speculative_tokens) == ("Eagle3", 3)  # k measured 3, launched 4
    ngram = {"decoding_type": "NGram", "max_draft_len": 5}
    info = FakeTrtllm(prometheus=PROM).server(spec_config=ngram).describe()
    assert (info.spec_method, info.num_speculative_tokens) == ("Eagle3", 3)


# ------------------------------------------------------------------ read_counters()

def test_counters_from_iteration_stats_with_token_totals_from_prometheus():
    fake = FakeTrtllm(prometheus=PROM)
    fake.push(SPEC_K3)
    snap = fake.server().read_counters()
    assert snap == CounterSnapshot(drafts=4.0, draft_tokens=12.0, accepted_tokens=8.0, generation_tokens=80.0,
                                   prompt_tokens=48.0,
                                   source="GET /metrics iteration stats (specDecodingStats), 3 entries accumulated")


def test_counters_from_prometheus_only_exactly():
    snap = FakeTrtllm(prometheus=PROM).server().read_counters()
    assert snap == CounterSnapshot(draft_tokens=60.0, accepted_tokens=36.0, generation_tokens=80.0,
                                   prompt_tokens=48.0,
                                   source="GET /prometheus/metrics (no per-step draft count: acceptance length unknown)")


def test_no_iteration_stats_list_keeps_the_token_totals():
    # constructed: prometheus-spec-eagle3.txt cut to its prompt and generation token families, as a
    # spec-off server with return_perf_metrics answers; /metrics answers 404
    tokens_only = "\n".join(line for line in PROM.splitlines()
                            if "prompt_tokens_total" in line or "generation_tokens_total" in line) + "\n"
    fake = Recording(prometheus=tokens_only, metrics_status=404)
    snap = fake.server().read_counters()
    assert snap == CounterSnapshot(generation_tokens=80.0, prompt_tokens=48.0,
                                   source="GET /metrics gave no iteration stats list")


# ------------------------------------------------------------------ the server object and its poller

def test_a_new_server_and_its_defaults():
    server = T.TRTLLMServer(URL)
    assert server.verify is True and server.launched is False and server.spec_config is None
    assert server.poll_errors == 0 and server.metrics_answered is False
    assert server.headers() == {}
    keyed = T.TRTLLMServer(URL, api_key="sk-test", verify=False, launched=True)
    assert keyed.headers() == {"Authorization": "Bearer sk-test"}
    assert keyed.verify is False and keyed.launched is True


def test_api_key_is_sent_on_every_request():
    fake = Recording(prometheus=PROM)
    fake.server(api_key="sk-test").describe()
    assert fake.requests and all(r.headers.get("authorization") == "Bearer sk-test" for r in fake.requests)


def test_poller_is_one_daemon_thread_named_for_what_it_does():
    server = FakeTrtllm().server(poll_interval_s=0.01)
    before = set(threading.enumerate())
    server.start_run()
    server.start_run()  # a second start is a no-op
    try:
        new = [t for t in threading.enumerate() if t not in before]
        assert [(t.name, t.daemon) for t in new] == [("trtllm-metrics-poller", True)]
    finally:
        server.end_run()
    assert not new[0].is_alive()


def test_poller_counts_each_failed_read_and_keeps_polling():
    failures = {"n": 0}
    fake = FakeTrtllm()

    def handler(request):
        if request.url.path == "/metrics" and failures["n"] < 3:
            failures["n"] += 1
            raise httpx.ConnectError("connection refused", request=request)
        return fake.handler(request)

    server = T.TRTLLMServer(URL, transport=httpx.MockTransport(handler), poll_interval_s=0.005)
    server.start_run()
    deadline = time.monotonic() + 5
    while failures["n"] < 3 and time.monotonic() < deadline:  # waiting, not timing
        time.sleep(0.005)
    fake.push(SPEC_K3)
    server.end_run()  # its last drain reads whatever the poller left
    assert failures["n"] == 3 and server.poll_errors == 3
    assert server.totals.draft_tokens == 12


# ------------------------------------------------------------------ launch plans

def _opts(tmp_path, **kw):
    kw.setdefault("config_dir", str(tmp_path))
    return T.TRTLLMLaunch(model="/models/llama", port=8301, **kw)


def test_off_plan_exactly(tmp_path):
    plan = T.launch_plan(_opts(tmp_path, dtype="bfloat16", host="0.0.0.0"))
    path = tmp_path / "trtllm-off-8301.yaml"
    assert plan.argv == ["trtllm-serve", "/models/llama", "--host", "0.0.0.0", "--port", "8301", "--backend",
                         "pytorch", "--config", str(path)]
    assert (plan.backend, plan.host, plan.port, plan.spec_enabled, plan.model) == (
        "trtllm", "0.0.0.0", 8301, False, "/models/llama")
    assert plan.notes == [T.ITER_STATS_NOTE, f"trtllm-serve config written to {path}"]
    assert plan.config == {"dtype": "bfloat16", "enable_iter_perf_stats": True} and plan.spec_settings == {}
    assert plan.per_server_flags == ["--host", "--port", "--config"]
    assert path.read_text() == "dtype: bfloat16\nenable_iter_perf_stats: true\n"


def test_ngram_plan_says_why_the_overlap_scheduler_goes(tmp_path):
    plan = T.launch_plan(_opts(tmp_path, spec_config=SpecConfig(method="ngram", k=4, ngram_max=3)))
    path = tmp_path / "trtllm-spec-8301.yaml"
    assert plan.argv[-2:] == ["--config", str(path)] and path.is_file()
    assert plan.notes == [
        T.ITER_STATS_NOTE, f"trtllm-serve config written to {path}",
        "disable_overlap_scheduler: true goes with this speculative_config (as in TensorRT-LLM's examples for "
        "it): it is recorded as part of the speculation, so the spec-off server keeps the overlap scheduler"]
    assert plan.spec_settings == {"speculative_config": {"decoding_type": "NGram", "max_draft_len": 4,
                                                         "max_matching_ngram_size": 3},
                                  "disable_overlap_scheduler": True}
    assert plan.config == {"enable_iter_perf_stats": True}


def test_eagle3_plan_has_no_overlap_note(tmp_path):
    spec = read_trtllm_form({"decoding_type": "Eagle3", "max_draft_len": 3, "speculative_model": "/d"})
    plan = T.launch_plan(_opts(tmp_path, spec_config=spec))
    path = tmp_path / "trtllm-spec-8301.yaml"
    assert plan.notes == [T.ITER_STATS_NOTE, f"trtllm-serve config written to {path}"]


def test_medusa_on_the_tensorrt_engine(tmp_path):
    """Medusa runs only on the TensorRT engine: both the config check and the command use that engine."""
    plan = T.launch_plan(_opts(tmp_path, engine="tensorrt",
                               spec_config=SpecConfig(method="medusa", k=3, draft="/heads")))
    assert plan.argv[plan.argv.index("--backend") + 1] == "tensorrt"
    assert plan.spec_settings == {"speculative_config": {"decoding_type": "Medusa", "max_draft_len": 3,
                                                         "speculative_model": "/heads"}}


def test_old_version_names_the_old_config_flag_as_per_server(tmp_path):
    plan = T.launch_plan(_opts(tmp_path, version="1.1.0"))
    assert plan.per_server_flags == ["--host", "--port", "--extra_llm_api_options"]


def test_yaml_goes_to_a_new_nested_folder(tmp_path):
    folder = tmp_path / "a" / "b"
    plan = T.launch_plan(_opts(tmp_path, config_dir=str(folder)))
    assert plan.argv[-1] == str(folder / "trtllm-off-8301.yaml") and Path(plan.argv[-1]).is_file()


def test_yaml_goes_to_the_runs_dir_by_default(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECADAPT_CACHE_DIR", str(tmp_path / "cache"))
    plan = T.launch_plan(_opts(tmp_path, config_dir=None))
    assert plan.argv[-1] == str(tmp_path / "cache" / "runs" / "trtllm-off-8301.yaml")


def test_config_errors_in_one_line_without_the_final_period():
    with pytest.raises(UsageError) as exc:
        T.trtllm_config_doc(T.TRTLLMLaunch(model="m", version="latest"))
    assert str(exc.value) == "--spec-config: 'latest' is not a version number: write it like 0.8.5 or 1.2.1"
    with pytest.raises(UsageError) as exc:
        T.trtllm_config_doc(T.TRTLLMLaunch(model="m", spec_config=SpecConfig(method="eagle3", k=3)))
    assert str(exc.value) == ("--spec-config: Method 'eagle3' needs a draft (a draft model, EAGLE head or "
                              "Medusa heads): add --draft PATH_OR_HF_ID")


# ------------------------------------------------------------------ the backend

def test_backend_launch_plan_is_the_module_plan(tmp_path):
    opts = _opts(tmp_path, spec_config=SpecConfig(method="ngram", k=4))
    assert T.TRTLLMBackend().launch_plan(opts) == T.launch_plan(opts)


def test_connect_launched_knows_the_speculative_config(tmp_path):
    opts = _opts(tmp_path, spec_config=SpecConfig(method="ngram", k=4, ngram_max=3))
    server = T.TRTLLMBackend().connect_launched(opts, "http://127.0.0.1:8301")
    assert server.base_url == "http://127.0.0.1:8301" and server.launched is True
    assert server.spec_config == {"decoding_type": "NGram", "max_draft_len": 4, "max_matching_ngram_size": 3}
    assert list(tmp_path.iterdir()) == []  # nothing written: the launch plan did that
    with pytest.raises(UsageError, match="^--spec-config: 'latest' is not a version number"):
        T.TRTLLMBackend().connect_launched(_opts(tmp_path, version="latest"), "http://127.0.0.1:8301")


def test_connect_passes_key_and_verification():
    server = T.TRTLLMBackend().connect("http://trt.test:8000/v1", api_key="sk-test")
    assert isinstance(server, T.TRTLLMServer) and server.base_url == URL
    assert server.headers() == {"Authorization": "Bearer sk-test"} and server.verify is True
    assert T.TRTLLMBackend().connect(URL, verify=False).verify is False
    assert T.TRTLLMBackend().connect(URL).headers() == {}


def test_resolve_model_in_words():
    assert T.TRTLLMBackend().resolve_model("/models/llama") == "/models/llama"
    with pytest.raises(UsageError) as exc:
        T.TRTLLMBackend().resolve_model("")
    assert str(exc.value) == ("--backend trtllm needs --model (an HF model directory or id): the embedded GGUF "
                              "model cannot be served by TensorRT-LLM")


def test_version_of_an_installed_tensorrt_llm(tmp_path, monkeypatch):
    # constructed: the dist-info folder pip writes for the tensorrt_llm wheel (name normalised with _)
    info = tmp_path / "tensorrt_llm-1.2.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: tensorrt_llm\nVersion: 1.2.1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert T.TRTLLMBackend().version() == "1.2.1"


# ------------------------------------------------------------------ read_live (specadapt watch)

def _hist(name: str, s: float, n: float, labels: str = 'model_name="llama"') -> str:
    """A histogram's _sum and _count lines (constructed; names as stated by each caller)."""
    return (f"# TYPE {name} histogram\n{name}_sum{{{labels}}} {s}\n{name}_count{{{labels}}} {n}\n"
            f'{name}_bucket{{{labels},le="+Inf"}} {n}\n')


def test_live_batch_from_iteration_stats_and_idle_reads_as_zero():
    """No Prometheus: the batch and queue are the latest drained entry's; a read that drains no
    entry (no iteration ran) is an idle server, 0, once iteration stats have been seen."""
    fake = FakeTrtllm()
    server = fake.server()
    first = server.read_live()  # nothing drained yet, never any iteration: unknown, not 0
    assert (first.running, first.waiting, first.ttft, first.tpot) == (None, None, None, None)
    fake.push(SPEC_K3)  # numActiveRequests 2 in each entry, no numQueuedRequests
    snap = server.read_live()
    assert (snap.running, snap.waiting) == (2.0, None)
    assert (snap.counters.drafts, snap.counters.draft_tokens, snap.counters.accepted_tokens) == (4, 12, 8)
    idle = server.read_live()
    assert (idle.running, idle.waiting) == (0.0, 0.0)
    assert idle.counters.draft_tokens == 12  # the totals stay
    # constructed entries: IterationStats' numActiveRequests / numQueuedRequests (executor/types.h)
    fake.push([{"iter": 13, "numActiveRequests": 7, "numQueuedRequests": 1},
               {"iter": 14, "numActiveRequests": 5, "numQueuedRequests": 3}])
    busy = server.read_live()
    assert (busy.running, busy.waiting) == (5.0, 3.0)  # the latest iteration, not a mean


def test_live_reads_prometheus_gauges_and_histograms_first():
    """Constructed /prometheus/metrics with the names of tensorrt_llm/metrics/collector.py
    @ 050f80de: the running gauge wins over the iteration entries, TTFT and TPOT histograms
    summed over label sets; TensorRT-LLM 1.1's unprefixed histogram names are read too."""
    prom = (PROM + "# TYPE trtllm_num_requests_running gauge\n"
            'trtllm_num_requests_running{model_name="llama"} 9\n'
            "# TYPE trtllm_num_requests_waiting gauge\n"
            'trtllm_num_requests_waiting{model_name="llama"} 4\n'
            + _hist("trtllm_time_to_first_token_seconds", 1.5, 6)
            + _hist("trtllm_time_to_first_token_seconds", 0.5, 2, 'model_name="other"')
            + _hist("trtllm_time_per_output_token_seconds", 0.25, 6))
    fake = FakeTrtllm(prometheus=prom)
    fake.push(SPEC_K3)
    snap = fake.server().read_live()
    assert (snap.running, snap.waiting) == (9.0, 4.0)
    assert (snap.ttft.sum, snap.ttft.count) == (2.0, 8.0)
    assert (snap.tpot.sum, snap.tpot.count) == (0.25, 6.0)
    old = FakeTrtllm(prometheus=_hist("time_to_first_token_seconds", 3.0, 4)
                     + _hist("time_per_output_token_seconds", 0.5, 4)).server().read_live()
    assert (old.ttft.sum, old.ttft.count, old.tpot.sum, old.tpot.count) == (3.0, 4.0, 0.5, 4.0)
    assert old.running is None  # a 1.1 server whose /metrics stays empty: the batch is not known


def test_live_reads_feed_the_watchers_interval():
    """Two reads of a TensorRT-LLM server through the watcher's arithmetic: acceptance from
    the drained specDecodingStats, the batch as the mean of the two reads."""
    fake = FakeTrtllm()
    server = fake.server()
    fake.push(SPEC_K3[:1])  # prefill only: 2 active, no drafts
    a = server.read_live().model_copy(update={"at": 0.0})
    fake.push(SPEC_K3[1:] + [{"iter": 13, "numActiveRequests": 4}])
    b = server.read_live().model_copy(update={"at": 10.0})
    iv = interval_between(a, b)
    assert (iv.drafts, iv.draft_tokens, iv.accepted) == (4, 12, 8)
    assert iv.running == 3.0  # (2 + 4) / 2


def test_an_entry_without_a_load_count_keeps_the_last_one():
    """Constructed: an entry without numActiveRequests / numQueuedRequests (or with a non-number
    there) leaves the latest counts as they were, rather than failing or reading True as 1."""
    totals = T.IterStatsTotals()
    totals.add([{"iter": 1, "numActiveRequests": 4, "numQueuedRequests": 2}])
    totals.add([{"iter": 2}, {"iter": 3, "numActiveRequests": True, "numQueuedRequests": "7"}])
    assert (totals.iterations, totals.last_active, totals.last_queued) == (3, 4.0, 2.0)

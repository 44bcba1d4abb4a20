"""VLLMServer.read_live() (what `specadapt watch` reads) on the recorded vLLM 0.32.0 /metrics of
tests/fixtures/vllm behind a scripted transport. Expected figures are the recorded lines' values."""

from pathlib import Path

import httpx

from specadapt.adapters.metrics import histogram_state, parse_samples
from tests.unit.adapters.test_vllm_describe import server_with

RECORDED = (Path(__file__).parents[2] / "fixtures" / "vllm" / "metrics-spec-ngram-k4.txt").read_text()
RUNNING = 'vllm:num_requests_running{engine="0",model_name="/tmp/sa-cache/models/SmolLM2-135M-Instruct"} 0.0'
WAITING = 'vllm:num_requests_waiting{engine="0",model_name="/tmp/sa-cache/models/SmolLM2-135M-Instruct"} 0.0'


def busy(text: str = RECORDED) -> str:
    """The recorded text with its idle gauges set to 3 running and 1 waiting (an edit of ours)."""
    assert RUNNING in text and WAITING in text
    return text.replace(RUNNING, RUNNING[:-3] + "3.0").replace(WAITING, WAITING[:-3] + "1.0")


def test_recorded_metrics_give_counters_gauges_and_both_histograms():
    snap = server_with({"/metrics": busy()}).read_live()
    c = snap.counters
    assert (c.drafts, c.draft_tokens, c.accepted_tokens) == (78.0, 311.0, 192.0)
    assert c.source == "GET /metrics (Prometheus text)"
    assert (snap.running, snap.waiting) == (3.0, 1.0)
    assert (snap.ttft.sum, snap.ttft.count) == (4.414981365203857, 9.0)
    assert (snap.tpot.sum, snap.tpot.count) == (14.501059864000126, 275.0)


def test_the_older_inter_token_name_is_read_when_the_new_one_is_absent():
    old = busy().replace("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds")
    snap = server_with({"/metrics": old}).read_live()
    assert (snap.tpot.sum, snap.tpot.count) == (14.501059864000126, 275.0)
    assert (snap.ttft.sum, snap.ttft.count) == (4.414981365203857, 9.0)


def test_unavailable_metrics_are_said_in_the_counters_source_not_raised():
    gone = server_with({}).read_live()
    assert gone.counters.source == "unavailable: GET /metrics did not answer 200"
    assert (gone.running, gone.ttft, gone.counters.has_spec_counters) == (None, None, False)
    garbage = server_with({"/metrics": httpx.Response(200, text="{not prometheus")}).read_live()
    assert garbage.counters.source.startswith("unavailable: /metrics is not Prometheus text")
    assert garbage.running is None


def test_a_histogram_missing_its_count_is_no_histogram():
    """TensorRT-LLM 1.1's pasted answer (tests/fixtures/trtllm) has e2e_request_latency_seconds with
    a _sum and buckets but no _count line: no mean can be formed from it."""
    text = (Path(__file__).parents[2] / "fixtures" / "trtllm" / "prometheus-1.1-issue-aibrix-2004.txt").read_text()
    samples = parse_samples(text)
    assert "e2e_request_latency_seconds_sum" in samples
    assert histogram_state(samples, "e2e_request_latency_seconds") is None
    assert histogram_state(parse_samples(RECORDED), "vllm:no_such_seconds", "vllm:time_to_first_token_seconds").count == 9

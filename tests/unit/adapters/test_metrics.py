"""Parsing real /metrics text captured from vLLM 0.32.0 (CPU build); see fixtures/vllm/README.md."""
import re
from pathlib import Path
import pytest
from specadapt.adapters.metrics import parse_samples
from specadapt.adapters.vllm import counters_from_metrics
from specadapt.errors import NotAServer
import httpx
from specadapt.adapters.metrics import by_label, parse_samples, total
from specadapt.adapters.vllm import VLLMServer, counters_from_metrics

FIX = Path(__file__).parents[2] / "fixtures" / "vllm"


def _grep(text: str, name: str) -> list[float]:
    """Independent of prometheus_client: every sample value of ``name`` by regex."""
    return [float(m.group(1)) for m in re.finditer(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.M)]


def test_spec_on_counters_match_the_text():
    text = (FIX / "metrics-spec-ngram-k4.txt").read_text()
    snap = counters_from_metrics(text)
    assert snap.has_spec_counters
    assert snap.drafts == sum(_grep(text, "vllm:spec_decode_num_drafts_total"))
    assert snap.draft_tokens == sum(_grep(text, "vllm:spec_decode_num_draft_tokens_total"))
    assert snap.accepted_tokens == sum(_grep(text, "vllm:spec_decode_num_accepted_tokens_total"))
    assert snap.generation_tokens == sum(_grep(text, "vllm:generation_tokens_total"))
    assert sorted(snap.accepted_per_position) == [0, 1, 2, 3]
    assert sum(snap.accepted_per_position.values()) == snap.accepted_tokens
    # per-position counts can only fall with the position
    values = [snap.accepted_per_position[i] for i in range(4)]
    assert values == sorted(values, reverse=True)


def test_spec_off_has_no_spec_counters():
    text = (FIX / "metrics-spec-off.txt").read_text()
    snap = counters_from_metrics(text)
    assert not snap.has_spec_counters
    assert snap.drafts is None and snap.accepted_per_position == {}
    # the token counters exist (stats are on), so "off" can be told apart from "stats disabled"
    assert snap.generation_tokens == sum(_grep(text, "vllm:generation_tokens_total"))
    assert snap.prompt_tokens == sum(_grep(text, "vllm:prompt_tokens_total"))


def test_label_sets_are_summed():
    text = ('# TYPE vllm:spec_decode_num_drafts counter\n'
            'vllm:spec_decode_num_drafts_total{engine="0"} 3\n'
            'vllm:spec_decode_num_drafts_total{engine="1"} 4\n')
    assert counters_from_metrics(text).drafts == 7


def test_garbage_is_not_prometheus_text():
    with pytest.raises(NotAServer):
        parse_samples("<html>hello</html>\nthis is { not metrics\n")


# Edges of the /metrics reading: label sets summed per position, where the numbers came from
PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"

# A data-parallel vLLM (two engines) exports each counter once per engine; hand-written values.
TWO_ENGINES = """\
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 5.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 3.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",model_name="m",position="0"} 2.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",model_name="m",position="1"} 1.0
"""


def metrics_server(route) -> VLLMServer:
    """A vLLM server whose GET /metrics answers ``route`` (text: 200 with it; a Response: as it is)."""
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path != "/metrics" or route is None:
            return httpx.Response(404, json={"detail": "Not Found"})
        return route if isinstance(route, httpx.Response) else httpx.Response(200, text=route)

    return VLLMServer("http://vllm.test:8000", transport=httpx.MockTransport(handler))


def test_by_label_sums_the_other_labels_away():
    samples = parse_samples(TWO_ENGINES)
    assert by_label(samples, PER_POS, "position") == {"0": 7.0, "1": 4.0}
    assert by_label(samples, PER_POS, "engine") == {"0": 8.0, "1": 3.0}
    assert by_label(samples, PER_POS, "no_such_label") == {} and by_label(samples, "absent", "position") == {}
    assert total(samples, PER_POS) == 11.0 and total(samples, "absent") is None


def test_per_position_counts_are_summed_over_engines_and_ordered_by_position():
    text = TWO_ENGINES + ('vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="10"} 1.0\n'
                          'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="2"} 2.0\n')
    per_pos = counters_from_metrics(text).accepted_per_position
    assert per_pos == {0: 7.0, 1: 4.0, 2: 2.0, 10: 1.0} and list(per_pos) == [0, 1, 2, 10]


def test_the_snapshot_says_where_its_numbers_came_from():
    text = (FIX / "metrics-spec-off.txt").read_text()
    assert counters_from_metrics(text).source == "GET /metrics (Prometheus text)"
    assert counters_from_metrics(text, source="GET /metrics of engine 1").source == "GET /metrics of engine 1"


def test_not_prometheus_text_is_said_with_the_parser_reason():
    with pytest.raises(NotAServer, match=r"^/metrics is not Prometheus text \(.+\)$"):
        parse_samples("<html>hello</html>\nthis is { not metrics\n")


def test_read_counters_of_the_recorded_spec_on_server():
    # tests/fixtures/vllm/metrics-spec-ngram-k4.txt, one engine: the values as they stand in the file
    snap = metrics_server((FIX / "metrics-spec-ngram-k4.txt").read_text()).read_counters()
    assert (snap.drafts, snap.draft_tokens, snap.accepted_tokens) == (78.0, 311.0, 192.0)
    assert snap.accepted_per_position == {0: 62.0, 1: 53.0, 2: 44.0, 3: 33.0}
    assert (snap.generation_tokens, snap.prompt_tokens) == (469.0, 612.0)
    assert snap.source == "GET /metrics (Prometheus text)"


@pytest.mark.parametrize("route", [None, httpx.Response(503, text="vllm:generation_tokens_total 5.0\n"),
                                   httpx.Response(500, text="")])
def test_read_counters_without_a_200_is_unavailable(route):
    srv = metrics_server(route)
    assert srv.metrics_text() is None
    snap = srv.read_counters()
    assert snap.source == "unavailable: GET /metrics did not answer 200"
    assert (snap.drafts, snap.generation_tokens, snap.accepted_per_position) == (None, None, {})


def test_read_counters_of_text_that_is_not_prometheus_is_unavailable_with_the_reason():
    snap = metrics_server("<html>hello</html>\nthis is { not metrics\n").read_counters()
    assert snap.source.startswith("unavailable: /metrics is not Prometheus text (") and snap.source.endswith(")")
    assert not snap.has_spec_counters and snap.generation_tokens is None

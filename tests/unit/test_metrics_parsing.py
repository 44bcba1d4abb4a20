"""Parsing real /metrics text captured from vLLM 0.32.0 (CPU build); see fixtures/vllm/README.md."""

import re
from pathlib import Path

import pytest

from specadapt.adapters.metrics import parse_samples
from specadapt.adapters.vllm import counters_from_metrics
from specadapt.errors import NotAServer

FIX = Path(__file__).parent.parent / "fixtures" / "vllm"


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

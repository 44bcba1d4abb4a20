"""The staging gate of `equiv` (analysis/gate.py): every threshold, its boundary and its exact reason."""

from __future__ import annotations

import pytest

from specadapt.analysis.gate import apply_gate
from specadapt.records import (
    CompareReport,
    CompareSettings,
    LevelResult,
    PromptIdentity,
    RatioCI,
    ServerInfo,
    SpeedRatios,
)

INFO = ServerInfo(backend="vllm", base_url="http://x")


def identity(verdicts: dict[str, str]) -> list[PromptIdentity]:
    return [PromptIdentity(prompt_id=pid, category="c", pairs=1, identical_pairs=int(v == "identical"), verdict=v)
            for pid, v in verdicts.items()]


def level(concurrency: int, throughput: float | None) -> LevelResult:
    ratio = RatioCI(point=throughput)
    return LevelResult.model_construct(concurrency=concurrency, pairs=1,
                                       speed=SpeedRatios(tpot=ratio, e2e=ratio, throughput=ratio))


def report(verdicts: dict[str, str], counts: dict[str, int], levels: list[LevelResult] = ()) -> CompareReport:
    return CompareReport(settings=CompareSettings(), off_server=INFO, on_server=INFO, identity=identity(verdicts),
                         counts=counts, levels=list(levels))


def test_a_clean_report_passes_and_the_gate_records_its_thresholds():
    r = report({"a": "identical"}, {"identical": 1}, [level(1, 1.5)])
    gate = apply_gate(r, max_suspect=2, max_near_tie=3, min_speedup=1.25)
    assert (gate.passed, gate.reasons) == (True, [])
    assert (gate.max_suspect, gate.max_near_tie, gate.min_speedup) == (2, 3, 1.25)
    assert r.gate is gate


def test_unknown_counts_as_suspect_and_both_are_named():
    r = report({"i": "identical", "s": "suspect", "u": "unknown", "n": "near-tie"},
               {"identical": 1, "suspect": 1, "unknown": 1, "near-tie": 1})
    gate = apply_gate(r, max_suspect=1)
    assert not gate.passed
    assert gate.reasons == ["2 suspect divergence(s) (max 1): s, u"]
    assert apply_gate(r, max_suspect=2).passed


@pytest.mark.parametrize("counts", [{"unknown": 1}, {"suspect": 1}])
def test_a_missing_count_is_zero(counts):
    verdict = next(iter(counts))
    assert apply_gate(report({"x": verdict}, counts), max_suspect=1).passed
    assert apply_gate(report({"x": "identical"}, {"identical": 1}), max_suspect=0, max_near_tie=0).passed


def test_at_most_ten_suspect_prompts_are_named():
    verdicts = {f"p{i:02d}": "suspect" for i in range(12)}
    gate = apply_gate(report(verdicts, {"suspect": 12}), max_suspect=0)
    assert gate.reasons == ["12 suspect divergence(s) (max 0): " + ", ".join(f"p{i:02d}" for i in range(10))]


def test_near_ties_fail_only_above_the_limit():
    r = report({"a": "near-tie", "b": "near-tie"}, {"near-tie": 2})
    assert apply_gate(r, max_near_tie=2).passed
    assert apply_gate(r).passed  # no limit: any number of near-ties
    gate = apply_gate(r, max_near_tie=1)
    assert gate.reasons == ["2 near-tie divergence(s) (max 1)"]


def test_speedup_is_read_at_the_first_level_and_the_limit_itself_passes():
    r = report({"a": "identical"}, {"identical": 1}, [level(4, 1.2), level(8, 0.5)])
    assert apply_gate(r, min_speedup=1.2).passed
    gate = apply_gate(r, min_speedup=1.21)
    assert gate.reasons == ["throughput speedup 1.20x at concurrency 4 is below 1.21x"]


@pytest.mark.parametrize("levels, where", [([], "?"), ([level(2, None)], "2")])
def test_an_unknown_speedup_fails_a_speedup_limit(levels, where):
    gate = apply_gate(report({"a": "identical"}, {"identical": 1}, levels), min_speedup=1.0)
    assert gate.reasons == [f"throughput speedup unknown at concurrency {where} is below 1.00x"]


def test_nothing_compared_fails():
    gate = apply_gate(report({}, {}))
    assert (gate.passed, gate.reasons) == (False, ["no prompt pair succeeded on both servers: nothing was compared"])

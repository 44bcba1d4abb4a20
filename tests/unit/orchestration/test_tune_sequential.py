"""tune --until-decided (orchestration/tune.py with ``settings.sequential``) without HTTP: the spec-off
server and each candidate are fake servers whose answers have an exact TPOT per side and unit
(test_compare_sequential's fake ``stream_request``), so every cell's units' log ratios are known
beforehand. Where a cell must stop is computed by another method than the code's: the confidence
sequence's ends found by root finding on the mixture Bayes factor (test_compare_sequential's
reference), not by analysis/sequential.py's closed form.

Pinned: a cell of a clearly faster k stops early with "faster"; a cell that cannot beat the best cell
so far at its batch size is dropped, with both intervals in its line; the requests against the fixed
design's; the verification keeps the fixed design."""

from __future__ import annotations

import contextlib
import math

import pytest

from specadapt.load import spread
from specadapt.orchestration import compare
from specadapt.orchestration import tune as tuning
from specadapt.records import CompareSettings, RequestSettings, SequentialDesign, ServerInfo
from specadapt.records.sequential import FIRST_LOOK
from specadapt.records.tune import TuneReport, TuneSettings
from specadapt.report.tune_render import render_markdown
from tests.unit.orchestration.test_compare_sequential import (
    NOISE,
    PROMPTS,
    Side,
    Wire,
    pair_logs,
    reference_cs,
    reference_stop,
    reference_verdict,
)

BASE = tuning.SpecConfig(method="ngram", k=4, ngram_min=2, ngram_max=4)
REPEAT = 3
FIXED = 2 * REPEAT * len(PROMPTS)  # the fixed design at concurrency 1: prompts x --repeat pairs, both sides
INDEX = {p.id: i for i, p in enumerate(PROMPTS)}


def tpot_of(speedups: dict[str, float]):
    """TPOT per request: spec off 10 ms; candidate ``name`` 10 ms / its speedup * exp(noise of the unit), so
    the unit's log ratio is log(speedup) - noise (pair_logs)."""
    def tpot(side, pid, repeat):
        if side == "off":
            return 10.0
        u = repeat * len(PROMPTS) + INDEX[pid]
        return 10.0 / speedups[side] * math.exp(NOISE[u % len(NOISE)])
    return tpot


def sweep(monkeypatch, speedups: dict[str, float], ks, max_units: int = 40, objective: str = "tpot"):
    """run_sweep at concurrency 1 under the rule; candidate k=K is the fake server named kK."""
    off = Side("off")
    servers = {name: Side(name) for name in speedups}
    wire = Wire([off, *servers.values()], tpot_of(speedups))
    monkeypatch.setattr(spread, "stream_request", wire.stream_request)
    monkeypatch.setattr(compare, "settle_counters", lambda server: server.read_counters())
    design = SequentialDesign(alpha=0.05, max_units=max_units, primary=objective)
    settings = TuneSettings(backend="vllm", base_spec={"method": "ngram", "k": 4}, ks=[0, *ks], concurrency=[1],
                            repeat=REPEAT, warmup=0, request=RequestSettings(), objective=objective,
                            sequential=design)
    report = TuneReport(settings=settings)
    report.off_server = ServerInfo(backend="fake", base_url=off.base_url)

    @contextlib.contextmanager
    def open_candidate(cand):
        yield servers[f"k{cand.k}"]

    ab = CompareSettings(concurrency=[1], repeat=REPEAT, warmup=0, triage=False, sequential=design)
    tuning.run_sweep(report, off, tuning.candidates_for(BASE, [0, *ks]), open_candidate, PROMPTS, ab,
                     lambda description, total: None, 999)
    return report, wire


def test_a_cell_of_a_clearly_faster_k_stops_early_with_faster(monkeypatch):
    units, verdict = reference_stop(pair_logs(1.5, 1.0, 40), cap=40)
    assert (units, verdict) == (FIRST_LOOK, "faster")  # the rule's first look already decides
    report, wire = sweep(monkeypatch, {"k2": 1.5}, [2])
    (cell,) = report.candidates[1].cells
    assert (cell.concurrency, cell.stopped, cell.verdict, cell.units) == (1, "decided", "faster", units)
    assert (cell.requests, cell.fixed_requests) == (2 * units, FIXED) == (12, 18)
    assert len([e for e in wire.log if e[0] == "k2"]) == units  # the server got no more
    low, high = reference_cs(pair_logs(1.5, 1.0, units))
    assert (cell.interval.low, cell.interval.high) == (pytest.approx(math.exp(low)), pytest.approx(math.exp(high)))
    assert cell.text.startswith(f"faster after {units} pairs: TPOT 1.")
    assert cell.text.endswith("12 requests against 18 for the fixed design (33% fewer)")
    md = render_markdown(report)
    assert "- k=2 at concurrency 1: faster after 6 pairs" in md
    assert "The sweep: 12 requests against 18 for the fixed design (33% fewer)." in md
    assert "Design: run until decided:" in md and "the verification keeps the fixed design (--repeat 3)" in md


def test_a_cell_that_cannot_beat_the_best_so_far_is_dropped_and_says_why(monkeypatch):
    """k=2 at 2x first (decided faster), then k=4 as fast as off: its interval reaches 1 (so the rule alone
    would go on to the cap), but its high end falls below k=2's low end: dropped there."""
    best_units, _ = reference_stop(pair_logs(2.0, 1.0, 40), cap=40)
    b_low, b_high = (math.exp(v) for v in reference_cs(pair_logs(2.0, 1.0, best_units)))
    same = pair_logs(1.0, 1.0, 40)
    drop_at = next(n for n in range(FIRST_LOOK, 41) if math.exp(reference_cs(same[:n])[1]) < b_low)
    assert all(reference_verdict(same[:n]) is None for n in range(1, 41))  # undecided against off: cap at 40
    report, wire = sweep(monkeypatch, {"k2": 2.0, "k4": 1.0}, [2, 4])
    first, dropped = report.candidates[1].cells[0], report.candidates[2].cells[0]
    assert (first.stopped, first.verdict, first.units) == ("decided", "faster", best_units)
    assert (dropped.stopped, dropped.verdict, dropped.units, dropped.requests) == (
        "dropped", "no clear difference", drop_at, 2 * drop_at)
    assert len([e for e in wire.log if e[0] == "k4"]) == drop_at
    assert dropped.best_label == "k=2"
    assert (dropped.best_interval.low, dropped.best_interval.high) == (pytest.approx(b_low), pytest.approx(b_high))
    low, high = (math.exp(v) for v in reference_cs(same[:drop_at]))
    assert (dropped.interval.low, dropped.interval.high) == (pytest.approx(low), pytest.approx(high))
    assert dropped.text == (f"dropped after {drop_at} pairs: TPOT {dropped.interval.point:.2f}x [{low:.2f}, "
                            f"{high:.2f}] lies below k=2's {first.interval.point:.2f}x [{b_low:.2f}, {b_high:.2f}] "
                            f"at this batch size, so it cannot beat it; {2 * drop_at} requests against 18 for the "
                            f"fixed design ({1 - 2 * drop_at / 18:.0%} fewer)")
    level = report.candidates[2].compare.levels[0]
    assert (level.sequential.stopped, level.sequential.text) == ("dropped", dropped.text)  # its own A/B says so too
    assert f"- k=4 at concurrency 1: {dropped.text}" in render_markdown(report)
    # the choice is as today, from the measured figures: the dropped k cannot be it
    tuning.analyse(report)
    assert [(ch.concurrency, ch.k) for ch in report.choices] == [(1, 2)]


def test_a_suspect_best_does_not_drop_others_and_variants_do_not_drop_each_other():
    from specadapt.records import RatioCI
    from specadapt.records.tune import Candidate
    from tests.unit.orchestration.test_tune import compare_report, lvl

    def cand(label, variant, k, point, suspect=0):
        return Candidate(label=label, variant=variant, k=k, suspect=suspect,
                         compare=compare_report([lvl(1, point, [0.5] * k), lvl(4, point - 0.2, [0.5] * k)]))

    settings = TuneSettings(backend="vllm", base_spec={}, ks=[0, 2, 3, 4], concurrency=[1, 4], repeat=5, warmup=0,
                            request=RequestSettings())
    report = TuneReport(settings=settings, candidates=[
        cand("k=2", "", 2, 1.5), cand("k=3", "", 3, 1.9, suspect=1), cand("k=4 w", "w", 4, 2.5)])
    bests = tuning.bests_so_far(report, "")
    # ratio() gives +-0.05: k=2's intervals are [1.45, 1.55] at 1 and [1.25, 1.35] at 4
    assert {lv: (label, r.low) for lv, (label, r) in bests.items()} == {1: ("k=2", pytest.approx(1.45)),
                                                                       4: ("k=2", pytest.approx(1.25))}
    assert isinstance(bests[1][1], RatioCI)
    assert tuning.bests_so_far(report, "other") == {}


def test_the_verification_keeps_the_fixed_design():
    from specadapt.orchestration.tune_run import TunePlan

    design = SequentialDesign(max_units=12, primary="e2e")
    settings = TuneSettings(backend="vllm", base_spec={}, ks=[0, 2], concurrency=[1], repeat=5, warmup=0,
                            request=RequestSettings(), objective="e2e", sequential=design)
    plan = TunePlan(servers=None, opts=None, base=BASE, candidates=(), settings=settings)
    assert plan.compare_settings().sequential == design
    assert plan.verify_settings().sequential is None
    assert plan.verify_settings().repeat == 5


def test_a_cell_the_rule_decides_is_decided_even_where_it_could_also_be_dropped(monkeypatch):
    """k=4 at 0.6x after k=2 at 2x: at the first look its interval lies below 1 (slower) and below k=2's
    low end; the rule's verdict against spec-off comes first."""
    units, verdict = reference_stop(pair_logs(0.6, 1.0, 40), cap=40)
    assert (units, verdict) == (FIRST_LOOK, "slower")
    report, _ = sweep(monkeypatch, {"k2": 2.0, "k4": 0.6}, [2, 4])
    cell = report.candidates[2].cells[0]
    assert (cell.stopped, cell.verdict, cell.units, cell.best_label) == ("decided", "slower", units, None)

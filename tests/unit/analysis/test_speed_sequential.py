"""compare's analysis under the run-until-decided rule (analysis/speed.py with ``settings.sequential``):
every ratio of a level is the confidence sequence over today's units, and ``LevelResult.sequential``
says how the rule ended there.

The expected intervals are found here by root finding on the normal-mixture Bayes factor (the means
whose factor stays below 1/alpha), not by the closed form the code uses; the per-unit log ratios are
written out from TPOT = (E2E - first chunk) / (tokens - 1), as docs/compare.md defines them.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy.optimize import brentq

from specadapt.analysis.speed import (
    analyse,
    compare_notes,
    level_design,
    sequential_outcome,
    should_stop,
    unit_logs,
    units_sent,
)
from specadapt.records import CompareReport, CompareSettings, RequestRecord, SequentialDesign, ServerInfo
from specadapt.records.sequential import FIRST_LOOK, PHI

MS = 1_000_000
TOKENS = 11
OFF_TPOT = 12.0  # ms
ON_TPOT = [8.0, 8.4, 7.7, 8.9, 8.1, 7.5, 8.6, 8.2, 7.9, 8.3]  # ms, one per pair in order


def rec(side: str, pid: str, repeat: int, tpot_ms: float, level: int = 1, ok: bool = True,
        replica: int = 0) -> RequestRecord:
    """TOKENS tokens, the first at 10 ms, then one every ``tpot_ms``: TPOT exactly ``tpot_ms``."""
    chunk = [round((10 + i * tpot_ms) * MS) for i in range(TOKENS)]
    return RequestRecord(prompt_id=pid, category="c", api="completions", side=side, repeat=repeat, replica=replica,
                         concurrency=level, ok=ok, sent_at_ns=0, chunk_ns=chunk, chunk_tokens=[1] * TOKENS,
                         output_tokens=TOKENS, e2e_ns=chunk[-1])


def pairs_at_1(n: int, prompts: int = 2) -> list[RequestRecord]:
    """n pairs at concurrency 1, prompt by prompt, cycling: pair u is prompt u mod ``prompts``, repeat u // prompts."""
    out = []
    for u in range(n):
        r, i = divmod(u, prompts)
        out += [rec("off", f"p{i}", r, OFF_TPOT), rec("on", f"p{i}", r, ON_TPOT[u])]
    return out


def report_of(records, design: SequentialDesign | None, concurrency=(1,)) -> CompareReport:
    settings = CompareSettings(concurrency=list(concurrency), repeat=3, sequential=design)
    return CompareReport(settings=settings, off_server=ServerInfo(backend="fake", base_url="http://off"),
                         on_server=ServerInfo(backend="fake", base_url="http://on"), requests=records)


def reference_cs(logs, alpha: float = 0.05, phi: float = PHI) -> tuple[float, float] | None:
    """The ends of {m : sqrt(r) ((1 + t^2/nu) / (1 + r t^2/nu))^((nu+1)/2) < 1/alpha}, t = (mean - m)/se,
    by root finding in t; None when the factor cannot reach 1/alpha."""
    x = np.asarray(logs, dtype=float)
    n = x.size
    nu, r = n - 1, phi / (phi + n)

    def excess(t: float) -> float:
        return 0.5 * math.log(r) + (nu + 1) / 2 * (math.log1p(t * t / nu) - math.log1p(r * t * t / nu)) \
            - math.log(1 / alpha)

    if n < 2 or excess(1e8) <= 0:
        return None
    t_star = brentq(excess, 0.0, 1e8, xtol=1e-12)
    half = t_star * x.std(ddof=1) / math.sqrt(n)
    return math.exp(x.mean() - half), math.exp(x.mean() + half)


def test_the_unit_logs_are_today_s_per_pair_tpot_log_ratios():
    logs = unit_logs(pairs_at_1(4), 1)
    assert logs["tpot"] == pytest.approx([math.log(OFF_TPOT / t) for t in ON_TPOT[:4]])
    # each request: TOKENS tokens in 10 + 10 tpot ms, so tokens/s on/off is E2E off/on
    e2e = [math.log((10 + 10 * OFF_TPOT) / (10 + 10 * t)) for t in ON_TPOT[:4]]
    assert logs["e2e"] == pytest.approx(e2e) and logs["throughput"] == pytest.approx(e2e)


def test_every_ratio_of_a_level_is_the_confidence_sequence_and_the_level_says_how_the_rule_ended():
    n = 8
    design = SequentialDesign(max_units=40)
    report = report_of(pairs_at_1(n), design)
    analyse(report, {(1, None): 18})
    (level,) = report.levels
    logs = [math.log(OFF_TPOT / t) for t in ON_TPOT[:n]]
    low, high = reference_cs(logs)
    tpot = level.speed.tpot
    assert (tpot.method, tpot.n, tpot.level) == ("cs", n, 0.95)
    assert (tpot.low, tpot.high) == (pytest.approx(low), pytest.approx(high))
    assert low > 1 and level.speed.e2e.method == level.speed.throughput.method == "cs"
    assert {p.ratios.tpot.method for p in level.by_prompt} == {"cs"}
    assert level.by_category["c"].tpot.method == "cs"
    seq = level.sequential
    assert (seq.verdict, seq.stopped, seq.units, seq.requests, seq.fixed_requests) == ("faster", "decided", n,
                                                                                       2 * n, 18)
    assert seq.interval == tpot
    assert seq.text == (f"faster after {n} pairs: TPOT {tpot.point:.2f}x, 95% confidence sequence {low:.2f}x-"
                        f"{high:.2f}x; 16 requests against 18 for the fixed design (11% fewer)")


def test_at_the_cap_undecided_is_no_clear_difference_with_the_interval_reached():
    n = 7
    records = []
    for u in range(n):  # on and off alternate who is faster: the interval holds 1
        t = 10.0 + (1.0 if u % 2 else -1.0)
        records += [rec("off", f"p{u}", 0, 10.0), rec("on", f"p{u}", 0, t)]
    report = report_of(records, SequentialDesign(max_units=n))
    analyse(report)
    seq = report.levels[0].sequential
    low, high = reference_cs([math.log(10.0 / (10.0 + (1.0 if u % 2 else -1.0))) for u in range(n)])
    assert low < 1 < high
    assert (seq.verdict, seq.stopped, seq.units, seq.fixed_requests) == ("no clear difference", "cap", n, None)
    assert seq.text.startswith(f"no clear difference at the cap of {n} pairs: TPOT ")
    assert seq.text.endswith(f"; {2 * n} requests")


def test_a_level_cut_short_undecided_was_stopped_on_identity():
    report = report_of(pairs_at_1(FIRST_LOOK - 1), SequentialDesign(max_units=40), concurrency=(1, 2))
    analyse(report)
    first, second = (lv.sequential for lv in report.levels)
    # an interval exists below the first look, but the rule decides nothing there
    assert first.interval.low is not None and first.interval.low > 1
    assert (first.stopped, first.verdict, first.units) == ("identity", "no clear difference", FIRST_LOOK - 1)
    assert (second.stopped, second.units, second.requests) == ("identity", 0, 0)
    assert second.text == "not run: the run stopped on identity before this level"


def test_a_run_stopped_on_identity_below_its_floor_keeps_the_verdict_of_the_first_look():
    n = FIRST_LOOK + 1
    report = report_of(pairs_at_1(n), SequentialDesign(max_units=40, min_units=n + 2))
    analyse(report)
    seq = report.levels[0].sequential
    assert (seq.stopped, seq.verdict, seq.units) == ("identity", "faster", n)
    assert seq.text.startswith(f"faster when the run stopped on identity after {n} pairs")


def test_units_count_what_was_sent_and_failed_pairs_leave_the_interval():
    records = pairs_at_1(FIRST_LOOK)
    records += [rec("off", "p0", 9, OFF_TPOT), rec("on", "p0", 9, 8.0, ok=False)]
    assert units_sent(records, 1) == FIRST_LOOK + 1
    report = report_of(records, SequentialDesign(max_units=FIRST_LOOK + 1))
    analyse(report)
    seq = report.levels[0].sequential
    assert (seq.units, seq.interval.n, seq.requests) == (FIRST_LOOK + 1, FIRST_LOOK, 2 * FIRST_LOOK + 2)


def test_blocks_are_the_units_above_1_and_the_floor_counts_pairs_at_1_only():
    records = []
    for r in range(3):
        for c in range(2):
            records += [rec("off", "p0", r, OFF_TPOT, level=4, replica=c), rec("on", "p0", r, 8.0, level=4, replica=c)]
    assert units_sent(records, 4) == 3
    design = SequentialDesign(min_units=20)
    assert level_design(design, 1).min_units == 20
    assert level_design(design, 4).min_units == 0 and level_design(design, 0, 2.0).min_units == 0
    assert level_design(design, 4).first_look == design.first_look


def test_the_notes_state_the_rule_and_the_error_rate_of_all_three_ratios():
    design = SequentialDesign(alpha=0.06)
    report = report_of(pairs_at_1(2), design)
    (note,) = [n for n in compare_notes(report) if n.startswith("run until decided")]
    assert note.startswith(design.rule)
    assert "each other ratio (E2E, tokens/s) has its own confidence sequence" in note
    assert "error rate 0.18" in note and "--alpha 0.02 for 0.06 over all three" in note
    assert not [n for n in compare_notes(report_of(pairs_at_1(2), None)) if n.startswith("run until decided")]


def test_reports_without_the_rule_read_and_write_as_before():
    report = report_of(pairs_at_1(FIRST_LOOK), None)
    analyse(report)
    data = json.loads(report.model_dump_json())
    assert "sequential" not in data["settings"] and "sequential" not in data["levels"][0]
    assert data["levels"][0]["speed"]["tpot"]["method"] == "t"
    again = CompareReport.model_validate_json(report.model_dump_json())
    assert again.settings.sequential is None and again.levels[0].sequential is None
    ruled = report_of(pairs_at_1(FIRST_LOOK), SequentialDesign(max_units=30))
    analyse(ruled)
    back = CompareReport.model_validate_json(ruled.model_dump_json())
    assert back.settings.sequential == ruled.settings.sequential
    assert back.levels[0].sequential == ruled.levels[0].sequential


RATE = 2.0


def blocks_at_rate(on_tpot: list[float], prompts: int = 2) -> list[RequestRecord]:
    """One off block + on block per entry of ``on_tpot`` at arrival rate RATE (concurrency 0), each
    block ``prompts`` requests all sent at 0; the on block's requests all have that TPOT."""
    out = []
    for r, t in enumerate(on_tpot):
        for i in range(prompts):
            out += [rec(side, f"p{i}", r, tpot, level=0).model_copy(update={"request_rate": RATE})
                    for side, tpot in (("off", OFF_TPOT), ("on", t))]
    return out


def test_at_a_rate_the_units_are_blocks_whatever_level_is_given():
    # with a rate the level is the rate's (as level_records reads it): a block per repeat, never a pair
    records = blocks_at_rate(ON_TPOT[:3])
    # a block's requests all end at 10 + 10 tpot ms after the block's start: tokens/s on/off is 130 / (10 + 10 t)
    tpot = [math.log(OFF_TPOT / t) for t in ON_TPOT[:3]]
    rate = [math.log((10 + 10 * OFF_TPOT) / (10 + 10 * t)) for t in ON_TPOT[:3]]
    for level in (0, 1):
        logs = unit_logs(records, level, RATE)
        assert logs["tpot"] == pytest.approx(tpot) and logs["throughput"] == pytest.approx(rate)
        assert units_sent(records, level, RATE) == 3
        assert level_design(SequentialDesign(min_units=20), level, RATE).min_units == 0
        # 3 blocks, before the first look: the rule stops at a cap of 3 blocks, not at 4
        assert should_stop(records, level, RATE, SequentialDesign(max_units=3)) is True
        assert should_stop(records, level, RATE, SequentialDesign(max_units=4)) is False


def test_at_a_rate_the_rule_decides_on_blocks_without_the_floor():
    n = 8
    records = blocks_at_rate(ON_TPOT[:n])
    low, high = reference_cs([math.log(OFF_TPOT / t) for t in ON_TPOT[:n]])
    assert low > 1
    design = SequentialDesign(max_units=40, min_units=50)  # a floor of pairs: none at a rate
    for level in (0, 1):
        assert should_stop(records, level, RATE, design) is True
        seq = sequential_outcome(records, level, RATE, design)
        assert (seq.verdict, seq.stopped, seq.units, seq.requests) == ("faster", "decided", n, 4 * n)
        assert (seq.interval.unit, seq.interval.low, seq.interval.high) == ("blocks", pytest.approx(low),
                                                                          pytest.approx(high))
        assert seq.text.startswith(f"faster after {n} blocks: TPOT ")
    assert should_stop(records[:4 * (FIRST_LOOK - 1)], 1, RATE, design) is False  # before the first look


def test_a_rate_stopped_on_identity_reads_its_own_blocks_not_another_level_s():
    # concurrency 1 would decide faster; the rate's 3 blocks are before the first look
    records = pairs_at_1(8) + blocks_at_rate(ON_TPOT[:3])
    seq = sequential_outcome(records, 1, RATE, SequentialDesign(max_units=40))
    assert (seq.stopped, seq.verdict, seq.units, seq.interval.n) == ("identity", "no clear difference", 3, 3)
    assert seq.text.startswith("no clear difference when the run stopped on identity after 3 blocks")


def test_a_level_of_failed_pairs_has_no_unit_measured_and_the_requests_against_the_fixed_design():
    records = []
    for i in range(2):
        records += [rec("off", f"p{i}", 0, OFF_TPOT), rec("on", f"p{i}", 0, 8.0, ok=False)]
    design = SequentialDesign(max_units=2)

    def text(fixed):
        seq = sequential_outcome(records, 1, None, design, fixed)
        assert (seq.stopped, seq.units, seq.requests, seq.interval.n) == ("cap", 2, 4, 0)
        return seq.text

    assert text(None) == text(0) == "no clear difference at the cap of 2 pairs: TPOT no unit measured; 4 requests"
    # 4 sent: against 4, none saved; against 3, a third more; against 1, three times more
    assert text(4).endswith("; 4 requests against 4 for the fixed design (0% fewer)")
    assert text(3).endswith("; 4 requests against 3 for the fixed design (33% more)")
    assert text(1).endswith("; 4 requests against 1 for the fixed design (300% more)")
    assert text(8).endswith("; 4 requests against 8 for the fixed design (50% fewer)")

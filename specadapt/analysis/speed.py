"""Spec-on against spec-off from an A/B run's records: speed ratios with confidence on each level's
unit of independence, per prompt and category, goodput, send lag, theory beside measurement, the
crossovers, and the report's notes.

The unit of independence at concurrency 1 is one off/on pair; at concurrency N > 1 (and at an
arrival rate) it is one repeat's off block + on block, whose requests share the machine's state
(never the single request pairs inside it). Per prompt the units are its pairs at concurrency 1
and its copies in each repeat's blocks at N > 1. Formulas: analysis/stats.py.

Run until decided (``settings.sequential``): every ratio of a level is the anytime-valid confidence
sequence over the same units (analysis/sequential.py) instead of the t interval, and the level's
``sequential`` says how the rule ended there. ``unit_logs`` gives the units' log ratios the rule
decides on, for the runner (after each unit) and for the analysis alike.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from specadapt.analysis.acceptance import acceptance_summary
from specadapt.analysis.interference import detected_interference, duration
from specadapt.analysis.latency import latency_summary, tpot_ns
from specadapt.analysis.pairs import Pair, level_records, pair_records
from specadapt.analysis.pass_notes import compare_findings_notes
from specadapt.analysis.sequential import cs_ratio, decide, requests_text
from specadapt.analysis.send_lag import send_lag_blocks
from specadapt.analysis.sides import side_notes
from specadapt.analysis.slo import compare_goodput
from specadapt.analysis.stats import find_crossover, log_latency_ratio, log_rate_ratio, ratio_ci
from specadapt.native_reference import theory
from specadapt.records import (
    CompareReport,
    CounterPair,
    CounterSnapshot,
    LevelResult,
    PromptSpeed,
    RatioCI,
    RequestRecord,
    SequentialDesign,
    SequentialOutcome,
    SpeedRatios,
    TheoryCheck,
)
from specadapt.records.load import GoodputComparison, SendLag, rate_label


def _latency_logs(units: list[list[Pair]]) -> tuple[list[float | None], list[float | None]]:
    """Per unit: log(mean TPOT off / mean TPOT on) over the pairs with a TPOT on both sides,
    and log(mean E2E off / mean E2E on)."""
    tpot, e2e = [], []
    for unit in units:
        tp = [(a, b) for a, b in ((tpot_ns(x), tpot_ns(y)) for x, y in unit) if a is not None and b is not None]
        tpot.append(log_latency_ratio([a for a, _ in tp], [b for _, b in tp]))
        e2e.append(log_latency_ratio([x.e2e_ns for x, _ in unit], [y.e2e_ns for _, y in unit]))
    return tpot, e2e


def _request_rate_log(unit: list[Pair]) -> float | None:
    """log(rate_on / rate_off), each side's rate = its output tokens / the sum of its E2E."""
    return log_rate_ratio(sum(x.output_tokens for x, _ in unit), sum(x.e2e_ns for x, _ in unit),
                          sum(y.output_tokens for _, y in unit), sum(y.e2e_ns for _, y in unit))


def block_rate(records: list[RequestRecord]) -> tuple[int, int]:
    """(output tokens, wall ns) of one block: its succeeded requests' tokens over the time from
    the first request sent to the last request finished."""
    ok = [r for r in records if r.ok and r.e2e_ns is not None]
    if not ok:
        return 0, 0
    return sum(r.output_tokens for r in ok), max(r.sent_at_ns + r.e2e_ns for r in ok) - min(r.sent_at_ns for r in ok)


def interval_of(design: SequentialDesign | None) -> Callable[[list[float | None], str], RatioCI]:
    """How a ratio's interval is made from its units' log ratios: the t interval of the fixed design
    (``design`` None), or the confidence sequence of the rule."""
    if design is None:
        return ratio_ci
    return lambda logs, unit: cs_ratio(logs, unit, design)


def _ratios(logs: dict[str, list[float | None]], unit: str, design: SequentialDesign | None) -> SpeedRatios:
    ci = interval_of(design)
    return SpeedRatios(tpot=ci(logs["tpot"], unit), e2e=ci(logs["e2e"], unit),
                       throughput=ci(logs["throughput"], unit))


def _pair_logs(pairs: list[Pair]) -> dict[str, list[float | None]]:
    """Each pair one unit: its log ratios by ratio."""
    units = [[p] for p in pairs]
    tpot, e2e = _latency_logs(units)
    return {"tpot": tpot, "e2e": e2e, "throughput": [_request_rate_log(u) for u in units]}


def _block_logs(units: list[tuple[int, list[Pair]]],
                throughput_logs: list[float | None]) -> dict[str, list[float | None]]:
    """Each repeat's off block + on block one unit: TPOT and E2E from the block's mean over its pairs,
    throughput as given."""
    tpot, e2e = _latency_logs([u for _, u in units])
    return {"tpot": tpot, "e2e": e2e, "throughput": throughput_logs}


def speed_ratios(pairs: list[Pair], design: SequentialDesign | None = None) -> SpeedRatios:
    """Ratios with each pair one unit (concurrency 1: the pairs are sent back to back, one at a time)."""
    return _ratios(_pair_logs(pairs), "pairs", design)


def block_units(pairs: list[Pair]) -> list[tuple[int, list[Pair]]]:
    """The pairs of one concurrency level N > 1 grouped by repeat: (repeat, its pairs), one
    group per off block + on block."""
    groups: dict[int, list[Pair]] = {}
    for a, b in pairs:
        groups.setdefault(a.repeat, []).append((a, b))
    return sorted(groups.items())


def block_speed_ratios(units: list[tuple[int, list[Pair]]], throughput_logs: list[float | None],
                       design: SequentialDesign | None = None) -> SpeedRatios:
    """Ratios with each repeat's off block + on block one unit (concurrency N > 1): TPOT and
    E2E from the block's mean over its pairs, throughput from the given per-block log ratios."""
    return _ratios(_block_logs(units, throughput_logs), "blocks", design)


def _block_rate_log(records: list[RequestRecord], level: int, repeat: int, rate: float | None = None) -> float | None:
    """log(rate_on / rate_off) of one repeat's blocks, each rate its block's tokens over its wall time
    (every succeeded request of the block, paired or not)."""
    recs = level_records(records, level, rate)
    (tok_off, t_off), (tok_on, t_on) = (
        block_rate([x for x in recs if x.repeat == repeat and x.side == side]) for side in ("off", "on"))
    return log_rate_ratio(tok_off, t_off, tok_on, t_on)


def _subset_ratios(level: int, pp: list[Pair], design: SequentialDesign | None = None) -> SpeedRatios:
    """A prompt's or a category's ratios: its pairs at concurrency 1; at N > 1 and at rates its
    share of each block (its requests' tokens over their E2E), one unit per block pair."""
    if level == 1:
        return speed_ratios(pp, design)
    units = block_units(pp)
    return block_speed_ratios(units, [_request_rate_log(u) for _, u in units], design)


def unit_name(level: int, rate: float | None = None) -> str:
    """The level's unit of independence: "pairs" at concurrency 1, else "blocks" (one repeat's off
    block + on block)."""
    return "pairs" if level == 1 and rate is None else "blocks"


def unit_logs(records: list[RequestRecord], level: int, rate: float | None = None) -> dict[str, list[float | None]]:
    """The level's units' log ratios (> 0: spec on is faster) by ratio ("tpot", "e2e", "throughput"),
    one per unit in the order the units were sent: what the level's ratios are made of, and what the
    run-until-decided rule decides on after each unit (None: the unit has no such figure)."""
    pairs = pair_records(records, level, rate)
    if unit_name(level, rate) == "pairs":
        return _pair_logs(pairs)
    blocks = block_units(pairs)
    return _block_logs(blocks, [_block_rate_log(records, level, r, rate) for r, _ in blocks])


def level_speed(records: list[RequestRecord], level: int, pairs: list[Pair],
                rate: float | None = None, design: SequentialDesign | None = None
                ) -> tuple[SpeedRatios, list[PromptSpeed]]:
    """The level's ratios and each prompt's, on the level's unit of independence. Per prompt at
    N > 1 the throughput is its requests' tokens over their E2E (its share of each block).
    ``design``: every interval is the rule's confidence sequence (None: the t interval)."""
    speed = _ratios(unit_logs(records, level, rate), unit_name(level, rate), design)
    by_prompt = []
    for pid in dict.fromkeys(p.prompt_id for p, _ in pairs):
        pp = [(a, b) for a, b in pairs if a.prompt_id == pid]
        by_prompt.append(PromptSpeed(prompt_id=pid, category=pp[0][0].category,
                                     ratios=_subset_ratios(0 if rate is not None else level, pp, design)))
    return speed, by_prompt


def category_speed(pairs: list[Pair], level: int, rate: float | None = None,
                   design: SequentialDesign | None = None) -> dict[str, SpeedRatios]:
    """Per prompt category: its ratios on the level's units (see _subset_ratios)."""
    cats = sorted({a.category for a, _ in pairs})
    return {c: _subset_ratios(0 if rate is not None else level, [(a, b) for a, b in pairs if a.category == c],
                              design)
            for c in cats}


def units_sent(records: list[RequestRecord], level: int, rate: float | None = None) -> int:
    """Units sent at the level, succeeded or not (what the rule's cap counts): at concurrency 1 the
    off/on pairs (each turn of a conversation one, as in the ratios), else the repeats' blocks."""
    recs = level_records(records, level, rate)
    if unit_name(level, rate) == "pairs":
        return len({(r.prompt_id, r.repeat, r.replica, r.turn) for r in recs})
    return len({r.repeat for r in recs})


def level_design(design: SequentialDesign, level: int, rate: float | None = None) -> SequentialDesign:
    """The rule at one level. Its floor (``min_units``: each prompt answered once, for identity)
    counts pairs at concurrency 1; a block at N > 1 or at a rate sends the prompt set itself, and
    the rule cannot decide before its first look (several blocks) anyway, so there the floor is none."""
    if unit_name(level, rate) == "pairs" or not design.min_units:
        return design
    return design.model_copy(update={"min_units": 0})


def should_stop(records: list[RequestRecord], level: int, rate: float | None, design: SequentialDesign) -> bool:
    """After a unit: the level's rule stops at its cap or at a verdict (the floor reached). The
    runner asks this after each unit; ``sequential_outcome`` reads the same records afterwards."""
    d = level_design(design, level, rate)
    if units_sent(records, level, rate) >= d.max_units:
        return True
    return decide(unit_logs(records, level, rate)[d.primary], d, capped=False,
                  unit=unit_name(level, rate)).verdict is not None


RATIO_NAMES = {"tpot": "TPOT", "e2e": "E2E", "throughput": "tokens/s"}


def _interval_text(ci: RatioCI) -> str:
    if ci.point is None:
        return "no unit measured"
    if ci.low is None or ci.high is None:
        return f"{ci.point:.2f}x (no interval yet: fewer than {ci.min_n} {ci.unit})"
    return f"{ci.point:.2f}x, {ci.level:.0%} confidence sequence {ci.low:.2f}x-{ci.high:.2f}x"


def sequential_outcome(records: list[RequestRecord], level: int, rate: float | None, design: SequentialDesign,
                       fixed_requests: int | None = None) -> SequentialOutcome:
    """How the rule ended at one level, from its records: decided (the interval gave a verdict, the
    first look and the floor reached), at the cap, or neither: the run was stopped on identity (the
    only other way a level ends early), which leaves the verdict the interval gives from the first
    look on, if any."""
    d = level_design(design, level, rate)
    unit = unit_name(level, rate)
    units = units_sent(records, level, rate)
    requests = len(level_records(records, level, rate))
    decision = decide(unit_logs(records, level, rate)[d.primary], d, capped=False, unit=unit)
    ci = decision.interval
    name = RATIO_NAMES[d.primary]
    spent = requests_text(requests, fixed_requests)
    if decision.verdict is not None:
        stopped, verdict = "decided", decision.verdict
        said = f"equivalent within +-{d.margin:.0%}" if verdict == "equivalent" else verdict
        text = f"{said} after {units} {unit}: {name} {_interval_text(ci)}; {spent}"
    elif units >= d.max_units:
        stopped, verdict = "cap", "no clear difference"
        text = f"no clear difference at the cap of {d.max_units} {unit}: {name} {_interval_text(ci)}; {spent}"
    else:  # the run's own floor did not hold the interval back when the run stopped: the first look does
        stopped = "identity"
        unfloored = d.model_copy(update={"min_units": 0})
        verdict = decide(unit_logs(records, level, rate)[d.primary], unfloored, capped=False,
                         unit=unit).verdict or "no clear difference"
        text = ("not run: the run stopped on identity before this level" if units == 0 else
                f"{verdict} when the run stopped on identity after {units} {unit}: {name} {_interval_text(ci)}; "
                f"{spent}")
    return SequentialOutcome(verdict=verdict, stopped=stopped, units=units, requests=requests,
                             fixed_requests=fixed_requests, interval=ci, text=text)


def level_goodput(records: list[RequestRecord], level: int, slo_ms: dict[str, float],
                  rate: float | None = None) -> GoodputComparison:
    """Goodput per side and the on/off ratio: one unit per repeat (its off block + on block; at
    concurrency 1 its pairs, each side's time the sum of its requests' E2E, as the sides alternate)."""
    recs = level_records(records, level, rate)
    units = [([r for r in recs if r.repeat == rep and r.side == "off"],
              [r for r in recs if r.repeat == rep and r.side == "on"]) for rep in sorted({r.repeat for r in recs})]
    return compare_goodput(units, slo_ms, busy_time=(level == 1 and rate is None))


def level_lag(records: list[RequestRecord], rate: float, side: str) -> SendLag:
    """Send lag of one side at an arrival rate, over its blocks (each timed from its own start)."""
    recs = [r for r in level_records(records, 0, rate) if r.side == side and r.scheduled_at_ns is not None]
    return send_lag_blocks([([r.scheduled_at_ns for r in recs if r.repeat == rep],
                             [r.sent_at_ns for r in recs if r.repeat == rep])
                            for rep in sorted({r.repeat for r in recs})])


def theory_check(level: LevelResult, tpot_off_ms: float | None, tpot_on_ms: float | None,
                 draft_cost: float | None) -> TheoryCheck | None:
    """Theory beside measurement: ideal speedup from acceptance, the implied draft cost c, best k."""
    acc = level.acceptance
    if not acc.known or not acc.drafts or not acc.per_position_rate:
        return None
    k = len(acc.per_position_rate)
    tokens_per_pass = acc.mean_acceptance_length
    c = draft_cost if draft_cost is not None else 0.0
    per_pos = [acc.per_position_rate[i] * acc.drafts for i in range(k)]
    predicted = theory.predicted_speedup_per_position(per_pos, int(acc.drafts), c)
    measured = level.speed.tpot.point
    implied_c = None
    if tpot_off_ms and tpot_on_ms:
        # one verify pass costs tpot_on * L; relative to a decode step: k*c + 1
        implied_c = max(0.0, (tpot_on_ms * tokens_per_pass / tpot_off_ms - 1.0) / k)
    a = theory.acceptance_from_mean_length(tokens_per_pass, k) if 1 < tokens_per_pass < k + 1 else None
    # 1 < L < k + 1 puts a strictly inside (0, 1)
    best = theory.best_k(a, implied_c if implied_c is not None else c) if a is not None else None
    best_measured = max(range(1, k + 1), key=lambda kk: theory.predicted_speedup_per_position(
        per_pos[:kk], int(acc.drafts), implied_c if implied_c is not None else c))
    return TheoryCheck(k=k, tokens_per_pass=tokens_per_pass, draft_cost_assumed=c, predicted_speedup=predicted,
                       measured_speedup=measured,
                       measured_over_predicted=(measured / predicted) if measured and predicted else None,
                       implied_draft_cost=implied_c, iid_acceptance=a,
                       best_k_iid=best[0] if best else None, best_k_measured_positions=best_measured)


def _level_result(report: CompareReport, level: int, rate: float | None, counters: CounterPair | None,
                  fixed_requests: int | None = None) -> LevelResult:
    s = report.settings
    design = s.sequential
    pairs = pair_records(report.requests, level, rate)
    speed, by_prompt = level_speed(report.requests, level, pairs, rate, design)
    recs = level_records(report.requests, level, rate)
    off_lat = latency_summary([r for r in recs if r.side == "off"])
    on_lat = latency_summary([r for r in recs if r.side == "on"])
    counters = counters or CounterPair(before=CounterSnapshot(), after=CounterSnapshot())
    acc = acceptance_summary(counters.before, counters.after)
    lr = LevelResult(concurrency=level if rate is None else 0, request_rate=rate, pairs=len(pairs), speed=speed,
                     by_prompt=by_prompt, by_category=category_speed(pairs, level, rate, design),
                     off=off_lat, on=on_lat, acceptance=acc)
    if design is not None:
        lr.sequential = sequential_outcome(report.requests, level, rate, design, fixed_requests)
    if rate is not None:
        lr.send_lag_off, lr.send_lag_on = level_lag(report.requests, rate, "off"), level_lag(report.requests, rate, "on")
    slo = s.load.slo_ms if s.load else {}
    if slo:
        lr.goodput = level_goodput(report.requests, level, slo, rate)
    lr.theory = theory_check(lr, off_lat.tpot_ms.mean, on_lat.tpot_ms.mean, s.draft_cost)
    return lr


def analyse(report: CompareReport, fixed_requests: Mapping[tuple[int, float | None], int | None] | None = None) -> None:
    """Fill per-level speed, acceptance, theory, goodput and the crossovers from the raw records.

    ``fixed_requests``: with the run-until-decided rule, the requests today's fixed design would have
    sent per level, by (concurrency, None) and (0, request rate) (orchestration knows the prompt set)."""
    s = report.settings
    fixed = fixed_requests or {}
    report.levels = [_level_result(report, level, None, report.counters_on.get(level), fixed.get((level, None)))
                     for level in s.concurrency]
    report.crossover = find_crossover([lv.concurrency for lv in report.levels],
                                      [lv.speed.throughput for lv in report.levels], report.on_server.spec_enabled)
    rates = s.load.request_rates if s.load else []
    report.rate_levels = [_level_result(report, 0, rate, report.counters_on_rate.get(rate_label(rate)),
                                        fixed.get((0, rate)))
                          for rate in rates]
    if rates:
        report.rate_crossover = find_crossover(rates, [lv.speed.throughput for lv in report.rate_levels],
                                               report.on_server.spec_enabled, what="request rate")


def compare_notes(report: CompareReport) -> list[str]:
    notes = side_notes(report.off_server, report.on_server, off_name="the 'off' server", on_name="the 'on' server")
    if report.settings.on_temperature not in (None, report.settings.request.temperature):
        notes.append(f"drill: the spec-on side ran at temperature {report.settings.on_temperature}")
    failed = [r for r in report.requests if not r.ok and not r.warmup]
    if failed:
        notes.append(f"{len(failed)} request(s) failed and were left out of the pairs")
    if report.settings.workers > 1 or report.settings.ray_address:
        where = "Ray actors" if report.settings.ray_address else "worker processes"
        notes.append(f"each block was sent by up to {report.settings.workers} {where}, each its share of the "
                     "requests at its share of the concurrency")
    if not report.settings.interleaved:
        notes.append("the servers ran one after the other (not interleaved): machine drift can bias the ratios")
    design = report.settings.sequential
    if design is not None:
        others = ", ".join(RATIO_NAMES[k] for k in RATIO_NAMES if k != design.primary)
        notes.append(f"{design.rule}; each other ratio ({others}) has its own confidence sequence at the same "
                     f"level, valid at the stop on its own; all three at once hold at error rate "
                     f"{3 * design.alpha:g} (--alpha {design.alpha / 3:.3g} for {design.alpha:g} over all three)")
    for lv in report.rate_levels:
        for side, lag in (("spec-off", lv.send_lag_off), ("spec-on", lv.send_lag_on)):
            if lag is not None and lag.client_limited:
                notes.append(f"request rate {rate_label(lv.request_rate or 0)}, {side}: {lag.reason}; the ratios at "
                             "this rate describe the client's pace, not the servers'")
    stalls = stalls_note(report)
    if stalls:
        notes.append(stalls)
    later = sum(p.different_history_pairs for p in report.identity)
    if later:
        notes.append(f"{later} pair(s) of later conversation turns followed a diverged turn: the sides' "
                     "histories differ there, so those pairs are not identity verdicts of their own")
    notes += compare_findings_notes(report)
    return notes


def stalls_note(report: CompareReport) -> str | None:
    """Where the servers stalled each other's first token (analysis/interference.py): what it does to
    the concurrency-1 figures, and which verdict to read where the TPOT and tokens/s verdicts differ."""
    f = detected_interference(report)
    first = next((lv for lv in report.levels if lv.concurrency == 1), None)
    if f is None or first is None:
        return None
    head = (f"the servers stalled each other's first token ({f.stalls} stalls of about {duration(f.stall_ms)}"
            f"{', in the check before the run' if f.source == 'check' else ''}): at concurrency 1 E2E and "
            "tokens/s include the stalls, TPOT does not")
    tpot, rate = first.speed.tpot.verdict, first.speed.throughput.verdict
    if first.speed.tpot.point is None or first.speed.throughput.point is None or tpot == rate:
        return head
    return f"{head}; where they disagree (here TPOT: {tpot}, tokens/s: {rate}), the stalls make the difference: read TPOT"

"""Spec-on against spec-off from an A/B run's records: speed ratios with confidence on each level's
unit of independence, per prompt and category, goodput, send lag, theory beside measurement, the
crossovers, and the report's notes.

The unit of independence at concurrency 1 is one off/on pair; at concurrency N > 1 (and at an
arrival rate) it is one repeat's off block + on block, whose requests share the machine's state
(never the single request pairs inside it). Per prompt the units are its pairs at concurrency 1
and its copies in each repeat's blocks at N > 1. Formulas: analysis/stats.py.
"""

from __future__ import annotations

from specadapt.analysis.acceptance import acceptance_summary
from specadapt.analysis.interference import detected_interference, duration
from specadapt.analysis.latency import latency_summary, tpot_ns
from specadapt.analysis.pairs import Pair, level_records, pair_records
from specadapt.analysis.pass_notes import compare_findings_notes
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
    RequestRecord,
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


def speed_ratios(pairs: list[Pair]) -> SpeedRatios:
    """Ratios with each pair one unit (concurrency 1: the pairs are sent back to back, one at a time)."""
    units = [[p] for p in pairs]
    tpot, e2e = _latency_logs(units)
    return SpeedRatios(tpot=ratio_ci(tpot, "pairs"), e2e=ratio_ci(e2e, "pairs"),
                       throughput=ratio_ci([_request_rate_log(u) for u in units], "pairs"))


def block_units(pairs: list[Pair]) -> list[tuple[int, list[Pair]]]:
    """The pairs of one concurrency level N > 1 grouped by repeat: (repeat, its pairs), one
    group per off block + on block."""
    groups: dict[int, list[Pair]] = {}
    for a, b in pairs:
        groups.setdefault(a.repeat, []).append((a, b))
    return sorted(groups.items())


def block_speed_ratios(units: list[tuple[int, list[Pair]]], throughput_logs: list[float | None]) -> SpeedRatios:
    """Ratios with each repeat's off block + on block one unit (concurrency N > 1): TPOT and
    E2E from the block's mean over its pairs, throughput from the given per-block log ratios."""
    tpot, e2e = _latency_logs([u for _, u in units])
    return SpeedRatios(tpot=ratio_ci(tpot, "blocks"), e2e=ratio_ci(e2e, "blocks"),
                       throughput=ratio_ci(throughput_logs, "blocks"))


def _block_rate_log(records: list[RequestRecord], level: int, repeat: int, rate: float | None = None) -> float | None:
    """log(rate_on / rate_off) of one repeat's blocks, each rate its block's tokens over its wall time
    (every succeeded request of the block, paired or not)."""
    recs = level_records(records, level, rate)
    (tok_off, t_off), (tok_on, t_on) = (
        block_rate([x for x in recs if x.repeat == repeat and x.side == side]) for side in ("off", "on"))
    return log_rate_ratio(tok_off, t_off, tok_on, t_on)


def _subset_ratios(level: int, pp: list[Pair]) -> SpeedRatios:
    """A prompt's or a category's ratios: its pairs at concurrency 1; at N > 1 and at rates its
    share of each block (its requests' tokens over their E2E), one unit per block pair."""
    if level == 1:
        return speed_ratios(pp)
    units = block_units(pp)
    return block_speed_ratios(units, [_request_rate_log(u) for _, u in units])


def level_speed(records: list[RequestRecord], level: int, pairs: list[Pair],
                rate: float | None = None) -> tuple[SpeedRatios, list[PromptSpeed]]:
    """The level's ratios and each prompt's, on the level's unit of independence. Per prompt at
    N > 1 the throughput is its requests' tokens over their E2E (its share of each block)."""
    if level == 1 and rate is None:
        speed = speed_ratios(pairs)
    else:
        units = block_units(pairs)
        speed = block_speed_ratios(units, [_block_rate_log(records, level, r, rate) for r, _ in units])
    by_prompt = []
    for pid in dict.fromkeys(p.prompt_id for p, _ in pairs):
        pp = [(a, b) for a, b in pairs if a.prompt_id == pid]
        by_prompt.append(PromptSpeed(prompt_id=pid, category=pp[0][0].category,
                                     ratios=_subset_ratios(0 if rate is not None else level, pp)))
    return speed, by_prompt


def category_speed(pairs: list[Pair], level: int, rate: float | None = None) -> dict[str, SpeedRatios]:
    """Per prompt category: its ratios on the level's units (see _subset_ratios)."""
    cats = sorted({a.category for a, _ in pairs})
    return {c: _subset_ratios(0 if rate is not None else level, [(a, b) for a, b in pairs if a.category == c])
            for c in cats}


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


def _level_result(report: CompareReport, level: int, rate: float | None, counters: CounterPair | None) -> LevelResult:
    s = report.settings
    pairs = pair_records(report.requests, level, rate)
    speed, by_prompt = level_speed(report.requests, level, pairs, rate)
    recs = level_records(report.requests, level, rate)
    off_lat = latency_summary([r for r in recs if r.side == "off"])
    on_lat = latency_summary([r for r in recs if r.side == "on"])
    counters = counters or CounterPair(before=CounterSnapshot(), after=CounterSnapshot())
    acc = acceptance_summary(counters.before, counters.after)
    lr = LevelResult(concurrency=level if rate is None else 0, request_rate=rate, pairs=len(pairs), speed=speed,
                     by_prompt=by_prompt, by_category=category_speed(pairs, level, rate),
                     off=off_lat, on=on_lat, acceptance=acc)
    if rate is not None:
        lr.send_lag_off, lr.send_lag_on = level_lag(report.requests, rate, "off"), level_lag(report.requests, rate, "on")
    slo = s.load.slo_ms if s.load else {}
    if slo:
        lr.goodput = level_goodput(report.requests, level, slo, rate)
    lr.theory = theory_check(lr, off_lat.tpot_ms.mean, on_lat.tpot_ms.mean, s.draft_cost)
    return lr


def analyse(report: CompareReport) -> None:
    """Fill per-level speed, acceptance, theory, goodput and the crossovers from the raw records."""
    s = report.settings
    report.levels = [_level_result(report, level, None, report.counters_on.get(level)) for level in s.concurrency]
    report.crossover = find_crossover([lv.concurrency for lv in report.levels],
                                      [lv.speed.throughput for lv in report.levels], report.on_server.spec_enabled)
    rates = s.load.request_rates if s.load else []
    report.rate_levels = [_level_result(report, 0, rate, report.counters_on_rate.get(rate_label(rate)))
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

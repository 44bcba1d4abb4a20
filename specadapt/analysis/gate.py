"""The staging gate of `specadapt equiv`: thresholds over a compare report.

A prompt whose divergence could not be triaged ("unknown") counts as suspect: a gate
must not pass what it could not check.

Beyond the thresholds, the gate certifies only what the run can show:
- speculation ran (``report.activity``, analysis/activity.py): a spec-on server that drafted
  nothing, or of which nothing shows that it drafted, fails unless ``allow_inactive``: an
  identity pass would prove nothing about speculation;
- the configuration promises identity (``report.lossy``, analysis/lossy.py): a lossy one
  fails unless ``allow_lossy``;
- what the prompts prove (``Gate.bound``, analysis/proof.py): the exact 95% upper bound on
  the rate of suspect divergences over the exercised prompts; ``max_suspect_rate`` fails a
  bound above it and says how many exercised prompts would bring it there.
"""

from __future__ import annotations

from specadapt.analysis.proof import CONFIDENCE, RATES, percent, prompts_needed, rate_upper_bound
from specadapt.records import CompareReport, Gate, RateBound

SUSPECT = ("suspect", "unknown")


def rate_bound(report: CompareReport) -> RateBound | None:
    """The bound over the prompts whose spec-on answers used accepted drafts; None without activity."""
    activity = report.activity
    if activity is None:
        return None
    exercised = {p.prompt_id: p for p in activity.prompts if p.exercised}
    suspect = sum(1 for p in report.identity if p.verdict in SUSPECT and p.prompt_id in exercised)
    n = len(exercised)
    tokens = sum(p.accepted for p in exercised.values() if p.accepted is not None) if activity.source != "none" else None
    return RateBound(exercised_prompts=n, suspect_prompts=suspect, confidence=CONFIDENCE,
                     upper=rate_upper_bound(suspect, n), exercised_tokens=tokens,
                     prompts_for={f"{rate:g}": prompts_needed(suspect, rate) for rate in RATES})


def bound_text(bound: RateBound) -> str:
    """One sentence: what the run proves about the suspect rate."""
    if bound.exercised_prompts == 0:
        return "no prompt used an accepted draft: the run bounds no suspect rate"
    needs = ", ".join(f"{percent(float(rate))} takes {n}" for rate, n in bound.prompts_for.items())
    return (f"{bound.suspect_prompts} suspect in {bound.exercised_prompts} exercised prompts: suspect rate below "
            f"{percent(bound.upper)} at {bound.confidence:.0%} confidence (showing {needs} exercised prompts at "
            f"{bound.suspect_prompts} suspect)")


def apply_gate(report: CompareReport, max_suspect: int = 0, max_near_tie: int | None = None,
               min_speedup: float | None = None, max_suspect_rate: float | None = None,
               allow_inactive: bool = False, allow_lossy: bool = False) -> Gate:
    gate = Gate(max_suspect=max_suspect, max_near_tie=max_near_tie, min_speedup=min_speedup,
                max_suspect_rate=max_suspect_rate, allow_inactive=allow_inactive, allow_lossy=allow_lossy)
    suspect = report.counts.get("suspect", 0) + report.counts.get("unknown", 0)
    near = report.counts.get("near-tie", 0)
    if suspect > max_suspect:
        ids = [p.prompt_id for p in report.identity if p.verdict in SUSPECT]
        gate.reasons.append(f"{suspect} suspect divergence(s) (max {max_suspect}): {', '.join(ids[:10])}")
    if max_near_tie is not None and near > max_near_tie:
        gate.reasons.append(f"{near} near-tie divergence(s) (max {max_near_tie})")
    if min_speedup is not None:
        first = report.levels[0] if report.levels else None
        point = first.speed.throughput.point if first else None
        if point is None or point < min_speedup:
            shown = "unknown" if point is None else f"{point:.2f}x"
            gate.reasons.append(f"throughput speedup {shown} at concurrency "
                                f"{first.concurrency if first else '?'} is below {min_speedup:.2f}x")
    gate.reasons += report.server_exits
    if not report.identity:
        gate.reasons.append("no prompt pair succeeded on both servers: nothing was compared")
    activity = report.activity
    if activity is not None and activity.ran is not True and not allow_inactive:
        if activity.ran is False:
            gate.reasons.append(f"speculation did not run: an identity pass would prove nothing ({activity.evidence}; "
                                "--allow-inactive accepts this)")
        else:
            gate.reasons.append(f"speculation not shown to run: an identity pass may prove nothing "
                                f"({activity.evidence}; --allow-inactive accepts this)")
    if report.lossy and not allow_lossy:
        gate.reasons.append(f"lossy by configuration, so identity is not promised: {'; '.join(report.lossy)} "
                            "(--allow-lossy accepts this)")
    gate.bound = rate_bound(report)
    if max_suspect_rate is not None:
        bound = gate.bound
        if bound is None:
            gate.reasons.append("--max-suspect-rate: the report has no record of speculation per prompt to bound "
                                "the rate over")
        elif bound.upper > max_suspect_rate:
            need = prompts_needed(bound.suspect_prompts, max_suspect_rate)
            gate.reasons.append(
                f"suspect rate shown only below {percent(bound.upper)} ({bound.suspect_prompts} suspect in "
                f"{bound.exercised_prompts} exercised prompts, {bound.confidence:.0%} confidence), above "
                f"--max-suspect-rate {percent(max_suspect_rate)}: {need - bound.exercised_prompts} more exercised "
                f"prompts would be needed at {bound.suspect_prompts} suspect ({need} in all)")
    gate.passed = not gate.reasons
    report.gate = gate
    return gate

"""The staging gate of `specadapt equiv`: thresholds over a compare report.

A prompt whose divergence could not be triaged ("unknown") counts as suspect: a gate
must not pass what it could not check.
"""

from __future__ import annotations

from specadapt.records import CompareReport, Gate


def apply_gate(report: CompareReport, max_suspect: int = 0, max_near_tie: int | None = None,
               min_speedup: float | None = None) -> Gate:
    gate = Gate(max_suspect=max_suspect, max_near_tie=max_near_tie, min_speedup=min_speedup)
    suspect = report.counts.get("suspect", 0) + report.counts.get("unknown", 0)
    near = report.counts.get("near-tie", 0)
    if suspect > max_suspect:
        ids = [p.prompt_id for p in report.identity if p.verdict in ("suspect", "unknown")]
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
    if not report.identity:
        gate.reasons.append("no prompt pair succeeded on both servers: nothing was compared")
    gate.passed = not gate.reasons
    report.gate = gate
    return gate

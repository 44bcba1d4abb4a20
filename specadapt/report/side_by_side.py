"""Two saved probe reports side by side (spec off vs on): per-category speed ratios.

Formulas: speedup in tokens/s = on / off; TPOT ratio = off TPOT / on TPOT (> 1 means
speculation made each token faster). These are point estimates from one run each; the
`compare` command adds interleaving and confidence intervals.
"""

from __future__ import annotations

from pydantic import BaseModel
from rich.console import Console
from rich.table import Table

from specadapt.records import LatencySummary, ProbeReport


class CategoryRatio(BaseModel):
    category: str
    off_tokens_per_s: float | None
    on_tokens_per_s: float | None
    tokens_per_s_ratio: float | None
    off_tpot_ms: float | None
    on_tpot_ms: float | None
    tpot_ratio: float | None


def _ratio(num: float | None, den: float | None) -> float | None:
    return num / den if num is not None and den else None


def category_ratio(name: str, off: LatencySummary, on: LatencySummary) -> CategoryRatio:
    return CategoryRatio(category=name, off_tokens_per_s=off.output_tokens_per_s, on_tokens_per_s=on.output_tokens_per_s,
                         tokens_per_s_ratio=_ratio(on.output_tokens_per_s, off.output_tokens_per_s),
                         off_tpot_ms=off.tpot_ms.mean, on_tpot_ms=on.tpot_ms.mean,
                         tpot_ratio=_ratio(off.tpot_ms.mean, on.tpot_ms.mean))


def side_by_side(off: ProbeReport, on: ProbeReport) -> list[CategoryRatio]:
    rows = [category_ratio(c, off.by_category[c], on.by_category[c])
            for c in off.by_category if c in on.by_category]
    rows.append(category_ratio("all", off.latency, on.latency))
    return rows


def identical_texts(off: ProbeReport, on: ProbeReport) -> dict[str, bool]:
    """Per prompt id (first repeat): is the spec-on text identical to spec-off?"""
    def texts(r: ProbeReport) -> dict[str, str]:
        return {q.prompt_id: q.text for q in r.requests if q.ok and q.repeat == 0}
    a, b = texts(off), texts(on)
    return {pid: a[pid] == b[pid] for pid in a if pid in b}


def render_side_by_side(off: ProbeReport, on: ProbeReport, console: Console) -> None:
    fmt = lambda v, spec=".1f": "-" if v is None else format(v, spec)  # noqa: E731
    table = Table(title="spec on vs off (point estimates, one run each)")
    for col in ("category", "tok/s off", "tok/s on", "speedup", "TPOT off ms", "TPOT on ms", "TPOT ratio"):
        table.add_column(col, justify="left" if col == "category" else "right")
    for r in side_by_side(off, on):
        table.add_row(r.category, fmt(r.off_tokens_per_s), fmt(r.on_tokens_per_s), fmt(r.tokens_per_s_ratio, ".2f") + "x",
                      fmt(r.off_tpot_ms), fmt(r.on_tpot_ms), fmt(r.tpot_ratio, ".2f") + "x")
    console.print(table)
    acc = on.acceptance
    if acc.known:
        console.print(f"spec on: acceptance rate {acc.acceptance_rate:.1%}, mean acceptance length "
                      f"{acc.mean_acceptance_length:.2f}, per position "
                      + " / ".join(f"{r:.0%}" for r in acc.per_position_rate))
    same = identical_texts(off, on)
    diff = sorted(p for p, ok in same.items() if not ok)
    console.print(f"identical greedy text: {len(same) - len(diff)} of {len(same)} prompts"
                  + (f"; different: {', '.join(diff)}" if diff else ""))

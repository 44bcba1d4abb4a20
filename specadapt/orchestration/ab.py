"""Spec off against spec on as one library call: open the planned servers, run the A/B, return
the report (orchestration/compare.py runs the requests and analyses them).

Both servers up at once, the requests interleaved (``settings.interleaved``), or one after the
other: the spec-on server alone first, then the spec-off server alone, kept up until its triage
of every divergence is done. Run until decided (``settings.sequential``) needs both servers up at
once: refused, before any server starts, when they would run one after the other.
"""

from __future__ import annotations

from specadapt.adapters.base import Server
from specadapt.load.progress import ProgressBars, no_bars
from specadapt.errors import UsageError
from specadapt.orchestration.compare import (
    ONE_AFTER_THE_OTHER,
    finish_compare,
    run_compare,
    run_one_side,
    side_settings,
    total_requests,
)
from specadapt.orchestration.servers import LOGGED, Messages, ServerPlan, open_servers
from specadapt.records import CompareReport, CompareSettings, Prompt

SIDES = ("spec-off", "spec-on")


def compare_servers(plan: ServerPlan, prompts: list[Prompt], settings: CompareSettings,
                    bars: ProgressBars = no_bars, messages: Messages = LOGGED) -> CompareReport:
    """The whole A/B on the servers of ``plan`` (its sides labelled spec-off and spec-on, e.g.
    ``ab_sides``): interleaved when ``settings.interleaved``, else one server after the other.
    Every server started here is stopped when this returns or raises."""
    labels = sorted(s.label or "" for s in plan.sides)
    if labels != sorted(SIDES):
        raise ValueError(f"compare_servers needs a plan of the sides {' and '.join(SIDES)}, not {labels}")
    if settings.sequential is not None and not settings.interleaved:
        raise UsageError(ONE_AFTER_THE_OTHER)
    total = total_requests(len(prompts), settings, prompts)
    if settings.interleaved:
        with open_servers(plan, messages) as opened:
            by = _by_label(plan, opened)
            report = run_compare(by["spec-off"], by["spec-on"], prompts, settings, bars("comparing", total))
            report.notes += [f"placement: {line}" for line in plan.placement]
            return report
    per_side = total // 2
    with open_servers(plan.only("spec-on"), messages) as (on,):
        on_info, on_recs, on_counters = run_one_side(on, "on", prompts, settings, bars("spec on", per_side))
    with open_servers(plan.only("spec-off"), messages) as (off,):
        off_info, off_recs, off_counters = run_one_side(off, "off", prompts, settings, bars("spec off", per_side))
        report = CompareReport(settings=settings, off_server=off_info, on_server=on_info,
                               requests=off_recs + on_recs, counters_on=on_counters, counters_off=off_counters)
        return finish_compare(report, off, prompts, side_settings(off, settings.request))


def _by_label(plan: ServerPlan, opened: list[Server]) -> dict[str, Server]:
    return {side.label or "": server for side, server in zip(plan.sides, opened, strict=True)}

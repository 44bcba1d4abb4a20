"""Probe reports of separate runs of the same settings, merged into one report.

Runs from several machines against one server, or against different replicas, each write
a probe report; ``merge_reports`` combines them. Settings must match (the first setting
that differs is named); the servers must be one model on one backend. Every figure is
recomputed from the merged records (see scale_report): latency, by category, failures;
acceptance sums the counter deltas over the distinct servers, each server counted once.

Send times: each run's records count from its own start, on its own clock; the merged
records are ordered by those times, so the run-wide duration and tokens/s assume the runs
started together (the report says so).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from specadapt.analysis.probe_report import build_probe_report
from specadapt.analysis.scale_report import replica_results, server_window, summed_counters
from specadapt.errors import UsageError
from specadapt.records import CounterSnapshot, MergeSource, ProbeReport, RequestRecord, ScaleLayout, ServerInfo


def _flat(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k in sorted(value):
            out.update(_flat(value[k], f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: value}


def setting_difference(a: ProbeReport, b: ProbeReport) -> tuple[str, Any, Any] | None:
    """The first setting (dotted name) in which two reports differ, with a's and b's value; None if none."""
    fa, fb = _flat(a.settings.model_dump()), _flat(b.settings.model_dump())
    for key in sorted(set(fa) | set(fb)):
        if fa.get(key) != fb.get(key):
            return key, fa.get(key), fb.get(key)
    for key in ("backend", "model_id"):
        if getattr(a.server, key) != getattr(b.server, key):
            return f"server {key}", getattr(a.server, key), getattr(b.server, key)
    return None


def _windows_of(report: ProbeReport) -> list[tuple[str, ServerInfo, CounterSnapshot, CounterSnapshot]]:
    """(url, server info, before, after) per server the report measured."""
    if report.scale is not None and report.scale.replicas:
        return [(r.target, r.server, r.counters_before, r.counters_after) for r in report.scale.replicas]
    return [(report.server.base_url, report.server, report.counters_before, report.counters_after)]


def merge_reports(sources: Sequence[tuple[str, ProbeReport]]) -> ProbeReport:
    """One report from several (name, report) pairs of the same settings."""
    if len(sources) < 2:
        raise UsageError("give at least two probe reports to merge")
    first_name, first = sources[0]
    for name, rep in sources[1:]:
        diff = setting_difference(first, rep)
        if diff is not None:
            key, mine, theirs = diff
            raise UsageError(f"{name} has {key} {theirs!r}, {first_name} {mine!r}: merge only runs of the same "
                             "settings")
    records: list[RequestRecord] = []
    servers: dict[str, ServerInfo] = {}
    pairs: dict[str, list[tuple[CounterSnapshot, CounterSnapshot]]] = {}
    layout_sources = []
    for name, rep in sources:
        for url, info, before, after in _windows_of(rep):
            servers.setdefault(url, info)
            pairs.setdefault(url, []).append((before, after))
        for rec in rep.requests:
            records.append(rec if rec.target else rec.model_copy(update={"target": rep.server.base_url}))
        layout_sources.append(MergeSource(path=name, created_at=rep.created_at, server=rep.server,
                                          requests=len(rep.requests), partial=rep.partial,
                                          replicas=[r.target for r in rep.scale.replicas] if rep.scale else []))
    records.sort(key=lambda r: r.sent_at_ns)
    windows = {url: server_window(p) for url, p in pairs.items()}
    before, after = summed_counters(list(windows.values()))
    partial = [f"{name}: {rep.partial_reason or 'partial'}" for name, rep in sources if rep.partial]
    layout = ScaleLayout(executor="merged", workers_requested=len(sources), sources=layout_sources,
                         replicas=replica_results(records, servers, windows) if len(servers) > 1 else [])
    notes = [f"merged from {len(sources)} reports over {len(servers)} server(s); each run's send times count "
             "from its own start, so duration and tokens/s assume the runs started together"]
    return build_probe_report(first.server, first.settings, records, before, after, layout,
                        partial_reason="; ".join(partial) if partial else None, extra_notes=notes)

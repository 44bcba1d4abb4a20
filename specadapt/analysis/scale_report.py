"""Probe reports from records gathered by several workers, replicas or saved runs.

Every figure is recomputed from the records and counter snapshots, the way ``run_probe``
computes them for one process and one server:

- latency, by category, failures, token sources: from the merged records;
- acceptance over several servers: the counter deltas summed over the distinct servers
  (Formula: before = sum over servers of each server's before, after likewise; the
  deltas of the sums are the sums of the deltas). A server that several runs measured
  counts once: its window runs from the smallest reading before to the largest after
  (counters only grow), so overlapping runs against one server are not counted twice.
  Any server whose counters could not be read makes acceptance unknown.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from specadapt.analysis.acceptance import acceptance_summary
from specadapt.analysis.latency import latency_summary
from specadapt.records import CounterSnapshot, ReplicaResult, RequestRecord, ServerInfo

_SCALARS = ("drafts", "draft_tokens", "accepted_tokens", "generation_tokens", "prompt_tokens")


def _unavailable(snapshots: Sequence[CounterSnapshot]) -> CounterSnapshot | None:
    return next((s for s in snapshots if s.source.startswith("unavailable")), None)


def _fold(snapshots: Sequence[CounterSnapshot], pick, source: str) -> CounterSnapshot:
    """Counter by counter, ``pick`` of the values (a counter missing anywhere stays missing)."""
    bad = _unavailable(snapshots)
    if bad is not None:
        return bad
    out = CounterSnapshot(source=source)
    for name in _SCALARS:
        values = [getattr(s, name) for s in snapshots]
        setattr(out, name, None if any(v is None for v in values) else pick(values))
    positions = set().union(*(s.accepted_per_position for s in snapshots))
    out.accepted_per_position = {p: pick([s.accepted_per_position.get(p, 0.0) for s in snapshots])
                                 for p in sorted(positions)}
    return out


def server_window(pairs: Sequence[tuple[CounterSnapshot, CounterSnapshot]]) -> tuple[CounterSnapshot, CounterSnapshot]:
    """One server read by several runs: (smallest before, largest after), counter by counter."""
    befores, afters = [b for b, _ in pairs], [a for _, a in pairs]
    return _fold(befores, min, befores[0].source), _fold(afters, max, afters[0].source)


Window = tuple[CounterSnapshot, CounterSnapshot]


def summed_counters(windows: Sequence[Window]) -> Window:
    """Several distinct servers: (sum of befores, sum of afters), counter by counter."""
    if len(windows) == 1:
        return windows[0]
    source = f"sum over {len(windows)} servers"
    return (_fold([b for b, _ in windows], sum, source), _fold([a for _, a in windows], sum, source))


def group_by_target(records: Iterable[RequestRecord]) -> dict[str, list[RequestRecord]]:
    out: dict[str, list[RequestRecord]] = {}
    for rec in records:
        out.setdefault(rec.target, []).append(rec)
    return out


def replica_results(records: Sequence[RequestRecord], servers: dict[str, ServerInfo],
                    windows: dict[str, tuple[CounterSnapshot, CounterSnapshot]]) -> list[ReplicaResult]:
    """Per server (in the order of ``servers``): its requests' latency and its own acceptance."""
    by_target = group_by_target(records)
    out = []
    for url, info in servers.items():
        before, after = windows[url]
        out.append(ReplicaResult(target=url, server=info, latency=latency_summary(by_target.get(url, [])),
                                 acceptance=acceptance_summary(before, after), counters_before=before,
                                 counters_after=after))
    return out

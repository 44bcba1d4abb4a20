"""Spec-decode counters before/after a run -> acceptance figures.

Formulas (deltas over the run, d = after - before):
- acceptance rate          d(accepted) / d(draft tokens)
- mean acceptance length   1 + d(accepted) / d(drafts)      (counts the bonus token)
- per-position rate i      d(accepted at i) / d(drafts)     (unconditional)
- conditional rate i       d(accepted at i) / d(accepted at i-1)
A counter that went down (a restarted server) or is missing makes the figures unknown,
never negative or wrong; the reason is stated.
"""

from __future__ import annotations

from specadapt.records import AcceptanceSummary, CounterSnapshot


def _delta(before: float | None, after: float | None) -> float | None:
    if before is None or after is None:
        return None
    return after - before


def acceptance_summary(before: CounterSnapshot, after: CounterSnapshot) -> AcceptanceSummary:
    gen = _delta(before.generation_tokens, after.generation_tokens)
    gen = gen if gen is None or gen >= 0 else None
    unreadable = [s.source for s in (before, after) if s.source.startswith("unavailable")]
    if unreadable:
        return AcceptanceSummary(known=False, generation_tokens=gen,
                                 reason=f"counters could not be read ({unreadable[0]})")
    if before.has_spec_counters != after.has_spec_counters:
        return AcceptanceSummary(known=False, generation_tokens=gen,
                                 reason="spec-decode counters appeared or vanished during the run (server restarted?)")
    if not (before.has_spec_counters and after.has_spec_counters):
        return AcceptanceSummary(known=False, generation_tokens=gen,
                                 reason="the server exposes no spec-decode counters (speculation off, or stats disabled)")
    d_drafts = _delta(before.drafts, after.drafts)
    d_tokens = _delta(before.draft_tokens, after.draft_tokens)
    d_acc = _delta(before.accepted_tokens, after.accepted_tokens)
    positions = sorted(set(before.accepted_per_position) | set(after.accepted_per_position))
    d_pos = [_delta(before.accepted_per_position.get(p, 0.0), after.accepted_per_position.get(p)) for p in positions]
    if any(d is None or d < 0 for d in (d_drafts, d_tokens, d_acc, *d_pos)):
        return AcceptanceSummary(known=False, generation_tokens=gen,
                                 reason="spec-decode counters went down or vanished during the run (server restarted?)")
    summary = AcceptanceSummary(known=True, drafts=d_drafts, draft_tokens=d_tokens, accepted_tokens=d_acc,
                                generation_tokens=gen)
    if not d_drafts or not d_tokens:
        summary.known = False
        summary.reason = "no drafts were proposed during the run"
        return summary
    summary.acceptance_rate = d_acc / d_tokens
    summary.mean_acceptance_length = 1.0 + d_acc / d_drafts
    summary.per_position_rate = [d / d_drafts for d in d_pos]
    cond: list[float | None] = []
    for i, d in enumerate(d_pos):
        prev = d_drafts if i == 0 else d_pos[i - 1]
        cond.append(d / prev if prev else None)
    summary.per_position_conditional = cond
    return summary

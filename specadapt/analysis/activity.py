"""Did speculation run on the spec-on server, and on which prompts?

An identity pass proves something about speculation only where speculation took part in the
text compared. Two questions, answered from the records and counters of an A/B run:

Did it run (``SpecActivity.ran``), from the best evidence there is:
1. the spec-on server says speculation is off (``ServerInfo.spec_enabled`` False): no;
2. its spec-decode counters over the compared levels (after - before, warm-up excluded):
   yes when draft tokens were proposed, no when none were;
3. the answers' own counts (``RequestRecord.spec_drafted``): yes when any drafted;
4. the streamed chunks (below): yes when a draft token was accepted; otherwise nothing tells.

Which prompts it took part in (``PromptActivity.exercised``: at least one accepted draft token
in the prompt's compared spec-on answers), from the first per-request source that holds:
- ``response``: every compared spec-on answer states its own accepted count (vLLM
  ``--per-request-spec-decode-metrics``, llama.cpp ``timings``, the reference server);
- ``chunks``: where each streamed chunk carries one engine step, a step emits its accepted
  draft tokens and the target's own token, so accepted = tokens - chunks (the first chunk,
  from the prefill, holds one token). It holds only where (a) the chunk token counts are
  exact (usage or logprobs, not one-per-chunk guesses), (b) the spec-off server's chunks carry
  one token each (a stream interval above 1, or chunks merged on the way, would make chunk
  sizes measure the stream), and (c) where the spec-on server has counters, at every level the
  chunks' sum A_c and the counters' accepted delta A satisfy 0 <= A - A_c <= k * requests
  (a request's last step can accept draft tokens that max_tokens or a stop then cuts; k: the
  draft length). Without counters the chunks are used unchecked, and the report says so.
- ``none``: per-prompt activity is not known, and the reason is stated; no prompt then counts
  as exercised.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from specadapt.analysis.pairs import sides_by_pair
from specadapt.records import CompareReport, PromptActivity, RequestRecord, SpecActivity
from specadapt.records.identity import SpecSource
from specadapt.records.load import rate_label
from specadapt.records.reports import CounterPair


def compared_on(records: Iterable[RequestRecord]) -> list[RequestRecord]:
    """The spec-on answers that have a spec-off partner (the pairs identity compares)."""
    return [v["on"] for v in sides_by_pair(records).values() if "on" in v and "off" in v]


def chunk_accepted(rec: RequestRecord) -> int:
    """Accepted draft tokens of one answer read from its chunks: tokens - chunks."""
    return sum(rec.chunk_tokens) - len(rec.chunk_tokens)


def _level_of(rec: RequestRecord) -> tuple[int, float | None]:
    return rec.concurrency, rec.request_rate


def _spec_delta(pair: CounterPair, field: str) -> float | None:
    before, after = pair.before, pair.after
    if not (before.has_spec_counters and after.has_spec_counters):
        return None
    d = getattr(after, field) - getattr(before, field)
    return d if d >= 0 else None


def counter_totals(pairs: Sequence[CounterPair]) -> tuple[float, float] | None:
    """(drafted, accepted) over the levels whose counters were read before and after; None when none were."""
    known = [(_spec_delta(p, "draft_tokens"), _spec_delta(p, "accepted_tokens")) for p in pairs]
    known = [(d, a) for d, a in known if d is not None and a is not None]
    if not known:
        return None
    return sum(d for d, _ in known), sum(a for _, a in known)


def chunks_hold(on_all: Sequence[RequestRecord], off_all: Sequence[RequestRecord],
                levels: dict[tuple[int, float | None], CounterPair], k: int | None) -> tuple[bool, str]:
    """Whether accepted = tokens - chunks holds for these spec-on answers, and what showed it (or why not).
    ``on_all``/``off_all``: every non-warm-up request of each side (failed ones too: they took engine steps)."""
    guessed = [r for r in on_all if r.ok and r.token_source == "chunks"]
    if guessed:
        return False, ("chunk token counts are guesses (the server gave neither usage nor logprobs per chunk), "
                       "so chunks cannot count accepted tokens")
    merged = [r for r in off_all if r.ok and any(n > 1 for n in r.chunk_tokens)]
    if merged:
        return False, (f"{len(merged)} spec-off answer(s) streamed chunks of several tokens (a stream interval above "
                       "1, or chunks merged on the way), so a chunk is not one engine step")
    by_chunks, by_counters = 0, None
    for level, pair in levels.items():
        counted = _spec_delta(pair, "accepted_tokens")
        if counted is None:
            continue
        recs = [r for r in on_all if _level_of(r) == level]
        from_chunks = sum(chunk_accepted(r) for r in recs)
        k_here = k if k is not None else max((n - 1 for r in recs for n in r.chunk_tokens), default=0)
        if not 0 <= counted - from_chunks <= k_here * len(recs):
            return False, (f"the chunks count {from_chunks} accepted tokens at {_level_text(level)}, the server's "
                           f"counters {counted:g}: chunks are not one engine step each there")
        by_chunks += from_chunks
        by_counters = (by_counters or 0.0) + counted
    if by_counters is None:
        return True, "streamed chunks, one engine step each (not checked: the server gives no spec-decode counters)"
    return True, (f"streamed chunks, one engine step each: {by_chunks} accepted tokens by the chunks, "
                  f"{by_counters:g} by the server's counters at the same levels")


def _level_text(level: tuple[int, float | None]) -> str:
    concurrency, rate = level
    return f"concurrency {concurrency}" if rate is None else f"request rate {rate:g}/s"


def _per_prompt(on: Sequence[RequestRecord], source: SpecSource) -> list[PromptActivity]:
    by_prompt: dict[str, list[RequestRecord]] = {}
    for r in on:
        by_prompt.setdefault(r.prompt_id, []).append(r)
    out = []
    for pid, recs in by_prompt.items():
        drafted = accepted = None
        if source == "response":
            drafted = sum(r.spec_drafted or 0 for r in recs)
            accepted = sum(r.spec_accepted or 0 for r in recs)
        elif source == "chunks":
            accepted = sum(chunk_accepted(r) for r in recs)
        out.append(PromptActivity(prompt_id=pid, category=recs[0].category, requests=len(recs),
                                  output_tokens=sum(r.output_tokens for r in recs), drafted=drafted,
                                  accepted=accepted, exercised=None if accepted is None else accepted > 0))
    return out


def spec_activity(report: CompareReport) -> SpecActivity:
    """The activity of the spec-on server over the compared pairs of ``report``."""
    records = report.requests
    on = compared_on(records)
    on_all = [r for r in records if r.side == "on" and not r.warmup]
    off_all = [r for r in records if r.side == "off" and not r.warmup]
    levels: dict[tuple[int, float | None], CounterPair] = {(c, None): p for c, p in report.counters_on.items()}
    rates = {r.request_rate: r for r in on_all if r.request_rate is not None}
    for label, pair in report.counters_on_rate.items():
        rate = next((x for x in rates if rate_label(x) == label), None)
        if rate is not None:
            levels[(0, rate)] = pair
    source: SpecSource = "none"
    if not on:
        note = "no pair was compared"
    elif all(r.spec_accepted is not None for r in on):
        source, note = "response", "the answers' own drafted and accepted counts"
    else:
        holds, note = chunks_hold(on_all, off_all, levels, report.on_server.num_speculative_tokens)
        source = "chunks" if holds else "none"
    prompts = _per_prompt(on, source)
    accepted_tokens = None if source == "none" else sum(p.accepted or 0 for p in prompts)
    ran, evidence, drafted, accepted = _decide_ran(report, list(levels.values()), on,
                                                   accepted_tokens if source == "chunks" else None)
    return SpecActivity(ran=ran, evidence=evidence, drafted=drafted, accepted=accepted, source=source,
                        source_note=note, prompts=prompts, exercised_prompts=sum(1 for p in prompts if p.exercised),
                        output_tokens=sum(r.output_tokens for r in on), accepted_output_tokens=accepted_tokens)


def _decide_ran(report: CompareReport, pairs: list[CounterPair], on: Sequence[RequestRecord],
                by_chunks: int | None) -> tuple[bool | None, str, float | None, float | None]:
    """(ran, evidence, drafted, accepted) from the best evidence (module docstring); ``by_chunks``: the
    accepted tokens the chunks count, where they hold."""
    info = report.on_server
    totals = counter_totals(pairs)
    if totals is not None and totals[0] > 0:
        return True, (f"the spec-on server's counters: {totals[0]:g} draft tokens proposed, {totals[1]:g} accepted "
                      "over the compared levels"), *totals
    if info.spec_enabled is False:
        signal = f" ({info.spec_signal})" if info.spec_signal else ""
        return False, "the spec-on server says speculation is off" + signal, None, None
    if totals is not None:
        return False, "the spec-on server's counters show no draft token proposed over the compared levels", *totals
    if on and all(r.spec_drafted is not None for r in on):
        drafted = sum(r.spec_drafted or 0 for r in on)
        accepted = sum(r.spec_accepted or 0 for r in on)
        if drafted:
            return True, f"the answers' own counts: {drafted} draft tokens proposed, {accepted} accepted", drafted, accepted
        return False, "the answers' own counts show no draft token proposed", drafted, accepted
    if by_chunks:
        return True, (f"the streamed chunks: {by_chunks} tokens came in steps of more than one (the server gives no "
                      "spec-decode counters)"), None, by_chunks
    return None, ("nothing shows that speculation ran: the spec-on server gives no spec-decode counters and no "
                  "per-request counts, and no streamed chunk carried more than one token"), None, None

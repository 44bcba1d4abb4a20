"""Speculation per request and per pass of the target: which tokens each pass produced.

A pass of the target checks the tokens drafted for a request and keeps the longest agreeing run
(the accepted draft tokens), then adds one token of its own: it produces accepted + 1 tokens.
The request's first pass (the prefill) produces one token and checks no draft. This module
reads, for each answer of the spec-on server, its passes and its drafted and accepted counts
from the best source there is, checks them, and sums them per prompt, per category and over all.

Sources, per answer (``RequestPasses.source``), the first that holds:

``chunks+response``
    The streamed chunks with exact token counts (usage or logprobs), each one engine step, so
    chunk i is pass i; checked against the answer's own counts (vLLM
    ``--per-request-spec-decode-metrics``, llama.cpp ``timings``, SGLang, the reference server).
    It holds where the first chunk has one token (the prefill's), the chunks' accepted sum
    A_c = sum(tokens - 1) and the answer's own A satisfy 0 <= A - A_c <= k (a length or stop
    limit can cut the accepted tokens of the last pass; they were still accepted), the passes
    of more than one token are at most the answer's passes with a draft, and, where the answer
    lists its passes (vLLM ``detailed``), the chunks of more than one token are its passes that
    accepted a draft token, in order, each with tokens - 1 accepted (the last may be cut).
    Draft lengths per pass are then read from the list where they are certain: between two
    passes that accepted, the r one-token chunks hold z passes that accepted nothing; z = r: all
    checked a draft, z = 0: none did, otherwise that stretch is left unknown.
``response``
    The answer's own counts, without the pass order (its chunks do not hold, or are not exact).
``chunks``
    The chunks alone, where no answer of the level gives its own counts. They hold only where
    one request was in flight at a time (concurrent requests can share an engine step and a
    server can merge a request's steps into one chunk when its client is slower than the
    engine), every chunk count is exact, the first chunk has one token, and the server's
    counters over the same requests agree: 0 <= A - A_c <= k * requests. No counters: refused.
``none``
    None holds: "per-request acceptance not available: <why>", never a guess.

The per-request sums are checked against the counter deltas of the same requests
(``CounterCheck``): the answers' own counts must equal them exactly (accepted; drafted and passes
with a draft where every answer states them); a disagreement is a finding about the server, which
says both figures. So is an answer whose exact chunks contradict its own counts: one finding per
group of answers, the first such answer's reason and how many more are alike.

Figures (``PassFigures``), per group: acceptance rate = accepted / drafted; tokens per pass =
output tokens / passes over the answers whose passes are known; the p10/p50/p90 of each across
answers; the histogram of tokens per pass. Acceptance by position (``PositionBin``): of the
output tokens at positions [start, end) over the answers with passes, the share that were
accepted draft tokens (in a pass of t tokens, the first t - 1).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from specadapt.analysis.latency import percentile
from specadapt.records import CompareReport, ProbeReport, RequestRecord
from specadapt.records.passes import (
    CounterCheck,
    PassFigures,
    PassSource,
    PositionBin,
    RequestPasses,
    SpeculationSeen,
)
from specadapt.records.load import rate_label
from specadapt.records.reports import CounterPair

EXACT = ("usage", "logprobs")
NOT_AVAILABLE = "per-request acceptance not available: "


@dataclass
class Group:
    """Answers whose engine steps the counters of one window cover: a level of a compare, a probe run."""

    label: str
    records: list[tuple[int, RequestRecord]] = field(default_factory=list)
    """(index in the report's requests, record): every non-warm-up answer of the side, failed ones too."""
    counters: CounterPair | None = None
    serial: bool = True
    """One request in flight at a time."""
    uncounted: str = ""
    """Why the counters cannot check these answers, where the caller knows (they also count other requests)."""


# ----------------------------------------------------------------------------- one answer

def chunk_passes(rec: RequestRecord) -> tuple[list[int] | None, str]:
    """The answer's chunks as passes, or (None, why not)."""
    if not rec.chunk_tokens:
        return None, "no chunk carried a token"
    if rec.token_source not in EXACT:
        return None, "its chunk token counts are guesses (no usage or logprobs per chunk)"
    if any(n < 1 for n in rec.chunk_tokens):
        return None, "a chunk counted no token"
    if rec.chunk_tokens[0] != 1:
        return None, (f"its first chunk carries {rec.chunk_tokens[0]} tokens, not the prefill's one: the server "
                      "merged steps into one chunk")
    return list(rec.chunk_tokens), ""


def align(decode: Sequence[int], accepted: Sequence[int], drafted: Sequence[int]) -> list[int | None] | None:
    """The draft length of each decode pass (the passes after the prefill, as tokens produced),
    given the answer's list of passes with a draft (``accepted``/``drafted``, in order); None where
    they cannot be the same passes. A length is None where it is not certain (module docstring)."""
    if len(accepted) != len(drafted) or len(accepted) > len(decode):
        return None
    last = len(decode) - 1
    nz = [j for j, a in enumerate(accepted) if a > 0]
    big = [i for i, t in enumerate(decode) if t > 1]
    if len(nz) == len(big) + 1 and (not big or big[-1] != last) and decode:
        big.append(last)  # the last pass accepted draft tokens that a limit then cut
    if len(nz) != len(big):
        return None
    for i, j in zip(big, nz):
        want = decode[i] - 1
        if accepted[j] != want and not (i == last and accepted[j] > want):
            return None
    out: list[int | None] = [None] * len(decode)
    prev_i = prev_j = -1
    for i, j in zip([*big, len(decode)], [*nz, len(accepted)]):
        run = range(prev_i + 1, i)
        zeros = range(prev_j + 1, j)
        if len(zeros) > len(run):
            return None
        if not zeros:
            for p in run:
                out[p] = 0
        elif len(zeros) == len(run):
            for p, s in zip(run, zeros):
                out[p] = drafted[s]
        if i < len(decode):
            out[i] = drafted[j]
        prev_i, prev_j = i, j
    return out


def response_problem(passes: Sequence[int], rec: RequestRecord, k: int | None) -> str | None:
    """Why the chunks of ``rec`` are not its passes by its own counts; None when they hold."""
    from_chunks = sum(t - 1 for t in passes)
    own = rec.spec_accepted or 0
    k_here = rec.spec_k if rec.spec_k is not None else k
    if own < from_chunks:
        return (f"its chunks show {from_chunks} accepted draft tokens, its own count {own}: a chunk carried "
                "several engine steps")
    if k_here is not None and own - from_chunks > k_here:
        return (f"its own count says {own} accepted draft tokens, its chunks {from_chunks}: more than one pass's "
                f"draft (k = {k_here}) apart")
    multi = sum(1 for t in passes if t > 1)
    if rec.spec_steps is not None and multi > rec.spec_steps:
        return (f"{multi} of its chunks carry several tokens, but it says only {rec.spec_steps} passes had a "
                "draft")
    if rec.spec_step_accepted is not None and rec.spec_step_drafted is not None:
        if align(passes[1:], rec.spec_step_accepted, rec.spec_step_drafted) is None:
            return "its chunks do not line up with the passes it lists (per_step_accepted)"
    return None


def one_answer(index: int, rec: RequestRecord, k: int | None) -> tuple[RequestPasses | None, str]:
    """The answer's passes from itself alone (chunks+response or response), or the chunks still to
    be checked against the counters (source ``chunks``); (None, why) where it has neither."""
    passes, why = chunk_passes(rec)
    base = dict(index=index, prompt_id=rec.prompt_id, category=rec.category, repeat=rec.repeat,
                concurrency=rec.concurrency, request_rate=rec.request_rate, output_tokens=rec.output_tokens)
    if rec.spec_accepted is not None:
        problem = response_problem(passes, rec, k) if passes is not None else why
        own = dict(accepted=rec.spec_accepted, drafted=rec.spec_drafted, spec_steps=rec.spec_steps)
        if passes is not None and problem is None:
            drafted = None
            if rec.spec_step_accepted is not None and rec.spec_step_drafted is not None:
                drafted = [0, *(align(passes[1:], rec.spec_step_accepted, rec.spec_step_drafted) or [])]
            return RequestPasses(**base, source="chunks+response", passes=passes, drafted_per_pass=drafted,
                                 **own), ""
        return RequestPasses(**base, source="response", **own), problem or ""
    if passes is None:
        return None, why
    return RequestPasses(**base, source="chunks", passes=passes, accepted=sum(t - 1 for t in passes)), ""


# ----------------------------------------------------------------------------- the counters

def _delta(pair: CounterPair | None, name: str) -> float | None:
    if pair is None or not (pair.before.has_spec_counters and pair.after.has_spec_counters):
        return None
    d = getattr(pair.after, name) - getattr(pair.before, name)
    return d if d >= 0 else None


def _fmt(x: float) -> str:
    return f"{x:g}"


def check_counts(group: Group, answers: Sequence[RequestPasses]) -> CounterCheck | None:
    """The answers' own counts against the counter deltas of the group; None without counters, or where
    an answer failed or gave no count of its own (the sums would then miss engine steps)."""
    accepted_c, drafted_c = _delta(group.counters, "accepted_tokens"), _delta(group.counters, "draft_tokens")
    steps_c = _delta(group.counters, "drafts")
    if accepted_c is None or drafted_c is None or group.uncounted:
        return None
    if len(answers) != len(group.records) or any(a.source not in ("chunks+response", "response") for a in answers):
        return None
    accepted = sum(a.accepted for a in answers)
    drafted = None if any(a.drafted is None for a in answers) else sum(a.drafted or 0 for a in answers)
    steps = None if any(a.spec_steps is None for a in answers) else sum(a.spec_steps or 0 for a in answers)
    agree = (accepted == accepted_c and (drafted is None or drafted == drafted_c)
             and (steps is None or steps_c is None or steps == steps_c))
    mine = f"{accepted} accepted" if drafted is None else f"{drafted} drafted, {accepted} accepted"
    if agree:
        text = (f"{group.label}: the {len(answers)} answers' own counts add up to the server's counters "
                f"({mine})")
    else:
        parts = [mine]
        counted = [f"{_fmt(drafted_c)} drafted, {_fmt(accepted_c)} accepted"]
        if steps is not None and steps_c is not None:
            parts.append(f"{steps} passes with a draft")
            counted.append(f"{_fmt(steps_c)} passes with a draft")
        text = (f"{group.label}: the server's per-request counts and its counters disagree: the {len(answers)} "
                f"answers say {', '.join(parts)}; the counters over the same requests {', '.join(counted)}")
    return CounterCheck(level=group.label, requests=len(answers), accepted_requests=accepted,
                        accepted_counters=accepted_c, drafted_requests=drafted, drafted_counters=drafted_c,
                        agree=agree, text=text)


def check_chunks(group: Group, answers: Sequence[RequestPasses], k: int | None) -> tuple[CounterCheck | None, str]:
    """Whether the chunks of a group's answers are its passes: (the check, "") or (None or the failed
    check, why not)."""
    if not group.serial:
        return None, (f"{group.label}: several requests were in flight, so a chunk can carry several engine "
                      "steps, and no answer gave its own counts to check them")
    if len(answers) != len(group.records):
        return None, f"{group.label}: {len(group.records) - len(answers)} answers have no exact chunks (failed or " \
                     "counted by guess), so the counters cannot check the rest"
    if group.uncounted:
        return None, f"{group.label}: {group.uncounted}"
    accepted_c = _delta(group.counters, "accepted_tokens")
    if accepted_c is None:
        return None, (f"{group.label}: the server gives no spec-decode counters to check the chunks against, and no "
                      "answer gave its own counts")
    from_chunks = sum(a.accepted for a in answers)
    k_here = k if k is not None else max((t - 1 for a in answers for t in a.passes or []), default=0)
    holds = 0 <= accepted_c - from_chunks <= k_here * len(answers)
    text = (f"{group.label}: {from_chunks} accepted draft tokens by the chunks, {_fmt(accepted_c)} by the server's "
            f"counters over the same {len(answers)} requests")
    check = CounterCheck(level=group.label, requests=len(answers), accepted_requests=from_chunks,
                         accepted_counters=accepted_c, agree=holds,
                         text=text + ("" if holds else ": the chunks are not one engine step each"))
    return check, "" if holds else check.text


# ----------------------------------------------------------------------------- figures

def _pct(values: list[float]) -> dict[str, float]:
    values = sorted(values)
    return {f"p{q}": percentile(values, q) for q in (10, 50, 90)} if values else {}


def figures(name: str, answers: Sequence[RequestPasses]) -> PassFigures:
    """The figures of a group of answers (module docstring)."""
    with_passes = [a for a in answers if a.passes]
    known_drafted = all(a.drafted is not None for a in answers)
    drafted = sum(a.drafted or 0 for a in answers) if known_drafted else None
    accepted = sum(a.accepted for a in answers)
    passes = sum(len(a.passes or []) for a in with_passes) if with_passes else None
    passes_tokens = sum(a.output_tokens for a in with_passes) if with_passes else None
    hist: list[int] = []
    for a in with_passes:
        for t in a.passes or []:
            if t > len(hist):
                hist += [0] * (t - len(hist))
            hist[t - 1] += 1
    return PassFigures(
        name=name, requests=len(answers), output_tokens=sum(a.output_tokens for a in answers), accepted=accepted,
        drafted=drafted, passes=passes, passes_tokens=passes_tokens,
        acceptance_rate=accepted / drafted if drafted else None,
        tokens_per_pass=passes_tokens / passes if passes else None,
        tokens_per_pass_pct=_pct([a.tokens_per_pass for a in with_passes if a.tokens_per_pass is not None]),
        acceptance_rate_pct=_pct([a.acceptance_rate for a in answers if a.acceptance_rate is not None]),
        tokens_histogram=hist)


def bin_width(longest: int, bins: int = 16) -> int:
    """A power of two, at least 4, that cuts ``longest`` positions into at most ``bins`` bins."""
    width = 4
    while width * bins < longest:
        width *= 2
    return width


def positions(answers: Sequence[RequestPasses]) -> list[PositionBin]:
    """Acceptance by position in the answer over the answers whose passes are known."""
    with_passes = [a for a in answers if a.passes]
    longest = max((sum(a.passes or []) for a in with_passes), default=0)
    if not longest:
        return []
    width = bin_width(longest)
    bins = [PositionBin(start=s, end=min(s + width, longest), tokens=0, from_draft=0)
            for s in range(0, longest, width)]
    for a in with_passes:
        pos = 0
        for t in a.passes or []:
            for i in range(t):
                b = bins[pos // width]
                b.tokens += 1
                b.from_draft += i < t - 1
                pos += 1
    return bins


def chosen(answers: Sequence[RequestPasses], show: int) -> list[int]:
    """Indices (into ``answers``) of up to ``show`` answers with passes to draw, one per prompt: the
    most tokens per pass first, then alternately the fewest, so a reader sees both ends."""
    best: dict[str, int] = {}
    for i, a in enumerate(answers):
        if a.passes and (a.prompt_id not in best or
                         (a.tokens_per_pass or 0) > (answers[best[a.prompt_id]].tokens_per_pass or 0)):
            best[a.prompt_id] = i
    ranked = sorted(best.values(), key=lambda i: (-(answers[i].tokens_per_pass or 0), answers[i].index))
    out: list[int] = []
    lo, hi = 0, len(ranked) - 1
    while len(out) < min(show, len(ranked)):
        if len(out) % 2 == 0:
            out.append(ranked[lo])
            lo += 1
        else:
            out.append(ranked[hi])
            hi -= 1
    return out


# ----------------------------------------------------------------------------- the whole side

def seen(groups: Sequence[Group], k: int | None = None, show: int = 0, refuse: str | None = None) -> SpeculationSeen:
    """Speculation per request and per pass over ``groups`` (module docstring). ``refuse``: a reason,
    known to the caller, why no chunk is one engine step (a spec-off side whose chunks carry several
    tokens): no answer's chunks are its passes then, and where its chunks contradict its own counts
    that is the reason, not a finding; the answers' own counts still hold (source ``response``)."""
    answers: list[RequestPasses] = []
    checks: list[CounterCheck] = []
    findings: list[str] = []
    refused: list[str] = []
    unread = False  # an answer's chunks set aside for ``refuse``
    for group in groups:
        mine: list[RequestPasses] = []
        why_not: list[str] = []
        contradicted: list[str] = []
        for index, rec in group.records:
            if not rec.ok and rec.spec_accepted is None:
                continue
            a, problem = one_answer(index, rec, k)
            if a is not None and refuse and a.source == "chunks":
                a, problem = None, refuse
            elif a is not None and refuse and a.source == "chunks+response":
                a, unread = a.model_copy(update={"source": "response", "passes": None, "drafted_per_pass": None}), True
            if a is None:
                why_not.append(problem)
                continue
            if a.source == "response" and problem and not refuse and rec.chunk_tokens and rec.token_source in EXACT:
                contradicted.append(f"{rec.prompt_id} ({group.label}): {problem}")
            mine.append(a)
        if contradicted:  # one finding per level: a server that merges its chunks does so in every answer
            findings.append(_first(contradicted))
        own = [a for a in mine if a.source != "chunks"]
        by_chunks = [a for a in mine if a.source == "chunks"]
        if own and not by_chunks:
            check = check_counts(group, own)
            if check is not None:
                checks.append(check)
                if not check.agree:
                    findings.append(check.text)
        if by_chunks:
            if own:  # some answers gave counts, others not: the chunks alone cannot be checked
                refused.append(f"{group.label}: only some answers gave their own counts")
            else:
                check, why = check_chunks(group, by_chunks, k)
                if check is not None:
                    checks.append(check)
                if why:
                    refused.append(why)
                else:
                    answers += by_chunks
        answers += own
        if why_not and not mine:
            refused.append(f"{group.label}: {_first(why_not)}")
    answers.sort(key=lambda a: a.index)
    if not answers:
        reason = "; ".join(dict.fromkeys(refused)) or "no answer to read"
        return SpeculationSeen(available=False, source_note=NOT_AVAILABLE + reason, k=k, checks=checks,
                               findings=findings)
    sources = {a.source for a in answers}
    best_first = [s for s in SOURCE_TEXT if s in sources]  # a tie goes to the source that tells the most
    source: PassSource = max(best_first, key=lambda s: sum(1 for a in answers if a.source == s))
    note = _source_note(answers, sources, checks, refused)
    if unread:
        note += f"; no chunk read as a pass: {refuse}"
    by_prompt: dict[str, list[RequestPasses]] = {}
    by_cat: dict[str, list[RequestPasses]] = {}
    for a in answers:
        by_prompt.setdefault(a.prompt_id, []).append(a)
        by_cat.setdefault(a.category, []).append(a)
    return SpeculationSeen(
        available=True, source=source, source_note=note, k=k, requests=answers,
        overall=figures("all", answers), prompts=[figures(p, v) for p, v in by_prompt.items()],
        categories=[figures(c, v) for c, v in sorted(by_cat.items())], positions=positions(answers),
        checks=checks, findings=findings, shown=chosen(answers, show))


def _first(reasons: list[str]) -> str:
    more = len(reasons) - 1
    return reasons[0] + (f" ({more} more answers alike)" if more else "")


SOURCE_TEXT: dict[PassSource, str] = {  # the sources, best first
    "chunks+response": "the streamed chunks (one engine step each), checked against each answer's own counts",
    "chunks": "the streamed chunks (one engine step each), checked against the server's counters",
    "response": "each answer's own drafted and accepted counts (no pass order)",
}


def _source_note(answers: Sequence[RequestPasses], sources: set[str], checks: Sequence[CounterCheck],
                 refused: Sequence[str]) -> str:
    parts = [f"{SOURCE_TEXT[s]}: {sum(1 for a in answers if a.source == s)} answers" for s in sorted(sources)]
    text = "; ".join(parts)
    agreed = [c for c in checks if c.agree]
    if agreed:
        text += f"; sums checked against the counters at {len(agreed)} of {len(checks)} levels"
    if refused:
        text += "; not available at " + "; ".join(dict.fromkeys(refused))
    return text


def first_answer(seen: SpeculationSeen, prompt_id: str) -> RequestPasses | None:
    """The first answer of ``prompt_id`` whose passes are known, else its first answer; None: none read."""
    mine = [a for a in seen.requests if a.prompt_id == prompt_id]
    return next((a for a in mine if a.passes), mine[0] if mine else None)


def drawn(seen: SpeculationSeen, prompt_ids: Sequence[str] = ()) -> list[RequestPasses]:
    """The answers a report draws pass by pass: those ``seen.shown`` names, then the first answer of
    each of ``prompt_ids`` (the demo's), each once."""
    out = [seen.requests[i] for i in seen.shown if 0 <= i < len(seen.requests)]
    for pid in prompt_ids:
        a = first_answer(seen, pid)
        if a is not None and a not in out:
            out.append(a)
    return out


def tokens_in_passes(a: RequestPasses) -> str:
    """'N tokens in M passes of the target' (the caption of a drawn answer)."""
    if not a.passes:
        return f"{a.output_tokens} tokens"
    return f"{sum(a.passes)} tokens in {len(a.passes)} passes of the target"


def percent(x: float | None) -> str:
    return "-" if x is None or math.isnan(x) else f"{100 * x:.0f}%"


# ----------------------------------------------------------------------------- probe and compare

def merged_off(records: Sequence[RequestRecord]) -> str | None:
    """Why no chunk of a run is one engine step, seen on the spec-off side: its exact chunks carry
    several tokens (a stream interval above 1, or chunks merged on the way); None when they do not."""
    merged = [r for r in records if r.ok and r.token_source in EXACT and any(n > 1 for n in r.chunk_tokens)]
    if not merged:
        return None
    return (f"{len(merged)} spec-off answer(s) streamed chunks of several tokens (a stream interval above 1, or "
            "chunks merged on the way), so a chunk is not one engine step")


def compare_speculation(report: CompareReport) -> SpeculationSeen | None:
    """The spec-on side of a compare report, one group per level (its counter window); None when the
    report has no spec-on answer. Where one server is both sides, its counters over a level count
    both sides' requests, so they check neither: its chunks alone are refused, its answers' own
    counts stand unchecked (and its other side says nothing of how a spec-off server streams)."""
    indexed = [(i, r) for i, r in enumerate(report.requests) if r.side == "on" and not r.warmup]
    if not indexed:
        return None
    groups: dict[tuple[int, float | None], Group] = {}
    for i, r in indexed:
        key = (r.concurrency, r.request_rate)
        if key not in groups:
            if r.request_rate is None:
                groups[key] = Group(f"concurrency {r.concurrency}", counters=report.counters_on.get(r.concurrency),
                                    serial=r.concurrency == 1)
            else:
                groups[key] = Group(f"request rate {rate_label(r.request_rate)}/s", serial=False,
                                    counters=report.counters_on_rate.get(rate_label(r.request_rate)))
        groups[key].records.append((i, r))
    off = [r for r in report.requests if r.side == "off" and not r.warmup]
    url = report.on_server.base_url
    one_server = url == report.off_server.base_url  # then the other side is no spec-off server to learn from
    if one_server:
        for g in groups.values():
            g.uncounted = f"the spec-on and spec-off sides are one server ({url}), whose counters count both sides"
    return seen(list(groups.values()), k=report.on_server.num_speculative_tokens, show=report.settings.show,
                refuse=None if one_server else merged_off(off))


def probe_speculation(report: ProbeReport) -> SpeculationSeen | None:
    """The answers of a probe run, one group (the run's counter window); None for a server that says
    speculation is off."""
    if report.server.spec_enabled is False:
        return None
    indexed = [(i, r) for i, r in enumerate(report.requests) if not r.warmup]
    if not indexed:
        return None
    s = report.settings
    rates = s.load.request_rates if s.load else []
    scale = report.scale  # several workers, or merged runs from several clients, send at the same time
    serial = s.concurrency == 1 and not rates and (scale is None or (len(scale.workers) <= 1
                                                                     and scale.executor != "merged"))
    group = Group("the run", indexed, CounterPair(before=report.counters_before, after=report.counters_after),
                  serial=serial)
    return seen([group], k=report.server.num_speculative_tokens, show=s.show)

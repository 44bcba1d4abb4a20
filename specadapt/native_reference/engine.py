"""The speculative decoding loop over a batch: propose -> verify in one target pass -> accept.

One ``SpecEngine.step`` is the algorithm, one rung per line:

1. draft: the proposer drafts up to k tokens per row (``_draft``);
2. verify: one target pass scores every row's last token and drafts (``_target_pass``);
3. accept: per row, greedy keeps the longest prefix of the drafts equal to the target's
   argmax, sampling runs modified rejection sampling against the draft's q
   (``_verify``: ``_process`` -> ``greedy_verify`` | ``_probs`` -> ``_rejection_sample``);
4. emit: the accepted drafts plus the target's own next token (the replacement after a
   rejection, or the bonus after a full acceptance), cut at the length limit, a stop
   token and a stop string (``_emit``: ``_chunk`` -> ``_cut_at_length`` -> ``_cut_at_stop``),
   with their raw target logprobs when asked (``_logprobs``).

Sequences join the batch (each prefilled alone, which gives its first token through the
same accept and emit rungs) and leave it between steps; every step verifies every row's
proposal in one target pass, each row with its own sampling parameters, random generator
and number of accepted tokens (see docs/reference.md, "Batching"). The number of draft
tokens may depend on the batch size (a schedule in vLLM's
``num_speculative_tokens_per_batch_size`` form). With no proposer (or k = 0) the same
loop is plain target-only decoding, one token per pass per row, which is what
speculative outputs are compared against.

Planted bugs for testing the tools that judge servers live in
``specadapt.native_reference.faults``: each is a subclass that overrides the rung it
breaks; this module holds the healthy algorithm only.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import torch

from specadapt.errors import UsageError
from specadapt.native_reference.models import SlotCache
from specadapt.native_reference.proposers import Proposal, Proposer
from specadapt.native_reference.sampling import (
    SamplingParams,
    greedy_verify,
    probs,
    process_logits,
    rejection_verify,
)
from specadapt.native_reference.stops import StopStrings
from specadapt.records.schedule import k_for_batch, schedule_problems


@dataclass
class SpecStats:
    """Counters of one or more generations (vLLM's spec-decode counters plus timings)."""

    k: int = 0
    prompt_tokens: int = 0
    generated_tokens: int = 0
    target_forwards: int = 0
    draft_forwards: int = 0
    num_drafts: int = 0  # verify passes that checked at least one proposed token
    draft_tokens: int = 0
    accepted_tokens: int = 0
    proposed_per_pos: list[int] = field(default_factory=list)
    accepted_per_pos: list[int] = field(default_factory=list)
    time_prefill: float = 0.0
    time_draft: float = 0.0
    time_verify: float = 0.0
    time_other: float = 0.0

    def __post_init__(self) -> None:
        self.proposed_per_pos = self.proposed_per_pos or [0] * self.k
        self.accepted_per_pos = self.accepted_per_pos or [0] * self.k

    @property
    def acceptance_rate(self) -> float:
        """Formula: accepted_tokens / draft_tokens."""
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else 0.0

    @property
    def mean_acceptance_length(self) -> float:
        """Formula: 1 + accepted_tokens / num_drafts (vLLM's definition; tokens per verify)."""
        return 1.0 + self.accepted_tokens / self.num_drafts if self.num_drafts else 1.0

    @property
    def time_total(self) -> float:
        return self.time_prefill + self.time_draft + self.time_verify + self.time_other

    def add(self, other: SpecStats) -> None:
        for name in ("prompt_tokens", "generated_tokens", "target_forwards", "draft_forwards",
                     "num_drafts", "draft_tokens", "accepted_tokens", "time_prefill",
                     "time_draft", "time_verify", "time_other"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        width = max(len(self.proposed_per_pos), len(other.proposed_per_pos))
        pad = lambda xs: xs + [0] * (width - len(xs))  # noqa: E731
        self.proposed_per_pos = [a + b for a, b in zip(pad(self.proposed_per_pos), pad(other.proposed_per_pos))]
        self.accepted_per_pos = [a + b for a, b in zip(pad(self.accepted_per_pos), pad(other.accepted_per_pos))]
        self.k = max(self.k, other.k)

    def as_dict(self) -> dict:
        d = {name: getattr(self, name) for name in self.__dataclass_fields__}
        d.update(acceptance_rate=self.acceptance_rate, mean_acceptance_length=self.mean_acceptance_length,
                 time_total=self.time_total)
        return d


@dataclass
class Step:
    """What one target pass produced for one row."""

    position: int  # sequence position of tokens[0]
    proposed: list[int]
    accepted: int
    tokens: list[int]  # emitted (after stop/length truncation)
    logprobs: list[float]  # raw target logprob of each emitted token; empty if not asked
    top_logprobs: list[list[tuple[int, float]]]  # per token, best first; empty if not asked
    finish_reason: str | None = None  # "stop" or "length" on the row's last step
    # vLLM's stop_reason on a "stop" step: the stop string, the stop token id, or None (EOS)
    stop_reason: int | str | None = None
    text: str | None = None  # with stop strings: the row's whole output text after this step
    # on a row's first Step only, when asked: None, then one entry per prompt token (prompt_logprobs_of)
    prompt_logprobs: list[list[tuple[int, float, int]] | None] | None = None


@dataclass
class Generation:
    prompt: list[int]
    tokens: list[int]
    steps: list[Step]
    stats: SpecStats
    finish_reason: str  # "stop" or "length"
    stop_reason: int | str | None = None
    text: str | None = None  # with stop strings: the output text, cut at the stop string


@dataclass
class Row:
    """One sequence in the batch."""

    prompt: list[int]
    max_new_tokens: int
    params: SamplingParams
    stop_ids: tuple[int, ...]
    logprobs: bool
    top_logprobs: int
    generator: torch.Generator
    seed: int  # the seed of ``generator``
    stats: SpecStats
    tag: object = None  # the caller's handle (the server's request)
    tokens: list[int] = field(default_factory=list)  # prompt + generated
    finish_reason: str | None = None
    stop_token_ids: tuple[int, ...] = ()  # the request's: they stop like EOS, stop_reason = the id
    stops: StopStrings | None = None  # the request's stop strings (and its output text)
    stop_reason: int | str | None = None

    @property
    def output(self) -> list[int]:
        return self.tokens[len(self.prompt):]

    @property
    def all_stop_ids(self) -> set[int]:
        """EOS ids and stop token ids: what min_tokens masks and what ends the row."""
        return set(self.stop_ids) | set(self.stop_token_ids)

    def process(self, logits: torch.Tensor, drafts: Sequence[int] = ()) -> torch.Tensor:
        """The row's logits ``[S, V]`` after min_tokens, logit_bias and penalties, row i
        after ``drafts[:i]`` (see sampling.process_logits); raw (float64) if none apply."""
        return process_logits(logits, self.params, self.prompt, self.output, drafts, self.all_stop_ids)

    @property
    def generated(self) -> int:
        return len(self.tokens) - len(self.prompt)


def parse_schedule(schedule: Iterable[Sequence[int]] | None, k: int) -> list[tuple[int, int, int]]:
    """Check a vLLM-style ``num_speculative_tokens_per_batch_size`` schedule (vLLM's rules,
    see specadapt.records.schedule); None or empty: no schedule (k at every batch size)."""
    if not schedule:
        return []
    schedule = [list(e) if isinstance(e, (list, tuple)) else e for e in schedule]
    problems = schedule_problems(schedule, k)
    if problems:
        raise UsageError(problems[0])
    return sorted(tuple(e) for e in schedule)


class SpecEngine:
    """Speculative decoding of a batch of sequences with a target and a proposer."""

    def __init__(self, target, proposer: Proposer | None = None, k: int = 4, seed: int = 0,
                 schedule: Iterable[Sequence[int]] | None = None, max_model_len: int | None = None):
        if proposer is None:
            k = 0
        if k < 0:
            raise UsageError(f"k must be >= 0, not {k}")
        self.model = target
        self.target = SlotCache(target)
        self.proposer = proposer
        self.k = k
        self.schedule = parse_schedule(schedule, k)
        cfg_len = getattr(target.config, "max_position_embeddings", None)
        self.max_model_len = int(max_model_len or cfg_len or 2 ** 31)
        self.device = self.target.device
        self.generator = torch.Generator(device="cpu").manual_seed(seed)  # seeds of rows without one
        self.rows: list[Row] = []
        self.totals = SpecStats(k=k)  # every pass counted once, whatever the batch size

    def seed(self, seed: int) -> None:
        self.generator.manual_seed(seed)

    def k_for(self, batch_size: int) -> int:
        """Draft tokens per row at this batch size (the schedule as vLLM reads it, else k)."""
        return k_for_batch(self.schedule, batch_size, self.k)

    # -- one sequence at a time (a batch of one) -------------------------------------------

    def generate(self, prompt: list[int], max_new_tokens: int, params: SamplingParams = SamplingParams(),
                 stop_ids: tuple[int, ...] = (), top_logprobs: int = 0, seed: int | None = None,
                 stop_token_ids: tuple[int, ...] = (), stops: StopStrings | None = None) -> Generation:
        return self.generate_batch([prompt], max_new_tokens, params, stop_ids, top_logprobs,
                                   seeds=None if seed is None else [seed], stop_token_ids=stop_token_ids,
                                   stops=None if stops is None else [stops])[0]

    def generate_batch(self, prompts: list[list[int]], max_new_tokens: int,
                       params: SamplingParams | Sequence[SamplingParams] = SamplingParams(),
                       stop_ids: tuple[int, ...] = (), top_logprobs: int = 0,
                       seeds: Sequence[int] | None = None, stop_token_ids: tuple[int, ...] = (),
                       stops: Sequence[StopStrings | None] | None = None) -> list[Generation]:
        """Decode ``prompts`` together in one batch until every row has finished
        (``stops``: one StopStrings, or None, per prompt)."""
        for prompt in prompts:
            _check_prompt(prompt)
        self._idle()
        plist = list(params) if isinstance(params, (list, tuple)) else [params] * len(prompts)
        steps: dict[int, list[Step]] = {}
        rows = []
        try:
            for i, prompt in enumerate(prompts):
                row, first = self.add(prompt, max_new_tokens, plist[i], stop_ids, top_logprobs=top_logprobs,
                                      seed=None if seeds is None else seeds[i], tag=i,
                                      stop_token_ids=stop_token_ids, stops=None if stops is None else stops[i])
                rows.append(row)
                steps[i] = [first]
            while self.rows:
                for row, step in self.step():
                    steps[row.tag].append(step)
        finally:
            for row in rows:
                self.remove(row)
        return [Generation(list(r.prompt), r.output, steps[i], r.stats, r.finish_reason or "length",
                           r.stop_reason, None if r.stops is None else r.stops.text)
                for i, r in enumerate(rows)]

    def _idle(self) -> None:
        if self.rows:
            raise UsageError("the engine is serving a batch already: add rows to it with add() and step()")

    # -- the batch ---------------------------------------------------------------------------

    def add(self, prompt: list[int], max_new_tokens: int, params: SamplingParams = SamplingParams(),
            stop_ids: tuple[int, ...] = (), logprobs: bool = False, top_logprobs: int = 0,
            seed: int | None = None, stats: SpecStats | None = None, tag: object = None,
            prompt_logprobs: int | None = None, stop_token_ids: tuple[int, ...] = (),
            stops: StopStrings | None = None) -> tuple[Row, Step]:
        """Prefill ``prompt`` (alone) and join the batch; returns the row and its first Step.
        A row that is finished after its first token (stop or length) does not join.

        ``stop_ids``: EOS ids (finish "stop", stop_reason None); ``stop_token_ids``: the
        request's stop token ids (finish "stop", stop_reason the id); both are kept in the
        output tokens, as vLLM keeps them. ``stops``: the request's stop strings, checked
        on the text after every step (the row leaves at a match).

        ``prompt_logprobs`` K (None: not asked; -1: the whole vocabulary): the first Step
        also carries the target's log-probabilities over the prompt, from the same prefill
        pass (see ``prompt_logprobs_of``)."""
        _check_prompt(prompt)
        if seed is None:
            seed = int(torch.randint(2 ** 62, (1,), generator=self.generator))
        gen = torch.Generator(device=self.device).manual_seed(int(seed))
        row = Row(list(prompt), max_new_tokens, params, tuple(stop_ids), logprobs or top_logprobs > 0,
                  top_logprobs, gen, int(seed), stats if stats is not None else SpecStats(k=self.k), tag, list(prompt),
                  stop_token_ids=tuple(stop_token_ids), stops=stops)
        t0 = time.perf_counter()
        if prompt_logprobs is None:
            logits = self.target.add(row.tokens)  # [1, V]
        else:
            every = self.target.add(row.tokens, keep=len(row.tokens))  # [n, V]
            plp = prompt_logprobs_of(every[:-1], row.tokens[1:], prompt_logprobs)
            logits = every[-1:]
        m, nxt = self._verify(row, logits, Proposal(), gen)
        step = self._emit(row, Proposal(), logits, m, nxt)
        if prompt_logprobs is not None:
            step.prompt_logprobs = [None] + plp
        for st in (row.stats, self.totals):
            st.prompt_tokens += len(prompt)
            st.target_forwards += 1
        if row.finish_reason is None:
            self.rows.append(row)
            if self.proposer is not None:
                self.proposer.add(row.prompt)
        else:
            self.target.keep_rows(list(range(len(self.rows))))
        elapsed = time.perf_counter() - t0
        row.stats.time_prefill += elapsed
        self.totals.time_prefill += elapsed
        return row, step

    def remove(self, row: Row) -> None:
        """Take ``row`` out of the batch (finished or cancelled); a no-op if it is not in it."""
        if any(r is row for r in self.rows):
            self._keep([i for i, r in enumerate(self.rows) if r is not row])

    def _keep(self, keep: list[int]) -> None:
        if len(keep) == len(self.rows):
            return
        self.rows = [self.rows[i] for i in keep]
        self.target.keep_rows(keep)
        if self.proposer is not None:
            self.proposer.keep_rows(keep)

    def step(self) -> list[tuple[Row, Step]]:
        """One target pass over every row: draft, verify, accept, emit. Finished rows leave."""
        if not self.rows:
            return []
        rows = self.rows
        t0 = time.perf_counter()
        proposals, draft_forwards = self._draft(rows)  # up to k draft tokens per row
        t1 = time.perf_counter()
        logits = self._target_pass(rows, proposals)  # [B, N, V]: every row's drafts in one pass
        t2 = time.perf_counter()
        out: list[tuple[Row, Step]] = []
        for b, (row, prop) in enumerate(zip(rows, proposals)):
            lg = logits[b, :len(prop.tokens) + 1]  # [len(draft)+1, V]
            m, nxt = self._verify(row, lg, prop, row.generator)  # accepted prefix, the target's next token
            out.append((row, self._emit(row, prop, lg, m, nxt)))  # drafts[:m] + [nxt]
            # keep the cache entries of every emitted token but the last (fed next step)
            self.target.truncate(b, len(row.tokens) - 1)
        t3 = time.perf_counter()
        for st in [r.stats for r in rows] + [self.totals]:
            st.target_forwards += 1
            st.draft_forwards += draft_forwards
            st.time_draft += t1 - t0
            st.time_verify += t2 - t1
            st.time_other += t3 - t2
        self._keep([i for i, r in enumerate(rows) if r.finish_reason is None])
        self.target.trim()
        return out

    def _draft(self, rows: list[Row]) -> tuple[list[Proposal], int]:
        """Each row's proposal (at most k tokens, never past the model length: positions >=
        max_model_len do not exist) and the number of draft forward passes it took."""
        k = self.k_for(len(rows))
        ks = [max(0, min(k, self.max_model_len - len(r.tokens))) for r in rows]
        if self.proposer is None or not any(ks):
            return [Proposal() for _ in rows], 0
        before = self.proposer.forwards
        process = [_draft_process(r) for r in rows]
        extra = {"process": process} if any(process) else {}  # proposers without it serve plain requests
        proposals = self.proposer.propose([r.tokens for r in rows], ks, [r.params for r in rows],
                                          [r.generator for r in rows], **extra)
        return proposals, self.proposer.forwards - before

    def _target_pass(self, rows: list[Row], proposals: list[Proposal]) -> torch.Tensor:
        """The target's logits ``[B, N, V]`` over each row's last token and its drafts, in
        one forward pass (the cache holds every position but the last of each row)."""
        return self.target.forward([r.tokens[-1:] + p.tokens for r, p in zip(rows, proposals)])

    def _verify(self, row: Row, logits: torch.Tensor, proposal: Proposal,
                generator: torch.Generator) -> tuple[int, int]:
        """Accepted drafts and the next token, from the row's processed logits (every
        position processed with the output as it stands before it): the agreeing prefix
        under greedy, modified rejection sampling otherwise."""
        x = self._process(row, logits, proposal.tokens)  # [len(draft)+1, V] float64
        if row.params.greedy:
            return greedy_verify(x, proposal.tokens)
        return self._rejection_sample(self._probs(row, x), proposal, generator)

    def _process(self, row: Row, logits: torch.Tensor, draft: list[int]) -> torch.Tensor:
        """min_tokens, logit_bias and penalties at every verified position (Row.process)."""
        return row.process(logits, draft)

    def _probs(self, row: Row, x: torch.Tensor) -> torch.Tensor:
        """The target's distributions p: temperature, then min-p, top-k and top-p."""
        return probs(x, row.params)

    def _rejection_sample(self, p: torch.Tensor, proposal: Proposal,
                          generator: torch.Generator) -> tuple[int, int]:
        """Modified rejection sampling of the drafts against p (q one-hot where None)."""
        return rejection_verify(p, proposal.q, proposal.tokens, generator)

    def _emit(self, row: Row, prop: Proposal, logits: torch.Tensor, m: int, nxt: int) -> Step:
        """Append what the row emits this pass: the accepted drafts and the next token, cut
        at the length limit, at a stop token and at a stop string, in that order (vLLM's
        scheduler cuts the first two, its output processor the last)."""
        draft = prop.tokens
        emitted = self._chunk(row, prop, m, nxt)
        emitted = self._cut_at_length(row, emitted)
        emitted, stop_reason = self._cut_at_stop(row, emitted)
        position = len(row.tokens)
        row.tokens.extend(emitted)
        lp, tops = self._logprobs(row, logits, emitted)
        if stop_reason is not None or (emitted and emitted[-1] in row.stop_ids):
            row.finish_reason, row.stop_reason = "stop", stop_reason
        elif row.generated >= row.max_new_tokens or len(row.tokens) >= self.max_model_len:
            row.finish_reason = "length"
        for st in (row.stats, self.totals):
            _count(st, len(draft), m)
            st.generated_tokens += len(emitted)
        return Step(position, list(draft), m, emitted, lp, tops, row.finish_reason, row.stop_reason,
                    None if row.stops is None else row.stops.text)

    def _chunk(self, row: Row, prop: Proposal, m: int, nxt: int) -> list[int]:
        """The accepted drafts, then the target's own next token."""
        return prop.tokens[:m] + [nxt]

    def _cut_at_length(self, row: Row, emitted: list[int]) -> list[int]:
        """``emitted`` cut at the row's max_tokens."""
        return emitted[:row.max_new_tokens - row.generated]

    def _cut_at_stop(self, row: Row, emitted: list[int]) -> tuple[list[int], int | str | None]:
        """``emitted`` cut after its first stop token and then at a stop string; the stop
        reason (the stop token id, or the stop string) or None (no stop, or EOS)."""
        stop_reason: int | str | None = None
        ends = row.all_stop_ids
        for i, t in enumerate(emitted):
            if t in ends:
                emitted = emitted[:i + 1]
                stop_reason = t if t in row.stop_token_ids and t not in row.stop_ids else None
                break
        if row.stops is not None and emitted:
            kept, matched = self._match_stop_string(row.stops, emitted, emitted[-1] in ends)
            if matched is not None:
                return emitted[:kept], matched
        return emitted, stop_reason

    def _match_stop_string(self, stops: StopStrings, emitted: list[int], terminated: bool
                           ) -> tuple[int, str | None]:
        """How many of ``emitted`` to keep, and the stop string they end at, if any
        (``terminated``: the last one is a stop token; see StopStrings.update)."""
        return stops.update(emitted, terminated)

    def _logprobs(self, row: Row, logits: torch.Tensor, emitted: list[int]
                  ) -> tuple[list[float], list[list[tuple[int, float]]]]:
        """Raw target logprobs of the emitted tokens (log_softmax of the unprocessed logits,
        vLLM's default) and the top ones; empty when not asked."""
        if not row.logprobs or not emitted:
            return [], []
        logp = self._emitted_logp(logits, len(emitted))  # [n, V]
        lp = logp.gather(-1, torch.tensor(emitted, device=logp.device)[:, None])[:, 0].tolist()
        tops: list[list[tuple[int, float]]] = []
        if row.top_logprobs > 0:
            vals, ids = torch.topk(logp, row.top_logprobs, dim=-1)
            tops = [list(zip(i.tolist(), v.tolist())) for i, v in zip(ids, vals)]
        return lp, tops

    def _emitted_logp(self, logits: torch.Tensor, n: int) -> torch.Tensor:
        """``[n, V]``: row j the target's raw log-probabilities at emitted token j's position."""
        return torch.log_softmax(logits[:n].to(torch.float64), dim=-1)


def _draft_process(row: Row):
    """The draft's logits processing for ``row``: the same as the target's, so q is built
    from the same processed logits as p and acceptance stays high."""
    if not row.params.processed:
        return None
    return lambda logits, drafted: process_logits(logits, row.params, row.prompt, row.output + list(drafted),
                                                  (), row.all_stop_ids)


def prompt_logprobs_of(logits: torch.Tensor, tokens: list[int], k: int,
                       chunk: int = 256) -> list[list[tuple[int, float, int]]]:
    """Per position, the target's raw log-probabilities (log_softmax of the logits, no
    temperature; float32, or the logits' dtype if wider) as vLLM's ``prompt_logprobs``.

    ``logits`` ``[n, V]``: row i predicts ``tokens[i]``. Entry i is a list of
    (token id, logprob, rank): first ``tokens[i]`` with its rank (the number of tokens
    whose logprob is >= its own, vLLM's count: 1 for the best token, ties counted
    against it), then the top ``k`` tokens, best first, ranks 1..k (``k`` = -1: the
    whole vocabulary; 0: the prompt token only). Computed ``chunk`` positions at a time,
    so a long prompt never holds two ``[n, V]`` copies."""
    if len(tokens) != logits.shape[0]:
        raise ValueError(f"{logits.shape[0]} rows of logits for {len(tokens)} tokens")
    vocab = logits.shape[-1]
    k = vocab if k == -1 else k
    if not 0 <= k <= vocab:
        raise ValueError(f"prompt logprobs k must be -1 or in 0..{vocab}, not {k}")
    ids = torch.tensor(tokens, dtype=torch.long, device=logits.device)
    dtype = torch.promote_types(logits.dtype, torch.float32)
    out: list[list[tuple[int, float, int]]] = []
    for start in range(0, len(tokens), chunk):
        logp = torch.log_softmax(logits[start:start + chunk].to(dtype), dim=-1)  # [c, V]
        own = logp.gather(-1, ids[start:start + chunk, None])  # [c, 1]
        ranks = (logp >= own).sum(-1).tolist()  # [c]
        if k:
            vals, top = torch.topk(logp, k, dim=-1)  # [c, k], best first
            tops = [list(zip(i, v)) for i, v in zip(top.tolist(), vals.tolist())]
        else:
            tops = [[] for _ in ranks]
        for tid, lp, rank, best in zip(tokens[start:start + chunk], own[:, 0].tolist(), ranks, tops):
            out.append([(tid, lp, rank)] + [(i, v, r) for r, (i, v) in enumerate(best, start=1)])
    return out


def _check_prompt(prompt) -> None:
    if not prompt:
        raise UsageError("the prompt is empty: give at least one token")
    if not all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        raise UsageError("a prompt is one list of token ids: for several sequences use generate_batch")


def _count(stats: SpecStats, proposed: int, accepted: int) -> None:
    if proposed == 0:
        return
    stats.num_drafts += 1
    stats.draft_tokens += proposed
    stats.accepted_tokens += accepted
    width = max(len(stats.proposed_per_pos), proposed)
    stats.proposed_per_pos += [0] * (width - len(stats.proposed_per_pos))
    stats.accepted_per_pos += [0] * (width - len(stats.accepted_per_pos))
    for i in range(proposed):
        stats.proposed_per_pos[i] += 1
    for i in range(accepted):
        stats.accepted_per_pos[i] += 1

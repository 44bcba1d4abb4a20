"""The speculative decoding loop: prefill -> propose -> verify in one target pass -> accept.

Batch size 1 only: each request is one sequence (see docs/reference.md for why). With
no proposer (or k = 0) the same loop is plain target-only decoding, one token per pass,
which is what speculative outputs are compared against.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Iterator

import torch

from specadapt.errors import UsageError
from specadapt.native_reference.models import CachedLM
from specadapt.native_reference.proposers import Proposal, Proposer
from specadapt.native_reference.sampling import (SamplingParams, greedy_verify, probs,
                                                 rejection_verify)

FAULTS = ("accept-always", "drop-bonus", "perturb-logits")


@dataclass(frozen=True)
class Fault:
    """A deliberate bug, for testing the tools that judge servers. Never on by default."""

    kind: str
    eps: float = 0.0

    @classmethod
    def parse(cls, text: str) -> "Fault":
        kind, _, value = text.partition("=")
        if kind not in FAULTS:
            raise UsageError(f"unknown fault {text!r}: use accept-always, drop-bonus or perturb-logits=EPS")
        if kind == "perturb-logits":
            try:
                eps = float(value)
            except ValueError:
                raise UsageError("perturb-logits needs a size: perturb-logits=EPS (e.g. 0.5)") from None
            return cls(kind, eps)
        if value:
            raise UsageError(f"fault {kind} takes no value")
        return cls(kind)


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

    def add(self, other: "SpecStats") -> None:
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
    """What one target pass produced."""

    position: int  # sequence position of tokens[0]
    proposed: list[int]
    accepted: int
    tokens: list[int]  # emitted (after stop/length truncation)
    logprobs: list[float]  # raw target logprob of each emitted token
    top_logprobs: list[list[tuple[int, float]]]  # per token, best first; empty if not asked


@dataclass
class Generation:
    prompt: list[int]
    tokens: list[int]
    steps: list[Step]
    stats: SpecStats
    finish_reason: str  # "stop" or "length"


class SpecEngine:
    """Speculative decoding of one sequence at a time with a target and a proposer."""

    def __init__(self, target, proposer: Proposer | None = None, k: int = 4,
                 fault: Fault | None = None, seed: int = 0):
        if proposer is None:
            k = 0
        if k < 0:
            raise UsageError(f"k must be >= 0, not {k}")
        self.target = CachedLM(target)
        self.proposer = proposer
        self.k = k
        self.fault = fault
        self.generator = torch.Generator(device=self.target.device).manual_seed(seed)
        self.noise = torch.Generator(device=self.target.device).manual_seed(seed + 1)

    def seed(self, seed: int) -> None:
        self.generator.manual_seed(seed)
        self.noise.manual_seed(seed + 1)

    def generate(self, prompt: list[int], max_new_tokens: int, params: SamplingParams = SamplingParams(),
                 stop_ids: tuple[int, ...] = (), top_logprobs: int = 0) -> Generation:
        stats = SpecStats(k=self.k)
        steps = list(self.stream(prompt, max_new_tokens, params, stop_ids, top_logprobs, stats))
        tokens = [t for s in steps for t in s.tokens]
        reason = "stop" if tokens and tokens[-1] in stop_ids else "length"
        return Generation(list(prompt), tokens, steps, stats, reason)

    def stream(self, prompt: list[int], max_new_tokens: int, params: SamplingParams = SamplingParams(),
               stop_ids: tuple[int, ...] = (), top_logprobs: int = 0,
               stats: SpecStats | None = None) -> Iterator[Step]:
        """Yield one Step per target pass; ``stats`` (if given) is updated as it goes."""
        if not prompt:
            raise UsageError("the prompt is empty: give at least one token")
        if not all(isinstance(t, int) for t in prompt):
            raise UsageError("the reference engine decodes one sequence at a time (batch size 1): "
                             "pass one list of token ids, and loop over a batch yourself")
        stats = stats if stats is not None else SpecStats(k=self.k)
        stats.prompt_tokens += len(prompt)
        tokens = list(prompt)
        self.target.reset()
        if self.proposer is not None:
            self.proposer.reset()
        generated = 0
        while generated < max_new_tokens:
            # the first pass is the prefill: the whole prompt, whose last row gives the first token
            step = self._step(tokens, params, top_logprobs, stats, prefill=self.target.length == 0)
            step.tokens = step.tokens[:max_new_tokens - generated]
            for i, t in enumerate(step.tokens):
                if t in stop_ids:
                    step.tokens = step.tokens[:i + 1]
                    break
            step.logprobs = step.logprobs[:len(step.tokens)]
            step.top_logprobs = step.top_logprobs[:len(step.tokens)]
            tokens.extend(step.tokens)
            generated += len(step.tokens)
            stats.generated_tokens += len(step.tokens)
            yield step
            if step.tokens and step.tokens[-1] in stop_ids:
                break

    def _step(self, tokens: list[int], params: SamplingParams, top_logprobs: int,
              stats: SpecStats, prefill: bool = False) -> Step:
        """One target pass: the prefill (no proposal), or [last token] + the proposed tokens."""
        t0 = time.perf_counter()
        proposal = Proposal()
        if self.proposer is not None and self.k > 0 and not prefill:
            before = self.proposer.forwards
            proposal = self.proposer.propose(tokens, self.k, params, self.generator)
            stats.draft_forwards += self.proposer.forwards - before
        t1 = time.perf_counter()
        draft = proposal.tokens
        # the cache holds every position but the last (none before the prefill)
        logits = self.target.forward(tokens[self.target.length:] + draft, keep=len(draft) + 1)  # [len(draft)+1, V]
        stats.target_forwards += 1
        if draft and self.fault and self.fault.kind == "perturb-logits":
            noise = torch.randn(logits.shape, generator=self.noise, dtype=torch.float32,
                                device=logits.device)
            logits = logits + (self.fault.eps * noise).to(logits.dtype)
        m, nxt = self._verify(logits, proposal, params)
        emitted = draft[:m] + [nxt]
        if self.fault and self.fault.kind == "drop-bonus" and draft and m == len(draft):
            emitted = list(draft)  # the target's extra token is thrown away
        # Keep the cache entries of every emitted token except the last (fed next step).
        self.target.rewind(len(tokens) - 1 + len(emitted))
        t2 = time.perf_counter()
        logp = torch.log_softmax(logits[:len(emitted)].to(torch.float64), dim=-1)  # [n, V]
        lp = logp.gather(-1, torch.tensor(emitted, device=logp.device)[:, None])[:, 0].tolist()
        tops: list[list[tuple[int, float]]] = []
        if top_logprobs > 0:
            vals, ids = torch.topk(logp, top_logprobs, dim=-1)
            tops = [list(zip(i.tolist(), v.tolist())) for i, v in zip(ids, vals)]
        self._count(stats, len(draft), m)
        if prefill:
            stats.time_prefill += time.perf_counter() - t0
        else:
            stats.time_draft += t1 - t0
            stats.time_verify += t2 - t1
            stats.time_other += time.perf_counter() - t2
        return Step(len(tokens), list(draft), m, emitted, lp, tops)

    def _verify(self, logits: torch.Tensor, proposal: Proposal, params: SamplingParams) -> tuple[int, int]:
        if self.fault and self.fault.kind == "accept-always":
            # the bug: no comparison with the target at all; next token from the last row
            row = logits[len(proposal.tokens):]  # [1, V]
            if params.greedy:
                return len(proposal.tokens), int(row.argmax(-1).item())
            return len(proposal.tokens), rejection_verify(probs(row, params), None, [], self.generator)[1]
        if params.greedy:
            return greedy_verify(logits, proposal.tokens)
        return rejection_verify(probs(logits, params), proposal.q, proposal.tokens, self.generator)

    @staticmethod
    def _count(stats: SpecStats, proposed: int, accepted: int) -> None:
        if proposed == 0:
            return
        stats.num_drafts += 1
        stats.draft_tokens += proposed
        stats.accepted_tokens += accepted
        for i in range(proposed):
            stats.proposed_per_pos[i] += 1
        for i in range(accepted):
            stats.accepted_per_pos[i] += 1

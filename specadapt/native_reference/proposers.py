"""Proposers: who guesses the next k tokens (a draft model, or n-gram prompt lookup).

The interface is one method, ``propose(tokens, k, params, generator) -> Proposal``: it
sees the whole sequence so far and returns up to k tokens, with the distributions they
were drawn from when there are any. A proposer keeps whatever state it likes between
calls (a draft model keeps a KV cache); an EAGLE-style head would fit the same method.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch

from specadapt.errors import UsageError
from specadapt.native_reference.models import CachedLM
from specadapt.native_reference.sampling import SamplingParams, probs, sample


@dataclass
class Proposal:
    tokens: list[int] = field(default_factory=list)
    q: torch.Tensor | None = None  # [len(tokens), V] draft distributions; None: deterministic


class Proposer(Protocol):
    name: str
    forwards: int  # model forward passes spent proposing (0 for n-gram)

    def reset(self) -> None: ...

    def propose(self, tokens: list[int], k: int, params: SamplingParams,
                generator: torch.Generator | None) -> Proposal: ...


class DraftModelProposer:
    """A smaller causal LM with the target's vocabulary, run autoregressively k times.

    Its cache is kept by position: before proposing it is rewound to the longest prefix
    it shares with the accepted sequence and fed the rest (one token normally, two when
    all k drafts were accepted: the last draft and the bonus token).
    """

    name = "draft_model"

    def __init__(self, model, min_confidence: float = 0.0):
        """``min_confidence`` > 0: stop drafting after a token the draft itself gives less
        than this probability (like transformers' assistant_confidence_threshold). The
        rule looks at the draft only, so verification stays exact."""
        self.lm = CachedLM(model)
        self.min_confidence = min_confidence

    @property
    def forwards(self) -> int:
        return self.lm.forwards

    def reset(self) -> None:
        self.lm.reset()

    def propose(self, tokens, k, params, generator) -> Proposal:
        feed = self.lm.sync(tokens)
        if not feed:  # everything is cached already: recompute the last position for its logits
            self.lm.rewind(len(tokens) - 1)
            feed = tokens[-1:]
        out: list[int] = []
        dists: list[torch.Tensor] = []
        for i in range(k):
            logits = self.lm.forward(feed, keep=1)  # [1, V]
            if params.greedy:
                x = int(logits.argmax(-1).item())
                q = torch.softmax(logits[0].double(), -1) if self.min_confidence > 0 else None
            else:
                q = probs(logits, params)[0]  # [V]
                x = sample(q, generator)
                dists.append(q)
            out.append(x)
            if self.min_confidence > 0 and float(q[x]) < self.min_confidence:
                break  # the draft is unsure: let the target decide from here
            feed = [x]
        return Proposal(out, torch.stack(dists) if dists else None)


class NgramProposer:
    """Prompt lookup: find the last n tokens (n from max_n down to min_n) earlier in the
    sequence, and propose the k tokens that followed the earliest such occurrence (the
    choice vLLM's ngram proposer makes, so the acceptance counters are comparable)."""

    name = "ngram"
    forwards = 0

    def __init__(self, min_n: int = 1, max_n: int = 4):
        if not 1 <= min_n <= max_n:
            raise UsageError(f"n-gram window {min_n}..{max_n} is empty: need 1 <= min <= max")
        self.min_n, self.max_n = min_n, max_n

    def reset(self) -> None:
        pass

    def propose(self, tokens, k, params, generator) -> Proposal:
        return Proposal(ngram_lookup(tokens, k, self.min_n, self.max_n))


def ngram_lookup(tokens: list[int], k: int, min_n: int, max_n: int) -> list[int]:
    """The up to k tokens after the earliest match of the longest suffix n-gram (n in
    min_n..max_n); a match may overlap the suffix itself but not be it."""
    size = len(tokens)
    for n in range(min(max_n, size - 1), min_n - 1, -1):
        suffix = tokens[size - n:]
        for start in range(size - n):
            if tokens[start:start + n] == suffix:
                return tokens[start + n:start + n + k]
    return []

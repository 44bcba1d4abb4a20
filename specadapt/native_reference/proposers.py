"""Proposers: who guesses the next k tokens (a draft model, or n-gram prompt lookup).

The interface is one method, ``propose(tokens, k, params, generator) -> Proposal``: it
sees the whole sequence so far and returns up to k tokens, with the distributions they
were drawn from when there are any. A proposer keeps whatever state it likes between
calls (a draft model keeps a KV cache); an EAGLE-style head would fit the same method.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Protocol

import torch

from specadapt.errors import UsageError
from specadapt.native_reference.models import SlotCache
from specadapt.native_reference.ngram import NgramIndex
from specadapt.native_reference.sampling import SamplingParams, probs, sample


@dataclass
class Proposal:
    tokens: list[int] = field(default_factory=list)
    q: torch.Tensor | None = None  # [len(tokens), V] draft distributions; None: deterministic


class Proposer(Protocol):
    """Proposes draft tokens for every row of a batch.

    Rows are numbered as the engine numbers them; the engine reports joins (``add``) and
    departures (``keep_rows``), so a proposer may keep per-row state (a draft model keeps a
    KV cache, n-gram lookup an index)."""

    name: str
    forwards: int  # model forward passes spent proposing (0 for n-gram)

    def add(self, tokens: list[int]) -> None: ...

    def keep_rows(self, rows: list[int]) -> None: ...

    def propose(self, seqs: list[list[int]], ks: list[int], params: list[SamplingParams],
                generators: list[torch.Generator | None], process: list | None = None) -> list[Proposal]:
        """``process``: per row None, or ``f(logits [1, V], drafted so far) -> logits``, the
        request's logits processing (bias, penalties, min_tokens) a sampling proposer
        applies before temperature, as the target's verification does."""


class DraftModelProposer:
    """A smaller causal LM with the target's vocabulary, run autoregressively k times over
    the whole batch at once.

    Its cache is kept by position: each row remembers the tokens it fed the draft; before
    proposing, the rejected tail is dropped (from the last confirmed position on, so O(k)
    per step) and the rest fed: one token normally, two when all k drafts were accepted
    (the last draft and the bonus token).
    """

    name = "draft_model"

    def __init__(self, model, min_confidence: float = 0.0):
        """``min_confidence`` > 0: stop drafting after a token the draft itself gives less
        than this probability (like transformers' assistant_confidence_threshold). The
        rule looks at the draft only, so verification stays exact."""
        self.model = model
        self.min_confidence = min_confidence
        # 1.0 when healthy. The draft-temperature fault (a test aid, set by the engine):
        # tokens are drawn at the request's temperature times this factor, while the q
        # returned for verification stays at the request's temperature.
        self.sample_temperature_factor = 1.0
        self.cache = SlotCache(model)
        self.fed: list[list[int]] = []  # per row: the tokens the draft's cache holds
        self.confirmed: list[int] = []  # per row: fed[:confirmed] is known to equal the sequence

    @property
    def forwards(self) -> int:
        return self.cache.forwards

    def add(self, tokens: list[int]) -> None:
        self.cache.add(tokens)
        self.fed.append(list(tokens))
        self.confirmed.append(len(tokens))

    def keep_rows(self, rows: list[int]) -> None:
        self.cache.keep_rows(rows)
        self.fed = [self.fed[i] for i in rows]
        self.confirmed = [self.confirmed[i] for i in rows]

    def propose(self, seqs, ks, params, generators, process=None) -> list[Proposal]:
        B = len(seqs)
        process = process or [None] * B
        feeds: list[list[int]] = []
        for b, seq in enumerate(seqs):
            fed, n = self.fed[b], self.confirmed[b]
            limit = min(len(fed), len(seq))
            while n < limit and fed[n] == seq[n]:
                n += 1
            n = min(n, len(seq) - 1)  # feed at least the last token: its logits start the draft
            self.cache.truncate(b, n)
            del fed[n:]
            feeds.append(seq[n:] if ks[b] > 0 else [])
            self.confirmed[b] = len(seq) if ks[b] > 0 else n
        self.cache.trim()
        out = [Proposal() for _ in range(B)]
        dists: list[list[torch.Tensor]] = [[] for _ in range(B)]
        live = [ks[b] > 0 for b in range(B)]
        step = 0
        while any(live):
            logits = self.cache.forward(feeds)  # [B, N, V]
            for b, feed in enumerate(feeds):
                if feed:
                    self.fed[b].extend(feed)
            nxt: list[list[int]] = [[] for _ in range(B)]
            for b in range(B):
                if not live[b]:
                    continue
                row = logits[b, len(feeds[b]) - 1][None]  # [1, V]
                if process[b] is not None:
                    row = process[b](row, out[b].tokens)  # the request's bias, penalties, min_tokens
                if params[b].greedy:
                    x = int(row.argmax(-1).item())
                    q = torch.softmax(row[0].double(), -1) if self.min_confidence > 0 else None
                else:
                    q = probs(row, params[b])[0]  # [V]
                    x = sample(self._drawn_from(row, params[b], q), generators[b])
                    dists[b].append(q)
                out[b].tokens.append(x)
                if len(out[b].tokens) >= ks[b] or (self.min_confidence > 0 and float(q[x]) < self.min_confidence):
                    live[b] = False  # done, or the draft is unsure: let the target decide from here
                else:
                    nxt[b] = [x]
            feeds = nxt
            step += 1
        for b in range(B):
            if dists[b]:
                out[b].q = torch.stack(dists[b])
        return out

    def _drawn_from(self, row: torch.Tensor, params: SamplingParams, q: torch.Tensor) -> torch.Tensor:
        """The distribution a draft token is drawn from: q itself, unless the
        draft-temperature fault rescales the temperature of the draw (not of q)."""
        if self.sample_temperature_factor == 1.0:
            return q
        wrong = replace(params, temperature=params.temperature * self.sample_temperature_factor)
        return probs(row, wrong)[0]


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
        self.indexes: list = []
        self.seen: list[int] = []  # per row: tokens already in its index

    def add(self, tokens: list[int]) -> None:
        index = NgramIndex(self.min_n, self.max_n)
        index.extend(list(tokens))
        self.indexes.append(index)
        self.seen.append(len(tokens))

    def keep_rows(self, rows: list[int]) -> None:
        self.indexes = [self.indexes[i] for i in rows]
        self.seen = [self.seen[i] for i in rows]

    def propose(self, seqs, ks, params, generators, process=None) -> list[Proposal]:
        out = []  # lookup proposes without logits: ``process`` does not apply
        for b, (index, seq, k) in enumerate(zip(self.indexes, seqs, ks)):
            index.extend(seq[self.seen[b]:])  # accepted tokens are final: the index only grows
            self.seen[b] = len(seq)
            out.append(Proposal(index.propose(k) if k > 0 else []))
        return out


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

"""Planted faults of the reference engine: deliberate bugs for testing the tools that judge servers.

Never on by default. Each fault is a small subclass of ``SpecEngine`` that overrides only
the steps it breaks (listed in its ``breaks``); everything else is the healthy algorithm
of ``specadapt.native_reference.engine``. ``FAULTS`` maps each name (what
``specadapt reference serve --inject-fault NAME`` takes) to its class; ``build_engine``
builds a healthy or a faulty engine from a name such as ``perturb-logits=0.5``.

- engine faults: ``accept-always``, ``drop-bonus``, ``perturb-logits=EPS``,
  ``draft-temperature=T`` (a draft model only);
- faults of the rejection sampler (``SAMPLER_FAULTS``, each a variant of
  ``sampling.rejection_verify``: ``faulty_rejection_verify``): ``residual-p``,
  ``bonus-previous``, ``accept-later``;
- faults of request features (``FEATURE_FAULTS``): each shows only where a verify pass
  emits several tokens (accepted drafts); target-only decoding (k = 0) never shows them;
- faults of batching (``BATCH_FAULTS``): each shows only where two or more requests share
  a verify pass; a request served alone (concurrency 1) never shows them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import ClassVar

import torch

from specadapt.errors import UsageError
from specadapt.native_reference.engine import Row, SpecEngine
from specadapt.native_reference.proposers import DraftModelProposer, Proposal, Proposer
from specadapt.native_reference.sampling import draft_q, probs, rejection_verify, residual, sample
from specadapt.native_reference.stops import StopStrings

SAMPLER_FAULTS = ("residual-p", "bonus-previous", "accept-later")
FEATURE_FAULTS = ("stop-in-chunk", "overrun-max-tokens", "draft-penalties-skipped", "draft-filters-skipped",
                  "seed-ignored", "logprobs-shifted")
BATCH_FAULTS = ("batch-drop",)


@dataclass(frozen=True)
class Fault:
    """A planted fault by name, with its value.

    ``eps``: the noise size of perturb-logits; ``factor``: the draft-temperature T (the
    draft samples at the request's temperature times T)."""

    kind: str
    eps: float = 0.0
    factor: float = 1.0

    @classmethod
    def parse(cls, text: str) -> Fault:
        kind, _, value = text.partition("=")
        if kind not in FAULTS:
            raise UsageError(f"unknown fault {text!r}: use one of {', '.join(FAULTS)} "
                             "(perturb-logits=EPS, draft-temperature=T)")
        if kind == "perturb-logits":
            try:
                eps = float(value)
            except ValueError:
                raise UsageError("perturb-logits needs a size: perturb-logits=EPS (e.g. 0.5)") from None
            return cls(kind, eps)
        if kind == "draft-temperature":
            return cls(kind, factor=_draft_temperature_factor(value))
        if value:
            raise UsageError(f"fault {kind} takes no value")
        return cls(kind)


def _draft_temperature_factor(value: str) -> float:
    """T of draft-temperature=T: finite, > 0 and not 1 (T = 1 is the healthy sampler)."""
    try:
        factor = float(value)
    except ValueError:
        raise UsageError("draft-temperature needs a factor: draft-temperature=T (e.g. 0.5: the draft "
                         "samples at half the request's temperature)") from None
    if not math.isfinite(factor) or factor <= 0:
        raise UsageError(f"draft-temperature={value}: T must be a finite number > 0 (e.g. 0.5)")
    if factor == 1:
        raise UsageError("draft-temperature=1 is the healthy sampler: pick T != 1 (e.g. 0.5 or 2)")
    return factor


class FaultyEngine(SpecEngine):
    """A ``SpecEngine`` with one planted fault (``self.fault``); a subclass overrides the
    engine methods named in its ``breaks`` and nothing else."""

    name: ClassVar[str]
    breaks: ClassVar[tuple[str, ...]]

    def __init__(self, fault: Fault, target, proposer: Proposer | None = None, k: int = 4, seed: int = 0,
                 schedule: Iterable[Sequence[int]] | None = None, max_model_len: int | None = None):
        super().__init__(target, proposer, k, seed, schedule, max_model_len)
        self.fault = fault


class AcceptAlways(FaultyEngine):
    """No comparison with the target at all: every draft is accepted, and the next token
    comes from the target's last position."""

    name, breaks = "accept-always", ("_verify",)

    def _verify(self, row: Row, logits: torch.Tensor, proposal: Proposal,
                generator: torch.Generator) -> tuple[int, int]:
        draft = proposal.tokens
        last = self._process(row, logits, draft)[len(draft):]  # [1, V]
        if row.params.greedy:
            return len(draft), int(last.argmax(-1).item())
        return len(draft), rejection_verify(probs(last, row.params), None, [], generator)[1]


class DropBonus(FaultyEngine):
    """After a full acceptance the target's extra token is thrown away (identity holds,
    throughput is lost)."""

    name, breaks = "drop-bonus", ("_chunk",)

    def _chunk(self, row: Row, prop: Proposal, m: int, nxt: int) -> list[int]:
        if prop.tokens and m == len(prop.tokens):
            return list(prop.tokens)
        return super()._chunk(row, prop, m, nxt)


class PerturbLogits(FaultyEngine):
    """Noise of size ``eps`` on the target's logits of every verify pass that checks drafts
    (a row's own noise stream, seeded with the row's seed + 1); prefills and passes without
    drafts are untouched."""

    name, breaks = "perturb-logits", ("_target_pass",)

    def _target_pass(self, rows: list[Row], proposals: list[Proposal]) -> torch.Tensor:
        logits = super()._target_pass(rows, proposals).clone()
        # the rows of this pass keep their streams; the held rows keep their ids unique
        held: dict[int, tuple[Row, torch.Generator]] = getattr(self, "_noise", {})
        self._noise = {id(r): held[id(r)] if id(r) in held and held[id(r)][0] is r
                       else (r, torch.Generator(device=self.device).manual_seed(r.seed + 1)) for r in rows}
        for b, (row, prop) in enumerate(zip(rows, proposals)):
            if prop.tokens:
                lg = logits[b, :len(prop.tokens) + 1]
                noise = torch.randn(lg.shape, generator=self._noise[id(row)][1], dtype=torch.float32,
                                    device=lg.device)
                logits[b, :len(prop.tokens) + 1] = lg + (self.fault.eps * noise).to(lg.dtype)
        return logits


class DraftTemperature(FaultyEngine):
    """The draft samples its tokens at the request's temperature times T, while q (what
    the rejection sampler divides by) stays at the request's temperature."""

    name, breaks = "draft-temperature", ("__init__",)

    def __init__(self, fault: Fault, target, proposer: Proposer | None = None, k: int = 4, seed: int = 0,
                 schedule: Iterable[Sequence[int]] | None = None, max_model_len: int | None = None):
        super().__init__(fault, target, proposer, k, seed, schedule, max_model_len)
        if not isinstance(proposer, DraftModelProposer) or self.k == 0:
            raise UsageError("the draft-temperature fault needs a draft model (--draft DIR, k >= 1): "
                             "n-gram proposals are not sampled (q is one-hot), so there is no draft "
                             "temperature to get wrong")
        proposer.sample_temperature_factor = fault.factor


def faulty_rejection_verify(p: torch.Tensor, q: torch.Tensor | None, draft: list[int],
                            generator: torch.Generator | None, fault: str) -> tuple[int, int]:
    """``sampling.rejection_verify`` with one of three realistic sampler bugs planted
    (``fault``, one of ``SAMPLER_FAULTS``), each of which breaks exactness:

    - ``residual-p``: the replacement after a rejection is drawn from p itself instead
      of norm(max(p - q, 0));
    - ``bonus-previous``: when all k drafts are accepted the bonus is drawn from the
      previous row p[k-1] instead of p[k] (an off-by-one);
    - ``accept-later``: only draft position 0 is checked; positions >= 1 are always
      accepted.

    Everything else (the random draws and their order included) is the healthy sampler's.
    """
    if fault not in SAMPLER_FAULTS:
        raise ValueError(f"unknown sampler fault {fault!r}: use one of {', '.join(SAMPLER_FAULTS)}")
    u = torch.rand(len(draft), generator=generator, dtype=torch.float64, device=p.device)
    for i, x in enumerate(draft):
        if fault == "accept-later" and i >= 1:
            continue  # the bug: later positions are never compared with the target
        q_i = draft_q(p, q, i, x)
        if u[i] * q_i[x] < p[i, x]:
            continue
        if fault == "residual-p":
            return i, sample(p[i], generator)  # the bug: the rejected mass is not removed
        return i, sample(residual(p[i], q_i), generator)
    row = len(draft)
    if fault == "bonus-previous" and draft:
        row -= 1  # the bug: the row of the last draft position, not the one after it
    return len(draft), sample(p[row], generator)


class _SamplerFault(FaultyEngine):
    """A bug inside the rejection sampler: ``faulty_rejection_verify`` with the fault's name."""

    breaks = ("_rejection_sample",)

    def _rejection_sample(self, p: torch.Tensor, proposal: Proposal,
                          generator: torch.Generator) -> tuple[int, int]:
        return faulty_rejection_verify(p, proposal.q, proposal.tokens, generator, self.name)


class ResidualP(_SamplerFault):
    """After a rejection the replacement is drawn from p, not from norm(max(p - q, 0))."""

    name = "residual-p"


class BonusPrevious(_SamplerFault):
    """The bonus token is drawn from the last draft position's row, not the one after it."""

    name = "bonus-previous"


class AcceptLater(_SamplerFault):
    """Draft positions after the first are never compared with the target."""

    name = "accept-later"


class StopInChunk(FaultyEngine):
    """A stop string completed before a chunk's last token neither cuts the text nor drops
    the tokens after it."""

    name, breaks = "stop-in-chunk", ("_match_stop_string",)

    def _match_stop_string(self, stops: StopStrings, emitted: list[int], terminated: bool
                           ) -> tuple[int, str | None]:
        if not emitted:
            return 0, None
        before = stops.tokens
        found = stops.first_stop(before, stops.append(emitted, terminated))
        if found is None:
            return len(emitted), None
        stop, start, kept = found
        if kept < len(emitted):
            stops.matched = stop
            return len(emitted), stop  # the bug: the chunk is kept whole, stop string and all
        stops.cut(stop, start, before + kept)
        return kept, stop


class OverrunMaxTokens(FaultyEngine):
    """A chunk is kept whole past max_tokens."""

    name, breaks = "overrun-max-tokens", ("_cut_at_length",)

    def _cut_at_length(self, row: Row, emitted: list[int]) -> list[int]:
        return emitted


class DraftPenaltiesSkipped(FaultyEngine):
    """min_tokens, logit_bias and penalties reach the first verified position only: the
    drafted positions stay raw."""

    name, breaks = "draft-penalties-skipped", ("_process",)

    def _process(self, row: Row, logits: torch.Tensor, draft: list[int]) -> torch.Tensor:
        return torch.cat([row.process(logits[:1]), logits[1:].to(torch.float64)])


class DraftFiltersSkipped(FaultyEngine):
    """min-p, top-k and top-p reach the first verified position only: the drafted
    positions stay unfiltered."""

    name, breaks = "draft-filters-skipped", ("_probs",)

    def _probs(self, row: Row, x: torch.Tensor) -> torch.Tensor:
        first = probs(x, row.params)[:1]  # every row checked, as the healthy step checks them
        unfiltered = replace(row.params, min_p=0.0, top_k=0, top_p=1.0)  # the same temperature
        return torch.cat([first, probs(x[1:], unfiltered)])


class SeedIgnored(FaultyEngine):
    """A verify pass that checks drafts samples from the engine's generator, not from the
    request's seeded one."""

    name, breaks = "seed-ignored", ("_verify",)

    def _verify(self, row: Row, logits: torch.Tensor, proposal: Proposal,
                generator: torch.Generator) -> tuple[int, int]:
        return super()._verify(row, logits, proposal, self.generator if proposal.tokens else generator)


class LogprobsShifted(FaultyEngine):
    """In a chunk of several tokens, token j's logprobs are read at position j - 1."""

    name, breaks = "logprobs-shifted", ("_emitted_logp",)

    def _emitted_logp(self, logits: torch.Tensor, n: int) -> torch.Tensor:
        logp = super()._emitted_logp(logits, n)
        return logp[[0] + list(range(n - 1))] if n > 1 else logp


class BatchDrop(FaultyEngine):
    """In a verify pass shared by several rows, every row but the first loses its last
    accepted draft, so the token the target chose after it takes its place. The cache
    entries kept (all but the last emitted token) are still those of the row's tokens, so
    the row goes on from the corrupted sequence as if it were its own."""

    name, breaks = "batch-drop", ("_chunk",)

    def _chunk(self, row: Row, prop: Proposal, m: int, nxt: int) -> list[int]:
        if m > 0 and any(r is row for r in self.rows[1:]):  # a row after the first of the pass
            return prop.tokens[:m - 1] + [nxt]
        return super()._chunk(row, prop, m, nxt)


# every fault by name: engine faults, then the sampler's, the features' and batching's
FAULTS: dict[str, type[FaultyEngine]] = {cls.name: cls for cls in (
    AcceptAlways, DropBonus, PerturbLogits, DraftTemperature, ResidualP, BonusPrevious, AcceptLater,
    StopInChunk, OverrunMaxTokens, DraftPenaltiesSkipped, DraftFiltersSkipped, SeedIgnored, LogprobsShifted,
    BatchDrop)}


def build_engine(target, proposer: Proposer | None = None, k: int = 4, fault: Fault | str | None = None,
                 seed: int = 0, schedule: Iterable[Sequence[int]] | None = None,
                 max_model_len: int | None = None) -> SpecEngine:
    """A ``SpecEngine``, or with ``fault`` (a Fault, or its text such as ``perturb-logits=0.5``)
    the engine with that fault planted."""
    if isinstance(fault, str):
        fault = Fault.parse(fault)
    if fault is None:
        return SpecEngine(target, proposer, k, seed, schedule, max_model_len)
    return FAULTS[fault.kind](fault, target, proposer, k, seed, schedule, max_model_len)

"""Sampling and verification: greedy acceptance and exact modified rejection sampling.

Rejection sampling follows Leviathan et al. 2023 / Chen et al. 2023: draft token x_i
drawn from q_i is accepted with probability min(1, p_i(x)/q_i(x)); at the first
rejection the replacement is drawn from norm(max(p_i - q_i, 0)); when all k drafts are
accepted a bonus token is drawn from p_{k+1}. The output is then distributed exactly as
sampling from the target alone. Proposals without a distribution (n-gram lookup) are
deterministic, so their q is one-hot.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

from specadapt.errors import UsageError


@dataclass(frozen=True)
class SamplingParams:
    """What the request asks for; applied identically to target (p) and draft (q).

    Checked on construction (``validate``), so a value that cannot be sampled from never
    reaches ``probs``; the server answers such a request with HTTP 400, as vLLM does.
    """

    temperature: float = 0.0
    top_k: int = 0  # 0 or -1: off
    top_p: float = 1.0  # 1.0: off
    min_p: float = 0.0  # 0.0: off; drop tokens below min_p x the best token's tempered probability
    repetition_penalty: float = 1.0  # 1.0: off; prompt and output tokens
    frequency_penalty: float = 0.0  # minus frequency_penalty x count in the output
    presence_penalty: float = 0.0  # minus presence_penalty for each token present in the output
    # (token id, bias) pairs, sorted by id; a dict is accepted and each bias clamped to
    # [-100, 100], as vLLM clamps it
    logit_bias: tuple[tuple[int, float], ...] = ()
    min_tokens: int = 0  # EOS and stop token ids masked while fewer tokens were generated

    def __post_init__(self) -> None:
        bias = self.logit_bias
        items = bias.items() if isinstance(bias, dict) else (bias or ())
        try:
            pairs = tuple(sorted((int(t), min(100.0, max(-100.0, float(b)))) for t, b in items))
        except (TypeError, ValueError):
            raise UsageError(f"logit_bias must map token ids to numbers, got {bias!r}") from None
        object.__setattr__(self, "logit_bias", pairs)
        self.validate()

    def validate(self) -> None:
        """Raise UsageError (one line naming the parameter) for a value vLLM refuses.

        The rules are those of vLLM's ``SamplingParams._verify_args``
        (vllm/sampling_params.py): temperature a finite number >= 0; top_p in (0, 1];
        top_k an integer >= -1, where 0 and -1 both mean off. NaN and infinities fail
        these checks. Not copied: recent vLLM versions also cap temperature at 2 (the
        OpenAI API's range); the reference engine samples at any finite temperature.
        """
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, numbers.Real) or not math.isfinite(t):
            raise UsageError(f"temperature must be a finite number, got {t!r}")
        if t < 0:
            raise UsageError(f"temperature must be non-negative, got {t!r}")
        p = self.top_p
        if isinstance(p, bool) or not isinstance(p, numbers.Real) or not 0.0 < p <= 1.0:
            raise UsageError(f"top_p must be in (0, 1], got {p!r}")
        k = self.top_k
        if isinstance(k, bool) or not isinstance(k, numbers.Integral):
            raise UsageError(f"top_k must be an integer, got {k!r}")
        if k < -1:
            raise UsageError(f"top_k must be 0 or -1 (off) or at least 1, got {k!r}")
        self._validate_processing()

    def _validate_processing(self) -> None:
        """vLLM's rules for min_p, the penalties and min_tokens (the max_tokens bound of
        min_tokens is the server's, which knows max_tokens)."""
        mp = self.min_p
        if isinstance(mp, bool) or not isinstance(mp, numbers.Real) or not 0.0 <= mp <= 1.0:
            raise UsageError(f"min_p must be in [0, 1], got {mp!r}")
        for name in ("presence_penalty", "frequency_penalty"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, numbers.Real) or not -2.0 <= v <= 2.0:
                raise UsageError(f"{name} must be in [-2, 2], got {v!r}")
        r = self.repetition_penalty
        if isinstance(r, bool) or not isinstance(r, numbers.Real) or not math.isfinite(r):
            raise UsageError(f"repetition_penalty must be a finite number, got {r!r}")
        if r <= 0:
            raise UsageError(f"repetition_penalty must be greater than zero, got {r!r}")
        n = self.min_tokens
        if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 0:
            raise UsageError(f"min_tokens must be greater than or equal to 0, got {n!r}")
        if any(not math.isfinite(b) for _, b in self.logit_bias):
            raise UsageError("logit_bias values must be finite numbers")

    @property
    def penalized(self) -> bool:
        """Whether repetition/frequency/presence penalties change anything."""
        return self.repetition_penalty != 1.0 or self.frequency_penalty != 0.0 or self.presence_penalty != 0.0

    @property
    def processed(self) -> bool:
        """Whether the logits need processing before temperature (bias, penalties, min_tokens)."""
        return self.penalized or bool(self.logit_bias) or self.min_tokens > 0

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


def process_logits(logits: torch.Tensor, params: SamplingParams, prompt: Sequence[int],
                   output: Sequence[int], drafts: Sequence[int] = (), stop_ids: Iterable[int] = ()
                   ) -> torch.Tensor:
    """The logits ``[S, V]`` after min_tokens, logit_bias and the penalties (float64), in
    vLLM's order; what greedy takes the argmax of and temperature divides.

    Row i predicts the token after ``output + drafts[:i]``, so each row is processed with
    the output as it would be after the chunk's earlier tokens: a verify pass then gives
    the same distributions as decoding one token at a time. ``stop_ids`` (EOS and stop
    token ids) are masked in a row whose output is shorter than ``params.min_tokens``.
    """
    x = logits.to(torch.float64).clone()  # [S, V]
    if not params.processed:
        return x
    vocab = x.shape[-1]
    stops = torch.tensor(sorted(set(stop_ids)), dtype=torch.long, device=x.device)
    counts = _counts(output, vocab, x.device)  # [V]
    in_prompt = _counts(prompt, vocab, x.device) > 0  # [V]
    for i in range(x.shape[0]):
        if i > 0:
            counts[drafts[i - 1]] += 1
        if len(output) + i < params.min_tokens and stops.numel():
            x[i, stops] = float("-inf")
        for tid, bias in params.logit_bias:
            x[i, tid] += bias
        if params.penalized:
            x[i] = _penalize(x[i], counts, in_prompt, params)
    return x


def _counts(tokens: Sequence[int], vocab: int, device) -> torch.Tensor:
    """How often each token id occurs in ``tokens`` ``[V]`` (float64)."""
    ids = torch.tensor(list(tokens), dtype=torch.long, device=device)
    return torch.bincount(ids, minlength=vocab)[:vocab].to(torch.float64)


def _penalize(x: torch.Tensor, counts: torch.Tensor, in_prompt: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """One row ``[V]``: repetition (tokens of the prompt or the output: a positive logit
    divided by the penalty, a negative one multiplied), then frequency (minus the penalty
    times the count in the output), then presence (minus the penalty if in the output)."""
    seen = counts > 0
    if params.repetition_penalty != 1.0:
        r = params.repetition_penalty
        scaled = torch.where(x > 0, x / r, x * r)
        x = torch.where(seen | in_prompt, scaled, x)
    return x - params.frequency_penalty * counts - params.presence_penalty * seen.to(x.dtype)


def probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Processed distributions ``[S, V]`` (float64): temperature, then min-p, top-k and
    top-p (vLLM's order); ``logits`` already hold bias and penalties (process_logits).

    Raises ValueError instead of returning NaN when a row has no token left to sample
    (NaN or +inf logits, or every token masked).
    """
    x = _filter(logits.to(torch.float64) / params.temperature, params)  # [S, V]
    # softmax is NaN on a row with a NaN or +inf, or with every entry -inf (nothing left)
    bad = (x.isnan() | (x == float("inf"))).any(-1) | (x == float("-inf")).all(-1)  # [S]
    if bool(bad.any()):
        row = int(bad.nonzero()[0, 0])
        raise ValueError(
            f"no distribution to sample from at row {row}: the logits hold NaN/inf "
            f"(a {logits.dtype} overflow?) or {params} masks every token")
    return torch.softmax(x, dim=-1)


def _filter(x: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Tempered logits ``[S, V]`` after min-p, top-k, top-p (dropped tokens at -inf)."""
    if params.min_p > 0.0:
        p = torch.softmax(x, dim=-1)
        x = x.masked_fill(p < params.min_p * p.max(dim=-1, keepdim=True).values, float("-inf"))
    if params.top_k > 0 and params.top_k < x.shape[-1]:
        kth = torch.topk(x, params.top_k, dim=-1).values[..., -1:]  # [S, 1]
        x = x.masked_fill(x < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_x, order = torch.sort(x, dim=-1, descending=True)
        p_sorted = torch.softmax(sorted_x, dim=-1)
        mass_before = torch.cumsum(p_sorted, dim=-1) - p_sorted  # [S, V]
        drop_sorted = mass_before >= params.top_p  # keep the smallest set reaching top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        x = x.masked_fill(drop, float("-inf"))
    return x


def sample(p: torch.Tensor, generator: torch.Generator | None) -> int:
    """One draw from the distribution ``p`` ``[V]``."""
    return int(torch.multinomial(p, 1, generator=generator).item())


def greedy_verify(target_logits: torch.Tensor, draft: list[int]) -> tuple[int, int]:
    """Accept the longest prefix of ``draft`` equal to the target's argmax.

    ``target_logits`` ``[k+1, V]``: row i predicts the token at draft position i.
    Returns (accepted count m, next token = target argmax at position m).
    """
    best = target_logits.argmax(dim=-1).tolist()  # [k+1]
    m = 0
    while m < len(draft) and draft[m] == best[m]:
        m += 1
    return m, best[m]


def draft_q(p: torch.Tensor, q: torch.Tensor | None, i: int, x: int) -> torch.Tensor:
    """The draft's distribution ``[V]`` at draft position i, where it drew token x:
    ``q[i]``, or one-hot at x for a deterministic proposal (``q`` None)."""
    if q is not None:
        return q[i]
    return torch.nn.functional.one_hot(torch.tensor(x, device=p.device), p.shape[-1]).to(p.dtype)


def residual(p_i: torch.Tensor, q_i: torch.Tensor) -> torch.Tensor:
    """What the replacement after a rejection is drawn from ``[V]``: norm(max(p_i - q_i, 0)),
    or p_i itself where that is all zero (q_i above p_i everywhere by rounding only)."""
    mass = torch.clamp(p_i - q_i, min=0.0)
    total = mass.sum()
    return mass / total if total > 0 else p_i


def rejection_verify(p: torch.Tensor, q: torch.Tensor | None, draft: list[int],
                     generator: torch.Generator | None) -> tuple[int, int]:
    """Modified rejection sampling over ``draft``.

    ``p`` ``[k+1, V]``: target distributions; ``q`` ``[k, V]``: draft distributions the
    tokens were drawn from, or None for deterministic proposals (q one-hot).
    Returns (accepted count m, next token: the replacement or the bonus).
    """
    u = torch.rand(len(draft), generator=generator, dtype=torch.float64, device=p.device)
    for i, x in enumerate(draft):
        q_i = draft_q(p, q, i, x)
        # accept with probability min(1, p/q)
        if u[i] * q_i[x] < p[i, x]:
            continue
        return i, sample(residual(p[i], q_i), generator)  # the replacement
    return len(draft), sample(p[len(draft)], generator)  # every draft accepted: the bonus token from p

"""Speculative decoding theory (Leviathan et al. 2023): tokens per pass, speedup, best k.

Pure Python (no torch) so that probes and reports can use it. ``a`` is the acceptance
rate of one draft token (i.i.d. across positions), ``k`` the number of draft tokens per
target pass, ``c`` the cost of one draft step divided by the cost of one target pass.
"""

from __future__ import annotations

from collections.abc import Sequence


def expected_tokens_per_pass(a: float, k: int) -> float:
    """Formula: (1 - a^(k+1)) / (1 - a); k + 1 when a = 1."""
    _check(a, k)
    if a >= 1.0:
        return float(k + 1)
    return (1.0 - a ** (k + 1)) / (1.0 - a)


def predicted_speedup(a: float, k: int, c: float, v: float = 1.0) -> float:
    """Formula: (1 - a^(k+1)) / ((1 - a)(k c + v)): tokens per pass over the cost of a pass.

    ``v`` is the cost of verifying k+1 tokens relative to one 1-token target pass; the
    classic formula takes v = 1 (true when decoding is purely memory-bound)."""
    if c < 0 or v <= 0:
        raise ValueError(f"cost ratios need c >= 0 and v > 0, not c={c}, v={v}")
    return expected_tokens_per_pass(a, k) / (k * c + v)


def best_k(a: float, c: float, k_max: int = 16) -> tuple[int, float]:
    """The k in 0..k_max with the highest predicted speedup (k = 0: do not speculate)."""
    candidates = [(predicted_speedup(a, k, c), -k) for k in range(k_max + 1)]
    speedup, neg_k = max(candidates)
    return -neg_k, speedup


def tokens_per_pass_per_position(accepted_per_pos: Sequence[int], num_drafts: int) -> float:
    """Formula: 1 + sum_i accepted_i / num_drafts, with accepted_i the count of passes in
    which draft position i was accepted (vLLM's per-position counter): measured, no i.i.d.
    assumption."""
    if num_drafts <= 0:
        return 1.0
    return 1.0 + sum(accepted_per_pos) / num_drafts


def predicted_speedup_per_position(accepted_per_pos: Sequence[int], num_drafts: int, c: float,
                                   v: float = 1.0) -> float:
    """Formula: (1 + sum_i accepted_i / num_drafts) / (k c + v), k = len(accepted_per_pos)."""
    k = len(accepted_per_pos)
    return tokens_per_pass_per_position(accepted_per_pos, num_drafts) / (k * c + v)


def predicted_speedup_from_counts(accepted_per_pos: Sequence[int], passes: int, draft_forwards: int,
                                  c: float, v: float = 1.0) -> float:
    """Formula: (1 + sum_i accepted_i / passes) / ((draft_forwards / passes) c + v).

    The per-position form for proposals of varying length (n-gram misses, a draft that
    stops early): the draft cost is what was spent per pass, not k c. Equal to
    predicted_speedup_per_position when every pass drafts exactly k tokens."""
    if passes <= 0:
        return 1.0
    return tokens_per_pass_per_position(accepted_per_pos, passes) / (draft_forwards / passes * c + v)


def conditional_acceptance(accepted_per_pos: Sequence[int], num_drafts: int) -> list[float]:
    """P(position i accepted | positions < i accepted), from per-position counts."""
    out, before = [], num_drafts
    for acc in accepted_per_pos:
        out.append(acc / before if before else 0.0)
        before = acc
    return out


def acceptance_from_mean_length(mean_tokens: float, k: int, tol: float = 1e-12) -> float:
    """Invert expected_tokens_per_pass: the i.i.d. a that explains a measured mean (bisection)."""
    if not 1.0 <= mean_tokens <= k + 1:
        raise ValueError(f"mean tokens per pass must be in [1, {k + 1}], not {mean_tokens}")
    lo, hi = 0.0, 1.0
    while hi - lo > tol:
        mid = (lo + hi) / 2
        if expected_tokens_per_pass(mid, k) < mean_tokens:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def _check(a: float, k: int) -> None:
    if not 0.0 <= a <= 1.0:
        raise ValueError(f"acceptance rate a must be in [0, 1], not {a}")
    if k < 0:
        raise ValueError(f"k must be >= 0, not {k}")

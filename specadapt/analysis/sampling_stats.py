"""Do sampled tokens follow the target's distribution? Tests with a stated false-alarm rate and power.

Speculative decoding must leave the target's sampling distribution unchanged. Each sampled
token comes with the source's (the target's) top-K log-probabilities at its position, so the
question is answered token by token, without knowing how the tokens depend on each other.

Formulas (derivations in docs/sampling.md):
- PIT interval: order the vocabulary as the top-K tokens by probability descending (ties by
  token id), then everything else lumped into one bucket. With cumulative F in that order, the
  sampled token x has the interval [F(x-), F(x)]; outside the top-K it is [sum(top), 1].
  Cumulative sums are capped at 1 (rounded top-K sums can exceed it); a ``full_vocab`` draw is
  normalised to sum 1 and has no lumped bucket.
- Randomised PIT: U = F(x-) + V (F(x) - F(x-)), V ~ U(0, 1). Under the null U ~ U(0, 1) given
  the past, so the U's of all positions are i.i.d. uniform and are pooled.
- Tests (Bonferroni: each at alpha / 3, family-wise false-alarm rate <= alpha):
  pit-chi-square: Pearson's chi-square of the U's in ``bins`` equal bins, bins - 1 dof.
  pit-ks: Kolmogorov-Smirnov of the U's against U(0, 1).
  rank-chi-square: categories rank 1, rank 2, ranks 3-5, ranks 6-K, outside top-K; with O the
  observed counts, E = sum_t p_t and Sigma = sum_t (diag(p_t) - p_t p_t^T), the statistic
  (O - E)^T Sigma^+ (O - E) is chi-square with rank(Sigma) dof (martingale CLT). Neighbouring
  categories with fewer than 5 expected tokens are merged first.
- Power: the chi-square's noncentrality is lambda = n B sum_i delta_i^2 for bin deviations
  delta_i, and lambda >= 4 n TV^2 (Cauchy-Schwarz), so a binned TV of at least
  sqrt(lambda* / (4 n)) is caught with the stated power, where lambda* solves
  P(ncx2(B - 1, lambda*) > chi2.isf(alpha / 3, B - 1)) = power.
- Fewer than 5 expected tokens per PIT bin (n < 5 B): "too-few", nothing decided, not passed.
  A sampled token of probability zero under the source is "inconsistent" at any n.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import NamedTuple

import numpy as np

from specadapt.errors import UsageError
from specadapt.records.sampling import RankCategory, SamplingStats, SamplingTest, TvTarget

TESTS = ("pit-chi-square", "pit-ks", "rank-chi-square")
MIN_EXPECTED = 5  # fewest expected tokens per PIT bin and per rank-test category
CATEGORIES = ("rank 1", "rank 2", "ranks 3-5", "ranks 6-K", "outside top-K")
_RANK_EDGES = (1, 2, 5)  # 0-based ranks at which the next category starts (rank 2, ranks 3-5, ranks 6-K)
_EIG_RTOL = 1e-10  # eigenvalues of Sigma below this many times n are its null space


@dataclass(frozen=True)
class TokenDraw:
    top: dict[int, float]          # top-K token id -> log-probability under the source at this position
    token: int                     # the sampled token id
    logprob: float | None = None   # the sampled token's log-probability under the source (if known)
    position: int = 0              # index of the token in its completion (0-based)
    prompt_id: str = ""
    full_vocab: bool = False       # True when `top` holds the whole distribution (no lumped rest)


class DrawArrays(NamedTuple):
    """Draws as arrays: what the statistics need, vectorised."""

    probs: np.ndarray  # [n, K] source probabilities in PIT order (descending, ties by id), zero-padded
    rank: np.ndarray   # [n] 0-based rank of the sampled token in ``probs``; -1 outside the top-K
    zero_probability: np.ndarray  # [n] bool: the source gives the sampled token probability zero


def _check_logprob(value: float, draw: TokenDraw) -> None:
    if math.isnan(value) or value == math.inf:
        raise ValueError(f"log-probability {value} at position {draw.position} of prompt "
                         f"{draw.prompt_id!r} is not a log-probability")


def encode_draws(draws: Sequence[TokenDraw]) -> DrawArrays:
    """The draws as ``DrawArrays`` (sorted, normalised where ``full_vocab``)."""
    width = max((len(d.top) for d in draws), default=0)
    probs = np.zeros((len(draws), width))
    rank = np.full(len(draws), -1)
    zero = np.zeros(len(draws), dtype=bool)
    for i, d in enumerate(draws):
        for value in [*d.top.values(), *([d.logprob] if d.logprob is not None else [])]:
            _check_logprob(value, d)
        ids = np.array(list(d.top.keys()))
        p = np.exp(np.array(list(d.top.values())))
        order = np.lexsort((ids, -p))  # probability descending, then token id ascending
        ids, p = ids[order], p[order]
        if d.full_vocab:
            total = p.sum()
            if not total > 0:
                raise ValueError(f"full-vocabulary draw at position {d.position} of prompt "
                                 f"{d.prompt_id!r} has no probability mass")
            p = p / total
        probs[i, :p.size] = p
        hit = np.flatnonzero(ids == d.token)
        if hit.size:
            rank[i] = hit[0]
            zero[i] = p[hit[0]] == 0.0
        else:
            zero[i] = d.full_vocab
        zero[i] |= d.logprob == -math.inf
    return DrawArrays(probs, rank, zero)


def _cumulative(probs: np.ndarray) -> np.ndarray:
    """F at the end of each top-K rank, capped at 1; at least 5 columns (padding repeats the sum)."""
    probs = np.asarray(probs)
    pad = max(0, _RANK_EDGES[-1] - probs.shape[1])
    probs = np.pad(probs, ((0, 0), (0, pad)))
    return np.minimum(np.cumsum(probs, axis=1), 1.0)


def _intervals(cum: np.ndarray, rank: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    rows = np.arange(rank.size)
    inside = rank >= 0
    r = np.maximum(rank, 0)
    before = np.where(r > 0, cum[rows, np.maximum(r - 1, 0)], 0.0)
    lo = np.where(inside, before, cum[:, -1])
    hi = np.where(inside, cum[rows, r], 1.0)
    return lo, hi


def pit_interval(draw: TokenDraw) -> tuple[float, float]:
    """[F(x-), F(x)] of the sampled token in the PIT order (see the module docstring)."""
    arrays = encode_draws([draw])
    lo, hi = _intervals(_cumulative(arrays.probs), arrays.rank)
    return float(lo[0]), float(hi[0])


def _pits(cum: np.ndarray, rank: np.ndarray, seed: int) -> np.ndarray:
    lo, hi = _intervals(cum, rank)
    return lo + np.random.default_rng(seed).random(rank.size) * (hi - lo)


def randomized_pits(draws: Sequence[TokenDraw], seed: int = 0) -> np.ndarray:
    """U = F(x-) + V (F(x) - F(x-)), V ~ U(0, 1) from ``default_rng(seed)``: U(0, 1) under the null."""
    arrays = encode_draws(draws)
    return _pits(_cumulative(arrays.probs), arrays.rank, seed)


def _check_level(alpha: float, power: float, bins: int) -> None:
    if not 0 < alpha < 1:
        raise UsageError(f"alpha must be between 0 and 1, got {alpha}: give a false-alarm rate such as 0.01")
    if not alpha < power < 1:
        raise UsageError(f"power must be above alpha ({alpha}) and below 1, got {power}: give e.g. 0.8")
    if isinstance(bins, bool) or not isinstance(bins, int) or bins < 2:
        raise UsageError(f"bins must be an integer of at least 2, got {bins!r}: give e.g. 20")


@lru_cache(maxsize=256)
def _noncentrality(alpha: float, power: float, bins: int) -> float:
    """lambda* with P(ncx2(bins - 1, lambda*) > chi2.isf(alpha, bins - 1)) = power."""
    from scipy import optimize, stats  # scipy.stats takes a second to import: only when used

    dof = bins - 1
    crit = stats.chi2.isf(alpha, dof)

    def shortfall(lam: float) -> float:
        return float(stats.ncx2.sf(crit, dof, lam)) - power

    upper = 1.0
    while shortfall(upper) < 0:
        upper *= 2
    return float(optimize.brentq(shortfall, 0.0, upper, xtol=1e-12, rtol=1e-12))


def detectable_tv(n: int, alpha: float, power: float = 0.8, bins: int = 20) -> float:
    """Smallest binned-PIT TV from uniform that the chi-square at level ``alpha`` catches with
    probability ``power`` whatever the deviation's shape: sqrt(lambda* / (4 n))."""
    _check_level(alpha, power, bins)
    if n < 1:
        raise UsageError(f"the number of tokens must be at least 1, got {n}")
    return math.sqrt(_noncentrality(alpha, power, bins) / (4 * n))


def samples_needed(tv: float, alpha: float, power: float = 0.8, bins: int = 20) -> int:
    """Fewest tokens whose detectable_tv is at most ``tv``: ceil(lambda* / (4 tv^2)), and never
    fewer than the MIN_EXPECTED * bins below which the verdict is "too-few"."""
    _check_level(alpha, power, bins)
    if not 0 < tv <= 1:
        raise UsageError(f"a total-variation distance must be in (0, 1], got {tv}: give e.g. 0.02")
    return max(math.ceil(_noncentrality(alpha, power, bins) / (4 * tv * tv)), MIN_EXPECTED * bins)


def _category_probs(cum: np.ndarray) -> np.ndarray:
    """[n, 5] probability of each rank category (CATEGORIES) at each position."""
    f1, f2, f5 = (cum[:, edge - 1] for edge in _RANK_EDGES)
    fk = cum[:, -1]
    return np.column_stack([f1, f2 - f1, f5 - f2, fk - f5, 1.0 - fk])


def _categories(rank: np.ndarray) -> np.ndarray:
    """Category index (into CATEGORIES) of each sampled token."""
    return np.where(rank < 0, len(CATEGORIES) - 1, np.searchsorted(_RANK_EDGES, rank, side="right"))


def merge_groups(expected: Sequence[float], min_expected: float = MIN_EXPECTED) -> list[list[int]]:
    """Merge neighbouring categories until each expects at least ``min_expected`` tokens (or one is
    left): the smallest is merged into its smaller neighbour (the left one on a tie)."""
    groups = [[i] for i in range(len(expected))]
    e = [float(x) for x in expected]
    while len(groups) > 1:
        j = int(np.argmin(e))
        if e[j] >= min_expected:
            break
        if j == 0:
            k = 1
        elif j == len(groups) - 1:
            k = j - 1
        else:
            k = j - 1 if e[j - 1] <= e[j + 1] else j + 1
        a, b = min(j, k), max(j, k)
        groups[a] += groups.pop(b)
        e[a] += e.pop(b)
    return groups


def rank_test(cat_probs: np.ndarray, cats: np.ndarray) -> tuple[float, int, float, list[list[int]]]:
    """(statistic, dof, p-value, groups): (O - E)^T Sigma^+ (O - E) over merged categories."""
    from scipy import stats

    groups = merge_groups(cat_probs.sum(axis=0))
    p = np.column_stack([cat_probs[:, g].sum(axis=1) for g in groups])
    group_of = np.empty(cat_probs.shape[1], dtype=np.int64)
    for gi, g in enumerate(groups):
        group_of[g] = gi
    observed = np.bincount(group_of[cats], minlength=len(groups))
    d = observed - p.sum(axis=0)
    sigma = np.diag(p.sum(axis=0)) - p.T @ p
    w, u = np.linalg.eigh(sigma)
    keep = w > _EIG_RTOL * cat_probs.shape[0]  # rounding leaves ~1e-16 n on the constant direction
    dof = int(keep.sum())
    if dof == 0:
        return 0.0, 0, 1.0, groups
    proj = u[:, keep].T @ d
    stat = float(np.sum(proj * proj / w[keep]))
    return stat, dof, float(stats.chi2.sf(stat, dof)), groups


def verdict_from_arrays(arrays: DrawArrays, alpha: float = 0.01, bins: int = 20, seed: int = 0,
                        power: float = 0.8, tv_targets: Sequence[float] = (0.01, 0.02, 0.05)) -> SamplingStats:
    """sampling_verdict on draws already encoded (``encode_draws``)."""
    from scipy import stats

    m = len(TESTS)
    per_test = alpha / m
    _check_level(alpha, power, bins)
    rank = np.asarray(arrays.rank)
    n = int(rank.size)
    cum = _cumulative(arrays.probs)
    u = _pits(cum, rank, seed)
    hist = np.bincount(np.minimum((u * bins).astype(np.int64), bins - 1), minlength=bins)
    cat_probs = _category_probs(cum)
    cats = _categories(rank)
    observed = np.bincount(cats, minlength=len(CATEGORIES))
    expected = cat_probs.sum(axis=0)
    rank_categories = [RankCategory(name=name, observed=int(o), expected=float(e))
                       for name, o, e in zip(CATEGORIES, observed, expected)]
    var1 = float(np.sum(cat_probs[:, 0] * (1 - cat_probs[:, 0])))
    top1_z = float((observed[0] - expected[0]) / math.sqrt(var1)) if var1 > 0 else None
    zero = int(np.count_nonzero(arrays.zero_probability))
    min_tokens = MIN_EXPECTED * bins
    checked = n >= min_tokens

    tests: list[SamplingTest] = []
    groups: list[list[int]] = []
    if checked:
        chi = stats.chisquare(hist)
        ks = stats.kstest(u, "uniform")
        r_stat, r_dof, r_p, groups = rank_test(cat_probs, cats)
        for name, stat, dof, p in ((TESTS[0], chi.statistic, bins - 1, chi.pvalue),
                                   (TESTS[1], ks.statistic, None, ks.pvalue),
                                   (TESTS[2], r_stat, r_dof, r_p)):
            tests.append(SamplingTest(name=name, statistic=float(stat), dof=dof, p_value=float(p),
                                      rejected=bool(p <= per_test)))

    if zero:
        status = "inconsistent"
        summary = (f"inconsistent with the target distribution: {zero} of {n} sampled tokens have "
                   f"probability zero under the source")
    elif not checked:
        status = "too-few"
        summary = (f"too few tokens: {n} sampled, {min_tokens} needed ({MIN_EXPECTED} expected per PIT "
                   f"bin over {bins} bins); nothing was checked")
    elif any(t.rejected for t in tests):
        status = "inconsistent"
        worst = min(tests, key=lambda t: t.p_value)
        summary = (f"inconsistent with the target distribution: {worst.name} p={worst.p_value:.3g} "
                   f"<= {per_test:.3g} (alpha {alpha:g} over {m} tests) on {n} tokens")
    else:
        status = "consistent"
        summary = (f"consistent with the target distribution: no test rejects at family-wise alpha "
                   f"{alpha:g} on {n} tokens; a binned-PIT TV of "
                   f"{detectable_tv(n, per_test, power, bins):.3g} or more would be caught with power "
                   f"{power:g}")
    return SamplingStats(
        status=status, passed=status == "consistent", n_tokens=n, min_tokens=min_tokens, alpha=alpha,
        per_test_alpha=per_test, power=power, bins=bins, seed=seed, tests=tests,
        pit_histogram=[int(c) for c in hist], pit_expected_per_bin=n / bins,
        rank_categories=rank_categories,
        rank_test_groups=["+".join(CATEGORIES[i] for i in g) for g in groups],
        top1_z=top1_z, zero_probability_tokens=zero,
        detectable_tv=detectable_tv(n, per_test, power, bins) if n else None,
        samples_needed=[TvTarget(tv=t, samples_needed=samples_needed(t, per_test, power, bins))
                        for t in tv_targets],
        summary=summary)


def sampling_verdict(draws: Sequence[TokenDraw], alpha: float = 0.01, bins: int = 20, seed: int = 0,
                     power: float = 0.8, tv_targets: Sequence[float] = (0.01, 0.02, 0.05)) -> SamplingStats:
    """Whether ``draws`` come from the source distribution (see the module docstring)."""
    return verdict_from_arrays(encode_draws(draws), alpha=alpha, bins=bins, seed=seed, power=power,
                               tv_targets=tv_targets)


def look_alphas(alpha: float, looks: int) -> list[float]:
    """The false-alarm rate spent at each look of a run that looks ``looks`` times and stops only to
    reject: alpha / (2 (looks - 1)) at each interim look and alpha / 2 at the last (alpha itself with
    one look). They add up to alpha, so by the union bound the chance that a correct sampler is
    rejected at any look is at most alpha, however the looks depend on each other."""
    if not 0 < alpha < 1:
        raise UsageError(f"alpha must be between 0 and 1, got {alpha}: give a false-alarm rate such as 0.01")
    if isinstance(looks, bool) or not isinstance(looks, int) or looks < 1:
        raise UsageError(f"looks must be an integer of at least 1, got {looks!r}")
    if looks == 1:
        return [alpha]
    return [alpha / (2 * (looks - 1))] * (looks - 1) + [alpha / 2]

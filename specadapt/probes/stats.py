"""Statistics for A/B comparisons: paired bootstrap intervals and the crossover load.

Formulas:
- ratio of means, paired: R = mean(x_off) / mean(x_on) for latencies (TPOT, E2E: > 1 means
  spec on is faster), R = rate_on / rate_off for output tokens/s where
  rate = sum(tokens) / sum(E2E) over the same pairs.
- 95% interval: percentile bootstrap over pairs (resample pair indices with replacement,
  B times, seeded), the 2.5th and 97.5th percentiles of R.
- crossover: the lowest tested concurrency whose ratio's point estimate is below 1;
  its estimate interpolates the point ratios linearly in log2(concurrency) between the last
  level at or above 1 and that level.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np

from specadapt.records import Crossover, RatioCI

DEFAULT_BOOTSTRAP = 2000


def paired_bootstrap(stat: Callable[[np.ndarray], float], columns: Sequence[Sequence[float]],
                     n_boot: int = DEFAULT_BOOTSTRAP, seed: int = 0, level: float = 0.95) -> RatioCI:
    """``stat`` on the paired data (rows = pairs, given as columns), with a percentile interval."""
    data = np.asarray(columns, dtype=float).T  # [n_pairs, n_columns]
    n = data.shape[0]
    if n == 0:
        return RatioCI(point=None, n=0)
    point = stat(data)
    if n < 2:
        return RatioCI(point=point, n=n)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n, size=(n_boot, n))
    boots = np.array([stat(data[row]) for row in idx])
    boots = boots[np.isfinite(boots)]
    alpha = (1 - level) / 2
    low, high = np.quantile(boots, [alpha, 1 - alpha]) if boots.size else (None, None)
    return RatioCI(point=float(point), low=float(low), high=float(high), n=n)


def _mean_ratio(data: np.ndarray) -> float:
    """mean(col 0) / mean(col 1)."""
    den = data[:, 1].mean()
    return float(data[:, 0].mean() / den) if den else math.nan


def latency_speedup(off: Sequence[float], on: Sequence[float], **kw) -> RatioCI:
    """mean(off) / mean(on) over pairs: > 1 means spec on has lower latency."""
    return paired_bootstrap(_mean_ratio, [off, on], **kw)


def _rate_ratio(data: np.ndarray) -> float:
    """(sum tok_on / sum t_on) / (sum tok_off / sum t_off); columns tok_off, t_off, tok_on, t_on."""
    tok_off, t_off, tok_on, t_on = (data[:, i].sum() for i in range(4))
    if not (t_off and t_on and tok_off):
        return math.nan
    return float((tok_on / t_on) / (tok_off / t_off))


def throughput_ratio(tokens_off: Sequence[float], time_off: Sequence[float], tokens_on: Sequence[float],
                     time_on: Sequence[float], **kw) -> RatioCI:
    """Output tokens/s on / off over pairs (each side's tokens over its time)."""
    return paired_bootstrap(_rate_ratio, [tokens_off, time_off, tokens_on, time_on], **kw)


def find_crossover(levels: Sequence[int], ratios: Sequence[float | None]) -> Crossover:
    pts = [(c, r) for c, r in sorted(zip(levels, ratios)) if r is not None]
    if not pts:
        return Crossover(status="unknown", text="no ratios measured")
    if all(r >= 1 for _, r in pts):
        return Crossover(status="faster-everywhere", last_faster=pts[-1][0],
                         text=f"spec on is faster at every tested concurrency (up to {pts[-1][0]})")
    if pts[0][1] < 1:
        return Crossover(status="never-faster", first_slower=pts[0][0],
                         text=f"spec on is slower already at concurrency {pts[0][0]}")
    for (c0, r0), (c1, r1) in zip(pts, pts[1:]):
        if r0 >= 1 > r1:
            x0, x1 = math.log2(c0), math.log2(c1)
            x = x0 + (r0 - 1) / (r0 - r1) * (x1 - x0)
            est = 2 ** x
            return Crossover(status="crosses", last_faster=c0, first_slower=c1, estimate=est,
                             text=f"spec on is faster up to concurrency {c0} and slower from {c1} "
                                  f"(crossover near {est:.1f})")
    raise AssertionError("unreachable: a ratio below 1 follows one at or above 1")

"""Run until decided: the anytime-valid t confidence sequence on the units' log ratios and its verdict.

Units and their log ratios d_1..d_n are today's (analysis/stats.py). With nu = n - 1, the mean
x̄, the sd s (ddof 1), se = s / sqrt(n), r = phi / (phi + n) and A = (r alpha^2)^(1/(nu+1)):

    CS_n = x̄ +- se * sqrt(nu (1 - A) / (A - r)),   given when n >= 2 and A > r.

It is the set of means m where the normal-mixture Bayes factor of the t statistic
t = (x̄ - m) / se stays below 1/alpha:

    sqrt(r) * ((1 + t^2/nu) / (1 + r t^2/nu))^((nu+1)/2) < 1/alpha

(a normal mixture of prior precision phi over the standardized effect, and the right-Haar
prior on sigma; Lindon, Ham, Tingley and Bojinov 2024; Wang and Ramdas, arXiv:2310.03722).
The ratio of the mixture and null likelihoods is a nonnegative martingale under the null, so by
Ville's inequality the sequence covers the true mean at every n at once with probability at
least 1 - alpha: looking after every unit and stopping at will keeps the error rate. The
factor is bounded by r^(-nu/2) (as t grows), so no interval exists until r^nu < alpha^2, that
is A > r: smallest_deciding_units.

The sequence is exact for Gaussian log ratios. When each unit lands in one of two states (a quiet
or a busy moment of the machine), the first few units can all fall in one state, and their t
statistic looks decisive: looking from the first interval on, false alarms reach about 17-24%
(benchmarks/sequential_design.py); hence a first look, the fewest units before the rule may
stop (6 by default: false alarms about 4.5% there, at most 2.8% for Gaussian or t units).

Verdict after each unit from the first look on (SequentialDesign.first_look), on exp of the sequence: "faster" when its low end is above 1, "slower"
when its high end is below 1, "equivalent" when it lies within (1/(1+delta), 1+delta) for a
margin delta, else go on; at the cap, "no clear difference" with the interval reached.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from specadapt.records import RatioCI
from specadapt.records.sequential import SequentialDesign

METHOD = "cs"


def _half_width_factor(n: int, alpha: float, phi: float) -> float:
    """sqrt(nu (1 - A) / (A - r)) at n >= 1 units; nan where no interval exists yet (A <= r, which
    includes n = 1)."""
    r = phi / (phi + n)
    a = (r * alpha * alpha) ** (1.0 / n)
    if a <= r:
        return math.nan
    return math.sqrt((n - 1) * (1.0 - a) / (a - r))


def cs_bounds(logs, alpha: float, phi: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(low, mean, high) of the confidence sequence for the mean at n = the last axis' length (at
    least 1), vectorised over the leading axes (as stats.t_bounds); low/high are nan where the
    rule gives no interval yet (n < smallest_deciding_units)."""
    x = np.asarray(logs)
    n = x.shape[-1]
    mean = x.mean(axis=-1)
    if n < 2:
        nan = np.full_like(mean, np.nan)
        return nan, mean, nan.copy()
    half = _half_width_factor(n, alpha, phi) * x.std(axis=-1, ddof=1) / math.sqrt(n)
    return mean - half, mean, mean + half


def smallest_deciding_units(alpha: float, phi: float) -> int:
    """The least n >= 2 at which the sequence gives an interval (A > r, that is r^(n-1) < alpha^2)."""
    n = 2
    while math.isnan(_half_width_factor(n, alpha, phi)):
        n += 1
    return n


def cs_ratio(log_ratios: Sequence[float | None], unit: str, design: SequentialDesign) -> RatioCI:
    """The ratio exp(mean d) over the units' log ratios d (None or non-finite ones left out), with
    the confidence sequence from smallest_deciding_units on (point only below)."""
    x = np.array([v for v in log_ratios if v is not None and math.isfinite(v)])
    n = int(x.size)
    min_n = smallest_deciding_units(design.alpha, design.phi)
    common = dict(n=n, unit=unit, method=METHOD, level=1.0 - design.alpha, min_n=min_n, too_few=n < min_n)
    if n == 0:
        return RatioCI(point=None, **common)
    if n < min_n:
        return RatioCI(point=math.exp(x.mean()), **common)
    low, mean, high = cs_bounds(x, design.alpha, design.phi)
    return RatioCI(point=math.exp(mean), low=math.exp(low), high=math.exp(high), **common)


@dataclass(frozen=True)
class Decision:
    """The rule's call after a unit: ``verdict`` None means go on."""

    verdict: str | None
    interval: RatioCI


def interval_decision(low: float | None, high: float | None, margin: float | None) -> str | None:
    """faster (low > 1), slower (high < 1), equivalent (1/(1+margin) < low and high < 1+margin),
    else None."""
    if low is None or high is None:
        return None
    if low > 1.0:
        return "faster"
    if high < 1.0:
        return "slower"
    if margin is not None and 1.0 / (1.0 + margin) < low and high < 1.0 + margin:
        return "equivalent"
    return None


def fewest_units_to_decide(design: SequentialDesign) -> int:
    """The fewest units at which the rule can give a verdict other than at the cap: the first
    interval, the first look and the run's own floor, whichever comes last. A cap below it cannot
    decide."""
    return max(smallest_deciding_units(design.alpha, design.phi), design.first_look, design.min_units)


def decide(log_ratios: Sequence[float | None], design: SequentialDesign, capped: bool,
           unit: str = "pairs") -> Decision:
    """The verdict on the primary ratio's log ratios so far; ``capped``: the cap is reached, so an
    undecided interval gives "no clear difference". Below the first look or the run's floor
    (``design.first_look``, ``design.min_units``) the interval decides nothing."""
    interval = cs_ratio(log_ratios, unit, design)
    verdict = interval_decision(interval.low, interval.high, design.margin)
    if interval.n < max(design.first_look, design.min_units):
        verdict = None
    if verdict is None and capped:
        verdict = "no clear difference"
    return Decision(verdict=verdict, interval=interval)


def requests_text(requests: int, fixed: int | None) -> str:
    """'12 requests against 50 for the fixed design (76% fewer)' (or 'more'); without a fixed
    count, '12 requests'."""
    if fixed is None or fixed <= 0:
        return f"{requests} requests"
    saved = 1 - requests / fixed
    how = f"{saved:.0%} fewer" if saved >= 0 else f"{-saved:.0%} more"
    return f"{requests} requests against {fixed} for the fixed design ({how})"

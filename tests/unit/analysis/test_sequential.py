"""The run-until-decided rule (analysis/sequential.py): the confidence sequence against the
mixture Bayes factor it inverts, solved here numerically; its first interval by brute force;
its time-uniform coverage by simulation; the verdicts at their boundaries; the first look.

The Bayes factor of the t statistic t at n units (nu = n - 1, r = phi / (phi + n)) is
sqrt(r) ((1 + t^2/nu) / (1 + r t^2/nu))^((nu+1)/2); the sequence is where it stays below 1/alpha.
"""

import math

import numpy as np
import pytest
from pydantic import ValidationError
from scipy.optimize import brentq

from specadapt.analysis.sequential import (
    Decision,
    cs_bounds,
    cs_ratio,
    decide,
    fewest_units_to_decide,
    interval_decision,
    smallest_deciding_units,
)
from specadapt.analysis.stats import t_bounds
from specadapt.records import SequentialDesign


def log_bayes_factor(t: float, n: int, phi: float) -> float:
    nu, r = n - 1, phi / (phi + n)
    return 0.5 * math.log(r) + (nu + 1) / 2 * (math.log1p(t * t / nu) - math.log1p(r * t * t / nu))


def solved_bounds(x, alpha: float, phi: float) -> tuple[float, float]:
    """The interval by solving bayes_factor(t) = 1/alpha for t > 0 (the factor grows with |t|)."""
    x = [float(v) for v in x]
    n = len(x)
    mean = math.fsum(x) / n
    se = math.sqrt(math.fsum((v - mean) ** 2 for v in x) / (n - 1)) / math.sqrt(n)
    t = brentq(lambda t: log_bayes_factor(t, n, phi) - math.log(1 / alpha), 0.0, 1e8, xtol=1e-12, rtol=1e-14)
    return mean - t * se, mean + t * se


@pytest.mark.parametrize("alpha,phi,n", [(0.05, 1.0, 5), (0.05, 1.0, 30), (0.05, 0.1, 3), (0.05, 0.1, 12),
                                         (0.01, 0.5, 9), (0.1, 4.0, 20), (0.05, 0.1, 200)])
def test_the_sequence_is_where_the_mixture_bayes_factor_stays_below_one_over_alpha(alpha, phi, n):
    x = np.random.default_rng(n).normal(0.3, 0.25, n)
    low, mean, high = cs_bounds(x, alpha, phi)
    want_low, want_high = solved_bounds(x, alpha, phi)
    assert float(mean) == pytest.approx(float(np.mean(x)), rel=1e-12)
    assert float(low) == pytest.approx(want_low, rel=1e-9, abs=1e-12)
    assert float(high) == pytest.approx(want_high, rel=1e-9, abs=1e-12)


def test_a_hand_computed_interval():
    # x = 0.1 .. 0.6: mean 0.35, sd sqrt(0.035) = 0.187083, se 0.0763763; phi 1, alpha 0.05:
    # r = 1/7, A = (0.0025/7)^(1/6) = 0.266363, factor sqrt(5 (1 - A) / (A - r)) = 5.449820
    low, mean, high = cs_bounds([0.1, 0.2, 0.3, 0.4, 0.5, 0.6], 0.05, 1.0)
    assert float(mean) == pytest.approx(0.35)
    half = 0.0763763 * 5.449820
    assert float(low) == pytest.approx(0.35 - half, abs=2e-6)
    assert float(high) == pytest.approx(0.35 + half, abs=2e-6)


def test_the_bounds_are_vectorised_over_leading_axes():
    x = np.random.default_rng(1).normal(0, 1, (3, 4, 10))
    low, mean, high = cs_bounds(x, 0.05, 0.5)
    assert low.shape == mean.shape == high.shape == (3, 4)
    for i in range(3):
        for j in range(4):
            want = solved_bounds(x[i, j], 0.05, 0.5)
            assert (low[i, j], high[i, j]) == pytest.approx(want, rel=1e-9)


def test_the_sequence_is_wider_than_the_fixed_t_interval():
    x = np.random.default_rng(2).normal(0, 1, (50, 12))
    low, _, high = cs_bounds(x, 0.05, 0.1)
    t_low, _, t_high = t_bounds(x, 0.95)
    assert np.all(high - low > t_high - t_low)


def test_the_width_does_not_move_with_a_shift_and_scales_with_the_sd():
    x = np.random.default_rng(3).normal(0, 0.3, 15)
    low, mean, high = cs_bounds(x, 0.05, 0.1)
    s_low, s_mean, s_high = cs_bounds(x + 0.7, 0.05, 0.1)
    assert float(s_high - s_low) == pytest.approx(float(high - low), rel=1e-12)
    assert float(s_mean) == pytest.approx(float(mean) + 0.7)
    assert float(s_low) == pytest.approx(float(low) + 0.7)
    k_low, _, k_high = cs_bounds(x * 2.5, 0.05, 0.1)
    assert float(k_high - k_low) == pytest.approx(2.5 * float(high - low), rel=1e-12)
    assert float(k_low) == pytest.approx(2.5 * float(low), rel=1e-12)


def brute_smallest(alpha: float, phi: float) -> int:
    """The least n >= 2 at which some t makes the Bayes factor reach 1/alpha (t -> inf: its bound)."""
    n = 2
    while log_bayes_factor(1e150, n, phi) <= math.log(1 / alpha):  # the factor's supremum over t, to float precision
        n += 1
    return n


@pytest.mark.parametrize("alpha", [0.2, 0.1, 0.05, 0.01, 0.001])
@pytest.mark.parametrize("phi", [0.01, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 10.0])
def test_the_smallest_deciding_units_by_brute_force(alpha, phi):
    n = smallest_deciding_units(alpha, phi)
    assert n == brute_smallest(alpha, phi)
    x = np.random.default_rng(0).normal(0, 1, n)
    low, _, high = cs_bounds(x, alpha, phi)
    assert np.isfinite(low) and np.isfinite(high)
    if n > 2:
        low, _, high = cs_bounds(x[:-1], alpha, phi)
        assert np.isnan(low) and np.isnan(high)


def test_the_smallest_deciding_units_by_hand():
    # phi 1, alpha 0.05: needs r^(n-1) < 0.0025; n = 4: (1/5)^3 = 0.008; n = 5: (1/6)^4 = 0.00077
    assert smallest_deciding_units(0.05, 1.0) == 5
    # phi 0.1: n = 2: 0.1/2.1 = 0.048 > 0.0025; n = 3: (0.1/3.1)^2 = 0.00104
    assert smallest_deciding_units(0.05, 0.1) == 3


def test_where_the_factors_bound_equals_one_over_alpha_there_is_no_interval_yet():
    # phi 1, n 3: r = 1/4; alpha 1/4: A = (1/4 * 1/16)^(1/3) = 1/4 = r exactly, and the factor's
    # bound r^(-nu/2) = 4 = 1/alpha is approached, never reached
    assert smallest_deciding_units(0.25, 1.0) == 4
    low, _, high = cs_bounds([0.1, 0.2, 0.4], 0.25, 1.0)
    assert np.isnan(low) and np.isnan(high)


def test_no_numerical_warning_before_the_first_interval(recwarn):
    x = np.random.default_rng(4).normal(0, 1, (5, 3))
    for n in (1, 2, 3):
        low, _, high = cs_bounds(x[:, :n], 0.05, 4.0)
        assert np.all(np.isnan(low)) and np.all(np.isnan(high))
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning)]


def test_one_unit_gives_no_interval():
    low, mean, high = cs_bounds(np.array([[0.4], [0.2]]), 0.05, 0.1)
    assert np.all(np.isnan(low)) and np.all(np.isnan(high))
    assert mean.tolist() == [0.4, 0.2]


def test_the_sequence_covers_at_every_look_at_once():
    """Looks after every unit up to 40 (20,000 Gaussian runs): the share ever missing the mean stays
    at or below alpha (Ville's inequality), and not far below (a much wider interval would fail)."""
    rng = np.random.default_rng(7)
    truth = math.log(1.2)
    x = rng.normal(truth, 0.3, (20_000, 40))
    missed = np.zeros(20_000, dtype=bool)
    for n in range(smallest_deciding_units(0.05, 0.1), 41):
        low, _, high = cs_bounds(x[:, :n], 0.05, 0.1)
        missed |= (low > truth) | (high < truth)
    assert 0.015 <= missed.mean() <= 0.05, missed.mean()


def test_cs_ratio_leaves_out_missing_and_infinite_units():
    design = SequentialDesign()
    logs = [0.41, 0.38, 0.45, 0.40, 0.36, 0.43, 0.39]
    clean = cs_ratio(logs, "pairs", design)
    messy = cs_ratio(logs[:3] + [None, math.inf, -math.inf, math.nan] + logs[3:], "pairs", design)
    assert messy == clean
    assert clean.n == 7 and clean.method == "cs" and clean.level == pytest.approx(0.95) and clean.unit == "pairs"
    low, mean, high = solved_bounds(logs, 0.05, design.phi)[0], np.mean(logs), solved_bounds(logs, 0.05, design.phi)[1]
    assert clean.point == pytest.approx(math.exp(mean))
    assert (clean.low, clean.high) == pytest.approx((math.exp(low), math.exp(high)), rel=1e-9)
    assert clean.min_n == smallest_deciding_units(0.05, design.phi) and not clean.too_few


def test_cs_ratio_from_the_first_interval_on_at_the_designs_level():
    # r^(n-1) < alpha^2 = 0.01 fails at n = 6 ((4/10)^5 = 0.0102) and holds at 7 ((4/11)^6 = 0.0023)
    design = SequentialDesign(phi=4.0, alpha=0.1)
    n = smallest_deciding_units(0.1, 4.0)
    assert n == 7
    logs = [0.1, 0.2, 0.3, 0.2, 0.1, 0.3, 0.25, 0.15][:n]
    ratio = cs_ratio(logs, "pairs", design)
    assert not ratio.too_few and ratio.n == n == ratio.min_n
    assert ratio.level == pytest.approx(0.9)
    want_low, want_high = solved_bounds(logs, 0.1, 4.0)
    assert (ratio.low, ratio.high) == pytest.approx((math.exp(want_low), math.exp(want_high)), rel=1e-9)


def test_cs_ratio_below_the_first_interval_gives_the_point_only():
    design = SequentialDesign(phi=4.0, alpha=0.05)  # first interval at 7 units
    ratio = cs_ratio([0.1, 0.2, 0.3, 0.2, 0.1, 0.3], "blocks", design)
    assert ratio.too_few and ratio.low is None and ratio.high is None and ratio.min_n == 7 and ratio.n == 6
    assert ratio.point == pytest.approx(math.exp(0.2))
    assert ratio.unit == "blocks"
    empty = cs_ratio([None, math.nan], "pairs", design)
    assert empty.point is None and empty.n == 0 and empty.too_few


@pytest.mark.parametrize("low,high,margin,want", [
    (1.0001, 1.5, None, "faster"), (1.0, 1.5, None, None), (0.5, 0.9999, None, "slower"), (0.5, 1.0, None, None),
    (0.97, 1.04, 0.05, "equivalent"), (1 / 1.05, 1.04, 0.05, None), (0.97, 1.05, 0.05, None),
    (1 / 1.05 + 1e-9, 1.05 - 1e-9, 0.05, "equivalent"), (0.97, 1.04, None, None),
    (1.01, 1.04, 0.05, "faster"), (0.97, 0.99, 0.05, "slower"), (None, None, 0.05, None),
    (None, 0.9, None, None), (1.1, None, None, None),
])
def test_the_interval_decides_at_its_boundaries(low, high, margin, want):
    assert interval_decision(low, high, margin) == want


def decisive(mean: float, n: int, sd: float = 0.05) -> list[float]:
    """n units with exactly this mean and a small spread (alternating +-sd around it)."""
    return [mean + (sd if i % 2 else -sd) for i in range(n - n % 2)] + ([mean] if n % 2 else [])


def test_decide_faster_slower_and_go_on():
    design = SequentialDesign()
    faster = decide(decisive(math.log(1.5), 8), design, capped=False)
    assert isinstance(faster, Decision) and faster.verdict == "faster" and faster.interval.low > 1
    assert decide(decisive(-math.log(1.5), 8), design, capped=False).verdict == "slower"
    noisy = decide(decisive(0.02, 8, sd=0.5), design, capped=False)
    assert noisy.verdict is None and noisy.interval.low < 1 < noisy.interval.high


def test_at_the_cap_an_undecided_interval_is_no_clear_difference_with_the_interval_reached():
    design = SequentialDesign()
    logs = decisive(0.02, 10, sd=0.5)
    capped = decide(logs, design, capped=True)
    assert capped.verdict == "no clear difference"
    assert capped.interval == cs_ratio(logs, "pairs", design)
    assert decide(decisive(math.log(1.5), 10), design, capped=True).verdict == "faster"


def test_equivalent_within_the_margin_only_when_one_is_given():
    logs = decisive(0.0, 30, sd=0.01)
    assert decide(logs, SequentialDesign(margin=0.05), capped=False).verdict == "equivalent"
    assert decide(logs, SequentialDesign(), capped=False).verdict is None
    assert decide(logs, SequentialDesign(margin=0.001), capped=False).verdict is None


def test_the_rule_stops_no_earlier_than_the_first_look():
    design = SequentialDesign(first_look=6)
    logs = decisive(math.log(2.0), 6)
    assert decide(logs[:5], design, capped=False).verdict is None
    assert decide(logs[:5], design, capped=False).interval.low > 1  # the interval would have decided
    assert decide(logs, design, capped=False).verdict == "faster"
    assert decide(logs[:5], design, capped=True).verdict == "no clear difference"
    assert decide(logs[:5], SequentialDesign(first_look=5), capped=False).verdict == "faster"


def test_the_runs_own_floor_holds_the_verdict_back_too():
    design = SequentialDesign(min_units=12)
    logs = decisive(math.log(2.0), 12)
    assert decide(logs[:11], design, capped=False).verdict is None
    assert decide(logs, design, capped=False).verdict == "faster"
    assert decide(logs[:11] + [None], design, capped=False).verdict is None  # a missing unit does not count


def test_the_unit_is_the_callers():
    assert decide(decisive(0.3, 8), SequentialDesign(), capped=False, unit="blocks").interval.unit == "blocks"


def test_the_fewest_units_to_decide_is_the_latest_of_the_three_floors():
    assert fewest_units_to_decide(SequentialDesign(phi=0.1, first_look=2)) == 3
    assert fewest_units_to_decide(SequentialDesign(phi=4.0, first_look=2)) == 7
    assert fewest_units_to_decide(SequentialDesign(phi=0.1, first_look=6)) == 6
    assert fewest_units_to_decide(SequentialDesign(phi=0.1, first_look=6, min_units=12)) == 12
    assert fewest_units_to_decide(SequentialDesign()) == 6


def test_the_design_refuses_impossible_values():
    for bad in (dict(alpha=0.0), dict(alpha=1.0), dict(phi=0.0), dict(margin=0.0), dict(max_units=1),
                dict(first_look=1), dict(min_units=-1), dict(fail_divergences=0), dict(primary="ttft")):
        with pytest.raises(ValidationError):
            SequentialDesign(**bad)

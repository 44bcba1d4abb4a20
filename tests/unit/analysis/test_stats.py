"""The interval method of compare (analysis/stats.py): coverage by simulation, the least number
of units, the cluster unit, pairing, the ratios' directions, verdicts and the crossover.

Simulations are vectorised and seeded: each coverage figure comes from 20,000 simulated data
sets at once (binomial sd of a 95% coverage: 0.0015), so a tolerance of +-0.006 holds a 95%
interval to 95% and fails a 90% or a 99% one.
"""

import math

import numpy as np
import pytest
from scipy import stats as sps

from specadapt.analysis.stats import (
    LEVEL,
    MIN_UNITS,
    find_crossover,
    log_latency_ratio,
    log_rate_ratio,
    ratio_ci,
    t_bounds,
)
from specadapt.records import RatioCI

SETS = 20_000


def coverage(data: np.ndarray, truth: float) -> float:
    """Share of the data sets (rows) whose interval, from the code under test, holds the truth."""
    low, _, high = t_bounds(data)
    return float(np.mean((low <= truth) & (truth <= high)))


@pytest.mark.parametrize("n", [2, 5, 10, 30])
def test_the_interval_covers_95_percent_of_normal_log_ratios_at_every_n(n):
    rng = np.random.default_rng(n)
    truth = math.log(1.3)
    cov = coverage(rng.normal(truth, 0.2, (SETS, n)), truth)
    assert abs(cov - 0.95) <= 0.006, cov


def test_the_stated_level_is_95_percent():
    assert LEVEL == 0.95
    assert ratio_ci([0.1, 0.2, 0.3, 0.1, 0.2], "pairs").level == 0.95


def two_state(rng, n: int, sd: float) -> np.ndarray:
    """Symmetric two-state noise: each unit lands in a quiet or a busy moment (+-1), plus
    continuous noise of sd ``sd`` (in units of the jump); the true mean is 0."""
    return rng.choice([-1.0, 1.0], (SETS, n)) + rng.normal(0.0, sd, (SETS, n))


def test_two_state_noise_is_why_there_is_no_interval_below_min_units():
    rng = np.random.default_rng(7)
    below = [coverage(two_state(rng, n, 0.2), 0.0) for n in range(2, MIN_UNITS)]
    assert max(below) < 0.90, below  # 0.79, 0.76, 0.88 at n = 2, 3, 4
    from_min = [coverage(two_state(rng, n, 0.2), 0.0) for n in range(MIN_UNITS, MIN_UNITS + 6)]
    assert min(from_min) >= 0.925, from_min  # 0.93 to 0.96 at n = 5..10
    assert MIN_UNITS == 5


def test_heavy_tails_cover_at_least_95_percent_from_min_units():
    rng = np.random.default_rng(3)
    for n in (MIN_UNITS, 10, 30):
        cov = coverage(rng.standard_t(3, (SETS, n)), 0.0)  # symmetric, heavy-tailed: conservative
        assert 0.944 <= cov <= 0.975, (n, cov)


def test_skewed_noise_undercovers_a_little_at_every_n():
    """Skewness 1 (gamma, shape 4): about 0.93 from 3 to 30 units; documented, not hidden."""
    rng = np.random.default_rng(4)
    for n in (MIN_UNITS, 10, 30):
        cov = coverage(rng.gamma(4.0, 1.0, (SETS, n)), 4.0)
        assert 0.92 <= cov < 0.947, (n, cov)


def test_the_block_is_the_unit_a_per_pair_interval_would_not_cover():
    """Six blocks of 16 requests sharing a block effect (the machine's state during the block):
    the interval over block means covers 95%; over the 96 requests as if independent it does not."""
    rng = np.random.default_rng(11)
    blocks, per_block, truth = 6, 16, 0.02
    data = truth + rng.normal(0, 0.03, (SETS, blocks, 1)) + rng.normal(0, 0.03, (SETS, blocks, per_block))
    by_block = coverage(data.mean(axis=2), truth)
    per_pair = coverage(data.reshape(SETS, blocks * per_block), truth)
    assert abs(by_block - 0.95) <= 0.006, by_block
    assert per_pair < 0.60, per_pair


def test_the_interval_is_scipy_s_t_interval_on_the_log_scale():
    logs = [0.12, 0.31, 0.05, 0.22, 0.18, 0.27]
    r = ratio_ci(logs, unit="blocks")
    lo, hi = sps.t.interval(0.95, len(logs) - 1, loc=np.mean(logs), scale=sps.sem(logs))
    assert r.point == pytest.approx(math.exp(np.mean(logs)))
    assert (r.low, r.high) == (pytest.approx(math.exp(lo)), pytest.approx(math.exp(hi)))
    assert (r.n, r.unit, r.method, r.min_n, r.too_few) == (6, "blocks", "t", MIN_UNITS, False)


def test_below_min_units_the_point_only_and_too_few():
    logs = [0.1, 0.3, 0.2, 0.4][: MIN_UNITS - 1]
    r = ratio_ci(logs, unit="blocks")
    assert r.point == pytest.approx(math.exp(np.mean(logs)))
    assert (r.low, r.high, r.too_few, r.n) == (None, None, True, MIN_UNITS - 1)
    assert r.verdict == "no clear difference"
    at_min = ratio_ci([0.1, 0.3, 0.2, 0.4, 0.25][:MIN_UNITS], "blocks")
    assert not at_min.too_few and at_min.low is not None


def test_another_level_is_recorded_and_changes_the_width():
    logs = [0.12, 0.31, 0.05, 0.22, 0.18, 0.27]
    r90, r95 = ratio_ci(logs, "pairs", level=0.90), ratio_ci(logs, "pairs")
    lo, hi = sps.t.interval(0.90, len(logs) - 1, loc=np.mean(logs), scale=sps.sem(logs))
    assert (r90.level, r90.low, r90.high) == (0.90, pytest.approx(math.exp(lo)), pytest.approx(math.exp(hi)))
    assert r95.low < r90.low and r90.high < r95.high
    assert ratio_ci(logs, "pairs", min_units=7).too_few and ratio_ci(logs, "pairs", min_units=7).min_n == 7


def test_missing_and_infinite_units_are_left_out():
    r = ratio_ci([0.1, None, math.inf, 0.2, 0.3, math.nan, 0.2, 0.1], "pairs")
    assert r.n == 5 and r.point == pytest.approx(math.exp(0.18))
    empty = ratio_ci([None, math.nan], "blocks")
    assert (empty.point, empty.n, empty.too_few, empty.unit) == (None, 0, True, "blocks")


def test_pairing_removes_a_shared_prompt_effect():
    """Latencies spread over 20x between prompts, spec on 1.25x faster on each: the paired
    interval is narrow; a comparison of the two sides' means would span 1."""
    rng = np.random.default_rng(5)
    prompt = np.exp(rng.normal(0, 1.0, 12))
    off = prompt * 1.25 * np.exp(rng.normal(0, 0.02, 12))
    on = prompt * np.exp(rng.normal(0, 0.02, 12))
    r = ratio_ci([log_latency_ratio([a], [b]) for a, b in zip(off, on)], "pairs")
    assert 1.2 < r.low and r.high < 1.3
    unpaired = sps.ttest_ind(np.log(off), np.log(on)).confidence_interval()
    assert unpaired.low < 0 < unpaired.high  # what an unpaired interval would say


def test_latency_ratio_is_off_over_on():
    assert log_latency_ratio([30.0, 50.0], [20.0]) == pytest.approx(math.log(2.0))
    assert log_latency_ratio([20.0], [40.0]) == pytest.approx(math.log(0.5))
    assert log_latency_ratio([], [1.0]) is None and log_latency_ratio([1.0], []) is None
    assert log_latency_ratio([0.0], [1.0]) is None and log_latency_ratio([1.0], [0.0]) is None
    assert log_latency_ratio([0.5], [0.25]) == pytest.approx(math.log(2.0))  # means below 1 are fine


def test_rate_ratio_is_on_over_off_with_each_side_s_tokens():
    # off: 50 tokens in 1 s; on: 300 tokens in 2 s -> 150 / 50 = 3
    assert log_rate_ratio(50, 1.0, 300, 2.0) == pytest.approx(math.log(3.0))
    assert log_rate_ratio(300, 2.0, 50, 1.0) == pytest.approx(math.log(1 / 3))
    for bad in [(0, 1, 1, 1), (1, 0, 1, 1), (1, 1, 0, 1), (1, 1, 1, 0)]:
        assert log_rate_ratio(*bad) is None


@pytest.mark.parametrize("low, high, verdict", [(1.0, 1.4, "no clear difference"), (1.0001, 1.4, "faster"),
                                                (0.7, 1.0, "no clear difference"), (0.7, 0.9999, "slower"),
                                                (None, None, "no clear difference")])
def test_verdict_needs_the_whole_interval_beyond_1(low, high, verdict):
    r = RatioCI(point=1.2 if verdict != "slower" else 0.8, low=low, high=high, n=6)
    assert r.verdict == verdict
    assert r.model_dump()["verdict"] == verdict  # in the JSON report too
    assert (r.significant_faster, r.significant_slower) == (verdict == "faster", verdict == "slower")


@pytest.mark.parametrize("low, high, verdict", [(1.2, 0.8, "faster"), (None, 0.9, "slower"), (1.1, None, "faster"),
                                                (0.9, 1.1, "no clear difference")])
def test_verdict_of_each_end_alone(low, high, verdict):
    """The low end decides "faster" before the high end decides "slower"; each end alone decides."""
    assert RatioCI(point=1.0, low=low, high=high).verdict == verdict


def ci(point: float, half: float = 0.05, n: int = 8, unit: str = "pairs") -> RatioCI:
    return RatioCI(point=point, low=point - half, high=point + half, n=n, unit=unit, method="t", min_n=MIN_UNITS)


def few(point: float, n: int = 3) -> RatioCI:
    return RatioCI(point=point, n=n, unit="blocks", method="t", min_n=MIN_UNITS, too_few=True)


def test_crossover_on_a_synthetic_curve():
    # ratio = 1.4 - 0.1 * log2(c): crosses 1 at c = 2**4 = 16
    levels = [1, 2, 4, 8, 32]
    x = find_crossover(levels, [ci(1.4 - 0.1 * np.log2(c), half=0.02) for c in levels])
    assert x.status == "crosses" and (x.last_faster, x.first_slower) == (8, 32)
    assert x.estimate == pytest.approx(16.0)
    assert x.verdicts == {1: "faster", 2: "faster", 4: "faster", 8: "faster", 32: "slower"}
    assert x.text == "spec on is faster at 1, 2, 4, 8 and slower at 32 (crossover near 16.0)"


def test_crossover_across_an_unclear_level_interpolates_where_the_points_cross():
    x = find_crossover([1, 4, 16], [ci(1.3), ci(1.1, half=0.2), ci(0.8)])
    assert (x.status, x.last_faster, x.first_slower) == ("crosses", 1, 16)
    assert x.estimate == pytest.approx(2 ** (2 + 0.1 / 0.3 * 2))
    assert x.text.endswith("(crossover near 6.3); no clear difference at 4")


def test_the_crossover_is_after_the_last_level_still_at_1():
    x = find_crossover([1, 4, 8, 16], [ci(1.3), ci(1.0, half=0.2), ci(1.0, half=0.2), ci(0.8)])
    assert (x.last_faster, x.first_slower, x.estimate) == (1, 16, pytest.approx(8.0))


def test_faster_everywhere_only_when_every_interval_is_above_1():
    x = find_crossover([1, 2, 4], [ci(1.3), ci(1.2), ci(1.1)])
    assert (x.status, x.last_faster, x.text) == ("faster-everywhere", 4,
                                                 "spec on is faster at every tested concurrency (1, 2, 4)")
    y = find_crossover([1, 2, 4], [ci(1.3), ci(1.2), ci(1.04)])
    assert (y.status, y.last_faster) == ("faster-at-some", 2)
    assert y.text == "spec on is faster at 1, 2; no clear difference at 4"
    assert y.verdicts == {1: "faster", 2: "faster", 4: "no clear difference"}
    z = find_crossover([1, 8, 16], [ci(1.3), few(1.5), few(1.2, n=2)])
    assert z.text == (f"spec on is faster at 1; no clear difference at 8, 16 (no interval at 8: 3 blocks, fewer "
                      f"than {MIN_UNITS}; 16: 2 blocks, fewer than {MIN_UNITS})")


def test_point_above_1_with_an_interval_across_1_is_no_clear_difference():
    """The A/A figure that was called 'faster': 1.02x [1.01, 1.04] from pairs is [0.90, 1.16] from blocks."""
    x = find_crossover([1, 16], [ci(1.07, half=0.12), ci(1.02, half=0.13, unit="blocks")])
    assert x.status == "no-clear-difference" and set(x.verdicts.values()) == {"no clear difference"}
    assert "faster" not in x.text


def test_too_few_units_is_no_clear_difference_and_says_why():
    x = find_crossover([1, 8], [ci(1.2, half=0.3), few(1.5)])
    assert x.status == "no-clear-difference" and x.verdicts == {1: "no clear difference", 8: "no clear difference"}
    assert x.text == ("no clear difference at any tested concurrency (1, 8): every interval includes 1.0x (1); "
                      f"no interval at 8: 3 blocks, fewer than {MIN_UNITS}")
    alone = find_crossover([8], [few(1.5)])
    assert alone.text == f"no clear difference at any tested concurrency (8): no interval at 8: 3 blocks, fewer than {MIN_UNITS}"


def test_never_faster_and_mixed():
    x = find_crossover([1, 2, 4], [ci(1.02), ci(0.9), ci(0.8)])
    assert (x.status, x.first_slower, x.last_faster) == ("never-faster", 2, None)
    assert x.text == "spec on is slower at 2, 4 and faster at none; no clear difference at 1"
    assert x.verdicts == {1: "no clear difference", 2: "slower", 4: "slower"}
    m = find_crossover([1, 2, 4], [ci(0.8), ci(1.0), ci(1.2)])
    assert (m.status, m.first_slower, m.last_faster) == ("mixed", 1, 4)
    assert m.verdicts == {1: "slower", 2: "no clear difference", 4: "faster"}
    assert m.text == "spec on is slower at 1 but faster at the higher 4; no clear difference at 2"


@pytest.mark.parametrize("speculation, why", [
    (False, "has no speculation counters (speculation looks off there)"),
    (None, "shows no speculation counters (speculation could not be confirmed)")])
def test_without_speculation_no_level_gets_a_speed_verdict(speculation, why):
    x = find_crossover([1, 4], [ci(1.5), ci(1.4)], speculation)
    assert x.status == "no-speculation" and x.verdicts == {1: "no speculation", 4: "no speculation"}
    assert x.text == f"no speed verdict: the spec-on server {why}, so a ratio would not measure speculative decoding"
    assert x.last_faster is None and x.estimate is None


def test_no_ratio_at_all_is_unknown():
    x = find_crossover([1, 2], [RatioCI(point=None), RatioCI(point=None)])
    assert (x.status, x.verdicts, x.text) == ("unknown", {}, "no ratios measured")

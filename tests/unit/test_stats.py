"""Bootstrap intervals and the crossover finder on synthetic data with a known truth."""

import numpy as np
import pytest

from specadapt.probes.stats import find_crossover, latency_speedup, throughput_ratio


def test_bootstrap_interval_covers_the_true_ratio_at_about_the_stated_rate():
    # TPOT off ~ N(50, 5), on ~ N(40, 5): true mean ratio 50 / 40 = 1.25
    rng = np.random.default_rng(1)
    trials, covered = 200, 0
    for t in range(trials):
        off = rng.normal(50, 5, 40)
        on = rng.normal(40, 5, 40)
        ci = latency_speedup(off, on, n_boot=400, seed=t)
        covered += ci.low <= 1.25 <= ci.high
    rate = covered / trials
    # 95% nominal; percentile bootstrap on n=40 runs a little narrow. Binomial sd ~1.5%.
    assert 0.89 <= rate <= 0.99, rate


def test_interval_brackets_the_point_and_narrows_with_more_data():
    rng = np.random.default_rng(2)
    small = latency_speedup(rng.normal(50, 5, 10), rng.normal(40, 5, 10), n_boot=500)
    big = latency_speedup(rng.normal(50, 5, 400), rng.normal(40, 5, 400), n_boot=500)
    for ci in (small, big):
        assert ci.low <= ci.point <= ci.high
    assert (big.high - big.low) < (small.high - small.low)
    assert big.significant_faster


def test_throughput_ratio_is_tokens_over_time_on_over_off():
    r = throughput_ratio([100, 100], [2.0, 2.0], [100, 100], [1.0, 1.0], n_boot=100)
    assert r.point == pytest.approx(2.0)
    assert r.low == pytest.approx(2.0) and r.high == pytest.approx(2.0)  # no variance, no width


def test_single_pair_has_no_interval():
    r = latency_speedup([50.0], [40.0])
    assert r.point == pytest.approx(1.25) and r.low is None and r.n == 1


def test_crossover_on_a_synthetic_curve():
    # ratio = 1.4 - 0.1 * log2(c): crosses 1 at c = 2**4 = 16
    levels = [1, 2, 4, 8, 32]
    ratios = [1.4 - 0.1 * np.log2(c) for c in levels]
    x = find_crossover(levels, ratios)
    assert x.status == "crosses" and (x.last_faster, x.first_slower) == (8, 32)
    assert x.estimate == pytest.approx(16.0)


@pytest.mark.parametrize("ratios, status", [([1.3, 1.2, 1.1], "faster-everywhere"),
                                            ([0.9, 0.8, 0.7], "never-faster"),
                                            ([None, None, None], "unknown")])
def test_crossover_edge_cases(ratios, status):
    assert find_crossover([1, 2, 4], ratios).status == status

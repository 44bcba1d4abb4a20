"""Benchmark: coverage of compare's 95% t interval by simulation, per number of units.

Not a test (tests/unit/analysis/test_stats.py holds the same claims as assertions). For each noise
shape and n, draws 40,000 data sets of n unit log ratios with a known mean and prints the
share whose interval (specadapt.analysis.stats.t_bounds) holds the mean; binomial sd 0.001.

    .venv/bin/python benchmarks/interval_coverage.py
"""

from __future__ import annotations

import numpy as np

from specadapt.analysis.stats import MIN_UNITS, t_bounds

SETS = 40_000
NS = [2, 3, 4, 5, 6, 8, 10, 15, 30]


def coverage(data: np.ndarray, truth: float) -> float:
    low, _, high = t_bounds(data)
    return float(np.mean((low <= truth) & (truth <= high)))


def main() -> None:
    rng = np.random.default_rng(0)

    def two_state(shape, sd):
        return rng.choice([-1.0, 1.0], shape) + rng.normal(0, sd, shape)

    def busy_moments(shape, p=0.1):  # quiet units (sd 0.3) and, with probability p, a one-sided +1 (sd 1)
        hit = rng.random(shape) < p
        return np.where(hit, rng.normal(1.0, 1.0, shape), rng.normal(0.0, 0.3, shape))

    shapes = {
        "normal": (lambda s: rng.normal(0, 1, s), 0.0),
        "heavy tails (t, 3 df)": (lambda s: rng.standard_t(3, s), 0.0),
        "two states, sd 0.5": (lambda s: two_state(s, 0.5), 0.0),
        "two states, sd 0.2": (lambda s: two_state(s, 0.2), 0.0),
        "two states, sd 0.1": (lambda s: two_state(s, 0.1), 0.0),
        "skewed (gamma, skewness 1)": (lambda s: rng.gamma(4.0, 1.0, s), 4.0),
        "skewed (exponential, skewness 2)": (lambda s: rng.exponential(1.0, s), 1.0),
        "one-sided busy moments (10%)": (lambda s: busy_moments(s), 0.1),
    }
    print(f"coverage of the 95% t interval ({SETS} data sets per cell; no interval below n = {MIN_UNITS})")
    print("| noise of the unit log ratios | " + " | ".join(f"n={n}" for n in NS) + " |")
    print("| --- |" + " --- |" * len(NS))
    for name, (draw, truth) in shapes.items():
        print(f"| {name} | " + " | ".join(f"{coverage(draw((SETS, n)), truth):.3f}" for n in NS) + " |")
    print("\nblocks sharing a state (block sd 0.03, request sd 0.03, 16 requests per block):")
    print("| blocks | interval over blocks | interval over the requests as if independent |")
    print("| --- | --- | --- |")
    for blocks in (MIN_UNITS, 8, 20):
        data = rng.normal(0, 0.03, (SETS, blocks, 1)) + rng.normal(0, 0.03, (SETS, blocks, 16))
        print(f"| {blocks} | {coverage(data.mean(axis=2), 0.0):.3f} | "
              f"{coverage(data.reshape(SETS, blocks * 16), 0.0):.3f} |")


if __name__ == "__main__":
    main()

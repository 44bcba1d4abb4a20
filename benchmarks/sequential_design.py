"""Benchmark: the run-until-decided rule against today's fixed design, by simulation.

Not a test (tests/unit/analysis/test_sequential.py holds the rule's formulas as assertions).
Each run draws the units' log ratios d_1..d_cap of one level, looks after every unit with the
rule (specadapt.analysis.sequential.cs_bounds: the anytime-valid t confidence sequence at
alpha 0.05) and stops at the first verdict: "faster" (interval above 0), "slower" (below 0),
or, at the cap, "no clear difference". Today's fixed design computes the 95% t interval
(specadapt.analysis.stats.t_bounds) once, over all its units. A request count is 2 per unit
(one off, one on request at concurrency 1).

(a) false alarms (true ratio 1.0, any verdict is false) with a look after every unit, for
    Gaussian units, heavy-tailed units (t, 3 df) and units whose mean drifts linearly within
    the run (from -D/2 to +D/2 sd over the cap: the run's mean is 0, the early units lean one
    way), against today's 95% t interval looked at in the same way;
(b) units to a verdict and the share of correct verdicts at true ratios 1.0-2.0 and per-unit
    sd 0.1-0.4 (Gaussian log ratios), against the fixed design of today's default compare
    (12 built-in prompts x --repeat 3 = 36 pairs) and a fixed 10 units;
(c) the mixing precision phi, over a grid, with the same data.

    nice -n 10 .venv/bin/python benchmarks/sequential_design.py [--runs 20000]
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np

from specadapt.analysis.sequential import cs_bounds, smallest_deciding_units
from specadapt.analysis.stats import MIN_UNITS, t_bounds
from specadapt.records import SequentialDesign

ALPHA = 0.05
CAP = SequentialDesign().max_units  # the default cap per level
DEFAULT_FIXED = 36  # today's default compare: 12 built-in prompts x --repeat 3, pairs at concurrency 1
SHORT_FIXED = 10
RATIOS = (1.0, 1.1, 1.5, 2.0)
SDS = (0.1, 0.2, 0.3, 0.4)
PHIS = (0.05, 0.1, 0.2, 0.5, 1.0, 2.0)
FIRST_LOOKS = (0, 6, 7, 8)


def sequential(x: np.ndarray, alpha: float, phi: float, first: int = 0, bounds=None) -> tuple[np.ndarray, np.ndarray]:
    """Looks after every unit from ``first`` to the last: (units used, verdict +1 faster / -1 slower / 0 none)."""
    runs, cap = x.shape
    units = np.full(runs, cap)
    verdict = np.zeros(runs, dtype=int)
    open_ = np.ones(runs, dtype=bool)
    for n in range(max(first, 2), cap + 1):
        low, _, high = bounds(x[open_, :n]) if bounds else cs_bounds(x[open_, :n], alpha, phi)
        call = np.where(low > 0, 1, np.where(high < 0, -1, 0))
        idx = np.flatnonzero(open_)
        hit = call != 0
        units[idx[hit]] = n
        verdict[idx[hit]] = call[hit]
        open_[idx[hit]] = False
        if not open_.any():
            break
    return units, verdict


def t_looks(x: np.ndarray, first: int) -> np.ndarray:
    """Share of runs that today's 95% t interval, looked at after every unit from ``first`` on, ever calls."""
    _, verdict = sequential(x, ALPHA, 1.0, first=first, bounds=lambda d: t_bounds(d))
    return verdict != 0


def fixed(x: np.ndarray, n: int) -> np.ndarray:
    low, _, high = t_bounds(x[:, :n])
    return np.where(low > 0, 1, np.where(high < 0, -1, 0))


def draw_null(rng: np.random.Generator, shape: str, runs: int, cap: int) -> np.ndarray:
    if shape == "gaussian":
        return rng.normal(0.0, 1.0, (runs, cap))
    if shape == "t3":
        return rng.standard_t(3, (runs, cap))
    if shape == "two states":  # a unit lands in a quiet or a busy moment (as benchmarks/interval_coverage.py)
        return rng.choice([-1.0, 1.0], (runs, cap)) + rng.normal(0.0, 0.2, (runs, cap))
    drift = float(shape.split()[1])
    return rng.normal(0.0, 1.0, (runs, cap)) + drift * (np.arange(cap) / (cap - 1) - 0.5)


def pct(v: float) -> str:
    return f"{100 * v:.1f}%"


def part_a(rng: np.random.Generator, runs: int, phi: float, first: int) -> None:
    print(f"\n### (a) False alarms with a look after every unit (true ratio 1.0; alpha {ALPHA}; {runs} runs per row)\n")
    print(f"| units | cap | rule: looks from unit {first} (the first look) | rule: looks from the first interval "
          f"(unit {smallest_deciding_units(ALPHA, phi)}) | 95% t, 10 looks (units {MIN_UNITS}-{MIN_UNITS + 9}) "
          f"| 95% t, looks at units {MIN_UNITS}-cap | 95% t, looks at units 2-cap | 95% t once, at the cap |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    names = {"gaussian": "Gaussian", "t3": "heavy-tailed (t, 3 df)", "two states": "two states (+-1, sd 0.2)",
             "drift 0.5": "drifting mean (-0.25 to +0.25 sd)", "drift 1": "drifting mean (-0.5 to +0.5 sd)"}
    for shape, name in names.items():
        for cap in (30, 60):
            x = draw_null(rng, shape, runs, cap)
            _, v = sequential(x, ALPHA, phi, first)
            _, v0 = sequential(x, ALPHA, phi)
            ten = t_looks(x[:, :MIN_UNITS + 9], MIN_UNITS).mean()
            print(f"| {name} | {cap} | {pct((v != 0).mean())} | {pct((v0 != 0).mean())} | {pct(ten)} | {pct(t_looks(x, MIN_UNITS).mean())} "
                  f"| {pct(t_looks(x, 2).mean())} | {pct((fixed(x, cap) != 0).mean())} |")


def part_b(rng: np.random.Generator, runs: int, phi: float, first: int) -> tuple[float, float]:
    print(f"\n### (b) Units to a verdict against the fixed design (Gaussian log ratios; cap {CAP}; {runs} runs per row)\n")
    print("Correct: \"faster\" when the true ratio is above 1, no verdict when it is 1.0; wrong: \"slower\" "
          "when above 1, any verdict at 1.0. Requests: 2 per unit; saved: 1 - the rule's mean units / the fixed "
          "design's units (negative: the rule sent more).\n")
    print("| true ratio | per-unit sd | rule: mean units (p90) | rule: correct | rule: wrong | saved vs fixed 36 "
          "| fixed 36: correct | fixed 36: wrong | saved vs fixed 10 | fixed 10: correct | fixed 10: wrong |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    saved_at = {}
    for ratio in RATIOS:
        for sd in SDS:
            x = rng.normal(math.log(ratio), sd, (runs, max(CAP, DEFAULT_FIXED)))
            units, v = sequential(x[:, :CAP], ALPHA, phi, first)
            f36, f10 = fixed(x, DEFAULT_FIXED), fixed(x, SHORT_FIXED)
            if ratio == 1.0:
                right = lambda w: (w == 0).mean()  # noqa: E731
                wrong = lambda w: (w != 0).mean()  # noqa: E731
            else:
                right = lambda w: (w == 1).mean()  # noqa: E731
                wrong = lambda w: (w == -1).mean()  # noqa: E731
            saved = 1 - units.mean() / DEFAULT_FIXED
            saved_at[(ratio, sd)] = saved
            print(f"| {ratio:.1f} | {sd:.1f} | {units.mean():.1f} ({np.percentile(units, 90):.0f}) | {pct(right(v))} "
                  f"| {pct(wrong(v))} | {pct(saved)} | {pct(right(f36))} | {pct(wrong(f36))} "
                  f"| {pct(1 - units.mean() / SHORT_FIXED)} | {pct(right(f10))} "
                  f"| {pct(wrong(f10))} |")
    return saved_at[(1.5, 0.1)], saved_at[(1.5, 0.2)]


def part_c(rng: np.random.Generator, runs: int) -> None:
    print(f"\n### (c) The mixing precision phi and the first look (the same data in every row; {runs} runs per cell)\n")
    print(f"Mean units to a verdict (cap {CAP}) at a true ratio and per-unit sd (Gaussian log ratios); false alarms: "
          "true ratio 1.0, a look after every unit from the first look up to the cap (60 unless said). First "
          "look: the fewest units before the rule may stop, whatever the interval (none: from the first interval "
          "on).\n")
    cells = [(1.5, 0.1), (1.5, 0.2), (1.5, 0.3), (1.5, 0.4), (1.1, 0.1), (2.0, 0.4)]
    data = {c: rng.normal(math.log(c[0]), c[1], (runs, CAP)) for c in cells}
    nulls = {name: draw_null(rng, shape, runs, 60) for name, shape in
             (("Gaussian", "gaussian"), ("t 3 df", "t3"), ("two states", "two states"))}
    nulls["two states, sd 0.1"] = rng.choice([-1.0, 1.0], (runs, 60)) + rng.normal(0.0, 0.1, (runs, 60))
    print("| phi | first look | fewest units | " + " | ".join(f"{r:.1f}x sd {s:.1f}" for r, s in cells)
          + " | mean of 1.5x sd 0.1-0.2 | " + " | ".join(f"false alarms: {name}" for name in nulls) + " |")
    print("| ---: | ---: | ---: |" + " ---: |" * (len(cells) + 1 + len(nulls)))
    for phi in PHIS:
        for first in FIRST_LOOKS:
            means = [sequential(data[c], ALPHA, phi, first)[0].mean() for c in cells]
            fa = [(sequential(x, ALPHA, phi, first)[1] != 0).mean() for x in nulls.values()]
            print(f"| {phi:g} | {first or 'none'} | {max(first, smallest_deciding_units(ALPHA, phi))} | "
                  + " | ".join(f"{m:.1f}" for m in means) + f" | {(means[0] + means[1]) / 2:.2f} | "
                  + " | ".join(pct(f) for f in fa) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    design = SequentialDesign()
    phi, first = design.phi, design.first_look
    start = time.monotonic()
    rng = np.random.default_rng(args.seed)
    print(f"rule: the anytime-valid t confidence sequence, alpha {ALPHA}, phi {phi:g}, first look at unit {first}, "
          f"cap {CAP} (the defaults); it gives an interval from unit {smallest_deciding_units(ALPHA, phi)}; "
          "binomial sd of a share near "
          f"{ALPHA}: {math.sqrt(ALPHA * (1 - ALPHA) / args.runs):.4f}")
    part_a(rng, args.runs, phi, first)
    lo, hi = part_b(rng, args.runs, phi, first)
    print(f"\nAt a true 1.5x the rule sends {pct(lo)} (sd 0.1) and {pct(hi)} (sd 0.2) fewer requests than the fixed 36 "
          "pairs of today's default compare.")
    part_c(rng, args.runs)
    print(f"\n({time.monotonic() - start:.0f} s)")


if __name__ == "__main__":
    main()

"""Statistics for A/B comparisons: per-unit log ratios, t intervals, verdicts, the crossover load.

Unit of independence. Requests that share the machine's state are not independent, so
the interval is computed over *units* whose noise is independent of each other's:
- concurrency 1: one off/on pair of the same (prompt, repeat), sent back to back;
- concurrency N > 1: one repeat's off block + on block (the blocks alternate off/on,
  on/off with the repeats); the requests inside a block share the block's state.

Per unit a log ratio d (> 0: spec on is faster):
- TPOT, E2E: d = log(mean off / mean on) over the unit's requests;
- output tokens/s: d = log(rate_on / rate_off), rate = output tokens / time; at
  concurrency 1 time is the request's E2E, for a block it is the block's wall time (first
  request sent to last request finished: what ``vllm bench serve`` calls output token
  throughput).

Point: exp(mean d). 95% interval: exp(mean d +- t_{n-1, 0.975} * sd(d) / sqrt(n)).
Below MIN_UNITS units only the point is given: with 2 to 4 units the t interval's coverage
collapses when the units' noise has two states (a unit lands in a quiet or a busy moment
of the machine) -- 0.64 to 0.88 in simulation for states +-1 plus noise of sd 0.1 to 0.2 --
and is about 0.93 or more from 5 units (benchmarks/interval_coverage.py, docs/compare.md,
tests/unit/analysis/test_stats.py).

Verdict of a ratio: faster when the interval's low end is above 1, slower when its high
end is below 1, otherwise (also without an interval) no clear difference.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy.special import stdtrit  # Student t quantile (what scipy.stats.t.ppf calls)

from specadapt.records import Crossover, RatioCI

LEVEL = 0.95
MIN_UNITS = 5
METHOD = "t"


def t_bounds(logs, level: float = LEVEL) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(low, mean, high) of the t interval for the mean, over the last axis (the units);
    vectorised, so a simulation can pass many data sets at once. Needs >= 2 units."""
    x = np.asarray(logs)
    n = x.shape[-1]
    mean = x.mean(axis=-1)
    half = stdtrit(n - 1, 0.5 + level / 2) * x.std(axis=-1, ddof=1) / math.sqrt(n)
    return mean - half, mean, mean + half


def ratio_ci(log_ratios: Sequence[float | None], unit: str, level: float = LEVEL,
             min_units: int = MIN_UNITS) -> RatioCI:
    """The ratio exp(mean d) over the units' log ratios d (None or non-finite ones left out),
    with its t interval from ``min_units`` units on."""
    x = np.array([v for v in log_ratios if v is not None and math.isfinite(v)])
    n = int(x.size)
    common = dict(n=n, unit=unit, method=METHOD, level=level, min_n=min_units, too_few=n < min_units)
    if n == 0:
        return RatioCI(point=None, **common)
    if n < min_units:
        return RatioCI(point=math.exp(x.mean()), **common)
    low, mean, high = t_bounds(x, level)
    return RatioCI(point=math.exp(mean), low=math.exp(low), high=math.exp(high), **common)


def log_latency_ratio(off: Sequence[float], on: Sequence[float]) -> float | None:
    """log(mean(off) / mean(on)): > 0 when spec on has the lower latency. None without data."""
    if not len(off) or not len(on):
        return None
    m_off, m_on = math.fsum(off) / len(off), math.fsum(on) / len(on)
    if m_off <= 0 or m_on <= 0:
        return None
    return math.log(m_off / m_on)


def log_rate_ratio(tokens_off: float, time_off: float, tokens_on: float, time_on: float) -> float | None:
    """log((tokens_on / time_on) / (tokens_off / time_off)): > 0 when spec on has the higher rate."""
    if min(tokens_off, time_off, tokens_on, time_on) <= 0:
        return None
    return math.log((tokens_on / time_on) / (tokens_off / time_off))


def _levels_text(levels: Sequence[float]) -> str:
    return ", ".join(f"{c:g}" for c in levels)  # inf formats as "inf"


def find_crossover(levels: Sequence[float], ratios: Sequence[RatioCI], speculation: bool | None = True,
                   what: str = "concurrency") -> Crossover:
    """Per-level verdicts of the throughput ratio and where spec on stops being faster.

    ``levels``: concurrencies, or request rates (``what="request rate"``; inf allowed: the
    estimate is then not interpolated past the last finite rate).

    ``speculation``: whether the spec-on server showed speculation counters; unless True no
    level gets a speed verdict (the ratio would compare two servers that do not speculate,
    as far as can be seen)."""
    pts = sorted((c, r) for c, r in zip(levels, ratios) if r.point is not None)
    if not pts:
        return Crossover(status="unknown", text="no ratios measured")
    if speculation is not True:
        why = ("has no speculation counters (speculation looks off there)" if speculation is False
               else "shows no speculation counters (speculation could not be confirmed)")
        return Crossover(status="no-speculation", verdicts={c: "no speculation" for c, _ in pts},
                         text=f"no speed verdict: the spec-on server {why}, so a ratio would not measure "
                              "speculative decoding")
    verdicts = {c: r.verdict for c, r in pts}
    faster = [c for c, v in verdicts.items() if v == "faster"]
    slower = [c for c, v in verdicts.items() if v == "slower"]
    unclear = [c for c, v in verdicts.items() if v == "no clear difference"]
    few = "; ".join(f"{_levels_text([c])}: {r.n} {r.unit}, fewer than {r.min_n}" for c, r in pts if r.too_few)
    few = f" (no interval at {few})" if few else ""
    tail = f"; no clear difference at {_levels_text(unclear)}{few}" if unclear else ""
    if len(faster) == len(pts):
        return Crossover(status="faster-everywhere", last_faster=faster[-1], verdicts=verdicts,
                         text=f"spec on is faster at every tested {what} ({_levels_text(faster)})")
    if not faster and not slower:
        covered = [c for c, r in pts if not r.too_few]
        why = ([f"every interval includes 1.0x ({_levels_text(covered)})"] if covered else []) + [
            f"no interval at {_levels_text([c])}: {r.n} {r.unit}, fewer than {r.min_n}" for c, r in pts if r.too_few]
        return Crossover(status="no-clear-difference", verdicts=verdicts,
                         text=f"no clear difference at any tested {what} ({_levels_text(unclear)}): "
                              + "; ".join(why))
    if not faster:
        return Crossover(status="never-faster", first_slower=slower[0], verdicts=verdicts,
                         text=f"spec on is slower at {_levels_text(slower)} and faster at none" + tail)
    later_slower = [c for c in slower if c > faster[0]]
    if later_slower:
        first_slower = later_slower[0]
        last_faster = max(c for c in faster if c < first_slower)
        span = [(c, r.point) for c, r in pts if last_faster <= c <= first_slower]
        # the points cross 1 somewhere in the span: it starts above 1 (faster) and ends below (slower)
        (c0, r0), (c1, r1) = next((a, b) for a, b in zip(span, span[1:]) if a[1] >= 1 > b[1])
        if math.isinf(c1):  # all at once: no log-scale position to interpolate to
            est, near = None, f"crossover above {_levels_text([c0])}"
        else:
            x0, x1 = math.log2(c0), math.log2(c1)
            est = 2 ** (x0 + (r0 - 1) / (r0 - r1) * (x1 - x0))
            near = f"crossover near {est:.1f}"
        return Crossover(status="crosses", last_faster=last_faster, first_slower=first_slower, estimate=est,
                         verdicts=verdicts,
                         text=f"spec on is faster at {_levels_text(faster)} and slower at {_levels_text(slower)} "
                              f"({near})" + tail)
    if slower:
        return Crossover(status="mixed", last_faster=faster[-1], first_slower=slower[0], verdicts=verdicts,
                         text=f"spec on is slower at {_levels_text(slower)} but faster at the higher "
                              f"{_levels_text(faster)}" + tail)
    return Crossover(status="faster-at-some", last_faster=faster[-1], verdicts=verdicts,
                     text=f"spec on is faster at {_levels_text(faster)}" + tail)

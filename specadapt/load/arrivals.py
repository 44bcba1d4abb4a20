"""Arrival schedules for open-loop runs (how well the client kept to them: analysis/send_lag.py).

Schedule. ``--request-rate R`` (requests/s) with ``--burstiness B``: the gaps between
arrivals are gamma distributed with shape B and mean 1/R (scale 1 / (R B)), as in
``vllm bench serve``: B = 1 is a Poisson process (exponential gaps), B < 1 is burstier
(coefficient of variation 1/sqrt(B) > 1), B > 1 more regular. The first arrival is at 0,
arrival i at the sum of the first i gaps. ``inf`` sends everything at once (every offset 0).
A schedule is a pure function of (R, B, count, seed): both sides of an A/B run that use
the same seed get the same arrival times.
"""

from __future__ import annotations

import math

import numpy as np

from specadapt.errors import UsageError

NS_PER_S = 1_000_000_000


def parse_rates(value: str | None) -> list[float]:
    """``--request-rate 1,2,inf`` -> [1.0, 2.0, inf] (ascending, without repeats); None/'' -> []."""
    if value is None or not value.strip():
        return []
    rates = set()
    for part in value.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            r = float(part)
        except ValueError:
            raise UsageError(f"--request-rate {value!r}: give requests per second, comma-separated, "
                             "e.g. 1,2,4,inf") from None
        if math.isnan(r) or r <= 0:
            raise UsageError(f"--request-rate {value!r}: every rate must be > 0 (inf: all at once)")
        rates.add(r)
    if not rates:
        raise UsageError(f"--request-rate {value!r}: give at least one rate, e.g. 2")
    return sorted(rates)


def arrivals_for_duration(rate: float, duration_s: float) -> int:
    """Arrivals a run of ``duration_s`` seconds gets at ``rate``: ceil(rate * duration), at least 1."""
    return max(1, math.ceil(rate * duration_s))


def schedule_ns(rate: float, count: int, burstiness: float = 1.0, seed: int = 0) -> list[int]:
    """Send offsets (ns from the run's start) of ``count`` arrivals; see the module docstring."""
    if count <= 0:
        return []
    if burstiness <= 0:
        raise UsageError(f"--burstiness {burstiness}: must be > 0 (1 is Poisson, below 1 burstier)")
    if math.isinf(rate):
        return [0] * count
    gaps = np.random.default_rng(seed).gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=count - 1)
    offsets = np.concatenate(([0.0], np.cumsum(gaps)))
    return [int(round(x * NS_PER_S)) for x in offsets]

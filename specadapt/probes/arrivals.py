"""Arrival schedules for open-loop runs, and how well the client kept to them.

Schedule. ``--request-rate R`` (requests/s) with ``--burstiness B``: the gaps between
arrivals are gamma distributed with shape B and mean 1/R (scale 1 / (R B)), as in
``vllm bench serve``: B = 1 is a Poisson process (exponential gaps), B < 1 is burstier
(coefficient of variation 1/sqrt(B) > 1), B > 1 more regular. The first arrival is at 0,
arrival i at the sum of the first i gaps. ``inf`` sends everything at once (every offset 0).
A schedule is a pure function of (R, B, count, seed): both sides of an A/B run that use
the same seed get the same arrival times.

Send lag. Each record keeps the time the schedule asked for (``scheduled_at_ns``) and the
time it was sent (``sent_at_ns``); lag = sent - scheduled. The client, not the server,
limited a run when the lag's p99 exceeds LAG_P99_LIMIT_MS, or when the achieved send rate
(arrivals after the first over the span of the send times) fell below
MIN_RATE_FRACTION of the schedule's own rate (the same over the scheduled times; for a
random schedule that rate, not R, is what the client was asked to keep).
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from specadapt.errors import UsageError
from specadapt.records.load import SendLag

LAG_P99_LIMIT_MS = 10.0
MIN_RATE_FRACTION = 0.95
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


def rate_label(rate: float) -> str:
    """'inf', '2', '0.5': how a rate is written in reports."""
    return f"{rate:g}"  # inf -> 'inf'; 2.0 -> '2'; 0.5 -> '0.5'


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


def send_lag(scheduled_ns: Sequence[int], sent_ns: Sequence[int], lag_p99_limit_ms: float = LAG_P99_LIMIT_MS,
             min_rate_fraction: float = MIN_RATE_FRACTION) -> SendLag:
    """Lag statistics of one schedule (pairs of scheduled and actual send times, ns)."""
    return send_lag_blocks([(scheduled_ns, sent_ns)], lag_p99_limit_ms, min_rate_fraction)


def send_lag_blocks(blocks: Sequence[tuple[Sequence[int], Sequence[int]]],
                    lag_p99_limit_ms: float = LAG_P99_LIMIT_MS,
                    min_rate_fraction: float = MIN_RATE_FRACTION) -> SendLag:
    """Lag statistics over several runs of a schedule (each timed from its own start): the lag
    percentiles over all requests; the rates pooled, sum(arrivals - 1) / sum(spans)."""
    lags = np.array([s - c for sched, sent in blocks for c, s in zip(sched, sent)])
    n = int(lags.size)
    if n == 0:
        return SendLag()
    p50, p99 = (float(v) / 1e6 for v in np.percentile(lags, [50, 99]))
    out = SendLag(requests=n, p50_ms=p50, p99_ms=p99, max_ms=float(lags.max()) / 1e6)
    reasons = []
    if p99 > lag_p99_limit_ms:
        reasons.append(f"send lag p99 {p99:.1f} ms > {lag_p99_limit_ms:g} ms")
    gaps = sum(len(sched) - 1 for sched, _ in blocks if sched)
    span_sched = sum(max(sched) - min(sched) for sched, _ in blocks if sched) / NS_PER_S
    span_sent = sum(max(sent) - min(sent) for _, sent in blocks if sent) / NS_PER_S
    if gaps and span_sched > 0:
        out.scheduled_rate = gaps / span_sched
        out.achieved_rate = gaps / span_sent if span_sent > 0 else math.inf
        if out.achieved_rate < min_rate_fraction * out.scheduled_rate:
            reasons.append(f"sent {out.achieved_rate:.2f} req/s, below {min_rate_fraction:.0%} of the "
                           f"scheduled {out.scheduled_rate:.2f} req/s")
    if reasons:
        out.client_limited = True
        out.reason = "the client, not the server, limited this run: " + "; ".join(reasons)
    return out

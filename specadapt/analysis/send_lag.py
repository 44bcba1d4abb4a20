"""How well the client kept to an open-loop schedule.

Send lag. Each record keeps the time the schedule asked for (``scheduled_at_ns``) and the
time it was sent (``sent_at_ns``); lag = sent - scheduled. The client, not the server,
limited a run when the lag's p99 exceeds LAG_P99_LIMIT_MS, or when the achieved send rate
(arrivals after the first over the span of the send times) fell below
MIN_RATE_FRACTION of the schedule's own rate (the same over the scheduled times; for a
random schedule that rate, not R, is what the client was asked to keep).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from specadapt.records.load import SendLag

LAG_P99_LIMIT_MS = 10.0
MIN_RATE_FRACTION = 0.95
NS_PER_S = 1_000_000_000


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

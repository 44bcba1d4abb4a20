"""Latency metrics of streamed requests. Integer nanoseconds inside, milliseconds outside.

Definitions (per request, successful requests only):
- TTFT  Formula: arrival of the first chunk carrying a token - send time.
- ITL   Formula: for each later chunk carrying n tokens after a gap g since the previous
        token-carrying chunk, n values of g / n (per token, not per chunk; see client.py).
- TPOT  Formula: (E2E - TTFT) / (output_tokens - 1); undefined for 1-token outputs.
- E2E   Formula: end of stream - send time.
- Output tokens/s (run) Formula: sum of output tokens / wall time from first send to last end.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from specadapt.records import Distribution, LatencySummary, RequestRecord

NS_PER_MS = 1_000_000


def percentile(sorted_values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default), ``q`` in [0, 100]."""
    if not sorted_values:
        raise ValueError("percentile of no values")
    pos = (len(sorted_values) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def summarize(values_ns: Iterable[float]) -> Distribution:
    values = sorted(v / NS_PER_MS for v in values_ns)
    if not values:
        return Distribution()
    return Distribution(count=len(values), mean=sum(values) / len(values), p50=percentile(values, 50),
                        p90=percentile(values, 90), p99=percentile(values, 99), min=values[0], max=values[-1])


def itl_values_ns(rec: RequestRecord) -> list[float]:
    out: list[float] = []
    for i in range(1, len(rec.chunk_ns)):
        gap = rec.chunk_ns[i] - rec.chunk_ns[i - 1]
        n = rec.chunk_tokens[i]
        out += [gap / n] * n
    return out


def tpot_ns(rec: RequestRecord) -> float | None:
    if rec.e2e_ns is None or rec.ttft_ns is None or rec.output_tokens < 2:
        return None
    return (rec.e2e_ns - rec.ttft_ns) / (rec.output_tokens - 1)


def latency_summary(records: list[RequestRecord]) -> LatencySummary:
    ok = [r for r in records if r.ok]
    tokens = sum(r.output_tokens for r in ok)
    if ok:
        start = min(r.sent_at_ns for r in ok)
        end = max(r.sent_at_ns + (r.e2e_ns or 0) for r in ok)
        duration = (end - start) / 1e9
    else:
        duration = 0.0
    chunks = sum(len(r.chunk_tokens) for r in ok)
    return LatencySummary(
        requests=len(records), succeeded=len(ok), failed=len(records) - len(ok), output_tokens=tokens,
        duration_s=duration, output_tokens_per_s=(tokens / duration) if duration > 0 else None,
        ttft_ms=summarize(r.ttft_ns for r in ok if r.ttft_ns is not None),
        itl_ms=summarize(v for r in ok for v in itl_values_ns(r)),
        tpot_ms=summarize(t for r in ok if (t := tpot_ns(r)) is not None),
        e2e_ms=summarize(r.e2e_ns for r in ok if r.e2e_ns is not None),
        tokens_per_chunk_mean=(tokens / chunks) if chunks else None,
    )

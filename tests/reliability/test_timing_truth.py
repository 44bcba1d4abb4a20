"""Timing truth: the probe's TTFT, ITL, TPOT and E2E against the scripted server's log.

The target in issue 7 is 1 ms at p99. Measured on the 2-core shared VM this was built on
(README "Reliability"), with 64 streams at 100 ms ITL the probe's median error is 0.2-1.2
ms and its p99 0.5-6 ms: the tail is the client process waiting for a CPU, which no code
in the probe removes. So this test holds the median to 2 ms for every metric (a
per-chunk, off-by-one-chunk or clock bug is off by a whole ITL, 100 ms here) and the p99
to a gross bound that catches stalls; benchmarks/probe_client_load.py reports p99
against the 1 ms target.
"""

from __future__ import annotations

import asyncio
import os

import pytest

from specadapt.probes.latency import percentile
from specadapt.testing.timing import drive, p99_abs, summary, timing_errors

SCRIPT = dict(ttft_ms=150.0, itl_ms=100.0, tokens=12)
P99_BOUND_MS = 60.0


def p50_abs(values: list[float]) -> float:
    return percentile(sorted(abs(v) for v in values), 50)


@pytest.mark.parametrize("concurrency, n", [(1, 12), (64, 64)])
def test_probe_times_match_the_server(scripted_url, concurrency, n):
    records, log = asyncio.run(drive(scripted_url, n, concurrency, f"truth{concurrency}", **SCRIPT))
    assert all(r.ok for r in records), [r.error for r in records if not r.ok][:3]
    assert all(r.output_tokens == 12 and r.token_source == "usage" for r in records)
    errors = timing_errors(records, log)
    print(f"\ntiming error at concurrency {concurrency} (load {os.getloadavg()[0]:.1f}): {summary(errors)}")
    for metric in ("ttft", "itl", "tpot", "e2e"):
        assert len(errors[metric]) >= n
        assert p50_abs(errors[metric]) < 2.0, (metric, summary(errors)[metric], f"load {os.getloadavg()}")
        assert p99_abs(errors[metric]) < P99_BOUND_MS, (metric, summary(errors)[metric], f"load {os.getloadavg()}")
    # Against the script itself the server's own timer jitter adds in; still close.
    assert p50_abs(errors["itl_vs_schedule"]) < 5.0, summary(errors)["itl_vs_schedule"]


def test_multi_token_chunks_are_spread_per_token(scripted_url):
    records, log = asyncio.run(drive(scripted_url, 4, 4, "multi", ttft_ms=20.0, itl_ms=30.0, tokens=10,
                                     tokens_per_chunk=4))
    for r in records:
        assert r.chunk_tokens == [4, 4, 2] and r.output_tokens == 10
    errors = timing_errors(records, log)
    assert len(errors["itl"]) == 4 * 6  # 6 tokens after the first chunk, per request
    # Per token: a 30 ms gap before a 4-token chunk is 4 ITLs of 7.5 ms, not one of 30.
    assert p50_abs(errors["itl"]) < 2.0, summary(errors)["itl"]

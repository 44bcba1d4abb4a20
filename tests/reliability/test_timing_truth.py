"""Timing truth over real sockets: the probe's TTFT, ITL, TPOT and E2E against the scripted server's log.

What this test is for: the arithmetic is tested exactly in tests/unit/load/test_client.py (an
injected clock, equality to the nanosecond). Here, over real loopback HTTP with a
separate server process, we check what a fake clock cannot: that the client reads the
same monotonic clock as the server, stamps a chunk when it arrives (not when a buffer
fills or the stream ends) and counts the tokens of the real wire format.

Every assertion must hold on a shared 2-core CI box whatever its neighbours do, so:

- Exact, load-proof: token counts, chunk counts, the number of error samples, and
  causality: the client cannot read a chunk before the server wrote it, so every TTFT
  and E2E error is > 0 (a wrong clock or a stamp taken too early breaks this at once).
- Timed, against the machine's own pace in the same run: the median |error| of each metric
  < FLOOR_MS + the p90 of how late the client's event loop woke from its sleeps (a ticker in
  the same loop, as `probe` measures the client) + the p90 of how late the server wrote its
  chunks against its script (from its log). A waiting CPU only ever adds delay, to the
  ticker's wake-ups as to the chunks' reads, and the median shrugs off a few long waits.
  Idle, every median is < 0.7 ms and the limit about 2.5 ms; at a load average of 5-8 on a 2-core
  VM the medians reached 8 ms with limits of 8-15 ms. What a bug in the probe looks like
  is far past that: a whole ITL (100 ms), a per-chunk instead of per-token ITL (75 ms per
  token here), a Nagle/delayed-ACK stall (40 ms). A machine so busy that the limit reaches
  BUG_MS cannot tell a stall from a bug: the timed part is skipped, saying so (the exact
  checks above still ran).
- No p99 assertion: the tail is the client waiting for a CPU (tens of ms on a loaded
  box), which no code in the probe removes. The figures are printed; concurrency 64 and
  above is benchmarks/timing_truth.py (p50/p99 per concurrency, no assertion).
"""

from __future__ import annotations

import asyncio
import os

import pytest

from specadapt.analysis.latency import percentile
from specadapt.load.meter import measure_client
from specadapt.testing.timing import METRICS, brief, drive, summary, timing_errors

SCRIPT = dict(ttft_ms=150.0, itl_ms=100.0, tokens=12)
FLOOR_MS = 2.0  # the probe's own work on a chunk, with room: idle, every median is < 0.7 ms
BUG_MS = 40.0  # the smallest error a probe bug makes here (a Nagle/delayed-ACK stall)


def p50_abs(values: list[float]) -> float:
    return percentile(sorted(abs(v) for v in values), 50)


async def drive_measured(url: str, n: int, concurrency: int, tag: str, **fields):
    """``drive`` with a ticker in the same event loop: (records, log, how late each wake-up was, ms)."""
    async with measure_client() as meter:
        records, log = await drive(url, n, concurrency, tag, **fields)
    return records, log, [lag / 1e6 for lag in meter.figures.lags_ns]


def server_lateness_ms(log: dict, records) -> list[float]:
    """How late the server wrote each chunk against its script (received + ttft + i * itl)."""
    out = []
    for r in records:
        e = log[r.prompt_id]
        out += [abs(t - e["recv_ns"] - (e["ttft_ms"] + i * e["itl_ms"]) * 1e6) / 1e6
                for i, t in enumerate(e["chunk_ns"])]
    return out


def check_causality_and_medians(errors: dict[str, list[float]], lags_ms: list[float], late_ms: list[float],
                                where: str) -> None:
    figures = summary(errors)
    client, server = percentile(sorted(lags_ms), 90), percentile(sorted(late_ms), 90)
    limit = FLOOR_MS + client + server
    pace = (f"load {os.getloadavg()[0]:.1f}; p90 lateness: client loop {client:.2f} ms over {len(lags_ms)} wake-ups, "
            f"server chunks {server:.2f} ms; limit {limit:.2f} ms")
    print(f"\ntiming error {where} ({pace}): {brief(errors)}")
    # Load-proof: the probe reads a chunk after the server wrote it, on the same clock.
    assert min(errors["ttft"]) > 0 and min(errors["e2e"]) > 0, (figures, min(errors["ttft"]), min(errors["e2e"]))
    if limit >= BUG_MS:
        pytest.skip(f"the machine was too busy to judge timing {where}: {pace}, not below the {BUG_MS:g} ms of a bug")
    for metric in (*METRICS, "itl_vs_schedule"):
        if errors[metric]:
            assert p50_abs(errors[metric]) < limit, (metric, figures[metric], pace)


@pytest.mark.parametrize("concurrency, n", [(1, 12), (16, 32)])
def test_probe_times_match_the_server(scripted_url, concurrency, n):
    records, log, lags = asyncio.run(drive_measured(scripted_url, n, concurrency, f"truth{concurrency}", **SCRIPT))
    assert all(r.ok for r in records), [r.error for r in records if not r.ok][:3]
    assert all(r.output_tokens == 12 and r.chunk_tokens == [1] * 12 and r.token_source == "usage" for r in records)
    errors = timing_errors(records, log)
    assert [len(errors[m]) for m in METRICS] == [n, n * 11, n, n]
    # itl_vs_schedule: against the script itself, so the server's own timer jitter adds in.
    assert len(errors["itl_vs_schedule"]) == n * 11
    check_causality_and_medians(errors, lags, server_lateness_ms(log, records), f"at concurrency {concurrency}")


def test_multi_token_chunks_are_spread_per_token(scripted_url):
    records, log, lags = asyncio.run(drive_measured(scripted_url, 4, 4, "multi", ttft_ms=20.0, itl_ms=100.0,
                                                    tokens=10, tokens_per_chunk=4))
    for r in records:
        assert r.ok and r.chunk_tokens == [4, 4, 2] and r.output_tokens == 10 and r.token_source == "usage"
    errors = timing_errors(records, log)
    assert len(errors["itl"]) == 4 * 6  # 6 tokens after the first chunk, per request
    # Per token: the 100 ms before a 4-token chunk is 4 ITLs of 25 ms; per chunk it would be
    # one of 100 ms, 75 ms off, far past the margin.
    check_causality_and_medians(errors, lags, server_lateness_ms(log, records), "with 4-token chunks")

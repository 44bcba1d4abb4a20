"""The probe client's self-report: was the client, not the server, the bottleneck of a run?

A single-threaded asyncio client reads a chunk only when its event loop gets to it. When
the loop is busy (too many streams for one process, a neighbour using the cores), every
chunk waits, and every time the client records is late by that wait: the run measured
the client. ``measure_client()`` wraps a run and reports:

- the process's CPU seconds (``time.process_time``: user + system, all threads) over the
  run, per chunk read and as a fraction of one core;
- the event loop's lag: a ticker sleeps 10 ms again and again and records how late it
  wakes (p50/p99/max). A chunk that arrives waits about as long before it is read.

``client_limited(load)`` gives a one-line reason when the client was the bottleneck: loop
lag p99 over 5 ms, or CPU over 90% of a core (one process uses one core at most).

    async with measure_client(client) as meter:
        ... the run ...
    load = meter.load          # a ClientLoad record
    reason = client_limited(load)
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from specadapt.probes.latency import percentile
from specadapt.records import ClientLoad

LAG_P99_LIMIT_MS = 5.0
"""Loop lag p99 above this: chunks waited that long to be read (times late by as much)."""
CPU_LIMIT = 0.9
"""CPU above this fraction of one core: the client had no headroom left."""
TICK_S = 0.010

NS_PER_MS = 1_000_000


def client_load(wall_s: float, cpu_s: float, chunks: int, lags_ns: list[int]) -> ClientLoad:
    """The record from raw figures: ``lags_ns`` are the ticker's wake-up delays."""
    lags = sorted(v / NS_PER_MS for v in lags_ns)
    return ClientLoad(
        wall_s=wall_s, cpu_s=cpu_s, chunks=chunks,
        cpu_ms_per_chunk=cpu_s * 1e3 / chunks if chunks > 0 else None,
        cpu_fraction=cpu_s / wall_s if wall_s > 0 else 0.0,
        loop_lag_ms_p50=percentile(lags, 50) if lags else None,
        loop_lag_ms_p99=percentile(lags, 99) if lags else None,
        loop_lag_ms_max=lags[-1] if lags else None,
        lag_samples=len(lags))


def client_limited(load: ClientLoad) -> str | None:
    """One line saying why the client was the bottleneck of the run, or None when it was not."""
    reasons = []
    if load.loop_lag_ms_p99 is not None and load.loop_lag_ms_p99 > LAG_P99_LIMIT_MS:
        reasons.append(f"event-loop lag p99 {load.loop_lag_ms_p99:.1f} ms (over {LAG_P99_LIMIT_MS:g} ms)")
    busy = load.cpu_fraction > CPU_LIMIT
    if busy:
        reasons.append(f"CPU {100 * load.cpu_fraction:.0f}% of a core (over {100 * CPU_LIMIT:.0f}%)")
    if not reasons:
        return None
    advice = ("run fewer streams per client process" if busy else
              f"with CPU at {100 * load.cpu_fraction:.0f}% of a core it waited for a core: "
              "give the client cores of its own")
    return "the probe client was the bottleneck: " + " and ".join(reasons) + f"; its times are late: {advice}"


class ClientMeter:
    """Collects during ``measure_client``; ``load`` is set when the block ends."""

    def __init__(self, client: Any = None, *, tick_s: float = TICK_S,
                 cpu: Callable[[], float] = time.process_time, clock: Callable[[], int] = time.perf_counter_ns):
        self.client, self.tick_s, self.cpu, self.clock = client, tick_s, cpu, clock
        self.lags_ns: list[int] = []
        self.extra_chunks = 0
        self.load: ClientLoad | None = None
        self._chunks0 = self._client_chunks()

    def add_chunks(self, n: int) -> None:
        """Count chunks read by a client that does not count its own."""
        self.extra_chunks += n

    def _client_chunks(self) -> int:
        return int(getattr(self.client, "chunks_read", 0))

    async def tick(self) -> None:
        """Sleep ``tick_s`` again and again; record how late each wake-up is."""
        step = round(self.tick_s * 1e9)
        while True:
            before = self.clock()
            await asyncio.sleep(self.tick_s)
            self.lags_ns.append(max(0, self.clock() - before - step))


@contextlib.asynccontextmanager
async def measure_client(client: Any = None, *, tick_s: float = TICK_S,
                         cpu: Callable[[], float] = time.process_time,
                         clock: Callable[[], int] = time.perf_counter_ns) -> AsyncIterator[ClientMeter]:
    """Measure the client process over the block: CPU, chunks read (from ``client.chunks_read``,
    a StreamClient's count, plus ``meter.add_chunks``) and event-loop lag. ``meter.load`` is the
    ClientLoad afterwards (also when the block raised)."""
    meter = ClientMeter(client, tick_s=tick_s, cpu=cpu, clock=clock)
    cpu0, t0 = cpu(), clock()
    ticker = asyncio.create_task(meter.tick())
    try:
        yield meter
    finally:
        ticker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await ticker
        chunks = meter._client_chunks() - meter._chunks0 + meter.extra_chunks
        meter.load = client_load((clock() - t0) / 1e9, cpu() - cpu0, chunks, meter.lags_ns)

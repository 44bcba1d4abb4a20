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

    async with measure_client(client) as meter:     # specadapt.load.meter
        ... the run ...
    load = client_load(*meter.figures)             # a ClientLoad record
    reason = client_limited(load)
"""

from __future__ import annotations

from specadapt.analysis.latency import percentile
from specadapt.records import ClientLoad

LAG_P99_LIMIT_MS = 5.0
"""Loop lag p99 above this: chunks waited that long to be read (times late by as much)."""
CPU_LIMIT = 0.9
"""CPU above this fraction of one core: the client had no headroom left."""

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

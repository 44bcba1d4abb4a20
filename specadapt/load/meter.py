"""The client process measured over a run: CPU seconds, chunks read and event-loop lag (what the
figures mean and when they say the client was the bottleneck: analysis/client_load.py).

    async with measure_client(client) as meter:
        ... the run ...
    meter.figures      # ClientFigures(wall_s, cpu_s, chunks, lags_ns)
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, NamedTuple

TICK_S = 0.010


class ClientFigures(NamedTuple):
    """Raw figures of one run: wall and CPU seconds, chunks read, the ticker's wake-up delays (ns)."""

    wall_s: float
    cpu_s: float
    chunks: int
    lags_ns: list[int]


class ClientMeter:
    """Collects during ``measure_client``; ``figures`` is set when the block ends."""

    def __init__(self, client: Any = None, *, tick_s: float = TICK_S,
                 cpu: Callable[[], float] = time.process_time, clock: Callable[[], int] = time.perf_counter_ns):
        self.client, self.tick_s, self.cpu, self.clock = client, tick_s, cpu, clock
        self.lags_ns: list[int] = []
        self.extra_chunks = 0
        self.figures: ClientFigures | None = None
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
    a StreamClient's count, plus ``meter.add_chunks``) and event-loop lag. ``meter.figures`` are set
    afterwards (also when the block raised)."""
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
        meter.figures = ClientFigures((clock() - t0) / 1e9, cpu() - cpu0, chunks, meter.lags_ns)

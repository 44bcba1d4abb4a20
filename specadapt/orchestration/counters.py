"""The counter window: what a server (the spec-on one, mostly) did during a stretch of requests,
from its counters read before and after.

Each read is settled (``settle_counters``: two reads in a row agree), and a server whose counters
drain on read polls them between ``start_run`` and ``end_run`` (``counting``). ``counter_window``
is the context manager for a block of requests; ``CounterWindow`` the same before/after object for
callers that open and close it themselves (``await window.open()`` / ``await window.close()`` read
off the event loop; ``open_now`` / ``close_now`` in the calling thread). Either gives
``acceptance`` (analysis/acceptance.py) over the window and ``pair`` (the records' CounterPair)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterator

from specadapt.adapters.base import Server
from specadapt.analysis.acceptance import acceptance_summary
from specadapt.errors import SpecadaptError
from specadapt.records import AcceptanceSummary, CounterSnapshot
from specadapt.records.reports import CounterPair

Settle = Callable[[Server], CounterSnapshot]


def settle_counters(server: Server, previous: CounterSnapshot | None = None,
                    max_wait_s: float = 3.0) -> CounterSnapshot:
    """Read counters until two reads in a row agree: servers update stats just after the
    last response is sent, so an immediate read can miss the final step."""
    deadline = time.monotonic() + max_wait_s
    last = previous or read_counters_safely(server)
    while True:
        time.sleep(0.2)
        now = read_counters_safely(server)
        if now == last or time.monotonic() > deadline:
            return now
        last = now


def read_counters_safely(server: Server) -> CounterSnapshot:
    """A snapshot, or an empty one saying why there is none (acceptance then is unknown)."""
    try:
        return server.read_counters()
    except SpecadaptError as exc:
        return CounterSnapshot(source=f"unavailable: {exc}")


@contextlib.contextmanager
def counting(*servers: Server) -> Iterator[None]:
    """One run's counter window: servers whose counters drain on read poll them between
    start_run() and end_run() (each server once, however often it is given)."""
    unique = list(dict.fromkeys(servers))
    for server in unique:
        server.start_run()
    try:
        yield
    finally:
        for server in unique:
            server.end_run()


class CounterWindow:
    """One server's counters before and after a stretch of requests. ``settle``: how a read is
    settled (default ``settle_counters``)."""

    def __init__(self, server: Server, settle: Settle | None = None):
        self.server = server
        self._settle = settle
        self.before: CounterSnapshot | None = None
        self.after: CounterSnapshot | None = None

    def _read(self) -> CounterSnapshot:
        return (self._settle or settle_counters)(self.server)

    def open_now(self) -> CounterWindow:
        self.before = self._read()
        return self

    def close_now(self) -> CounterWindow:
        self.after = self._read()
        return self

    async def open(self) -> CounterWindow:
        """The counters before, read in a thread (the event loop keeps running)."""
        self.before = await asyncio.to_thread(self._read)
        return self

    async def close(self) -> CounterWindow:
        self.after = await asyncio.to_thread(self._read)
        return self

    def _both(self) -> tuple[CounterSnapshot, CounterSnapshot]:
        if self.before is None or self.after is None:
            raise RuntimeError("the counter window is not closed")
        return self.before, self.after

    @property
    def acceptance(self) -> AcceptanceSummary:
        """The acceptance over the window (once closed)."""
        return acceptance_summary(*self._both())

    @property
    def pair(self) -> CounterPair:
        before, after = self._both()
        return CounterPair(before=before, after=after)


@contextlib.contextmanager
def counter_window(server: Server, settle: Settle | None = None) -> Iterator[CounterWindow]:
    """The server's counters before and after the block, within its run (``counting``). When the
    block raises, no after is read."""
    window = CounterWindow(server, settle)
    with counting(server):
        window.open_now()
        yield window
        window.close_now()

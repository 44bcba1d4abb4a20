"""The counter window: what the spec-on server did during a stretch of requests, from its
counters read before and after (each read settled: two reads in a row agree).

``counter_window(server)`` is a context manager whose window holds ``before``, ``after`` and
``acceptance`` (analysis/acceptance.py over the two) once the block has run; ``CounterWindow``
is the same object for callers whose requests run between two awaits (``await
window.open()`` / ``await window.close()``, the reads off the event loop)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

from specadapt.adapters.base import Server
from specadapt.analysis.acceptance import acceptance_summary
from specadapt.orchestration.probe import counting, settle_counters
from specadapt.records import AcceptanceSummary, CounterSnapshot


class CounterWindow:
    """One server's counters before and after a stretch of requests."""

    def __init__(self, server: Server):
        self.server = server
        self.before: CounterSnapshot | None = None
        self.after: CounterSnapshot | None = None

    @property
    def acceptance(self) -> AcceptanceSummary:
        """The acceptance over the window (after ``close``)."""
        if self.before is None or self.after is None:
            raise RuntimeError("the counter window is not closed")
        return acceptance_summary(self.before, self.after)

    def open_now(self) -> CounterWindow:
        self.before = settle_counters(self.server)
        return self

    def close_now(self) -> CounterWindow:
        self.after = settle_counters(self.server)
        return self

    async def open(self) -> CounterWindow:
        """The counters before, read in a thread (the event loop keeps running)."""
        self.before = await asyncio.to_thread(settle_counters, self.server)
        return self

    async def close(self) -> CounterWindow:
        self.after = await asyncio.to_thread(settle_counters, self.server)
        return self


@contextlib.contextmanager
def counter_window(server: Server) -> Iterator[CounterWindow]:
    """The server's counters before and after the block, within its run (``counting``: servers whose
    counters drain on read poll them meanwhile). When the block raises, no after is read."""
    window = CounterWindow(server)
    with counting(server):
        window.open_now()
        yield window
        window.close_now()

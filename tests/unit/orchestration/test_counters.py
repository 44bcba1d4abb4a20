"""The one counter window (orchestration/counters.py): a server's counters read before and after a
stretch of requests, within its run (start_run / end_run), each read settled."""

from __future__ import annotations

import asyncio

import pytest

from specadapt.errors import ServerError
from specadapt.orchestration import counters
from specadapt.orchestration.counters import CounterWindow, counter_window, read_counters_safely
from specadapt.records import CounterSnapshot


class Counting:
    """A server whose counters move by one draft of 4 tokens (3 accepted) per ``step``."""

    def __init__(self):
        self.log: list[str] = []
        self.drafts = 0
        self.broken = False

    def start_run(self):
        self.log.append("start")

    def end_run(self):
        self.log.append("end")

    def read_counters(self):
        self.log.append("read")
        if self.broken:
            raise ServerError("metrics gone")
        return CounterSnapshot(drafts=self.drafts, draft_tokens=4 * self.drafts, accepted_tokens=3 * self.drafts,
                               source="test")

    def step(self):
        self.drafts += 1


def read(server):  # the settled read, without its wait
    return server.read_counters()


def test_the_window_reads_before_and_after_within_the_run_and_gives_the_acceptance():
    server = Counting()
    with counter_window(server, read) as window:
        assert server.log == ["start", "read"]
        server.step()
        server.step()
    assert server.log == ["start", "read", "read", "end"]
    assert (window.before.drafts, window.after.drafts) == (0, 2)
    a = window.acceptance
    assert (a.drafts, a.draft_tokens, a.accepted_tokens, a.acceptance_rate) == (2, 8, 6, 0.75)
    assert (window.pair.before, window.pair.after) == (window.before, window.after)


def test_a_block_that_raises_reads_no_after_and_still_ends_the_run():
    server = Counting()
    with pytest.raises(RuntimeError), counter_window(server, read) as window:
        raise RuntimeError("boom")
    assert server.log == ["start", "read", "end"] and window.after is None
    with pytest.raises(RuntimeError, match="not closed"):
        window.acceptance


def test_the_async_window_reads_off_the_event_loop():
    server = Counting()

    async def run():
        window = await CounterWindow(server, read).open()
        server.step()
        return await window.close()

    window = asyncio.run(run())
    assert window.pair.after.drafts - window.pair.before.drafts == 1
    assert "start" not in server.log  # the caller holds the run (``counting``) around it


def test_the_default_read_is_settled(monkeypatch):
    server = Counting()
    settled = []
    monkeypatch.setattr(counters, "settle_counters", lambda s: settled.append(s) or s.read_counters())
    CounterWindow(server).open_now().close_now()
    assert settled == [server, server]


def test_settle_reads_until_two_reads_agree(monkeypatch):
    monkeypatch.setattr(counters.time, "sleep", lambda s: None)
    server = Counting()
    reads = iter([0, 1, 2, 2])
    server.read_counters = lambda: CounterSnapshot(drafts=next(reads), source="test")
    assert counters.settle_counters(server).drafts == 2


def test_unreadable_counters_make_an_empty_snapshot_saying_why():
    server = Counting()
    server.broken = True
    snap = read_counters_safely(server)
    assert snap.source == "unavailable: metrics gone" and snap.drafts is None
    with counter_window(server, read_counters_safely) as window:
        pass
    assert not window.acceptance.known and "metrics gone" in window.acceptance.reason

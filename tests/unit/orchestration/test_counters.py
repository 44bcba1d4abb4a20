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


class Clock:
    """A clock that moves only when slept on, by ``step`` seconds whatever the sleep asks; it keeps
    every sleep asked for."""

    def __init__(self, step: float):
        self.t, self.step, self.slept = 100.0, step, []

    def monotonic(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.t += self.step


class Reads:
    """Counters that move on every read (``moving``) or never; the reads are counted."""

    def __init__(self, moving: bool):
        self.moving, self.n = moving, 0

    def read_counters(self):
        self.n += 1
        return CounterSnapshot(drafts=self.n if self.moving else 7, source="test")


def test_settle_sleeps_a_fifth_of_a_second_and_stops_only_past_its_deadline(monkeypatch):
    clock = Clock(step=0.5)
    monkeypatch.setattr(counters, "time", clock)
    server = Reads(moving=True)
    snap = counters.settle_counters(server, max_wait_s=1.0)
    # reads at 0, 0.5, 1.0 (the deadline itself: not past it, so read again) and 1.5 s
    assert (server.n, snap.drafts) == (4, 4)
    assert clock.slept == [0.2, 0.2, 0.2]


def test_settle_gives_moving_counters_three_seconds_by_default(monkeypatch):
    clock = Clock(step=1.0)
    monkeypatch.setattr(counters, "time", clock)
    counters.settle_counters(Reads(moving=True))
    assert clock.t - 100.0 == 4.0  # the first read past 3 s ends it


def test_settle_reads_once_more_than_it_is_given(monkeypatch):
    clock = Clock(step=0.5)
    monkeypatch.setattr(counters, "time", clock)
    still = Reads(moving=False)
    assert counters.settle_counters(still).drafts == 7 and still.n == 2 and clock.slept == [0.2]
    given = Reads(moving=False)
    counters.settle_counters(given, previous=CounterSnapshot(drafts=7, source="test"))
    assert given.n == 1  # the read before the run is the first of the pair


def test_a_window_closed_but_never_opened_is_not_closed():
    window = CounterWindow(Counting(), read).close_now()
    with pytest.raises(RuntimeError, match="^the counter window is not closed$"):
        window.pair

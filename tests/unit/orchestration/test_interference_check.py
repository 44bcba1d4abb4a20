"""The interference check before a compare (orchestration/interference_check.py), without HTTP: what it
sends, in which order and how short; that the compare runner runs it only when asked, at concurrency 1
with both sides interleaved, keeps its finding and never its requests; and that a fake pair of servers
that stall each other's first token is caught while a pair that does not is not."""

from __future__ import annotations

import asyncio

import pytest

from specadapt.load import spread
from specadapt.orchestration import compare
from specadapt.orchestration import interference_check as ic
from specadapt.orchestration.compare import ABRunner, run_compare
from specadapt.records import CompareSettings, Prompt, RequestSettings
from tests.unit.orchestration.test_compare import (  # noqa: F401 (fixtures)
    CHAT,
    MIXED,
    MS,
    Clock,
    Side,
    Wire,
    detokenizer,
    triager,
)


class StallingWire(Wire):
    """The fake servers, each request 10 ms apart on the clock; with ``stall_ms``, a request right after
    the other server's request gets its first token (and the rest) that much later."""

    def __init__(self, servers, stall_ms: float = 0.0):
        super().__init__(servers, clock=Clock(), step_ns=10 * MS)
        self.stall_ns = int(stall_ms * MS)

    async def stream_request(self, client, prompt, model, settings, t0, repeat=0, warmup=False):
        before = self.log[-1][0] if self.log else None
        rec = await super().stream_request(client, prompt, model, settings, t0, repeat, warmup)
        if before is not None and before != self.log[-1][0]:
            rec.chunk_ns = [c + self.stall_ns for c in rec.chunk_ns]
            rec.e2e_ns += self.stall_ns
        return rec


def install_wire(monkeypatch, wire: StallingWire) -> StallingWire:
    """``wire`` answers every request of this test, and the counters are read from the fake servers."""
    monkeypatch.setattr(spread, "stream_request", wire.stream_request)
    monkeypatch.setattr(compare, "settle_counters", lambda server: server.read_counters())
    return wire


@pytest.fixture
def stalling(monkeypatch):
    def install(off: Side, on: Side, stall_ms: float = 0.0) -> StallingWire:
        return install_wire(monkeypatch, StallingWire([off, on], stall_ms))
    return install


def test_the_check_sends_each_side_alone_then_alternates_with_short_requests_of_the_first_message():
    assert ic.check_order(2, 3) == ["off", "off", "on", "on", "off", "on", "off", "on", "off", "on"]
    # each side's typical first token stands while more than a quarter of its requests do not stall: the
    # ALONE - 1 after its own side, of ALONE + PAIRS
    assert 4 * (ic.ALONE - 1) > ic.ALONE + ic.PAIRS
    sent = ic.check_prompt(CHAT)
    assert (sent.max_tokens, sent.turns, sent.messages) == (ic.MAX_TOKENS, None, CHAT.messages)
    assert CHAT.turns == ["more"]  # the workload's prompt is untouched


def test_the_runner_checks_after_the_warm_up_keeps_the_finding_and_not_its_requests(stalling):
    off, on = Side("off"), Side("on", spec=True)
    wire = stalling(off, on, stall_ms=1000)
    settings = CompareSettings(concurrency=[1], repeat=1, warmup=1, interference_check=True)
    runner = ABRunner(off, on, MIXED, settings)
    records, _, _ = asyncio.run(runner.run())
    n = 2 * (ic.ALONE + ic.PAIRS)
    # the run's warm-up first (each server's first request is no stall), then the check, no warm-up of its own
    assert [(side, warm) for side, _, _, _, warm, *_ in wire.log[:2]] == [("off", True), ("on", True)]
    check = wire.log[2:2 + n]
    assert [side for side, *_ in check] == ic.check_order()
    assert {(p.id, p.max_tokens, warm) for _, _, _, _, warm, _, p in check} == {("same", ic.MAX_TOKENS, False)}
    assert len(records) == 2 * 5 and not any(r.warmup for r in records)  # the check's requests are not kept
    f = runner.interference_check
    assert f is not None and f.source == "check" and f.detected
    # alone: the first of each side's run after the other side (the spec-on side's first); alternating: all of
    # them. The check's first request follows the warm-up's last (the spec-on side's): it stalls, and the check,
    # which sees its own requests only, counts it as a stall after neither side
    assert [(s.side, s.after_other, s.after_same, s.stalls, s.stalls_after_other) for s in f.sides] == [
        ("off", ic.PAIRS, ic.ALONE - 1, ic.PAIRS + 1, ic.PAIRS), ("on", ic.PAIRS + 1, ic.ALONE - 1, ic.PAIRS + 1,
                                                                  ic.PAIRS + 1)]
    assert f.stall_ms == pytest.approx(1000, abs=1) and f.host is None  # two fake hosts


def test_servers_that_do_not_stall_each_other_pass_the_check(stalling):
    off, on = Side("off"), Side("on", spec=True)
    stalling(off, on)
    runner = ABRunner(off, on, MIXED, CompareSettings(concurrency=[1, 2], repeat=1, warmup=0, interference_check=True))
    asyncio.run(runner.run())
    f = runner.interference_check
    assert not f.detected and f.stalls == 0 and f.order == "judged"
    assert f.text.startswith("no interference between the sides seen: none of 20 first tokens stalled")


@pytest.mark.parametrize("settings, sides", [
    (CompareSettings(concurrency=[1], repeat=1, warmup=0), ("off", "on")),  # not asked
    (CompareSettings(concurrency=[2], repeat=1, warmup=0, interference_check=True), ("off", "on")),  # no level 1
    (CompareSettings(concurrency=[1], repeat=1, warmup=0, interference_check=True), ("on",)),  # one side alone
], ids=["not-asked", "no-concurrency-1", "one-side"])
def test_no_check_unless_asked_at_concurrency_1_with_both_sides(stalling, settings, sides):
    off, on = Side("off"), Side("on", spec=True)
    wire = stalling(off, on)
    runner = ABRunner(off, on, MIXED, settings)
    records, _, _ = asyncio.run(runner.run(sides=sides))
    assert runner.interference_check is None and len(wire.log) == len(records)


def test_run_compare_keeps_the_check_in_the_report_and_the_diagnosis_reads_it(stalling, triager, detokenizer):  # noqa: F811
    """The run itself (two prompts once: too few to judge the order) cannot tell; the check can."""
    off, on = Side("off", spec=False), Side("on", spec=True, k=2)
    stalling(off, on, stall_ms=1000)
    report = run_compare(off, on, MIXED[:2], CompareSettings(concurrency=[1], repeat=1, warmup=1, dtype="float32",
                                                             interference_check=True))
    assert report.interference_check.detected and report.sections["interference"]["order"] == "too few"
    assert len(report.requests) == 2 * 2
    assert "interference" in [c.code for c in report.diagnosis.causes]
    assert any(n.startswith("the servers stalled each other's first token") for n in report.notes)


def test_check_interference_on_two_servers_from_this_process(stalling):
    off, on = Side("off"), Side("on", spec=True)
    wire = stalling(off, on, stall_ms=500)
    f = ic.check_interference(off, on, Prompt(id="x", prompt="hello"))
    assert f.detected and f.stall_ms == pytest.approx(500, abs=1)
    assert len(wire.log) == 2 + 2 * (ic.ALONE + ic.PAIRS)  # one request to each side first, not judged
    assert [side for side, *_ in wire.log[:2]] == ["off", "on"]
    assert {s.logprobs for *_, s, _ in wire.log} == {False}


class ColdWire(StallingWire):
    """Each fake server's first request waits ``cold_ms`` longer (a server just started); nothing else stalls."""

    def __init__(self, servers, cold_ms: float):
        super().__init__(servers)
        self.cold_ns, self.seen = int(cold_ms * MS), set()

    async def stream_request(self, client, prompt, model, settings, t0, repeat=0, warmup=False):
        rec = await super().stream_request(client, prompt, model, settings, t0, repeat, warmup)
        side = self.log[-1][0]
        if side not in self.seen:
            self.seen.add(side)
            rec.chunk_ns = [c + self.cold_ns for c in rec.chunk_ns]
            rec.e2e_ns += self.cold_ns
        return rec


@pytest.mark.parametrize("warmup", [0, 1])
def test_a_cold_servers_first_request_is_not_judged(monkeypatch, warmup):
    """Without the run's warm-up the check warms each side itself; with it, the warm-up did: either way the
    seconds a just-started server takes for its first request are not counted as stalls."""
    off, on = Side("off"), Side("on", spec=True)
    wire = install_wire(monkeypatch, ColdWire([off, on], cold_ms=3000))
    runner = ABRunner(off, on, MIXED[:3], CompareSettings(concurrency=[1], repeat=1, warmup=warmup,
                                                          interference_check=True))
    asyncio.run(runner.run())
    f = runner.interference_check
    assert f.stalls == 0 and not f.detected and f"none of {2 * (ic.ALONE + ic.PAIRS)} first tokens" in f.text, f.text
    assert len(wire.log) == 2 + 2 * (ic.ALONE + ic.PAIRS) + 2 * 3  # warm (the run's or the check's), check, run


def test_without_the_warm_request_a_cold_first_request_would_count(monkeypatch):
    """The warm request is what keeps a cold start out: checked on the check itself, without it."""
    off, on = Side("off"), Side("on", spec=True)
    wire = install_wire(monkeypatch, ColdWire([off, on], cold_ms=3000))
    request = RequestSettings(logprobs=False)

    async def go(warm):
        executor = spread.InProcess()
        try:
            return await ic.check_sides(off, on, Prompt(id="x", prompt="hi"), {"off": request, "on": request},
                                        executor, warm=warm)
        finally:
            await executor.aclose()

    cold = asyncio.run(go(False))
    wire.seen.clear()
    warmed = asyncio.run(go(True))
    assert cold.stalls == 2 and warmed.stalls == 0


@pytest.mark.parametrize("repeat, prompts, checked", [
    (2, 4, False),  # 8 pairs at concurrency 1: fewer than the check's 10 to each side
    (3, 4, True),  # 12 pairs: the run's own records show the order
], ids=["8-pairs", "12-pairs"])
def test_the_check_runs_only_where_the_run_has_fewer_pairs_than_it(stalling, repeat, prompts, checked):
    off, on = Side("off"), Side("on", spec=True)
    stalling(off, on)
    runner = ABRunner(off, on, MIXED[:prompts], CompareSettings(concurrency=[1], repeat=repeat, warmup=0,
                                                                  interference_check=True))
    asyncio.run(runner.run())
    assert (runner.interference_check is None) == checked
    assert ic.needs_check(ic.ALONE + ic.PAIRS - 1) and not ic.needs_check(ic.ALONE + ic.PAIRS)


def test_one_server_given_as_both_sides_is_not_checked(stalling):
    """An A/A of one server: there is no other server to stall it."""
    server = Side("same", spec=True)
    wire = stalling(server, server)
    runner = ABRunner(server, server, MIXED, CompareSettings(concurrency=[1], repeat=1, warmup=0,
                                                             interference_check=True))
    records, _, _ = asyncio.run(runner.run())
    assert runner.interference_check is None and len(wire.log) == len(records)


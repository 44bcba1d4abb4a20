"""The A/B runner (orchestration/compare.py) where the runner tests leave it open: one clock for the whole
run, the clients each block reaches its server through, a block stopped by its executor, the settled
counter reads, the executor ``run_compare`` and ``run_one_side`` are given, the servers that exited
during the run, the spec-on path check of each divergence and the report sections' two passes.

The fake servers and wire are those of tests/unit/orchestration/test_compare.py.
"""

from __future__ import annotations

import asyncio
import types

import pytest

from specadapt.analysis import sections as analyses
from specadapt.analysis.activity import spec_activity
from specadapt.load import spread
from specadapt.load.plan import RunResult
from specadapt.orchestration import compare
from specadapt.orchestration.compare import ABRunner, run_compare, run_one_side
from specadapt.records import CompareReport, CompareSettings, CounterSnapshot, RequestRecord, Triage
from specadapt.records.interference import InterferenceFinding
from specadapt.records.load import LoadSettings
from tests.unit.orchestration.test_compare import (  # noqa: F401 (fixtures)
    MIXED,
    MS,
    PROMPTS_edge as PROMPTS,
    Side,
    answer,
    detokenizer,
    on_one_clock,
    triager,
    wired,
)


# ------------------------------------------------------------------------------ one clock for the run

def test_every_request_of_a_run_is_timed_from_the_runs_start(wired, monkeypatch):
    """Every request takes 10 ms of the (fake) clock to start: the warm-up, the interleaved pairs at
    concurrency 1 and the blocks at concurrency 2 are sent at 0, 10, 20, ... ms of one timeline, the
    run's, not from each block's own start."""
    off, on = Side("off"), Side("on")
    on_one_clock(wired, monkeypatch, off, on, 10 * MS)
    seen: list[RequestRecord] = []
    settings = CompareSettings(concurrency=[1, 2], repeat=1, warmup=1)
    records, _, _ = asyncio.run(ABRunner(off, on, PROMPTS, settings, seen.append).run())
    # warm-up off, on; level 1: p0 off, on, p1 on, off; level 2: the off block of 4, then the on block
    assert [(r.side, r.prompt_id, r.warmup, r.sent_at_ns // MS) for r in seen[:6]] == [
        ("off", "p0", True, 0), ("on", "p0", True, 10), ("off", "p0", False, 20), ("on", "p0", False, 30),
        ("on", "p1", False, 40), ("off", "p1", False, 50)]
    assert sorted(r.sent_at_ns for r in seen) == [i * 10 * MS for i in range(14)]
    assert [(r.side, r.concurrency) for r in seen[6:]] == [("off", 2)] * 4 + [("on", 2)] * 4
    assert len(seen) == 2 + len(records) and not any(r.warmup for r in records)


# ------------------------------------------------------------------------------ clients and blocks

def test_the_warm_up_and_concurrency_1_reach_each_server_through_its_one_stream_client(wired, monkeypatch):
    """Blocks at concurrency 1 (the warm-up's too) are closed loops of one stream: each side opens one
    client of width 1, which the warm-up warms and every pair reuses, and one of width N for the
    blocks at concurrency N."""
    opened: list[tuple[str, int]] = []
    real = spread.client_for

    def client_for(target, settings, concurrency):
        opened.append((target.base_url, concurrency))
        return real(target, settings, concurrency)

    monkeypatch.setattr(spread, "client_for", client_for)
    off, on = Side("off"), Side("on")
    wired(off, on)
    records, _, _ = asyncio.run(ABRunner(off, on, PROMPTS, CompareSettings(concurrency=[1, 4], repeat=2,
                                                                           warmup=2)).run())
    assert opened == [("http://off.invalid", 1), ("http://on.invalid", 1), ("http://off.invalid", 4),
                      ("http://on.invalid", 4)]
    assert len(records) == 2 * 2 * 2 + 2 * 2 * 2 * 4


class Stopped(spread.InProcess):
    """An executor whose second run stops early (a server died under it)."""

    def __init__(self):
        super().__init__()
        self.runs = 0
        self.closed = False

    async def run(self, shares, targets, progress=None, watch=None, accept=None, t0_ns=None):
        self.runs += 1
        if self.runs == 2:
            return RunResult(partial_reason="the vllm server exited with code -9")
        return await super().run(shares, targets, progress, watch, accept, t0_ns)

    async def aclose(self):
        self.closed = True
        await super().aclose()


def test_a_block_that_its_executor_stopped_ends_the_run_with_the_executors_reason(wired):
    off, on = Side("off"), Side("on")
    wired(off, on)
    executor = Stopped()
    runner = ABRunner(off, on, PROMPTS, CompareSettings(concurrency=[1], repeat=1, warmup=0), executor=executor)
    with pytest.raises(spread.WorkerStopped, match="^the vllm server exited with code -9$"):
        asyncio.run(runner.run())
    assert executor.runs == 2 and executor.closed


# ------------------------------------------------------------------------------ counters

def test_the_counters_around_each_level_and_rate_are_the_settled_reads(wired, monkeypatch):
    """Each window's before and after are what ``settle_counters`` answers (it waits for the
    server's counters to stop moving), read in order: before and after each level, then each rate."""
    off, on = Side("off"), Side("on", spec=True)
    wired(off, on)
    reads: list[str] = []

    def settle(server):
        reads.append(server.name)
        return CounterSnapshot(drafts=len(reads), generation_tokens=100 + len(reads))

    monkeypatch.setattr(compare, "settle_counters", settle)
    runner = ABRunner(off, on, PROMPTS, CompareSettings(concurrency=[1, 2], repeat=1, warmup=0,
                                                        load=LoadSettings(request_rates=[float("inf")])))
    _, on_c, off_c = asyncio.run(runner.run())
    assert reads == ["off", "on"] * 6
    assert {lv: (p.before.drafts, p.after.drafts) for lv, p in off_c.items()} == {1: (1, 3), 2: (5, 7)}
    assert {lv: (p.before.drafts, p.after.drafts) for lv, p in on_c.items()} == {1: (2, 4), 2: (6, 8)}
    assert {side: {k: (p.before.drafts, p.after.drafts) for k, p in c.items()}
            for side, c in runner.rate_counters.items()} == {"off": {"inf": (9, 11)}, "on": {"inf": (10, 12)}}


# ------------------------------------------------------------------------------ run_compare / run_one_side

class Recording(spread.InProcess):
    """This process's executor, counting its runs and whether it was closed as a context."""

    def __init__(self):
        super().__init__()
        self.runs = 0
        self.exited = False

    async def run(self, *args, **kw):
        self.runs += 1
        return await super().run(*args, **kw)

    def __exit__(self, *exc):
        self.exited = True
        super().__exit__(*exc)


@pytest.fixture
def executors(monkeypatch):
    made: list[tuple[int, str | None, Recording]] = []

    def executor_for(workers=1, ray_address=None):
        made.append((workers, ray_address, Recording()))
        return made[-1][2]

    monkeypatch.setattr(compare, "executor_for", executor_for)
    return made


def test_run_compare_sends_every_block_through_the_executor_of_its_workers_and_ray_address(
        wired, triager, detokenizer, executors):
    off, on = Side("off", spec=False), Side("on", spec=True)
    wired(off, on)
    settings = CompareSettings(concurrency=[1], repeat=1, warmup=1, workers=3, ray_address="ray://head:10001",
                               dtype="float32")
    report = run_compare(off, on, PROMPTS, settings)
    ((workers, address, executor),) = executors
    assert (workers, address) == (3, "ray://head:10001")
    assert executor.runs == 2 + 2 * 2 and executor.exited  # the warm-up, then a block per request
    assert len(report.requests) == 4


def test_run_one_side_sends_every_block_through_the_executor_of_its_workers_and_ray_address(wired, executors):
    server = Side("on", spec=True)
    wired(server)
    settings = CompareSettings(concurrency=[1], repeat=1, warmup=0, workers=2, ray_address="auto")
    _, records, _ = run_one_side(server, "on", PROMPTS, settings)
    ((workers, address, executor),) = executors
    assert (workers, address) == (2, "auto") and executor.runs == 2 and executor.exited
    assert [(r.side, r.prompt_id) for r in records] == [("on", "p0"), ("on", "p1")]


class Exited:
    """A started server's process that has exited: its return code and its log."""

    def __init__(self, code: int | None):
        self.proc = types.SimpleNamespace(poll=lambda: code)
        self.log_path = f"/runs/{code}.log"
        self.code = code

    def alive(self) -> bool:
        return self.code is None

    def log_tail(self) -> str:
        return ""


def test_a_server_that_exited_during_the_run_is_named_in_the_report_with_how_far_the_run_got(
        wired, triager, detokenizer):
    off, on = Side("off", spec=False), Side("on", spec=True)
    off.process, on.process = Exited(-9), Exited(None)  # spec-off died, spec-on still runs
    wired(off, on)
    report = run_compare(off, on, PROMPTS, CompareSettings(concurrency=[1], repeat=1, warmup=0, dtype="float32"))
    assert report.server_exits == [
        "the spec-off server exited with code -9 during the run; 4 of 4 requests had succeeded (log: /runs/-9.log)"]
    on.process = Exited(1)
    report = run_compare(off, on, PROMPTS, CompareSettings(concurrency=[1], repeat=1, warmup=0, dtype="float32"))
    assert [e.split(" during")[0] for e in report.server_exits] == [
        "the spec-off server exited with code -9", "the spec-on server exited with code 1"]


def test_a_server_given_by_url_is_never_named_as_exited(wired, triager, detokenizer):
    off, on = Side("off", spec=False), Side("on", spec=True)
    wired(off, on)
    report = run_compare(off, on, PROMPTS, CompareSettings(concurrency=[1], repeat=1, warmup=0, dtype="float32"))
    assert report.server_exits == []


# ------------------------------------------------------------------------------ finish_compare

def test_each_divergence_is_checked_on_the_spec_on_answers_own_path_and_its_token_made_readable(
        wired, triager, detokenizer, monkeypatch):
    """After the server's triage, the spec-on record paired with the divergence's spec-off record is
    checked on its own path (asked as it was sent, with the spec-on side's own history), with the
    server's verdict, the threshold and the backend's token requests; its token is made readable by
    the spec-off server."""
    calls: list[tuple] = []

    def path_triage(server, prompt, on_rec, div, base, threshold, requests):
        calls.append((server, prompt, on_rec, div, base, threshold, requests))
        return base.model_copy(update={"path_checked": 3, "path_token": "token_id:7"})

    monkeypatch.setattr(compare, "path_triage", path_triage)
    off, on = Side("off", spec=False), Side("on", spec=True, k=2)
    wired(off, on)
    report = run_compare(off, on, MIXED, CompareSettings(concurrency=[1], repeat=1, warmup=0, dtype="float32"))
    assert sorted(c[1].id for c in calls) == ["bug", "chat", "tie"]
    requests = compare.token_requests_of(off)
    for server, prompt, on_rec, div, base, threshold, asked in calls:
        assert server is off and threshold == 0.01 and asked == requests
        assert (on_rec.side, on_rec.prompt_id, on_rec.turn, on_rec.concurrency) == ("on", prompt.id, div.turn, 1)
        assert on_rec.tokens == answer("on", prompt, div.turn)
        assert base.verdict == {"tie": "near-tie", "bug": "suspect"}.get(prompt.id, "unknown")  # the server's
    (chat,) = [c for c in calls if c[1].id == "chat"]
    # the later turn asked as the spec-on side sent it: with its own earlier answer
    assert [(m.role, m.content) for m in chat[1].messages] == [
        ("user", "hi"), ("assistant", "<0><1><2><3>"), ("user", "more")]
    triaged = {p.prompt_id: p.divergence.triage for p in report.identity if p.divergence}
    assert {k: (t.path_checked, t.path_token) for k, t in triaged.items()} == {
        k: (3, "w7 (id 7)") for k in ("bug", "chat", "tie")}
    assert ("off", [7]) in detokenizer


def test_without_a_spec_on_partner_no_path_is_checked(wired, triager, detokenizer, monkeypatch):
    """A divergence whose spec-off record has no spec-on record of the same key (not paired) gets the
    server's triage only."""
    calls: list = []
    monkeypatch.setattr(compare, "path_triage", lambda *a: calls.append(a))
    monkeypatch.setattr(compare, "partner", lambda records, off_rec: None)
    off, on = Side("off", spec=False), Side("on", spec=True)
    wired(off, on)
    report = run_compare(off, on, MIXED, CompareSettings(concurrency=[1], repeat=1, warmup=0, dtype="float32"))
    assert calls == [] and report.counts == {"identical": 1, "near-tie": 1, "suspect": 1, "unknown": 1}


def test_the_report_carries_the_spec_on_servers_activity(wired, triager, detokenizer):
    off, on = Side("off", spec=False), Side("on", spec=True, k=2)
    wired(off, on)
    report = run_compare(off, on, PROMPTS, CompareSettings(concurrency=[1], repeat=1, warmup=0, dtype="float32"))
    assert report.activity is not None and report.activity == spec_activity(report)


def test_each_section_is_analysed_once_before_or_after_the_diagnosis(wired, triager, detokenizer, monkeypatch):
    """A section marked before the diagnosis is analysed once, before it (the diagnosis and the notes
    may read it); the others once, after it."""
    seen: list[tuple[str, bool]] = []

    def early(report: CompareReport) -> InterferenceFinding:
        seen.append(("early", report.diagnosis is not None))
        return InterferenceFinding(alpha=0.05, text="early")

    def late(report: CompareReport) -> InterferenceFinding:
        seen.append(("late", report.diagnosis is not None))
        return InterferenceFinding(alpha=0.05, text="late")

    monkeypatch.setattr(analyses, "SECTIONS", (
        analyses.Section("early", InterferenceFinding, early, before_diagnosis=True),
        analyses.Section("late", InterferenceFinding, late)))
    off, on = Side("off", spec=False), Side("on", spec=True)
    wired(off, on)
    report = run_compare(off, on, PROMPTS, CompareSettings(concurrency=[1], repeat=1, warmup=0, dtype="float32"))
    assert seen == [("early", False), ("late", True)]
    assert {k: v["text"] for k, v in report.sections.items()} == {"early": "early", "late": "late"}

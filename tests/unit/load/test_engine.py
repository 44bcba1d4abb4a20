"""The load engine (load/engine.py) on an injected clock: open-loop send times, closed-loop
concurrency and order, --duration, multi-turn conversations. No real time is measured."""

from __future__ import annotations

import asyncio
import itertools
import pickle

import pytest

from specadapt.load.engine import Job, LoadEngine, cycle_jobs, key, turn_prompt, turns_of
from specadapt.records import ChatMessage, Prompt, RequestRecord

MS = 1_000_000


class FakeTime:
    """Virtual ns clock: sleep(s) moves it forward by s (plus ``overshoot_ns``, a late timer)."""

    def __init__(self, start: int = 5_000 * MS, overshoot_ns: int = 0):
        self.now, self.overshoot = start, overshoot_ns
        self.sleeps: list[float] = []

    def clock(self) -> int:
        return self.now

    async def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.now += int(round(s * 1e9)) + self.overshoot
        await asyncio.sleep(0)


class FakeServer:
    """``send``: records the send time on the fake clock, serves for ``service_ms`` of virtual time."""

    def __init__(self, t: FakeTime, t0: int, service_ms: int = 0, fail: set[tuple[str, int]] | None = None):
        self.t, self.t0, self.service = t, t0, service_ms * MS
        self.fail = fail or set()
        self.in_flight, self.max_in_flight = 0, 0
        self.sent: list[tuple[str, int, int, list[dict]]] = []  # (prompt id, turn, sent ns, messages)
        self.busy: set[tuple[str, int]] = set()
        self.hold_until: int | None = None  # keep every request open until this many were sent
        self.released = asyncio.Event()

    async def send(self, prompt: Prompt, job: Job, turn: int) -> RequestRecord:
        conv = (prompt.id, job.repeat)
        assert conv not in self.busy, "two turns of one conversation in flight"
        self.busy.add(conv)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        sent = self.t.clock() - self.t0
        self.sent.append((prompt.id, turn, sent, [m.model_dump() for m in prompt.messages or []]))
        if self.hold_until is not None:
            if len(self.sent) >= self.hold_until:
                self.released.set()
            await self.released.wait()
        await asyncio.sleep(0)
        self.t.now += self.service
        await asyncio.sleep(0)
        self.in_flight -= 1
        self.busy.discard(conv)
        ok = (prompt.id, turn) not in self.fail
        return RequestRecord(prompt_id=prompt.id, category=prompt.category, api=prompt.api, repeat=job.repeat,
                             ok=ok, sent_at_ns=sent, e2e_ns=self.service, output_tokens=2 if ok else 0,
                             text=f"answer {prompt.id}/{turn}", error=None if ok else "boom")


P = [Prompt(id=f"p{i}", prompt=f"text {i}") for i in range(3)]
CHAT = Prompt(id="chat", messages=[ChatMessage(role="system", content="be brief"),
                                   ChatMessage(role="user", content="first")], turns=["second", "third"])


def engine(t: FakeTime, srv: FakeServer) -> LoadEngine:
    return LoadEngine(srv.send, clock=t.clock, sleep=t.sleep)


def test_open_loop_sends_each_job_at_its_offset_and_records_the_schedule():
    t = FakeTime()
    t0 = t.now
    srv = FakeServer(t, t0)
    offsets = [0, 250 * MS, 250 * MS, 900 * MS]
    jobs = [Job(prompt=P[i % 3], repeat=i, offset_ns=o) for i, o in enumerate(offsets)]
    recs = asyncio.run(engine(t, srv).open_loop(jobs, t0))
    assert [r.scheduled_at_ns for r in recs] == offsets
    assert [r.sent_at_ns for r in recs] == offsets  # a punctual client: no lag
    assert t.sleeps == [pytest.approx(0.25), pytest.approx(0.65)]  # no sleep for a job already due


def test_open_loop_does_not_wait_for_requests_in_flight():
    t = FakeTime()
    srv = FakeServer(t, t.now, service_ms=0)
    srv.hold_until = 6
    jobs = [Job(prompt=P[0], repeat=i, offset_ns=0) for i in range(6)]
    asyncio.run(engine(t, srv).open_loop(jobs, t.now))
    assert srv.max_in_flight == 6  # all at once (rate inf): every request in flight together


def test_open_loop_lag_shows_a_late_timer():
    t = FakeTime(overshoot_ns=3 * MS)
    t0 = t.now
    srv = FakeServer(t, t0)
    jobs = [Job(prompt=P[0], repeat=i, offset_ns=i * 100 * MS) for i in range(4)]
    recs = asyncio.run(engine(t, srv).open_loop(jobs, t0))
    assert [r.sent_at_ns - r.scheduled_at_ns for r in recs] == [0, 3 * MS, 3 * MS, 3 * MS]


def test_open_loop_returns_records_in_job_order_whatever_the_offsets():
    t = FakeTime()
    srv = FakeServer(t, t.now)
    jobs = [Job(prompt=P[0], repeat=0, offset_ns=300 * MS), Job(prompt=P[1], repeat=0, offset_ns=0)]
    recs = asyncio.run(engine(t, srv).open_loop(jobs, t.now))
    assert [r.prompt_id for r in recs] == ["p0", "p1"] and [s[0] for s in srv.sent] == ["p1", "p0"]


@pytest.mark.parametrize("n", [1, 2, 4])
def test_closed_loop_keeps_at_most_n_in_flight_and_job_order(n):
    t = FakeTime()
    srv = FakeServer(t, t.now, service_ms=10)
    jobs = [Job(prompt=p, repeat=r) for r in range(3) for p in P]
    recs = asyncio.run(engine(t, srv).closed_loop(jobs, t.now, n))
    assert srv.max_in_flight == n
    assert [(r.prompt_id, r.repeat) for r in recs] == [(j.prompt.id, j.repeat) for j in jobs]
    assert all(r.scheduled_at_ns is None for r in recs)
    assert [s[0] for s in srv.sent] == [j.prompt.id for j in jobs]  # started in job order


def test_closed_loop_with_a_duration_cycles_the_prompts_and_starts_none_after_it():
    t = FakeTime()
    t0 = t.now
    srv = FakeServer(t, t0, service_ms=100)
    recs = asyncio.run(engine(t, srv).closed_loop(cycle_jobs([Job(prompt=p) for p in P]), t0, 2, duration_s=1.0))
    assert max(r.sent_at_ns for r in recs) < 1_000 * MS
    assert len(recs) >= 10  # 2 streams x 1 s / 100 ms, kept busy
    assert [r.prompt_id for r in recs[:6]] == ["p0", "p1", "p2"] * 2
    assert [r.repeat for r in recs[:6]] == [0, 0, 0, 1, 1, 1]


def test_turn_prompt_builds_history_with_the_servers_answers():
    assert turn_prompt(CHAT, 0, []) is CHAT
    p2 = turn_prompt(CHAT, 2, ["A0", "A1"])
    assert [(m.role, m.content) for m in p2.messages] == [
        ("system", "be brief"), ("user", "first"), ("assistant", "A0"), ("user", "second"),
        ("assistant", "A1"), ("user", "third")]
    assert p2.turns is None and p2.id == "chat" and turns_of(CHAT) == 3 and turns_of(P[0]) == 1


def test_a_conversation_runs_its_turns_in_order_one_record_each():
    t = FakeTime()
    t0 = t.now
    srv = FakeServer(t, t0, service_ms=40)
    jobs = [Job(prompt=CHAT, repeat=0, offset_ns=100 * MS), Job(prompt=CHAT, repeat=1, offset_ns=110 * MS)]
    recs = asyncio.run(engine(t, srv).open_loop(jobs, t0))
    assert [(r.repeat, r.turn) for r in recs] == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    assert [r.scheduled_at_ns for r in recs] == [100 * MS, None, None, 110 * MS, None, None]
    turn1 = [m for pid, turn, _, m in srv.sent if turn == 1][0]
    assert turn1[-2:] == [{"role": "assistant", "content": "answer chat/0"}, {"role": "user", "content": "second"}]
    first = [r for r in recs if r.repeat == 0]
    assert first[1].sent_at_ns >= first[0].sent_at_ns + 40 * MS  # a later turn follows the answer at once
    assert first[1].sent_at_ns < first[0].sent_at_ns + 200 * MS


def test_a_failed_turn_ends_its_conversation_later_turns_recorded_as_not_sent():
    t = FakeTime()
    srv = FakeServer(t, t.now, fail={("chat", 1)})
    recs = asyncio.run(engine(t, srv).closed_loop([Job(prompt=CHAT, copy_index=2)], t.now, 1))
    assert [(r.turn, r.ok, r.error_kind) for r in recs] == [(0, True, None), (1, False, None), (2, False, "not_sent")]
    assert "turn 1" in recs[2].error and all(r.replica == 2 for r in recs)
    assert [turn for _, turn, _, _ in srv.sent] == [0, 1]


def test_every_record_is_handed_on_as_it_finishes_with_its_job_unsent_turns_too():
    t = FakeTime()
    srv = FakeServer(t, t.now, fail={("chat", 1)})
    seen = []
    eng = LoadEngine(srv.send, clock=t.clock, sleep=t.sleep, on_record=lambda job, rec: seen.append((job, rec)))
    jobs = [Job(prompt=CHAT, index=4, copy_index=2), Job(prompt=P[0], index=5)]
    recs = asyncio.run(eng.closed_loop(jobs, t.now, 1))
    assert [(j.index, r.turn, r.error_kind) for j, r in seen] == [(4, 0, None), (4, 1, None), (4, 2, "not_sent"),
                                                                   (5, 0, None)]
    assert [r for _, r in seen] == recs == eng.finished


def test_cycling_counts_the_passes_in_the_field_asked_for():
    jobs = [Job(prompt=P[0], index=0, repeat=3), Job(prompt=P[1], index=1, repeat=3)]
    by_repeat = list(itertools.islice(cycle_jobs(jobs), 6))
    assert [(j.index, j.repeat, j.copy_index) for j in by_repeat] == [(0, 3, 0), (1, 3, 0), (0, 4, 0), (1, 4, 0),
                                                                        (0, 5, 0), (1, 5, 0)]
    by_copy = list(itertools.islice(cycle_jobs(jobs, "copy_index"), 4))
    assert [(j.index, j.repeat, j.copy_index) for j in by_copy] == [(0, 3, 0), (1, 3, 0), (0, 3, 1), (1, 3, 1)]
    assert by_repeat[0] is jobs[0]  # the first pass is the jobs themselves


def test_the_one_process_order_is_repeat_copy_job_turn():
    rec = RequestRecord(prompt_id="x", category="c", api="chat", turn=2)
    assert key(Job(prompt=P[0], index=7, repeat=1, copy_index=3), rec) == (1, 3, 7, 2)


def test_jobs_and_records_pickle_for_other_processes():
    job = Job(prompt=CHAT, repeat=3, copy_index=1, offset_ns=7)
    assert pickle.loads(pickle.dumps(job)) == job
    assert Job.model_validate_json(job.model_dump_json()) == job

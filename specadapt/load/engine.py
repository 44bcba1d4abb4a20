"""The load engine: runs jobs closed-loop at a concurrency or open-loop on a schedule.

A *job* is one prompt to send: its place in the one-process order (``index``), its repeat and
copy indices, the replica it goes to (``target``), and for open-loop runs its send offset in
ns from the run's start, ``t0``. The engine does not know HTTP: it calls
``send(prompt, job, turn)``, a coroutine that returns the RequestRecord (``load.spread``
passes one around ``client.stream_request``). Jobs and records are pydantic and the engine
keeps no global state, so a share of the jobs can be run by another process or a Ray actor
with the same ``t0`` (the clocks are CLOCK_MONOTONIC, the same on one machine).

Closed loop (``concurrency=N``): at most N jobs in flight; the next job starts when one
finishes, in job order. With ``duration_s`` the jobs are cycled (``cycle``: a field of the
job counts the passes) and no job starts after ``t0 + duration_s``: the streams stay busy
until the time is up. Records come back in job order.

Open loop (``offset_ns`` set on every job): each job is sent at ``t0 + offset_ns``,
however many are in flight; the record keeps ``scheduled_at_ns`` beside ``sent_at_ns``.

Multi-turn. A prompt with ``turns`` is one conversation and one job: turn 0 is the prompt's
messages; turn i (i >= 1) is sent once turn i-1 has finished, with the messages so far,
the server's own answer (its streamed text) as the assistant message, and the user's turn
i. Turns of a conversation never run concurrently and keep its slot (closed loop); in
open loop only turn 0 has a scheduled time, later turns follow at once. A failed turn
ends its conversation: each later turn is recorded as not sent (``ok`` false,
``error_kind`` "not_sent"), so every planned turn has a record.

Time comes from the injected ``clock`` (integer ns) and ``sleep`` (seconds), so tests run
the open-loop timing on a fake clock.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from typing import Literal, Protocol

from pydantic import BaseModel, Field

from specadapt.records import ChatMessage, Prompt, RequestRecord


class Job(BaseModel):
    """One prompt (a conversation when it has turns) to send."""

    prompt: Prompt
    index: int = Field(0, description="Place in the order one process sends the jobs of a run.")
    target: int = Field(0, description="The replica (server) it goes to, an index into the run's targets.")
    repeat: int = 0
    copy_index: int = Field(0, description="Copy of the prompt within a block (RequestRecord.replica).")
    offset_ns: int | None = Field(None, description="Open loop: send at t0 + this; None: closed loop.")


class Send(Protocol):
    def __call__(self, prompt: Prompt, job: Job, turn: int) -> Awaitable[RequestRecord]: ...


Clock = Callable[[], int]
Sleep = Callable[[float], Awaitable[None]]


def turn_prompt(prompt: Prompt, turn: int, answers: list[str]) -> Prompt:
    """The request of ``turn``: the first messages, then per earlier turn the answer and the next user turn."""
    if turn == 0:
        return prompt
    msgs = list(prompt.messages or [])
    for i in range(turn):
        msgs.append(ChatMessage(role="assistant", content=answers[i]))
        msgs.append(ChatMessage(role="user", content=(prompt.turns or [])[i]))
    return prompt.model_copy(update={"messages": msgs, "turns": None})


def turns_of(prompt: Prompt) -> int:
    return 1 + len(prompt.turns or [])


def not_sent(failed: RequestRecord, turn: int) -> RequestRecord:
    """The record of a turn left unsent after ``failed`` (same conversation, side and level)."""
    return RequestRecord(prompt_id=failed.prompt_id, category=failed.category, api=failed.api, repeat=failed.repeat,
                         replica=failed.replica, turn=turn, side=failed.side, concurrency=failed.concurrency,
                         request_rate=failed.request_rate, warmup=failed.warmup, ok=False,
                         error=f"not sent: turn {failed.turn} of this conversation failed", error_kind="not_sent",
                         sent_at_ns=failed.sent_at_ns)


CycleField = Literal["repeat", "copy_index"]


def cycle_jobs(jobs: Sequence[Job], field: CycleField = "repeat") -> Iterator[Job]:
    """Duration runs: ``jobs`` over and over, ``field`` counting the passes (added to its value)."""
    for n in itertools.count():
        for job in jobs:
            yield job if n == 0 else job.model_copy(update={field: getattr(job, field) + n})


def key(job: Job, rec: RequestRecord) -> tuple[int, int, int, int]:
    """A record's place in the one-process order of a run: (repeat, copy, job index, turn)."""
    return job.repeat, job.copy_index, job.index, rec.turn


OnRecord = Callable[[Job, RequestRecord], None]


class LoadEngine:
    """Runs jobs through ``send``; ``finished`` holds the records done so far (also after a cancel)."""

    def __init__(self, send: Send, *, clock: Clock = time.perf_counter_ns, sleep: Sleep = asyncio.sleep,
                 on_record: OnRecord | None = None):
        self.send, self.clock, self.sleep, self.on_record = send, clock, sleep, on_record
        self.finished: list[RequestRecord] = []

    def _finish(self, job: Job, rec: RequestRecord) -> None:
        self.finished.append(rec)
        if self.on_record is not None:
            self.on_record(job, rec)

    async def conversation(self, job: Job) -> list[RequestRecord]:
        """All turns of one job, in order."""
        out: list[RequestRecord] = []
        answers: list[str] = []
        for turn in range(turns_of(job.prompt)):
            if out and not out[-1].ok:
                failed = out[-1] if out[-1].error_kind != "not_sent" else next(r for r in out if not r.ok)
                out.append(not_sent(failed, turn))
                self._finish(job, out[-1])
                continue
            rec = await self.send(turn_prompt(job.prompt, turn, answers), job, turn)
            rec.turn, rec.replica = turn, job.copy_index
            if turn == 0 and job.offset_ns is not None:
                rec.scheduled_at_ns = job.offset_ns
            answers.append(rec.text)
            out.append(rec)
            self._finish(job, rec)
        return out

    async def closed_loop(self, jobs: Iterable[Job], t0_ns: int, concurrency: int,
                          duration_s: float | None = None) -> list[RequestRecord]:
        """At most ``concurrency`` jobs in flight, in job order; with ``duration_s`` none starts after it."""
        source = iter(enumerate(jobs))
        results: dict[int, list[RequestRecord]] = {}
        deadline = None if duration_s is None else t0_ns + int(duration_s * 1e9)

        async def worker() -> None:
            for index, job in source:  # the shared iterator hands each job to one worker
                if deadline is not None and self.clock() >= deadline:
                    return
                results[index] = await self.conversation(job)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return _in_order(results)

    async def open_loop(self, jobs: Iterable[Job], t0_ns: int) -> list[RequestRecord]:
        """Each job sent at ``t0 + offset_ns`` (in offset order), whatever is in flight."""
        ordered = sorted(enumerate(jobs), key=lambda ij: (ij[1].offset_ns or 0, ij[0]))
        tasks: dict[int, asyncio.Task] = {}
        try:
            for index, job in ordered:
                wait_ns = t0_ns + (job.offset_ns or 0) - self.clock()
                if wait_ns > 0:
                    await self.sleep(wait_ns / 1e9)
                tasks[index] = asyncio.ensure_future(self.conversation(job))
                await asyncio.sleep(0)  # let it send before the next arrival is waited for
            await asyncio.gather(*tasks.values())
        finally:
            for t in tasks.values():
                t.cancel()
        return _in_order({i: t.result() for i, t in tasks.items()})


def _in_order(results: dict[int, list[RequestRecord]]) -> list[RequestRecord]:
    return [rec for i in sorted(results) for rec in results[i]]

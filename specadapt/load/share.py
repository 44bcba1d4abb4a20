"""One share of a probe's jobs, run in the current process: the seam every executor uses.

``execute_share`` streams a share's jobs from this process's event loop at the share's
concurrency and returns (job index, record) pairs; the in-process path, every worker process
and every Ray actor run it, so a load engine plugs in here. ``worker_main`` is a worker
process's entry point. This module imports little (no adapters, no CLI): a spawned worker
starts fast.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from specadapt.load.client import StreamClient, connect, stream_request
from specadapt.load.client import run as run_loop
from specadapt.load.engine import Job as EngineJob
from specadapt.load.engine import LoadEngine, turns_of
from specadapt.records import Prompt, RequestRecord, RequestSettings


# --- jobs and shares ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Job:
    """One request to send: ``index`` is its place in the one-process order."""

    index: int
    prompt: Prompt
    repeat: int = 0
    target: int = 0


@dataclass(frozen=True)
class Share:
    """What one worker runs: its jobs, at most ``concurrency`` streams at a time."""

    worker: int
    jobs: tuple[Job, ...]
    concurrency: int


def plan_jobs(prompts: Sequence[Prompt], repeat: int, replicas: int = 1) -> list[Job]:
    """The jobs in the order one process sends them; job i to replica i mod ``replicas``."""
    if replicas < 1:
        raise ValueError("at least one replica")
    order = [(p, r) for r in range(repeat) for p in prompts]
    return [Job(index=i, prompt=p, repeat=r, target=i % replicas) for i, (p, r) in enumerate(order)]


def split_jobs(jobs: Sequence[Job], concurrency: int, workers: int) -> list[Share]:
    """``jobs`` over at most ``workers`` workers (job i to worker i mod W) and ``concurrency``
    over them (C // W each, the first C mod W one more); W = min(workers, jobs, concurrency)."""
    if workers < 1 or concurrency < 1:
        raise ValueError("workers and concurrency must be at least 1")
    if not jobs:
        return []
    n = min(workers, len(jobs), concurrency)
    base, extra = divmod(concurrency, n)
    return [Share(worker=w, jobs=tuple(jobs[w::n]), concurrency=base + (1 if w < extra else 0)) for w in range(n)]


# --- where requests go ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Target:
    """What a worker needs to reach one server (picklable: no sockets, no SSL contexts)."""

    base_url: str
    model: str
    headers: dict[str, str] = field(default_factory=dict)
    verify: bool | str = True  # httpx verify: on, off, or a CA bundle path


def client_for(target: Target, settings: RequestSettings,
               concurrency: int) -> contextlib.AbstractAsyncContextManager[StreamClient]:
    """The streaming client for one target in this process (one per event loop)."""
    return connect(target.base_url, headers=target.headers, verify=target.verify, concurrency=concurrency,
                   request_timeout_s=settings.request_timeout_s)


OnRecord = Callable[[Job, RequestRecord], None]


async def execute_share(share: Share, targets: Sequence[Target], settings: RequestSettings, run_t0_ns: int,
                        on_record: OnRecord | None = None) -> list[tuple[int, RequestRecord]]:
    """Stream ``share``'s jobs from this process's event loop, at most ``share.concurrency`` at a
    time, send times counted from ``run_t0_ns`` (time.perf_counter_ns); (job index, record) pairs.
    The load engine runs them: a prompt with ``turns`` is one conversation (one job, a record
    per turn, the server's own answers as the history), exactly as in one process."""
    used = sorted({j.target for j in share.jobs})
    async with contextlib.AsyncExitStack() as stack:
        clients = {t: await stack.enter_async_context(client_for(targets[t], settings, share.concurrency))
                   for t in used}
        engine_jobs = [EngineJob(prompt=j.prompt, repeat=j.repeat) for j in share.jobs]
        of = {id(ej): j for ej, j in zip(engine_jobs, share.jobs)}

        async def send(prompt: Prompt, engine_job: EngineJob, turn: int) -> RequestRecord:
            job = of[id(engine_job)]
            target = targets[job.target]
            rec = await stream_request(clients[job.target], prompt, target.model, settings, run_t0_ns,
                                       repeat=job.repeat)
            rec.target, rec.turn = target.base_url, turn
            if on_record is not None:
                on_record(job, rec)
            return rec

        records = await LoadEngine(send).closed_loop(engine_jobs, run_t0_ns, share.concurrency)
    pairs: list[tuple[int, RequestRecord]] = []
    it = iter(records)
    for job in share.jobs:  # the engine returns every planned turn of every job, in job order
        for _ in range(turns_of(job.prompt)):
            rec = next(it)
            if rec.error_kind == "not_sent":  # made by the engine after a failed turn, never sent
                rec.target = targets[job.target].base_url
                if on_record is not None:
                    on_record(job, rec)
            pairs.append((job.index, rec))
    return pairs


async def _watchdog(parent_pid: int, stop) -> None:
    """Worker side: end the worker when the parent is gone or asks it to stop."""
    while os.getppid() == parent_pid and not stop.is_set():
        await asyncio.sleep(0.1)


def worker_main(share: Share, targets: Sequence[Target], settings: RequestSettings, parent_pid: int,
                 go, stop, t0_value, out) -> None:
    """Entry point of a worker process: wait for the start signal, stream the share, send each
    record to the parent as it finishes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's: it stops the workers
    out.put(("ready", share.worker, os.getpid(), socket.gethostname()))
    while not go.wait(0.1):
        if os.getppid() != parent_pid or stop.is_set():
            return
    t0 = t0_value.value
    if stop.is_set() or t0 < 0:
        return

    async def main() -> None:
        work = asyncio.ensure_future(execute_share(
            share, targets, settings, t0, on_record=lambda job, rec: out.put(("record", share.worker, job.index, rec))))
        guard = asyncio.ensure_future(_watchdog(parent_pid, stop))
        await asyncio.wait({work, guard}, return_when=asyncio.FIRST_COMPLETED)
        for task in (work, guard):
            task.cancel()
        await asyncio.gather(work, guard, return_exceptions=True)

    run_loop(main())
    out.put(("done", share.worker, None, None))



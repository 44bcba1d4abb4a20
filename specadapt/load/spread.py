"""Where and how a run's jobs are sent: shares of jobs, and the executors that run them in this
process, in worker processes or in Ray actors, to one server or round robin over several.

Every way of sending goes through the same three steps:

- **plan**: ``closed_jobs`` / ``rate_jobs`` make the jobs of one level in the order one process
  sends them (job i to replica i mod R);
- **split**: ``split`` deals them over W workers, job i to worker i mod W. Closed loop: the
  concurrency C over the workers (worker w gets C // W streams, plus one when w < C mod W;
  a worker needs at least one job and one stream, so W is cut to min(W, jobs, C)). Open loop
  (jobs carry their send offsets): the arrivals dealt round robin, W cut to min(W, jobs).
  With a duration each worker cycles its own jobs until the time is up;
- **execute**: ``execute_share`` runs one share through the load engine from the current
  process's event loop; the in-process executor, every worker process and every Ray actor
  run it, so closed loop, open loop, duration and conversations behave the same on every path.

Executors (``Executor.run(shares, targets)``, a coroutine; one run is one level or one block):

- ``InProcess``: this process's event loop.
- ``WorkerPool``: local worker processes (the "spawn" context: a fresh interpreter, no fork
  after threads), started once and reused for every run. Send times are on the parent's
  monotonic clock (CLOCK_MONOTONIC is one clock for every process on a Linux machine): the
  parent reads t0 and hands it to every worker with its share.
- ``RayPool``: Ray actors spread over the cluster's nodes (scheduling strategy SPREAD).
  Machines do not share a monotonic clock, so the driver names one wall-clock start instant;
  each actor sleeps until its own wall clock reaches it, reads its own monotonic t0 there and
  times its records from it. Each actor's clock offset to the driver is estimated from a
  round trip and recorded.

Every finished record comes back to the parent at once (it feeds the progress bar), so a
crash, a dead server or Ctrl-C loses only the requests in flight: ``watch`` (a callable the
parent polls) names a reason to stop, ``accept`` drops records that failed because of it,
and the run returns what finished with the reason (``RunResult.partial_reason``). After
Ctrl-C the executor's ``last`` holds what the interrupted run had gathered.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import queue
import signal
import socket
import ssl
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from pydantic import BaseModel

from specadapt.errors import MissingDependency, SpecadaptError, UsageError
from specadapt.load.arrivals import arrivals_for_duration, schedule_ns
from specadapt.load.client import StreamClient, connect, stream_request
from specadapt.load.client import run as run_loop
from specadapt.load.engine import CycleField, Job, LoadEngine, OnRecord, cycle_jobs, key
from specadapt.load.progress import Progress
from specadapt.records import Prompt, RequestRecord, RequestSettings, WorkerInfo
from specadapt.records.load import LoadSettings

INTERRUPTED = "interrupted (Ctrl-C); every worker was stopped"
OPEN_LOOP_CONNECTIONS = 1024
"""Connections a client may open in an open-loop run (arrivals do not wait for a free stream)."""
POLL_S = 0.2


# --- where requests go ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Target:
    """What a client needs to reach one server. Picklable (for worker processes and Ray actors)
    once ``portable``: no sockets, and a TLS context carried as the CA bundle it was built from."""

    base_url: str
    model: str
    headers: dict[str, str] = field(default_factory=dict)
    verify: bool | str | ssl.SSLContext = True  # on, a CA bundle path, a context, or off


CA_BUNDLE_ATTR = "specadapt_ca_bundle"
"""A TLS context made from a CA bundle file carries the file's path under this attribute."""


def target_of(server: Any) -> Target:
    """A server (``adapters.base.Server``) as a client reaches it (a TLS context as it is: ``portable``
    turns it into the CA bundle it was made from for another process)."""
    return Target(base_url=server.base_url, model=server.model_id, headers=dict(server.headers()),
                  verify=server.verify)


def portable(target: Target) -> Target:
    """``target`` for another process: a TLS context becomes the CA bundle path it was made from
    (a context without one: default verification)."""
    if isinstance(target.verify, ssl.SSLContext):
        return replace(target, verify=getattr(target.verify, CA_BUNDLE_ATTR, None) or True)
    return target


def client_for(target: Target, settings: RequestSettings,
               concurrency: int) -> contextlib.AbstractAsyncContextManager[StreamClient]:
    """The streaming client for one target in this process (one per event loop): its auth and TLS
    settings, a connection per stream."""
    return connect(target.base_url, headers=target.headers, verify=target.verify, concurrency=concurrency,
                   request_timeout_s=settings.request_timeout_s)


# --- jobs and shares ------------------------------------------------------------------------------
class Stamp(BaseModel):
    """What every record of a share is marked with: its side, level and rate (None: left as sent)."""

    side: str | None = None
    concurrency: int | None = None
    request_rate: float | None = None
    warmup: bool = False


@dataclass(frozen=True)
class Share:
    """What one worker runs: its jobs with their request settings; closed loop at most
    ``concurrency`` streams at a time (with ``duration_s``: the jobs cycled, ``cycle`` counting
    the passes, none started after it), open loop on the jobs' offsets when ``concurrency`` is None."""

    worker: int
    jobs: tuple[Job, ...]
    settings: RequestSettings
    concurrency: int | None
    duration_s: float | None = None
    cycle: CycleField = "repeat"
    stamp: Stamp = field(default_factory=Stamp)


def closed_jobs(prompts: Sequence[Prompt], repeat: int = 1, copies: int = 1, replicas: int = 1,
                first_repeat: int = 0) -> list[Job]:
    """The jobs of a closed-loop run in the order one process sends them (repeat by repeat, copy
    by copy, prompt by prompt); job i to replica i mod ``replicas``."""
    if replicas < 1:
        raise ValueError("at least one replica")
    order = [(p, first_repeat + r, c) for r in range(repeat) for c in range(copies) for p in prompts]
    return [Job(index=i, prompt=p, repeat=r, copy_index=c, target=i % replicas) for i, (p, r, c) in enumerate(order)]


def rate_jobs(prompts: Sequence[Prompt], rate: float, load: LoadSettings, *, passes: int = 1, block: int | None = None,
              replicas: int = 1) -> list[Job]:
    """The jobs of one arrival-rate schedule, each with its send offset: ceil(rate * duration) arrivals
    with --duration (at rate inf, and without it, the prompt set ``passes`` times), the prompts
    cycled. ``block``: one block of an A/B run, seeded seed + block, every job of repeat ``block``
    with its pass as the copy index; else the pass is the repeat, seeded by the seed."""
    n = len(prompts) * passes
    if load.duration_s is not None and not math.isinf(rate):
        n = arrivals_for_duration(rate, load.duration_s)
    offsets = schedule_ns(rate, n, load.burstiness, load.seed + (block or 0))
    size = len(prompts)
    return [Job(index=i, prompt=prompts[i % size], offset_ns=off, target=i % replicas,
                repeat=block if block is not None else i // size, copy_index=i // size if block is not None else 0)
            for i, off in enumerate(offsets)]


def split(jobs: Sequence[Job], settings: RequestSettings, concurrency: int | None, workers: int, *,
          duration_s: float | None = None, cycle: CycleField = "repeat", stamp: Stamp | None = None) -> list[Share]:
    """``jobs`` over at most ``workers`` workers (see the module docstring)."""
    if workers < 1 or (concurrency is not None and concurrency < 1):
        raise ValueError("workers and concurrency must be at least 1")
    if not jobs:
        return []
    n = min(workers, len(jobs)) if concurrency is None else min(workers, len(jobs), concurrency)
    stamp = stamp or Stamp()
    if concurrency is None:
        return [Share(worker=w, jobs=tuple(jobs[w::n]), settings=settings, concurrency=None, stamp=stamp)
                for w in range(n)]
    base, extra = divmod(concurrency, n)
    return [Share(worker=w, jobs=tuple(jobs[w::n]), settings=settings, concurrency=base + (1 if w < extra else 0),
                  duration_s=duration_s, cycle=cycle, stamp=stamp) for w in range(n)]


class ClientCache:
    """The streaming clients of one event loop, kept open across runs (a level's or a pair's requests
    reuse their connections, as one client would): one per target, request timeout and width."""

    def __init__(self) -> None:
        self._stack = contextlib.AsyncExitStack()
        self._clients: dict[tuple, StreamClient] = {}

    async def get(self, target: Target, settings: RequestSettings, width: int) -> StreamClient:
        verify = target.verify if not isinstance(target.verify, ssl.SSLContext) else id(target.verify)
        k = (target.base_url, tuple(sorted(target.headers.items())), verify, settings.request_timeout_s, width)
        if k not in self._clients:
            self._clients[k] = await self._stack.enter_async_context(client_for(target, settings, width))
        return self._clients[k]

    @property
    def chunks_read(self) -> int:
        return sum(c.chunks_read for c in self._clients.values())

    async def aclose(self) -> None:
        await self._stack.aclose()
        self._clients.clear()


async def execute_share(share: Share, targets: Sequence[Target], t0_ns: int, on_record: OnRecord | None = None,
                        cache: ClientCache | None = None) -> list[tuple[Job, RequestRecord]]:
    """Stream ``share``'s jobs from this process's event loop, send times counted from ``t0_ns``
    (time.perf_counter_ns); (job, record) pairs, every planned turn of every job (a turn left
    unsent after a failed one is recorded as not sent). ``on_record`` sees each as it finishes.
    ``cache``: clients kept open across runs (without it, the share's own, closed at its end)."""
    used = sorted({j.target for j in share.jobs})
    width = share.concurrency if share.concurrency is not None else OPEN_LOOP_CONNECTIONS
    stamp = share.stamp
    pairs: list[tuple[Job, RequestRecord]] = []

    def finished(job: Job, rec: RequestRecord) -> None:
        rec.target = targets[job.target].base_url
        if stamp.side is not None:
            rec.side = stamp.side  # type: ignore[assignment]
        if stamp.concurrency is not None:
            rec.concurrency = stamp.concurrency
        rec.request_rate = stamp.request_rate
        pairs.append((job, rec))
        if on_record is not None:
            on_record(job, rec)

    own = cache is None
    cache = cache or ClientCache()
    try:
        clients = {t: await cache.get(targets[t], share.settings, width) for t in used}

        async def send(prompt: Prompt, job: Job, turn: int) -> RequestRecord:
            return await stream_request(clients[job.target], prompt, targets[job.target].model, share.settings, t0_ns,
                                        repeat=job.repeat, warmup=stamp.warmup)

        engine = LoadEngine(send, on_record=finished)
        if share.concurrency is None:
            await engine.open_loop(share.jobs, t0_ns)
        elif share.duration_s is not None:
            await engine.closed_loop(cycle_jobs(share.jobs, share.cycle), t0_ns, share.concurrency, share.duration_s)
        else:
            await engine.closed_loop(share.jobs, t0_ns, share.concurrency)
    finally:
        if own:
            await cache.aclose()
    return pairs


# --- one run's result -----------------------------------------------------------------------------
@dataclass
class RunResult:
    """What one run brought back: every accepted record with its job, and why it stopped early
    (None when every job finished)."""

    pairs: list[tuple[Job, RequestRecord]] = field(default_factory=list)
    partial_reason: str | None = None
    planned: int = 0

    @property
    def records(self) -> list[RequestRecord]:
        """The records in the one-process order (repeat, copy, job, turn), whatever sent them."""
        keys = [key(j, r) for j, r in self.pairs]
        if len(set(keys)) != len(keys):
            raise AssertionError("a request came back twice")
        return [r for _, r in sorted(self.pairs, key=lambda p: key(*p))]


Watch = Callable[[], str | None]
"""Polled while a run goes: a reason to stop it (a managed server died), or None."""
Accept = Callable[[RequestRecord], Awaitable[bool]]
"""Whether a record counts as finished (False: it failed because of what ``watch`` reports)."""


def planned_turns(shares: Sequence[Share]) -> int:
    """Requests the shares plan (a conversation's turns each; with a duration, one pass)."""
    return sum(1 + len(j.prompt.turns or []) for s in shares for j in s.jobs)


def _done(info: WorkerInfo) -> str:
    """'3 of 8' (finished of planned), or '12' when a duration cycled past one pass."""
    return f"{info.finished} of {info.jobs}" if info.finished <= info.jobs else str(info.finished)


class Executor:
    """Runs shares and brings their records back to this process; ``infos`` describes the workers."""

    kind = "process"
    shared_clock = True
    """Whether the workers time their records on this process's clock (one machine): then a run
    can be timed from a ``t0_ns`` given for several runs, one timeline."""
    interrupted = "interrupted (Ctrl-C)"
    """The partial reason of a run that Ctrl-C ended."""

    def __init__(self) -> None:
        self.infos: dict[int, WorkerInfo] = {}
        self.last = RunResult()

    def __enter__(self) -> Executor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop every worker (nothing to stop in this process)."""

    async def aclose(self) -> None:
        """Close what this event loop holds open (clients kept across runs)."""

    async def run(self, shares: Sequence[Share], targets: Sequence[Target], progress: Progress | None = None,
                  watch: Watch | None = None, accept: Accept | None = None, t0_ns: int | None = None) -> RunResult:
        """Run ``shares`` together (one level or one block) and gather their records. Send times
        count from ``t0_ns`` (this process's time.perf_counter_ns; default: now); Ray actors
        count from their own start instant."""
        result = self.last = RunResult(planned=planned_turns(shares))
        inbox: asyncio.Queue = asyncio.Queue()
        verdicts: dict[tuple[int, int, int], asyncio.Future] = {}  # a conversation's failed turn: does it count?
        pending: set[asyncio.Future] = set()

        def keep(worker: int, job: Job, rec: RequestRecord) -> None:
            result.pairs.append((job, rec))
            self.infos[worker].finished += 1
            if progress is not None:
                progress(rec)

        async def keep_if(verdict: asyncio.Future, worker: int, job: Job, rec: RequestRecord) -> None:
            if await verdict:
                keep(worker, job, rec)

        def take(worker: int, job: Job, rec: RequestRecord) -> None:
            """A failed request counts unless ``accept`` says it failed because the run is stopping
            (its server died); the turns it left unsent go with it. The checks run side by side."""
            conversation = (job.repeat, job.copy_index, job.index)
            if accept is None or rec.ok or (rec.error_kind == "not_sent" and conversation not in verdicts):
                keep(worker, job, rec)
                return
            if rec.error_kind != "not_sent":
                verdicts[conversation] = asyncio.ensure_future(accept(rec))
            pending.add(asyncio.ensure_future(keep_if(verdicts[conversation], worker, job, rec)))

        async def consume() -> None:
            while True:
                item = await inbox.get()
                try:
                    take(*item)
                finally:
                    inbox.task_done()

        consumer = asyncio.ensure_future(consume())
        t0 = time.perf_counter_ns() if t0_ns is None else t0_ns
        work = asyncio.ensure_future(self._execute(shares, targets, lambda w, j, r: inbox.put_nowait((w, j, r)), t0))
        try:
            while not work.done():
                done, _ = await asyncio.wait({work}, timeout=POLL_S)
                if done:
                    break
                reason = watch() if watch is not None else None
                if reason is not None:
                    result.partial_reason = reason
                    await self._cancel(work)
                    break
            if work.done() and not work.cancelled() and work.exception() is not None:
                if not isinstance(work.exception(), WorkerStopped):
                    raise work.exception()  # type: ignore[misc]
                result.partial_reason = result.partial_reason or str(work.exception())
            await inbox.join()
            await asyncio.gather(*pending)
            if result.partial_reason is None and watch is not None:  # it may have died at the very end
                result.partial_reason = watch()
        except asyncio.CancelledError:  # Ctrl-C: the records back so far stay in ``last``
            await self._cancel(work)
            while not inbox.empty():
                take(*inbox.get_nowait())
            result.partial_reason = self.interrupted
            raise
        finally:
            consumer.cancel()
            for task in (*pending, *verdicts.values()):  # a failure still being judged at Ctrl-C is left out
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await consumer
        return result

    async def _execute(self, shares: Sequence[Share], targets: Sequence[Target], emit: Emit, t0: int) -> None:
        raise NotImplementedError

    async def _cancel(self, work: asyncio.Future) -> None:
        work.cancel()
        with contextlib.suppress(asyncio.CancelledError, WorkerStopped):
            await work


Emit = Callable[[int, Job, RequestRecord], None]
"""An executor hands each record to the run: (worker, job, record)."""


class WorkerStopped(SpecadaptError):
    """A worker ended before its share was done (its message says which and why)."""


class InProcess(Executor):
    """Every share from this process's event loop, its clients kept open across runs until
    ``aclose``; ``chunks_read`` counts what they read."""

    kind = "process"

    def __init__(self) -> None:
        super().__init__()
        self.cache = ClientCache()
        self.infos = {0: WorkerInfo(worker=0, kind="process", pid=os.getpid(), node=socket.gethostname(), jobs=0,
                                    concurrency=0)}

    @property
    def chunks_read(self) -> int:
        return self.cache.chunks_read

    async def aclose(self) -> None:
        await self.cache.aclose()

    async def _execute(self, shares: Sequence[Share], targets: Sequence[Target], emit: Emit, t0: int) -> None:
        info = self.infos[0]
        info.jobs += planned_turns(shares)
        info.concurrency = max([info.concurrency, *(s.concurrency or 0 for s in shares)])
        if info.t0_mono_ns is None:
            info.t0_mono_ns = t0
        await asyncio.gather(*(execute_share(s, targets, t0, lambda j, r: emit(0, j, r), self.cache) for s in shares))


# --- worker processes -----------------------------------------------------------------------------
def worker_main(worker: int, parent_pid: int, inbox, out, cancel) -> None:
    """Entry point of a worker process: take a share at a time from ``inbox``, stream it, send
    each record to the parent as it finishes, then "done"; end on "stop" or when the parent is
    gone. One event loop for the worker's life, so its clients stay open across runs."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's: it stops the workers
    out.put(("ready", worker, os.getpid(), socket.gethostname()))

    async def serve() -> None:
        cache = ClientCache()
        try:
            while True:
                try:
                    msg = await asyncio.to_thread(inbox.get, True, 0.2)
                except queue.Empty:
                    if os.getppid() != parent_pid:
                        return
                    continue
                if msg[0] == "stop":
                    return
                _, share, targets, t0 = msg
                work = asyncio.ensure_future(execute_share(
                    share, targets, t0, lambda job, rec: out.put(("record", worker, job, rec)), cache))
                while not work.done():
                    await asyncio.wait({work}, timeout=0.1)
                    if cancel.is_set() or os.getppid() != parent_pid:
                        work.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await work
                out.put(("done", worker, None, None))
        finally:
            await cache.aclose()

    run_loop(serve())


class WorkerPool(Executor):
    """``workers`` local worker processes, started on entry and stopped (joined, then terminated,
    then killed) on exit, however the run ends."""

    kind = "workers"
    interrupted = INTERRUPTED

    def __init__(self, workers: int, ready_timeout_s: float = 120.0, stop_grace_s: float = 3.0):
        super().__init__()
        import multiprocessing

        self.ctx = multiprocessing.get_context("spawn")
        self.n, self.ready_timeout_s, self.stop_grace_s = workers, ready_timeout_s, stop_grace_s
        self.out = self.ctx.Queue()
        self.cancel = self.ctx.Event()
        self.inboxes = {w: self.ctx.Queue() for w in range(workers)}
        self.procs = {w: self.ctx.Process(target=worker_main, name=f"specadapt-worker-{w}", daemon=True,
                                          args=(w, os.getpid(), self.inboxes[w], self.out, self.cancel))
                      for w in range(workers)}
        self.infos = {w: WorkerInfo(worker=w, kind="process", jobs=0, concurrency=0) for w in range(workers)}
        self._pending: list[tuple] = []

    def __enter__(self) -> WorkerPool:
        try:
            for p in self.procs.values():
                p.start()
            deadline = time.monotonic() + self.ready_timeout_s
            while any(i.pid is None for i in self.infos.values()):
                self._pump(0.1)
                dead = self._dead()
                if dead:
                    raise WorkerStopped(dead)
                if time.monotonic() > deadline:
                    raise WorkerStopped(f"the worker processes were not ready within {self.ready_timeout_s:g} s")
        except BaseException:
            self.close()
            raise
        return self

    def _pump(self, timeout: float) -> tuple | None:
        try:
            msg = self.out.get(timeout=timeout)
        except (queue.Empty, EOFError, OSError, ValueError):
            return None
        kind, worker, a, b = msg
        if kind == "ready":
            self.infos[worker].pid, self.infos[worker].node = a, b
            return None
        return msg

    def _dead(self, busy: set[int] | None = None) -> str | None:
        for w, p in self.procs.items():
            if (busy is None or w in busy) and p.exitcode is not None:
                info = self.infos[w]
                return (f"worker {w} (pid {p.pid}) exited with code {p.exitcode} after {_done(info)} requests; "
                        "every worker was stopped")
        return None

    def _next(self) -> tuple | None:
        """The next message from the workers without waiting, or None."""
        try:
            msg = self.out.get_nowait()
        except (queue.Empty, EOFError, OSError, ValueError):
            return None
        if msg[0] == "ready":
            self.infos[msg[1]].pid, self.infos[msg[1]].node = msg[2], msg[3]
            return None
        return msg

    async def _execute(self, shares: Sequence[Share], targets: Sequence[Target], emit: Emit, t0: int) -> None:
        self.cancel.clear()
        busy = set()
        for s in shares:
            info = self.infos[s.worker]
            info.jobs += planned_turns([s])
            info.concurrency = max(info.concurrency, s.concurrency or 0)
            if info.t0_mono_ns is None:
                info.t0_mono_ns = t0
            self.inboxes[s.worker].put(("run", s, [portable(x) for x in targets], t0))
            busy.add(s.worker)
        try:
            while busy:
                msg = self._next()
                if msg is not None:
                    kind, worker, job, rec = msg
                    if kind == "record":
                        emit(worker, job, rec)
                    elif kind == "done":
                        busy.discard(worker)
                    continue
                await asyncio.sleep(0.01)
                dead = self._dead(busy)
                if dead:
                    for w in busy:
                        if self.procs[w].exitcode not in (0, None):
                            self.infos[w].error = f"exited with code {self.procs[w].exitcode}"
                    raise WorkerStopped(dead)
        except (asyncio.CancelledError, WorkerStopped):
            self.cancel.set()
            deadline = time.monotonic() + self.stop_grace_s
            # What finished is in the pipe: take it until every worker still alive says done (a dead
            # one never will, but what it sent before it died is there too).
            busy = {w for w in busy if self.procs[w].exitcode is None}
            while busy and time.monotonic() < deadline:
                msg = self._pump(0.05)
                if msg is None:
                    busy = {w for w in busy if self.procs[w].exitcode is None}
                elif msg[0] == "record":
                    emit(msg[1], msg[2], msg[3])
                elif msg[0] == "done":
                    busy.discard(msg[1])
            while (msg := self._next()) is not None:
                if msg[0] == "record":
                    emit(msg[1], msg[2], msg[3])
            raise

    def close(self) -> None:
        """Ask every worker to stop, then terminate and finally kill what is left; join them all
        (no orphan, no zombie)."""
        self.cancel.set()
        for w, p in self.procs.items():
            if p.pid is not None and p.is_alive():
                with contextlib.suppress(Exception):
                    self.inboxes[w].put(("stop",))
        deadline = time.monotonic() + self.stop_grace_s
        while any(p.is_alive() for p in self.procs.values()) and time.monotonic() < deadline:
            self._pump(0.05)
        for p in self.procs.values():
            if p.is_alive():
                p.terminate()
        for p in self.procs.values():
            if p.pid is not None:
                p.join(2.0)
                if p.is_alive():
                    p.kill()
                    p.join(2.0)
        for q in (self.out, *self.inboxes.values()):
            q.close()
            q.cancel_join_thread()


# --- Ray actors -----------------------------------------------------------------------------------
def _ray():
    try:
        import ray
    except ImportError as exc:
        raise MissingDependency("ray", "ray", "--ray") from exc
    return ray


class ShareActor:
    """A Ray actor that runs one share at a time (async: ``take`` and ``cancel`` are answered while
    ``run`` streams)."""

    def __init__(self) -> None:
        self._records: list[tuple[Job, RequestRecord]] = []
        self._task: asyncio.Future | None = None
        self._cache = ClientCache()

    def clock(self) -> dict[str, Any]:
        import ray

        return {"wall_ns": time.time_ns(), "node": socket.gethostname(), "pid": os.getpid(),
                "node_id": ray.get_runtime_context().get_node_id()}

    async def run(self, share: Share, targets: list[Target], start_wall_ns: int) -> dict[str, int]:
        delay_s = (start_wall_ns - time.time_ns()) / 1e9
        if delay_s > 0:
            await asyncio.sleep(delay_s)
        t0 = time.perf_counter_ns()
        lag_ns = time.time_ns() - start_wall_ns
        self._task = asyncio.ensure_future(execute_share(
            share, targets, t0, lambda job, rec: self._records.append((job, rec)), self._cache))
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        return {"t0_mono_ns": t0, "start_lag_ns": lag_ns}

    async def cancel(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def take(self) -> list[tuple[Job, RequestRecord]]:
        out, self._records = self._records, []
        return out


class RayPool(Executor):
    """``workers`` Ray actors (SPREAD over the nodes), created on entry and killed on exit.
    ``address``: ``local`` (a Ray instance on this machine), ``auto`` (the running cluster) or
    ``ray://host:port``; a Ray already initialised in this process is used as it is."""

    kind = "ray"
    shared_clock = False
    interrupted = INTERRUPTED

    def __init__(self, workers: int, address: str, start_margin_s: float = 0.5):
        super().__init__()
        self.n, self.address, self.start_margin_s = workers, address, start_margin_s
        self.actors: dict[int, Any] = {}
        self.started_here = False
        self.infos = {w: WorkerInfo(worker=w, kind="ray", jobs=0, concurrency=0) for w in range(workers)}

    def __enter__(self) -> RayPool:
        ray = self.ray = _ray()
        self.started_here = not ray.is_initialized()
        if self.started_here:
            try:
                ray.init(address=None if self.address == "local" else self.address, include_dashboard=False,
                         log_to_driver=False, configure_logging=False)
            except (ConnectionError, ValueError, RuntimeError) as exc:
                raise UsageError(f"--ray {self.address}: cannot connect to a Ray cluster "
                                 f"({str(exc).splitlines()[0]}); give 'local', 'auto' or ray://host:port") from exc
        try:
            remote = ray.remote(ShareActor).options(scheduling_strategy="SPREAD", num_cpus=0, max_concurrency=1000)
            self.actors = {w: remote.remote() for w in range(self.n)}
            for w, actor in self.actors.items():  # the second round trip: the first one waits for the actor
                for _ in range(2):
                    t1 = time.time_ns()
                    info = ray.get(actor.clock.remote())
                    t2 = time.time_ns()
                wi = self.infos[w]
                wi.pid, wi.node, wi.node_id = info["pid"], info["node"], info["node_id"]
                wi.clock_offset_ms = (info["wall_ns"] - (t1 + t2) / 2) / 1e6
                wi.clock_uncertainty_ms = (t2 - t1) / 2e6
        except BaseException:
            self.close()
            raise
        return self

    def _collect(self, w: int, emit: Emit) -> None:
        for job, rec in self.ray.get(self.actors[w].take.remote()):
            emit(w, job, rec)

    async def _execute(self, shares: Sequence[Share], targets: Sequence[Target], emit: Emit, t0: int) -> None:
        ray = self.ray
        start = time.time_ns() + (int(self.start_margin_s * 1e9) if len(shares) > 1 else 0)  # one share: at once
        runs = {}
        for s in shares:
            self.infos[s.worker].jobs += planned_turns([s])
            self.infos[s.worker].concurrency = max(self.infos[s.worker].concurrency, s.concurrency or 0)
            runs[self.actors[s.worker].run.remote(s, [portable(x) for x in targets], start)] = s.worker
        pending = list(runs)
        try:
            while pending:
                ready, pending = ray.wait(pending, num_returns=len(pending), timeout=0)
                for s in shares:
                    self._collect(s.worker, emit)
                for ref in ready:
                    w = runs[ref]
                    try:
                        out = ray.get(ref)
                    except ray.exceptions.RayError as exc:
                        self.infos[w].error = str(exc).splitlines()[0][:200]
                        raise WorkerStopped(f"Ray worker {w} on {self.infos[w].node} failed after "
                                            f"{_done(self.infos[w])} requests; every worker was stopped") from None
                    if self.infos[w].t0_mono_ns is None:
                        self.infos[w].t0_mono_ns = out["t0_mono_ns"]
                        self.infos[w].start_lag_ms = out["start_lag_ns"] / 1e6
                if pending:
                    await asyncio.sleep(POLL_S)
        except (asyncio.CancelledError, WorkerStopped):
            for s in shares:
                with contextlib.suppress(Exception):  # a dead actor has nothing left to give
                    ray.get(self.actors[s.worker].cancel.remote())
                    self._collect(s.worker, emit)
            raise

    def close(self) -> None:
        ray = getattr(self, "ray", None)
        if ray is None:
            return
        for actor in self.actors.values():
            with contextlib.suppress(Exception):
                ray.kill(actor)
        if self.started_here:
            ray.shutdown()


def executor_for(workers: int = 1, ray_address: str | None = None) -> Executor:
    """The executor of a run: Ray actors with an address, worker processes for more than one
    worker, else this process."""
    if ray_address is not None:
        if not ray_address.strip():
            raise UsageError("--ray needs an address: 'local', 'auto' or ray://host:port")
        return RayPool(workers, ray_address)
    if workers > 1:
        return WorkerPool(workers)
    return InProcess()

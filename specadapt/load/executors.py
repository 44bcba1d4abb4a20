"""Load past one process and one machine: a pool of local worker processes and a pool of Ray
actors, each an ``Executor`` (``load.spread``) that runs the shares of ``load.plan`` with
``execute_share``, started once per run and reused for every level and block.

- ``WorkerPool``: local worker processes (the "spawn" context: a fresh interpreter, no fork
  after threads). Send times are on the parent's monotonic clock (CLOCK_MONOTONIC is one clock
  for every process on a Linux machine): the parent reads t0 and hands it to every worker with
  its share.
- ``RayPool``: Ray actors spread over the cluster's nodes (scheduling strategy SPREAD).
  Machines do not share a monotonic clock, so the driver names one wall-clock start instant;
  each actor sleeps until its own wall clock reaches it, reads its own monotonic t0 there and
  times its records from it. Each actor's clock offset to the driver is estimated from a
  round trip and recorded.
- ``executor_for``: the executor a run's options ask for.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import queue
import signal
import socket
import time
from collections.abc import Sequence
from typing import Any

from specadapt.errors import MissingDependency, UsageError
from specadapt.load.client import run as run_loop
from specadapt.load.engine import Job
from specadapt.load.plan import Share, planned_turns
from specadapt.load.spread import (
    INTERRUPTED,
    POLL_S,
    ClientCache,
    Emit,
    Executor,
    InProcess,
    Target,
    WorkerStopped,
    done_text,
    execute_share,
    portable,
)
from specadapt.records import RequestRecord, WorkerInfo


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
                return (f"worker {w} (pid {p.pid}) exited with code {p.exitcode} after {done_text(info)} requests; "
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
                                            f"{done_text(self.infos[w])} requests; every worker was stopped") from None
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

"""Load past one process and one machine: worker processes, Ray actors, several replicas.

One event loop in one process stops telling the truth about latency once it has more
streams than it can read in time (see docs/scale.md). This module spreads a probe's jobs:

- ``plan_jobs``: the jobs in the order one process sends them (repeat by repeat, prompt by
  prompt); with several replicas, job i goes to replica i mod R (round robin per job).
- ``split_jobs``: the jobs over W workers, job i to worker i mod W, and the concurrency
  over them (Formula: worker w gets C // W streams, plus one when w < C mod W). A worker
  needs at least one job and one stream, so W is cut to min(W, jobs, C).
- ``execute_share``: one share of jobs, streamed from the current process's event loop at
  the share's concurrency; returns its records. This is the one seam a load engine plugs
  into; the workers below and the in-process path all run it.
- ``run_workers``: local worker processes (the "spawn" context: a fresh interpreter, no
  fork after threads). Send times are on the parent's monotonic clock (CLOCK_MONOTONIC is
  one clock for every process on a Linux machine): the parent reads t0 and hands it to
  every worker at the start signal. Each finished record comes back through a queue at
  once (it feeds the progress bar), so a crash or Ctrl-C loses only requests in flight.
- ``run_ray``: Ray actors spread over the cluster's nodes (scheduling strategy SPREAD).
  Machines do not share a monotonic clock, so the driver names one wall-clock start
  instant; each actor sleeps until its own wall clock reaches it, reads its own monotonic
  t0 there and times its records from it. Each actor's clock offset to the driver is
  estimated from a round trip and recorded.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import queue
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from specadapt.adapters.base import Server
from specadapt.analysis.probe_report import build_probe_report
from specadapt.analysis.scale_report import replica_results, summed_counters
from specadapt.errors import MissingDependency, UsageError
from specadapt.load.client import run as run_loop
from specadapt.load.client import stream_request
from specadapt.load.share import Job, Share, Target, client_for, execute_share, plan_jobs, split_jobs, worker_main
from specadapt.orchestration.probe import counting, read_counters_safely, settle_counters
from specadapt.records import (
    CounterSnapshot,
    ProbeReport,
    ProbeSettings,
    Prompt,
    RequestRecord,
    RequestSettings,
    ScaleLayout,
    WorkerInfo,
)

Progress = Callable[[RequestRecord], None]
INTERRUPTED = "interrupted (Ctrl-C); every worker was stopped"
__all__ = ["Job", "Share", "Target", "execute_share", "merge_records", "plan_jobs", "run_ray", "run_spread_probe",
           "run_workers", "split_jobs", "target_of"]


def target_of(server: Server, ca_bundle: str | None = None) -> Target:
    """A server as workers reach it; a TLS context is carried as the CA bundle it was built from."""
    verify = server.verify
    if not isinstance(verify, (bool, str)):
        verify = ca_bundle or True
    return Target(base_url=server.base_url, model=server.model_id, headers=dict(server.headers()), verify=verify)


def merge_records(shares_records: Sequence[Sequence[tuple[int, RequestRecord]]]) -> list[RequestRecord]:
    """(job index, record) pairs from every worker -> one list ordered by send time (ties: job order,
    then turn); a conversation's turns share their job's index."""
    pairs = [p for recs in shares_records for p in recs]
    keys = [(i, rec.turn) for i, rec in pairs]
    if len(set(keys)) != len(keys):
        raise AssertionError("a request came back twice")
    return [rec for _, rec in sorted(pairs, key=lambda p: (p[1].sent_at_ns, p[0], p[1].turn))]


# --- worker processes -------------------------------------------------------------------------------
@dataclass
class RunResult:
    """What a spread run brought back: every finished record with its job index, per-worker facts,
    and why it stopped early (None when every job finished)."""

    pairs: list[tuple[int, RequestRecord]]
    workers: list[WorkerInfo]
    partial_reason: str | None = None


def run_workers(shares: Sequence[Share], targets: Sequence[Target], settings: RequestSettings,
                progress: Progress | None = None, before_start: Callable[[], None] | None = None,
                ready_timeout_s: float = 120.0, stop_grace_s: float = 3.0) -> RunResult:
    """Run every share in its own process; ``before_start`` runs once all are ready, just before t0
    (the counters' first reading). A worker that exits early, or Ctrl-C, stops them all; the
    records already back are kept and the reason is returned. KeyboardInterrupt is re-raised
    only after every worker has been stopped, with the result attached as ``.result``."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    out, go, stop = ctx.Queue(), ctx.Event(), ctx.Event()
    t0_value = ctx.Value("q", -1)
    infos = {s.worker: WorkerInfo(worker=s.worker, kind="process", jobs=len(s.jobs), concurrency=s.concurrency)
             for s in shares}
    procs = {s.worker: ctx.Process(target=worker_main, name=f"specadapt-worker-{s.worker}", daemon=True,
                                   args=(s, list(targets), settings, os.getpid(), go, stop, t0_value, out))
             for s in shares}
    pairs: list[tuple[int, RequestRecord]] = []
    done: set[int] = set()
    reason: str | None = None

    def handle(msg: tuple) -> None:
        kind, worker, a, b = msg
        if kind == "ready":
            infos[worker].pid, infos[worker].node = a, b
        elif kind == "record":
            pairs.append((a, b))
            infos[worker].finished += 1
            if progress is not None:
                progress(b)
        elif kind == "done":
            done.add(worker)

    def pump(timeout: float) -> None:
        try:
            handle(out.get(timeout=timeout))
        except queue.Empty:
            pass

    def early_exit() -> str | None:
        for w, p in procs.items():
            if w not in done and p.exitcode == 0:  # its last messages may still be in the pipe
                deadline = time.monotonic() + 2.0
                while w not in done and time.monotonic() < deadline:
                    pump(0.05)
            if w not in done and p.exitcode is not None:
                return (f"worker {w} (pid {p.pid}) exited with code {p.exitcode} after {infos[w].finished} of "
                        f"{infos[w].jobs} requests; every worker was stopped")
        return None

    try:
        for p in procs.values():
            p.start()
        deadline = time.monotonic() + ready_timeout_s
        while any(i.pid is None for i in infos.values()):
            pump(0.1)
            reason = early_exit()
            if reason is None and time.monotonic() > deadline:
                reason = f"the worker processes were not ready within {ready_timeout_s:g} s"
            if reason:
                break
        if reason is None:
            if before_start is not None:
                before_start()
            t0 = time.perf_counter_ns()
            t0_value.value = t0
            go.set()
            for info in infos.values():
                info.t0_mono_ns = t0
            while len(done) < len(procs):
                pump(0.1)
                reason = early_exit()
                if reason:
                    break
    except KeyboardInterrupt as exc:
        _stop(procs, stop, go, pump, stop_grace_s)
        exc.result = RunResult(pairs, list(infos.values()), INTERRUPTED)  # type: ignore[attr-defined]
        raise
    finally:
        _stop(procs, stop, go, pump, stop_grace_s)
        while True:  # what finished before the stop is still in the pipe
            try:
                handle(out.get(timeout=0.2))
            except queue.Empty:
                break
            except (EOFError, OSError, ValueError):
                break
        out.close()
    if reason is not None:
        for w, p in procs.items():
            if w not in done and p.exitcode not in (0, None):
                infos[w].error = f"exited with code {p.exitcode}"
    return RunResult(pairs, list(infos.values()), reason)


def _stop(procs: dict, stop, go, pump: Callable[[float], None], grace_s: float) -> None:
    """Ask every worker to stop, keep reading the queue while they do, then terminate and
    finally kill what is left; join them all (no orphan, no zombie)."""
    stop.set()
    go.set()
    deadline = time.monotonic() + grace_s
    while any(p.is_alive() for p in procs.values()) and time.monotonic() < deadline:
        pump(0.05)
    for p in procs.values():
        if p.is_alive():
            p.terminate()
    for p in procs.values():
        if p.pid is not None:
            p.join(2.0)
            if p.is_alive():
                p.kill()
                p.join(2.0)


# --- Ray actors -----------------------------------------------------------------------------------
def _ray():
    try:
        import ray
    except ImportError as exc:
        raise MissingDependency("ray", "ray", "--ray") from exc
    return ray


class ShareActor:
    """A Ray actor that runs one share (async: ``take`` is answered while ``run`` streams)."""

    def __init__(self) -> None:
        self._records: list[tuple[int, RequestRecord]] = []

    def clock(self) -> dict[str, Any]:
        import ray

        return {"wall_ns": time.time_ns(), "node": socket.gethostname(), "pid": os.getpid(),
                "node_id": ray.get_runtime_context().get_node_id()}

    async def run(self, share: Share, targets: list[Target], settings: RequestSettings,
                  start_wall_ns: int) -> dict[str, int]:
        delay_s = (start_wall_ns - time.time_ns()) / 1e9
        if delay_s > 0:
            await asyncio.sleep(delay_s)
        t0 = time.perf_counter_ns()
        lag_ns = time.time_ns() - start_wall_ns
        await execute_share(share, targets, settings, t0,
                            on_record=lambda job, rec: self._records.append((job.index, rec)))
        return {"t0_mono_ns": t0, "start_lag_ns": lag_ns}

    async def take(self) -> list[tuple[int, RequestRecord]]:
        out, self._records = self._records, []
        return out


def run_ray(shares: Sequence[Share], targets: Sequence[Target], settings: RequestSettings, address: str,
            progress: Progress | None = None, before_start: Callable[[], None] | None = None,
            start_margin_s: float = 0.5) -> RunResult:
    """Run every share in a Ray actor (SPREAD over the nodes). ``address``: ``local`` (a Ray
    instance on this machine), ``auto`` (the running cluster) or ``ray://host:port``; a Ray
    already initialised in this process is used as it is."""
    ray = _ray()
    started_here = not ray.is_initialized()
    if started_here:
        try:
            ray.init(address=None if address == "local" else address, include_dashboard=False,
                     log_to_driver=False, configure_logging=False)
        except (ConnectionError, ValueError, RuntimeError) as exc:
            raise UsageError(f"--ray {address}: cannot connect to a Ray cluster ({str(exc).splitlines()[0]}); "
                             "give 'local', 'auto' or ray://host:port") from exc
    remote = ray.remote(ShareActor).options(scheduling_strategy="SPREAD", num_cpus=0, max_concurrency=1000)
    actors = {s.worker: remote.remote() for s in shares}
    infos = {s.worker: WorkerInfo(worker=s.worker, kind="ray", jobs=len(s.jobs), concurrency=s.concurrency)
             for s in shares}
    pairs: list[tuple[int, RequestRecord]] = []
    reason: str | None = None

    def collect(worker: int) -> None:
        for pair in ray.get(actors[worker].take.remote()):
            pairs.append(pair)
            infos[worker].finished += 1
            if progress is not None:
                progress(pair[1])

    try:
        for w, actor in actors.items():  # the second round trip: the first one waits for the actor
            for _ in range(2):
                t1 = time.time_ns()
                info = ray.get(actor.clock.remote())
                t2 = time.time_ns()
            infos[w].pid, infos[w].node, infos[w].node_id = info["pid"], info["node"], info["node_id"]
            infos[w].clock_offset_ms = (info["wall_ns"] - (t1 + t2) / 2) / 1e6
            infos[w].clock_uncertainty_ms = (t2 - t1) / 2e6
        if before_start is not None:
            before_start()
        start = time.time_ns() + int(start_margin_s * 1e9)
        runs = {actor.run.remote(s, list(targets), settings, start): s.worker
                for s, actor in zip(shares, actors.values(), strict=True)}
        pending = list(runs)
        while pending:
            ready, pending = ray.wait(pending, num_returns=len(pending), timeout=0.2)
            for w in actors:
                collect(w)
            for ref in ready:
                w = runs[ref]
                try:
                    out = ray.get(ref)
                except ray.exceptions.RayError as exc:
                    infos[w].error = str(exc).splitlines()[0][:200]
                    reason = (f"Ray worker {w} on {infos[w].node} failed after {infos[w].finished} of "
                              f"{infos[w].jobs} requests; every worker was stopped")
                    pending = []
                    break
                infos[w].t0_mono_ns = out["t0_mono_ns"]
                infos[w].start_lag_ms = out["start_lag_ns"] / 1e6
    except KeyboardInterrupt as exc:
        _collect_all(actors, collect)
        _kill(ray, actors)
        exc.result = RunResult(pairs, list(infos.values()), INTERRUPTED)  # type: ignore[attr-defined]
        raise
    finally:
        if reason:
            _collect_all(actors, collect)
        _kill(ray, actors)
        if started_here:
            ray.shutdown()
    return RunResult(pairs, list(infos.values()), reason)


def _collect_all(actors: dict, collect: Callable[[int], None]) -> None:
    for w in actors:
        with contextlib.suppress(Exception):  # a dead actor has nothing left to give
            collect(w)


def _kill(ray, actors: dict) -> None:
    for actor in actors.values():
        with contextlib.suppress(Exception):
            ray.kill(actor)


# --- the probe --------------------------------------------------------------------------------------
async def _warm(targets: Sequence[Target], prompts: Sequence[Prompt], settings: RequestSettings, warmup: int,
                progress: Progress | None) -> None:
    """Warm-up requests, discarded, one after the other, round robin over the servers."""
    async with contextlib.AsyncExitStack() as stack:
        clients = [await stack.enter_async_context(client_for(t, settings, 1)) for t in targets]
        t0 = time.perf_counter_ns()
        for i in range(warmup):
            t = i % len(targets)
            rec = await stream_request(clients[t], prompts[i % len(prompts)], targets[t].model, settings, t0,
                                       warmup=True)
            if progress is not None:
                progress(rec)


def run_spread_probe(servers: Sequence[Server], prompts: list[Prompt], settings: RequestSettings,
                     concurrency: int = 1, repeat: int = 1, warmup: int = 1, prompts_source: str = "built-in",
                     progress: Progress | None = None, workers: int = 1, ray_address: str | None = None,
                     ca_bundle: str | None = None) -> ProbeReport:
    """Probe one or several replicas with the jobs spread over worker processes or Ray actors.

    Returns the report; a crash or Ctrl-C gives a partial report (``partial_reason`` says why;
    after Ctrl-C the KeyboardInterrupt is re-raised with the partial report as ``.report``)."""
    if not servers:
        raise ValueError("no server")
    if len({s.base_url for s in servers}) != len(servers):
        raise UsageError("the same --url is given twice: give each replica once")
    targets = [target_of(s, ca_bundle) for s in servers]
    infos = {s.base_url: s.describe() for s in servers}
    jobs = plan_jobs(prompts, repeat, len(servers))
    shares = split_jobs(jobs, concurrency, workers)
    befores: dict[str, CounterSnapshot] = {}

    def read_befores() -> None:
        for s in servers:
            befores[s.base_url] = settle_counters(s)

    interrupted: KeyboardInterrupt | None = None
    with counting(*servers):
        if warmup:
            run_loop(_warm(targets, prompts, settings, warmup, progress))
        try:
            if ray_address:
                result = run_ray(shares, targets, settings, ray_address, progress, before_start=read_befores)
                executor = "ray"
            elif workers > 1:
                result = run_workers(shares, targets, settings, progress, before_start=read_befores)
                executor = "workers"
            else:
                read_befores()
                t0 = time.perf_counter_ns()
                on_record = (lambda job, rec: progress(rec)) if progress is not None else None
                pairs = run_loop(execute_share(shares[0], targets, settings, t0, on_record))
                result = RunResult(pairs, [WorkerInfo(worker=0, kind="process", pid=os.getpid(),
                                                      node=socket.gethostname(), jobs=len(jobs),
                                                      concurrency=concurrency, finished=len(pairs),
                                                      t0_mono_ns=t0)])
                executor = "process"
        except KeyboardInterrupt as exc:
            result = getattr(exc, "result", None)
            if result is None:
                raise
            interrupted, executor = exc, "ray" if ray_address else "workers"
        if not befores:
            read_befores()
        afters = {s.base_url: (settle_counters(s) if result.partial_reason is None and interrupted is None
                               else read_counters_safely(s)) for s in servers}
    records = merge_records([result.pairs])
    windows = {url: (befores[url], afters[url]) for url in infos}
    before, after = summed_counters(list(windows.values()))
    layout = ScaleLayout(executor=executor, workers_requested=workers, workers=result.workers,
                         ray_address=ray_address,
                         replicas=replica_results(records, infos, windows) if len(servers) > 1 else [])
    notes = []
    if len(shares) < workers:
        notes.append(f"{workers} workers were asked for, {len(shares)} used: each needs at least one request "
                     f"and one stream (requests {len(jobs)}, concurrency {concurrency})")
    if len(servers) > 1:
        notes.append(f"requests went round robin over {len(servers)} replicas (server above: the first); the "
                     "figures are over all of them, each replica's own are in the per-replica table")
    if executor == "ray":
        notes.append("Ray workers time their requests on their own clocks from a shared wall-clock start "
                     "instant; see each worker's start lag and clock offset")
    report = build_probe_report(infos[servers[0].base_url], ProbeSettings(
        concurrency=concurrency, repeat=repeat, warmup=warmup, prompts_source=prompts_source, request=settings),
        records, before, after, layout, partial_reason=result.partial_reason, extra_notes=notes)
    if interrupted is not None:
        interrupted.report = report  # type: ignore[attr-defined]
        raise interrupted
    return report

"""A probe run: warm-up, counters before, the workload at a concurrency or at arrival rates,
counters after; from one process or spread over worker processes, Ray actors and several
replicas (``load.spread``: one engine, one way of sending on every path).

Faults do not end a run: a failed request is recorded with its reason, and counters that
cannot be read make acceptance unknown. Three things do, on every path: a server that
specadapt started (``server.process``) and that exits mid-run, a worker that dies, and Ctrl-C.
The run then stops, keeps the requests that had finished, and the report is marked
``partial`` with the reason (after Ctrl-C the KeyboardInterrupt is re-raised with the partial
report as ``.report``).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Iterator, Sequence
from dataclasses import replace

from specadapt.adapters.base import Server
from specadapt.analysis.client_load import client_load
from specadapt.analysis.lossy import describe_death
from specadapt.analysis.probe_report import build_probe_report
from specadapt.analysis.scale_report import replica_results, summed_counters
from specadapt.errors import UsageError
from specadapt.load.arrivals import arrivals_for_duration
from specadapt.load.client import run as run_loop
from specadapt.load.engine import Job
from specadapt.load.executors import executor_for
from specadapt.load.meter import measure_client
from specadapt.load.plan import RunResult, Share, Stamp, closed_jobs, rate_jobs, split
from specadapt.load.progress import Progress, ProgressBars, no_bars
from specadapt.load.spread import Executor, InProcess, Target, target_of
from specadapt.orchestration.counters import CounterWindow, counting, read_counters_safely
from specadapt.orchestration.servers import LOGGED, Messages, ServerPlan, open_servers
from specadapt.records import (
    CounterSnapshot,
    ProbeReport,
    ProbeSettings,
    Prompt,
    RequestRecord,
    RequestSettings,
    ScaleLayout,
)
from specadapt.records.load import LoadSettings
from specadapt.records.workload import WorkloadInfo


class ServerGuard:
    """Watches the servers specadapt started (``server.process``) during a run: ``watch`` names the
    first that exited, ``accept`` drops a failed record when a server exits within ``within_s``
    of it (a dying server drops its connections a moment before the kernel reports its exit, so
    such a request failed because of the death, not on its own)."""

    def __init__(self, servers: Sequence[Server], within_s: float = 0.5):
        self.servers = [s for s in servers if s.process is not None]
        self.within_s = within_s
        self.dead: Server | None = None

    def watch(self) -> str | None:
        for s in self.servers:
            if not s.process.alive():
                self.dead = s
                return f"the {s.backend} server exited"
        return None

    async def accept(self, rec: RequestRecord) -> bool:
        if not self.servers:  # none started here: every failure is the server's own
            return True
        deadline = time.monotonic() + self.within_s
        while all(s.process.alive() for s in self.servers):
            if time.monotonic() > deadline:
                return True
            await asyncio.sleep(0.02)
        return False

    def death_reason(self, done: int, planned: int) -> tuple[str, str]:
        """(one-line reason with the exit code, the server log's last lines)."""
        server = self.dead or next(s for s in self.servers if not s.process.alive())
        return death_reason(server, done, planned)


def death_reason(server: Server, done: int, planned: int) -> tuple[str, str]:
    """(one-line reason with the exit code, the server log's last lines) of a managed server that
    exited during a run."""
    return exit_reason(server, progress=f"{done} of {planned} requests had finished"), server.process.log_tail()


def exit_reason(server: Server, what: str | None = None, progress: str = "") -> str:
    """One line: which server (``what``, default its backend) exited with which code during a run,
    the line of its log that says why (analysis/lossy.py ``describe_death``), ``progress`` so far,
    and where its log is."""
    process = server.process
    code = process.proc.poll() if process is not None and process.proc is not None else None
    log = f" (log: {process.log_path})" if process is not None else ""
    why = describe_death(process.log_tail()) if process is not None else None
    return f"the {what or server.backend} server exited with code {code} during the run" + \
        (f", saying: {why}" if why else "") + (f"; {progress}" if progress else "") + log


def with_spec_extras(settings: RequestSettings, server: Server) -> RequestSettings:
    """``settings`` with the server's ``spec_extras`` (the request keys that make each answer state its
    own speculation) merged in, the user's own extra keys kept over them."""
    if not server.spec_extras:
        return settings
    return settings.model_copy(update={"extra_body": {**server.spec_extras, **settings.extra_body}})


def planned_requests(prompts: list[Prompt], repeat: int, load: LoadSettings | None) -> int:
    """Requests a probe plans to send (a progress bar's total; a conversation counts its turns;
    --duration at a concurrency is open-ended and counts one pass)."""
    per_set = sum(1 + len(p.turns or []) for p in prompts)
    rates = load.request_rates if load else []
    if not rates:
        return per_set * repeat
    total = 0
    for r in rates:
        n = len(prompts) * repeat
        if load.duration_s is not None and not math.isinf(r):
            n = arrivals_for_duration(r, load.duration_s)
        total += n
    return total * per_set // len(prompts)


def run_probe(servers: Server | Sequence[Server], prompts: list[Prompt], settings: RequestSettings,
              concurrency: int = 1, repeat: int = 1, warmup: int = 1, prompts_source: str = "built-in",
              progress: Progress | None = None, load: LoadSettings | None = None, *, workers: int = 1,
              ray_address: str | None = None, layout: bool = False, show: int = 1) -> ProbeReport:
    """Probe one server, or several replicas (requests round robin), with ``prompts``; the load from
    this process, ``workers`` worker processes, or Ray actors at ``ray_address``. ``load``: arrival
    rates (then each rate is a level, sent open-loop, instead of ``concurrency``), --duration, SLOs.
    The report describes where the load came from (``scale``) when it was spread, or with ``layout``;
    it draws ``show`` answers pass by pass.

    Returns the report; a dead server, a dead worker or Ctrl-C gives a partial report
    (``partial_reason`` says why; after Ctrl-C the KeyboardInterrupt is re-raised with the partial
    report as ``.report``)."""
    servers = [servers] if isinstance(servers, Server) else list(servers)
    if not servers:
        raise ValueError("no server")
    if len({s.base_url for s in servers}) != len(servers):
        raise UsageError("the same --url is given twice: give each replica once")
    spread = workers > 1 or ray_address is not None or len(servers) > 1 or layout
    settings = with_spec_extras(settings, servers[0])
    targets = [target_of(s) for s in servers]
    infos = {s.base_url: s.describe() for s in servers}
    guard = ServerGuard(servers)
    counter_windows: dict[str, CounterWindow] = {}
    results: list[RunResult] = []
    meters: list = []
    interrupted: KeyboardInterrupt | None = None
    shares_used: list[int] = []

    async def main(executor: Executor) -> None:
        if warmup:  # discarded, one after the other, round robin over the servers: the first requests are slow
            await warm_up(targets, prompts, settings, warmup, progress)
        for s in servers:
            counter_windows[s.base_url] = await CounterWindow(s).open()
        async with measure_client() as meter:  # its figures are set also when the run raises
            meters.append(meter)
            try:
                run_t0 = time.perf_counter_ns()
                for shares in _levels(prompts, settings, concurrency, repeat, load, len(servers), workers):
                    shares_used.append(len(shares))
                    t0 = None
                    if executor.shared_clock:  # one timeline: each rate's schedule starts when the previous is done
                        t0, shift = run_t0, time.perf_counter_ns() - run_t0
                        shares = [_shifted(s, shift) for s in shares]
                    result = await executor.run(shares, targets, progress, guard.watch, guard.accept, t0)
                    results.append(result)
                    if result.partial_reason is not None:
                        break
            finally:
                if isinstance(executor, InProcess):
                    meter.add_chunks(executor.chunks_read)
                await executor.aclose()

    executor = executor_for(workers, ray_address)
    with counting(*servers):
        try:
            with executor:
                run_loop(main(executor))
        except KeyboardInterrupt as exc:
            interrupted = exc
            if executor.last.partial_reason is None:
                executor.last.partial_reason = executor.interrupted
            if not results or results[-1] is not executor.last:
                results.append(executor.last)
        partial = next((r.partial_reason for r in results if r.partial_reason), None)
        for s in servers:
            if s.base_url not in counter_windows:  # the run stopped before the counters were read
                counter_windows[s.base_url] = CounterWindow(s)
                counter_windows[s.base_url].before = read_counters_safely(s)
            window = counter_windows[s.base_url]
            if partial is None:
                window.close_now()
            else:
                window.after = read_counters_safely(s)
    records = [rec for r in results for rec in r.records]
    planned = sum(r.planned for r in results)
    log_tail = ""
    if guard.dead is not None or (partial is not None and guard.servers and guard.watch()):
        partial, log_tail = guard.death_reason(len(records), max(planned, len(records)))
        for window in counter_windows.values():
            window.after = CounterSnapshot(source="unavailable: the server exited during the run")
    windows = {url: (counter_windows[url].before, counter_windows[url].after) for url in infos}
    before, after = summed_counters(list(windows.values()))
    scale, notes = None, []
    if spread:
        scale = ScaleLayout(executor=executor.kind, workers_requested=workers, workers=list(executor.infos.values()),
                             ray_address=ray_address,
                             replicas=replica_results(records, infos, windows) if len(servers) > 1 else [])
        notes = _spread_notes(workers, max(shares_used, default=workers), len(servers), executor.kind, concurrency,
                              planned)
    probe_settings = ProbeSettings(concurrency=concurrency, repeat=repeat, warmup=warmup,
                                   prompts_source=prompts_source, request=settings, load=load, show=show)
    client = client_load(*meters[0].figures) if meters and meters[0].figures and not spread else None
    report = build_probe_report(infos[servers[0].base_url], probe_settings, records, before, after, scale,
                                partial_reason=partial, log_tail=log_tail, extra_notes=notes, client=client)
    if interrupted is not None:
        interrupted.report = report  # type: ignore[attr-defined]
        raise interrupted
    return report


async def warm_up(targets: Sequence[Target], prompts: Sequence[Prompt], settings: RequestSettings, count: int,
                  progress: Progress | None = None, stamp: Stamp | None = None) -> None:
    """``count`` requests, discarded, one after the other, round robin over ``targets`` (the first
    requests after a server's start are slow)."""
    jobs = [Job(index=i, prompt=prompts[i % len(prompts)], target=i % len(targets)) for i in range(count)]
    stamp = (stamp or Stamp()).model_copy(update={"warmup": True})
    executor = InProcess()
    try:
        await executor.run([Share(worker=0, jobs=tuple(jobs), settings=settings, concurrency=1, stamp=stamp)],
                           targets, progress)
    finally:
        await executor.aclose()


def _levels(prompts: list[Prompt], settings: RequestSettings, concurrency: int, repeat: int,
            load: LoadSettings | None, replicas: int, workers: int) -> Iterator[list[Share]]:
    """The shares of each level: one closed-loop run at ``concurrency`` (cycled for --duration), or
    one open-loop run per arrival rate (each schedule starts when the previous rate's requests are done)."""
    rates = load.request_rates if load else []
    if not rates:
        duration = load.duration_s if load else None
        jobs = closed_jobs(prompts, 1 if duration is not None else repeat, replicas=replicas)
        yield split(jobs, settings, concurrency, workers, duration_s=duration)
        return
    for rate in rates:
        jobs = rate_jobs(prompts, rate, load, passes=repeat, replicas=replicas)
        yield split(jobs, settings, None, workers, stamp=Stamp(concurrency=0, request_rate=rate))


def _shifted(share: Share, shift_ns: int) -> Share:
    """``share`` with its open-loop offsets ``shift_ns`` later."""
    if share.concurrency is not None or not shift_ns:
        return share
    return replace(share, jobs=tuple(j.model_copy(update={"offset_ns": (j.offset_ns or 0) + shift_ns})
                                     for j in share.jobs))


def _spread_notes(workers: int, used: int, replicas: int, kind: str, concurrency: int, planned: int) -> list[str]:
    notes = []
    if used < workers:
        notes.append(f"{workers} workers were asked for, {used} used: each needs at least one request "
                     f"and one stream (requests {planned}, concurrency {concurrency})")
    if replicas > 1:
        notes.append(f"requests went round robin over {replicas} replicas (server above: the first); the "
                     "figures are over all of them, each replica's own are in the per-replica table")
    if kind == "ray":
        notes.append("Ray workers time their requests on their own clocks from a shared wall-clock start "
                     "instant; see each worker's start lag and clock offset")
    return notes


def probe_servers(plan: ServerPlan, prompts: list[Prompt], settings: RequestSettings, concurrency: int = 1,
                  repeat: int = 1, warmup: int = 1, load: LoadSettings | None = None, *, workers: int = 1,
                  ray_address: str | None = None, workload: WorkloadInfo | None = None,
                  bars: ProgressBars = no_bars, messages: Messages = LOGGED, show: int = 1) -> ProbeReport:
    """A whole probe on the servers of ``plan`` (one side, or one per replica: ``replica_sides``):
    open them, run ``run_probe``, stop what was started. A dead server, a dead worker or Ctrl-C
    gives a partial report (after Ctrl-C the KeyboardInterrupt carries it as ``.report``)."""
    with open_servers(plan, messages) as servers:
        progress = bars("probing", planned_requests(prompts, repeat, load) + warmup)
        try:
            report = run_probe(servers, prompts, settings, concurrency, repeat, warmup,
                               workload.source if workload else "built-in", progress, load, workers=workers,
                               ray_address=ray_address, show=show)
        except KeyboardInterrupt as exc:
            part = getattr(exc, "report", None)
            if part is not None:
                part.settings.workload = workload
            raise
    report.settings.workload = workload
    return report

"""A probe run: warm-up, counters before, the prompt set at a concurrency, counters after.

Faults do not end a run: a failed request is recorded with its reason, and counters that
cannot be read make acceptance unknown. One thing does: a server that specadapt started
(``server.process``) and that exits mid-run. The run then stops, keeps the requests that
had finished, and the report is marked ``partial`` with the exit code.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Callable, Iterator

from specadapt.adapters.base import Server
from specadapt.analysis.client_load import client_load
from specadapt.analysis.probe_report import build_probe_report
from specadapt.errors import SpecadaptError
from specadapt.load.arrivals import arrivals_for_duration, schedule_ns
from specadapt.load.client import StreamClient, open_client, stream_request
from specadapt.load.client import run as run_loop
from specadapt.load.engine import Job, LoadEngine, NotFinished, cycle_jobs
from specadapt.load.meter import ClientMeter, measure_client
from specadapt.records import (
    CounterSnapshot,
    ProbeReport,
    ProbeSettings,
    Prompt,
    RequestRecord,
    RequestSettings,
)
from specadapt.records.load import LoadSettings

Progress = Callable[[RequestRecord], None]


def settle_counters(server: Server, previous: CounterSnapshot | None = None,
                    max_wait_s: float = 3.0) -> CounterSnapshot:
    """Read counters until two reads in a row agree: servers update stats just after the
    last response is sent, so an immediate read can miss the final step."""
    deadline = time.monotonic() + max_wait_s
    last = previous or read_counters_safely(server)
    while True:
        time.sleep(0.2)
        now = read_counters_safely(server)
        if now == last or time.monotonic() > deadline:
            return now
        last = now


def read_counters_safely(server: Server) -> CounterSnapshot:
    """A snapshot, or an empty one saying why there is none (acceptance then is unknown)."""
    try:
        return server.read_counters()
    except SpecadaptError as exc:
        return CounterSnapshot(source=f"unavailable: {exc}")


class _Partial(Exception):
    """Internal: the managed server exited while requests were running."""

    def __init__(self, records: list[RequestRecord], planned: int):
        super().__init__("partial run")
        self.records, self.planned = records, planned
        self.before: CounterSnapshot | None = None


async def _exits_soon(process, within_s: float = 0.5) -> bool:
    """True if ``process`` has exited or does within ``within_s``: a dying server drops its
    connections a moment before the kernel reports its exit."""
    deadline = time.monotonic() + within_s
    while process.alive():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


async def _watch_process(process, poll_s: float = 0.2) -> None:
    while process.alive():
        await asyncio.sleep(poll_s)


def server_client(server: Server, settings: RequestSettings,
                  concurrency: int) -> contextlib.AbstractAsyncContextManager[StreamClient]:
    """The streaming client for one server: its auth and TLS settings, a connection per stream."""
    return open_client(server, settings, concurrency)


def planned_requests(prompts: list[Prompt], repeat: int, load: LoadSettings | None) -> int:
    """Requests a probe plans to send (a progress bar's total; a conversation counts its turns;
    --duration at a concurrency is open-ended and counts one pass)."""
    per_set = sum(1 + len(p.turns or []) for p in prompts)
    rates = load.request_rates if load else []
    if not rates:
        return per_set * repeat
    return sum(len(rate_jobs(prompts, r, repeat, load)) for r in rates) * per_set // len(prompts)


def rate_jobs(prompts: list[Prompt], rate: float, repeat: int, load: LoadSettings) -> list[Job]:
    """The jobs of one arrival-rate level: the prompt set cycled, each with its scheduled offset.
    Count: ceil(rate * duration) with --duration (the prompt set x repeat at rate inf), else the
    prompt set x repeat."""
    n = len(prompts) * repeat
    if load.duration_s is not None and not math.isinf(rate):
        n = arrivals_for_duration(rate, load.duration_s)
    offsets = schedule_ns(rate, n, load.burstiness, load.seed)
    return [Job(prompt=prompts[i % len(prompts)], repeat=i // len(prompts), offset_ns=off)
            for i, off in enumerate(offsets)]


async def _run_requests(server: Server, prompts: list[Prompt], settings: RequestSettings, concurrency: int,
                        repeat: int, warmup: int, progress: Progress | None,
                        load: LoadSettings | None = None, meter_out: list[ClientMeter] | None = None
                        ) -> tuple[list[RequestRecord], CounterSnapshot, CounterSnapshot]:
    rates = load.request_rates if load else []
    async with server_client(server, settings, concurrency if not rates else 1024) as client:
        model = server.model_id
        t0 = time.perf_counter_ns()
        for i in range(warmup):  # discarded: the first requests after start-up are slow
            rec = await stream_request(client, prompts[i % len(prompts)], model, settings, t0, warmup=True)
            if progress:
                progress(rec)
        before = await asyncio.to_thread(settle_counters, server)
        process = server.process  # None unless specadapt started the server
        run_t0 = 0

        async def send(prompt: Prompt, job: Job, turn: int) -> RequestRecord | None:
            if process is not None and not process.alive():
                return None  # not sent: the server is gone
            rec = await stream_request(client, prompt, model, settings, run_t0, repeat=job.repeat)
            if process is not None and not rec.ok and await _exits_soon(process):
                return None  # it failed because the server died under it: not a finished request
            if rates:
                rec.concurrency, rec.request_rate = 0, level_rate
            if progress:
                progress(rec)
            return rec

        engine = LoadEngine(send)
        records: list[RequestRecord] = []
        planned = 0
        async with measure_client(client) as meter:  # its load is set also when the run raises
            if meter_out is not None:
                meter_out.append(meter)
            try:
                if not rates:
                    duration = load.duration_s if load else None
                    jobs = cycle_jobs(prompts) if duration is not None else \
                        [Job(prompt=p, repeat=r) for r in range(repeat) for p in prompts]
                    planned = len(jobs) if isinstance(jobs, list) else 0
                    level_rate = None
                    run_t0 = time.perf_counter_ns()
                    records = await _engine_or_death(engine.closed_loop(jobs, run_t0, concurrency, duration),
                                                     process)
                else:
                    run_t0 = time.perf_counter_ns()
                    for level_rate in rates:  # each schedule starts when the previous rate's requests are done
                        shift = time.perf_counter_ns() - run_t0
                        jobs = [j.model_copy(update={"offset_ns": j.offset_ns + shift})
                                for j in rate_jobs(prompts, level_rate, repeat, load)]
                        planned += len(jobs)
                        records += await _engine_or_death(engine.open_loop(jobs, run_t0), process)
            except (_Partial, NotFinished):
                part = _Partial(engine.finished, max(planned, len(engine.finished)))
                part.before = before
                raise part from None
        after = await asyncio.to_thread(settle_counters, server, None)
    return records, before, after


async def _engine_or_death(run, process) -> list[RequestRecord]:
    """The engine's records; _Partial if ``process`` (the managed server) exits first."""
    if process is None:
        return await run
    task = asyncio.ensure_future(run)
    watcher = asyncio.ensure_future(_watch_process(process))
    await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    watcher.cancel()
    if not task.done():
        task.cancel()
    await asyncio.gather(task, watcher, return_exceptions=True)
    if task.cancelled() or task.exception() is not None:
        if task.done() and not task.cancelled() and not isinstance(task.exception(), NotFinished):
            raise task.exception()
        raise _Partial([], 0)
    return task.result()


def _death_reason(server: Server, done: int, planned: int) -> tuple[str, str]:
    """(one-line reason with the exit code, the server log's last lines)."""
    process = server.process
    code = process.proc.poll() if process.proc else None
    reason = (f"the {server.backend} server exited with code {code} during the run; {done} of {planned} "
              f"requests had finished (log: {process.log_path})")
    return reason, process.log_tail()


@contextlib.contextmanager
def counting(*servers: Server) -> Iterator[None]:
    """One run's counter window: servers whose counters drain on read poll them between
    start_run() and end_run() (each server once, however often it is given)."""
    unique = list(dict.fromkeys(servers))
    for server in unique:
        server.start_run()
    try:
        yield
    finally:
        for server in unique:
            server.end_run()


def run_probe(server: Server, prompts: list[Prompt], settings: RequestSettings, concurrency: int = 1,
              repeat: int = 1, warmup: int = 1, prompts_source: str = "built-in",
              progress: Progress | None = None, load: LoadSettings | None = None) -> ProbeReport:
    """Probe ``server`` with ``prompts`` and return the full report. ``load``: arrival rates
    (then each rate is a level, sent open-loop, instead of ``concurrency``), --duration, SLOs."""
    info = server.describe()
    partial_reason, log_tail = None, ""
    meters: list[ClientMeter] = []
    with counting(server):
        try:
            records, before, after = run_loop(
                _run_requests(server, prompts, settings, concurrency, repeat, warmup, progress, load, meters))
        except _Partial as part:
            records, before = part.records, part.before
            after = CounterSnapshot(source="unavailable: the server exited during the run")
            partial_reason, log_tail = _death_reason(server, len(records), part.planned)
    settings_record = ProbeSettings(concurrency=concurrency, repeat=repeat, warmup=warmup,
                                    prompts_source=prompts_source, request=settings, load=load)
    return build_probe_report(info, settings_record, records, before, after, partial_reason=partial_reason,
                              log_tail=log_tail, client=client_load(*meters[0].figures) if meters and meters[0].figures else None)

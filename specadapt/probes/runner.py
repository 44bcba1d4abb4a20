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
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Callable

from specadapt.adapters.base import Server
from specadapt.errors import SpecadaptError
from specadapt.probes.acceptance import acceptance_summary
from specadapt.probes.arrivals import arrivals_for_duration, rate_label, schedule_ns, send_lag
from specadapt.probes.client import StreamClient, open_client, stream_request
from specadapt.probes.client import run as run_loop
from specadapt.probes.client_load import ClientMeter, client_limited, measure_client
from specadapt.probes.latency import latency_summary
from specadapt.probes.load import Job, LoadEngine, NotFinished, cycle_jobs
from specadapt.probes.slo import goodput_summary
from specadapt.records import (
    ClientLoad,
    CounterSnapshot,
    ProbeReport,
    ProbeSettings,
    Prompt,
    RequestRecord,
    RequestSettings,
    ScaleLayout,
    ServerInfo,
)
from specadapt.records.load import LoadSettings, RateLevel

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
                              log_tail=log_tail, client=meters[0].load if meters else None)


def build_probe_report(server: ServerInfo, settings: ProbeSettings, records: list[RequestRecord],
                       before: CounterSnapshot, after: CounterSnapshot, scale: ScaleLayout | None = None,
                       partial_reason: str | None = None, log_tail: str = "", extra_notes: Sequence[str] = (),
                       client: ClientLoad | None = None) -> ProbeReport:
    """A probe report from its records and counter window, every figure computed from them: one
    process and one server (run_probe), or records gathered by workers, replicas or saved runs."""
    by_cat: dict[str, list[RequestRecord]] = {}
    for rec in records:
        by_cat.setdefault(rec.category, []).append(rec)
    retried = [r for r in records if r.attempts > 1]
    report = ProbeReport(
        server=server, settings=settings, partial=partial_reason is not None, partial_reason=partial_reason,
        latency=latency_summary([r for r in records if r.attempts == 1]),
        latency_retried=latency_summary(retried) if retried else None,
        failures=dict(sorted(Counter(_failure_key(r) for r in records if not r.ok).items())),
        by_category={cat: latency_summary(recs) for cat, recs in sorted(by_cat.items())},
        acceptance=acceptance_summary(before, after),
        counters_before=before, counters_after=after,
        token_sources=dict(Counter(r.token_source or "none" for r in records if r.ok)),
        client=client, scale=scale, requests=records,
    )
    load = settings.load
    slo = load.slo_ms if load else {}
    if slo:
        report.goodput = goodput_summary([r for r in records if not r.warmup], slo)
    for rate in (load.request_rates if load else []):
        recs = [r for r in records if r.request_rate == rate and not r.warmup]
        first = [r for r in recs if r.scheduled_at_ns is not None]
        report.rates.append(RateLevel(
            request_rate=rate, latency=latency_summary(recs),
            send_lag=send_lag([r.scheduled_at_ns for r in first], [r.sent_at_ns for r in first]),
            goodput=goodput_summary(recs, slo) if slo else None))
    report.notes += _notes(report)
    report.notes += list(extra_notes)
    if log_tail:
        report.notes.append(LOG_NOTE + log_tail)
    return report


LOG_NOTE = "last lines of the server log:\n"


def server_log_tail(report: ProbeReport) -> str:
    """The server log lines a partial report carries in its notes ('' if none)."""
    return next((n[len(LOG_NOTE):] for n in report.notes if n.startswith(LOG_NOTE)), "")


def _failure_key(rec: RequestRecord) -> str:
    """The error kind; HTTP errors by status (http_429, http_503, ...)."""
    if rec.error_kind == "http_status" and rec.status_code:
        return f"http_{rec.status_code}"
    return rec.error_kind or "other"


def failed_count(report: ProbeReport) -> int:
    """Failed requests, whether sent once or retried."""
    return sum(1 for r in report.requests if not r.ok)


def _notes(report: ProbeReport) -> list[str]:
    notes = list(report.server.notes)
    if report.token_sources.get("chunks"):
        notes.append("some requests had neither continuous usage nor logprobs: their tokens were counted "
                     "one per chunk, which understates tokens and overstates ITL under speculation")
    gen = report.acceptance.generation_tokens
    if gen is not None and gen != report.latency.output_tokens:
        notes.append(f"the server counted {gen:.0f} generated tokens during the run, the probe "
                     f"{report.latency.output_tokens}: other clients may be using the server")
    failed = failed_count(report)
    if failed:
        kinds = ", ".join(f"{k} {n}" for k, n in report.failures.items())
        notes.append(f"{failed} request(s) failed ({kinds}); see the requests list for reasons")
    for lv in report.rates:
        if lv.send_lag.client_limited:
            notes.append(f"request rate {rate_label(lv.request_rate)}: {lv.send_lag.reason}; its figures describe "
                         "the client's pace, not the server's")
    limited = client_limited(report.client) if report.client is not None else None
    if limited:
        notes.append(limited)
    if report.latency_retried is not None:
        notes.append(f"{report.latency_retried.requests} request(s) were sent more than once (--retries): "
                     "their latency is reported apart, not in the main figures")
    return notes

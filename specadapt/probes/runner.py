"""A probe run: warm-up, counters before, the prompt set at a concurrency, counters after.

Faults do not end a run: a failed request is recorded with its reason, and counters that
cannot be read make acceptance unknown. One thing does: a server that specadapt started
(``server.process``) and that exits mid-run. The run then stops, keeps the requests that
had finished, and the report is marked ``partial`` with the exit code.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import Iterator
from typing import Callable

from specadapt.adapters.base import Server
from specadapt.errors import SpecadaptError
from specadapt.probes.acceptance import acceptance_summary
from specadapt.probes.client import StreamClient, open_client, stream_request
from specadapt.probes.latency import latency_summary
from specadapt.records import (
    CounterSnapshot,
    ProbeReport,
    ProbeSettings,
    Prompt,
    RequestRecord,
    RequestSettings,
)

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


async def _gather_or_death(jobs: list, process) -> list[RequestRecord]:
    """Run ``jobs`` (each returns a record, or None when the server was gone); if
    ``process`` exits first, cancel the rest and raise _Partial."""
    tasks = [asyncio.ensure_future(j) for j in jobs]
    if process is None:
        return list(await asyncio.gather(*tasks))
    watcher = asyncio.ensure_future(_watch_process(process))
    all_done = asyncio.gather(*tasks)
    await asyncio.wait({all_done, watcher}, return_when=asyncio.FIRST_COMPLETED)
    watcher.cancel()
    if not all_done.done():
        for t in tasks:
            t.cancel()
    await asyncio.gather(all_done, watcher, return_exceptions=True)
    results = [t.result() for t in tasks if t.done() and not t.cancelled() and t.exception() is None]
    finished = [r for r in results if r is not None]
    if len(finished) < len(tasks):
        raise _Partial(finished, len(tasks))
    return finished


def server_client(server: Server, settings: RequestSettings,
                  concurrency: int) -> contextlib.AbstractAsyncContextManager[StreamClient]:
    """The streaming client for one server: its auth and TLS settings, a connection per stream."""
    return open_client(server, settings, concurrency)


async def _run_requests(server: Server, prompts: list[Prompt], settings: RequestSettings, concurrency: int,
                        repeat: int, warmup: int, progress: Progress | None) -> tuple[list[RequestRecord], CounterSnapshot, CounterSnapshot]:
    async with server_client(server, settings, concurrency) as client:
        model = server.model_id
        t0 = time.perf_counter_ns()
        for i in range(warmup):  # discarded: the first requests after start-up are slow
            rec = await stream_request(client, prompts[i % len(prompts)], model, settings, t0, warmup=True)
            if progress:
                progress(rec)
        before = await asyncio.to_thread(settle_counters, server)
        sem = asyncio.Semaphore(concurrency)
        t0 = time.perf_counter_ns()

        process = server.process  # None unless specadapt started the server

        async def one(prompt: Prompt, r: int) -> RequestRecord | None:
            async with sem:
                if process is not None and not process.alive():
                    return None  # not sent: the server is gone
                rec = await stream_request(client, prompt, model, settings, t0, repeat=r)
            if process is not None and not rec.ok and await _exits_soon(process):
                return None  # it failed because the server died under it: not a finished request
            if progress:
                progress(rec)
            return rec

        jobs = [one(p, r) for r in range(repeat) for p in prompts]
        try:
            records = await _gather_or_death(jobs, process)
        except _Partial as part:
            part.before = before
            raise
        after = await asyncio.to_thread(settle_counters, server, None)
    return records, before, after


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
              progress: Progress | None = None) -> ProbeReport:
    """Probe ``server`` with ``prompts`` and return the full report."""
    info = server.describe()
    partial_reason, log_tail = None, ""
    with counting(server):
        try:
            records, before, after = asyncio.run(
                _run_requests(server, prompts, settings, concurrency, repeat, warmup, progress))
        except _Partial as part:
            records, before = part.records, part.before
            after = CounterSnapshot(source="unavailable: the server exited during the run")
            partial_reason, log_tail = _death_reason(server, len(records), part.planned)
    by_cat: dict[str, list[RequestRecord]] = {}
    for rec in records:
        by_cat.setdefault(rec.category, []).append(rec)
    report = ProbeReport(
        server=info,
        settings=ProbeSettings(concurrency=concurrency, repeat=repeat, warmup=warmup,
                               prompts_source=prompts_source, request=settings),
        partial=partial_reason is not None, partial_reason=partial_reason,
        latency=latency_summary([r for r in records if r.attempts == 1]),
        latency_retried=latency_summary(retried) if (retried := [r for r in records if r.attempts > 1]) else None,
        failures=dict(sorted(Counter(_failure_key(r) for r in records if not r.ok).items())),
        by_category={cat: latency_summary(recs) for cat, recs in sorted(by_cat.items())},
        acceptance=acceptance_summary(before, after),
        counters_before=before, counters_after=after,
        token_sources=dict(Counter(r.token_source or "none" for r in records if r.ok)),
        requests=records,
    )
    report.notes += _notes(report)
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
    if report.latency_retried is not None:
        notes.append(f"{report.latency_retried.requests} request(s) were sent more than once (--retries): "
                     "their latency is reported apart, not in the main figures")
    return notes

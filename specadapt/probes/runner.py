"""A probe run: warm-up, counters before, the prompt set at a concurrency, counters after."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Callable

import httpx

from specadapt.adapters.base import CounterSnapshot, Server, run_hooks
from specadapt.probes.acceptance import acceptance_summary
from specadapt.probes.client import RequestRecord, RequestSettings, stream_request
from specadapt.probes.latency import latency_summary
from specadapt.probes.prompts import Prompt
from specadapt.report.model import ProbeReport, ProbeSettings

Progress = Callable[[RequestRecord], None]


def settle_counters(server: Server, previous: CounterSnapshot | None = None,
                    max_wait_s: float = 3.0) -> CounterSnapshot:
    """Read counters until two reads in a row agree: servers update stats just after the
    last response is sent, so an immediate read can miss the final step."""
    deadline = time.monotonic() + max_wait_s
    last = previous or server.read_counters()
    while True:
        time.sleep(0.2)
        now = server.read_counters()
        if now == last or time.monotonic() > deadline:
            return now
        last = now


async def _run_requests(server: Server, prompts: list[Prompt], settings: RequestSettings, concurrency: int,
                        repeat: int, warmup: int, progress: Progress | None) -> tuple[list[RequestRecord], CounterSnapshot, CounterSnapshot]:
    timeout = httpx.Timeout(connect=10.0, read=settings.request_timeout_s, write=30.0, pool=None)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=server.base_url, headers=server.headers(), timeout=timeout,
                                 limits=limits, verify=getattr(server, "verify", True)) as client:
        model = server.model_id
        t0 = time.perf_counter_ns()
        for i in range(warmup):  # discarded: the first requests after start-up are slow
            rec = await stream_request(client, prompts[i % len(prompts)], model, settings, t0, warmup=True)
            if progress:
                progress(rec)
        before = await asyncio.to_thread(settle_counters, server)
        sem = asyncio.Semaphore(concurrency)
        t0 = time.perf_counter_ns()

        async def one(prompt: Prompt, r: int) -> RequestRecord:
            async with sem:
                rec = await stream_request(client, prompt, model, settings, t0, repeat=r)
            if progress:
                progress(rec)
            return rec

        jobs = [one(p, r) for r in range(repeat) for p in prompts]
        records = list(await asyncio.gather(*jobs))
        after = await asyncio.to_thread(settle_counters, server, None)
    return records, before, after


def run_probe(server: Server, prompts: list[Prompt], settings: RequestSettings, concurrency: int = 1,
              repeat: int = 1, warmup: int = 1, prompts_source: str = "built-in",
              progress: Progress | None = None) -> ProbeReport:
    """Probe ``server`` with ``prompts`` and return the full report."""
    info = server.describe()
    start_run, end_run = run_hooks(server)
    start_run()
    try:
        records, before, after = asyncio.run(
            _run_requests(server, prompts, settings, concurrency, repeat, warmup, progress))
    finally:
        end_run()
    by_cat: dict[str, list[RequestRecord]] = {}
    for rec in records:
        by_cat.setdefault(rec.category, []).append(rec)
    report = ProbeReport(
        server=info,
        settings=ProbeSettings(concurrency=concurrency, repeat=repeat, warmup=warmup,
                               prompts_source=prompts_source, request=settings),
        latency=latency_summary(records),
        by_category={cat: latency_summary(recs) for cat, recs in sorted(by_cat.items())},
        acceptance=acceptance_summary(before, after),
        counters_before=before, counters_after=after,
        token_sources=dict(Counter(r.token_source or "none" for r in records if r.ok)),
        requests=records,
    )
    report.notes += _notes(report)
    return report


def _notes(report: ProbeReport) -> list[str]:
    notes = list(report.server.notes)
    if report.token_sources.get("chunks"):
        notes.append("some requests had neither continuous usage nor logprobs: their tokens were counted "
                     "one per chunk, which understates tokens and overstates ITL under speculation")
    gen = report.acceptance.generation_tokens
    if gen is not None and gen != report.latency.output_tokens:
        notes.append(f"the server counted {gen:.0f} generated tokens during the run, the probe "
                     f"{report.latency.output_tokens}: other clients may be using the server")
    if report.latency.failed:
        notes.append(f"{report.latency.failed} request(s) failed; see the requests list for reasons")
    return notes

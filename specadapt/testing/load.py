"""A steady load of scripted streams for minutes: the probe client's CPU, memory and timing error.

Used by the opt-in soak test and benchmarks/probe_client_load.py. Streams are staggered
(request i's first token is later by i/concurrency of an ITL) and kept in flight at the
given concurrency until the time is up; the server's log is collected every 2 s, so
memory stays flat however long it runs.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import psutil

from specadapt.analysis.client_load import client_limited, client_load
from specadapt.load.client import stream_request
from specadapt.wire.stream import connect
from specadapt.load.meter import measure_client
from specadapt.records import Prompt, RequestRecord, RequestSettings
from specadapt.testing import script
from specadapt.testing.timing import summary, timing_errors


async def soak(base_url: str, concurrency: int, seconds: float, itl_ms: float, tokens: int,
               connector: Callable[..., AbstractAsyncContextManager[Any]] = connect) -> dict:
    """``connector(base_url, concurrency=, request_timeout_s=)``: the client to measure (default: the
    probe's own ``connect``); it needs ``post_stream`` and ``get_json``."""
    me = psutil.Process()
    settings = RequestSettings(max_tokens=tokens, request_timeout_s=120)
    errors: dict[str, list[float]] = {}
    failed: list[str] = []
    pending: dict[str, RequestRecord] = {}
    counter = 0
    rss: list[float] = []
    async with connector(base_url, concurrency=concurrency, request_timeout_s=120) as client:
        deadline = time.monotonic() + seconds

        async def worker(w: int) -> None:
            nonlocal counter
            while time.monotonic() < deadline:
                counter += 1
                rid = f"soak-{counter}"
                ttft = 50.0 + (w % concurrency) * itl_ms / concurrency  # staggered streams
                prompt = Prompt(id=rid, prompt=script(id=rid, ttft_ms=ttft, itl_ms=itl_ms, tokens=tokens))
                rec = await stream_request(client, prompt, "scripted", settings, run_t0_ns=0)
                if rec.ok:
                    pending[rid] = rec
                else:
                    failed.append(rec.error or "?")

        async def collector() -> None:
            while time.monotonic() < deadline + 5:
                await asyncio.sleep(2.0)
                log = await client.get_json("/_script/log?pop=1")
                done = [pending.pop(k) for k in list(pending) if k in log]
                for metric, values in timing_errors(done, log).items():
                    errors.setdefault(metric, []).extend(values)
                rss.append(me.memory_info().rss / 2**20)

        cpu0, wall0 = me.cpu_times(), time.monotonic()
        async with measure_client(client) as meter:
            await asyncio.gather(collector(), *(worker(w) for w in range(concurrency)))
        cpu1, wall1 = me.cpu_times(), time.monotonic()
    assert meter.figures is not None
    load = client_load(*meter.figures)
    cpu = (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)
    n_ok = sum(len(v) for k, v in errors.items() if k == "e2e")
    return {"concurrency": concurrency, "seconds": round(wall1 - wall0, 1), "itl_ms": itl_ms, "tokens": tokens,
            "requests_ok": n_ok, "requests_failed": len(failed), "failures": failed[:5],
            "client_cpu_s": round(cpu, 1), "client_cpu_pct_of_one_core": round(100 * cpu / (wall1 - wall0), 1),
            "client_rss_mib_first_last_max": [round(rss[0], 1), round(rss[-1], 1), round(max(rss), 1)] if rss else None,
            "chunks_per_s": round(n_ok * tokens / (wall1 - wall0), 1), "load_avg": os.getloadavg(),
            "events_read": load.chunks, "cpu_ms_per_chunk": load.cpu_ms_per_chunk,
            "loop_lag_ms": {"p50": load.loop_lag_ms_p50, "p99": load.loop_lag_ms_p99, "max": load.loop_lag_ms_max},
            "client_limited": client_limited(load),
            "timing_error_ms": summary(errors)}

"""Soak (opt-in: pytest -m soak): the probe client against the scripted server at a high
concurrency for minutes; reports the client's CPU and memory use and its timing error.

Settings from the environment: SOAK_CONCURRENCY (256), SOAK_SECONDS (300), SOAK_ITL_MS
(100), SOAK_TOKENS (32), SOAK_OUT (a JSON file for the figures; default: none).
"""

from __future__ import annotations

import asyncio
import json
import os
import time

import httpx
import psutil
import pytest

from specadapt.probes.client import RequestRecord, RequestSettings, stream_request
from specadapt.probes.prompts import Prompt
from specadapt.testing import script
from specadapt.testing.timing import summary, timing_errors

pytestmark = pytest.mark.soak


async def soak(base_url: str, concurrency: int, seconds: float, itl_ms: float, tokens: int) -> dict:
    me, server = psutil.Process(), None
    settings = RequestSettings(max_tokens=tokens, request_timeout_s=120)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    errors: dict[str, list[float]] = {}
    failed: list[str] = []
    pending: dict[str, RequestRecord] = {}
    counter = 0
    rss: list[float] = []
    async with httpx.AsyncClient(base_url=base_url, limits=limits, timeout=httpx.Timeout(120, pool=None)) as client:
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
                log = (await client.get("/_script/log?pop=1")).json()
                done = [pending.pop(k) for k in list(pending) if k in log]
                for metric, values in timing_errors(done, log).items():
                    errors.setdefault(metric, []).extend(values)
                rss.append(me.memory_info().rss / 2**20)

        cpu0, wall0 = me.cpu_times(), time.monotonic()
        await asyncio.gather(collector(), *(worker(w) for w in range(concurrency)))
        cpu1, wall1 = me.cpu_times(), time.monotonic()
    del server
    cpu = (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)
    n_ok = sum(len(v) for k, v in errors.items() if k == "e2e")
    return {"concurrency": concurrency, "seconds": round(wall1 - wall0, 1), "itl_ms": itl_ms, "tokens": tokens,
            "requests_ok": n_ok, "requests_failed": len(failed), "failures": failed[:5],
            "client_cpu_s": round(cpu, 1), "client_cpu_pct_of_one_core": round(100 * cpu / (wall1 - wall0), 1),
            "client_rss_mib_first_last_max": [round(rss[0], 1), round(rss[-1], 1), round(max(rss), 1)] if rss else None,
            "chunks_per_s": round(n_ok * tokens / (wall1 - wall0), 1), "load_avg": os.getloadavg(),
            "timing_error_ms": summary(errors)}


def test_soak(scripted_url):
    env = os.environ
    result = asyncio.run(soak(scripted_url, int(env.get("SOAK_CONCURRENCY", 256)), float(env.get("SOAK_SECONDS", 300)),
                              float(env.get("SOAK_ITL_MS", 100)), int(env.get("SOAK_TOKENS", 32))))
    text = json.dumps(result, indent=1)
    print("\nsoak:", text)
    if env.get("SOAK_OUT"):
        with open(env["SOAK_OUT"], "w") as fh:
            fh.write(text)
    assert result["requests_failed"] == 0, result["failures"]
    assert result["requests_ok"] > 0
    first, last, _peak = result["client_rss_mib_first_last_max"]
    assert last - first < 100, "client memory grew by more than 100 MiB during the soak"

"""How much load the probe client itself can carry with honest timings (not a CI test).

Starts the scripted SSE server (specadapt.testing) and, for each concurrency, drives
staggered streams for a fixed time in this one process, then prints the client's CPU
per chunk, chunks/s, its event-loop lag and its timing error against the server's log
(p50/p99 of |probe - truth|, ms). "OK" marks a concurrency whose p99 TTFT, ITL and E2E
errors all stay under 1 ms. The scripted server runs in its own process on the same
machine: on a small machine the two share the cores.

    python benchmarks/probe_client_load.py --concurrency 1 16 64 256 512 --seconds 20
    python benchmarks/probe_client_load.py --loop asyncio      # without uvloop
    python benchmarks/probe_client_load.py --client httpx      # httpx transport, same parser
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specadapt.load.client import run  # noqa: E402
from specadapt.testing import scripted_server  # noqa: E402
from specadapt.testing.load import soak  # noqa: E402
from specadapt.wire.stream import connect  # noqa: E402


class _HttpxResponse:
    def __init__(self, resp):
        self._resp, self.status = resp, resp.status_code
        self.content_type = resp.headers.get("content-type", "")

    async def read(self) -> bytes:
        return await self._resp.aread()

    def chunks(self):
        return self._resp.aiter_raw()

    async def finish(self):
        pass


class HttpxClient:
    """The httpx transport under the same SSE parser (for comparison: httpx's per-read cost)."""

    def __init__(self, client):
        self.client, self.chunks_read = client, 0

    @contextlib.asynccontextmanager
    async def post_stream(self, path, body):
        async with self.client.stream("POST", path, json=body) as resp:
            yield _HttpxResponse(resp)

    async def get_json(self, path):
        return (await self.client.get(path)).json()


@contextlib.asynccontextmanager
async def connect_httpx(base_url, *, concurrency, request_timeout_s):
    import httpx
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    timeout = httpx.Timeout(connect=10.0, read=request_timeout_s, write=30.0, pool=None)
    async with httpx.AsyncClient(base_url=base_url, limits=limits, timeout=timeout) as client:
        yield HttpxClient(client)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64, 256, 512])
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--itl-ms", type=float, default=100)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--loop", choices=["uvloop", "asyncio"], default="uvloop",
                    help="event loop (uvloop falls back to asyncio when not installed)")
    ap.add_argument("--client", choices=["aiohttp", "httpx"], default="aiohttp",
                    help="transport under the probe's SSE parser: aiohttp (the probe's own) or httpx")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    runner = run if args.loop == "uvloop" else asyncio.run
    rows = []
    print("streams  chunks/s  CPU ms/chunk  CPU %core  loop lag p99 ms  |error| p50/p99 ms: TTFT       ITL        "
          "E2E       failed", flush=True)
    with tempfile.TemporaryDirectory() as tmp, scripted_server(Path(tmp) / "server.log") as mp:
        for c in args.concurrency:
            r = runner(soak(mp.plan.base_url, c, args.seconds, args.itl_ms, args.tokens,
                            connect if args.client == "aiohttp" else connect_httpx))
            e = r["timing_error_ms"]
            ok = all(e[m]["p99_abs_ms"] < 1.0 for m in ("ttft", "itl", "e2e")) and not r["requests_failed"]
            cells = "  ".join(f"{e[m]['p50_abs_ms']:5.2f}/{e[m]['p99_abs_ms']:6.2f}" for m in ("ttft", "itl", "e2e"))
            print(f"{c:7d}  {r['chunks_per_s']:8.0f}  {r['cpu_ms_per_chunk']:12.3f}  {r['client_cpu_pct_of_one_core']:9.1f}"
                  f"  {r['loop_lag_ms']['p99']:15.2f}  {cells}  {r['requests_failed']:6d}  "
                  f"{'OK' if ok else 'over 1 ms'}", flush=True)
            rows.append({**r, "within_1ms": ok})
            time.sleep(1)
    meta = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": f"{os.cpu_count()}-core "
            f"{platform.machine()}", "loop": args.loop, "client": args.client,
            "load_avg_1m": os.getloadavg()[0], "itl_ms": args.itl_ms, "tokens": args.tokens,
            "seconds": args.seconds}
    print(json.dumps(meta))
    if args.out:
        args.out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()

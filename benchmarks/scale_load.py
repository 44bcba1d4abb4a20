"""How many streams one process vs N worker processes carry with honest timings (not a CI test).

Starts the scripted SSE server (specadapt.testing) and, for each concurrency and worker count,
runs a probe (orchestration.probe.run_probe: the code `specadapt probe --workers N` runs)
of staggered streams, then prints the timing error against the server's log (p50/p99 of
|probe - truth|, ms). "Within 1 ms" is p99 TTFT, ITL and E2E errors all under 1 ms. Send times
are on the shared monotonic clock (the report's worker t0 plus each record's send time).

    python benchmarks/scale_load.py --concurrency 16 32 64 128 --workers 1 2 --rounds 2
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specadapt.adapters.vllm import VLLMServer  # noqa: E402
from specadapt.orchestration.probe import run_probe  # noqa: E402
from specadapt.records import Prompt, RequestSettings  # noqa: E402
from specadapt.testing import script, scripted_server  # noqa: E402
from specadapt.testing.timing import summary, timing_errors  # noqa: E402


def one(url: str, concurrency: int, workers: int, rounds: int, itl_ms: float, tokens: int) -> dict:
    tag = f"c{concurrency}w{workers}-"
    stagger = [20 + (i % concurrency) * itl_ms / concurrency for i in range(concurrency * rounds)]
    prompts = [Prompt(id=f"{tag}{i}", prompt=script(id=f"{tag}{i}", ttft_ms=t, itl_ms=itl_ms, tokens=tokens))
               for i, t in enumerate(stagger)]
    server = VLLMServer(url)
    cpu0 = os.times()
    try:
        report = run_probe([server], prompts, RequestSettings(max_tokens=tokens, request_timeout_s=120),
                           concurrency=concurrency, warmup=0, workers=workers, layout=True)
    finally:
        server.close()
    log = httpx.get(url + "/_script/log?pop=1", timeout=60).json()
    t0 = report.scale.workers[0].t0_mono_ns
    absolute = [r.model_copy(update={"sent_at_ns": t0 + r.sent_at_ns}) for r in report.requests]
    errors = summary(timing_errors(absolute, log))
    cpu1 = os.times()
    return {"concurrency": concurrency, "workers": workers, "requests": len(report.requests),
            "failed": report.latency.failed, "timing_error_ms": errors, "load_avg": os.getloadavg(),
            "parent_cpu_s": (cpu1.user + cpu1.system) - (cpu0.user + cpu0.system)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", type=int, nargs="+", default=[16, 32, 64, 128])
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--rounds", type=int, default=2, help="Requests per stream.")
    ap.add_argument("--itl-ms", type=float, default=100)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp, scripted_server(Path(tmp) / "server.log") as mp:
        for c in args.concurrency:
            for w in args.workers:
                r = one(mp.plan.base_url, c, w, args.rounds, args.itl_ms, args.tokens)
                e = r["timing_error_ms"]
                ok = all(e[m]["p99_abs_ms"] < 1.0 for m in ("ttft", "itl", "e2e")) and not r["failed"]
                print(f"concurrency {c:4d} workers {w}: p50/p99 |error| ms: "
                      + "  ".join(f"{m.upper()} {e[m]['p50_abs_ms']:.2f}/{e[m]['p99_abs_ms']:.2f}"
                                  for m in ("ttft", "itl", "tpot", "e2e"))
                      + f"  failed {r['failed']}  load {r['load_avg'][0]:.1f}  {'OK' if ok else 'over 1 ms'}",
                      flush=True)
                rows.append({**r, "within_1ms": ok})
                time.sleep(1)
    meta = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": f"{os.cpu_count()}-core "
            f"{platform.machine()}", "itl_ms": args.itl_ms, "tokens": args.tokens, "rounds": args.rounds}
    if args.out:
        args.out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()

"""How much load the probe client itself can carry with honest timings (not a CI test).

Starts the scripted SSE server (specadapt.testing) and, for each concurrency, drives
staggered streams for a fixed time, then prints the client's CPU use and its timing
error against the server's log (p50/p99 of |probe - truth|, ms). "Sustainable" is the
highest concurrency whose p99 TTFT, ITL and E2E errors all stay under 1 ms.

    python benchmarks/probe_client_load.py --concurrency 1 16 64 128 256 --seconds 20
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specadapt.testing import scripted_server  # noqa: E402
from specadapt.testing.load import soak  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64, 128, 256])
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--itl-ms", type=float, default=100)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp, scripted_server(Path(tmp) / "server.log") as mp:
        for c in args.concurrency:
            r = asyncio.run(soak(mp.plan.base_url, c, args.seconds, args.itl_ms, args.tokens))
            e = r["timing_error_ms"]
            ok = all(e[m]["p99_abs_ms"] < 1.0 for m in ("ttft", "itl", "e2e")) and not r["requests_failed"]
            print(f"concurrency {c:4d}: {r['chunks_per_s']:7.0f} chunks/s, client CPU "
                  f"{r['client_cpu_pct_of_one_core']:5.1f}% of a core, p99 |error| ms: TTFT {e['ttft']['p99_abs_ms']:.2f}"
                  f" ITL {e['itl']['p99_abs_ms']:.2f} TPOT {e['tpot']['p99_abs_ms']:.2f} E2E {e['e2e']['p99_abs_ms']:.2f}"
                  f"  failed {r['requests_failed']}  load {r['load_avg'][0]:.1f}  {'OK' if ok else 'over 1 ms'}",
                  flush=True)
            rows.append({**r, "within_1ms": ok})
            time.sleep(1)
    meta = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": f"{os.cpu_count()}-core "
            f"{platform.machine()}", "itl_ms": args.itl_ms, "tokens": args.tokens, "seconds": args.seconds}
    if args.out:
        args.out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()

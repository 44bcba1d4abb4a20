"""Benchmark: do two servers started side by side stall each other's first token, and which
binding stops it?

Not a test. Starts two vLLM (CPU build) servers of the embedded model, both WITHOUT speculation
(an A/A: nothing but their placement differs), then sends requests as compare's pairs do at
concurrency 1 (off,on | on,off | off,on ...), one at a time, each on a new connection with a
plain ``http.client`` (no specadapt client in the measured path), and records each request's
time to first token and whether the request just before it went to the other server or to the
same one. Conditions (``--bind``, several allowed):

- ``shared``: both servers as vLLM starts them by default (OpenMP bound to every core, each);
- ``omp``: ``VLLM_CPU_OMP_THREADS_BIND`` disjoint (core share 0 for one, 1 for the other) only;
- ``taskset``: the whole process tree of each bound to its share (sched_setaffinity), OpenMP left
  at vLLM's default binding;
- ``both``: the two together (what specadapt does by default, adapters/placement.py).

Prints, per condition, each server's TTFT after the other server vs after itself (median, max)
and the count of first tokens that waited over ``--stall-ms`` more than the server's lower quartile.
``--gap`` leaves the machine idle that many seconds before each request: vLLM's worker keeps
polling its shared-memory queue (``sched_yield`` in a loop) for 1 s after its last message before
it sleeps (``SpinCondition.busy_loop_s`` in vllm/distributed/device_communicators/shm_broadcast.py,
vLLM 0.32.0), so a stall that comes from that poll is gone once the gap exceeds 1 s.

    .venv/bin/python benchmarks/side_by_side_stalls.py --bind shared,both --pairs 12
"""

from __future__ import annotations

import argparse
import datetime
import http.client
import json
import platform
import statistics
import time
from contextlib import ExitStack

from specadapt.adapters.hardware import STARTED_HERE, local_hardware
from specadapt.adapters.placement import cpu_list, split_cpus, usable_cpus
from specadapt.adapters.process import ManagedProcess
from specadapt.adapters.vllm import OMP_BIND, VLLMLaunch, launch_plan
from specadapt.models import resolve_model_dir

PROMPT = "Repeat this sentence three times: the quick brown fox jumps over the lazy dog."


def plans(bind: str, dtype: str) -> list:
    shares = split_cpus(usable_cpus(), 2)
    out = []
    for share in shares:
        plan = launch_plan(VLLMLaunch(model=str(resolve_model_dir(None)), dtype=dtype,
                                      extra_args=["--enforce-eager"]))
        env = dict(plan.env)
        if bind in ("omp", "both"):
            env[OMP_BIND] = cpu_list(share)
        out.append(plan.model_copy(update={"env": env, "cpus": share if bind in ("taskset", "both") else None}))
    return out


def ttft_ms(port: int, max_tokens: int) -> float:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    body = json.dumps({"model": str(resolve_model_dir(None)), "prompt": PROMPT, "max_tokens": max_tokens,
                       "temperature": 0, "stream": True})
    t0 = time.perf_counter()
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    first = None
    for line in resp:
        if first is None and line.startswith(b"data: {") and b'"text":""' not in line.replace(b" ", b""):
            first = time.perf_counter()
    conn.close()
    return ((first or time.perf_counter()) - t0) * 1e3


def run(bind: str, gaps: list[float], pairs: int, max_tokens: int, dtype: str, stall_ms: float) -> dict:
    """Per gap (seconds idle between two requests) the summary of ``pairs`` pairs, on one started pair."""
    out = {}
    with ExitStack() as stack:
        procs = [stack.enter_context(ManagedProcess(p)) for p in plans(bind, dtype)]
        for p in procs:
            p.wait_healthy(900)
        ports = [p.plan.port for p in procs]
        for side in (0, 1):  # warm-up, alone
            ttft_ms(ports[side], max_tokens)
        for gap in gaps:
            rows, last = [], None
            for i in range(pairs):
                for side in ((0, 1) if i % 2 == 0 else (1, 0)):
                    time.sleep(gap)
                    rows.append({"side": side, "after_other": last is not None and last != side,
                                 "ttft_ms": ttft_ms(ports[side], max_tokens)})
                    last = side
            out[f"gap {gap:g} s"] = summarise(rows, stall_ms)
    return out


def summarise(rows: list[dict], stall_ms: float) -> dict:
    summary = {}
    for side in (0, 1):
        mine = [r for r in rows if r["side"] == side]
        base = statistics.quantiles([r["ttft_ms"] for r in mine], n=4)[0]  # the lower quartile: unstalled
        summary[side] = {
            "p25_ms": round(base, 1),
            "after_other_ms": sorted(round(r["ttft_ms"]) for r in mine if r["after_other"]),
            "after_same_ms": sorted(round(r["ttft_ms"]) for r in mine if not r["after_other"]),
            "stalls": sum(r["ttft_ms"] > base + stall_ms for r in mine),
            "stalls_after_other": sum(r["ttft_ms"] > base + stall_ms for r in mine if r["after_other"]),
        }
    return summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bind", default="shared,both", help="comma-separated: shared, omp, taskset, both")
    ap.add_argument("--pairs", type=int, default=12)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--stall-ms", type=float, default=300.0)
    ap.add_argument("--gap", default="0", help="comma-separated seconds of idle before each request, e.g. 0,1.5")
    args = ap.parse_args()
    hw = local_hardware(STARTED_HERE)
    print(f"# {datetime.date.today()} {hw.cpu_model}, {hw.cores} CPUs, flags {' '.join(hw.cpu_flags)}; "
          f"python {platform.python_version()}; {args.pairs} pairs, max_tokens {args.max_tokens}, {args.dtype}")
    for bind in args.bind.split(","):
        gaps = [float(g) for g in args.gap.split(",")]
        for gap, summary in run(bind, gaps, args.pairs, args.max_tokens, args.dtype, args.stall_ms).items():
            print(bind, gap, json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()

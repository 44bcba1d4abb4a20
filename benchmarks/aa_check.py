"""Benchmark: the A/A check of compare's speed intervals on two identical spec-off servers.

Not a test. Starts two identical servers without speculation (`--backend vllm`, the
default, with the embedded model; `--backend reference` is the cheaper option), runs ONE
long interleaved A/B through the library (`--repeat 20` at concurrency 1 and 8 by
default), then cuts the repeats into disjoint subsets of 2, 3 and 5 consecutive repeats
(what a user with `--repeat 2`, 3 or 5 would get), analyses each subset as compare does
and counts how often an interval misses 1.0, the true ratio of an A/A: about 5% is right.
The same subsets through the percentile bootstrap over request pairs that compare used
before, for contrast. `--same-server` starts one server and gives it as both sides: the
exact A/A, in which nothing but chance separates the sides (two servers can differ while
they run, e.g. in the cores they get). The long run's report is kept (`--out`), and
`--from-report FILE` evaluates a saved one again without servers.

    .venv/bin/python benchmarks/aa_check.py --backend reference --repeat 20 --concurrency 1,8 --max-tokens 32
"""

from __future__ import annotations

import argparse
import datetime
import math
import platform
from pathlib import Path

import numpy as np

from specadapt.analysis.latency import tpot_ns
from specadapt.analysis.pairs import pair_records
from specadapt.analysis.speed import _block_rate_log, analyse, block_units
from specadapt.analysis.stats import MIN_UNITS
from specadapt.orchestration.compare import run_compare
from specadapt.records import (
    CompareReport,
    CompareSettings,
    RatioCI,
    RequestSettings,
    read_compare_report,
    write_report,
)
from specadapt.workloads.prompts import load_prompts

METRICS = ("throughput", "tpot", "e2e")


def subsets(repeats: int, size: int) -> list[list[int]]:
    """Disjoint runs of ``size`` consecutive repeats (a remainder shorter than ``size`` is dropped)."""
    return [list(range(i, i + size)) for i in range(0, repeats - size + 1, size)]


def sub_report(report: CompareReport, repeats: list[int]) -> CompareReport:
    """The report a user running only these repeats would have had, analysed as compare does."""
    keep = set(repeats)
    settings = report.settings.model_copy(update={"repeat": len(repeats)})
    sub = report.model_copy(update={"settings": settings, "requests": [r for r in report.requests
                                                                       if r.repeat in keep and not r.warmup]})
    analyse(sub)
    return sub


def missed(r: RatioCI, truth: float = 1.0) -> bool:
    return r.low is not None and not (r.low <= truth <= r.high)


def old_bootstrap(pairs, metric: str, n_boot: int = 2000, seed: int = 0) -> tuple[float, float] | None:
    """The interval compare gave before: ratio of means over request pairs (tokens/s: sum of
    tokens over sum of E2E per side), percentile bootstrap over the pairs."""
    if metric == "tpot":
        cols = np.array([(tpot_ns(a), tpot_ns(b)) for a, b in pairs if tpot_ns(a) and tpot_ns(b)], dtype=float)
    elif metric == "e2e":
        cols = np.array([(a.e2e_ns, b.e2e_ns) for a, b in pairs], dtype=float)
    else:
        cols = np.array([(a.output_tokens, a.e2e_ns, b.output_tokens, b.e2e_ns) for a, b in pairs], dtype=float)
    if len(cols) < 2:
        return None
    idx = np.random.default_rng(seed).integers(0, len(cols), size=(n_boot, len(cols)))
    s = cols[idx].sum(axis=1)  # [n_boot, columns]
    stat = (s[:, 2] / s[:, 3]) / (s[:, 0] / s[:, 1]) if metric == "throughput" else s[:, 0] / s[:, 1]
    low, high = np.quantile(stat, [0.025, 0.975])
    return float(low), float(high)


def evaluate(report: CompareReport, size: int) -> list[dict]:
    """One row per (level, scope): intervals given, missed 1.0, too few; new method and old."""
    rows: dict[tuple, dict] = {}
    for i, reps in enumerate(subsets(report.settings.repeat, size)):
        sub = sub_report(report, reps)
        for lv in sub.levels:
            pairs = pair_records(sub.requests, lv.concurrency)
            scopes = [("level", lv.speed, pairs)] + [
                ("per prompt", p.ratios, [(a, b) for a, b in pairs if a.prompt_id == p.prompt_id])
                for p in lv.by_prompt]
            for scope, ratios, scope_pairs in scopes:
                row = rows.setdefault((lv.concurrency, scope), dict(level=lv.concurrency, scope=scope, subsets=set(),
                                                                  given=0, missed=0, too_few=0, units=set(),
                                                                  old_given=0, old_missed=0))
                row["subsets"].add(i)
                for m in METRICS:
                    r: RatioCI = getattr(ratios, m)
                    row["units"].add(f"{r.n} {r.unit}")
                    row["too_few"] += r.too_few
                    row["given"] += r.low is not None
                    row["missed"] += missed(r)
                    old = old_bootstrap(scope_pairs, m)
                    row["old_given"] += old is not None
                    row["old_missed"] += old is not None and not (old[0] <= 1.0 <= old[1])
    return list(rows.values())


def table(report: CompareReport, sizes: list[int]) -> list[str]:
    out = ["| repeats per subset | concurrency | scope | subsets | units per interval | t intervals given "
           "(too few) | t missed 1.0 | old pair bootstrap missed 1.0 |",
           "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for size in sizes:
        for row in evaluate(report, size):
            rate = lambda k, n: f"{row[k]} / {row[n]}" + (f" ({row[k] / row[n]:.0%})" if row[n] else "")  # noqa: E731
            out.append(f"| {size} | {row['level']} | {row['scope']} | {len(row['subsets'])} | "
                       f"{', '.join(sorted(row['units']))} | {row['given']} ({row['too_few']}) | "
                       f"{rate('missed', 'given')} | {rate('old_missed', 'old_given')} |")
    return out


def run(args) -> CompareReport:
    from specadapt.models import resolve_model_dir

    model = str(resolve_model_dir(None))
    prompts = load_prompts(None)[: args.prompts]
    settings = CompareSettings(concurrency=[int(c) for c in args.concurrency.split(",")], repeat=args.repeat,
                               warmup=2, request=RequestSettings(max_tokens=args.max_tokens), triage=False,
                               dtype="float32")
    if args.backend == "reference":
        from specadapt.adapters.reference import ReferenceBackend, ReferenceLaunch

        backend, opts = ReferenceBackend(), [ReferenceLaunch(model=model, dtype="float32") for _ in range(2)]
    else:
        from specadapt.adapters.vllm import VLLMBackend, VLLMLaunch

        backend = VLLMBackend()
        opts = [VLLMLaunch(model=model, dtype="float32", max_model_len=2048) for _ in range(2)]
    if args.same_server:  # the exact A/A: one server is both sides
        with backend.launched_many(opts[:1], startup_timeout_s=1800) as (server,):
            return run_compare(server, server, prompts, settings)
    with backend.launched_many(opts, startup_timeout_s=1800) as (off, on):
        return run_compare(off, on, prompts, settings)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", choices=["vllm", "reference"], default="vllm")
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--concurrency", default="1,8")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--prompts", type=int, default=4, help="The first N built-in prompts.")
    ap.add_argument("--sizes", default="2,3,5", help="Repeats per subset.")
    ap.add_argument("--out", type=Path, default=Path("aa-out"))
    ap.add_argument("--same-server", action="store_true", help="One server as both sides (the exact A/A).")
    ap.add_argument("--from-report", type=Path, help="Evaluate a saved long run instead of running one.")
    args = ap.parse_args()
    if args.from_report:
        report = read_compare_report(args.from_report)
    else:
        start = datetime.datetime.now(datetime.timezone.utc)
        report = run(args)
        args.out.mkdir(parents=True, exist_ok=True)
        write_report(report, args.out / f"aa-{args.backend}{'-same' if args.same_server else ''}.json")
        minutes = (datetime.datetime.now(datetime.timezone.utc) - start).total_seconds() / 60
        print(f"{report.created_at}: {args.backend}{' (one server as both sides)' if args.same_server else ''}, "
              f"{len(report.identity)} prompts x {report.settings.repeat} "
              f"repeats at concurrency {report.settings.concurrency}, --max-tokens "
              f"{report.settings.request.max_tokens}; {platform.machine()}, {minutes:.0f} min")
    failed = sum(1 for r in report.requests if not r.ok)
    print(f"requests: {len(report.requests)} ({failed} failed); identity: {report.counts}; "
          f"intervals need >= {MIN_UNITS} units")
    print("\n".join(table(report, [int(s) for s in args.sizes.split(",")])))
    for level in report.settings.concurrency:
        if level > 1:
            units = block_units(pair_records(report.requests, level))
            print(f"tokens/s on/off per block pair at concurrency {level}, repeats in run order: "
                  + " ".join(f"{math.exp(x):.2f}" if (x := _block_rate_log(report.requests, level, r)) is not None
                             else "-" for r, _ in units))
    print("\nA 95% interval misses 1.0 in about 5% of A/A subsets. Each cell counts tokens/s, TPOT and E2E "
          "intervals, which move together: about a third as many independent outcomes.")

if __name__ == "__main__":
    main()

"""False alarms and power of `equiv --features`' distribution cells over repeated runs (not a test).

Starts three `specadapt reference serve` servers on loopback, on the embedded model (float32,
CPU, one torch thread each): spec off, a healthy n-gram k=4 server, and an n-gram k=4 server
with the planted fault ``draft-filters-skipped`` (min_p, top_k and top_p applied at the first
position of a verify pass only; drafted positions and the bonus token after them use the
tempered, untruncated distribution). Then, R times, run r with seed ``base + 1000 r``, it runs
the distribution cells through the library (``orchestration.features.check_features``, as
``specadapt equiv --features distribution --off URL --on URL --backend reference --reference
DIR`` does): once with the healthy server as the spec-on side (a failed cell is a false alarm;
expected rate: alpha) and once with the faulty one (a failed cell is a detection: the power at
that budget). Every sampled token is scored against the target recomputed in float64
(``--reference``, the embedded model's directory).

The temperature-only cells (temperature-0.7, temperature-1.3) have nothing to filter, so the
fault does not touch them: their detection rate should sit at the false-alarm rate. The other
cells (top-p-0.9, top-k-20, min-p-0.05, combined) should catch it.

Printed: the machine, the date, the command, one line per run and cell, then a table per
cell: runs, false alarms / R and detections / R with 95% Clopper-Pearson intervals, the
median tokens scored per run, the median seconds per run (healthy / faulty), the median
smallest p-value of the cell's tests and the median count of sampled tokens that the setting
gives probability zero (each healthy / faulty; one such token fails the cell), and the faulty
server's acceptance rate.

    .venv/bin/python benchmarks/feature_cells.py [--runs 20] [--samples 4] [--max-tokens 24]
    .venv/bin/python benchmarks/feature_cells.py --runs 2 --cells top-k-20,temperature-0.7
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import shlex
import signal
import statistics
import sys
import time
from dataclasses import dataclass, field

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from scipy.stats import binomtest  # noqa: E402

from specadapt.adapters.hardware import local_hardware  # noqa: E402
from specadapt.adapters.reference import ReferenceBackend, ReferenceLaunch  # noqa: E402
from specadapt.analysis.features import GROUPS, parse_features  # noqa: E402
from specadapt.configs.spec import SpecConfig  # noqa: E402
from specadapt.models import resolve_model_dir  # noqa: E402
from specadapt.orchestration.features import check_features  # noqa: E402
from specadapt.orchestration.sampling import ReferenceDistribution  # noqa: E402
from specadapt.orchestration.servers import ServerOptions, ab_sides, plan_servers  # noqa: E402
from specadapt.records.features import CellResult, FeatureSettings  # noqa: E402

NGRAM_K4 = SpecConfig(method="ngram", k=4, ngram_min=1, ngram_max=4)
FAULT = "draft-filters-skipped"
TOP_LOGPROBS = 20  # equiv's default K
CONCURRENCY = 4  # equiv --features' default requests in flight
SIDES = ("healthy", "faulty")


@dataclass
class Tally:
    """One cell's results against one spec-on server over the runs."""

    verdicts: list[str] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    min_p: list[float | None] = field(default_factory=list)
    acceptance: list[float | None] = field(default_factory=list)
    outside: list[int | None] = field(default_factory=list)  # sampled tokens of probability zero under the setting

    def add(self, cell: CellResult) -> None:
        self.verdicts.append(cell.verdict)
        self.tokens.append(cell.stats.n_tokens if cell.stats else 0)
        self.seconds.append(cell.seconds or 0.0)
        self.min_p.append(min(t.p_value for t in cell.stats.tests) if cell.stats and cell.stats.tests else None)
        self.outside.append(cell.stats.zero_probability_tokens if cell.stats else None)
        a = cell.activity.acceptance if cell.activity else None
        self.acceptance.append(a.acceptance_rate if a is not None else None)

    @property
    def failed(self) -> int:
        return self.verdicts.count("fail")

    @property
    def other(self) -> dict[str, int]:
        """Verdicts that are neither pass nor fail (inactive, error, ...), with their counts."""
        out: dict[str, int] = {}
        for v in self.verdicts:
            if v not in ("pass", "fail"):
                out[v] = out.get(v, 0) + 1
        return out


def describe_cell(cell: CellResult) -> str:
    s = cell.stats
    tests = " ".join(f"{t.name}={t.p_value:.2g}" for t in s.tests) if s else ""
    act = cell.activity.text if cell.activity else "?"
    line = (f"{cell.verdict}, {s.n_tokens if s else 0} tokens, {cell.seconds or 0:.0f} s, {act}; {tests}; "
            f"{s.zero_probability_tokens if s else '?'} outside the support")
    if cell.verdict not in ("pass", "fail"):
        line += f" ({cell.reason})"
    return line


def one_run(side: str, off_url: str, on_url: str, settings: FeatureSettings, reference: ReferenceDistribution):
    plan = plan_servers(ServerOptions(backend="reference"), ab_sides(off_url, on_url))
    report = check_features(plan, settings, reference)
    if report.partial:  # check_features keeps Ctrl-C's partial report; the benchmark stops
        raise KeyboardInterrupt
    return report.cells


def interval(k: int, n: int) -> str:
    ci = binomtest(k, n).proportion_ci(0.95, method="exact")
    return f"{k} / {n} [{ci.low:.2f}, {ci.high:.2f}]"


def med(values: list[float | None], fmt: str) -> str:
    known = [v for v in values if v is not None]
    return format(statistics.median(known), fmt) if known else "-"


def table(cells: list[str], tallies: dict[tuple[str, str], Tally]) -> str:
    out = ["| cell | runs | false alarms / R [95% CI] | detections / R [95% CI] | tokens per run | "
           "s per run (healthy / faulty) | median min p (healthy / faulty) | median tokens outside the support "
           "(healthy / faulty) | faulty acceptance |",
           "|---|---|---|---|---|---|---|---|---|"]
    notes = []
    for name in cells:
        h, f = tallies[(name, "healthy")], tallies[(name, "faulty")]
        runs = len(h.verdicts)
        out.append(f"| {name} | {runs} | {interval(h.failed, runs)} | {interval(f.failed, len(f.verdicts))} | "
                   f"{med(h.tokens + f.tokens, '.0f')} | {med(h.seconds, '.0f')} / {med(f.seconds, '.0f')} | "
                   f"{med(h.min_p, '.2g')} / {med(f.min_p, '.2g')} | "
                   f"{med(h.outside, '.0f')} / {med(f.outside, '.0f')} | {med(f.acceptance, '.0%')} |")
        for side, t in (("healthy", h), ("faulty", f)):
            if t.other:
                notes.append(f"{name} ({side}): " + ", ".join(f"{v} {n}" for v, n in t.other.items())
                             + " (neither a pass nor a failure)")
    return "\n".join(out + notes)


def _stop(signum, frame):  # SIGTERM ends the run as Ctrl-C does, so the servers are stopped
    raise KeyboardInterrupt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=20, help="R: repeated runs, each with its own seed.")
    ap.add_argument("--samples", type=int, default=4, help="Completions per prompt and cell (--samples).")
    ap.add_argument("--max-tokens", type=int, default=24, help="Tokens per completion (--max-tokens).")
    ap.add_argument("--alpha", type=float, default=0.01, help="Family-wise false-alarm rate per cell.")
    ap.add_argument("--seed", type=int, default=0, help="Base seed: run r uses base + 1000 r.")
    ap.add_argument("--cells", default="distribution", help="Cells to run (names or the group 'distribution').")
    args = ap.parse_args()
    cells = parse_features(args.cells)
    wrong = [c for c in cells if c not in GROUPS["distribution"]]
    if wrong:
        raise SystemExit(f"not distribution cells: {', '.join(wrong)}")
    signal.signal(signal.SIGTERM, _stop)

    hw = local_hardware("benchmark")
    print(f"date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC")
    print(f"machine: {platform.machine()}, {hw.cpu_model or 'CPU model unknown'}, {hw.cores or os.cpu_count()} "
          f"CPUs; matrix flags: {' '.join(hw.cpu_flags) or 'none'}"
          + (f" (absent: {' '.join(hw.cpu_flags_missing)})" if hw.cpu_flags_missing else "")
          + (f"; GPUs: {', '.join(g.name for g in hw.gpus)}" if hw.gpus else "; no GPU"))
    print(f"command: {shlex.join(['benchmarks/feature_cells.py', *sys.argv[1:]])}")
    print(f"R = {args.runs}, alpha = {args.alpha}, {args.samples} samples x {args.max_tokens} tokens per prompt "
          f"(3 prompts), K = {TOP_LOGPROBS}, concurrency {CONCURRENCY}, source: float64 reference; spec on: "
          f"n-gram k=4 (window 1..4), healthy and with fault {FAULT}", flush=True)

    model = str(resolve_model_dir(None))
    reference = ReferenceDistribution(model)
    launches = [ReferenceLaunch(model=model), ReferenceLaunch(model=model, spec_config=NGRAM_K4),
                ReferenceLaunch(model=model, spec_config=NGRAM_K4, fault=FAULT)]
    tallies = {(c, s): Tally() for c in cells for s in SIDES}
    t_start = time.monotonic()
    try:
        with ReferenceBackend().launched_many(launches) as (off, healthy, faulty):
            on_urls = {"healthy": healthy.base_url, "faulty": faulty.base_url}
            for r in range(args.runs):
                seed = args.seed + 1000 * r
                settings = FeatureSettings(
                    features=cells, max_tokens=args.max_tokens, samples=args.samples, sample_tokens=args.max_tokens,
                    alpha=args.alpha, top_logprobs=TOP_LOGPROBS, concurrency=CONCURRENCY, seed=seed,
                    request_timeout_s=600, source="reference", reference=model)
                for side in SIDES:
                    for cell in one_run(side, off.base_url, on_urls[side], settings, reference):
                        tallies[(cell.name, side)].add(cell)
                        print(f"  run {r + 1}/{args.runs} seed {seed} {side:7s} {cell.name}: {describe_cell(cell)}",
                              flush=True)
    except KeyboardInterrupt:
        print("# interrupted: the runs finished so far", flush=True)
    done = min(len(t.verdicts) for t in tallies.values())
    if not done:
        raise SystemExit("no run finished")
    print(f"# {done} runs in {(time.monotonic() - t_start) / 60:.1f} min; a failed cell on the healthy server is a "
          f"false alarm (expected rate: alpha = {args.alpha}), on the faulty one a detection")
    print(table(cells, {k: Tally(*(getattr(t, f)[:done] for f in ("verdicts", "tokens", "seconds", "min_p",
                                                                    "acceptance", "outside")))
                        for k, t in tallies.items()}))


if __name__ == "__main__":
    main()

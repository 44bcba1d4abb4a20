"""False alarms and detections of `equiv --sampling` over repeated runs (not a test).

Starts `specadapt reference serve` servers on the embedded model (float32, CPU): spec off
(the source of p), healthy n-gram k=4, and the sampler faults the integration tests plant:
residual-p (n-gram k=4), bonus-previous (n-gram k=2) and draft-temperature=0.5 (the target
as its own draft, k=2). Each configuration runs R times at the token budget of
tests/integration/test_sampling.py, run r with base seed 1000 r (its own samples and its
own PIT randomisation). A healthy run that fails is a false alarm (expected rate: alpha);
a faulty run that fails is a detection (the power at that budget). Printed: the counts
over R with a 95% Clopper-Pearson interval, the median p-value of each test, seconds per
run, and the binned-PIT TV that the budget catches with 80% power.

    .venv/bin/python benchmarks/sampling_false_alarm.py [--runs 20] [--only healthy,residual-p]
    .venv/bin/python benchmarks/sampling_false_alarm.py --vllm-off URL --vllm-on URL   # also vLLM

With --vllm-off/--vllm-on (a vLLM spec-off server and its spec-on twin), the same is done
for vLLM: the spec-off server sampled against itself (healthy) and the spec-on server.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from scipy.stats import binomtest  # noqa: E402

from specadapt.adapters.reference import ReferenceBackend, ReferenceLaunch  # noqa: E402
from specadapt.adapters.vllm import VLLMBackend  # noqa: E402
from specadapt.analysis.sampling_stats import sampling_verdict  # noqa: E402
from specadapt.configs.spec import SpecConfig  # noqa: E402
from specadapt.models import resolve_model_dir  # noqa: E402
from specadapt.orchestration import sampling  # noqa: E402
from specadapt.workloads.prompts import load_prompts  # noqa: E402

# The prompts and budgets of tests/integration/test_sampling.py: prompts on which n-gram
# drafts are proposed at most positions, so that the sampler is exercised often.
ABC = {"id": "abc", "category": "repetitive", "prompt": "a b c d e f g a b c d e f g a b c d e f g a b c d e f g a b"}
COUNT = {"id": "count", "category": "repetitive",
         "prompt": "1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2,"}
REPEAT_LINE = {"id": "repeat-line", "category": "grounded", "messages": [
    {"role": "user", "content": "Repeat this line five times: The quick brown fox jumps over the lazy dog."}]}
COPY_CODE = {"id": "copy-code", "category": "grounded", "messages": [{"role": "user", "content":
             "Copy the following code exactly, adding a docstring to each function:\n\n"
             "def add(x, y):\n    return x + y\n\ndef sub(x, y):\n    return x - y"}]}


@dataclass(frozen=True)
class Config:
    name: str
    server: str  # key of the started (or given) spec-on server
    prompts: tuple[dict, ...]
    samples: int
    max_tokens: int
    failures_are: str  # what a failed run is: "false alarms" (healthy) or "detections" (a planted fault)


REFERENCE = (
    Config("healthy n-gram k=4", "ngram", (ABC, COUNT), 8, 32, "false alarms"),
    Config("residual-p (n-gram k=4)", "residual-p", (ABC,), 16, 32, "detections"),
    Config("bonus-previous (n-gram k=2)", "bonus-previous", (ABC, COUNT), 6, 32, "detections"),
    Config("draft-temperature=0.5 (target as draft, k=2)", "draft-temperature", (ABC, COUNT), 4, 32, "detections"),
)
VLLM = (
    Config("vLLM spec off against itself", "vllm-off", (REPEAT_LINE, COPY_CODE), 8, 32, "false alarms"),
    Config("vLLM n-gram k=4 against spec off", "vllm-on", (REPEAT_LINE, COPY_CODE), 16, 32, "failures"),
)
CONCURRENCY = 16
TOP_K = 20
ALPHA = 0.01


def reference_launches(model: str) -> dict[str, ReferenceLaunch]:
    ngram4 = SpecConfig(method="ngram", k=4, ngram_min=1, ngram_max=4)
    ngram2 = SpecConfig(method="ngram", k=2, ngram_min=1, ngram_max=4)
    self_draft = SpecConfig(method="draft_model", k=2, draft=model)
    return {"off": ReferenceLaunch(model=model),
            "ngram": ReferenceLaunch(model=model, spec_config=ngram4),
            "residual-p": ReferenceLaunch(model=model, spec_config=ngram4, fault="residual-p"),
            "bonus-previous": ReferenceLaunch(model=model, spec_config=ngram2, fault="bonus-previous"),
            "draft-temperature": ReferenceLaunch(model=model, spec_config=self_draft,
                                                 fault="draft-temperature=0.5")}


def prompt_file(rows: tuple[dict, ...], folder: Path) -> Path:
    path = folder / ("-".join(r["id"] for r in rows) + ".jsonl")
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def one_run(on, source, cfg: Config, folder: Path, seed: int):
    prompts = load_prompts(prompt_file(cfg.prompts, folder))
    ids = asyncio.run(sampling.tokenize_on_server(source, prompts, 120))
    inputs = sampling.inputs_for(prompts, ids, cfg.max_tokens)
    samples = asyncio.run(sampling.draw_samples(on, inputs, cfg.samples, seed, CONCURRENCY, 600))
    draws = asyncio.run(sampling.score_on_server(source, samples, TOP_K, CONCURRENCY, 600))
    return sampling_verdict([d for ds in draws for d in ds], alpha=ALPHA, seed=seed)


def run_config(cfg: Config, on, source, runs: int, folder: Path) -> dict:
    failed, pvals, secs, n, dtv = 0, {}, [], 0, None
    for r in range(runs):
        t0 = time.perf_counter()
        stats = one_run(on, source, cfg, folder, seed=1000 * r)
        secs.append(time.perf_counter() - t0)
        failed += not stats.passed
        n, dtv = stats.n_tokens, stats.detectable_tv
        for t in stats.tests:
            pvals.setdefault(t.name, []).append(t.p_value)
        print(f"  {cfg.name}: run {r + 1}/{runs}: {stats.status} "
              + " ".join(f"{t.name}={t.p_value:.2g}" for t in stats.tests), flush=True)
    ci = binomtest(failed, runs).proportion_ci(0.95, method="exact")
    return {"config": cfg.name, "what": cfg.failures_are, "runs": runs, "failed": failed, "ci": (ci.low, ci.high),
            "tokens": n, "detectable_tv": dtv, "seconds": statistics.median(secs),
            "median_p": {k: statistics.median(v) for k, v in pvals.items()}}


def table(rows: list[dict]) -> str:
    out = ["| configuration | tokens per run | runs failed / R [95% CI] | what that is | median p (PIT chi2 / KS / rank) "
           "| TV caught at 80% power | s per run |",
           "|---|---|---|---|---|---|---|"]
    for r in rows:
        p = r["median_p"]
        ps = " / ".join(f"{p.get(k, float('nan')):.2g}" for k in ("pit-chi-square", "pit-ks", "rank-chi-square"))
        out.append(f"| {r['config']} | {r['tokens']} | {r['failed']} / {r['runs']} [{r['ci'][0]:.2f}, "
                   f"{r['ci'][1]:.2f}] | {r['what']} | {ps} | {r['detectable_tv']:.3f} | {r['seconds']:.0f} |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--only", default="", help="Comma-separated server keys (ngram, residual-p, bonus-previous, "
                                               "draft-temperature, vllm-off, vllm-on).")
    ap.add_argument("--vllm-off", help="URL of a running vLLM spec-off server.")
    ap.add_argument("--vllm-on", help="URL of its running spec-on twin.")
    ap.add_argument("--no-reference", action="store_true", help="Only the vLLM configurations.")
    args = ap.parse_args()
    only = {s for s in args.only.split(",") if s}
    print(f"{datetime.date.today()} {platform.machine()} {os.cpu_count()} CPUs; R = {args.runs}, alpha = {ALPHA}, "
          f"K = {TOP_K}, concurrency {CONCURRENCY}", flush=True)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        if not args.no_reference:
            model = str(resolve_model_dir(None))
            launches = reference_launches(model)
            configs = [c for c in REFERENCE if not only or c.server in only]
            keys = ["off", *dict.fromkeys(c.server for c in configs)]
            with ReferenceBackend().launched_many([launches[k] for k in keys]) as servers:
                by_key = dict(zip(keys, servers))
                for cfg in configs:
                    rows.append(run_config(cfg, by_key[cfg.server], by_key["off"], args.runs, folder))
        if args.vllm_off and args.vllm_on:
            backend = VLLMBackend()
            off, on = backend.connect(args.vllm_off), backend.connect(args.vllm_on)
            for cfg in (c for c in VLLM if not only or c.server in only):
                rows.append(run_config(cfg, on if cfg.server == "vllm-on" else off, off, args.runs, folder))
    print(table(rows))


if __name__ == "__main__":
    main()

"""Benchmark: the embedded model on the vLLM CPU build, ngram k=4 vs spec off, bf16 and fp32.

Not a test. For each dtype it starts a spec-off and an ngram k=4 server side by side and
runs the built-in prompt set through `specadapt compare`'s interleaved A/B runner (so load
changes on the machine hit both sides alike), then prints a Markdown table of
per-category speedup (output tokens/s ratio and TPOT ratio, on vs off, with 95% bootstrap
intervals) and the acceptance figures, and keeps the JSON reports.

    .venv/bin/python benchmarks/spec_vs_off.py [--out bench-out] [--max-tokens 160] [--repeat 3]
"""

from __future__ import annotations

import argparse
import datetime
import platform
from pathlib import Path

from specadapt.adapters.vllm import VLLMBackend, VLLMLaunch
from specadapt.analysis.pairs import pair_records
from specadapt.analysis.speed import speed_ratios
from specadapt.configs.spec import SpecConfig
from specadapt.models import resolve_model_dir
from specadapt.orchestration.compare import run_compare
from specadapt.records import CompareSettings, RequestSettings, write_report
from specadapt.report.compare_render import ci
from specadapt.workloads.prompts import load_prompts

NGRAM_K4 = SpecConfig(method="ngram", k=4, ngram_min=2, ngram_max=4)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("bench-out"))
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dtypes", default="bfloat16,float32")
    args = ap.parse_args()
    model = str(resolve_model_dir(None))
    prompts = load_prompts(None)
    args.out.mkdir(parents=True, exist_ok=True)
    lines = [f"Measured {datetime.date.today()} on {platform.machine()} (2 cores, no GPU), "
             f"`python benchmarks/spec_vs_off.py --max-tokens {args.max_tokens} --repeat {args.repeat}`; "
             "vLLM 0.32.0 CPU build, embedded SmolLM2-135M-Instruct, greedy, concurrency 1, built-in prompts, "
             "requests interleaved on/off.", "",
             "| dtype | category | tok/s off | tok/s ngram k=4 | tokens/s ratio [95% CI] | TPOT ratio [95% CI] |",
             "| --- | --- | --- | --- | --- | --- |"]
    notes = []
    for dtype in args.dtypes.split(","):
        opts = [VLLMLaunch(model=model, spec_config=spec, dtype=dtype) for spec in (None, NGRAM_K4)]
        settings = CompareSettings(repeat=args.repeat, warmup=2, request=RequestSettings(max_tokens=args.max_tokens),
                                   dtype=dtype, triage=True)
        with VLLMBackend().launched_many(opts, startup_timeout_s=1800) as (off, on):
            report = run_compare(off, on, prompts, settings)
        write_report(report, args.out / f"{dtype}.json")
        pairs = pair_records(report.requests, 1)
        for cat in [*dict.fromkeys(p.category for p in prompts), "all"]:
            sel = [(a, b) for a, b in pairs if cat in ("all", a.category)]
            r = speed_ratios(sel)
            rate = lambda recs: sum(x.output_tokens for x in recs) / (sum(x.e2e_ns for x in recs) / 1e9)  # noqa: E731
            lines.append(f"| {dtype} | {cat} | {rate([a for a, _ in sel]):.1f} | {rate([b for _, b in sel]):.1f} | "
                         f"{ci(r.throughput)} | {ci(r.tpot)} |")
        lv = report.levels[0]
        a = lv.acceptance
        c = report.counts
        notes.append(f"- {dtype}: acceptance rate {a.acceptance_rate:.1%}, mean acceptance length "
                     f"{a.mean_acceptance_length:.2f}, per position "
                     + " / ".join(f"{x:.0%}" for x in a.per_position_rate)
                     + f"; identity: {c.get('identical', 0)} identical, {c.get('near-tie', 0)} near-tie, "
                       f"{c.get('suspect', 0)} suspect, {c.get('unknown', 0)} unknown")
        notes.append("  - per prompt (tokens/s ratio): " + ", ".join(
            f"{p.prompt_id} {p.ratios.throughput.point:.2f}x" for p in lv.by_prompt))
        if lv.theory:
            t = lv.theory
            notes.append(f"  - theory: {t.tokens_per_pass:.2f} tokens per pass, predicted {t.predicted_speedup:.2f}x "
                         f"at c=0, measured TPOT ratio {t.measured_speedup:.2f}x, implied c {t.implied_draft_cost:.3f}")
    text = "\n".join(lines + [""] + notes)
    print(text)
    (args.out / "table.md").write_text(text + "\n")


if __name__ == "__main__":
    main()

"""Benchmark: the embedded model on the vLLM CPU build, ngram k=4 vs spec off, bf16 and fp32.

Not a test. For each dtype it starts a spec-off server, probes the built-in prompt set,
stops it, then does the same with ngram k=4 (servers one after the other: a small
machine). Prints a Markdown table of per-category speedup (output tokens/s ratio and TPOT
ratio, on vs off, measured side by side in this run) and the acceptance figures, and
keeps the JSON reports.

    .venv/bin/python benchmarks/spec_vs_off.py [--out bench-out] [--max-tokens 160] [--repeat 1]
"""

from __future__ import annotations

import argparse
import datetime
import platform
from pathlib import Path

from specadapt.adapters.vllm import VLLMLaunch, launched_server
from specadapt.models import resolve_model_dir
from specadapt.probes.client import RequestSettings
from specadapt.probes.prompts import load_prompts
from specadapt.probes.runner import run_probe
from specadapt.report.model import write_report
from specadapt.report.side_by_side import identical_texts, side_by_side

NGRAM_K4 = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4}


def probe_one(model: str, dtype: str, spec, settings: RequestSettings, repeat: int, out: Path, name: str):
    opts = VLLMLaunch(model=model, spec_config=spec, dtype=dtype)
    with launched_server(opts, startup_timeout_s=1200) as server:
        report = run_probe(server, load_prompts(None), settings, concurrency=1, repeat=repeat, warmup=2)
    write_report(report, out / f"{name}.json")
    return report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("bench-out"))
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--dtypes", default="bfloat16,float32")
    args = ap.parse_args()
    model = str(resolve_model_dir(None))
    settings = RequestSettings(max_tokens=args.max_tokens)
    args.out.mkdir(parents=True, exist_ok=True)
    lines = [f"Measured {datetime.date.today()} on {platform.machine()} ({platform.processor() or 'cpu'}), "
             f"`python benchmarks/spec_vs_off.py --max-tokens {args.max_tokens} --repeat {args.repeat}`; "
             "vLLM 0.32.0 CPU build, embedded SmolLM2-135M-Instruct, greedy, concurrency 1, built-in prompts.", "",
             "| dtype | category | tok/s off | tok/s ngram k=4 | speedup (tok/s) | TPOT off ms | TPOT on ms | TPOT ratio |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    notes = []
    for dtype in args.dtypes.split(","):
        off = probe_one(model, dtype, None, settings, args.repeat, args.out, f"{dtype}-off")
        on = probe_one(model, dtype, NGRAM_K4, settings, args.repeat, args.out, f"{dtype}-ngram4")
        for r in side_by_side(off, on):
            lines.append(f"| {dtype} | {r.category} | {r.off_tokens_per_s:.1f} | {r.on_tokens_per_s:.1f} | "
                         f"{r.tokens_per_s_ratio:.2f}x | {r.off_tpot_ms:.1f} | {r.on_tpot_ms:.1f} | {r.tpot_ratio:.2f}x |")
        a = on.acceptance
        same = identical_texts(off, on)
        diff = sorted(p for p, ok in same.items() if not ok)
        notes.append(f"- {dtype}: acceptance rate {a.acceptance_rate:.1%}, mean acceptance length "
                     f"{a.mean_acceptance_length:.2f}, per position "
                     + " / ".join(f"{x:.0%}" for x in a.per_position_rate)
                     + f"; identical text {len(same) - len(diff)}/{len(same)}"
                     + (f" (different: {', '.join(diff)})" if diff else ""))
        per_prompt = {}
        for rec_off in off.requests:
            rec_on = next((q for q in on.requests if q.prompt_id == rec_off.prompt_id and q.repeat == rec_off.repeat), None)
            if rec_on and rec_off.ok and rec_on.ok and rec_off.e2e_ns and rec_on.e2e_ns:
                per_prompt.setdefault(rec_off.prompt_id, []).append(
                    (rec_on.output_tokens / rec_on.e2e_ns) / (rec_off.output_tokens / rec_off.e2e_ns))
        notes.append(f"  - per prompt (tokens/s ratio): " + ", ".join(
            f"{k} {sum(v) / len(v):.2f}x" for k, v in per_prompt.items()))
    text = "\n".join(lines + [""] + notes)
    print(text)
    (args.out / "table.md").write_text(text + "\n")


if __name__ == "__main__":
    main()

"""Benchmark of the native reference engine against target-only greedy and transformers'
assisted generation, on the embedded SmolLM2-135M-Instruct (not a test; run by hand).

    python benchmarks/reference_bench.py --threads 1 --max-tokens 48

Same process, same torch threads, same prompts, greedy, float32 on CPU. For every prompt
it runs: target alone (ours), ours with n-gram lookup, ours with a draft model,
transformers' plain greedy, transformers with prompt_lookup_num_tokens=, and transformers
with assistant_model=. It asserts that every output is identical to ours-target-alone,
and prints a markdown table (tokens/s, speedup, acceptance, measured / theory).
"""

from __future__ import annotations

import os
import platform
import sys
import time
from datetime import datetime, timezone

import click

os.environ.setdefault("HF_HUB_OFFLINE", "1")

PROMPTS = {
    "copy-code (input-grounded)": (
        "Copy the following code exactly, adding a docstring to each function:\n\n"
        "def add(x, y):\n    return x + y\n\ndef sub(x, y):\n    return x - y\n\n"
        "def mul(x, y):\n    return x * y\n\ndef div(x, y):\n    return x / y\n"),
    "rewrite-list (input-grounded)": (
        "Repeat this list, one item per line, each line starting with '- ':\n"
        "apples, bananas, cherries, dates, elderberries, figs, grapes, honeydew"),
    "open (free generation)": "Write a Python function that reverses a string, then explain it.",
}


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def hf_generate(model, ids, max_tokens, eos, **kw):
    import torch

    x = torch.tensor([ids])
    out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=max_tokens, do_sample=False,
                         eos_token_id=eos, pad_token_id=eos, **kw)
    return out[0, len(ids):].tolist()


@click.command()
@click.option("--draft", "draft_dir", default=None, help="Draft dir (default: the 8-layer cut in the cache).")
@click.option("--k", type=int, default=4, show_default=True, help="k for n-gram.")
@click.option("--draft-k", type=int, default=2, show_default=True, help="k for the draft model.")
@click.option("--max-tokens", type=int, default=48, show_default=True)
@click.option("--threads", type=int, default=1, show_default=True)
@click.option("--prompts", "only", multiple=True, help="Subset of prompt names (prefix match).")
@click.option("--repeats", type=int, default=2, show_default=True, help="Runs per method; the fastest counts.")
def main(draft_dir, k, draft_k, max_tokens, threads, only, repeats):
    import torch

    from specadapt.models import embedded_model_dir, resolve_model_dir
    from specadapt.native_reference import theory
    from specadapt.native_reference.engine import SpecEngine, SpecStats
    from specadapt.native_reference.models import check_draft_compatible, load_causal_lm, load_tokenizer
    from specadapt.native_reference.proposers import DraftModelProposer, NgramProposer

    torch.set_num_threads(threads)
    target_dir = resolve_model_dir(None)
    draft_dir = resolve_model_dir(draft_dir or str(embedded_model_dir().parent / f"{target_dir.name}-first8"))
    target = load_causal_lm(target_dir, torch.float32)
    draft = load_causal_lm(draft_dir, torch.float32)
    check_draft_compatible(target, draft)
    tok = load_tokenizer(target_dir)
    eos = tok.eos_token_id
    prompts = {n: p for n, p in PROMPTS.items() if not only or any(n.startswith(o) for o in only)}

    def encode(text):
        ids = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                      tokenize=True)
        return list(ids["input_ids"] if hasattr(ids, "keys") else ids)

    ours = {"ours: target alone": lambda: SpecEngine(target),
            f"ours: ngram k={k} (2..4)": lambda: SpecEngine(target, NgramProposer(2, 4), k),
            f"ours: draft {draft_dir.name} k={draft_k}": lambda: SpecEngine(target, DraftModelProposer(draft), draft_k)}
    peers = {"transformers: greedy": {},
             f"transformers: prompt_lookup_num_tokens={k}": {"prompt_lookup_num_tokens": k},
             "transformers: assistant_model (draft)": {"assistant_model": draft}}

    # warm-up (allocator, first-call overheads): one short run of each path, not measured
    warm = encode("Hello")
    for make in ours.values():
        make().generate(warm, 4, stop_ids=(eos,))
    for kw in peers.values():
        hf_generate(target, warm, 4, eos, **kw)

    rows = []  # (prompt, method, tokens, seconds, stats or None)
    for pname, text in prompts.items():
        ids = encode(text)
        reference = None
        for name, make in ours.items():
            runs = [timed(lambda: make().generate(ids, max_tokens, stop_ids=(eos,))) for _ in range(repeats)]
            gen, secs = min(runs, key=lambda r: r[1])
            reference = reference if reference is not None else gen.tokens
            for g, _ in runs:
                assert g.tokens == reference, f"{name} differs from the target alone on {pname!r}"
            rows.append((pname, name, len(gen.tokens), secs, gen.stats))
        for name, kw in peers.items():
            runs = [timed(lambda: hf_generate(target, ids, max_tokens, eos, **kw)) for _ in range(repeats)]
            for out, _ in runs:
                assert out == reference, f"{name} differs from ours on {pname!r}: {out[:20]} vs {reference[:20]}"
            rows.append((pname, name, len(runs[0][0]), min(r[1] for r in runs), None))
        print(f"# done: {pname}: {len(reference)} tokens: {tok.decode(reference)[:80]!r}", file=sys.stderr)

    # cost ratios from our own runs: one target pass of 1 token; one draft forward; a verify pass
    alone = SpecStats()
    for r in rows:
        if r[1] == "ours: target alone":
            alone.add(r[4])
    t_pass = alone.time_verify / max(alone.target_forwards - len(prompts), 1)

    print(f"\nDate: {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC. Machine: {platform.machine()} "
          f"CPU, {os.cpu_count()} cores, torch {torch.__version__}, {threads} thread(s), float32, greedy, "
          f"max {max_tokens} new tokens, chat template. Target {target_dir.name}; draft {draft_dir.name}.\n")
    print(f"One target pass (1 token): {t_pass * 1000:.1f} ms.\n")
    print("| prompt | method | tokens | tokens/s | speedup | decode tokens/s | decode speedup "
          "| acceptance | mean acc. len | c | verify pass cost | theory | measured/theory |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    base = {r[0]: r[2] / r[3] for r in rows if r[1] == "ours: target alone"}
    base_dec = {r[0]: r[2] / (r[4].time_total - r[4].time_prefill) for r in rows if r[1] == "ours: target alone"}
    for pname, name, n, secs, st in rows:
        tps = n / secs
        cells = [f"{n}", f"{tps:.1f}", f"{tps / base[pname]:.2f}"] + [""] * 8
        if st is not None:
            dec = n / (st.time_total - st.time_prefill)
            cells[3:5] = [f"{dec:.1f}", f"{dec / base_dec[pname]:.2f}"]
        if st is not None and st.draft_tokens:
            passes = st.target_forwards - 1  # verify passes (the prefill is not one)
            c = (st.time_draft / st.draft_forwards / t_pass) if st.draft_forwards else 0.0
            verify = st.time_verify / passes / t_pass
            # per-position theory over every pass (a pass without a proposal accepts nothing)
            pred = theory.predicted_speedup_per_position(st.accepted_per_pos, passes, c)
            cells[5:] = [f"{st.acceptance_rate:.2f}", f"{st.mean_acceptance_length:.2f}", f"{c:.2f}",
                         f"{verify:.2f}", f"{pred:.2f}", f"{dec / base_dec[pname] / pred:.2f}"]
        print(f"| {pname} | {name} | " + " | ".join(cells) + " |")
    print("\nAll outputs identical to ours-target-alone: yes (asserted).")


if __name__ == "__main__":
    main()

"""Benchmark of the native reference engine against target-only greedy and transformers'
assisted generation, on the embedded SmolLM2-135M-Instruct (not a test; run by hand).

    python benchmarks/make_truncated_draft.py --layers 8
    python benchmarks/reference_bench.py --threads 1 --max-tokens 48 --repeats 2

Same process, same torch threads, same prompts, greedy, float32 on CPU. For every prompt
it runs: the target alone (ours), ours with n-gram lookup (vLLM's 2..4 window, and
transformers' 1..2), ours with two drafts (the
8-layer cut made by make_truncated_draft.py, and an int8 dynamically quantized copy of the
target built here in memory), transformers' plain greedy, transformers with
prompt_lookup_num_tokens=, and transformers with assistant_model= for both drafts.
Methods are interleaved and repeated; the fastest run of each counts. Every output is
asserted identical to ours-target-alone. Target and draft forward passes (prefills included) are counted for every method
(a hook on the target), which compares the methods without the machine's timing noise.
Prints a markdown table.
"""

from __future__ import annotations

import copy
import os
import platform
import sys
import time
import warnings
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


def pass_cost(model, prefix, sizes=(2, 5, 9), repeats=5):
    """Time of one forward of n new tokens over a cached ``prefix``, relative to n = 1: the
    v of the theory, measured on this machine without any speculation code."""
    import torch
    from transformers import DynamicCache

    def best(n):
        times = []
        for _ in range(repeats):
            cache = DynamicCache()
            with torch.inference_mode():
                model(input_ids=torch.tensor([prefix]), past_key_values=cache, use_cache=True)
                ids = torch.tensor([prefix[-1:] * n])
                t0 = time.perf_counter()
                model(input_ids=ids, past_key_values=cache, use_cache=True)
                times.append(time.perf_counter() - t0)
        return min(times)

    one = best(1)
    return {n: best(n) / one for n in sizes}


def int8_copy(model):
    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.ao.quantization.quantize_dynamic(copy.deepcopy(model), {torch.nn.Linear}, dtype=torch.qint8)


@click.command()
@click.option("--draft", "draft_dir", default=None, help="Draft dir (default: the 8-layer cut in the cache).")
@click.option("--k", type=int, default=4, show_default=True, help="k for n-gram.")
@click.option("--draft-k", type=int, default=2, show_default=True, help="k for the truncated draft.")
@click.option("--int8-k", type=int, default=8, show_default=True, help="Most draft tokens for the int8 draft (0: skip it).")
@click.option("--int8-min-confidence", type=float, default=0.4, show_default=True,
              help="Stop drafting below this draft probability (transformers' default threshold is 0.4).")
@click.option("--max-tokens", type=int, default=48, show_default=True)
@click.option("--threads", type=int, default=1, show_default=True)
@click.option("--prompts", "only", multiple=True, help="Subset of prompt names (prefix match).")
@click.option("--repeats", type=int, default=2, show_default=True, help="Runs per method; the fastest counts.")
def main(draft_dir, k, draft_k, int8_k, int8_min_confidence, max_tokens, threads, only, repeats):
    import torch

    from specadapt.models import embedded_model_dir, resolve_model_dir
    from specadapt.native_reference import theory
    from specadapt.native_reference.engine import SpecEngine, SpecStats
    from specadapt.native_reference.models import (
        check_draft_compatible,
        load_causal_lm,
        load_tokenizer,
    )
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
            # transformers' prompt lookup window (max_matching_ngram_size 2, falling back to 1)
            f"ours: ngram k={k} (1..2)": lambda: SpecEngine(target, NgramProposer(1, 2), k),
            f"ours: draft {draft_dir.name} k={draft_k}": lambda: SpecEngine(target, DraftModelProposer(draft), draft_k)}
    peers = {"transformers: greedy": {},
             f"transformers: prompt_lookup_num_tokens={k}": {"prompt_lookup_num_tokens": k},
             f"transformers: assistant_model={draft_dir.name}": {"assistant_model": draft}}
    if int8_k:
        q8 = int8_copy(target)
        check_draft_compatible(target, q8)
        ours[f"ours: draft int8 copy of target k<={int8_k}, stop below {int8_min_confidence}"] = \
            lambda: SpecEngine(target, DraftModelProposer(q8, int8_min_confidence), int8_k)
        peers["transformers: assistant_model=int8 copy"] = {"assistant_model": q8}

    # Target forward passes of every method, transformers' included: a count that no noise of
    # the machine touches (registered after the int8 copy, which would otherwise copy the hook).
    # Draft forward passes too (both drafts; transformers' assistant included).
    passes = [0, 0]
    target.register_forward_pre_hook(lambda module, args: passes.__setitem__(0, passes[0] + 1))
    for model in [draft] + ([q8] if int8_k else []):
        model.register_forward_pre_hook(lambda module, args: passes.__setitem__(1, passes[1] + 1))

    def counted(fn):
        passes[0] = passes[1] = 0
        out, secs = timed(fn)
        return out, secs, (passes[0], passes[1])

    # warm-up (allocator, first-call overheads): one short run of each path, not measured
    warm = encode("Hello")
    for make in ours.values():
        make().generate(warm, 4, stop_ids=(eos,))
    for kw in peers.values():
        hf_generate(target, warm, 4, eos, **kw)

    runs: dict[tuple[str, str], list] = {}  # (prompt, method) -> [(tokens, seconds, stats, target passes)]
    reference: dict[str, list[int]] = {}
    for rep in range(repeats):  # interleaved, so slow phases of a shared machine hit all methods
        for pname, text in prompts.items():
            ids = encode(text)
            for name, make in ours.items():
                gen, secs, n_pass = counted(lambda: make().generate(ids, max_tokens, stop_ids=(eos,)))
                ref = reference.setdefault(pname, gen.tokens)
                assert gen.tokens == ref, f"{name} differs from the target alone on {pname!r}"
                assert n_pass[0] == gen.stats.target_forwards, (name, n_pass, gen.stats.target_forwards)
                runs.setdefault((pname, name), []).append((gen.tokens, secs, gen.stats, n_pass))
            for name, kw in peers.items():
                out, secs, n_pass = counted(lambda: hf_generate(target, ids, max_tokens, eos, **kw))
                assert out == reference[pname], f"{name} differs from ours on {pname!r}: {out[:20]} vs {reference[pname][:20]}"
                runs.setdefault((pname, name), []).append((out, secs, None, n_pass))
            print(f"# round {rep + 1}: {pname}: {tok.decode(reference[pname])[:70]!r}", file=sys.stderr)

    rows = [(p, m, *min(r, key=lambda x: x[1])) for (p, m), r in runs.items()]
    alone = SpecStats()
    for pname, name, _, _, st, _ in rows:
        if name == "ours: target alone":
            alone.add(st)
    t_pass = alone.time_verify / (alone.target_forwards - len(prompts))  # one 1-token target pass

    print(f"\nDate: {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC. Machine: 2-core {platform.machine()} "
          f"CPU, no GPU, torch {torch.__version__}, {threads} thread(s), float32, "
          f"greedy, max {max_tokens} new tokens, chat template, best of {repeats} interleaved runs. "
          f"Target {target_dir.name}. One 1-token target pass: {t_pass * 1000:.1f} ms. "
          f"Load average at the end: {os.getloadavg()[0]:.1f} (1 min), {os.getloadavg()[2]:.1f} (15 min).\n")
    cost = pass_cost(target, encode(list(prompts.values())[0]))
    print("Cost of one target pass of n tokens / one of 1 token (after the first prompt, best of 5): "
          + ", ".join(f"n={n}: {r:.2f}" for n, r in cost.items()) + ".\n")
    print("| prompt | method | tokens | target passes | draft passes | tokens/s | speedup | decode speedup "
          "| acceptance | mean acc. len | c | v | theory (v=1) | measured/theory | theory (measured v) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    base = {p: len(t) / s for p, m, t, s, _, _ in rows if m == "ours: target alone"}
    base_dec = {p: len(t) / (st.time_total - st.time_prefill) for p, m, t, s, st, _ in rows
                if m == "ours: target alone"}
    for pname, name, toks, secs, st, n_pass in rows:
        n = len(toks)
        cells = [f"{n}", f"{n_pass[0]}", f"{n_pass[1]}", f"{n / secs:.1f}", f"{n / secs / base[pname]:.2f}"] \
            + [""] * 8
        if st is not None:
            dec = n / (st.time_total - st.time_prefill) / base_dec[pname]
            cells[5] = f"{dec:.2f}"
        if st is not None and st.draft_tokens:
            passes = st.target_forwards - 1  # verify passes (the prefill is not one)
            c = (st.time_draft / st.draft_forwards / t_pass) if st.draft_forwards else 0.0
            v = st.time_verify / passes / t_pass
            # per-position theory over every pass (a pass without a proposal accepts nothing),
            # with the draft work actually spent per pass
            pred = theory.predicted_speedup_from_counts(st.accepted_per_pos, passes, st.draft_forwards, c)
            pred_v = theory.predicted_speedup_from_counts(st.accepted_per_pos, passes, st.draft_forwards, c, v)
            cells[6:] = [f"{st.acceptance_rate:.2f}", f"{st.mean_acceptance_length:.2f}", f"{c:.2f}",
                         f"{v:.2f}", f"{pred:.2f}", f"{dec / pred:.2f}", f"{pred_v:.2f}"]
        print(f"| {pname} | {name} | " + " | ".join(cells) + " |")
    print("\nAll outputs identical to ours-target-alone: yes (asserted).")


if __name__ == "__main__":
    main()

"""GPU check of the reference engine: a seeded random ~1B LLaMA-shaped target and a
2-layer draft (its first layers, shared embeddings and head) in bfloat16 on CUDA.

Checks greedy identity (speculative vs target alone; on a difference it prints the
target's top-2 margin there, since bf16 verify passes of k+1 tokens use other kernels
than 1-token decoding) and measures target-only vs speculative tokens/s and the time of
one verify pass. No network, no weights: everything is random and seeded.

Then the same three methods on batches (generate_batch) of B = 1, 4, 8 different random
prompts: tokens/s per (B, method), the spec/off ratio at each B (where speculation stops
paying as the batch grows), target passes, mean acceptance length, and every row compared
with its prompt decoded alone (B=1) by the same method, with the top-2 margin at the first
difference. B=1 means the eight prompts decoded one at a time (tokens/s over all of them).
"""

from __future__ import annotations

import copy
import json
import os
import sys
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from specadapt.native_reference.engine import SpecEngine
from specadapt.native_reference.models import CachedLM, truncate_layers
from specadapt.native_reference.proposers import DraftModelProposer, NgramProposer

SMOKE = os.environ.get("GPU_CHECK_SMOKE") == "1"  # tiny shapes on CPU: checks the script itself
DEVICE = "cpu" if SMOKE else "cuda"


def sync():
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def build(dtype):
    torch.manual_seed(0)
    shape = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4) if SMOKE \
        else dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32)
    cfg = LlamaConfig(vocab_size=32000, num_key_value_heads=4, max_position_embeddings=2048, **shape)
    with torch.device(DEVICE):
        target = LlamaForCausalLM(cfg).to(dtype).eval()
    with torch.no_grad():  # later layers are small corrections, so a 2-layer cut is a usable draft
        for layer in target.model.layers[2:]:
            layer.self_attn.o_proj.weight.mul_(0.05)
            layer.mlp.down_proj.weight.mul_(0.05)
    draft = truncate_layers(copy.deepcopy(target), 2)
    return target, draft


def run(engine, prompt, n):
    sync()
    t0 = time.perf_counter()
    gen = engine.generate(prompt, n)
    sync()
    return gen, time.perf_counter() - t0


def run_batch(engine, prompts, n):
    sync()
    t0 = time.perf_counter()
    gens = engine.generate_batch(prompts, n)
    sync()
    return [g.tokens for g in gens], time.perf_counter() - t0


def margin(target, prompt, base, spec):
    i = next((i for i, (a, b) in enumerate(zip(base, spec)) if a != b), None)
    if i is None:
        return None
    logits = CachedLM(target).forward(prompt + base[:i])[-1].float()
    top = torch.topk(logits, 2)
    return {"position": i, "alone": base[i], "spec": spec[i], "top2_margin": float(top.values[0] - top.values[1])}


def main() -> int:
    if not SMOKE and not torch.cuda.is_available():
        print("no CUDA device: nothing to check", file=sys.stderr)
        return 2
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 128
    target, draft = build(torch.bfloat16)
    print(f"target {sum(p.numel() for p in target.parameters()) / 1e9:.2f}B params, "
          f"draft {sum(p.numel() for p in draft.parameters()) / 1e9:.2f}B, bf16, {torch.cuda.get_device_name() if DEVICE == 'cuda' else 'CPU smoke run'}")
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, 32000, (64,), generator=g).tolist()
    prompt = prompt + prompt[:32]  # some repetition for the n-gram proposer
    SpecEngine(target).generate(prompt, 8)  # warm-up
    base, t_base = run(SpecEngine(target), prompt, n)
    results = {"target_alone": {"tokens_per_s": n / t_base,
                                "ms_per_pass": 1000 * base.stats.time_verify / n}}
    ok = True
    for name, prop, k in [("draft2L_k4", DraftModelProposer(draft), 4), ("ngram_k4", NgramProposer(1, 4), 4)]:
        SpecEngine(target, prop, k).generate(prompt, 8)
        gen, secs = run(SpecEngine(target, prop, k), prompt, n)
        st = gen.stats
        diff = margin(target, prompt, base.tokens, gen.tokens)
        ok &= diff is None or diff["top2_margin"] < 0.25  # bf16 near-tie, not a bug
        results[name] = {"identical": diff is None, "divergence": diff, "tokens_per_s": n / secs,
                         "speedup": t_base / secs, "acceptance": st.acceptance_rate,
                         "mean_acceptance_length": st.mean_acceptance_length,
                         "verify_ms_per_pass": 1000 * st.time_verify / (st.target_forwards - 1),
                         "draft_ms_per_forward": 1000 * st.time_draft / max(st.draft_forwards, 1)}
    t_batched = time.perf_counter()
    batched, batch_ok = batched_check(target, draft, n)
    results["batched"] = batched
    results["batched_seconds"] = time.perf_counter() - t_batched
    print(json.dumps(results, indent=2))
    return 0 if ok and batch_ok else 1


def batched_check(target, draft, n, sizes=(1, 4, 8)):
    """Target alone vs draft2L_k4 vs ngram_k4 on batches of different random prompts."""
    g = torch.Generator().manual_seed(2)
    prompts = []
    for i in range(max(sizes)):  # different lengths, some repetition for the n-gram proposer
        p = torch.randint(0, 32000, (48 + 8 * i,), generator=g).tolist()
        prompts.append(p + p[:24])
    methods = {"target_alone": lambda: SpecEngine(target),
               "draft2L_k4": lambda: SpecEngine(target, DraftModelProposer(draft), 4),
               "ngram_k4": lambda: SpecEngine(target, NgramProposer(1, 4), 4)}
    for make in methods.values():  # warm-up of every path and the padded batch shapes
        for b in sizes:
            make().generate_batch(prompts[:b], 4)
    alone, out, ok = {}, {}, True
    for b in sizes:
        row = out[f"B={b}"] = {}
        for name, make in methods.items():
            if b == 1:  # each prompt alone: the reference rows, and B=1's tokens/s over all of them
                toks, secs, totals = [], 0.0, None
                for p in prompts:
                    engine = make()
                    (tok,), t = run_batch(engine, [p], n)
                    toks.append(tok)
                    secs += t
                    if totals is None:
                        totals = engine.totals
                    else:
                        totals.add(engine.totals)
                alone[name] = toks
                # at B=1 the speculative rows are compared with the target alone
                ref_name = None if name == "target_alone" else "target_alone"
                refs = alone["target_alone"]
            else:
                engine = make()
                toks, secs = run_batch(engine, prompts[:b], n)
                totals = engine.totals
                ref_name, refs = f"{name} at B=1", alone[name]
            diffs = [dict(row=i, **d) for i, (p, ref, got) in enumerate(zip(prompts, refs, toks, strict=False))
                     if ref_name and (d := margin(target, p, ref, got)) is not None]
            ok &= all(d["top2_margin"] < 0.25 for d in diffs)  # bf16 near-ties, not bugs
            res = {"tokens_per_s": sum(map(len, toks)) / secs, "target_passes": totals.target_forwards}
            if name != "target_alone":
                res.update(spec_over_off=res["tokens_per_s"] / row["target_alone"]["tokens_per_s"],
                           mean_acceptance_length=totals.mean_acceptance_length)
            if ref_name:
                res.update({"compared_with": ref_name, "rows_identical": f"{len(toks) - len(diffs)}/{len(toks)}",
                            "divergences": diffs})
            row[name] = res
    return out, ok


if __name__ == "__main__":
    sys.exit(main())

"""GPU check of the reference engine: a seeded random ~1B LLaMA-shaped target and a
2-layer draft (its first layers, shared embeddings and head) in bfloat16 on CUDA.

Checks greedy identity (speculative vs target alone; on a difference it prints the
target's top-2 margin there, since bf16 verify passes of k+1 tokens use other kernels
than 1-token decoding) and measures target-only vs speculative tokens/s and the time of
one verify pass. No network, no weights: everything is random and seeded.
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
    print(json.dumps(results, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""How much does a server dtype move a top-2 logprob margin? (the near-tie thresholds)

For a few prompts, the embedded model generates a greedy continuation in float64; then the
whole sequence is scored once (teacher forcing) in float64 and in each of bfloat16,
float16 and float32. At every generated position, the margin between the float64 top-2
tokens, logp(top1) - logp(top2), is computed in each dtype; the error is its distance
from the float64 margin. A divergence whose margin is below the dtype's largest error can
be flipped by that dtype's arithmetic alone: a numerical near-tie.

    .venv/bin/python benchmarks/near_tie_noise.py [--tokens 96]

CPU kernels are not GPU kernels, and a server's batch shapes add their own noise, so the
defaults in specadapt.analysis.identity take about twice the largest error seen here.
"""

from __future__ import annotations

import argparse
import datetime
import platform

import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from specadapt.models import resolve_model_dir
from specadapt.workloads.prompts import load_prompts


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=96)
    args = ap.parse_args()
    torch.manual_seed(0)
    path = str(resolve_model_dir(None))
    tok = AutoTokenizer.from_pretrained(path)
    ref = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float64).eval()
    seqs = []
    for p in load_prompts(None):
        if p.api == "chat":
            ids = tok.apply_chat_template([m.model_dump() for m in p.messages], add_generation_prompt=True,
                                          return_tensors="pt")
            ids = ids["input_ids"] if hasattr(ids, "keys") else ids
        else:
            ids = tok(p.prompt, return_tensors="pt").input_ids
        with torch.no_grad():
            out = ref.generate(ids, max_new_tokens=args.tokens, do_sample=False)
        seqs.append((ids.shape[1], out))
    errors: dict[str, list[float]] = {"bfloat16": [], "float16": [], "float32": []}
    # each dtype loaded from the float32 checkpoint on disk (a round trip through a lower
    # precision would round the weights for every later dtype)
    models = {name: AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, name)).eval() for name in errors}
    margins64 = []
    with torch.no_grad():
        for n_prompt, seq in seqs:
            lp64 = torch.log_softmax(ref(seq).logits[0, n_prompt - 1:-1].double(), -1)
            top2 = lp64.topk(2, dim=-1).indices  # [T, 2]
            m64 = (lp64.gather(1, top2[:, :1]) - lp64.gather(1, top2[:, 1:])).squeeze(1)
            margins64 += m64.tolist()
            for name, model in models.items():
                lp = torch.log_softmax(model(seq).logits[0, n_prompt - 1:-1].double(), -1)
                m = (lp.gather(1, top2[:, :1]) - lp.gather(1, top2[:, 1:])).squeeze(1)
                errors[name] += (m - m64).abs().tolist()
    print(f"Measured {datetime.date.today()} on {platform.machine()}, torch {torch.__version__} CPU, "
          f"embedded SmolLM2-135M, {len(margins64)} generated positions of {len(seqs)} built-in prompts; "
          f"`python benchmarks/near_tie_noise.py --tokens {args.tokens}`\n")
    print("| dtype | margin error p50 | p99 | max | positions with float64 margin < max error |")
    print("| --- | --- | --- | --- | --- |")
    m64 = np.array(margins64)
    for name, errs in errors.items():
        e = np.array(errs)
        print(f"| {name} | {np.median(e):.4f} | {np.quantile(e, 0.99):.4f} | {e.max():.4f} | "
              f"{int((m64 < e.max()).sum())} of {len(m64)} |")


if __name__ == "__main__":
    main()

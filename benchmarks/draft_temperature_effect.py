"""How far the draft-temperature fault moves the output distribution, by draft (not a test;
run by hand, to choose a draft that makes the fault visible to a sampling check).

    python benchmarks/make_truncated_draft.py --layers 4     # also --layers 8, 16
    python benchmarks/draft_temperature_effect.py --factor 0.5 --factor 2

Exact, no sampling: for each chat-templated prompt of reference_batch_bench.py, the
target's next-token distribution p and the draft's q at temperature 1 (float64 softmax of
float32 logits, the embedded SmolLM2-135M-Instruct as target). One draft position verified
by rejection sampling outputs x with probability
q_draw(x) min(1, p(x)/q(x)) + (1 - sum_y q_draw(y) min(1, p(y)/q(y))) norm(max(p - q, 0))(x),
where q_draw is the distribution the draft sampled from: q when healthy (the output is then
p), q at temperature T under draft-temperature=T. Printed per draft: the healthy acceptance
probability sum_x min(p(x), q(x)) and the total variation distance between the faulty output
and p (min, mean, max over the prompts). Drafts: the layer cuts present in the model cache
and the target itself.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from reference_batch_bench import PROMPTS  # noqa: E402


def one_position(p, q, q_draw):
    """The output distribution of one verified draft position (see the module docstring)."""
    import torch

    accepted = q_draw * torch.clamp(p / q, max=1.0)
    residual = torch.clamp(p - q, min=0.0)
    total = residual.sum()
    return accepted + (1 - accepted.sum()) * (residual / total if total > 0 else p)


@click.command()
@click.option("--factor", "factors", type=float, multiple=True, default=(0.5, 2.0), show_default=True,
              help="T of draft-temperature=T (repeatable).")
@click.option("--threads", type=int, default=1, show_default=True)
def main(factors: tuple[float, ...], threads: int) -> None:
    import torch

    from specadapt.models import embedded_model_dir, resolve_model_dir
    from specadapt.native_reference.models import load_causal_lm, load_tokenizer

    torch.set_num_threads(threads)
    src = resolve_model_dir(None)
    target, tok = load_causal_lm(src), load_tokenizer(src)
    drafts = {}
    for layers in (4, 8, 16):
        path = embedded_model_dir().parent / f"{src.name}-first{layers}"
        if (path / "config.json").is_file():
            drafts[f"first{layers}"] = load_causal_lm(path)
    drafts["target itself"] = target
    prompts = [tok(tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                           tokenize=False), add_special_tokens=False)["input_ids"]
               for text in PROMPTS.values()]
    print("| draft | healthy acceptance (mean) | T | TVD(faulty output, p): min | mean | max |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, draft in drafts.items():
        dists = []
        with torch.inference_mode():
            for ids in prompts:
                x = torch.tensor([ids])
                dists.append((target(x).logits[0, -1].double(), draft(x).logits[0, -1].double()))
        acceptance = sum(float(torch.minimum(torch.softmax(lp, -1), torch.softmax(lq, -1)).sum())
                         for lp, lq in dists) / len(dists)
        for factor in factors:
            tvd = []
            for lp, lq in dists:
                p, q = torch.softmax(lp, -1), torch.softmax(lq, -1)
                out = one_position(p, q, torch.softmax(lq / factor, -1))
                tvd.append(float(0.5 * (out - p).abs().sum()))
            print(f"| {name} | {acceptance:.3f} | {factor:g} | {min(tvd):.4f} | {sum(tvd) / len(tvd):.4f} | "
                  f"{max(tvd):.4f} |")


if __name__ == "__main__":
    main()

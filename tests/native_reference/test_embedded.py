"""Greedy identity on the embedded SmolLM2-135M-Instruct in float32 (CPU)."""

from __future__ import annotations

import pytest
import torch

from specadapt.native_reference.engine import SpecEngine
from specadapt.native_reference.models import (
    CachedLM,
    load_causal_lm,
    load_tokenizer,
    truncate_layers,
)
from specadapt.native_reference.proposers import DraftModelProposer, NgramProposer

pytestmark = pytest.mark.slow

TEXT = ("def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\n"
        "Copy the two functions above exactly:\n")
N = 16


@pytest.fixture(scope="module")
def smol(embedded_dir):
    target = load_causal_lm(embedded_dir, torch.float32)
    draft = truncate_layers(load_causal_lm(embedded_dir, torch.float32), 8)
    prompt = load_tokenizer(embedded_dir)(TEXT)["input_ids"]
    base = SpecEngine(target).generate(prompt, N).tokens
    return target, draft, prompt, base


def divergence(target, prompt, base, spec) -> str:
    """Where the outputs part, and the target's top-2 logit margin there (near-tie or bug?)."""
    i = next(i for i, (a, b) in enumerate(zip(base, spec)) if a != b)
    logits = CachedLM(target).forward(prompt + base[:i])[-1].double()
    top = torch.topk(logits, 2)
    return (f"first difference at generated token {i}: target alone {base[i]}, speculative {spec[i]}; "
            f"target top-2 {top.indices.tolist()} margin {float(top.values[0] - top.values[1]):.3g} logits")


@pytest.mark.parametrize("kind", ["draft", "ngram"])
@pytest.mark.parametrize("k", [1, 3, 8])
def test_greedy_identity_smollm2(smol, kind, k):
    target, draft, prompt, base = smol
    proposer = DraftModelProposer(draft) if kind == "draft" else NgramProposer(1, 4)
    gen = SpecEngine(target, proposer, k).generate(prompt, N)
    assert gen.tokens == base, divergence(target, prompt, base, gen.tokens)
    assert gen.stats.draft_tokens > 0


def test_divergence_report_shows_the_margin(smol):
    """The failure message of the identity test names the position and the top-2 margin."""
    target, _, prompt, base = smol
    fake = base[:5] + [base[5] + 1] + base[6:]
    msg = divergence(target, prompt, base, fake)
    assert msg.startswith(f"first difference at generated token 5: target alone {base[5]}, speculative {base[5] + 1}")
    assert float(msg.split("margin ")[1].split()[0]) > 0


def test_target_alone_equals_transformers_generate(smol):
    """The engine's own loop against an implementation that shares no cache code with it."""
    target, _, prompt, base = smol
    ids = torch.tensor([prompt])
    out = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=N, min_new_tokens=N,
                          do_sample=False, pad_token_id=0)
    assert out[0, len(prompt):].tolist() == base


def test_batched_rows_equal_rows_alone_smollm2(smol, embedded_dir):
    """Three prompts of different lengths in one batch (n-gram k=4, rows accepting different
    numbers of tokens per pass): each row equals the prompt decoded alone."""
    target, _, prompt, base = smol
    tok = load_tokenizer(embedded_dir)
    others = [tok("List three colours:\n1. red\n2.")["input_ids"], tok("x = [1, 2, 3]\ny = [1, 2,")["input_ids"]]
    alone = [base] + [SpecEngine(target).generate(p, N).tokens for p in others]
    gens = SpecEngine(target, NgramProposer(1, 4), 4).generate_batch([prompt] + others, N)
    for g, a, p in zip(gens, alone, [prompt] + others):
        assert g.tokens == a, divergence(target, p, a, g.tokens)

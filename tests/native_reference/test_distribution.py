"""Exactness of speculative sampling past the first draft position, on tiny float64 models.

test_sampling.py checks the first two generated tokens only: the first comes from the
prefill and the second from draft position 0, so neither a later draft position nor the
bonus token is ever looked at. Here the joint distribution of the first three tokens
(t1, t2, t3) is computed exactly from the target alone and compared (chi-square) with the
engine's samples, drawn as the rows of one batch (so rows that accept different numbers of
drafts share each pass), and once one sequence at a time. With k = 1, t3 is the bonus
token whenever t2's draft was accepted; with k = 2, t3 is draft position 1 whenever t2's
draft was accepted. Each sampler fault (draft-temperature among them) is shown to fail
the same test, so the healthy runs passing means something.

Also: a stop token inside an accepted draft, and the draft model's cache after
rejections in sampling mode.
"""

from __future__ import annotations

import pytest
import torch

from specadapt.native_reference.engine import SpecEngine
from specadapt.native_reference.faults import Fault, build_engine
from specadapt.native_reference.models import CachedLM
from specadapt.native_reference.proposers import DraftModelProposer, NgramProposer
from specadapt.native_reference.sampling import SamplingParams, probs

from .conftest import noisy_copy, tiny_llama
from .test_sampling import chi_square_p

V = 6
N = 1500
PROMPT = [1, 4, 2]
NGRAM_PROMPT = [1, 4, 2, 5, 3, 1, 4]  # the lookup proposes 2, 5 after the prompt (q one-hot)
HOT = SamplingParams(temperature=1.0)


@pytest.fixture(scope="module")
def pair():
    """Target and draft with V = 6 and a large init: peaked, clearly different distributions."""
    target = tiny_llama(seed=10, vocab=V, layers=1, hidden=16, init=0.6)
    draft = tiny_llama(seed=11, vocab=V, layers=1, hidden=16, init=0.6)
    return target, draft


@torch.inference_mode()
def exact_first_three(model, prompt: list[int], params: SamplingParams) -> dict:
    """P(t1, t2, t3) = p(t1 | prompt) p(t2 | prompt, t1) p(t3 | prompt, t1, t2), from the
    model alone in float64: one batched forward per depth over every prefix (V, then V^2)."""
    def dist(seqs):  # next-token distributions after each sequence, [len(seqs), V]
        return probs(model(input_ids=torch.tensor(seqs)).logits[:, -1], params)

    p1 = dist([prompt])[0]  # [V]
    p2 = dist([prompt + [a] for a in range(V)])  # [V, V]
    p3 = dist([prompt + [a, b] for a in range(V) for b in range(V)]).reshape(V, V, V)
    joint = p1[:, None, None] * p2[:, :, None] * p3  # [V, V, V]
    assert float(joint.sum()) == pytest.approx(1.0, abs=1e-12)
    return {(a, b, c): float(joint[a, b, c]) for a in range(V) for b in range(V) for c in range(V)}


def sample_first_three(engine: SpecEngine, prompt: list[int], n: int, params: SamplingParams,
                       batched: bool) -> dict:
    """``n`` independent samples of the first three tokens: one ``generate`` after another,
    or ``n`` rows of one ``generate_batch`` (each row has its own generator; rows accept
    different numbers of drafts in the same pass)."""
    if batched:
        gens = engine.generate_batch([prompt] * n, 3, params)
    else:
        gens = [engine.generate(prompt, 3, params) for _ in range(n)]
    counts: dict = {}
    for gen in gens:
        counts[tuple(gen.tokens)] = counts.get(tuple(gen.tokens), 0) + 1
    return counts


def p_value(target, proposer, k, prompt, seed, fault=None, params=HOT, batched=True) -> float:
    engine = build_engine(target, proposer, k, Fault.parse(fault) if fault else None, seed=seed)
    counts = sample_first_three(engine, prompt, N, params, batched)
    return chi_square_p(counts, exact_first_three(target, prompt, params), N)


@pytest.mark.parametrize("k", [1, 2])
def test_draft_model_first_three_tokens_exact(pair, k):
    target, draft = pair
    assert p_value(target, DraftModelProposer(draft), k, PROMPT, seed=100 + k) > 1e-3


def test_draft_model_first_three_tokens_exact_one_at_a_time(pair):
    """The same through ``generate``, one sequence after another (today the engine draws
    each row's seed the same way on both routes, so the samples equal the batch's)."""
    target, draft = pair
    assert p_value(target, DraftModelProposer(draft), 2, PROMPT, seed=102, batched=False) > 1e-3


def test_draft_model_first_three_tokens_exact_with_top_k_top_p(pair):
    """The processed distributions (top-k, then top-p) must be applied to p and q alike."""
    target, draft = pair
    params = SamplingParams(temperature=1.0, top_k=4, top_p=0.9)
    assert p_value(target, DraftModelProposer(draft), 2, PROMPT, seed=5, params=params) > 1e-3


def test_ngram_first_three_tokens_exact(pair):
    target, _ = pair
    assert p_value(target, NgramProposer(1, 2), 2, NGRAM_PROMPT, seed=7) > 1e-3


# fault, and the k that exposes it within three tokens
FAULT_CASES = [("accept-always", 2), ("residual-p", 2), ("bonus-previous", 1), ("accept-later", 2),
               ("draft-temperature=0.5", 2), ("draft-temperature=2", 1)]


@pytest.mark.parametrize("fault, k", FAULT_CASES, ids=[c[0] for c in FAULT_CASES])
def test_fault_fails_the_same_test(pair, fault, k):
    """Each deliberate sampler bug is rejected by the test the healthy engine passes
    (test_draft_model_first_three_tokens_exact[k]: same models, prompt, seed, samples):

    - accept-always (k = 2): drafts are never compared with the target at all.
    - residual-p (k = 2): after a rejection the replacement comes from p instead of the
      residual, so the rejected draft token is over-represented at t2 and t3.
    - bonus-previous (k = 1): the bonus token is t3 only with k = 1 (with k = 2 all-accepted
      drafts reach t4, past the window); it is then drawn from t2's distribution.
    - accept-later (k = 2): needs a draft position >= 1, which only k >= 2 has; t3 then
      follows the draft's q whenever t2's draft was accepted.
    - draft-temperature=0.5 (k = 2) and =2 (k = 1): the draft samples at half (twice) the
      request's temperature, while verification divides by q at the request's
      temperature, which is not the distribution the tokens came from.
    """
    target, draft = pair
    p = p_value(target, DraftModelProposer(draft), k, PROMPT, seed=100 + k, fault=fault)
    assert p < 1e-6, f"{fault} (k={k}) passed the exactness test: p = {p:.3g}"


def test_stop_token_inside_an_accepted_draft(tiny_target):
    """The target as its own draft accepts all k = 4 drafts (greedy); a stop token at draft
    position 1 or 2 must end the generation there, dropping the accepted drafts after it
    and the bonus token."""
    prompt = [51, 0, 63, 42, 31, 41, 8, 24]
    k, longest = 4, 30
    base = SpecEngine(tiny_target).generate(prompt, longest).tokens
    # with everything accepted, step 0 (prefill) emits token 0, step s >= 1 emits tokens
    # 5(s-1)+1 .. 5s: four drafts, then the bonus; pick a first occurrence at a middle draft
    # position of a step after the first speculative one
    picks = [j for j in range(6, longest) if (j - 1) % (k + 1) in (1, 2) and base[j] not in base[:j]]
    assert picks, f"no usable stop token in {base}"
    j = picks[0]
    stop = base[j]
    gen = SpecEngine(tiny_target, DraftModelProposer(tiny_target), k).generate(prompt, longest, stop_ids=(stop,))
    assert gen.finish_reason == "stop"
    assert gen.tokens == base[:j + 1]
    assert gen.tokens[-1] == stop and stop not in gen.tokens[:-1]
    last = gen.steps[-1]
    assert len(last.proposed) == k and last.accepted == k  # the stop was inside an accepted draft
    assert len(last.tokens) == (j - 1) % (k + 1) + 1 < k
    assert gen.stats.generated_tokens == len(gen.tokens)


def test_draft_temperature_fault_draws_at_the_other_temperature(pair):
    """Under draft-temperature=T the draft tokens come from the draft at temperature
    (request temperature x T) and the q handed to verification is the one at the
    request's temperature. With T tiny the draw is the draft's argmax, so every proposed
    token is the argmax of its q (the q at temperature 1, where other tokens are likely:
    asserted), and q equals a from-scratch recomputation at temperature 1."""
    target, draft = pair
    prop = DraftModelProposer(draft)
    engine = build_engine(target, prop, 3, Fault.parse("draft-temperature=1e-4"), seed=4)
    inner = prop.propose
    seen = []

    def propose(seqs, ks, params, generators):
        proposals = inner(seqs, ks, params, generators)
        for seq, par, proposal in zip(seqs, params, proposals):
            fresh = CachedLM(draft).forward(list(seq) + proposal.tokens[:-1])[-len(proposal.tokens):]
            torch.testing.assert_close(proposal.q, probs(fresh, par), rtol=0, atol=1e-12)
            assert proposal.tokens == proposal.q.argmax(-1).tolist()
            seen.append(float(proposal.q.max(-1).values.min()))
        return proposals

    prop.propose = propose
    engine.generate_batch([PROMPT, [5, 0, 3, 3]], 30, HOT)
    assert len(seen) > 10 and min(seen) < 0.9  # q itself would often have drawn another token


ROLLBACK_PROMPTS = [PROMPT, [5, 0, 3, 3], [2, 2, 1, 0, 5, 4, 3]]


@pytest.mark.parametrize("batched", [False, True], ids=["alone", "batch"])
def test_draft_cache_rolled_back_after_rejections(pair, monkeypatch, batched):
    """Sampling mode, draft often rejected mid-draft: at every proposal, the distributions q
    the draft model returns for each row equal a from-scratch recomputation (a fresh
    CachedLM over the row's sequence plus its drafted tokens), so the cache entries of
    rejected drafts were dropped. In a batch, rows accept different numbers of drafts in
    the same pass."""
    target, _ = pair
    draft = noisy_copy(target, 0.15, seed=1)  # close enough to accept whole drafts at times
    k, params = 3, HOT
    prop = DraftModelProposer(draft)
    inner = prop.propose
    checked = []

    def propose(seqs, ks, params, generators):
        proposals = inner(seqs, ks, params, generators)
        assert len(proposals) == len(seqs)
        for seq, kk, par, proposal in zip(seqs, ks, params, proposals):
            n = len(proposal.tokens)
            assert n == kk and proposal.q is not None and proposal.q.shape == (n, V)
            fresh = CachedLM(draft).forward(list(seq) + proposal.tokens[:-1])[-n:]  # [n, V]
            torch.testing.assert_close(proposal.q, probs(fresh, par), rtol=0, atol=1e-12)
            checked.append(n)
        return proposals

    monkeypatch.setattr(prop, "propose", propose)
    engine = SpecEngine(target, prop, k, seed=3)
    if batched:
        gens = engine.generate_batch(ROLLBACK_PROMPTS, 60, params)
    else:  # one after another: the cache must also restart cleanly for each new sequence
        gens = [engine.generate(prompt, 60, params) for prompt in ROLLBACK_PROMPTS]
    steps = [s for g in gens for s in g.steps]
    mid = sum(1 for s in steps if 0 < s.accepted < len(s.proposed))
    full = sum(1 for s in steps if s.proposed and s.accepted == len(s.proposed))
    assert len(checked) == sum(1 for s in steps if s.proposed) > 30
    assert mid >= 10 and full >= 5, (mid, full)  # both kinds of rollback really happened

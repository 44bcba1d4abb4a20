"""Greedy identity, statistics and faults of the engine on seeded tiny random LLaMAs (float64)."""

from __future__ import annotations

import pytest
import torch

from specadapt.errors import UsageError
from specadapt.native_reference.engine import SpecEngine
from specadapt.native_reference.faults import Fault, build_engine
from specadapt.native_reference.models import CachedLM, check_draft_compatible
from specadapt.native_reference.proposers import (
    DraftModelProposer,
    NgramProposer,
    ngram_lookup,
)

from .conftest import tiny_llama

PROMPT = [3, 17, 5, 9, 3, 17, 22, 41, 8, 3, 17, 5]
N = 40


@pytest.fixture(scope="module")
def baseline(tiny_target):
    # Long enough to check every proposal, even past the last emitted token.
    return SpecEngine(tiny_target).generate(PROMPT, N + 10).tokens


def proposer(kind, draft):
    return DraftModelProposer(draft) if kind == "draft" else NgramProposer(1, 3)


@pytest.mark.parametrize("kind", ["draft", "ngram"])
@pytest.mark.parametrize("k", [1, 3, 8])
def test_greedy_identity(tiny_target, tiny_draft, baseline, kind, k):
    gen = SpecEngine(tiny_target, proposer(kind, tiny_draft), k).generate(PROMPT, N)
    assert gen.tokens == baseline[:N]
    # the test is only meaningful when some drafts are accepted and some rejected
    assert 0 < gen.stats.accepted_tokens < gen.stats.draft_tokens


@pytest.mark.parametrize("kind", ["draft", "ngram"])
def test_stats_recomputed_from_tokens(tiny_target, tiny_draft, baseline, kind):
    k = 4
    gen = SpecEngine(tiny_target, proposer(kind, tiny_draft), k).generate(PROMPT, N)
    accepted_per_pos, proposed_per_pos = [0] * k, [0] * k
    for step in gen.steps:
        offset = step.position - len(PROMPT)
        truth = baseline[offset:offset + len(step.proposed)]
        m = next((i for i, (a, b) in enumerate(zip(step.proposed, truth)) if a != b), len(step.proposed))
        for i in range(len(step.proposed)):
            proposed_per_pos[i] += 1
            accepted_per_pos[i] += i < m
    s = gen.stats
    assert s.accepted_per_pos == accepted_per_pos
    assert s.proposed_per_pos == proposed_per_pos
    assert s.accepted_tokens == sum(accepted_per_pos)
    assert s.draft_tokens == sum(len(st.proposed) for st in gen.steps)
    assert s.num_drafts == sum(1 for st in gen.steps if st.proposed)
    assert s.generated_tokens == len(gen.tokens) == N
    # one target pass per step, the first being the prefill (which emits the first token and
    # verifies nothing); a draft model runs k times per later step
    assert s.target_forwards == len(gen.steps)
    assert gen.steps[0].proposed == [] and len(gen.steps[0].tokens) == 1
    if kind == "draft":
        assert s.draft_forwards == k * (len(gen.steps) - 1)
    assert s.mean_acceptance_length == pytest.approx(1 + s.accepted_tokens / s.num_drafts)


@pytest.mark.parametrize("batch", [1, 3])
def test_cache_positions_match_full_recompute(tiny_target, tiny_draft, batch):
    """After speculation with rejections (holes in the batched cache), every row's cached
    entries give the same next-token logits as a fresh prefill of its sequence."""
    engine = SpecEngine(tiny_target, DraftModelProposer(tiny_draft), 3)
    rows = [engine.add(PROMPT[i:], 100)[0] for i in range(batch)]
    for _ in range(8):
        engine.step()
    assert engine.target.lengths == [len(r.tokens) - 1 for r in rows]  # all but the last token
    cached = engine.target.forward([[r.tokens[-1]] for r in rows])  # [B, 1, V]
    for b, row in enumerate(rows):
        fresh = CachedLM(tiny_target).forward(row.tokens)[-1]
        torch.testing.assert_close(cached[b, 0], fresh, rtol=0, atol=1e-10)


def test_draft_cache_in_step_when_all_accepted(tiny_target):
    """A draft identical to the target accepts everything; its cache must stay in step."""
    prop = DraftModelProposer(tiny_target)
    engine = SpecEngine(tiny_target, prop, 4)
    row, first = engine.add(PROMPT, 100)
    steps = [first] + [s for _ in range(4) for _, s in engine.step()]
    assert engine.totals.accepted_tokens == engine.totals.draft_tokens > 0
    assert len(steps[0].tokens) == 1  # the prefill
    assert all(len(s.tokens) == 5 for s in steps[1:])
    # the draft holds every token but the bonus and the last draft of the last step
    assert prop.fed[0] == row.tokens[:len(prop.fed[0])] and len(prop.fed[0]) == len(row.tokens) - 2


def test_ngram_lookup_prefers_longest_then_earliest():
    seq = [2, 3, 5, 1, 2, 3, 9, 2, 3, 7, 1, 2, 3]
    assert ngram_lookup(seq, 2, 1, 3) == [9, 2]  # "1 2 3" is longer than "2 3"
    assert ngram_lookup(seq, 2, 1, 2) == [5, 1]  # "2 3": the earliest match, as vLLM picks
    assert ngram_lookup(seq, 20, 2, 2) == seq[2:]  # k capped by what follows the match
    assert ngram_lookup([5, 6, 7], 3, 1, 3) == []
    assert ngram_lookup([4, 4, 4], 2, 2, 2) == [4]  # overlapping match, not the suffix itself


def test_draft_with_other_vocab_is_refused(tiny_target):
    other = tiny_llama(seed=5, vocab=65)
    with pytest.raises(UsageError, match="vocab size 65 .* 64"):
        check_draft_compatible(tiny_target, other)


def test_fault_accept_always_changes_output(tiny_target, tiny_draft, baseline):
    gen = build_engine(tiny_target, DraftModelProposer(tiny_draft), 3, Fault.parse("accept-always")).generate(PROMPT, N)
    assert gen.stats.accepted_tokens == gen.stats.draft_tokens
    assert gen.tokens != baseline[:N]


def test_fault_drop_bonus_loses_throughput_not_identity(tiny_target, baseline):
    prop = DraftModelProposer(tiny_target)  # accepts everything: a bonus every step
    gen = build_engine(tiny_target, prop, 4, Fault.parse("drop-bonus")).generate(PROMPT, N)
    assert gen.tokens == baseline[:N]
    assert max(len(s.tokens) for s in gen.steps) == 4
    good = SpecEngine(tiny_target, DraftModelProposer(tiny_target), 4).generate(PROMPT, N)
    assert gen.stats.target_forwards > good.stats.target_forwards


def test_fault_perturb_logits_only_on_verify(tiny_target, tiny_draft, baseline):
    engine = build_engine(tiny_target, DraftModelProposer(tiny_draft), 3, Fault.parse("perturb-logits=5"))
    gen = engine.generate(PROMPT, N)
    assert gen.tokens != baseline[:N]
    alone = build_engine(tiny_target, None, 0, Fault.parse("perturb-logits=5")).generate(PROMPT, N)
    assert alone.tokens == baseline[:N]  # no verify pass, no noise


@pytest.mark.parametrize("text", ["bogus", "perturb-logits", "perturb-logits=x", "accept-always=1"])
def test_bad_fault_refused(text):
    with pytest.raises(UsageError):
        Fault.parse(text)


@pytest.mark.parametrize("text, factor", [("draft-temperature=0.5", 0.5), ("draft-temperature=2", 2.0),
                                          ("draft-temperature=1e-3", 1e-3)])
def test_draft_temperature_fault_parsed(text, factor):
    assert Fault.parse(text) == Fault("draft-temperature", factor=factor)


@pytest.mark.parametrize("text, message", [
    ("draft-temperature", "needs a factor: draft-temperature=T"),
    ("draft-temperature=hot", "needs a factor: draft-temperature=T"),
    ("draft-temperature=0", "T must be a finite number > 0"),
    ("draft-temperature=-0.5", "T must be a finite number > 0"),
    ("draft-temperature=inf", "T must be a finite number > 0"),
    ("draft-temperature=nan", "T must be a finite number > 0"),
    ("draft-temperature=1", "draft-temperature=1 is the healthy sampler"),
    ("draft-temp=0.5", "unknown fault 'draft-temp=0.5'.*draft-temperature=T"),
])
def test_bad_draft_temperature_refused(text, message):
    with pytest.raises(UsageError, match=message):
        Fault.parse(text)


@pytest.mark.parametrize("kind, k", [("ngram", 3), ("none", 3), ("draft", 0)])
def test_draft_temperature_needs_a_sampling_draft(tiny_target, tiny_draft, kind, k):
    """n-gram proposals are deterministic (q one-hot): the fault would change nothing, so it
    is refused; so are the target alone and a draft model with k = 0 (never asked)."""
    prop = None if kind == "none" else proposer(kind, tiny_draft)
    with pytest.raises(UsageError, match="draft-temperature fault needs a draft model"):
        build_engine(tiny_target, prop, k, Fault.parse("draft-temperature=0.5"))


def test_draft_temperature_sets_the_factor_of_the_draw_only(tiny_target, tiny_draft):
    prop = DraftModelProposer(tiny_draft)
    assert prop.sample_temperature_factor == 1.0
    build_engine(tiny_target, prop, 3, Fault.parse("draft-temperature=0.25"))
    assert prop.sample_temperature_factor == 0.25
    healthy = DraftModelProposer(tiny_draft)
    build_engine(tiny_target, healthy, 3, Fault.parse("perturb-logits=1"))
    assert healthy.sample_temperature_factor == 1.0


def test_batch_of_prompts_refused_with_reason(tiny_target):
    with pytest.raises(UsageError, match="generate_batch"):
        SpecEngine(tiny_target).generate([[1, 2], [3, 4]], 4)


def test_confidence_stop_shortens_drafts_and_keeps_identity(tiny_target, tiny_draft, baseline):
    prop = DraftModelProposer(tiny_draft, min_confidence=0.1)
    gen = SpecEngine(tiny_target, prop, 8).generate(PROMPT, N)
    assert gen.tokens == baseline[:N]
    lengths = {len(s.proposed) for s in gen.steps}
    assert min(lengths) < 8 and gen.stats.draft_forwards == sum(len(s.proposed) for s in gen.steps)

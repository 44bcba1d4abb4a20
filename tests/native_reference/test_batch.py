"""Batched speculative decoding: every row of a batch equals that row decoded alone, and
greedy output equals transformers' own ``generate`` (an implementation that shares no
cache code with the engine). Seeded tiny random models in float64."""

from __future__ import annotations

import pytest
import torch
import transformers

from specadapt.errors import UsageError
from specadapt.native_reference.engine import SpecEngine, parse_schedule
from specadapt.native_reference.proposers import DraftModelProposer, NgramProposer
from specadapt.native_reference.sampling import SamplingParams
from specadapt.records.schedule import k_for_batch

# different lengths, and repetition so that n-gram lookup finds something
PROMPTS = [
    [3, 17, 5, 9, 3, 17, 22, 41, 8, 3, 17, 5],
    [7, 7, 12, 30, 7, 12],
    [50, 2, 33, 2, 33, 19, 4, 2, 33, 50, 61, 2, 33, 19, 4, 60, 2, 33],
]
N = 30


def hf_greedy(model, prompt, n):
    ids = torch.tensor([prompt])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                         do_sample=False, pad_token_id=0)
    return out[0, len(prompt):].tolist()


@pytest.fixture(scope="module")
def truth(tiny_target):
    return [hf_greedy(tiny_target, p, N) for p in PROMPTS]


def make(kind, target, draft, k, **kw):
    prop = {"draft": lambda: DraftModelProposer(draft), "ngram": lambda: NgramProposer(1, 3),
            "none": lambda: None}[kind]()
    return SpecEngine(target, prop, k, **kw)


@pytest.mark.parametrize("kind", ["draft", "ngram"])
@pytest.mark.parametrize("k", [1, 2, 4, 8])
@pytest.mark.parametrize("batch", [1, 3])
def test_greedy_equals_transformers_generate(tiny_target, tiny_draft, truth, kind, k, batch):
    engine = make(kind, tiny_target, tiny_draft, k)
    gens = engine.generate_batch(PROMPTS[:batch], N)
    assert [g.tokens for g in gens] == truth[:batch]
    s = engine.totals
    assert 0 < s.accepted_tokens
    if batch > 1 and k > 1:  # rows accepted different numbers of tokens in the same passes
        assert s.accepted_tokens < s.draft_tokens


def test_target_alone_batched_equals_transformers(tiny_target, truth):
    gens = SpecEngine(tiny_target).generate_batch(PROMPTS, N)
    assert [g.tokens for g in gens] == truth


@pytest.mark.parametrize("kind", ["draft", "ngram"])
def test_sampling_rows_equal_rows_alone(tiny_target, tiny_draft, kind):
    """With a seed per row, a row draws the same random numbers in a batch as alone, so its
    sampled tokens are the same: batching changes nothing about any row's distribution."""
    params = [SamplingParams(1.0), SamplingParams(0.7, top_k=20), SamplingParams(1.3, top_p=0.9)]
    seeds = [11, 22, 33]
    batched = make(kind, tiny_target, tiny_draft, 3).generate_batch(PROMPTS, N, params, seeds=seeds)
    for i, prompt in enumerate(PROMPTS):
        alone = make(kind, tiny_target, tiny_draft, 3).generate(prompt, N, params[i], seed=seeds[i])
        assert batched[i].tokens == alone.tokens
        assert [s.accepted for s in batched[i].steps] == [s.accepted for s in alone.steps]
    # and the rows are really sampled (not greedy), with some rejections
    assert batched[0].tokens != SpecEngine(tiny_target).generate(PROMPTS[0], N).tokens
    assert any(s.accepted < len(s.proposed) for g in batched for s in g.steps)


def test_mixed_greedy_and_sampling_rows(tiny_target, tiny_draft, truth):
    params = [SamplingParams(0.0), SamplingParams(1.0), SamplingParams(0.0)]
    gens = make("draft", tiny_target, tiny_draft, 4).generate_batch(PROMPTS, N, params, seeds=[1, 2, 3])
    assert gens[0].tokens == truth[0] and gens[2].tokens == truth[2]
    alone = make("draft", tiny_target, tiny_draft, 4).generate(PROMPTS[1], N, params[1], seed=2)
    assert gens[1].tokens == alone.tokens


def test_rows_join_and_leave_between_steps(tiny_target, tiny_draft, truth):
    """Continuous batching: a row joins while others are mid-way, rows with fewer tokens
    to go leave early; every row still equals transformers' output."""
    engine = make("draft", tiny_target, tiny_draft, 4)
    out: dict[int, list[int]] = {}
    r0, s0 = engine.add(PROMPTS[0], N, tag=0)
    r1, s1 = engine.add(PROMPTS[1], 7, tag=1)
    out[0], out[1] = list(s0.tokens), list(s1.tokens)
    for _ in range(3):
        for row, step in engine.step():
            out[row.tag] += step.tokens
    r2, s2 = engine.add(PROMPTS[2], N, tag=2)
    out[2] = list(s2.tokens)
    sizes = []
    while engine.rows:
        sizes.append(len(engine.rows))
        for row, step in engine.step():
            out[row.tag] += step.tokens
    assert out[0] == truth[0] and out[1] == truth[1][:7] and out[2] == truth[2]
    assert r1.finish_reason == "length" and max(sizes) == 3 and min(sizes) == 1
    assert engine.target.batch == 0 and engine.proposer.cache.batch == 0


def test_cancelled_row_leaves_the_others_exact(tiny_target, tiny_draft, truth):
    engine = make("draft", tiny_target, tiny_draft, 4)
    rows = [engine.add(p, N, tag=i)[0] for i, p in enumerate(PROMPTS)]
    for _ in range(2):
        engine.step()
    engine.remove(rows[1])  # a client went away
    while engine.rows:
        engine.step()
    assert rows[0].tokens[len(PROMPTS[0]):] == truth[0]
    assert rows[2].tokens[len(PROMPTS[2]):] == truth[2]


def test_compaction_keeps_rows_exact(tiny_target, tiny_draft, truth):
    """Holes (rejected drafts in one row while another accepted) are squeezed out by
    compact(); the rows' outputs do not change."""
    engine = make("draft", tiny_target, tiny_draft, 8)
    rows = [engine.add(p, N)[0] for p in PROMPTS]
    holes = 0
    while engine.rows:
        engine.step()
        if engine.target.batch:
            holes = max(holes, int((engine.target.pos < 0).sum()))
            engine.target.compact()
            assert int((engine.target.pos < 0).sum()) < engine.target.batch * engine.target.slots
            assert engine.target.slots == max(engine.target.lengths)
    assert holes > 0
    assert [r.tokens[len(p):] for r, p in zip(rows, PROMPTS)] == truth


def test_stop_token_inside_a_batch(tiny_target, truth):
    stop = truth[1][5]
    first = truth[1].index(stop)
    gens = make("ngram", tiny_target, None, 4).generate_batch(PROMPTS, N, stop_ids=(stop,))
    assert gens[1].tokens == truth[1][:first + 1] and gens[1].finish_reason == "stop"
    for g, t in zip(gens, truth):
        cut = t.index(stop) + 1 if stop in t else N
        assert g.tokens == t[:cut]


def test_schedule_sets_k_by_batch_size(tiny_target, tiny_draft, truth):
    engine = make("draft", tiny_target, tiny_draft, 4, schedule=[[1, 1, 4], [2, 2, 2], [3, 8, 0]])
    assert [engine.k_for(b) for b in (1, 2, 3, 9)] == [4, 2, 0, 0]  # past the last range: its k (vLLM)
    lengths = [N, N // 2, N // 4]  # rows leave one by one: batch sizes 3, 2, 1
    rows = [engine.add(p, n)[0] for p, n in zip(PROMPTS, lengths)]
    proposed = []
    while engine.rows:
        b = len(engine.rows)
        for _, step in engine.step():
            proposed.append((b, len(step.proposed)))
    assert {b: max(n for bb, n in proposed if bb == b) for b, _ in proposed} == {3: 0, 2: 2, 1: 4}
    assert [r.tokens[len(p):] for r, p in zip(rows, PROMPTS)] == [t[:n] for t, n in zip(truth, lengths)]
    # per-position counters: position 2+ only counted while one row ran alone (k = 4)
    assert engine.totals.proposed_per_pos[2] == sum(1 for b, n in proposed if b == 1 and n > 2)


@pytest.mark.parametrize("bad, message", [
    ([[0, 4, 2]], "must be positive"),
    ([[5, 4, 2]], "start <= end"),
    ([[2, 4, 2]], "must start at 1"),
    ([[1, 4, 9]], "between 0 and k=4"),
    ([[1, 4, 2], [4, 8, 1]], "overlaps"),
    ([[1, 4]], "three integers"),
    ([[1.5, 4, 2]], "three integers"),
])
def test_bad_schedule_refused(bad, message):
    with pytest.raises(UsageError, match=message):
        parse_schedule(bad, 4)


def test_gaps_and_tail_carry_the_previous_k_forward():
    """vLLM's lookup: [(1, 16, 3), (32, 128, 2)] gives 17..31 k = 3, and 129+ k = 2."""
    schedule = parse_schedule([[32, 128, 2], [1, 16, 3]], 4)
    engine_k = [k_for_batch(schedule, b, 4) for b in (1, 16, 17, 31, 32, 128, 129, 1000)]
    assert engine_k == [3, 3, 3, 3, 2, 2, 2, 2]
    assert k_for_batch([], 7, 4) == 4 and k_for_batch([[1, 8, 6]], 3, 4) == 4


def test_drafts_never_pass_the_model_length(tiny_target):
    prompt = PROMPTS[0]
    engine = make("ngram", tiny_target, None, 8, max_model_len=len(prompt) + 10)
    gen = engine.generate(prompt, 10)
    assert len(gen.tokens) == 10
    assert all(s.position - 1 + len(s.proposed) < len(prompt) + 10 for s in gen.steps)


@pytest.fixture(scope="module")
def sliding_pair():
    """A hybrid Qwen2: layer 0 full attention, layer 1 a 5-token sliding window."""
    torch.manual_seed(7)
    cfg = transformers.Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                   use_sliding_window=True, sliding_window=5, max_window_layers=1,
                                   initializer_range=0.05, tie_word_embeddings=False)
    target = transformers.Qwen2ForCausalLM(cfg).to(torch.float64).eval()
    assert set(target.config.layer_types) == {"full_attention", "sliding_attention"}
    return target


@pytest.mark.parametrize("batch", [1, 3])
def test_sliding_window_model_past_the_window(sliding_pair, batch):
    """Sequences far longer than the window, with rejections: the window is applied by
    position, so holes never shift it."""
    truth = [hf_greedy(sliding_pair, p, N) for p in PROMPTS[:batch]]
    gens = make("ngram", sliding_pair, None, 4).generate_batch(PROMPTS[:batch], N)
    assert [g.tokens for g in gens] == truth
    assert 0 < sum(g.stats.draft_tokens for g in gens)

"""Sampling-distribution statistics on simulated discrete distributions with a known truth.

Targets are Dirichlet distributions over a 50-token vocabulary; the source reports the top-K
(K = 5 or 20) of the target at every position. Speculative samplers are simulated in numpy:
a correct one must pass at the stated false-alarm rate, faulty ones must be rejected.
"""
import math
import subprocess
import sys
import numpy as np
import pytest
from scipy import stats
from specadapt.analysis.sampling_stats import (
    DrawArrays,
    TokenDraw,
    detectable_tv,
    encode_draws,
    merge_groups,
    pit_interval,
    randomized_pits,
    rank_test,
    samples_needed,
    sampling_verdict,
    verdict_from_arrays,
)
from specadapt.errors import UsageError
from specadapt.analysis.sampling_stats import samples_needed, sampling_verdict

VOCAB = 50
LN = math.log


# ---------------------------------------------------------------- simulation helpers

def targets(rng, n, conc=0.1, vocab=VOCAB):
    """n target distributions (rows); conc 0.1 is peaked like a language model's."""
    return rng.dirichlet(np.full(vocab, conc), size=n)


def sample(rng, p):
    """One token per row of p."""
    c = p.cumsum(axis=1)
    u = rng.random(p.shape[0])[:, None]
    return np.minimum((u >= c).sum(axis=1), p.shape[1] - 1)


def to_arrays(p, tokens, k):
    """What encode_draws makes of a source reporting the top-k of p (no ties in continuous p)."""
    n = p.shape[0]
    order = np.argsort(-p, axis=1, kind="stable")
    rank_of = np.empty_like(order)
    np.put_along_axis(rank_of, order, np.broadcast_to(np.arange(p.shape[1]), p.shape).copy(), axis=1)
    r = rank_of[np.arange(n), tokens]
    return DrawArrays(np.take_along_axis(p, order, axis=1)[:, :k], np.where(r < k, r, -1), np.zeros(n, bool))


def to_draws(p, tokens, k):
    draws = []
    for t, (row, tok) in enumerate(zip(p, tokens)):
        ids = np.argsort(-row, kind="stable")[:k]
        draws.append(TokenDraw(top={int(i): LN(row[i]) for i in ids}, token=int(tok),
                               logprob=LN(row[tok]), position=t, prompt_id="p"))
    return draws


def ngram_proposals(rng, p, hit=0.5):
    """One-hot drafts as an n-gram proposer makes them: the target's top token half the time,
    otherwise a token of the vocabulary at random."""
    n, vocab = p.shape
    return np.where(rng.random(n) < hit, p.argmax(axis=1), rng.integers(0, vocab, n))


def without(p, d):
    """max(0, p - onehot(d)) renormalised: p with the draft token removed."""
    res = p.copy()
    res[np.arange(p.shape[0]), d] = 0.0
    return res / res.sum(axis=1, keepdims=True)


def ngram_step(rng, p, residual_is_p=False):
    """Each position: draft d, accepted with probability p(d); on reject sample the residual."""
    rows = np.arange(p.shape[0])
    d = ngram_proposals(rng, p)
    accepted = rng.random(p.shape[0]) < p[rows, d]
    return np.where(accepted, d, sample(rng, p if residual_is_p else without(p, d)))


def draft_model_step(rng, p, draft_temperature=1.0):
    """A draft distribution q; proposals drawn from q at ``draft_temperature`` while accept/reject
    uses q itself: min(1, p/q) and the residual max(0, p - q)."""
    n, vocab = p.shape
    rows = np.arange(n)
    q = 0.6 * p + 0.4 * targets(rng, n, conc=0.3, vocab=vocab)
    tempered = q ** (1 / draft_temperature)
    d = sample(rng, tempered / tempered.sum(axis=1, keepdims=True))
    accepted = rng.random(n) < np.minimum(1.0, p[rows, d] / q[rows, d])
    residual = np.maximum(p - q, 0.0)
    return np.where(accepted, d, sample(rng, residual / residual.sum(axis=1, keepdims=True)))


def ngram_with_bonus(rng, p, bonus_from_previous=False):
    """Steps of one one-hot draft: accepted (prob p_s(d)) -> the draft, then a bonus token for
    position s + 1 from p_{s+1} (faulty: from p_s); rejected -> a residual sample."""
    n = p.shape[0]
    out = np.empty(n, dtype=np.int64)
    d_all, u_all = ngram_proposals(rng, p), rng.random(n)
    s = 0
    while s < n:
        d = d_all[s]
        if u_all[s] < p[s, d]:
            out[s] = d
            if s + 1 < n:
                out[s + 1] = sample(rng, p[s if bonus_from_previous else s + 1][None])[0]
            s += 2
        else:
            out[s] = sample(rng, without(p[s:s + 1], np.array([d])))[0]
            s += 1
    return out


def markov_runs(rng, runs, n, conc=0.1, vocab=30):
    """``runs`` completions of n tokens from Markov chains (each run its own transition matrix):
    the distribution at a position depends on the token before it. Returns p [runs, n, vocab]
    and tokens [runs, n]."""
    chains = rng.dirichlet(np.full(vocab, conc), size=(runs, vocab))
    p = np.empty((runs, n, vocab))
    tokens = np.empty((runs, n), dtype=np.int64)
    prev = rng.integers(0, vocab, runs)
    for t in range(n):
        p[:, t] = chains[np.arange(runs), prev]
        tokens[:, t] = prev = sample(rng, p[:, t])
    return p, tokens


# ---------------------------------------------------------------- pit_interval

def test_pit_interval_of_a_top_k_token_is_its_slice_in_descending_order():
    top = {9: LN(0.1), 5: LN(0.5), 7: LN(0.3)}
    assert pit_interval(TokenDraw(top=top, token=5)) == pytest.approx((0.0, 0.5))
    assert pit_interval(TokenDraw(top=top, token=7)) == pytest.approx((0.5, 0.8))
    assert pit_interval(TokenDraw(top=top, token=9)) == pytest.approx((0.8, 0.9))


def test_pit_interval_outside_the_top_k_is_the_lumped_rest():
    top = {9: LN(0.1), 5: LN(0.5), 7: LN(0.3)}
    assert pit_interval(TokenDraw(top=top, token=123)) == pytest.approx((0.9, 1.0))
    assert pit_interval(TokenDraw(top={}, token=4)) == (0.0, 1.0)


def test_pit_interval_breaks_ties_by_token_id_not_insertion_order():
    top = {3: LN(0.25), 1: LN(0.25), 8: LN(0.5)}
    assert pit_interval(TokenDraw(top=top, token=1)) == pytest.approx((0.5, 0.75))
    assert pit_interval(TokenDraw(top=top, token=3)) == pytest.approx((0.75, 1.0))


def test_pit_interval_caps_a_top_k_sum_rounded_above_one():
    top = {0: LN(0.6), 1: LN(0.3), 2: LN(0.1000004)}
    assert pit_interval(TokenDraw(top=top, token=1)) == pytest.approx((0.6, 0.9))
    lo, hi = pit_interval(TokenDraw(top=top, token=2))
    assert lo == pytest.approx(0.9) and hi == 1.0
    assert pit_interval(TokenDraw(top=top, token=77)) == (1.0, 1.0)


def test_full_vocab_is_normalised_and_has_no_rest_bucket():
    top = {0: LN(0.2), 1: LN(0.2), 2: LN(0.4)}  # sums to 0.8
    assert pit_interval(TokenDraw(top=top, token=2, full_vocab=True)) == pytest.approx((0.0, 0.5))
    assert pit_interval(TokenDraw(top=top, token=1, full_vocab=True)) == pytest.approx((0.75, 1.0))
    # the same numbers as a top-K leave 0.2 to the rest
    assert pit_interval(TokenDraw(top=top, token=1)) == pytest.approx((0.6, 0.8))
    assert pit_interval(TokenDraw(top=top, token=5)) == pytest.approx((0.8, 1.0))


def test_tokens_of_probability_zero_are_marked():
    top = {0: LN(0.5), 1: LN(0.5), 2: -math.inf}
    arrays = encode_draws([
        TokenDraw(top=top, token=2),                                   # -inf in the top-K
        TokenDraw(top=top, token=9, full_vocab=True),                  # not in a full vocabulary
        TokenDraw(top={0: LN(0.5)}, token=9, logprob=-math.inf),       # its own logprob says zero
        TokenDraw(top={0: LN(0.5)}, token=9, logprob=LN(0.01)),        # in the rest: possible
        TokenDraw(top=top, token=1, logprob=LN(0.5)),                  # possible
    ])
    assert arrays.zero_probability.tolist() == [True, True, True, False, False]
    assert arrays.rank.tolist() == [2, -1, -1, -1, 1]
    assert pit_interval(TokenDraw(top=top, token=2)) == (1.0, 1.0)


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_a_value_that_is_no_log_probability_is_refused(bad):
    with pytest.raises(ValueError, match=r"log-probability .* at position 3 of prompt 'q7' is not a log-prob"):
        encode_draws([TokenDraw(top={0: bad}, token=0, position=3, prompt_id="q7")])
    with pytest.raises(ValueError, match="is not a log-probability"):
        encode_draws([TokenDraw(top={0: -1.0}, token=0, logprob=bad)])


def test_a_full_vocabulary_without_mass_is_refused():
    with pytest.raises(ValueError, match="full-vocabulary draw at position 4 of prompt 'x' has no probability"):
        encode_draws([TokenDraw(top={0: -math.inf}, token=0, full_vocab=True, position=4, prompt_id="x")])


def test_encode_draws_pads_to_the_widest_top_k_and_sorts_each_row():
    arrays = encode_draws([TokenDraw(top={4: LN(0.1), 2: LN(0.7)}, token=4),
                           TokenDraw(top={1: LN(0.2), 3: LN(0.3), 5: LN(0.4)}, token=1)])
    assert arrays.probs == pytest.approx(np.array([[0.7, 0.1, 0.0], [0.4, 0.3, 0.2]]))
    assert arrays.rank.tolist() == [1, 2]
    assert encode_draws([]).probs.shape == (0, 0)


def test_simulation_helper_encodes_as_encode_draws_does():
    rng = np.random.default_rng(3)
    p = targets(rng, 300, conc=0.5)
    tokens = sample(rng, p)
    for k in (5, 20):
        mine, theirs = to_arrays(p, tokens, k), encode_draws(to_draws(p, tokens, k))
        assert np.array_equal(mine.rank, theirs.rank)
        assert np.allclose(mine.probs, theirs.probs)
        assert (mine.rank == -1).any() and (mine.rank >= 0).any()


# ---------------------------------------------------------------- randomised PITs

def test_randomized_pits_are_f_minus_plus_v_times_the_width_with_v_from_the_seed():
    draws = [TokenDraw(top={0: LN(0.5), 1: LN(0.3)}, token=t) for t in (0, 1, 9, 1)]
    v = np.random.default_rng(42).random(len(draws))
    lo, hi = np.array([pit_interval(d) for d in draws]).T
    assert np.allclose(randomized_pits(draws, seed=42), lo + v * (hi - lo))
    assert not np.allclose(randomized_pits(draws, seed=43), randomized_pits(draws, seed=42))
    assert np.array_equal(randomized_pits(draws), randomized_pits(draws, seed=0))


def test_defaults_are_alpha_001_bins_20_power_08_seed_0():
    rng = np.random.default_rng(9)
    p = targets(rng, 150)
    tokens = sample(rng, p)
    arrays, draws = to_arrays(p, tokens, 5), to_draws(p, tokens, 5)
    explicit = dict(alpha=0.01, bins=20, seed=0, power=0.8, tv_targets=(0.01, 0.02, 0.05))
    v = verdict_from_arrays(arrays)
    assert v.model_dump() == verdict_from_arrays(arrays, **explicit).model_dump()
    assert sampling_verdict(draws).model_dump() == sampling_verdict(draws, **explicit).model_dump()
    assert (v.alpha, v.bins, v.seed, v.power) == (0.01, 20, 0, 0.8)
    assert [t.tv for t in v.samples_needed] == [0.01, 0.02, 0.05]
    assert detectable_tv(1000, 0.01) == detectable_tv(1000, 0.01, 0.8, 20)
    assert samples_needed(0.05, 0.01) == samples_needed(0.05, 0.01, 0.8, 20)


def test_pits_of_discrete_targets_are_uniform_and_the_lumped_rest_is_needed():
    rng = np.random.default_rng(7)
    p = targets(rng, 4000, conc=0.3)
    tokens = sample(rng, p)
    u = randomized_pits(to_draws(p, tokens, 5), seed=1)
    assert stats.kstest(u, "uniform").pvalue > 0.01
    assert u.min() >= 0 and u.max() <= 1
    # non-randomised (the upper end F(x)) is far from uniform: the randomisation matters
    hi = np.array([pit_interval(d)[1] for d in to_draws(p[:500], tokens[:500], 5)])
    assert stats.kstest(hi, "uniform").pvalue < 1e-6


# ---------------------------------------------------------------- the rank test

@pytest.mark.parametrize(("expected", "groups"), [
    ([10, 10, 10], [[0], [1], [2]]),
    ([1, 10, 10], [[0, 1], [2]]),                 # the first merges right
    ([10, 10, 1], [[0], [1, 2]]),                 # the last merges left
    ([10, 2, 3, 10], [[0], [1, 2], [3]]),         # into the smaller neighbour; 5 is enough
    ([3, 2, 10], [[0, 1], [2]]),
    ([6, 1, 6, 10, 10], [[0, 1], [2], [3], [4]]),  # a tie goes left
    ([4.9, 10], [[0, 1]]),
    ([5, 10], [[0], [1]]),
    ([1, 1, 1], [[0, 1, 2]]),                     # never fewer than one group
    ([], []),
])
def test_merge_groups(expected, groups):
    assert merge_groups(expected) == groups


def test_merge_groups_threshold_is_a_parameter():
    assert merge_groups([7, 7, 9], min_expected=8) == [[0, 1], [2]]
    assert merge_groups([7, 7, 9]) == [[0], [1], [2]]


def test_rank_statistic_with_one_distribution_is_pearsons_chi_square():
    # With p_t = p at every position, Sigma = n (diag p - p p^T), and (O - E)^T Sigma^+ (O - E) is
    # exactly Pearson's sum (O - E)^2 / E with C - 1 dof.
    p = np.array([0.4, 0.25, 0.2, 0.1, 0.05])
    cats = np.repeat(np.arange(5), [50, 20, 22, 12, 16])
    cat_probs = np.tile(p, (cats.size, 1))
    stat, dof, pval, groups = rank_test(cat_probs, cats)
    pearson = stats.chisquare(np.bincount(cats), p * cats.size)
    assert (stat, dof, pval) == pytest.approx((pearson.statistic, 4, pearson.pvalue))
    assert groups == [[0], [1], [2], [3], [4]]


def test_rank_statistic_runs_over_merged_groups():
    p = np.array([0.5, 0.3, 0.14, 0.0, 0.06])  # ranks 6-K empty: merged with outside (6 expected)
    cats = np.repeat([0, 1, 2, 4], [45, 35, 12, 8])
    stat, dof, pval, groups = rank_test(np.tile(p, (100, 1)), cats)
    pearson = stats.chisquare([45, 35, 12, 8], [50, 30, 14, 6])
    assert groups == [[0], [1], [2], [3, 4]]
    assert (stat, dof, pval) == pytest.approx((pearson.statistic, 3, pearson.pvalue))


def test_rank_statistic_with_an_unobserved_last_group():
    p = np.array([0.5, 0.25, 0.15, 0.04, 0.06])
    cats = np.repeat([0, 1, 2], [55, 27, 18])  # nothing beyond rank 5; ranks 6-K merged into outside
    stat, dof, pval, groups = rank_test(np.tile(p, (100, 1)), cats)
    pearson = stats.chisquare([55, 27, 18, 0], [50, 25, 15, 10])
    assert groups == [[0], [1], [2], [3, 4]]
    assert (stat, dof, pval) == pytest.approx((pearson.statistic, 3, pearson.pvalue))


def test_rank_test_of_no_tokens_has_no_degrees_of_freedom():
    assert rank_test(np.zeros((0, 5)), np.zeros(0, dtype=np.int64)) == (0.0, 0, 1.0, [[0, 1, 2, 3, 4]])


def test_rows_summing_to_one_only_up_to_rounding_add_no_degree_of_freedom():
    # Sigma's eigenvalue along (1, ..., 1) is ~ n (1 - sum p) / 5 = 2e-9 here: far below
    # 1e-10 n = 1e-5, so it is null space, not a fifth degree of freedom.
    n = 100_000
    p = np.array([0.4, 0.3, 0.2, 0.06, 0.04]) * (1 - 1e-13)
    cats = np.repeat(np.arange(5), [40_100, 29_900, 20_000, 6_000, 4_000])
    stat, dof, pval, _ = rank_test(np.tile(p, (n, 1)), cats)
    pearson = stats.chisquare(np.bincount(cats), p / p.sum() * n)
    assert dof == 4
    assert (stat, pval) == pytest.approx((pearson.statistic, pearson.pvalue), rel=1e-6)


def test_rank_test_without_variance_has_no_degrees_of_freedom():
    cat_probs = np.tile([1.0, 0, 0, 0, 0], (200, 1))
    assert rank_test(cat_probs, np.zeros(200, dtype=np.int64)) == (0.0, 0, 1.0, [[0, 1, 2, 3, 4]])


def test_deterministic_positions_add_no_degrees_of_freedom():
    # Half the positions are certain (rank 1 with probability 1): they add nothing to Sigma, and
    # the statistic is the one of the uncertain half alone.
    p = np.array([0.4, 0.3, 0.2, 0.06, 0.04])
    cats = np.repeat(np.arange(5), [85, 58, 38, 11, 8])
    alone = rank_test(np.tile(p, (200, 1)), cats)
    sure = np.zeros((100, 5))
    sure[:, 0] = 1.0
    both = rank_test(np.vstack([np.tile(p, (200, 1)), sure]), np.concatenate([cats, np.zeros(100, np.int64)]))
    assert both[:3] == pytest.approx(alone[:3])
    assert both[1] == 4


# ---------------------------------------------------------------- the verdict

def uniform_runs(rng, n, probs_per_bin):
    """Tokens over ``len(probs_per_bin)`` equally likely tokens (full vocabulary): token i's PIT
    interval is exactly bin i, so ``probs_per_bin`` is the binned PIT distribution."""
    bins = len(probs_per_bin)
    tokens = rng.choice(bins, size=n, p=probs_per_bin)
    return DrawArrays(np.full((n, bins), 1.0 / bins), tokens, np.zeros(n, bool))


def test_verdict_on_draws_is_the_verdict_on_their_arrays():
    rng = np.random.default_rng(5)
    p = targets(rng, 400)
    tokens = sample(rng, p)
    draws = to_draws(p, tokens, 20)
    a = sampling_verdict(draws, alpha=0.05, seed=3)
    b = verdict_from_arrays(encode_draws(draws), alpha=0.05, seed=3)
    assert a.model_dump() == b.model_dump()
    assert a.pit_histogram == np.bincount(
        np.minimum((randomized_pits(draws, seed=3) * 20).astype(int), 19), minlength=20).tolist()


def test_consistent_verdict_reports_everything():
    rng = np.random.default_rng(8)
    p = targets(rng, 600, conc=0.5)
    v = verdict_from_arrays(to_arrays(p, sample(rng, p), 20), alpha=0.03, power=0.9, bins=10,
                            tv_targets=(0.02, 0.1))
    assert v.status == "consistent" and v.passed
    assert v.n_tokens == 600 and v.min_tokens == 50 and v.bins == 10
    assert v.alpha == 0.03 and v.per_test_alpha == pytest.approx(0.01) and v.power == 0.9
    assert [t.name for t in v.tests] == ["pit-chi-square", "pit-ks", "rank-chi-square"]
    assert [t.dof for t in v.tests] == [9, None, 4]
    assert all(t.p_value > 0.01 and not t.rejected for t in v.tests)
    assert sum(v.pit_histogram) == 600 and len(v.pit_histogram) == 10 and v.pit_expected_per_bin == 60
    assert [c.name for c in v.rank_categories] == ["rank 1", "rank 2", "ranks 3-5", "ranks 6-K", "outside top-K"]
    assert sum(c.observed for c in v.rank_categories) == 600
    assert sum(c.expected for c in v.rank_categories) == pytest.approx(600)
    assert v.rank_test_groups == ["rank 1", "rank 2", "ranks 3-5", "ranks 6-K", "outside top-K"]
    assert v.detectable_tv == pytest.approx(detectable_tv(600, 0.01, 0.9, 10))
    assert [(t.tv, t.samples_needed) for t in v.samples_needed] == [
        (0.02, samples_needed(0.02, 0.01, 0.9, 10)), (0.1, samples_needed(0.1, 0.01, 0.9, 10))]
    assert v.zero_probability_tokens == 0
    assert v.summary == (f"consistent with the target distribution: no test rejects at family-wise alpha 0.03 "
                         f"on 600 tokens; a binned-PIT TV of {v.detectable_tv:.3g} or more would be caught "
                         f"with power 0.9")


def test_top1_z_is_the_standardised_rank_1_excess():
    probs = np.tile([0.5, 0.3, 0.2], (400, 1))
    rank = np.repeat([0, 1, 2], [230, 100, 70])
    v = verdict_from_arrays(DrawArrays(probs, rank, np.zeros(400, bool)))
    assert v.top1_z == pytest.approx((230 - 200) / math.sqrt(400 * 0.25))
    assert [(c.name, c.observed) for c in v.rank_categories] == [
        ("rank 1", 230), ("rank 2", 100), ("ranks 3-5", 70), ("ranks 6-K", 0), ("outside top-K", 0)]
    assert v.rank_categories[0].observed == 230 and v.rank_categories[0].expected == pytest.approx(200)
    # ranks 3-5 holds rank 3 only; ranks 6-K and outside are empty and merged away
    assert v.rank_test_groups == ["rank 1", "rank 2", "ranks 3-5+ranks 6-K+outside top-K"]
    sure = verdict_from_arrays(DrawArrays(np.ones((400, 1)), np.zeros(400, np.int64), np.zeros(400, bool)))
    assert sure.top1_z is None


def test_rank_categories_bounds():
    # one token at each rank 1..7 and one outside, K = 7
    probs = np.tile(np.full(7, 0.125), (8, 1))
    rank = np.array([0, 1, 2, 3, 4, 5, 6, -1])
    v = verdict_from_arrays(DrawArrays(probs, rank, np.zeros(8, bool)))
    assert [c.observed for c in v.rank_categories] == [1, 1, 3, 2, 1]
    assert [c.expected for c in v.rank_categories] == pytest.approx([1, 1, 3, 2, 1])
    assert v.top1_z == 0.0  # rank-1 variance 8 * 0.125 * 0.875 = 0.875: small, but not zero


def test_pit_histogram_has_every_bin_and_puts_u_equal_one_in_the_last():
    # all tokens in the first bin: the other 19 bins are there, empty
    v = verdict_from_arrays(uniform_runs(np.random.default_rng(0), 100, np.eye(20)[0]))
    assert v.pit_histogram == [100] + [0] * 19
    assert v.status == "inconsistent" and all(t.rejected for t in v.tests[:2])
    # a token outside a top-K that sums to 1 has U = 1 exactly
    top = {0: LN(0.6), 1: LN(0.4000001)}
    draws = [TokenDraw(top=top, token=5)] + [TokenDraw(top=top, token=0)] * 3
    assert randomized_pits(draws)[0] == 1.0
    assert sampling_verdict(draws, bins=4).pit_histogram[3] == 1
    assert len(sampling_verdict(draws, bins=4).pit_histogram) == 4


def test_too_few_tokens_decide_nothing_and_do_not_pass():
    rng = np.random.default_rng(2)
    p = targets(rng, 100)
    arrays = to_arrays(p, sample(rng, p), 5)
    short = DrawArrays(arrays.probs[:99], arrays.rank[:99], arrays.zero_probability[:99])
    v = verdict_from_arrays(short)
    assert v.status == "too-few" and not v.passed and v.tests == [] and v.rank_test_groups == []
    assert v.min_tokens == 100 and sum(v.pit_histogram) == 99
    assert v.summary == ("too few tokens: 99 sampled, 100 needed (5 expected per PIT bin over 20 bins); "
                         "nothing was checked")
    at_floor = verdict_from_arrays(arrays)
    assert at_floor.status == "consistent" and len(at_floor.tests) == 3
    assert verdict_from_arrays(short, bins=19).status == "consistent"  # 95 needed
    empty = sampling_verdict([])
    assert empty.status == "too-few" and empty.detectable_tv is None and empty.top1_z is None


def test_a_token_of_probability_zero_is_inconsistent_at_any_count():
    top = {0: LN(0.5), 1: LN(0.5)}
    v = sampling_verdict([TokenDraw(top=top, token=0), TokenDraw(top=top, token=2, full_vocab=True)])
    assert v.status == "inconsistent" and not v.passed and v.zero_probability_tokens == 1
    assert v.summary == ("inconsistent with the target distribution: 1 of 2 sampled tokens have "
                         "probability zero under the source")
    rng = np.random.default_rng(4)
    p = targets(rng, 500)
    arrays = to_arrays(p, sample(rng, p), 20)
    assert verdict_from_arrays(arrays).passed
    zero = arrays.zero_probability.copy()
    zero[7] = True
    v = verdict_from_arrays(arrays._replace(zero_probability=zero))
    assert v.status == "inconsistent" and all(not t.rejected for t in v.tests)


def test_importing_the_module_does_not_import_scipy():
    code = ("import sys; import specadapt.analysis.sampling_stats; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'scipy'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]"


def test_a_test_rejects_at_a_p_value_equal_to_the_per_test_alpha(monkeypatch):
    rng = np.random.default_rng(6)
    p = targets(rng, 300)
    arrays = to_arrays(p, sample(rng, p), 20)
    real = stats.kstest

    def ks_at(pvalue):
        def fake(u, dist):
            res = real(u, dist)
            return type("R", (), {"statistic": res.statistic, "pvalue": pvalue})()
        return fake

    monkeypatch.setattr(stats, "kstest", ks_at(0.3 / 3))
    v = verdict_from_arrays(arrays, alpha=0.3)
    assert v.tests[1].rejected and v.status == "inconsistent" and not v.passed
    assert v.summary == ("inconsistent with the target distribution: pit-ks p=0.1 <= 0.1 (alpha 0.3 over 3 tests) "
                         "on 300 tokens")
    monkeypatch.setattr(stats, "kstest", ks_at(0.3 / 3 * 1.0001))
    assert verdict_from_arrays(arrays, alpha=0.3).passed


@pytest.mark.slow
def test_false_alarm_rate_is_alpha_over_three_per_test_and_at_most_alpha_in_all():
    # 1500 null runs of 200 tokens whose distributions depend on the previous token (Markov
    # chains), K alternating 5 / 20. Each test alone rejects at alpha / 3 = 0.05: binomial sd
    # 0.0056, so [0.0275, 0.0725] is +-4 sd and excludes both half (0.025) and double (0.1).
    # Bonferroni bounds the family at alpha = 0.15 (measured ~0.8 alpha: the tests overlap).
    rng = np.random.default_rng(2026)
    runs, n, alpha = 1500, 200, 0.15
    rejected = np.zeros(3)
    family = 0
    for chunk in range(0, runs, 250):
        p, tokens = markov_runs(rng, 250, n)
        for r in range(250):
            v = verdict_from_arrays(to_arrays(p[r], tokens[r], 5 if r % 2 else 20), alpha=alpha,
                                    seed=chunk + r)
            rejected += [t.rejected for t in v.tests]
            family += not v.passed
    rates = rejected / runs
    assert np.all((rates >= 0.0275) & (rates <= 0.0725)), rates
    assert 0.0725 <= family / runs <= alpha + 0.035, family / runs


# ---------------------------------------------------------------- power

def test_samples_needed_and_detectable_tv_are_inverse():
    for alpha, bins, power in ((0.01 / 3, 20, 0.8), (0.05, 10, 0.9), (0.001, 40, 0.5)):
        for tv in (0.01, 0.02, 0.05):
            n = samples_needed(tv, alpha, power, bins)
            assert detectable_tv(n, alpha, power, bins) <= tv < detectable_tv(n - 1, alpha, power, bins)
    # 1 / sqrt(n) scaling: four times the tokens halve the detectable TV
    assert detectable_tv(4000, 0.01, 0.8, 20) == pytest.approx(detectable_tv(1000, 0.01, 0.8, 20) / 2)


def test_samples_needed_is_never_below_the_too_few_floor():
    assert detectable_tv(100, 0.01, 0.8, 20) < 0.5
    assert samples_needed(0.5, 0.01, 0.8, 20) == 100
    assert samples_needed(0.5, 0.01, 0.8, 30) == 150


def test_detectable_tv_is_where_the_worst_case_noncentrality_gives_the_power():
    for n, alpha, power, bins in ((1000, 0.01, 0.8, 20), (50, 0.2, 0.25, 4), (10**6, 1e-4, 0.99, 50)):
        tv = detectable_tv(n, alpha, power, bins)
        crit = stats.chi2.isf(alpha, bins - 1)
        assert stats.ncx2.sf(crit, bins - 1, 4 * n * tv * tv) == pytest.approx(power, abs=1e-9)


def test_an_evenly_spread_deviation_of_the_detectable_tv_is_caught_with_the_stated_power():
    # Binned PIT probabilities 1/B +- 2 tv / B (TV exactly tv, the Cauchy-Schwarz worst case) at
    # n = samples_needed(tv): the chi-square rejects in `power` of runs. 4000 runs: sd 0.0063.
    rng = np.random.default_rng(11)
    bins, alpha, power = 20, 0.01 / 3, 0.8
    for tv in (0.02, 0.05):
        n = samples_needed(tv, alpha, power, bins)
        even = np.full(bins, 1 / bins) + np.tile([1, -1], bins // 2) * 2 * tv / bins
        assert 0.5 * np.abs(even - 1 / bins).sum() == pytest.approx(tv)
        counts = rng.multinomial(n, even, size=4000)
        rate = np.mean(stats.chisquare(counts, axis=1).pvalue <= alpha)
        assert abs(rate - power) < 0.03, (tv, n, rate)
        # any other shape of the same TV is caught more often: all of it in two bins
        lumpy = np.full(bins, 1 / bins)
        lumpy[0] += tv
        lumpy[1] -= tv
        rate_lumpy = np.mean(stats.chisquare(rng.multinomial(n, lumpy, size=4000), axis=1).pvalue <= alpha)
        assert rate_lumpy > power + 0.1


@pytest.mark.slow
def test_the_verdict_catches_the_detectable_tv_with_at_least_the_stated_power():
    # End to end: tokens whose binned PIT deviates by exactly the TV the verdict says it detects;
    # its PIT chi-square rejects in ~`power` of runs (300 runs: sd 0.023) and the family in at
    # least as many.
    rng = np.random.default_rng(12)
    bins, alpha, power, tv = 20, 0.01, 0.8, 0.05
    n = samples_needed(tv, alpha / 3, power, bins)
    even = np.full(bins, 1 / bins) + np.tile([1, -1], bins // 2) * 2 * tv / bins
    chi = family = 0
    for seed in range(300):
        v = verdict_from_arrays(uniform_runs(rng, n, even), alpha=alpha, power=power, seed=seed)
        chi += v.tests[0].rejected
        family += not v.passed
    assert v.detectable_tv <= tv
    assert abs(chi / 300 - power) < 0.08, chi
    assert family >= chi


@pytest.mark.parametrize(("call", "message"), [
    (lambda: detectable_tv(100, 0.0), "alpha must be between 0 and 1, got 0.0: give a false-alarm rate such as 0.01"),
    (lambda: detectable_tv(100, 1.0), "alpha must be between 0 and 1, got 1.0"),
    (lambda: detectable_tv(100, 0.1, power=0.1),
     r"power must be above alpha \(0.1\) and below 1, got 0.1: give e.g. 0.8"),
    (lambda: detectable_tv(100, 0.1, power=1.0), "power must be above alpha"),
    (lambda: detectable_tv(100, 0.1, bins=1), "bins must be an integer of at least 2, got 1: give e.g. 20"),
    (lambda: detectable_tv(100, 0.1, bins=2.0), "bins must be an integer of at least 2, got 2.0"),
    (lambda: detectable_tv(100, 0.1, bins=True), "bins must be an integer of at least 2, got True"),
    (lambda: detectable_tv(0, 0.1), "the number of tokens must be at least 1, got 0"),
    (lambda: samples_needed(0.0, 0.1), r"a total-variation distance must be in \(0, 1\], got 0.0: give e.g. 0.02"),
    (lambda: samples_needed(1.01, 0.1), "a total-variation distance must be in"),
    (lambda: samples_needed(0.1, 2.0), "alpha must be between 0 and 1"),
    (lambda: sampling_verdict([], alpha=1.5), "alpha must be between 0 and 1"),
    (lambda: sampling_verdict([], power=0.005), "power must be above alpha"),
    (lambda: sampling_verdict([], bins=1), "bins must be an integer"),
    (lambda: sampling_verdict([], tv_targets=(0.0,)), "a total-variation distance must be in"),
])
def test_bad_parameters_say_what_is_wrong(call, message):
    with pytest.raises(UsageError, match=message):
        call()


def test_boundary_parameters_are_accepted():
    assert detectable_tv(1, 0.5, power=0.51, bins=2) > 0
    assert samples_needed(1.0, 0.01, bins=2) == 10
    assert detectable_tv(1, 1e-9, power=1 - 1e-9) > detectable_tv(1, 0.01)


# ---------------------------------------------------------------- simulated speculative samplers

N_FAULT = 1000
FAULT_RUNS = 20


def rejection_rate(step, k, seed, n=N_FAULT):
    rng = np.random.default_rng(seed)
    rejected = 0
    for run in range(FAULT_RUNS):
        p = targets(rng, n)
        rejected += not verdict_from_arrays(to_arrays(p, step(rng, p), k), seed=run).passed
    return rejected / FAULT_RUNS


@pytest.mark.parametrize("k", [5, 20])
@pytest.mark.parametrize(("name", "step"), [
    ("n-gram", ngram_step),
    ("n-gram with bonus tokens", ngram_with_bonus),
    ("draft model", draft_model_step),
])
def test_correct_speculative_samplers_pass(name, step, k):
    assert rejection_rate(step, k, seed=100 + k) <= 0.1


@pytest.mark.parametrize("k", [5, 20])
@pytest.mark.parametrize(("name", "step"), [
    ("residual p instead of max(0, p - q)", lambda rng, p: ngram_step(rng, p, residual_is_p=True)),
    ("bonus token from the previous position", lambda rng, p: ngram_with_bonus(rng, p, bonus_from_previous=True)),
    ("proposals at temperature 0.5, q at 1", lambda rng, p: draft_model_step(rng, p, draft_temperature=0.5)),
])
def test_faulty_speculative_samplers_are_rejected_at_a_thousand_tokens(name, step, k):
    assert rejection_rate(step, k, seed=200 + k) >= 0.9


def test_the_temperature_fault_is_caught_at_two_hundred_tokens():
    step = lambda rng, p: draft_model_step(rng, p, draft_temperature=0.5)  # noqa: E731
    assert rejection_rate(step, 5, seed=7, n=200) >= 0.9


# Sampling statistics edges: parameters refused before anything is computed with them.
#
# An alpha of 0 makes the chi-square's critical value infinite, so the power computation could
# never finish: it must be refused up front, also where no power figure would be computed
# (no tokens, no TV targets) and before the other parameters are looked at.
ALPHA_0 = "alpha must be between 0 and 1, got 0.0: give a false-alarm rate such as 0.01"


def test_alpha_zero_is_refused_even_when_no_power_figure_is_asked_for():
    with pytest.raises(UsageError) as err:
        sampling_verdict([], alpha=0.0, tv_targets=())
    assert str(err.value) == ALPHA_0


def test_alpha_is_checked_before_the_total_variation_target():
    with pytest.raises(UsageError) as err:
        samples_needed(0.0, 0.0)
    assert str(err.value) == ALPHA_0

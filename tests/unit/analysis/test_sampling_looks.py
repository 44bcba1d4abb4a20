"""equiv --sampling --until-decided without servers: the alpha split, the batches of the looks, when a
run stops, the outcome in words and the report it gives (analysis/sampling_check.py, sampling_stats.py)."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from specadapt.analysis import sampling_check as C
from specadapt.analysis.sampling_stats import look_alphas, sampling_verdict
from specadapt.errors import UsageError
from specadapt.records import Prompt, ServerInfo
from specadapt.records.sampling import SamplingStats
from specadapt.records.sampling_report import SamplingLook, SamplingSettings
from tests.unit.orchestration.test_sampling import simulated as markov


# --- the alpha split ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("alpha", [0.001, 0.01, 0.05, 0.2])
@pytest.mark.parametrize("looks", range(1, 13))
def test_the_looks_alphas_add_up_to_at_most_alpha_and_the_last_keeps_half(alpha, looks):
    alphas = look_alphas(alpha, looks)
    assert len(alphas) == looks and all(a > 0 for a in alphas)
    assert math.fsum(alphas) <= alpha * (1 + 1e-12)
    assert math.fsum(alphas) == pytest.approx(alpha, rel=1e-12)  # nothing left unspent
    assert alphas[-1] == pytest.approx(alpha if looks == 1 else alpha / 2, rel=1e-15)


def test_four_looks_by_hand():
    # 0.01 / (2 * 3) = 0.001666..., three times, then 0.01 / 2
    assert look_alphas(0.01, 4) == pytest.approx([0.0016666666666666668] * 3 + [0.005], rel=1e-15)
    assert look_alphas(0.05, 2) == pytest.approx([0.025, 0.025], rel=1e-15)


@pytest.mark.parametrize("alpha, looks, said", [(0.0, 4, "alpha must be between 0 and 1"),
                                                (1.0, 4, "alpha must be between 0 and 1"),
                                                (0.01, 0, "looks must be an integer of at least 1"),
                                                (0.01, True, "looks must be an integer of at least 1"),
                                                (0.01, 2.0, "looks must be an integer of at least 1")])
def test_a_split_of_nothing_is_refused(alpha, looks, said):
    with pytest.raises(UsageError, match=said):
        look_alphas(alpha, looks)


# --- the batches --------------------------------------------------------------------------------------------
def inputs(*ids: str) -> list[C.PromptInput]:
    return [C.PromptInput(prompt=Prompt(id=i, prompt="x"), ids=(1,), max_tokens=4) for i in ids]


def test_the_batches_take_the_prompts_in_turn_and_keep_the_fixed_designs_indices_and_seeds():
    batches = C.look_batches(inputs("a", "b"), samples=8, seed=100, looks=4)
    # plan_samples numbers a's samples 0-7 and b's 8-15; each batch takes two of each, in turn
    assert [[(inp.prompt.id, n) for inp, n, _ in b] for b in batches] == [
        [("a", 0), ("b", 8), ("a", 1), ("b", 9)], [("a", 2), ("b", 10), ("a", 3), ("b", 11)],
        [("a", 4), ("b", 12), ("a", 5), ("b", 13)], [("a", 6), ("b", 14), ("a", 7), ("b", 15)]]
    assert all(s == 100 + n for b in batches for _, n, s in b)
    flat = sorted(((inp.prompt.id, n, s) for b in batches for inp, n, s in b), key=lambda t: t[1])
    assert flat == [(inp.prompt.id, n, s) for inp, n, s in C.plan_samples(inputs("a", "b"), 8, 100)]


@pytest.mark.parametrize("n_prompts, samples, looks, sizes", [
    (2, 5, 4, [2, 3, 2, 3]),   # 10 samples: cut at 10 * i // 4 = 0, 2, 5, 7, 10
    (1, 3, 4, [1, 1, 1]),      # fewer samples than looks: one look per sample, none empty
    (3, 4, 1, [12]),
    (1, 1, 4, [1]),
])
def test_batch_sizes_differ_by_at_most_one_and_none_is_empty(n_prompts, samples, looks, sizes):
    batches = C.look_batches(inputs(*[f"p{i}" for i in range(n_prompts)]), samples, 0, looks)
    assert [len(b) for b in batches] == sizes


# --- when a run stops ---------------------------------------------------------------------------------------
def stats(status: str) -> SamplingStats:
    return SamplingStats(status=status, passed=status == "consistent", n_tokens=200, min_tokens=100, alpha=0.01,
                         per_test_alpha=0.01 / 3, power=0.8, bins=20, seed=0, pit_histogram=[10] * 20,
                         pit_expected_per_bin=10.0, rank_categories=[], summary="s")


@pytest.mark.parametrize("look, status, stop", [
    (1, "consistent", False), (3, "consistent", False), (1, "too-few", False),  # interim: go on
    (1, "inconsistent", True), (3, "inconsistent", True),                       # interim: only to reject
    (4, "consistent", True), (4, "too-few", True), (4, "inconsistent", True),   # the last look decides
])
def test_an_interim_look_stops_only_to_reject(look, status, stop):
    assert C.stops(look, 4, stats(status)) is stop


# --- the outcome ----------------------------------------------------------------------------------------
def look(n: int, samples: int, alpha: float, status: str, p: float | None) -> SamplingLook:
    return SamplingLook(look=n, samples=samples, tokens=samples * 16, alpha=alpha, status=status, smallest_p=p)


def test_a_stop_at_the_first_look_says_where_why_and_the_samples_used():
    out = C.looks_outcome(0.01, 4, 32, [look(1, 8, 0.01 / 6, "inconsistent", 1e-9)])
    assert (out.looks, out.stopped_at, out.samples, out.fixed_samples) == (4, 1, 8, 32)
    assert out.alphas == pytest.approx([0.01 / 6] * 3 + [0.005])
    assert out.text == ("stopped at look 1 of 4: the sampling distribution differs (p=1e-09 <= 0.000556), after 8 of "
                        "the fixed design's 32 samples; alpha 0.01 split over 4 looks: 0.00167 at each of looks 1-3 "
                        "and 0.005 at the last (each look's three tests at a third of its alpha; at most alpha in "
                        "all)")


def test_a_stop_for_a_token_of_probability_zero_says_so():
    out = C.looks_outcome(0.01, 4, 32, [look(1, 8, 0.01 / 6, "inconsistent", None)])
    assert out.text.startswith("stopped at look 1 of 4: a sampled token has probability zero under the source, "
                               "after 8 of")


def test_a_run_through_all_looks_and_a_single_look():
    history = [look(i, 8 * i, a, "consistent", 0.3) for i, a in enumerate(look_alphas(0.05, 4), start=1)]
    out = C.looks_outcome(0.05, 4, 32, history)
    assert (out.stopped_at, out.samples, len(out.history)) == (4, 32, 4)
    assert out.text.startswith("ran all 4 looks (an interim look only rejects; acceptance is decided at the last), "
                               "after 32 of the fixed design's 32 samples; alpha 0.05 split over 4 looks: 0.00833 at "
                               "each of looks 1-3 and 0.025 at the last")
    one = C.looks_outcome(0.05, 1, 3, [look(1, 3, 0.05, "consistent", 0.3)])
    assert "alpha 0.05 split over 1 looks: 0.05 at the only look" in one.text
    # two looks: an interim one and the last, alpha / 2 = 0.025 each; there is no "only look"
    two = C.looks_outcome(0.05, 2, 16, [look(1, 8, 0.025, "consistent", 0.3), look(2, 16, 0.025, "consistent", 0.3)])
    assert "alpha 0.05 split over 2 looks: 0.025 at look 1 and 0.025 at the last" in two.text
    assert "0.025 at the last" in two.text and "only look" not in two.text


@pytest.mark.parametrize("look_alpha, p, why", [
    (0.03, 0.01, "the sampling distribution differs (p=0.01 <= 0.01)"),  # p at a third of alpha rejects
    (0.01, 0.003, "the sampling distribution differs (p=0.003 <= 0.00333)"),  # 0.3 alpha: below a third
    (0.01, 0.005, "a sampled token has probability zero under the source"),  # half alpha: above a third
    (0.01, 0.02, "a sampled token has probability zero under the source"),
])
def test_an_early_stop_is_the_tests_when_a_p_value_is_at_most_a_third_of_the_looks_alpha(look_alpha, p, why):
    out = C.looks_outcome(0.06, 4, 32, [look(1, 8, look_alpha, "inconsistent", p)])
    assert out.text.startswith(f"stopped at look 1 of 4: {why}, after 8 of the fixed design's 32 samples")


# --- the last look is the fixed design at its alpha ---------------------------------------------------------
def simulated(n_samples: int, temperature: float, seed: int = 5):
    """Samples of a fixed 30-token Markov chain and the source's top 10 at each position."""
    return markov(n_samples, temperature, seed=seed, chain_seed=11)


def settings(**kw) -> SamplingSettings:
    return SamplingSettings(**{"samples": 16, "max_tokens": 16, "alpha": 0.01, "top_logprobs": 10, "concurrency": 4,
                               "seed": 3, "request_timeout_s": 60, "source": "server", "tokenizer": "t", "looks": 4,
                               **kw})


def test_a_look_on_every_sample_in_any_order_is_the_fixed_designs_verdict_at_that_alpha():
    samples, draws = simulated(16, 1.0)
    pairs = list(zip(samples, draws))
    random.Random(1).shuffle(pairs)  # the order the looks' batches came back in
    at_look = C.look_stats(settings(), [s for s, _ in pairs], [d for _, d in pairs], 0.005)
    fixed = sampling_verdict([d for ds in draws for d in ds], alpha=0.005, seed=3)
    assert at_look.model_dump() == fixed.model_dump()
    assert at_look.per_test_alpha == pytest.approx(0.005 / 3)
    # the run's own bins, power and TV targets, not sampling_verdict's defaults
    own = {"bins": 10, "power": 0.9, "tv_targets": [0.03, 0.1]}
    at_own = C.look_stats(settings(**own), samples, draws, 0.005)
    fixed_own = sampling_verdict([d for ds in draws for d in ds], alpha=0.005, seed=3, bins=10, power=0.9,
                                 tv_targets=(0.03, 0.1))
    assert at_own.model_dump() == fixed_own.model_dump()
    assert (at_own.bins, at_own.power, len(at_own.pit_histogram)) == (10, 0.9, 10)
    for key, value in own.items():  # each setting on its own shows in the verdict
        alone = sampling_verdict([d for ds in draws for d in ds], alpha=0.005, seed=3, **{key: value})
        assert C.look_stats(settings(**{key: value}), samples, draws, 0.005).model_dump() == alone.model_dump()
        assert alone.model_dump() != fixed.model_dump()


def test_samples_and_draws_of_different_lengths_are_refused_not_cut_short():
    samples, draws = simulated(3, 1.0)
    ordered, ordered_draws = C.by_index(samples[::-1], draws[::-1])
    assert [s.index for s in ordered] == [0, 1, 2] and ordered_draws == draws
    with pytest.raises(ValueError):
        C.by_index(samples, draws[:2])
    with pytest.raises(ValueError):
        C.look_stats(settings(), samples[:2], draws, 0.005)


def test_the_report_of_a_run_with_looks_keeps_the_stopping_looks_verdict_and_counts_the_samples_sent():
    samples, draws = simulated(8, 0.5)
    verdict = C.look_stats(settings(), samples, draws, 0.01 / 6)
    assert verdict.status == "inconsistent"
    outcome = C.looks_outcome(0.01, 4, 32, [C.look_record(1, 8, 0.01 / 6, verdict)])
    assert outcome.history[0].smallest_p == min(t.p_value for t in verdict.tests)
    on = ServerInfo(backend="vllm", base_url="http://on", model_id="m", spec_enabled=True)
    off = ServerInfo(backend="vllm", base_url="http://off", model_id="m", spec_enabled=False)
    inp = C.inputs_for([Prompt(id="p", prompt="x")], [[0]], 16)
    report = C.sampling_report(settings(), on, off, inp, samples[::-1], draws[::-1], looks=(verdict, outcome))
    assert report.stats is verdict and report.looks is outcome
    assert (report.prompts[0].samples, report.prompts[0].tokens) == (8, 128)
    assert not report.gate.passed and report.gate.reasons[0].startswith("the samples are not from the target")


def test_without_the_rule_the_report_has_no_looks():
    samples, draws = simulated(8, 1.0)
    on = ServerInfo(backend="vllm", base_url="http://on", model_id="m", spec_enabled=True)
    inp = C.inputs_for([Prompt(id="p", prompt="x")], [[0]], 16)
    report = C.sampling_report(settings(looks=None), on, None, inp, samples, draws)
    assert report.looks is None and report.settings.looks is None
    assert report.stats.alpha == 0.01


# --- the split holds the run's false-alarm rate -----------------------------------------------------------
def test_a_correct_sampler_looked_at_four_times_is_rejected_at_most_alpha_of_the_time():
    """Seeded simulation of the real verdict under the null: tokens from fixed 12-token distributions,
    400 per run, looks after 100, 200, 300, 400 at look_alphas(0.3, 4). The union bound caps the rate
    at 0.3; spending the whole 0.3 at every look instead rejects well above it (the same runs)."""
    from specadapt.analysis.sampling_stats import DrawArrays, verdict_from_arrays

    rng = np.random.default_rng(2024)
    logits = rng.normal(size=(4, 12)) * 1.5
    dists = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    split, naive, runs = 0, 0, 200
    for r in range(runs):
        p = dists[rng.integers(0, 4, 400)]
        tokens = np.minimum((p.cumsum(axis=1) < rng.random((400, 1))).sum(axis=1), 11)
        order = np.argsort(-p, axis=1, kind="stable")
        probs = np.take_along_axis(p, order, axis=1)[:, :8]
        rank = np.argmax(order == tokens[:, None], axis=1)
        arrays = DrawArrays(probs, np.where(rank < 8, rank, -1), np.zeros(400, dtype=bool))

        def rejects(n: int, alpha: float) -> bool:
            part = DrawArrays(arrays.probs[:n], arrays.rank[:n], arrays.zero_probability[:n])
            return verdict_from_arrays(part, alpha=alpha, seed=r).status == "inconsistent"

        split += any(rejects(100 * (i + 1), a) for i, a in enumerate(look_alphas(0.3, 4)))
        naive += any(rejects(100 * (i + 1), 0.3) for i in range(4))
    assert split / runs <= 0.3
    assert naive / runs > 0.3  # the test can tell a split that does not hold alpha

"""Theory formulas against a Monte-Carlo simulation of i.i.d. acceptance (pure Python)."""

from __future__ import annotations

import math
import random
import subprocess
import sys

import pytest

from specadapt.native_reference import theory


def simulate(a: float, k: int, passes: int, rng: random.Random) -> tuple[list[int], list[int]]:
    """Tokens per pass and per-position acceptance counts when each draft passes with prob a."""
    per_pass, per_pos = [], [0] * k
    for _ in range(passes):
        m = 0
        while m < k and rng.random() < a:
            per_pos[m] += 1
            m += 1
        per_pass.append(m + 1)  # accepted drafts plus the target's own token
    return per_pass, per_pos


@pytest.mark.parametrize("a,k", [(0.3, 1), (0.6, 3), (0.8, 5), (0.95, 8)])
def test_tokens_per_pass_matches_simulation(a, k):
    per_pass, per_pos = simulate(a, k, 20000, random.Random(k))
    mean = sum(per_pass) / len(per_pass)
    sd = math.sqrt(sum((x - mean) ** 2 for x in per_pass) / (len(per_pass) - 1))
    assert abs(mean - theory.expected_tokens_per_pass(a, k)) < 4 * sd / math.sqrt(len(per_pass))
    # per-position form from the same counts gives the sample mean exactly
    assert theory.tokens_per_pass_per_position(per_pos, len(per_pass)) == pytest.approx(mean)
    cond = theory.conditional_acceptance(per_pos, len(per_pass))
    assert all(abs(c - a) < 0.05 for c in cond if c > 0)


def test_limits_and_speedup():
    assert theory.expected_tokens_per_pass(0.0, 5) == 1.0
    assert theory.expected_tokens_per_pass(1.0, 5) == 6.0
    assert theory.predicted_speedup(0.7, 4, 0.0) == pytest.approx(sum(0.7 ** i for i in range(5)))
    assert theory.predicted_speedup(0.7, 4, 0.25) == pytest.approx(
        theory.expected_tokens_per_pass(0.7, 4) / 2.0)
    assert theory.predicted_speedup(0.7, 4, 0.25, v=1.5) == pytest.approx(
        theory.expected_tokens_per_pass(0.7, 4) / 2.5)


def test_simulated_speedup_with_costs():
    """Simulate time: each pass costs 1 + k c; speedup = tokens per unit time."""
    a, k, c = 0.7, 4, 0.1
    per_pass, _ = simulate(a, k, 20000, random.Random(7))
    measured = sum(per_pass) / (len(per_pass) * (1 + k * c))
    assert measured == pytest.approx(theory.predicted_speedup(a, k, c), rel=0.02)


@pytest.mark.parametrize("a,c", [(0.5, 0.05), (0.8, 0.02), (0.9, 0.3), (0.2, 0.5)])
def test_best_k_is_the_argmax(a, c):
    k, s = theory.best_k(a, c, k_max=12)
    assert s == max(theory.predicted_speedup(a, j, c) for j in range(13))
    assert s == theory.predicted_speedup(a, k, c)


def test_bad_inputs_raise():
    with pytest.raises(ValueError):
        theory.expected_tokens_per_pass(1.2, 3)
    with pytest.raises(ValueError):
        theory.predicted_speedup(0.5, 3, -1)


def test_acceptance_inverse():
    for a in (0.1, 0.5, 0.9):
        assert theory.acceptance_from_mean_length(theory.expected_tokens_per_pass(a, 4), 4) == pytest.approx(a)


def test_theory_imports_without_torch():
    code = ("import sys; import specadapt.native_reference.theory, specadapt.commands.reference, "
            "specadapt.cli; assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_counts_form_equals_per_position_form_for_fixed_k():
    per_pass, per_pos = simulate(0.6, 4, 1000, random.Random(3))
    fixed = theory.predicted_speedup_per_position(per_pos, 1000, 0.2, 1.3)
    assert theory.predicted_speedup_from_counts(per_pos, 1000, 4 * 1000, 0.2, 1.3) == pytest.approx(fixed)
    # half the draft work per pass: cheaper passes, same tokens
    assert theory.predicted_speedup_from_counts(per_pos, 1000, 2 * 1000, 0.2, 1.3) == pytest.approx(
        (sum(per_pass) / 1000) / (2 * 0.2 + 1.3))

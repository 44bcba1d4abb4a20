"""Theory formulas at their edges: exact figures worked out by hand from the formulas in
theory.py's docstrings, the empty and one-pass cases, the bisection's bracket and the error
messages a user reads."""

from __future__ import annotations

import re

import pytest

from specadapt.native_reference import theory


def test_tokens_per_pass_from_per_position_counts():
    # 1 + (3 + 1) / 1 and 1 + (6 + 2) / 4
    assert theory.tokens_per_pass_per_position([3, 1], 1) == 5.0
    assert theory.tokens_per_pass_per_position([6, 2], 4) == 3.0
    # no drafts: one token per pass (the target's own), whatever the counts say
    assert theory.tokens_per_pass_per_position([0, 0], 0) == 1.0
    assert theory.tokens_per_pass_per_position([3, 1], 0) == 1.0
    assert theory.tokens_per_pass_per_position([3, 1], -2) == 1.0


def test_speedup_from_counts_by_hand():
    # (1 + (3 + 2) / 4) / (8 / 4 * 0.1 + 1) = 2.25 / 1.2, with the default v = 1
    assert theory.predicted_speedup_from_counts([3, 2], 4, 8, 0.1) == pytest.approx(1.875)
    # one pass: (1 + 1 / 1) / (1 / 1 * 0.5 + 1)
    assert theory.predicted_speedup_from_counts([1], 1, 1, 0.5) == pytest.approx(4 / 3)
    # no pass at all: nothing to predict from, the speed of not speculating
    assert theory.predicted_speedup_from_counts([1], 0, 0, 0.5) == 1.0
    assert theory.predicted_speedup_from_counts([1], -1, 3, 0.5) == 1.0


def test_conditional_acceptance_by_hand():
    # 8 of 10 drafts pass position 0, 4 of those 8 pass position 1, 1 of those 4 pass position 2
    assert theory.conditional_acceptance([8, 4, 1], 10) == pytest.approx([0.8, 0.5, 0.25])
    # a position nobody reached has no rate: 0.0, also for the positions after it
    assert theory.conditional_acceptance([3, 0, 0], 4) == [0.75, 0.0, 0.0]
    assert theory.conditional_acceptance([1], 0) == [0.0]


def test_predicted_speedup_needs_a_positive_verification_cost():
    with pytest.raises(ValueError, match=re.escape("cost ratios need c >= 0 and v > 0, not c=0.1, v=0.0")):
        theory.predicted_speedup(0.5, 3, 0.1, v=0.0)
    with pytest.raises(ValueError, match=re.escape("cost ratios need c >= 0 and v > 0, not c=-1, v=1.0")):
        theory.predicted_speedup(0.5, 3, -1)


def test_bad_acceptance_or_k_say_which():
    with pytest.raises(ValueError, match=re.escape("acceptance rate a must be in [0, 1], not 1.2")):
        theory.expected_tokens_per_pass(1.2, 3)
    with pytest.raises(ValueError, match=re.escape("k must be >= 0, not -1")):
        theory.expected_tokens_per_pass(0.5, -1)


def test_best_k_looks_up_to_16_by_default_and_prefers_the_smaller_k_on_a_tie():
    # every draft accepted and drafting free: speedup k + 1 grows with k, so the largest k allowed wins
    assert theory.best_k(1.0, 0.0) == (16, 17.0)
    assert theory.best_k(1.0, 0.0, k_max=12) == (12, 13.0)
    # nothing accepted and drafting free: every k gives 1.0; k = 0 (do not speculate) is kept
    assert theory.best_k(0.0, 0.0) == (0, 1.0)


def test_mean_length_at_the_ends_of_its_range():
    assert theory.acceptance_from_mean_length(1.0, 4) == pytest.approx(0.0, abs=1e-9)
    # (1 - a^5) / (1 - a) loses digits to cancellation next to a = 1
    assert theory.acceptance_from_mean_length(5.0, 4) == pytest.approx(1.0, abs=1e-6)
    with pytest.raises(ValueError, match=re.escape("mean tokens per pass must be in [1, 5], not 5.5")):
        theory.acceptance_from_mean_length(5.5, 4)
    with pytest.raises(ValueError, match=re.escape("mean tokens per pass must be in [1, 5], not 0.9")):
        theory.acceptance_from_mean_length(0.9, 4)


def test_the_bisection_stops_at_the_tolerance_and_returns_the_middle_of_its_bracket():
    """k = 1: tokens per pass = 1 + a. With tol = 0.25 the bracket [0, 1] is halved twice."""
    # mean 1.3 (a = 0.3): 0.5 is too high -> [0, 0.5]; 0.25 too low -> [0.25, 0.5], width 0.25: stop
    assert theory.acceptance_from_mean_length(1.3, 1, tol=0.25) == 0.375
    # mean 1.5 (a = 0.5): a midpoint that explains the mean exactly becomes the bracket's top
    # -> [0, 0.5]; 0.25 too low -> [0.25, 0.5]
    assert theory.acceptance_from_mean_length(1.5, 1, tol=0.25) == 0.375
    # a tolerance as wide as [0, 1] takes no step: its middle
    assert theory.acceptance_from_mean_length(3.0, 4, tol=2.0) == 0.5

"""The bound on the suspect rate (analysis/proof.py) against the binomial distribution it inverts
(scipy.stats.binom, an independent implementation) and the closed forms of zero suspects."""

from __future__ import annotations

import math

import pytest
from scipy.stats import binom

from specadapt.analysis.proof import percent, prompts_needed, rate_upper_bound


@pytest.mark.parametrize(("x", "n"), [(0, 1), (0, 6), (0, 59), (1, 10), (3, 50), (7, 8), (2, 300)])
def test_the_bound_is_the_rate_at_which_x_or_fewer_suspects_have_probability_5_percent(x, n):
    u = rate_upper_bound(x, n)
    assert binom.cdf(x, n, u) == pytest.approx(0.05, abs=1e-9)
    assert binom.cdf(x, n, u * 0.999) > 0.05  # a lower rate would make x or fewer suspects likelier than 5%


def test_zero_suspects_in_n_prompts_is_one_minus_the_nth_root_of_5_percent():
    assert rate_upper_bound(0, 6) == pytest.approx(1 - 0.05 ** (1 / 6)) and round(rate_upper_bound(0, 6), 3) == 0.393
    assert rate_upper_bound(0, 299) <= 0.01 < rate_upper_bound(0, 298)
    assert rate_upper_bound(0, 59) <= 0.05 < rate_upper_bound(0, 58)


def test_nothing_exercised_or_all_suspect_bounds_nothing():
    assert rate_upper_bound(0, 0) == 1.0 and rate_upper_bound(4, 4) == 1.0


def test_a_higher_confidence_gives_a_higher_bound():
    assert rate_upper_bound(1, 20, 0.99) > rate_upper_bound(1, 20, 0.95) > rate_upper_bound(1, 20, 0.5)


@pytest.mark.parametrize(("x", "n"), [(-1, 5), (6, 5), (0, -1), (1, 0)])
def test_impossible_counts_are_refused(x, n):
    with pytest.raises(ValueError, match=f"^{x} suspect of {n} prompts$"):
        rate_upper_bound(x, n)


@pytest.mark.parametrize(("x", "rate"), [(0, 0.01), (0, 0.05), (0, 0.5), (1, 0.05), (3, 0.1), (10, 0.2)])
def test_prompts_needed_is_the_least_n_whose_bound_reaches_the_rate(x, rate):
    n = prompts_needed(x, rate)
    assert rate_upper_bound(x, n) <= rate < rate_upper_bound(x, n - 1)


def test_prompts_needed_at_zero_suspects_matches_the_closed_form():
    assert (prompts_needed(0, 0.01), prompts_needed(0, 0.05)) == (299, 59)
    assert prompts_needed(0, 0.01) == math.ceil(math.log(20) / -math.log(0.99))


@pytest.mark.parametrize("rate", [0, 1, -0.1, 1.5])
def test_prompts_needed_refuses_a_rate_outside_0_1(rate):
    with pytest.raises(ValueError, match="outside"):
        prompts_needed(0, rate)


@pytest.mark.parametrize("n", [1, 6, 11, 59, 299, 1000])
def test_the_bound_of_n_prompts_needs_exactly_n_prompts(n):
    """Where log(1 - confidence) / log(1 - rate) is a whole number up to rounding, the ceiling is that number."""
    assert prompts_needed(0, rate_upper_bound(0, n)) == n


@pytest.mark.parametrize(("x", "rate"), [(0, 0.05), (2, 0.1)])
def test_prompts_needed_at_another_confidence_uses_it(x, rate):
    n = prompts_needed(x, rate, confidence=0.99)
    assert rate_upper_bound(x, n, 0.99) <= rate < rate_upper_bound(x, n - 1, 0.99)
    assert n > prompts_needed(x, rate)


@pytest.mark.parametrize(("rate", "text"), [(0.393, "39.3%"), (0.0153, "1.53%"), (0.01, "1%"), (1.0, "100%"),
                                            (0.05, "5%"), (0.1234, "12.3%"), (0.996, "99.6%"), (0.5, "50%")])
def test_percent(rate, text):
    assert percent(rate) == text


@pytest.mark.parametrize(("x", "n"), [(1, 10), (3, 40), (11, 12), (2, 300)])
def test_the_bound_of_x_in_n_prompts_needs_exactly_n_prompts(x, n):
    assert prompts_needed(x, rate_upper_bound(x, n)) == n

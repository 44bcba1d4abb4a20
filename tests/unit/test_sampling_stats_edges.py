"""Sampling statistics edges: parameters refused before anything is computed with them.

An alpha of 0 makes the chi-square's critical value infinite, so the power computation could
never finish: it must be refused up front, also where no power figure would be computed
(no tokens, no TV targets) and before the other parameters are looked at.
"""

import pytest

from specadapt.analysis.sampling_stats import samples_needed, sampling_verdict
from specadapt.errors import UsageError

ALPHA_0 = "alpha must be between 0 and 1, got 0.0: give a false-alarm rate such as 0.01"


def test_alpha_zero_is_refused_even_when_no_power_figure_is_asked_for():
    with pytest.raises(UsageError) as err:
        sampling_verdict([], alpha=0.0, tv_targets=())
    assert str(err.value) == ALPHA_0


def test_alpha_is_checked_before_the_total_variation_target():
    with pytest.raises(UsageError) as err:
        samples_needed(0.0, 0.0)
    assert str(err.value) == ALPHA_0

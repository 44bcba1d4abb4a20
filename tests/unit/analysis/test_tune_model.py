"""`specadapt tune`'s arithmetic (analysis/tune_model.py): the per-level cost model, the k chosen per
level, the batch-size schedule, the fixed-k fallback, the recommendation and the verification
verdicts. Every expected figure is worked out here from the formulas in the module's docstrings,
and every comparison is pinned at its boundary (the module is mutation-tested)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from specadapt.analysis import tune_model as tm
from specadapt.records import (
    AcceptanceSummary,
    Distribution,
    LatencySummary,
    LevelResult,
    RatioCI,
    SpeedRatios,
)
from specadapt.records.tune import HonourCheck, LevelChoice, LevelFit, LevelVerify


def ci(point, low=None, high=None) -> RatioCI:
    return RatioCI(point=point, low=low, high=high, n=5 if low is not None else 3)


def latency() -> LatencySummary:
    return LatencySummary(requests=5, succeeded=5, failed=0, output_tokens=100, duration_s=1.0,
                          output_tokens_per_s=100.0, ttft_ms=Distribution(), itl_ms=Distribution(),
                          tpot_ms=Distribution(), e2e_ms=Distribution(), tokens_per_chunk_mean=None)


def level(tpot: RatioCI, length: float | None = None, rates=(), e2e: RatioCI | None = None,
          throughput: RatioCI | None = None) -> LevelResult:
    acc = AcceptanceSummary(known=length is not None, mean_acceptance_length=length, per_position_rate=list(rates))
    return LevelResult(concurrency=4, pairs=5, off=latency(), on=latency(), acceptance=acc,
                       speed=SpeedRatios(tpot=tpot, e2e=e2e or ci(None), throughput=throughput or ci(None)))


def choice(concurrency: int, k: int, certainty: str = "clear", point: float | None = None,
           label: str | None = None) -> LevelChoice:
    return LevelChoice(concurrency=concurrency, k=k, label=label or ("off" if k == 0 else f"k={k}"),
                       ratio=None if k == 0 else ci(point if point is not None else 1.5),
                       certainty=certainty, reason="")


def acc(rates, drafts, generated, known=True) -> AcceptanceSummary:
    return AcceptanceSummary(known=known, drafts=drafts, generation_tokens=generated, per_position_rate=list(rates))


# ---------------------------------------------------------------- objective_ratio

def test_objective_ratio_picks_the_named_ratio():
    tpot, e2e, thr = ci(1.1), ci(1.2), ci(1.3)
    lv = level(tpot, e2e=e2e, throughput=thr)
    assert tm.objective_ratio(lv, "tpot") is tpot
    assert tm.objective_ratio(lv, "e2e") is e2e
    assert tm.objective_ratio(lv, "throughput") is thr


# ---------------------------------------------------------------- fit_level

RATES = [0.8, 0.6, 0.4, 0.2]


def model(v: float, c: float, k: int, rates=RATES) -> float:
    """The docstring's prediction, written out independently: tokens per pass over cost per pass."""
    return (1.0 + sum(rates[:k])) / (v + c * k)


def point_at(k: int, v: float, c: float, rates=RATES, low=None, high=None, own_rates=None) -> LevelResult:
    """A candidate whose measurement lies exactly on the model."""
    length = 1.0 + sum(rates[:k])
    return level(ci(model(v, c, k, rates), low, high), length, own_rates if own_rates is not None else rates[:k])


def test_three_points_recover_v_and_c_and_predict_every_k():
    v, c = 1.2, 0.2
    pts = [(4, point_at(4, v, c)), (1, point_at(1, v, c)), (2, point_at(2, v, c))]  # any order
    fit = tm.fit_level(8, pts, variant="ngram_max=3")
    assert (fit.concurrency, fit.variant, fit.form) == (8, "ngram_max=3", "v + c k")
    assert fit.v == pytest.approx(v, abs=1e-9) and fit.c == pytest.approx(c, abs=1e-9)
    assert fit.per_position_rate == RATES
    assert sorted(fit.predicted) == [0, 1, 2, 3, 4]
    assert fit.predicted[0] == 1.0
    for k in range(1, 5):  # k = 3 was not measured: predicted all the same
        assert fit.predicted[k] == pytest.approx(model(v, c, k))
    assert [p.k for p in fit.points] == [1, 2, 4]
    for p in fit.points:
        assert p.measured == pytest.approx(model(v, c, p.k))
        assert p.tokens_per_pass == pytest.approx(1.0 + sum(RATES[:p.k]))
        assert p.predicted == pytest.approx(p.measured)
        assert p.inside is None and p.low is None and p.high is None
    assert fit.max_rel_error == pytest.approx(0.0, abs=1e-9)
    assert fit.r2 == pytest.approx(1.0)
    best = max(range(5), key=lambda k: (1.0 if k == 0 else model(v, c, k), -k))
    assert fit.model_best_k == best == 3  # the model prefers a k that was not measured


def test_least_squares_with_noise_and_r2_and_error():
    # y = L / S at k = 1, 2, 3: 1.3, 1.35, 1.6 -> least squares by hand:
    # mean k 2, mean y 1.41666..; c = sum (k - 2)(y - mean y) / sum (k - 2)^2 = (0.3) / 2 = 0.15;
    # v = 1.41666.. - 2 * 0.15 = 1.11666..
    rates = [0.5, 0.3, 0.2]
    lengths = [1.5, 1.8, 2.0]
    ys = [1.3, 1.35, 1.6]
    pts = [(k, level(ci(lengths[k - 1] / ys[k - 1]), lengths[k - 1], rates)) for k in (1, 2, 3)]
    fit = tm.fit_level(1, pts)
    assert fit.form == "v + c k"
    assert fit.c == pytest.approx(0.15)
    assert fit.v == pytest.approx(1.41666666666 - 0.3)
    pred = {k: (1.0 + sum(rates[:k])) / (fit.v + fit.c * k) for k in (1, 2, 3)}
    meas = {k: lengths[k - 1] / ys[k - 1] for k in (1, 2, 3)}
    assert [p.predicted for p in fit.points] == pytest.approx([pred[1], pred[2], pred[3]])
    assert fit.max_rel_error == pytest.approx(max(abs(pred[k] - meas[k]) / meas[k] for k in (1, 2, 3)))
    mean = sum(meas.values()) / 3
    ss_tot = sum((m - mean) ** 2 for m in meas.values())
    ss_res = sum((meas[k] - pred[k]) ** 2 for k in (1, 2, 3))
    assert fit.r2 == pytest.approx(1.0 - ss_res / ss_tot)
    assert 0.0 < fit.r2 < 1.0


def test_one_point_fixes_v_at_1_and_the_model_meets_the_point():
    # k = 1, L = 1.5, S = 0.75: y = 2.0, c = 1 * (2 - 1) / 1 = 1.0, predicted = 1.5 / 2 = 0.75 exactly.
    fit = tm.fit_level(1, [(1, level(ci(0.75, 0.75, 0.75), 1.5, [0.5]))])
    assert (fit.form, fit.v, fit.c) == ("1 + c k", 1.0, 1.0)
    assert fit.predicted == {0: 1.0, 1: 0.75}
    (p,) = fit.points
    assert (p.k, p.measured, p.low, p.high, p.tokens_per_pass, p.predicted) == (1, 0.75, 0.75, 0.75, 1.5, 0.75)
    assert p.inside is True  # low == predicted == high: both ends are inside
    assert fit.r2 is None and fit.max_rel_error == 0.0
    assert fit.model_best_k == 0  # 1.0 at k = 0 beats 0.75


@pytest.mark.parametrize("low, high, inside", [
    (0.75, 0.80, True), (0.70, 0.75, True), (0.76, 0.80, False), (0.70, 0.74, False)])
def test_inside_is_low_le_predicted_le_high(low, high, inside):
    fit = tm.fit_level(1, [(1, level(ci(0.75, low, high), 1.5, [0.5]))])
    assert fit.points[0].inside is inside


def test_a_half_interval_is_no_interval():
    fit = tm.fit_level(1, [(1, level(RatioCI(point=0.75, low=0.7), 1.5, [0.5]))])
    assert fit.points[0].inside is None


def test_two_points_least_squares_through_v_1():
    # k = 1: L = 1.6, S = 1.28 -> y = 1.25; k = 3: L = 2.5, S = 1.25 -> y = 2.0.
    # c = (1 * 0.25 + 3 * 1.0) / (1 + 9) = 0.325
    rates = [0.6, 0.5, 0.4]
    fit = tm.fit_level(2, [(3, level(ci(1.25), 2.5, rates)), (1, level(ci(1.28), 1.6, [0.6]))])
    assert fit.form == "1 + c k" and fit.v == 1.0
    assert fit.c == pytest.approx(0.325)
    assert fit.predicted[2] == pytest.approx(2.1 / 1.65)
    assert fit.r2 is None  # fewer than 3 points
    assert fit.model_best_k == 2


def test_points_without_a_ratio_or_a_length_are_left_out():
    v, c = 1.1, 0.2
    pts = [(1, point_at(1, v, c)), (2, level(ci(None), 1.6, RATES[:2])), (3, level(ci(1.3), None)),
           (4, point_at(4, v, c))]
    fit = tm.fit_level(1, pts)
    assert (fit.form, fit.variant) == ("1 + c k", "")  # two points left
    assert [p.k for p in fit.points] == [1, 4]


def test_no_point_no_fit():
    for pts in ([], [(2, level(ci(None), 1.5, [0.5, 0.2]))], [(2, level(ci(1.2)))]):
        fit = tm.fit_level(4, pts, "x")
        assert (fit.concurrency, fit.variant, fit.form) == (4, "x", "none")
        assert fit.v is None and fit.c is None and fit.predicted == {} and fit.points == []
        assert fit.model_best_k is None and fit.max_rel_error is None and fit.r2 is None


def test_rates_come_from_the_largest_k():
    small = point_at(1, 1.0, 0.1, own_rates=[0.9])
    large = point_at(2, 1.0, 0.1, own_rates=[0.7, 0.3])
    fit = tm.fit_level(1, [(2, large), (1, small)])
    assert fit.per_position_rate == [0.7, 0.3]
    assert fit.predicted[1] == pytest.approx(1.7 / (fit.v + fit.c))


def test_no_prediction_past_the_rates_known():
    # the largest k's per-position rates stop at position 1: k = 2 has no prediction and no FitPoint
    pts = [(1, level(ci(1.2), 1.5, [0.5])), (2, level(ci(1.3), 1.8, [0.5]))]
    fit = tm.fit_level(1, pts)
    assert sorted(fit.predicted) == [0, 1]
    assert [p.k for p in fit.points] == [1]
    assert fit.c is not None


def test_predictions_stop_at_the_largest_k_measured():
    # the rates reach further than the largest k (position 2 of a k = 1 run cannot exist, but the
    # fit must not predict past what was measured)
    fit = tm.fit_level(1, [(1, level(ci(1.2), 1.5, [0.5, 0.3]))])
    assert sorted(fit.predicted) == [0, 1]


def test_a_point_without_per_position_rates_has_no_prediction():
    fit = tm.fit_level(1, [(2, level(ci(1.2), 1.5, []))])
    assert fit.form == "1 + c k" and fit.c == pytest.approx(((1.5 / 1.2) - 1) / 2)
    assert fit.predicted == {0: 1.0} and fit.points == []
    assert fit.max_rel_error is None and fit.r2 is None and fit.model_best_k == 0


def test_no_prediction_where_the_fitted_cost_is_not_positive():
    # y = 0.25 at k = 1 and 0.125 at k = 2: c = (1 * -0.75 + 2 * -0.875) / 5 = -0.5 (shown as measured),
    # the cost at k = 2 is 1 - 2 * 0.5 = 0: no prediction there; at k = 1 it is 0.5.
    pts = [(1, level(ci(4.0), 1.0, [0.0, 0.0])), (2, level(ci(8.0), 1.0, [0.0, 0.0]))]
    fit = tm.fit_level(1, pts)
    assert fit.c == -0.5
    assert fit.predicted == {0: 1.0, 1: 2.0}
    assert [p.k for p in fit.points] == [1]
    assert fit.model_best_k == 1


def test_points_beyond_a_non_positive_cost_keep_their_prediction():
    # y = 0.1, 0.3, 2.0 at k = 1, 2, 3 (L = 1): c = (2.0 - 0.1) / 2 = 0.95, v = 0.8 - 2 * 0.95 = -1.1;
    # the cost is -0.15 at k = 1 (no prediction), 0.8 at k = 2 and 1.75 at k = 3
    pts = [(k, level(ci(1.0 / y), 1.0, [0.0] * 3)) for k, y in ((1, 0.1), (2, 0.3), (3, 2.0))]
    fit = tm.fit_level(1, pts)
    assert (fit.v, fit.c) == (pytest.approx(-1.1), pytest.approx(0.95))
    assert sorted(fit.predicted) == [0, 2, 3]
    assert fit.predicted[2] == pytest.approx(1.0 / 0.8) and fit.predicted[3] == pytest.approx(1.0 / 1.75)
    assert [p.k for p in fit.points] == [2, 3]


def test_model_best_ties_go_to_the_smaller_k():
    # k = 1 predicted exactly 1.0 (L = 1.5, S = 1.0: y = 1.5, c = 0.5): tied with off
    fit = tm.fit_level(1, [(1, level(ci(1.0), 1.5, [0.5]))])
    assert fit.predicted == {0: 1.0, 1: 1.0}
    assert fit.model_best_k == 0


def test_r2_needs_spread_in_the_measured_ratios():
    # three points measured at the same S: SS_tot = 0, no R^2 (the fit is still made)
    pts = [(k, level(ci(1.25), 1.0 + 0.5 * k, [0.5] * 3)) for k in (1, 2, 3)]
    fit = tm.fit_level(1, pts)
    assert fit.form == "v + c k" and fit.r2 is None
    assert fit.max_rel_error is not None


# ---------------------------------------------------------------- choose_level

def test_clear_winner_ahead_of_the_runner_up():
    k2, k4 = ci(1.21, 1.10, 1.30), ci(1.42, 1.30, 1.55)
    ch = tm.choose_level(4, {2: k2, 4: k4}, {})
    assert (ch.concurrency, ch.k, ch.label, ch.ratio) == (4, 4, "k=4", k4)
    assert (ch.runner_up_k, ch.runner_up_ratio, ch.certainty) == (2, 1.21, "clear")
    assert ch.reason == "k=4: 1.42x [1.30, 1.55] vs off; ahead of k=2 (1.21x) beyond its interval"
    assert ch.excluded == {} and ch.model_best_k is None and ch.model_note is None


def test_low_equal_to_the_runner_up_is_leaning():
    ch = tm.choose_level(4, {2: ci(1.30, 1.2, 1.4), 4: ci(1.42, 1.30, 1.55)}, {})
    assert (ch.k, ch.certainty) == (4, "leaning")
    assert ch.reason == "k=4: 1.42x [1.30, 1.55] vs off; leaning: its interval reaches k=2 (1.30x)"


@pytest.mark.parametrize("low, certainty", [(1.0, "leaning"), (1.01, "clear"), (0.9, "leaning")])
def test_against_off_as_runner_up(low, certainty):
    ch = tm.choose_level(1, {4: ci(1.2, low, 1.4)}, {})
    assert (ch.k, ch.runner_up_k, ch.runner_up_ratio, ch.certainty) == (4, 0, 1.0, certainty)
    assert "off (1.00x)" in ch.reason


@pytest.mark.parametrize("ratio", [ci(1.2), RatioCI(point=1.2, low=1.1), RatioCI(point=1.2, high=1.3)])
def test_best_without_interval(ratio):
    ch = tm.choose_level(1, {4: ratio, 2: ci(1.1, 1.05, 1.2)}, {})
    assert (ch.k, ch.certainty) == (4, "no interval")
    assert ch.reason == "k=4: 1.20x vs off, without an interval to judge it by; runner-up k=2 (1.10x)"


def test_ties_go_to_the_smaller_k():
    ch = tm.choose_level(1, {4: ci(1.3, 1.2, 1.4), 2: ci(1.3, 1.2, 1.4)}, {})
    assert (ch.k, ch.runner_up_k) == (2, 4)
    ch = tm.choose_level(1, {3: ci(1.0, 0.9, 1.1)}, {})
    assert (ch.k, ch.label, ch.ratio, ch.runner_up_k, ch.runner_up_ratio) == (0, "off", None, 3, 1.0)
    assert ch.certainty == "leaning"  # the runner-up itself is not clearly slower
    assert ch.reason == "off: no candidate is faster, but k=3 at 1.00x [0.90, 1.10] is not clearly slower"


def test_off_clear_when_every_candidate_is_slower():
    ch = tm.choose_level(2, {2: ci(0.9, 0.8, 0.99), 4: ci(0.8, 0.7, 0.9)}, {})
    assert (ch.k, ch.certainty, ch.runner_up_k, ch.runner_up_ratio) == (0, "clear", 2, 0.9)
    assert ch.reason == "off: every candidate is slower beyond its interval; the best, k=2, gives 0.90x [0.80, 0.99]"


@pytest.mark.parametrize("other, shown", [(ci(0.8, 0.7, 1.0), "0.80x [0.70, 1.00]"), (ci(0.8), "0.80x"),
                                          (RatioCI(point=0.8, low=0.7), "0.80x")])
def test_off_leaning_when_a_candidate_is_not_clearly_slower(other, shown):
    # the runner-up (k=2) is clearly slower; k=4, behind it, is what keeps off from being clear
    ch = tm.choose_level(2, {2: ci(0.9, 0.8, 0.99), 4: other}, {})
    assert (ch.k, ch.certainty, ch.runner_up_k) == (0, "leaning", 2)
    assert ch.reason == f"off: no candidate is faster, but k=4 at {shown} is not clearly slower"


def test_off_when_nothing_can_be_chosen():
    ch = tm.choose_level(8, {}, {})
    assert (ch.k, ch.label, ch.ratio, ch.runner_up_k, ch.runner_up_ratio) == (0, "off", None, None, None)
    assert ch.certainty == "clear"
    assert ch.reason == "off: no candidate could be chosen at this level"


def test_excluded_candidates_are_never_chosen_and_unmeasured_ones_are_listed():
    excluded = {4: "2 suspect divergences", 5: "its server failed"}
    ch = tm.choose_level(1, {4: ci(2.0, 1.8, 2.2), 2: ci(1.2, 1.1, 1.3), 3: None, 6: ci(None), 5: None}, excluded)
    assert (ch.k, ch.runner_up_k, ch.certainty) == (2, 0, "clear")
    assert ch.excluded == {4: "2 suspect divergences", 5: "its server failed",
                           3: "not measured at this level", 6: "not measured at this level"}
    assert excluded == {4: "2 suspect divergences", 5: "its server failed"}  # the caller's mapping is untouched


def test_labels_name_the_candidates():
    labels = {2: "k=2 ngram_max=3", 4: "k=4 ngram_max=3"}
    ch = tm.choose_level(1, {2: ci(1.2, 1.1, 1.3), 4: ci(1.5, 1.4, 1.6)}, {}, labels=labels)
    assert ch.label == "k=4 ngram_max=3"
    assert ch.reason == ("k=4 ngram_max=3: 1.50x [1.40, 1.60] vs off; ahead of k=2 ngram_max=3 (1.20x) "
                         "beyond its interval")
    assert tm.choose_level(1, {}, {}, labels=labels).label == "off"


def fit_with_best(best: int, value: float = 1.5) -> LevelFit:
    return LevelFit(concurrency=1, form="v + c k", predicted={0: 1.0, best: value}, model_best_k=best)


def test_model_note_for_an_unmeasured_k():
    opts = {2: ci(1.2, 1.1, 1.3), 4: ci(1.3, 1.2, 1.4), 5: None}
    ch = tm.choose_level(1, opts, {}, fit=fit_with_best(3))
    assert ch.model_best_k == 3
    assert ch.model_note == "the model predicts k=3 at 1.50x; it was not measured: add it to --k to test it"
    ch = tm.choose_level(1, opts, {}, fit=fit_with_best(5, 1.61))
    assert ch.model_note == "the model predicts k=5 at 1.61x; it was not measured at this level"


@pytest.mark.parametrize("best", [0, 2, 4])
def test_no_model_note_for_a_measured_k(best):
    # 4 is excluded but was measured; 0 is off, always measured
    ch = tm.choose_level(1, {2: ci(1.2, 1.1, 1.3), 4: ci(1.3, 1.2, 1.4)}, {4: "suspect"}, fit=fit_with_best(best))
    assert ch.model_best_k == best and ch.model_note is None


def test_a_fit_without_a_best_gives_no_note():
    ch = tm.choose_level(1, {2: ci(1.2)}, {}, fit=LevelFit(concurrency=1, form="none"))
    assert ch.model_best_k is None and ch.model_note is None


# ---------------------------------------------------------------- build_schedule

def test_one_level():
    ranges, note = tm.build_schedule([choice(1, 4)])
    assert ranges == [(1, 1, 4)]
    assert note == "Every batch size from 1 to 1 was measured; the engines carry the last range's k=4 to batch sizes above 1."


def test_levels_become_ranges_up_to_max_batch_size():
    ranges, note = tm.build_schedule([choice(1, 4), choice(4, 2), choice(16, 0)], max_batch_size=64)
    assert ranges == [(1, 3, 4), (4, 15, 2), (16, 64, 0)]
    assert note == ("Batch sizes 2-3 were not measured: they take k=4 of batch size 1; "
                    "batch sizes 5-15 were not measured: they take k=2 of batch size 4; "
                    "batch sizes 17-64 were not measured: they take k=0 of batch size 16; "
                    "the engines carry the last range's k=0 to batch sizes above 64.")


def test_adjacent_ranges_with_the_same_k_merge():
    ranges, note = tm.build_schedule([choice(1, 4), choice(2, 4), choice(4, 2)])
    assert ranges == [(1, 3, 4), (4, 4, 2)]
    assert note == ("Batch size 3 was not measured: it takes k=4 of batch size 2; "
                    "the engines carry the last range's k=2 to batch sizes above 4.")
    ranges, _ = tm.build_schedule([choice(1, 4), choice(2, 2), choice(3, 4)])
    assert ranges == [(1, 1, 4), (2, 2, 2), (3, 3, 4)]  # the same k, not adjacent: kept apart
    ranges, _ = tm.build_schedule([choice(1, 0), choice(2, 0), choice(8, 0)], max_batch_size=16)
    assert ranges == [(1, 16, 0)]


def test_the_first_range_starts_at_1():
    ranges, note = tm.build_schedule([choice(4, 2), choice(8, 1)])
    assert ranges == [(1, 7, 2), (8, 8, 1)]
    assert note == ("Batch sizes 1-3 were not measured: they take k=2 of batch size 4; "
                    "batch sizes 5-7 were not measured: they take k=2 of batch size 4; "
                    "the engines carry the last range's k=1 to batch sizes above 8.")
    ranges, note = tm.build_schedule([choice(2, 3)])
    assert ranges == [(1, 2, 3)]
    assert note.startswith("Batch size 1 was not measured: it takes k=3 of batch size 2; ")


@pytest.mark.parametrize("max_bs, last_end, extra", [
    (None, 8, ""), (4, 8, ""), (8, 8, ""), (0, 8, ""),
    (9, 9, "batch size 9 was not measured: it takes k=1 of batch size 8; "),
    (32, 32, "batch sizes 9-32 were not measured: they take k=1 of batch size 8; ")])
def test_the_last_range_ends_at_max_batch_size_or_the_last_level(max_bs, last_end, extra):
    ranges, note = tm.build_schedule([choice(1, 3), choice(2, 2), choice(8, 1)], max_batch_size=max_bs)
    assert ranges == [(1, 1, 3), (2, 7, 2), (8, last_end, 1)]
    assert note == ("Batch sizes 3-7 were not measured: they take k=2 of batch size 2; " + extra
                    + f"the engines carry the last range's k=1 to batch sizes above {last_end}.")


def test_levels_are_taken_in_order_and_at_least_one_is_needed():
    ranges, _ = tm.build_schedule([choice(8, 1), choice(1, 3)])
    assert ranges == [(1, 7, 3), (8, 8, 1)]
    with pytest.raises(ValueError, match="^a schedule needs at least one level$"):
        tm.build_schedule([])


def test_contiguous_levels_are_all_measured():
    _, note = tm.build_schedule([choice(1, 2), choice(2, 1), choice(3, 0)])
    assert note == ("Every batch size from 1 to 3 was measured; "
                    "the engines carry the last range's k=0 to batch sizes above 3.")


# ---------------------------------------------------------------- fixed_fallback

def test_fallback_is_the_best_mean_log_ratio():
    per_level = {1: {2: ci(1.5), 4: ci(2.0)}, 8: {2: ci(1.2), 4: ci(0.7)}}
    # k=2: (ln 1.5 + ln 1.2) / 2 = ln 1.8 / 2; k=4: ln 1.4 / 2; off: 0
    assert tm.fixed_fallback(per_level, [2, 4]) == 2
    assert tm.fixed_fallback(per_level, [4, 0]) == 4
    assert tm.fixed_fallback(per_level, []) == 0
    # one big win does not outweigh a loss at another level: ln 3 + ln 0.3 < 0
    assert tm.fixed_fallback({1: {4: ci(3.0)}, 8: {4: ci(0.3)}}, [4]) == 0


def test_fallback_needs_a_point_at_every_level():
    assert tm.fixed_fallback({1: {4: ci(3.0)}, 8: {4: None}}, [4]) == 0
    assert tm.fixed_fallback({1: {4: ci(3.0)}, 8: {}}, [4]) == 0
    assert tm.fixed_fallback({1: {4: ci(3.0)}, 8: {4: ci(None)}}, [4]) == 0
    assert tm.fixed_fallback({1: {4: ci(3.0), 2: ci(1.1)}, 8: {2: ci(1.1)}}, [2, 4]) == 2
    assert tm.fixed_fallback({1: {2: ci(3.0), 4: ci(1.1)}, 8: {4: ci(1.1)}}, [2, 4]) == 4


def test_fallback_ties_go_to_the_smaller_k():
    assert tm.fixed_fallback({1: {4: ci(1.3), 2: ci(1.3), 3: ci(1.3)}}, [4, 3, 2]) == 2
    assert tm.fixed_fallback({1: {2: ci(1.0)}, 8: {2: ci(1.0)}}, [2]) == 0  # tied with off
    assert tm.fixed_fallback({1: {1: ci(1.2)}}, [1]) == 1
    assert tm.fixed_fallback({}, [2]) == 0


# ---------------------------------------------------------------- recommendation

def test_recommendation_off():
    rec = tm.recommendation([(1, 64, 0)], [choice(1, 0), choice(16, 0)], 0)
    assert (rec.form, rec.k, rec.schedule, rec.fixed_fallback_k, rec.verified) == ("off", 0, [(1, 64, 0)], 0, False)
    assert rec.summary == ("Speculation off: batch sizes 1-64 off. Every level's choice is clear. "
                           "Fixed-k fallback for engines that do not honour schedules: off.")


def test_recommendation_fixed():
    rec = tm.recommendation([(1, 16, 4)], [choice(1, 4), choice(16, 4, "leaning")], 4, variant="ngram_max=3")
    assert (rec.form, rec.k, rec.variant) == ("fixed", 4, "ngram_max=3")
    assert rec.summary == ("Fixed k=4 (ngram_max=3): batch sizes 1-16 k=4. Least certain: concurrency 16, "
                           "k=4 (leaning). Fixed-k fallback for engines that do not honour schedules: k=4.")


def test_recommendation_schedule_takes_the_largest_k():
    sched = [(1, 1, 2), (2, 7, 5), (8, 8, 0)]
    choices = [choice(1, 2, "leaning"), choice(2, 5, "no interval"), choice(8, 0, "leaning")]
    rec = tm.recommendation(sched, choices, 2)
    assert (rec.form, rec.k, rec.schedule, rec.fixed_fallback_k) == ("schedule", 5, sched, 2)
    assert rec.summary == ("Schedule: batch sizes 1 k=2, 2-7 k=5, 8 off; the engine's k is 5. Least certain: "
                           "concurrency 2, k=5 (no interval). Fixed-k fallback for engines that do not honour "
                           "schedules: k=2.")


@pytest.mark.parametrize("certainties, named", [
    (("clear", "leaning"), "concurrency 4, k=2 (leaning)"),
    (("leaning", "no interval"), "concurrency 4, k=2 (no interval)"),
    (("leaning", "leaning"), "concurrency 1, k=3 (leaning)"),
    (("no interval", "clear"), "concurrency 1, k=3 (no interval)")])
def test_the_least_certain_level_is_named(certainties, named):
    choices = [choice(1, 3, certainties[0]), choice(4, 2, certainties[1])]
    rec = tm.recommendation([(1, 3, 3), (4, 4, 2)], choices, 2)
    assert f"Least certain: {named}." in rec.summary


def test_recommendation_without_choices_or_schedule():
    rec = tm.recommendation([(1, 4, 0)], [], 0)
    assert rec.summary == ("Speculation off: batch sizes 1-4 off. "
                           "Fixed-k fallback for engines that do not honour schedules: off.")
    rec = tm.recommendation([], [], 0, variant="v")
    assert (rec.form, rec.variant, rec.schedule, rec.fixed_fallback_k) == ("none", "v", [], 0)
    assert rec.summary == "Nothing was measured: there is no recommendation."


# ---------------------------------------------------------------- honour_check

@pytest.mark.parametrize("scheduled", [3, 4])
def test_honour_not_applicable_at_the_engine_k(scheduled):
    h = tm.honour_check(16, scheduled, 3, acc([0.5] * 3, 100, 200), acc([0.5] * 3, 100, 200))
    assert (h.verdict, h.scheduled_k, h.engine_k, h.concurrency) == ("not applicable", scheduled, 3, 16)
    assert h.ratio is None and h.schedule_rate is None
    assert h.reason == (f"At concurrency 16 the schedule's k={scheduled} is not below the engine's k=3: "
                        "there are no fewer drafts to check.")


def test_honoured():
    # positions >= 1: verify (0.05 + 0.02) * 100 = 7 over 400 generated; fixed (0.5 + 0.3) * 100 = 80 over 320
    h = tm.honour_check(16, 1, 3, acc([0.6, 0.05, 0.02], 100, 400), acc([0.7, 0.5, 0.3], 100, 320))
    assert h.verdict == "honoured"
    assert h.schedule_rate == pytest.approx(7 / 400)
    assert h.fixed_rate == pytest.approx(80 / 320) and h.fixed_count == pytest.approx(80)
    assert h.ratio == pytest.approx((7 / 400) / (80 / 320))
    assert h.reason == ("At concurrency 16 0.0175 tokens per generated token were accepted above k=1 in the "
                        "verification run against 0.2500 in the fixed k=3 run (ratio 0.07, below 0.5): the server "
                        "drafted fewer tokens as scheduled.")


def test_ratio_at_the_threshold_is_not_honoured_and_a_count_at_the_minimum_is_enough():
    # verify: 0.25 * 40 = 10 over 100 = 0.1; fixed: 0.5 * 40 = 20 (= MIN_FIXED_COUNT) over 100 = 0.2; ratio 0.5
    assert tm.MIN_FIXED_COUNT == 20 and tm.HONOURED_BELOW == 0.5
    h = tm.honour_check(4, 1, 2, acc([0.9, 0.25], 40, 100), acc([0.9, 0.5], 40, 100))
    assert (h.fixed_count, h.ratio, h.verdict) == (20.0, 0.5, "not honoured")
    assert h.reason == ("At concurrency 4 0.1000 tokens per generated token were accepted above k=1 in the "
                        "verification run against 0.2000 in the fixed k=2 run (ratio 0.50, not below 0.5): the "
                        "server kept drafting beyond the scheduled k.")


def test_just_below_the_threshold_is_honoured():
    h = tm.honour_check(4, 1, 2, acc([0.9, 0.2475], 40, 100), acc([0.9, 0.5], 40, 100))
    assert h.ratio == pytest.approx(0.495) and h.verdict == "honoured"


def test_too_few_fixed_tokens_is_undetermined():
    h = tm.honour_check(4, 1, 2, acc([0.9, 0.0], 40, 100), acc([0.9, 0.49], 40, 100))
    assert h.verdict == "undetermined" and h.ratio is None
    assert h.fixed_count == pytest.approx(19.6) and h.schedule_rate == 0.0 and h.fixed_rate == pytest.approx(0.196)
    assert h.reason == ("At concurrency 4 whether k=1 is honoured cannot be told: only 19.6 tokens were accepted "
                        "above k=1 in the fixed k=2 run, fewer than 20.")


UNKNOWN = "the {} run's acceptance counts are unknown"
LACKS = "the {} run lacks draft, generated-token or per-position counts above k=1"


@pytest.mark.parametrize("verify, fixed, problem, sched_known, fixed_known", [
    (None, acc([0.9, 0.5], 40, 100), UNKNOWN.format("verification"), False, True),
    (acc([0.9, 0.1], 40, 100, known=False), acc([0.9, 0.5], 40, 100), UNKNOWN.format("verification"), False, True),
    (acc([0.9, 0.1], 40, 100), None, UNKNOWN.format("fixed k=2"), True, False),
    (acc([0.9, 0.1], 40, 100), acc([0.9, 0.5], 40, 100, known=False), UNKNOWN.format("fixed k=2"), True, False),
    (acc([0.9, 0.1], None, 100), acc([0.9, 0.5], 40, 100), LACKS.format("verification"), False, True),
    (acc([0.9, 0.1], 0, 100), acc([0.9, 0.5], 40, 100), LACKS.format("verification"), False, True),
    (acc([0.9, 0.1], 40, None), acc([0.9, 0.5], 40, 100), LACKS.format("verification"), False, True),
    (acc([0.9, 0.1], 40, 0), acc([0.9, 0.5], 40, 100), LACKS.format("verification"), False, True),
    (acc([0.9], 40, 100), acc([0.9, 0.5], 40, 100), LACKS.format("verification"), False, True),
    (acc([0.9, 0.1], 40, 100), acc([0.9, 0.5], 0, 100), LACKS.format("fixed k=2"), True, False),
    (acc([0.9, 0.1], 40, 100), acc([0.9, 0.5], 40, 0), LACKS.format("fixed k=2"), True, False),
    (acc([0.9, 0.1], 40, 100), acc([0.9], 40, 100), LACKS.format("fixed k=2"), True, False),
])
def test_undetermined_without_counts(verify, fixed, problem, sched_known, fixed_known):
    h = tm.honour_check(4, 1, 2, verify, fixed)
    assert h.verdict == "undetermined" and h.ratio is None
    assert h.reason == f"At concurrency 4 whether k=1 is honoured cannot be told: {problem}."
    assert (h.schedule_rate == pytest.approx(0.04)) if sched_known else h.schedule_rate is None
    if fixed_known:
        assert (h.fixed_count, h.fixed_rate) == (20.0, 0.2)
    else:
        assert h.fixed_count is None and h.fixed_rate is None


def test_positions_from_the_scheduled_k_on_are_counted():
    # scheduled k = 0: every position counts; the first problem named is the verification run's
    h = tm.honour_check(1, 0, 2, acc([0.25, 0.25], 40, 100), acc([0.5, 0.5], 40, 100))
    assert (h.schedule_rate, h.fixed_rate, h.fixed_count, h.ratio) == (0.2, 0.4, 40.0, 0.5)
    h = tm.honour_check(1, 1, 2, None, acc([0.9], 40, 100))
    assert h.reason.endswith(": " + UNKNOWN.format("verification") + ".")


# ---------------------------------------------------------------- verify_level, overall_honour, reasons

@pytest.mark.parametrize("high, best, as_good", [
    (1.30, ci(1.4, 1.30, 1.5), True), (1.29, ci(1.4, 1.30, 1.5), False),
    (1.0, None, True), (0.99, None, False),
    (None, ci(1.4, 1.3, 1.5), None), (1.3, ci(1.4), None), (None, None, None)])
def test_as_good_when_the_interval_reaches_the_best_fixed(high, best, as_good):
    ratio = RatioCI(point=1.2, low=None if high is None else 1.1, high=high)
    honour = HonourCheck(concurrency=4, scheduled_k=1, engine_k=3, verdict="honoured", reason="r")
    lv = tm.verify_level(4, 1, ratio, 3, best, honour)
    assert lv.as_good is as_good
    assert (lv.concurrency, lv.scheduled_k, lv.ratio, lv.best_fixed_k, lv.best_fixed_ratio, lv.honour) == (
        4, 1, ratio, 3, best, honour)
    assert tm.verify_level(4, 1, ratio, 3, best).honour is None


def hc(verdict: str) -> HonourCheck:
    return HonourCheck(concurrency=1, scheduled_k=1, engine_k=2, verdict=verdict, reason="")


@pytest.mark.parametrize("verdicts, overall", [
    (["honoured", "not honoured", "undetermined"], "not honoured"),
    (["undetermined", "honoured", "not applicable"], "honoured"),
    (["not applicable", "undetermined"], "undetermined"),
    (["not applicable"], "not applicable"), ([], "not applicable")])
def test_overall_honour(verdicts, overall):
    assert tm.overall_honour([hc(v) for v in verdicts]) == overall


def test_verification_reasons():
    levels = [
        LevelVerify(concurrency=1, scheduled_k=4, ratio=ci(1.4, 1.3, 1.5), best_fixed_k=4,
                    best_fixed_ratio=ci(1.4, 1.3, 1.5), as_good=True),
        LevelVerify(concurrency=4, scheduled_k=2, ratio=ci(1.1, 1.02, 1.18), best_fixed_k=4,
                    best_fixed_ratio=ci(1.4, 1.3, 1.5), as_good=False),
        LevelVerify(concurrency=8, scheduled_k=1, ratio=ci(1.1), best_fixed_k=0, as_good=None),
        LevelVerify(concurrency=16, scheduled_k=0, ratio=ci(0.8, 0.7, 0.9), best_fixed_k=0, as_good=False),
    ]
    assert tm.verification_reasons(levels, 2) == [
        "At concurrency 4 the emitted config's 1.10x [1.02, 1.18] falls short of k=4's 1.40x [1.30, 1.50]: "
        "its interval does not reach the other's.",
        "At concurrency 8 there is no interval to tell whether the emitted config's 1.10x is as good as off's 1.00x.",
        "At concurrency 16 the emitted config's 0.80x [0.70, 0.90] falls short of off's 1.00x: "
        "its interval does not reach the other's.",
        "2 prompts diverged from the spec-off output beyond a near-tie (suspect).",
    ]
    assert tm.verification_reasons(levels[:1], 1) == [
        "1 prompt diverged from the spec-off output beyond a near-tie (suspect)."]
    assert tm.verification_reasons(levels[:1], 0) == []
    unknown = LevelVerify(concurrency=2, scheduled_k=1, ratio=ci(None), best_fixed_k=3, as_good=None)
    assert tm.verification_reasons([unknown], 0) == [
        "At concurrency 2 there is no interval to tell whether the emitted config's unknown is as good as k=3's 1.00x."]


# ---------------------------------------------------------------- variant_score

def test_variant_score_is_the_mean_log_of_the_chosen_points():
    assert tm.variant_score([choice(1, 4, point=2.0), choice(8, 0)]) == pytest.approx(math.log(2.0) / 2)
    assert tm.variant_score([choice(1, 4, point=0.5), choice(8, 2, point=1.5)]) == pytest.approx(
        (math.log(0.5) + math.log(1.5)) / 2)
    assert tm.variant_score([choice(1, 0)]) == 0.0
    assert tm.variant_score([]) == 0.0


# ---------------------------------------------------------------- units_problem

@pytest.mark.parametrize("concurrency, prompts, repeat, problem", [
    ([1, 4], 10, 5, None),
    ([1, 4], 10, 4, "--concurrency 4 gives 4 units (one per --repeat); intervals need 5: give --repeat 5."),
    ([4, 1, 8, 16], 10, 3, "--concurrency 4, 8 and 16 give 3 units each (one per --repeat); intervals need 5: "
                           "give --repeat 5."),
    ([2, 8], 10, 1, "--concurrency 2 and 8 give 1 unit each (one per --repeat); intervals need 5: give --repeat 5."),
    ([1], 10, 1, None),
    ([1], 5, 1, None),
    ([1, 2], 2, 2, "--concurrency 2 gives 2 units (one per --repeat); intervals need 5: give --repeat 5."),
    ([1], 2, 2, "--concurrency 1 gives 4 units (prompts x --repeat); intervals need 5: give --repeat 3 or more "
                "prompts."),
    ([1], 4, 1, "--concurrency 1 gives 4 units (prompts x --repeat); intervals need 5: give --repeat 2 or more "
                "prompts."),
    ([1], 1, 1, "--concurrency 1 gives 1 unit (prompts x --repeat); intervals need 5: give --repeat 5 or more "
                "prompts."),
    ([1], 0, 5, "--concurrency 1 gives 0 units (prompts x --repeat); intervals need 5: give prompts."),
    ([4], 0, 5, None),
])
def test_units_problem(concurrency, prompts, repeat, problem):
    assert tm.units_problem(concurrency, prompts, repeat, 5) == problem


def test_units_follow_min_units():
    assert tm.units_problem([4], 10, 3, 3) is None
    assert tm.units_problem([4], 10, 2, 3) == (
        "--concurrency 4 gives 2 units (one per --repeat); intervals need 3: give --repeat 3.")


def test_least_squares_agree_with_polyfit():
    # the fit's least squares agree with numpy's polyfit on a noisy line (a cross-check of the algebra)
    ks = np.array([1.0, 2.0, 4.0, 6.0])
    ys = np.array([1.25, 1.32, 1.61, 1.77])
    c, v = np.polyfit(ks, ys, 1)
    pts = [(int(k), level(ci(2.0 / y), 2.0, [0.5] * 6)) for k, y in zip(ks, ys, strict=True)]
    fit = tm.fit_level(1, pts)
    assert (fit.v, fit.c) == (pytest.approx(v), pytest.approx(c))


@pytest.mark.parametrize("form,text", [
    ("given", "1-3: k=4, 4-4: k=2, 5-16: k=0"),
    ("report", "batch sizes 1-3: k=4; 4: k=2; 5-16: off"),
    ("summary", "batch sizes 1-3 k=4, 4 k=2, 5-16 off"),
])
def test_ranges_text_in_each_form(form, text):
    assert tm.ranges_text([(1, 3, 4), (4, 4, 2), (5, 16, 0)], form) == text


def test_ranges_text_without_ranges():
    assert (tm.ranges_text([]), tm.ranges_text([], "report"), tm.ranges_text([], "summary")) == ("", "-", "-")


# --- run until decided: the sweep's cells (expected values by hand) ------------------------------------------

def test_best_cell_is_the_highest_low_end_and_skips_cells_without_an_interval():
    assert tm.best_cell([]) is None
    assert tm.best_cell([("k=1", None), ("k=2", ci(1.5))]) is None
    cells = [("k=1", ci(1.3, 1.2, 1.4)), ("k=2", ci(1.6, 1.1, 2.1)), ("k=3", None), ("k=4", ci(1.35, 1.25, 1.45)),
             ("k=5", ci(1.3, 1.25, 1.35))]
    label, r = tm.best_cell(cells)
    assert (label, r.low) == ("k=4", 1.25)  # the highest low end (not the highest point); ties: the first
    # a half interval (a low end, no high end) is no interval: left out, even with the highest low end
    half = [("k=1", RatioCI(point=2.0, low=1.9)), ("k=2", ci(1.3, 1.2, 1.4)), ("k=3", RatioCI(point=2.0, high=2.1))]
    assert tm.best_cell(half)[0] == "k=2"


def test_drop_interval_from_the_first_look_when_the_high_end_is_below_the_best_low_end():
    from specadapt.records import SequentialDesign

    design = SequentialDesign()  # alpha 0.05, phi 0.1, first look 6
    # logs +-0.1 over 6 units: mean 0, sd sqrt(0.06 / 5), se sd / sqrt(6); r = 0.1 / 6.1, A = (r 0.05^2)^(1/6)
    # = 0.18568, half-width factor sqrt(5 (1 - A) / (A - r)) = 4.9042: high = exp(0.2193) = 1.24523
    logs = [0.1, -0.1] * 3
    dropped = tm.drop_interval(logs, design, "pairs", ci(1.4, 1.25, 1.55))
    assert (dropped.n, dropped.high, dropped.unit) == (6, pytest.approx(1.24523, abs=1e-5), "pairs")
    assert tm.drop_interval(logs, design, "pairs", ci(1.4, 1.24, 1.55)) is None  # the intervals overlap
    # its high end exactly at best's low end is not below it: the two intervals touch, the cell may tie
    assert tm.drop_interval(logs, design, "pairs", ci(1.4, dropped.high, 1.55)) is None
    assert tm.drop_interval(logs[:5], design, "pairs", ci(9.0, 8.0, 10.0)) is None  # before the first look
    assert tm.drop_interval([None, *logs], design, "pairs", ci(1.4, 1.25, 1.55)).n == 6  # None left out
    floored = design.model_copy(update={"min_units": 7})
    assert tm.drop_interval(logs, floored, "pairs", ci(9.0, 8.0, 10.0)) is None  # below the run's floor
    assert tm.drop_interval(logs, design, "pairs", None) is None
    assert tm.drop_interval(logs, design, "pairs", ci(1.4)) is None  # a best without an interval
    early = design.model_copy(update={"first_look": 2})
    assert tm.drop_interval([0.0, 0.0], early, "pairs", ci(9.0, 8.0, 10.0)) is None  # no interval yet at 2


def test_requests_text_and_the_sweep_total():
    assert tm.requests_text(12, 50) == "12 requests against 50 for the fixed design (76% fewer)"
    assert tm.requests_text(60, 50) == "60 requests against 50 for the fixed design (20% more)"
    assert tm.requests_text(12, None) == tm.requests_text(12, 0) == "12 requests"
    # as many as the fixed design: none saved, said "0% fewer"; a fixed count of 1 is still a count
    assert tm.requests_text(50, 50) == "50 requests against 50 for the fixed design (0% fewer)"
    assert tm.requests_text(2, 1) == "2 requests against 1 for the fixed design (100% more)"
    from specadapt.records.tune import CellOutcome

    def cell(requests, fixed):
        return CellOutcome(concurrency=1, stopped="cap", verdict="no clear difference", units=1, requests=requests,
                           fixed_requests=fixed, interval=ci(1.0), text="")

    assert tm.sweep_requests([cell(12, 50), cell(20, 30)]) == (32, 80)
    assert tm.sweep_requests([cell(12, 50), cell(20, None)]) == (32, None)
    assert tm.sweep_requests([]) == (0, 0)


def test_cell_outcome_keeps_the_rule_s_outcome_or_says_it_was_dropped_with_both_intervals():
    from specadapt.records import SequentialOutcome

    outcome = SequentialOutcome(verdict="faster", stopped="decided", units=6, requests=12, fixed_requests=30,
                                interval=ci(1.5, 1.2, 1.8).model_copy(update={"unit": "pairs"}), text="T")
    kept = tm.cell_outcome(1, outcome, "tpot")
    assert (kept.stopped, kept.verdict, kept.units, kept.requests, kept.fixed_requests, kept.text,
            kept.best_label) == ("decided", "faster", 6, 12, 30, "T", None)
    undecided = outcome.model_copy(update={"verdict": "no clear difference", "stopped": "identity",
                                           "interval": ci(1.01, 0.9, 1.12).model_copy(update={"unit": "blocks"})})
    cell = tm.cell_outcome(4, undecided, "e2e", ("k=2", ci(1.5, 1.2, 1.8)))
    assert (cell.concurrency, cell.stopped, cell.verdict, cell.best_label, cell.best_interval.low) == (
        4, "dropped", "no clear difference", "k=2", 1.2)
    assert cell.text == ("dropped after 6 blocks: E2E 1.01x [0.90, 1.12] lies below k=2's 1.50x [1.20, 1.80] at "
                         "this batch size, so it cannot beat it; 12 requests against 30 for the fixed design "
                         "(60% fewer)")

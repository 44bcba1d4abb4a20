"""`specadapt watch`'s arithmetic (analysis/watch.py): intervals and restarts, windows and the fleet,
the drift test (replayed over simulated days), and the expected speedup from a baseline."""

from __future__ import annotations

import math

import numpy as np
import pytest

from specadapt.analysis.watch import (
    CostModel,
    DriftDetector,
    DriftSettings,
    Interval,
    LevelCost,
    Window,
    WindowSums,
    arl0,
    baseline_problem,
    cost_at,
    cost_model_from_compare,
    cost_model_from_tune,
    decision_level,
    detection_delay_blocks,
    expected_speedup,
    figures,
    fleet_sums,
    interval_between,
    sigma_upper,
    wilson,
)
from specadapt.records import (
    AcceptanceSummary,
    CompareReport,
    CompareSettings,
    CounterSnapshot,
    Distribution,
    LatencySummary,
    LevelResult,
    RatioCI,
    ServerInfo,
    SpeedRatios,
)
from specadapt.records.tune import FitPoint, LevelFit, TuneReport, TuneSettings
from specadapt.records.watch import HistogramState, LiveSnapshot
from specadapt.testing.counter_series import Simulator, Timeline, replay


def snap(at, drafts=0.0, tokens=0.0, acc=0.0, pos=(), gen=0.0, running=None, ttft=None, tpot=None,
         spec=True) -> LiveSnapshot:
    c = CounterSnapshot(drafts=drafts if spec else None, draft_tokens=tokens if spec else None,
                        accepted_tokens=acc if spec else None, accepted_per_position=dict(enumerate(pos)),
                        generation_tokens=gen)
    return LiveSnapshot(at=at, counters=c, running=running,
                        ttft=HistogramState(sum=ttft[0], count=ttft[1]) if ttft else None,
                        tpot=HistogramState(sum=tpot[0], count=tpot[1]) if tpot else None)


# ------------------------------------------------------------------------------ intervals

def test_interval_is_the_difference_of_two_reads():
    a = snap(10.0, 100, 300, 150, (80, 50, 20), 400, running=2, ttft=(1.0, 10), tpot=(2.0, 100))
    b = snap(12.5, 110, 330, 166, (88, 55, 23), 436, running=6, ttft=(1.5, 12), tpot=(2.4, 136))
    iv = interval_between(a, b)
    assert iv == Interval(start=10.0, end=12.5, drafts=10, draft_tokens=30, accepted=16, per_position=(8, 5, 3),
                          generation=36, running=4.0, ttft_sum=0.5, ttft_count=2, tpot_sum=pytest.approx(0.4),
                          tpot_count=36)
    assert iv.seconds == 2.5


@pytest.mark.parametrize("field", ["drafts", "tokens", "acc", "gen"])
def test_a_counter_that_goes_down_is_a_restart_not_a_negative_rate(field):
    base = {"drafts": 100, "tokens": 300, "acc": 150, "gen": 400}
    later = {k: v + 10 for k, v in base.items()}
    later[field] = 3  # the counter started again from zero
    assert interval_between(snap(0, **base), snap(1, **later)) is None
    assert interval_between(snap(0, **base), snap(1, **{k: v + 10 for k, v in base.items()})) is not None


def test_a_position_or_histogram_that_goes_down_is_a_restart():
    a = snap(0, 10, 30, 15, (9, 6), ttft=(1.0, 10), tpot=(2.0, 20))
    assert interval_between(a, snap(1, 11, 33, 16, (2, 6), ttft=(1.1, 11), tpot=(2.1, 21))) is None
    assert interval_between(a, snap(1, 11, 33, 16, (10, 6), ttft=(0.1, 11), tpot=(2.1, 21))) is None
    assert interval_between(a, snap(1, 11, 33, 16, (10, 6), ttft=(1.1, 1), tpot=(2.1, 21))) is None
    assert interval_between(a, snap(1, 11, 33, 16, (10, 6), ttft=(1.1, 11), tpot=(1.0, 21))) is None
    assert interval_between(a, snap(1, 11, 33, 16, (10, 6), ttft=(1.1, 11), tpot=(2.1, 20))) is not None


def test_counters_that_appear_or_vanish_are_a_restart():
    assert interval_between(snap(0, spec=False), snap(1, 5, 15, 7)) is None
    assert interval_between(snap(0, 5, 15, 7), snap(1, spec=False)) is None
    iv = interval_between(snap(0, gen=10, spec=False), snap(1, gen=25, spec=False))
    assert iv is not None and iv.drafts is None and iv.generation == 15


def test_a_gauge_read_once_is_taken_as_it_is():
    iv = interval_between(snap(0, running=None), snap(1, running=7))
    assert iv.running == 7
    assert interval_between(snap(0, running=3), snap(1, running=None)).running == 3
    assert interval_between(snap(0), snap(1)).running is None


# ------------------------------------------------------------------------------ windows

def test_window_figures_equal_the_counter_deltas_over_the_window():
    reads = [snap(t, 10 * t, 30 * t, 12 * t + (t % 2), (6 * t, 4 * t, 2 * t + (t % 2)), 22 * t + (t % 2),
                  running=2 + t % 3, ttft=(0.1 * t, t), tpot=(0.01 * 22 * t, 22 * t)) for t in range(11)]
    w = Window(window_s=100)
    for a, b in zip(reads, reads[1:], strict=False):
        w.add(interval_between(a, b))
    f = figures(w.sums())
    first, last = reads[0].counters, reads[-1].counters
    assert f.acceptance_rate == pytest.approx((last.accepted_tokens - first.accepted_tokens)
                                              / (last.draft_tokens - first.draft_tokens))
    assert f.mean_acceptance_length == pytest.approx(1 + (last.accepted_tokens - first.accepted_tokens)
                                                     / (last.drafts - first.drafts))
    assert f.per_position_rate == pytest.approx((0.6, 0.4, 0.2))
    assert f.draft_tokens_per_s == pytest.approx(30.0)
    assert f.accepted_per_s == pytest.approx(12.0)
    assert f.verify_passes_per_s == pytest.approx(10.0)
    assert f.generation_per_s == pytest.approx(22.0)
    # time-weighted mean of the mean of each interval's two readings: (2,3),(3,4),(4,2),...
    gauges = [2 + t % 3 for t in range(11)]
    assert f.running == pytest.approx(sum((a + b) / 2 for a, b in zip(gauges, gauges[1:], strict=False)) / 10)
    assert f.ttft_s == pytest.approx(0.1)
    assert f.tpot_s == pytest.approx(0.01)
    assert (f.seconds, f.drafts, f.draft_tokens, f.accepted) == (10, 100, 300, 120)


def test_window_keeps_only_its_last_seconds_and_a_bounded_number():
    w = Window(window_s=5)
    for t in range(20):
        w.add(Interval(start=t, end=t + 1, drafts=1, draft_tokens=3, accepted=t % 3))
    assert len(w) == 5  # ends 16..20 are within 5 s of 20
    assert w.sums().seconds == 5
    assert w.sums(now=22.5).seconds == 3  # the intervals ending at 18, 19 and 20 end after 22.5 - 5
    bounded = Window(window_s=1e9, max_intervals=3)
    for t in range(10):
        bounded.add(Interval(start=t, end=t + 1))
    assert len(bounded) == 3
    with pytest.raises(ValueError):
        Window(0)


def test_empty_window_says_nothing():
    f = figures(WindowSums())
    assert (f.acceptance_rate, f.mean_acceptance_length, f.per_position_rate, f.draft_tokens_per_s, f.running,
            f.ttft_s, f.tpot_s, f.generation_per_s) == (None, None, (), None, None, None, None, None)


def test_intervals_without_spec_counters_give_no_draft_rates():
    w = WindowSums()
    w.add(Interval(start=0, end=2, generation=10))
    f = figures(w)
    assert f.draft_tokens_per_s is None and f.generation_per_s == 5 and w.spec_intervals == 0


def test_fleet_is_a_ratio_of_sums_and_batches_add_up():
    a, b = WindowSums(), WindowSums()
    a.add(Interval(start=0, end=10, drafts=100, draft_tokens=300, accepted=270, per_position=(90, 90, 90),
                   running=2, ttft_sum=1, ttft_count=10))
    b.add(Interval(start=0, end=10, drafts=10, draft_tokens=30, accepted=3, per_position=(3,), running=6,
                   ttft_sum=3, ttft_count=10))
    f = figures(fleet_sums([a, b]))
    assert f.acceptance_rate == pytest.approx(273 / 330)  # not the mean of 0.9 and 0.1
    assert f.per_position_rate == pytest.approx((93 / 110, 90 / 110, 90 / 110))
    assert f.running == pytest.approx(8)
    assert f.ttft_s == pytest.approx(0.2)
    assert f.mean_acceptance_length == pytest.approx(1 + 273 / 110)


# ------------------------------------------------------------------------------ drift arithmetic

def test_siegmund_in_control_run_length_matches_a_simulated_cusum():
    kappa, h = 0.5, 3.0
    rng = np.random.default_rng(7)
    lengths = []
    for _ in range(400):
        s, n = 0.0, 0
        while s <= h:
            s = max(0.0, s + rng.normal() - kappa)
            n += 1
        lengths.append(n)
    assert np.mean(lengths) == pytest.approx(arl0(kappa, h), rel=0.15)


def test_siegmund_delay_matches_a_simulated_shift():
    kappa, h, shift = 1.0, 4.0, 2.0
    rng = np.random.default_rng(11)
    lengths = []
    for _ in range(400):
        s, n = 0.0, 0
        while s <= h:
            s = max(0.0, s + rng.normal() + shift - kappa)
            n += 1
        lengths.append(n)
    assert np.mean(lengths) == pytest.approx(detection_delay_blocks(kappa, h, shift), rel=0.15)
    assert detection_delay_blocks(kappa, h, kappa) == pytest.approx((h + 1.166) ** 2)


def test_decision_level_inverts_the_run_length():
    for kappa, blocks, rate in ((1.0, 1440, 0.1), (0.5, 86400, 1.0), (0.25, 100, 2.0)):
        h = decision_level(kappa, blocks, rate)
        assert arl0(kappa, h) == pytest.approx(blocks / rate, rel=1e-6)
    with pytest.raises(ValueError):
        decision_level(1.0, 1440, 0)
    with pytest.raises(ValueError):
        decision_level(1.0, 0, 1)


def test_settings_derive_kappa_level_and_delay():
    s = DriftSettings(block_s=60, false_alarms_per_day=0.1, shift_sigmas=2.0)
    assert s.kappa == 1.0
    assert arl0(1.0, s.h) == pytest.approx(1440 / 0.1, rel=1e-6)
    assert s.delay_s() == pytest.approx(detection_delay_blocks(1.0, s.h, 2.0) * 60)
    assert s.delay_s(3.0) < s.delay_s()


def test_sigma_upper_bound_is_above_the_estimate_and_shrinks_with_blocks():
    assert sigma_upper(1.0, 1) == 1.0
    assert sigma_upper(1.0, 5) > sigma_upper(1.0, 30) > sigma_upper(1.0, 1000) > 1.0
    # chi-square 5% quantile with 4 degrees of freedom is 0.7107
    assert sigma_upper(1.0, 5) == pytest.approx(math.sqrt(4 / 0.710723), rel=1e-4)


def judged(settings: DriftSettings, xs, tokens=1000.0) -> DriftDetector:
    d = DriftDetector(settings)
    for x in xs:
        d.judge(x, tokens)
    return d


def test_detector_learns_then_accumulates_the_fall():
    s = DriftSettings(block_s=1, learn_blocks=4, false_alarms_per_day=1.0, shift_sigmas=2.0)
    d = judged(s, [0.5, 0.6, 0.5, 0.6])
    assert d.mu0 == pytest.approx(0.55)
    sd = math.sqrt(4 * 0.05 ** 2 / 3)
    assert d.sigma == pytest.approx(sigma_upper(sd, 4))
    assert d.learning is False and d.statistic == 0.0 and d.blocks == 0
    d.judge(0.55 - 3 * d.sigma, 1000)  # z = 3: S = 3 - kappa = 2
    assert d.statistic == pytest.approx(2.0) and d.blocks == 1
    d.judge(0.55 + 10 * d.sigma, 1000)  # a rise drains it to 0
    assert d.statistic == 0.0
    alarm = None
    for _ in range(50):
        alarm = d.judge(0.55 - 3 * d.sigma, 1000)
        if alarm:
            break
    assert alarm is True and d.alarm and d.statistic > d.h
    n_to_alarm = d.blocks - 2
    assert n_to_alarm == math.floor(d.h / 2.0) + 1
    for _ in range(200):
        d.judge(0.55 + 3 * d.sigma, 1000)
    assert d.statistic == 0.0 and d.alarm is False


def test_detector_alarm_holds_between_the_level_and_zero():
    s = DriftSettings(block_s=1, learn_blocks=2, false_alarms_per_day=1.0)
    d = judged(s, [0.5, 0.5])
    d.sigma = 0.01
    d.statistic = d.h + 0.5
    d.judge(0.5, 1000)  # z = 0: S falls by kappa, still above 0
    assert d.alarm is False or d.statistic > 0
    d.statistic, d.alarm = d.h + 0.5, True
    d.judge(0.5, 1000)
    assert d.alarm is True and 0 < d.statistic < d.h


def test_sigma_has_the_binomial_floor():
    s = DriftSettings(block_s=1, learn_blocks=3)
    d = judged(s, [0.5, 0.5, 0.5], tokens=100.0)  # no spread between blocks
    assert d.sigma == pytest.approx(math.sqrt(0.25 / 100))


def test_blocks_fill_by_time_and_quiet_ones_are_skipped():
    s = DriftSettings(block_s=2, learn_blocks=2, min_draft_tokens=50)
    d = DriftDetector(s)
    assert d.feed(Interval(start=0, end=1, draft_tokens=40, accepted=20)) is None
    assert d.feed(Interval(start=1, end=2, draft_tokens=5, accepted=2)) is None  # 45 tokens: too quiet
    assert d.skipped == 1 and d.learned == []
    d.feed(Interval(start=2, end=3, draft_tokens=40, accepted=20))
    d.feed(Interval(start=3, end=4, draft_tokens=60, accepted=40))
    assert d.learned == [pytest.approx(0.6)] and d.learned_tokens == [100]
    assert d.feed(Interval(start=4, end=5)) is None  # no counters: nothing added
    d.feed(Interval(start=4, end=5, draft_tokens=50, accepted=10))
    d.restart()  # the half block is dropped
    d.feed(Interval(start=6, end=8, draft_tokens=100, accepted=50))
    assert d.learned == [pytest.approx(0.6), pytest.approx(0.5)] and d.mu0 == pytest.approx(0.55)


# ------------------------------------------------------------------------------ drift on replayed series

def run_detector(reads, settings: DriftSettings) -> tuple[DriftDetector, list[float]]:
    d = DriftDetector(settings)
    alarms, was = [], False
    for a, b in zip(reads, reads[1:], strict=False):
        iv = interval_between(a, b)
        if iv is None:
            d.restart()
            continue
        d.feed(iv)
        if d.alarm and not was:
            alarms.append(b.at)
        was = d.alarm
    return d, alarms


STEADY = dict(drafts_per_s=5.0, k=3, block_noise=0.02, noise_block_s=60.0, step_s=60.0)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_steady_series_raise_no_more_false_alarms_than_stated(seed):
    """30 simulated days of a steady server (binomial draws plus a wobble between blocks, so the
    spread is not a binomial idealisation) at 1 false alarm a day stated: at most the stated rate
    plus Poisson's 99.9% slack."""
    days, rate = 30, 1.0
    tl = Timeline(acceptance=[(0.0, 0.6)], seed=seed, **STEADY)
    reads = replay(tl, until_s=days * 86400, every_s=60.0)
    _, alarms = run_detector(reads, DriftSettings(block_s=60, learn_blocks=30, false_alarms_per_day=rate,
                                                  min_draft_tokens=100))
    assert len(alarms) <= days * rate + 3.1 * math.sqrt(days * rate)


def test_steady_series_at_the_default_rate_raise_none_in_a_week():
    tl = Timeline(acceptance=[(0.0, 0.7)], seed=5, **STEADY)
    reads = replay(tl, until_s=7 * 86400, every_s=60.0)
    _, alarms = run_detector(reads, DriftSettings(block_s=60, min_draft_tokens=100))
    assert alarms == []


def test_a_planted_decay_raises_the_alarm_within_the_stated_delay():
    """One steady day, then the acceptance decays over six hours (the pattern of a server whose
    acceptance length falls until it is restarted), then a restart brings it back. The alarm must
    come no later than the stated expected delay after the fall reaches the tuned shift."""
    day = 86400.0
    tl = Timeline(acceptance=[(0.0, 0.7), (day, 0.7), (day + 6 * 3600, 0.45)], seed=4, restarts=[day + 8 * 3600],
                  **STEADY)
    tl.acceptance.append((day + 8 * 3600, 0.7))
    reads = replay(tl, until_s=day + 12 * 3600, every_s=60.0)
    settings = DriftSettings(block_s=60, min_draft_tokens=100)
    d, alarms = run_detector(reads, settings)
    assert d.mu0 is not None and len(alarms) >= 1
    sim = Simulator(tl)
    # when the mean block acceptance first stands shift * sigma below the reference
    t = day
    while True:
        a = sim.acceptance(t)
        mean = (a + a ** 2 + a ** 3) / 3
        if mean <= d.mu0 - settings.shift_sigmas * d.sigma:
            break
        t += 60
    assert day < alarms[0] <= t + settings.delay_s()
    assert all(x > day for x in alarms)  # nothing in the steady day


def test_a_step_fall_is_caught_on_average_as_fast_as_stated():
    settings = DriftSettings(block_s=60, learn_blocks=30, false_alarms_per_day=0.1, min_draft_tokens=100)
    rng = np.random.default_rng(3)
    delays = []
    for _ in range(60):
        d = judged(settings, list(0.5 + rng.normal(0, 0.02, 30)))
        d.sigma = 0.02  # the true spread: the delay is Siegmund's at that sigma
        d.mu0 = 0.5
        n = 0
        while not d.alarm:
            d.judge(0.5 - 2 * 0.02 + rng.normal(0, 0.02), 1000)
            n += 1
        delays.append(n)
    assert np.mean(delays) * 60 == pytest.approx(settings.delay_s(), rel=0.2)


# ------------------------------------------------------------------------------ paying

def ci(point, low=None, high=None) -> RatioCI:
    return RatioCI(point=point, low=low, high=high, n=5)


def latency() -> LatencySummary:
    return LatencySummary(requests=5, succeeded=5, failed=0, output_tokens=100, duration_s=1.0,
                          output_tokens_per_s=100.0, ttft_ms=Distribution(), itl_ms=Distribution(),
                          tpot_ms=Distribution(), e2e_ms=Distribution(), tokens_per_chunk_mean=None)


def level(concurrency, tpot: RatioCI, length) -> LevelResult:
    acc = AcceptanceSummary(known=True, mean_acceptance_length=length, per_position_rate=[0.7, 0.5, 0.3])
    return LevelResult(concurrency=concurrency, pairs=5, off=latency(), on=latency(), acceptance=acc,
                       speed=SpeedRatios(tpot=tpot, e2e=ci(None), throughput=ci(None)))


def compare_report(levels, k=3, model="m", method="ngram") -> CompareReport:
    on = ServerInfo(backend="vllm", base_url="http://on", model_id=model, spec_method=method,
                    num_speculative_tokens=k)
    return CompareReport(settings=CompareSettings(), off_server=ServerInfo(backend="vllm", base_url="http://off"),
                         on_server=on, levels=levels)


def test_compare_baseline_gives_one_plus_c_k_per_level():
    rep = compare_report([level(1, ci(2.0, 1.8, 2.3), 2.5), level(16, ci(1.0, 0.9, 1.2), 2.5),
                          level(8, ci(None), 2.0)])
    m = cost_model_from_compare(rep)
    assert [lv.concurrency for lv in m.levels] == [1, 16]
    one, sixteen = m.levels
    assert one.v == 1.0 and one.c == pytest.approx((2.5 / 2.0 - 1) / 3)
    assert sixteen.c == pytest.approx((2.5 - 1) / 3)
    assert (one.rel_low, one.rel_high) == (pytest.approx(0.1), pytest.approx(0.15))
    assert (m.k, m.model_id, m.spec_method) == (3, "m", "ngram")
    assert cost_model_from_compare(compare_report([level(1, ci(2.0), 2.5)], k=None)).levels == ()


def test_tune_baseline_takes_the_fits_of_the_base_variant():
    fits = [LevelFit(concurrency=4, form="v + c k", v=1.1, c=0.2, max_rel_error=0.05,
                     points=[FitPoint(k=2, measured=1.5, low=1.2, high=1.65, tokens_per_pass=2, predicted=1.5)]),
            LevelFit(concurrency=1, form="v + c k", v=1.0, c=0.05, max_rel_error=0.3),
            LevelFit(concurrency=1, variant="ngram_max=2", form="v + c k", v=9, c=9),
            LevelFit(concurrency=8, form="none")]
    rep = TuneReport(settings=TuneSettings(backend="vllm", base_spec={"method": "ngram"}, ks=[0, 2], concurrency=[1, 4],
                                           repeat=1, warmup=0, request={}), fits=fits)
    m = cost_model_from_tune(rep)
    assert [(lv.concurrency, lv.v, lv.c) for lv in m.levels] == [(1, 1.0, 0.05), (4, 1.1, 0.2)]
    assert (m.levels[0].rel_low, m.levels[0].rel_high) == (0.3, 0.3)
    assert m.levels[1].rel_low == pytest.approx(0.2) and m.levels[1].rel_high == pytest.approx(0.1)
    assert m.spec_method == "ngram" and m.model_id is None


MODEL = CostModel(levels=(LevelCost(1, 1.0, 0.1, 0.1, 0.1), LevelCost(9, 1.2, 0.5, 0.2, 0.3)), k=3,
                  model_id="m", spec_method="ngram", source="test")


def test_cost_is_interpolated_between_levels_and_nearest_outside():
    assert cost_at(MODEL, 0.5) == (MODEL.levels[0], None)
    assert cost_at(MODEL, 1) == (MODEL.levels[0], None)
    mid, note = cost_at(MODEL, 5)
    assert (mid.v, mid.c, mid.rel_low, mid.rel_high, note) == (pytest.approx(1.1), pytest.approx(0.3), 0.2, 0.3, None)
    assert cost_at(MODEL, 9) == (MODEL.levels[1], None)
    top, note = cost_at(MODEL, 20)
    assert top == MODEL.levels[1] and "above the largest measured level (9)" in note
    with pytest.raises(ValueError):
        cost_at(CostModel(levels=(), k=1, model_id=None, spec_method=None, source=""), 1)


def test_wilson_interval():
    lo, hi = wilson(50, 100)
    assert lo == pytest.approx(0.4038, abs=1e-3) and hi == pytest.approx(0.5962, abs=1e-3)
    assert wilson(0, 0) == (0.0, 1.0)
    assert wilson(0, 10)[0] == 0.0 and wilson(10, 10)[1] == 1.0


def window(rates, drafts, running) -> object:
    w = WindowSums()
    w.add(Interval(start=0, end=10, drafts=drafts, draft_tokens=3 * drafts, accepted=sum(rates) * drafts,
                   per_position=tuple(r * drafts for r in rates), running=running))
    return figures(w)


def test_expected_speedup_at_the_live_batch():
    f = window([0.8, 0.6, 0.4], 10_000, 1.0)
    e = expected_speedup(MODEL, f)
    assert e.point == pytest.approx(2.8 / 1.3) and e.k == 3 and e.batch == 1.0
    bounds = [wilson(r * 10_000, 10_000) for r in (0.8, 0.6, 0.4)]
    assert e.low == pytest.approx((1 + sum(b[0] for b in bounds)) / 1.3 * 0.9)
    assert e.high == pytest.approx((1 + sum(b[1] for b in bounds)) / 1.3 * 1.1)
    assert e.costing_time is False and e.best_k == 3


def test_collapsed_acceptance_at_high_batch_is_costing_time_and_the_model_picks_off():
    f = window([0.05, 0.01, 0.0], 10_000, 12.0)
    e = expected_speedup(MODEL, f)
    assert e.point == pytest.approx(1.06 / (1.2 + 0.5 * 3)) and e.high < 1
    assert e.costing_time is True and e.best_k == 0
    assert "above the largest" in e.note


def test_costing_time_needs_the_upper_bound_below_one():
    model = CostModel(levels=(LevelCost(1, 1.0, 0.36, 0.0, 0.2),), k=2, model_id=None, spec_method=None, source="")
    e = expected_speedup(model, window([0.6, 0.1], 10_000, 1.0))
    assert e.point < 1 < e.high and e.costing_time is False
    assert e.best_k == 1  # 1.6 / 1.36 beats 1.7 / 1.72 and 1


def test_expected_speedup_says_nothing_without_what_it_needs():
    assert expected_speedup(MODEL, window([0.8, 0.6, 0.4], 0, 1.0)) is None
    assert expected_speedup(MODEL, window([0.8, 0.6, 0.4], 100, None)) is None
    assert expected_speedup(MODEL, window([0.8, 0.6], 100, 1.0)) is None  # k = 3 > positions measured
    assert expected_speedup(MODEL, window([0.8, 0.6], 100, 1.0), k=2).k == 2
    empty = CostModel(levels=(), k=3, model_id=None, spec_method=None, source="")
    assert expected_speedup(empty, window([0.8, 0.6, 0.4], 100, 1.0)) is None
    bad = CostModel(levels=(LevelCost(1, -1.0, 0.1, 0, 0),), k=3, model_id=None, spec_method=None, source="")
    assert expected_speedup(bad, window([0.8, 0.6, 0.4], 100, 1.0)) is None


def test_baseline_of_another_model_or_method_is_refused():
    assert baseline_problem(MODEL, "m", "ngram") is None
    assert baseline_problem(MODEL, None, None) is None
    assert "model 'm'" in baseline_problem(MODEL, "other", "ngram") and "'other'" in baseline_problem(MODEL, "other", "x")
    assert "method 'ngram'" in baseline_problem(MODEL, "m", "eagle")
    assert baseline_problem(MODEL, "m", "[ngram]") is None  # vLLM's placeholder name for the n-gram draft
    assert baseline_problem(CostModel(levels=(), k=1, model_id=None, spec_method="draft_model", source=""), "m",
                            "draft-model") is None


# ------------------------------------------------------------------------------ edges (each a mutant's test)

def test_a_histogram_or_counter_read_once_adds_nothing():
    iv = interval_between(snap(0, 1, 3, 1, gen=5, ttft=None, tpot=(1.0, 10)), snap(1, 2, 6, 2, gen=9,
                                                                                  ttft=(2.0, 20), tpot=None))
    assert (iv.ttft_sum, iv.ttft_count, iv.tpot_sum, iv.tpot_count) == (0.0, 0.0, 0.0, 0.0)
    a = snap(0, 1, 3, 1)
    a.counters.generation_tokens = None
    iv = interval_between(a, snap(1, 2, 6, 2, gen=9))
    assert iv.generation is None and iv.drafts == 1


def test_a_position_seen_first_in_the_later_read_counts_from_zero():
    iv = interval_between(snap(0, 10, 30, 5, (5,)), snap(1, 12, 36, 8, (6, 2)))
    assert iv.per_position == (1, 2)
    assert interval_between(snap(0, 10, 30, 5, (5, 1)), snap(1, 12, 36, 8, (6,))) is None  # vanished: down


def test_window_sums_count_intervals_and_grow_positions_both_ways():
    w = WindowSums()
    w.add(Interval(start=0, end=1, drafts=2, draft_tokens=6, accepted=3, per_position=(2, 1)))
    w.add(Interval(start=1, end=2, drafts=2, draft_tokens=6, accepted=4, per_position=(2, 1, 1)))
    w.add(Interval(start=2, end=3, drafts=1, draft_tokens=3, accepted=1, per_position=(1,)))
    w.add(Interval(start=3, end=4, drafts=1, draft_tokens=None, accepted=1, generation=None))
    w.add(Interval(start=4, end=5, drafts=None, draft_tokens=3, accepted=None))
    assert (w.intervals, w.spec_intervals) == (5, 3)
    assert w.per_position == [5, 2, 1] and w.drafts == 5 and w.accepted == 8 and w.generation == 0.0
    merged = WindowSums()
    merged.merge(w)
    merged.merge(w)
    short = WindowSums()
    short.add(Interval(start=0, end=1, drafts=1, draft_tokens=3, accepted=1, per_position=(1,)))
    merged.merge(short)
    assert merged.per_position == [11, 4, 2] and merged.intervals == 11 and merged.spec_intervals == 7
    longer = WindowSums()
    longer.merge(short)
    longer.merge(w)
    assert longer.per_position == [6, 2, 1]


def test_figures_of_a_single_token_and_a_half_second():
    w = WindowSums()
    w.add(Interval(start=0, end=0.5, drafts=1, draft_tokens=1, accepted=1, per_position=(1,), generation=2,
                   ttft_sum=0.2, ttft_count=1, tpot_sum=0.1, tpot_count=1))
    f = figures(w)
    assert (f.acceptance_rate, f.mean_acceptance_length, f.per_position_rate) == (1.0, 2.0, (1.0,))
    assert (f.ttft_s, f.tpot_s) == (0.2, 0.1)
    assert f.draft_tokens_per_s == 2.0 and f.generation_per_s == 4.0


def test_error_messages_say_what_is_wrong():
    with pytest.raises(ValueError, match="^window_s must be positive$"):
        Window(-1)
    with pytest.raises(ValueError, match="^false alarms per day and blocks per day must be positive$"):
        decision_level(1.0, 10, -1)
    with pytest.raises(ValueError, match="^the cost model has no level$"):
        cost_at(CostModel(levels=(), k=1, model_id=None, spec_method=None, source=""), 1)
    assert arl0(1.0, decision_level(1.0, 0.5, 0.01)) == pytest.approx(50, rel=1e-6)  # under one block a day


def test_run_lengths_by_formula():
    b = 2.0 + 1.166
    assert arl0(0.5, 2.0) == pytest.approx((math.exp(b) - b - 1) / 0.5)
    assert detection_delay_blocks(0.5, 2.0, 2.5) == pytest.approx((math.exp(-4 * b) + 4 * b - 1) / 8)
    assert detection_delay_blocks(1.0, 3.0, 1.0 + 1e-13) == pytest.approx((3.0 + 1.166) ** 2)
    # the delay is continuous where the shift meets kappa: the special case is the formula's limit
    for eps in (1e-3, -1e-3):
        assert detection_delay_blocks(1.0, 3.0, 1.0 + eps) == pytest.approx((3.0 + 1.166) ** 2, rel=0.01)
    # and it falls as the shift grows (a larger fall is found sooner)
    delays = [detection_delay_blocks(1.0, 3.0, s) for s in (0.5, 1.0, 1.5, 2.0, 3.0)]
    assert delays == sorted(delays, reverse=True)
    h = decision_level(0.5, 1440, 288.0)
    assert arl0(0.5, h) == pytest.approx(5, rel=1e-9) and 0 < h < 1  # a level below the first guess of 1


def test_sigma_upper_at_two_blocks():
    assert sigma_upper(1.0, 2) == pytest.approx(math.sqrt(1 / 0.0039321), rel=1e-4)


def test_detector_starts_empty_and_counts_what_it_skips():
    d = DriftDetector(DriftSettings(block_s=1, learn_blocks=2, min_draft_tokens=10))
    assert (d.mu0, d.sigma, d.statistic, d.alarm, d.last_block, d.blocks, d.skipped) == (None, None, 0.0, False,
                                                                                           None, 0, 0)
    assert d.feed(Interval(start=0, end=1, draft_tokens=10, accepted=7)) is None
    assert d.learned == [0.7] and d.last_block == 0.7  # exactly min_draft_tokens: judged
    d.feed(Interval(start=1, end=2, draft_tokens=9, accepted=7))
    d.feed(Interval(start=2, end=3, draft_tokens=9, accepted=7))
    assert d.skipped == 2
    assert d.feed(Interval(start=3, end=4, draft_tokens=None, accepted=5)) is None and d._tok == 0
    assert d.feed(Interval(start=3, end=4, draft_tokens=20, accepted=None)) is None and d._tok == 0


def test_alarm_needs_the_statistic_above_the_level():
    d = judged(DriftSettings(block_s=1, learn_blocks=2, shift_sigmas=2.0), [0.5, 0.5])
    d.sigma, d.mu0 = 1.0, 0.5
    d.statistic = d.h - 1.0
    d.judge(0.5 - 2.0, 1000)  # z = 2, kappa = 1: S = h exactly
    assert d.statistic == pytest.approx(d.h) and d.alarm is False


def test_two_learned_blocks_give_their_spread():
    d = judged(DriftSettings(block_s=1, learn_blocks=2), [0.4, 0.6], tokens=10_000.0)
    assert d.sigma == pytest.approx(sigma_upper(math.sqrt(0.02), 2))


def test_default_sources_name_the_report_kind():
    assert cost_model_from_compare(compare_report([level(1, ci(2.0, 1.8, 2.3), 2.5)])).source == "compare report"
    rep = TuneReport(settings=TuneSettings(backend="vllm", base_spec={}, ks=[0, 2], concurrency=[1], repeat=1,
                                           warmup=0, request={}),
                     fits=[LevelFit(concurrency=1, form="v + c k", v=1.0, c=0.1),
                           LevelFit(concurrency=2, variant="x", form="v + c k", v=1.0, c=0.1)])
    m = cost_model_from_tune(rep)
    assert m.source == "tune report" and [lv.concurrency for lv in m.levels] == [1]


def test_one_learned_block_takes_the_binomial_spread():
    d = judged(DriftSettings(block_s=1, learn_blocks=1), [0.75], tokens=300.0)
    assert d.mu0 == 0.75 and d.sigma == pytest.approx(math.sqrt(0.75 * 0.25 / 300))


def test_relative_interval_needs_a_point_and_both_bounds():
    from specadapt.analysis.watch import _rel

    assert _rel(2.0, 1.5, 2.5) == (0.25, 0.25)
    assert _rel(2.0, None, 2.5) == (0.0, 0.0) and _rel(2.0, 1.5, None) == (0.0, 0.0)
    assert _rel(0.0, 1.0, 2.0) == (0.0, 0.0) and _rel(None, 1.0, 2.0) == (0.0, 0.0)
    assert _rel(2.0, 2.5, 1.5) == (0.0, 0.0)  # bounds on the wrong side are no width


def test_compare_baseline_skips_rate_levels_and_levels_without_figures_then_goes_on():
    no_length = level(2, ci(1.5, 1.4, 1.6), None)
    rate = level(0, ci(1.5, 1.4, 1.6), 2.0)
    rep = compare_report([no_length, rate, level(4, ci(1.5, 1.4, 1.6), 2.5)])
    m = cost_model_from_compare(rep, source="compare report x.json")
    assert [lv.concurrency for lv in m.levels] == [4] and m.source == "compare report x.json"


def test_tune_baseline_reads_model_method_and_k_from_its_candidates():
    from specadapt.records.tune import Candidate, Recommendation

    def cand(model: str | None):
        return Candidate(label="k=2", variant="", k=2, compare=compare_report([], k=2, model=model, method="eagle"))

    fits = [LevelFit(concurrency=2, variant="ngram_max=2", form="v + c k", v=9, c=9),
            LevelFit(concurrency=1, form="v + c k", v=None, c=0.1),
            LevelFit(concurrency=4, form="v + c k", v=1.0, c=0.2)]
    rep = TuneReport(settings=TuneSettings(backend="vllm", base_spec={"method": "ngram"}, ks=[0, 2], concurrency=[1, 4],
                                           repeat=1, warmup=0, request={}), fits=fits,
                     candidates=[Candidate(label="off", variant="", k=0, status="baseline"), cand("m1"), cand("m2")],
                     recommendation=Recommendation(form="fixed", k=2))
    m = cost_model_from_tune(rep, source="tune report t.json")
    assert [(lv.concurrency, lv.rel_low, lv.rel_high) for lv in m.levels] == [(4, 0.0, 0.0)]
    assert (m.k, m.model_id, m.spec_method, m.source) == (2, "m1", "eagle", "tune report t.json")
    assert cost_model_from_tune(rep, variant="ngram_max=2").levels[0].v == 9


def test_cost_at_a_measured_level_is_that_level_exactly():
    three = CostModel(levels=(LevelCost(1, 1.0, 0.1, 0.6, 0.6), LevelCost(4, 1.1, 0.2, 0.1, 0.1),
                              LevelCost(16, 1.3, 0.4, 0.3, 0.2)), k=3, model_id=None, spec_method=None, source="")
    assert cost_at(three, 16) == (three.levels[2], None)  # its own interval, not a wider one beside it
    assert cost_at(three, 4) == (three.levels[1], None)
    assert cost_at(three, 1) == (three.levels[0], None)
    assert cost_at(three, 10)[0].concurrency == 10
    top, note = cost_at(three, 40.0)
    assert top == three.levels[2] and note.startswith("batch 40.0 is above the largest measured level (16): its "
                                                      "cost is taken as that level's")


def test_wilson_with_one_trial_and_more_successes_than_trials():
    lo, hi = wilson(1, 1)
    assert lo == pytest.approx(0.2065, abs=1e-3) and hi == 1.0
    assert wilson(12, 10) == wilson(10, 10)


def test_best_k_stays_within_the_deployed_k_and_ties_go_to_the_smaller():
    f = window([0.9, 0.9, 0.9], 10_000, 1.0)
    model = CostModel(levels=(LevelCost(1, 1.0, 0.01, 0.0, 0.0),), k=3, model_id=None, spec_method=None, source="")
    assert expected_speedup(model, f, k=2).best_k == 2  # k = 3 would be better, but 2 is deployed
    flat = CostModel(levels=(LevelCost(1, 1.0, 0.0, 0.0, 0.0),), k=1, model_id=None, spec_method=None, source="")
    assert expected_speedup(flat, window([0.0], 10_000, 1.0)).best_k == 0  # 1.0 at k = 0 and at k = 1

"""Arrival schedules (load/arrivals.py): gamma gaps with mean 1/R and shape B, seeded; rate
parsing; send lag and the client-limited flag."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from specadapt.analysis import send_lag as arrivals
from specadapt.analysis.send_lag import LAG_P99_LIMIT_MS, MIN_RATE_FRACTION, send_lag, send_lag_blocks
from specadapt.errors import UsageError
from specadapt.load.arrivals import arrivals_for_duration, parse_rates, schedule_ns
from specadapt.records.load import rate_label

S = 1_000_000_000
MS = 1_000_000


def gaps_s(rate, n, b, seed):
    return np.diff(np.array(schedule_ns(rate, n, b, seed))) / S


@pytest.mark.parametrize("burstiness", [0.25, 0.5, 1.0, 2.0, 4.0])
def test_gaps_are_gamma_with_shape_b_and_mean_1_over_r(burstiness):
    rate = 4.0
    g = gaps_s(rate, 4001, burstiness, seed=11)
    # exact distribution: gamma(shape B, scale 1/(R B)); the ns rounding is far below the test's power
    assert stats.kstest(g, "gamma", args=(burstiness, 0, 1 / (rate * burstiness))).pvalue > 0.001
    # and not the neighbouring shapes (the test can tell B apart, so B is really used)
    for other in (burstiness / 2, burstiness * 2):
        assert stats.kstest(g, "gamma", args=(other, 0, 1 / (rate * other))).pvalue < 0.001
    assert g.mean() == pytest.approx(1 / rate, rel=0.1)
    cv = g.std() / g.mean()  # dispersion: 1/sqrt(B), > 1 for B < 1 (burstier than Poisson)
    assert cv == pytest.approx(1 / math.sqrt(burstiness), rel=0.1)


def test_poisson_counts_per_window_have_variance_equal_to_mean():
    offs = np.array(schedule_ns(10.0, 20001, 1.0, seed=3)) / S
    counts = np.bincount(offs.astype(int))[:-1]  # arrivals per 1-s window, the last one partial
    assert counts.mean() == pytest.approx(10.0, rel=0.05)
    assert counts.var(ddof=1) / counts.mean() == pytest.approx(1.0, abs=0.15)


def test_first_arrival_at_zero_offsets_increase_and_count_is_exact():
    offs = schedule_ns(2.0, 50, 1.0, seed=0)
    assert len(offs) == 50 and offs[0] == 0
    assert all(b >= a for a, b in zip(offs, offs[1:]))
    assert all(isinstance(x, int) for x in offs)


def test_same_seed_same_schedule_other_seed_other_schedule():
    assert schedule_ns(3.0, 20, 0.5, seed=7) == schedule_ns(3.0, 20, 0.5, seed=7)
    assert schedule_ns(3.0, 20, 0.5, seed=7) != schedule_ns(3.0, 20, 0.5, seed=8)


def test_inf_rate_sends_everything_at_once_and_no_count_no_schedule():
    assert schedule_ns(math.inf, 5, 1.0, seed=1) == [0] * 5
    assert schedule_ns(2.0, 0) == []
    assert schedule_ns(2.0, 1) == [0]


def test_burstiness_must_be_positive():
    with pytest.raises(UsageError, match="--burstiness"):
        schedule_ns(1.0, 3, 0.0)


def test_arrivals_for_duration_is_ceil_of_rate_times_seconds_at_least_one():
    assert arrivals_for_duration(2.0, 3.0) == 6
    assert arrivals_for_duration(2.0, 3.1) == 7
    assert arrivals_for_duration(0.1, 1.0) == 1
    assert arrivals_for_duration(0.01, 1.0) == 1


@pytest.mark.parametrize("text, rates", [("2", [2.0]), ("4,1,2", [1.0, 2.0, 4.0]), ("1, 1,inf", [1.0, math.inf]),
                                         ("0.5,", [0.5]), (None, []), ("  ", [])])
def test_parse_rates(text, rates):
    assert parse_rates(text) == rates


@pytest.mark.parametrize("text, msg", [("fast", "requests per second"), ("0", "> 0"), ("-1", "> 0"),
                                       ("nan", "> 0"), (",", "at least one")])
def test_parse_rates_refuses_in_one_line(text, msg):
    with pytest.raises(UsageError, match=msg) as exc:
        parse_rates(text)
    assert "\n" not in str(exc.value) and "--request-rate" in str(exc.value)


def test_rate_label():
    assert rate_label(math.inf) == "inf" and rate_label(2.0) == "2" and rate_label(0.5) == "0.5"
    assert rate_label(1e-3) == "0.001"


def test_lag_percentiles_and_max_in_ms():
    sched = [0, 100 * MS, 200 * MS, 300 * MS]
    sent = [1 * MS, 102 * MS, 203 * MS, 304 * MS]  # lags 1, 2, 3, 4 ms
    lag = send_lag(sched, sent)
    assert lag.requests == 4
    assert lag.p50_ms == pytest.approx(2.5) and lag.max_ms == pytest.approx(4.0)
    assert lag.p99_ms == pytest.approx(float(np.percentile([1, 2, 3, 4], 99)))
    assert lag.scheduled_rate == pytest.approx(3 / 0.3)
    assert lag.achieved_rate == pytest.approx(3 / 0.303)
    assert not lag.client_limited and lag.reason is None


def test_a_late_client_is_flagged_by_its_lag_p99():
    limit = LAG_P99_LIMIT_MS * MS
    sched = [i * 1000 * MS for i in range(10)]
    at_limit = send_lag(sched, [s + limit for s in sched])  # exactly at the limit: fine
    assert not at_limit.client_limited
    over = send_lag(sched, [s + limit + MS for s in sched])
    assert over.client_limited and "the client, not the server, limited this run" in over.reason
    assert "p99" in over.reason


def test_a_slow_client_is_flagged_by_its_achieved_rate():
    sched = [i * 100 * MS for i in range(11)]  # 10 gaps in 1 s: 10 req/s
    # every request sent 1 ms late except a stretched tail: the rate falls, the p99 lag stays small
    just_ok = [s for s in sched[:-1]] + [int(sched[-1] / MIN_RATE_FRACTION)]
    assert send_lag(sched, just_ok, lag_p99_limit_ms=1e9).client_limited is False
    too_slow = [s for s in sched[:-1]] + [int(sched[-1] / MIN_RATE_FRACTION) + 2 * MS]
    lag = send_lag(sched, too_slow, lag_p99_limit_ms=1e9)
    assert lag.client_limited and "below 95% of the scheduled 10.00 req/s" in lag.reason


def test_all_at_once_has_no_rates_and_no_lag_no_figures():
    lag = send_lag([0, 0, 0], [0, 1 * MS, 2 * MS])
    assert lag.scheduled_rate is None and lag.achieved_rate is None and not lag.client_limited
    assert send_lag([], []).requests == 0 and send_lag([], []).p50_ms is None


def test_blocks_pool_rates_over_their_own_spans():
    a = ([0, 1 * S], [0, 1 * S])
    b = ([0, 1 * S, 2 * S], [0, 2 * S, 4 * S])
    lag = send_lag_blocks([a, b], lag_p99_limit_ms=1e9)
    assert lag.scheduled_rate == pytest.approx(3 / 3) and lag.achieved_rate == pytest.approx(3 / 5)
    assert lag.client_limited and lag.requests == 5


def test_sent_at_once_while_scheduled_apart_counts_as_infinitely_fast():
    lag = send_lag([0, S], [5 * MS, 5 * MS], lag_p99_limit_ms=1e9)
    assert lag.achieved_rate == math.inf and not lag.client_limited


def test_the_module_constants_are_the_documented_ones():
    assert arrivals.LAG_P99_LIMIT_MS == 10.0 and arrivals.MIN_RATE_FRACTION == 0.95


def test_defaults_are_poisson_and_seed_0():
    assert schedule_ns(2.0, 50) == schedule_ns(2.0, 50, 1.0, 0)


def test_empty_parts_are_skipped_and_the_message_is_exact():
    assert parse_rates("1,,2") == [1.0, 2.0]
    with pytest.raises(UsageError) as exc:
        parse_rates("fast")
    assert str(exc.value) == "--request-rate 'fast': give requests per second, comma-separated, e.g. 1,2,4,inf"


def test_lag_figures_are_exact_ms():
    lag = send_lag([0, 0], [2 * MS, 3 * MS])
    assert lag.p50_ms == 2.5 and lag.max_ms == 3.0


def test_rate_fraction_is_passed_on_and_the_boundary_is_not_limited():
    sched = [i * 100 * MS for i in range(11)]          # 10 req/s
    sent = [i * 200 * MS for i in range(11)]           # 5 req/s: exactly half
    assert not send_lag(sched, sent, lag_p99_limit_ms=1e9, min_rate_fraction=0.5).client_limited
    lag = send_lag(sched, sent, lag_p99_limit_ms=1e9, min_rate_fraction=0.6)
    assert lag.reason == ("the client, not the server, limited this run: sent 5.00 req/s, below 60% of the "
                          "scheduled 10.00 req/s")
    both = send_lag(sched, sent, lag_p99_limit_ms=1.0, min_rate_fraction=0.6)
    assert both.reason == ("the client, not the server, limited this run: send lag p99 990.0 ms > 1 ms; "
                           "sent 5.00 req/s, below 60% of the scheduled 10.00 req/s")


def test_spans_run_from_each_blocks_first_time():
    lag = send_lag_blocks([([S, 2 * S], [S, 2 * S]), ([0], [0])], lag_p99_limit_ms=1e9)
    assert lag.scheduled_rate == 1.0 and lag.achieved_rate == 1.0 and lag.requests == 3

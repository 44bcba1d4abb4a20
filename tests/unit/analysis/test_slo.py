"""SLOs and goodput (analysis/slo.py): parsing, per-request judgement as vLLM's --goodput does,
goodput over the run's wall time, and the on/off goodput ratio over units."""

from __future__ import annotations

import math

import pytest

from specadapt.analysis.slo import (
    busy_duration_s,
    compare_goodput,
    diff_ci,
    goodput_summary,
    is_good,
    meets,
    parse_slo,
    request_value_ms,
    run_duration_s,
    slo_text,
)
from specadapt.analysis.stats import MIN_UNITS, t_bounds
from specadapt.errors import UsageError
from specadapt.records import RequestRecord

MS = 1_000_000


def rec(ttft=10, gaps=(5, 5), per_chunk=1, e2e=None, ok=True, sent=0, scheduled=None, tokens=None):
    """A request whose first chunk arrives at ``ttft`` ms, the next ones ``gaps`` ms apart."""
    chunk = [ttft * MS]
    for g in gaps:
        chunk.append(chunk[-1] + g * MS)
    n = tokens if tokens is not None else per_chunk * len(chunk)
    return RequestRecord(prompt_id="p", category="c", api="chat", ok=ok, chunk_ns=chunk,
                         chunk_tokens=[per_chunk] * len(chunk), output_tokens=n,
                         e2e_ns=(e2e if e2e is not None else chunk[-1] / MS + 1) * MS, sent_at_ns=sent * MS,
                         scheduled_at_ns=None if scheduled is None else scheduled * MS)


@pytest.mark.parametrize("text, slo", [
    ("ttft=200ms", {"ttft": 200.0}),
    ("ttft=200ms,tpot=40ms,itl=50ms,e2e=2s", {"ttft": 200.0, "tpot": 40.0, "itl": 50.0, "e2e": 2000.0}),
    (" E2E = 1.5s , ", {"e2e": 1500.0}),
    ("ttft=0.5s", {"ttft": 500.0}),
    ("tpot=1e2ms", {"tpot": 100.0}),
    ("", {}), (None, {}),
])
def test_parse_slo(text, slo):
    assert parse_slo(text) == slo


@pytest.mark.parametrize("text, line", [
    ("ttfb=200ms", "--slo: unknown metric 'ttfb'; use ttft, tpot, itl, e2e"),
    ("ttft=200", "--slo: ttft=200 needs a unit: 200ms or 200s"),
    ("ttft", "--slo: 'ttft' is not METRIC=LIMIT; write e.g. ttft=200ms,e2e=2s"),
    ("ttft=fast", "--slo: ttft='fast' is not a number with a unit; write e.g. ttft=200ms"),
    ("ttft=2min", "--slo: ttft=2min: unknown unit 'min'; use ms or s"),
    ("ttft=1ms,ttft=2ms", "--slo: ttft is given twice"),
    ("ttft=-1ms", "--slo: ttft='-1ms' is not a number with a unit; write e.g. ttft=200ms"),
])
def test_bad_slo_is_one_line(text, line):
    with pytest.raises(UsageError) as exc:
        parse_slo(text)
    assert str(exc.value) == line


def test_slo_text():
    assert slo_text({"ttft": 200.0, "e2e": 2000.0}) == "ttft<=200ms, e2e<=2000ms"


def test_request_values_in_ms():
    r = rec(ttft=10, gaps=(4, 8), per_chunk=2, e2e=30)  # 6 tokens; ITL per token 2 and 4 ms
    assert request_value_ms(r, "ttft") == 10
    assert request_value_ms(r, "e2e") == 30
    assert request_value_ms(r, "tpot") == pytest.approx((30 - 10) / 5)
    assert request_value_ms(r, "itl") == pytest.approx(4.0)  # the largest per-token gap


def test_one_token_has_tpot_and_itl_zero_like_vllm():
    r = rec(gaps=(), tokens=1)
    assert request_value_ms(r, "tpot") == 0.0 and request_value_ms(r, "itl") == 0.0
    assert meets(r, {"tpot": 0.0, "itl": 0.0}) == {"tpot": True, "itl": True}


def test_no_ttft_no_value_and_unknown_metric_raises():
    r = RequestRecord(prompt_id="p", category="c", api="chat", ok=True, output_tokens=3)
    assert request_value_ms(r, "ttft") is None and request_value_ms(r, "e2e") is None
    assert request_value_ms(r, "tpot") is None
    assert meets(r, {"ttft": 1e9}) == {"ttft": False}
    with pytest.raises(ValueError):
        request_value_ms(rec(), "ttfb")


def test_limits_are_inclusive_and_a_failed_request_meets_none():
    r = rec(ttft=10, gaps=(5,), e2e=20)
    assert meets(r, {"ttft": 10, "e2e": 20, "itl": 5}) == {"ttft": True, "e2e": True, "itl": True}
    assert meets(r, {"ttft": 9.999, "e2e": 19.999, "itl": 4.999}) == {"ttft": False, "e2e": False, "itl": False}
    bad = rec(ok=False)
    assert meets(bad, {"ttft": 1e9}) == {"ttft": False} and not is_good(bad, {})
    assert is_good(r, {}) and is_good(r, {"ttft": 10}) and not is_good(r, {"ttft": 10, "e2e": 19})


def test_run_duration_runs_from_the_first_schedule_or_send_to_the_last_end():
    a = rec(sent=100, scheduled=90, e2e=50)   # ends at 150
    b = rec(sent=120, e2e=100)                 # ends at 220
    assert run_duration_s([a, b]) == pytest.approx((220 - 90) / 1000)
    assert run_duration_s([b]) == pytest.approx(0.1)
    assert run_duration_s([]) == 0.0
    assert busy_duration_s([a, b]) == pytest.approx(0.15)


def test_goodput_is_good_requests_per_second_and_shares_per_slo():
    recs = [rec(ttft=10, e2e=100, sent=0), rec(ttft=50, e2e=100, sent=0), rec(ttft=10, e2e=400, sent=0),
            rec(ok=False, sent=0, e2e=100)]
    g = goodput_summary(recs, {"ttft": 20, "e2e": 200})
    assert (g.requests, g.good) == (4, 1)
    assert g.duration_s == pytest.approx(0.4)
    assert g.goodput == pytest.approx(1 / 0.4)
    assert g.share_good == pytest.approx(0.25)
    assert g.share_per_slo == {"ttft": pytest.approx(0.5), "e2e": pytest.approx(0.5)}
    given = goodput_summary(recs, {"ttft": 20}, duration_s=2.0)
    assert given.goodput == pytest.approx(2 / 2.0) and given.duration_s == 2.0


def test_goodput_of_nothing():
    g = goodput_summary([], {"ttft": 1})
    assert g.goodput is None and g.share_good is None and g.share_per_slo == {}
    zero = goodput_summary([rec(sent=0, e2e=0, ttft=0, gaps=())], {"ttft": 1})
    assert zero.duration_s == 0 and zero.goodput is None and zero.share_good == 1.0


def _unit(good_off, good_on, n=4, dur_ms=1000):
    """off and on records of one unit: n requests each over dur_ms, the first good_* within ttft<=20ms."""
    def side(good):
        return [rec(ttft=10 if i < good else 50, sent=0, e2e=dur_ms) for i in range(n)]
    return side(good_off), side(good_on)


def test_goodput_ratio_is_the_mean_log_over_units_with_a_t_interval():
    units = [_unit(2, 4), _unit(2, 3), _unit(1, 3), _unit(2, 2), _unit(3, 4), _unit(2, 4)]
    g = compare_goodput(units, {"ttft": 20})
    logs = [math.log(on / off) for off, on in ((2, 4), (2, 3), (1, 3), (2, 2), (3, 4), (2, 4))]
    low, mean, high = t_bounds(logs)
    assert g.ratio.point == pytest.approx(math.exp(mean))
    assert (g.ratio.low, g.ratio.high) == (pytest.approx(math.exp(low)), pytest.approx(math.exp(high)))
    assert g.ratio.n == 6 and g.ratio.unit == "blocks" and g.units_without_good == 0
    assert (g.off.good, g.on.good) == (12, 20) and g.off.requests == g.on.requests == 24
    assert g.off.duration_s == pytest.approx(6.0)
    diffs = [(on - off) / 4 for off, on in ((2, 4), (2, 3), (1, 3), (2, 2), (3, 4), (2, 4))]
    dlow, dmean, dhigh = t_bounds(diffs)
    d = g.share_difference
    assert (d.point, d.low, d.high, d.n) == (pytest.approx(dmean), pytest.approx(dlow), pytest.approx(dhigh), 6)


def test_a_unit_without_a_good_request_is_left_out_and_counted():
    units = [_unit(0, 2), _unit(2, 0), _unit(2, 2)]
    g = compare_goodput(units, {"ttft": 20})
    assert g.units_without_good == 2 and g.ratio.n == 1 and g.ratio.point == pytest.approx(1.0)
    assert g.ratio.too_few and g.ratio.low is None
    assert g.share_difference.n == 3 and g.share_difference.too_few


def test_busy_time_divides_by_the_sum_of_e2e():
    off, on = _unit(2, 2, n=2, dur_ms=100)
    on = [rec(ttft=10, sent=0, e2e=50) for _ in range(2)]
    g = compare_goodput([(off, on)], {"ttft": 20}, busy_time=True)
    assert g.off.duration_s == pytest.approx(0.2) and g.on.duration_s == pytest.approx(0.1)
    assert g.ratio.point == pytest.approx(2.0)
    wall = compare_goodput([(off, on)], {"ttft": 20})
    assert wall.on.duration_s == pytest.approx(0.05) and wall.ratio.point == pytest.approx(2.0)


def test_diff_ci_needs_min_units_for_an_interval():
    few = diff_ci([0.1] * (MIN_UNITS - 1))
    assert few.too_few and few.point == pytest.approx(0.1) and few.low is None
    enough = diff_ci([0.1, 0.2, 0.3, 0.2, 0.1])
    assert not enough.too_few and enough.low < enough.point < enough.high
    assert diff_ci([None, float("nan")]).point is None and diff_ci([]).n == 0


def test_empty_parts_are_skipped_and_a_second_equals_sign_is_part_of_the_limit():
    assert parse_slo("ttft=1ms,,e2e=2s") == {"ttft": 1.0, "e2e": 2000.0}
    with pytest.raises(UsageError) as exc:
        parse_slo("ttft=1ms=2")
    assert str(exc.value) == "--slo: ttft='1ms=2' is not a number with a unit; write e.g. ttft=200ms"


def test_two_tokens_without_times_have_no_tpot():
    r = RequestRecord(prompt_id="p", category="c", api="chat", ok=True, output_tokens=2)
    assert request_value_ms(r, "tpot") is None


def test_values_are_exact_ms():
    r = rec(ttft=10, gaps=(4,), per_chunk=1, e2e=14)  # 2 tokens: TPOT (14 - 10) / 1 = 4 ms; ITL 4 ms
    assert request_value_ms(r, "tpot") == 4.0 and request_value_ms(r, "itl") == 4.0
    assert run_duration_s([rec(sent=0, e2e=500)]) == 0.5
    with pytest.raises(ValueError, match="unknown metric ttfb"):
        request_value_ms(r, "ttfb")


def test_busy_time_counts_a_request_without_e2e_as_zero_and_is_exact():
    no_end = RequestRecord(prompt_id="p", category="c", api="chat", ok=False)
    assert busy_duration_s([no_end, rec(e2e=500)]) == 0.5


def test_diff_ci_without_values_is_too_few_and_its_level_is_used():
    assert diff_ci([]).too_few is True
    x = [0.1, 0.2, 0.3, 0.2, 0.1, 0.25]
    wide, narrow = diff_ci(x), diff_ci(x, level=0.5)
    assert narrow.high - narrow.low < wide.high - wide.low


def test_a_unit_with_no_request_on_a_side_has_no_share_difference():
    _, on = _unit(2, 2)
    g = compare_goodput([([], on)], {"ttft": 20})
    assert g.share_difference.n == 0 and g.share_difference.point is None

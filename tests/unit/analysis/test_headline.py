"""The headline of a comparison (analysis/headline.py): the response time first, the text, then
the speed figures and, where their verdicts differ, the one reason why."""

from __future__ import annotations

import pytest

from specadapt.analysis.headline import headline, response_sentence, text_sentence, ttft_share, why_disagree
from specadapt.records.interference import InterferenceFinding
from specadapt.records import (
    AcceptanceSummary,
    CompareReport,
    CompareSettings,
    Distribution,
    LatencySummary,
    LevelResult,
    RatioCI,
    ServerInfo,
    SpeedRatios,
)


def r(point, low, high, n=8):
    return RatioCI(point=point, low=low, high=high, n=n, unit="pairs")


def lat(ttft, e2e):
    return LatencySummary(requests=8, succeeded=8, failed=0, output_tokens=800, duration_s=10,
                          output_tokens_per_s=80, ttft_ms=Distribution(count=8, mean=ttft),
                          itl_ms=Distribution(), tpot_ms=Distribution(), e2e_ms=Distribution(count=8, mean=e2e),
                          tokens_per_chunk_mean=None)


def report(tpot, e2e, tps, ttft=100.0, e2e_ms=2000.0, sections=None, counts=None):
    lv = LevelResult(concurrency=1, pairs=8, speed=SpeedRatios(tpot=tpot, e2e=e2e, throughput=tps),
                     off=lat(ttft, e2e_ms), on=lat(ttft, e2e_ms), acceptance=AcceptanceSummary(known=False))
    info = ServerInfo(backend="vllm", base_url="http://x")
    rep = CompareReport(settings=CompareSettings(), off_server=info, on_server=info, levels=[lv],
                        counts=counts or {"identical": 0})
    rep.sections = sections or {}
    return rep


def test_response_sentence_by_verdict():
    assert response_sentence(r(2.0, 1.5, 2.5)) == ("the response came 2.00x faster with speculation "
                                                   "(50% less time per answer)")
    assert response_sentence(r(0.5, 0.4, 0.6)) == ("the response came 2.00x slower with speculation "
                                                   "(100% more time per answer)")
    assert response_sentence(r(1.39, 0.96, 2.02)) == ("no clear difference in response time (1.39x, the interval "
                                                      "includes 1)")
    assert response_sentence(RatioCI(point=None)) == "no response time measured"


def test_text_sentence_counts():
    assert text_sentence({"identical": 4}, 4) == "the text was identical for every prompt"
    assert text_sentence({"identical": 2, "near-tie": 1, "suspect": 1}, 4) == (
        "the text was identical for 2 of 4 prompts (1 near-tie, 1 suspect)")
    assert text_sentence({}, 0) == "the text was identical for 0 of 0 prompts"


def test_all_verdicts_agree_no_reason():
    h = headline(report(r(2.0, 1.8, 2.2), r(1.9, 1.7, 2.1), r(1.9, 1.7, 2.1)))
    assert h.agree and h.why_not is None
    assert h.figures == ("TPOT 2.00x [1.80, 2.20] faster, E2E 1.90x [1.70, 2.10] faster, "
                         "tokens/s 1.90x [1.70, 2.10] faster")


def finding(detected: bool, order: str = "judged", source: str = "run") -> InterferenceFinding:
    return InterferenceFinding(source=source, detected=detected, order=order, alpha=0.05)


def test_interference_is_the_reason_first():
    stalled = {"interference": finding(True).model_dump(mode="json")}
    h = headline(report(r(2.45, 1.68, 3.59), r(1.39, 0.96, 2.02), r(1.39, 0.96, 2.02), ttft=800.0, sections=stalled))
    assert not h.agree and h.why_not.startswith("the two sides stalled each other's first token (interference")


def test_the_check_before_the_run_counts_where_the_run_could_not_judge_the_order():
    unjudged = {"interference": finding(False, order="too few").model_dump(mode="json")}
    rep = report(r(2.45, 1.68, 3.59), r(1.39, 0.96, 2.02), r(1.39, 0.96, 2.02), ttft=10.0, sections=unjudged)
    rep.interference_check = finding(True, source="check")
    assert headline(rep).why_not.startswith("the two sides stalled each other's first token")
    judged = {"interference": finding(False).model_dump(mode="json")}  # the run judged it and saw none
    rep = report(r(2.45, 1.68, 3.59), r(1.39, 0.96, 2.02), r(1.39, 0.96, 2.02), ttft=10.0, sections=judged)
    rep.interference_check = finding(True, source="check")
    assert "interference" not in headline(rep).why_not


def test_the_first_tokens_share_bounds_the_response():
    # TTFT 40% of a spec-off answer, TPOT 2x: the response can be at most 1 / (0.4 + 0.6 / 2) = 1.43x faster
    rep = report(r(2.0, 1.8, 2.2), r(1.3, 0.95, 1.7), r(1.3, 0.95, 1.7), ttft=800.0, e2e_ms=2000.0)
    assert ttft_share(rep.levels[0]) == pytest.approx(0.4)
    assert why_disagree(rep, rep.levels[0]) == ("the first token is 40% of a spec-off answer here and speculation "
                                                "does not shorten it, so at TPOT 2.00x the response can be at most "
                                                "1.43x faster")


def test_otherwise_the_wide_intervals_are_named():
    rep = report(r(2.0, 1.8, 2.2), r(1.3, 0.95, 1.7, n=3), r(1.2, 0.9, 1.6, n=3), ttft=10.0, e2e_ms=2000.0)
    assert why_disagree(rep, rep.levels[0]) == ("the E2E and tokens/s intervals are too wide to decide over 3 pairs: "
                                                "more --repeat narrows them")
    one = report(r(2.0, 1.8, 2.2), r(1.3, 0.95, 1.7, n=3), r(1.6, 1.2, 1.9, n=3), ttft=10.0, e2e_ms=2000.0)
    assert why_disagree(one, one.levels[0]) == ("the E2E interval is too wide to decide over 3 pairs: more --repeat "
                                                "narrows it")


def test_no_levels_no_headline():
    rep = report(r(1, 1, 1), r(1, 1, 1), r(1, 1, 1))
    rep.levels = []
    assert headline(rep) is None


def test_figures_without_an_interval():
    h = headline(report(r(2.0, 1.8, 2.2), RatioCI(point=1.9, n=3, too_few=True), r(1.9, 1.7, 2.1)))
    assert h.figures == ("TPOT 2.00x [1.80, 2.20] faster, E2E 1.90x (no interval) no clear difference, "
                         "tokens/s 1.90x [1.70, 2.10] faster")


def test_unknown_identity_is_counted():
    assert text_sentence({"identical": 3, "unknown": 1}, 4) == "the text was identical for 3 of 4 prompts (1 unknown)"


def test_ttft_share_needs_both_means():
    rep = report(r(1, 1, 1), r(1, 1, 1), r(1, 1, 1))
    lv = rep.levels[0]
    lv.off.ttft_ms.mean = None
    assert ttft_share(lv) is None
    lv.off.ttft_ms.mean, lv.off.e2e_ms.mean = 100.0, None
    assert ttft_share(lv) is None
    lv.off.e2e_ms.mean = 0.0
    assert ttft_share(lv) is None


def test_interference_reason_in_full():
    stalled = {"interference": finding(True).model_dump(mode="json")}
    rep = report(r(2.45, 1.68, 3.59), r(1.39, 0.96, 2.02), r(1.39, 0.96, 2.02), ttft=800.0, sections=stalled)
    assert why_disagree(rep, rep.levels[0]) == (
        "the two sides stalled each other's first token (interference, see its section): E2E and tokens/s include "
        "the stalls, TPOT does not; start the servers on separate CPUs or machines")


def test_a_wide_tpot_interval_and_opposite_verdicts():
    rep = report(r(1.3, 0.9, 1.7, n=3), r(1.6, 1.2, 1.9, n=3), r(1.6, 1.2, 1.9, n=3), ttft=10.0, e2e_ms=2000.0)
    assert why_disagree(rep, rep.levels[0]) == ("the TPOT interval is too wide to decide over 3 pairs: more --repeat "
                                                "narrows it")
    opposite = report(r(1.3, 1.1, 1.5), r(0.8, 0.7, 0.9), r(0.8, 0.7, 0.9), ttft=10.0, e2e_ms=2000.0)
    assert why_disagree(opposite, opposite.levels[0]) == ("the intervals point different ways over 8 pairs: more "
                                                          "--repeat settles them")


def test_a_first_token_of_exactly_5_percent_is_not_given_as_the_reason():
    rep = report(r(2.0, 1.8, 2.2), r(1.3, 0.95, 1.7), r(1.3, 0.95, 1.7), ttft=100.0, e2e_ms=2000.0)
    assert ttft_share(rep.levels[0]) == pytest.approx(0.05)
    assert why_disagree(rep, rep.levels[0]).startswith("the E2E and tokens/s intervals are too wide")

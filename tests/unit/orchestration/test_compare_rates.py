"""compare at arrival rates, multi-turn pairs and per-turn identity, per-category ratios and
goodput (orchestration/compare.py), with the fake ``stream_request`` of test_compare.py."""

from __future__ import annotations

import asyncio
import io
import json
import math

import pytest
from rich.console import Console

from specadapt.analysis.identity import identity_report
from specadapt.analysis.pairs import pair_records
from specadapt.analysis.speed import analyse, level_goodput
from specadapt.analysis.stats import MIN_UNITS, find_crossover
from specadapt.load import spread
from specadapt.load.arrivals import schedule_ns
from specadapt.load.plan import rate_jobs
from specadapt.orchestration import compare
from specadapt.orchestration.compare import ABRunner, total_requests
from specadapt.records import (
    ChatMessage,
    CompareReport,
    CompareSettings,
    Prompt,
    RatioCI,
    RequestRecord,
    ServerInfo,
    read_compare_report,
    write_report,
)
from specadapt.records.load import LoadSettings
from specadapt.report.compare_render import render_console, to_markdown
from specadapt.report.html import to_html
from tests.unit.orchestration.test_compare import PROMPTS, FakeServer, Script, rec

MS = 1_000_000
INFO = ServerInfo(backend="fake", base_url="http://x", model_id="m", spec_enabled=True)


def run(monkeypatch, settings, prompts=PROMPTS, tokens=None):
    script = Script(tokens or {"off": 8, "on": 16}, {"off": 10.0, "on": 10.0})
    monkeypatch.setattr(spread, "stream_request", script.stream_request)
    monkeypatch.setattr(compare, "settle_counters", lambda server: server.read_counters())
    runner = ABRunner(FakeServer("off"), FakeServer("on"), prompts, settings)
    records, _, _ = asyncio.run(runner.run())
    return script, records, runner


def test_rate_jobs_follow_the_seeded_schedule_per_repeat_and_the_duration():
    load = LoadSettings(request_rates=[4.0], duration_s=2.0, seed=5, burstiness=0.5)
    jobs = rate_jobs(PROMPTS, 4.0, load, block=3)
    assert len(jobs) == 8  # ceil(4 * 2)
    assert [j.offset_ns for j in jobs] == schedule_ns(4.0, 8, 0.5, 5 + 3)
    assert [j.prompt.id for j in jobs] == ["p0", "p1"] * 4 and [j.copy_index for j in jobs] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert all(j.repeat == 3 for j in jobs)
    once = rate_jobs(PROMPTS, math.inf, load, block=0)  # inf: the prompt set once, all at once
    assert [j.offset_ns for j in once] == [0, 0]
    no_duration = rate_jobs(PROMPTS, 4.0, LoadSettings(request_rates=[4.0]), block=0)
    assert len(no_duration) == len(PROMPTS)


def test_rates_run_alternating_blocks_on_the_same_schedule(monkeypatch):
    load = LoadSettings(request_rates=[2000.0, math.inf], duration_s=0.004, seed=1)
    settings = CompareSettings(concurrency=[1], repeat=3, warmup=0, load=load)
    script, records, runner = run(monkeypatch, settings)
    rated = [r for r in records if r.request_rate is not None]
    assert len(rated) == total_requests(len(PROMPTS), settings) - 2 * 3 * len(PROMPTS)
    assert {r.concurrency for r in rated} == {0}
    at = [r for r in rated if r.request_rate == 2000.0]
    assert len(at) == 2 * 3 * 8  # ceil(2000 * 0.004) arrivals per block
    blocks = []
    for r in at:  # the sides' blocks, in the order they ran
        if not blocks or blocks[-1] != (r.side, r.repeat):
            blocks.append((r.side, r.repeat))
    assert blocks == [("off", 0), ("on", 0), ("on", 1), ("off", 1), ("off", 2), ("on", 2)]
    for rep in range(3):  # both sides of a repeat: the same schedule
        sched = {side: [r.scheduled_at_ns for r in at if r.side == side and r.repeat == rep] for side in ("off", "on")}
        assert sched["off"] == sched["on"] == schedule_ns(2000.0, 8, 1.0, 1 + rep)
    assert set(runner.rate_counters["on"]) == {"2000", "inf"}


def test_rate_levels_are_analysed_with_blocks_as_units_and_a_crossover_in_rate(monkeypatch):
    load = LoadSettings(request_rates=[math.inf], slo_ms={"e2e": 60000.0})
    settings = CompareSettings(concurrency=[1], repeat=MIN_UNITS, warmup=0, load=load)
    _, records, _ = run(monkeypatch, settings)
    report = CompareReport(settings=settings, off_server=INFO, on_server=INFO, requests=records)
    analyse(report)
    (lv,) = report.rate_levels
    assert lv.request_rate == math.inf and lv.concurrency == 0 and lv.pairs == MIN_UNITS * len(PROMPTS)
    assert (lv.speed.throughput.unit, lv.speed.throughput.n) == ("blocks", MIN_UNITS)
    assert lv.send_lag_off.requests == lv.send_lag_on.requests == MIN_UNITS * len(PROMPTS)
    assert lv.goodput.off.good == lv.goodput.on.good == MIN_UNITS * len(PROMPTS)
    assert lv.goodput.ratio.n == MIN_UNITS
    assert report.rate_crossover is not None and math.inf in report.rate_crossover.verdicts
    assert report.levels[0].request_rate is None and report.levels[0].goodput is not None
    # saved and read back: inf survives JSON
    buf = io.StringIO()
    render_console(report, Console(file=buf, width=200))
    assert "inf req/s" in buf.getvalue() and "send lag" in buf.getvalue() and "goodput" in buf.getvalue()
    assert "inf req/s" in to_markdown(report) and "Goodput (e2e<=60000ms)" in to_markdown(report)
    assert "Send lag" in to_html(report)


def test_inf_rates_survive_the_saved_report(tmp_path):
    load = LoadSettings(request_rates=[2.0, math.inf])
    r = RequestRecord(prompt_id="a", category="c", api="chat", concurrency=0, request_rate=math.inf)
    report = CompareReport(settings=CompareSettings(load=load), off_server=INFO, on_server=INFO, requests=[r])
    write_report(report, tmp_path / "r.json")
    back = read_compare_report(tmp_path / "r.json")
    assert back.settings.load.request_rates == [2.0, math.inf] and back.requests[0].request_rate == math.inf
    assert json.loads((tmp_path / "r.json").read_text())["requests"][0]["request_rate"] == "Infinity"


def test_crossover_in_request_rate_names_rates_and_does_not_interpolate_to_inf():
    def r(point, low, high):
        return RatioCI(point=point, low=low, high=high, n=6, unit="blocks", method="t", min_n=5)
    c = find_crossover([1.0, 4.0, math.inf], [r(1.3, 1.1, 1.5), r(1.2, 1.05, 1.4), r(0.8, 0.7, 0.9)],
                       what="request rate")
    assert (c.status, c.last_faster, c.first_slower, c.estimate) == ("crosses", 4.0, math.inf, None)
    assert "crossover above 4" in c.text and "inf" in c.text
    every = find_crossover([0.5, 2.0], [r(1.3, 1.1, 1.5)] * 2, what="request rate")
    assert every.text == "spec on is faster at every tested request rate (0.5, 2)"
    finite = find_crossover([1.0, 4.0], [r(1.2, 1.1, 1.3), r(0.8, 0.7, 0.9)], what="request rate")
    assert finite.estimate == pytest.approx(2 ** (0 + 0.2 / 0.4 * 2))


CHAT = Prompt(id="chat", category="talk", messages=[ChatMessage(role="user", content="hi")], turns=["more"])


def turn_rec(side, turn, tokens, repeat=0, text=None):
    r = rec(side, "chat", repeat, tokens=len(tokens))
    return r.model_copy(update={"turn": turn, "tokens": tokens, "text": text or "".join(tokens), "api": "chat",
                                "category": "talk"})


def test_pairs_are_per_turn():
    recs = [turn_rec("off", 0, ["a", "b"]), turn_rec("on", 0, ["a", "b"]),
            turn_rec("off", 1, ["c"] * 3), turn_rec("on", 1, ["c"] * 3)]
    pairs = pair_records(recs, 1)
    assert sorted((a.turn, b.turn) for a, b in pairs) == [(0, 0), (1, 1)]


def test_a_turn_after_a_divergence_has_a_different_history_and_no_verdict_of_its_own():
    recs = [turn_rec("off", 0, ["a", "b"]), turn_rec("on", 0, ["a", "X"]),     # turn 0 diverges
            turn_rec("off", 1, ["c", "d"]), turn_rec("on", 1, ["e", "f"]),     # histories differ now
            turn_rec("off", 0, ["a", "b"], repeat=1), turn_rec("on", 0, ["a", "b"], repeat=1),
            turn_rec("off", 1, ["c", "d"], repeat=1), turn_rec("on", 1, ["c", "Z"], repeat=1)]  # own divergence
    seen = []

    def triage(prompt, div, off):
        seen.append((div.turn, div.token_index))
        return None

    (ident,) = identity_report(recs, [CHAT], triage)
    assert ident.different_history_pairs == 1
    assert ident.pairs == 3 and ident.identical_pairs == 1
    assert sorted(seen) == [(0, 1), (1, 1)]  # each divergence of its own, the turn kept


def test_triage_of_a_later_turn_asks_with_the_off_sides_history():
    recs = [turn_rec("off", 0, ["a", "b"], text="ANSWER OFF"), turn_rec("on", 0, ["a", "b"], text="ANSWER ON"),
            turn_rec("off", 1, ["b", "c"])]
    req = compare.turn_request(recs, CHAT, recs[2])
    assert [(m.role, m.content) for m in req.messages] == [("user", "hi"), ("assistant", "ANSWER OFF"),
                                                           ("user", "more")]
    assert compare.turn_request(recs, CHAT, recs[0]) is CHAT


def test_a_conversation_runs_both_sides_turn_by_turn_at_concurrency_1(monkeypatch):
    chat = CHAT.model_copy(update={"messages": [ChatMessage(role="user", content="hi")]})
    settings = CompareSettings(concurrency=[1, 2], repeat=2, warmup=0)
    script, records, _ = run(monkeypatch, settings, prompts=[chat])
    assert len(records) == total_requests(1, settings, [chat])
    one = [(r.side, r.repeat, r.turn) for r in records if r.concurrency == 1]
    assert one == [("off", 0, 0), ("off", 0, 1), ("on", 0, 0), ("on", 0, 1),
                   ("on", 1, 0), ("on", 1, 1), ("off", 1, 0), ("off", 1, 1)]
    assert len(pair_records(records, 2)) == 2 * 4 * 2  # repeats x copies x turns


def category_report():
    recs = []
    for r in range(MIN_UNITS):
        for pid, cat, on_tok in (("a", "grounded", 20), ("b", "open", 10)):
            off = rec("off", pid, r, tokens=10, e2e_ms=100, level=4)
            on = rec("on", pid, r, tokens=on_tok, e2e_ms=100, level=4)
            recs += [x.model_copy(update={"category": cat}) for x in (off, on)]
    report = CompareReport(settings=CompareSettings(concurrency=[4], repeat=MIN_UNITS), off_server=INFO,
                           on_server=INFO, requests=recs)
    analyse(report)
    return report


def test_per_category_ratios_on_the_levels_units():
    (lv,) = category_report().levels
    assert set(lv.by_category) == {"grounded", "open"}
    assert lv.by_category["grounded"].throughput.point == pytest.approx(2.0)
    assert lv.by_category["open"].throughput.point == pytest.approx(1.0)
    assert lv.by_category["open"].throughput.unit == "blocks" and lv.by_category["open"].throughput.n == MIN_UNITS
    assert "grounded" in to_markdown(category_report())


def test_goodput_at_concurrency_1_divides_by_each_sides_busy_time():
    recs = []
    for r in range(MIN_UNITS):
        recs += [rec("off", "a", r, e2e_ms=200), rec("on", "a", r, e2e_ms=100)]
    g = level_goodput(recs, 1, {"e2e": 150})
    assert (g.off.good, g.on.good) == (0, MIN_UNITS)
    assert g.on.duration_s == pytest.approx(MIN_UNITS * 0.1)
    assert g.units_without_good == MIN_UNITS and g.ratio.point is None
    assert g.share_difference.point == pytest.approx(1.0)


def test_crossover_names_rates_without_a_trailing_zero():
    few = RatioCI(point=1.1, n=2, unit="blocks", method="t", min_n=5, too_few=True)
    c = find_crossover([1.0, math.inf], [few, few], what="request rate")
    assert c.text == ("no clear difference at any tested request rate (1, inf): no interval at 1: 2 blocks, "
                      "fewer than 5; no interval at inf: 2 blocks, fewer than 5")

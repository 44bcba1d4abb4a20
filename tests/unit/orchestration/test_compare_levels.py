"""compare's notes that warn the user, and the per-level figures (orchestration/compare.py) where the
earlier tests leave gaps: arrival-rate levels (their units, latency, acceptance, crossover in
request rate), per-category units, goodput's time per side (busy time at concurrency 1, block
wall time otherwise), send lag per side and repeat, progress totals, and a later turn whose
history is missing.

Expected figures are worked out here from the records' times by hand."""

from __future__ import annotations

import math

import pytest

from specadapt.analysis import speed
from specadapt.analysis.pairs import pair_records
from specadapt.analysis.speed import analyse, category_speed, level_goodput, level_lag, level_speed
from specadapt.analysis.stats import MIN_UNITS
from specadapt.load import spread
from specadapt.orchestration import compare
from specadapt.orchestration.compare import total_requests
from specadapt.records import (
    ChatMessage,
    CompareReport,
    CompareSettings,
    CounterPair,
    CounterSnapshot,
    LevelResult,
    Prompt,
    PromptIdentity,
    RequestRecord,
    ServerInfo,
)
from specadapt.records.load import LoadSettings, SendLag
from builders import server
from tests.unit.orchestration.test_compare import FakeServer, Script

MS = 1_000_000


# ------------------------------------------------------------------------------ notes

def info(**kw) -> ServerInfo:
    return server(**{"base_url": "http://x", **kw})


def rate_level(rate: float, lag_off: SendLag | None, lag_on: SendLag | None) -> LevelResult:
    return LevelResult.model_construct(concurrency=0, request_rate=rate, send_lag_off=lag_off, send_lag_on=lag_on)


def failed(warmup: bool = False, ok: bool = False) -> RequestRecord:
    return RequestRecord(prompt_id="a", category="c", api="completions", ok=ok, warmup=warmup)


def identity(later: int) -> PromptIdentity:
    return PromptIdentity(prompt_id="a", category="c", pairs=2, identical_pairs=2, verdict="identical",
                          different_history_pairs=later)


def test_every_warning_note_in_order():
    limited = SendLag(requests=8, client_limited=True, reason="the client, not the server, limited this run: X")
    report = CompareReport(
        settings=CompareSettings(on_temperature=0.7, interleaved=False),
        off_server=info(model_id="m-a", spec_enabled=True, version="0.9.0"),
        on_server=info(model_id="m-b", spec_enabled=False, version="0.10.0"),
        requests=[failed(), failed(), failed(warmup=True), failed(ok=True)],
        identity=[identity(2), identity(0), identity(1)])
    report.rate_levels = [rate_level(2.5, limited, SendLag(requests=8)), rate_level(math.inf, None, limited)]
    assert speed.compare_notes(report) == [
        "the 'off' server has spec-decode counters: speculation looks ON there",
        "the 'on' server has no spec-decode counters: speculation looks OFF there",
        "the servers serve different model ids (m-a vs m-b)",
        "the sides differ in more than speculation: server version: 0.9.0 on the spec-off side, 0.10.0 on the "
        "spec-on side",
        "drill: the spec-on side ran at temperature 0.7",
        "2 request(s) failed and were left out of the pairs",
        "the servers ran one after the other (not interleaved): machine drift can bias the ratios",
        "request rate 2.5, spec-off: the client, not the server, limited this run: X; the ratios at this rate "
        "describe the client's pace, not the servers'",
        "request rate inf, spec-on: the client, not the server, limited this run: X; the ratios at this rate "
        "describe the client's pace, not the servers'",
        "3 pair(s) of later conversation turns followed a diverged turn: the sides' histories differ there, so "
        "those pairs are not identity verdicts of their own",
    ]


@pytest.mark.parametrize("on_spec", [True, None])
def test_a_clean_comparison_has_no_note(on_spec):
    """Speculation seen on the spec-on side only (or not known there), the same model, the drill
    temperature equal to the run's, only a warm-up failed, the client kept the pace."""
    report = CompareReport(settings=CompareSettings(on_temperature=0.0), off_server=info(spec_enabled=None),
                           on_server=info(spec_enabled=on_spec), requests=[failed(warmup=True), failed(ok=True)],
                           identity=[identity(0)])
    report.rate_levels = [rate_level(4.0, SendLag(requests=3), None)]
    assert speed.compare_notes(report) == []


# ------------------------------------------------------------------------------ rate levels

def record(side, pid, repeat, tokens, e2e_ms, sent_ms, *, level=0, rate=None, category="x", sched_ms=None):
    """``tokens`` tokens evenly from 10 ms to E2E - 1 ms."""
    step = (e2e_ms - 11) / (tokens - 1)
    chunk = [int((10 + i * step) * MS) for i in range(tokens)]
    return RequestRecord(prompt_id=pid, category=category, api="completions", side=side, repeat=repeat,
                         concurrency=level, request_rate=rate, ok=True, sent_at_ns=int(sent_ms * MS), chunk_ns=chunk,
                         chunk_tokens=[1] * tokens, output_tokens=tokens, e2e_ns=int(e2e_ms * MS),
                         scheduled_at_ns=None if sched_ms is None else int(sched_ms * MS))


def rate_report(spec: bool | None = True) -> CompareReport:
    """Concurrency 1 and 2 req/s, MIN_UNITS repeats, prompts a (category x) and b (y), 10 tokens each.
    Concurrency 1, per repeat r: off a (sent 0, 100 ms), on a (100, 50 + r), on b (200, 50 + r),
    off b (300, 100): spec off is busy 200 ms over a 400 ms span. 2 req/s, per repeat and side a
    block: a sent at 0, b at 500 ms; off 100 ms each (wall 600), on 50 + r (wall 550 + r)."""
    recs = []
    for r in range(MIN_UNITS):
        for pid, cat, sent in (("a", "x", 0), ("b", "y", 300)):
            recs.append(record("off", pid, r, 10, 100, sent, level=1, category=cat))
        for pid, cat, sent in (("a", "x", 100), ("b", "y", 200)):
            recs.append(record("on", pid, r, 10, 50 + r, sent, level=1, category=cat))
        for side, e2e in (("off", 100), ("on", 50 + r)):
            for pid, cat, sent in (("a", "x", 0), ("b", "y", 500)):
                recs.append(record(side, pid, r, 10, e2e, sent, rate=2.0, category=cat, sched_ms=sent))
    before = CounterSnapshot(drafts=0, draft_tokens=0, accepted_tokens=0, accepted_per_position={0: 0, 1: 0})
    after = CounterSnapshot(drafts=40, draft_tokens=80, accepted_tokens=60, accepted_per_position={0: 36, 1: 24})
    load = LoadSettings(request_rates=[2.0], slo_ms={"e2e": 80.0})
    report = CompareReport(settings=CompareSettings(concurrency=[1], repeat=MIN_UNITS, load=load),
                           off_server=info(), on_server=info(spec_enabled=spec), requests=recs,
                           counters_on_rate={"2": CounterPair(before=before, after=after)})
    analyse(report)
    return report


def test_a_rate_level_is_analysed_on_its_own_records_blocks_and_counters():
    report = rate_report()
    (one,), (lv,) = report.levels, report.rate_levels
    assert (lv.concurrency, lv.request_rate, lv.pairs) == (0, 2.0, 2 * MIN_UNITS)
    # its latency summaries: its own 10 requests per side (e2e 100 off; 50 + r on)
    assert (lv.off.requests, lv.on.requests) == (2 * MIN_UNITS, 2 * MIN_UNITS)
    assert lv.off.e2e_ms.mean == pytest.approx(100) and lv.on.e2e_ms.mean == pytest.approx(50 + 2)
    # block throughput: (20 tokens / (550 + r) ms) / (20 tokens / 600 ms)
    expected = math.exp(sum(math.log(600 / (550 + r)) for r in range(MIN_UNITS)) / MIN_UNITS)
    assert lv.speed.throughput.point == pytest.approx(expected) and lv.speed.throughput.unit == "blocks"
    # per prompt and per category: the share of each block, one unit per block pair (never per request pair)
    for p in lv.by_prompt:
        assert (p.ratios.throughput.unit, p.ratios.throughput.n, p.ratios.tpot.unit) == ("blocks", MIN_UNITS, "blocks")
    assert {c: (s.throughput.unit, s.throughput.n) for c, s in lv.by_category.items()} == {
        "x": ("blocks", MIN_UNITS), "y": ("blocks", MIN_UNITS)}
    share = math.exp(sum(math.log(100 / (50 + r)) for r in range(MIN_UNITS)) / MIN_UNITS)
    assert lv.by_category["x"].throughput.point == pytest.approx(share)
    # at concurrency 1 each pair is a unit, per category too
    assert {c: (s.throughput.unit, s.throughput.n) for c, s in one.by_category.items()} == {
        "x": ("pairs", MIN_UNITS), "y": ("pairs", MIN_UNITS)}
    # the rate's own counters: 40 passes, 60 accepted
    assert lv.acceptance.known and lv.acceptance.mean_acceptance_length == pytest.approx(2.5)
    assert not one.acceptance.known
    assert report.rate_crossover.text == "spec on is faster at every tested request rate (2)"
    assert report.rate_crossover.verdicts == {2.0: "faster"}


@pytest.mark.parametrize("spec", [False, None])
def test_no_speed_verdict_in_request_rate_without_speculation_on_the_spec_on_side(spec):
    crossing = rate_report(spec).rate_crossover
    assert crossing.status == "no-speculation" and crossing.verdicts == {2.0: "no speculation"}


def test_goodput_time_is_busy_time_at_concurrency_1_and_block_wall_time_at_a_rate():
    report = rate_report()
    (one,), (lv,) = report.levels, report.rate_levels
    # concurrency 1: off busy 2 x 100 ms per repeat (its span would be 400 ms), on 2 x (50 + r)
    assert one.goodput.off.requests == 2 * MIN_UNITS and one.goodput.off.duration_s == pytest.approx(MIN_UNITS * 0.2)
    assert one.goodput.on.duration_s == pytest.approx(sum(2 * (50 + r) for r in range(MIN_UNITS)) / 1000)
    assert (one.goodput.off.good, one.goodput.on.good) == (0, 2 * MIN_UNITS)  # e2e <= 80 ms
    # 2 req/s: each block's wall time, 600 ms off (busy only 200)
    assert lv.goodput.off.duration_s == pytest.approx(MIN_UNITS * 0.6)
    assert lv.goodput.on.duration_s == pytest.approx(sum(550 + r for r in range(MIN_UNITS)) / 1000)


def test_goodput_at_concurrency_n_counts_each_blocks_wall_time():
    """Concurrency 4: the off block's 4 requests run together (100 ms wall, 400 ms busy); on two
    at a time (sent 0, 0, 50, 50 ms, 50 ms each: 100 ms wall, 200 ms busy)."""
    recs = []
    for r in range(MIN_UNITS):
        recs += [record("off", "a", r, 10, 100, 0, level=4) for _ in range(4)]
        recs += [record("on", "a", r, 10, 50, sent, level=4) for sent in (0, 0, 50, 50)]
    g = level_goodput(recs, 4, {"e2e": 1000.0})
    assert g.off.duration_s == pytest.approx(MIN_UNITS * 0.1) and g.on.duration_s == pytest.approx(MIN_UNITS * 0.1)
    assert g.ratio.point == pytest.approx(1.0) and (g.off.good, g.on.good) == (4 * MIN_UNITS, 4 * MIN_UNITS)


def test_with_a_rate_the_units_are_blocks_whatever_level_is_passed():
    report = rate_report()
    pairs = pair_records(report.requests, 0, 2.0)
    speed0, by0 = level_speed(report.requests, 0, pairs, 2.0)
    speed1, by1 = level_speed(report.requests, 1, pairs, 2.0)
    assert (speed1, by1) == (speed0, by0) and by1[0].ratios.tpot.unit == "blocks"
    assert category_speed(pairs, 1, 2.0) == category_speed(pairs, 0, 2.0)
    assert category_speed(pairs, 1, 2.0)["x"].e2e.unit == "blocks"


# ------------------------------------------------------------------------------ send lag

def test_send_lag_is_per_side_over_each_repeats_own_schedule():
    """Off: repeat 0 scheduled 0, 250 ms, sent 1, 252 (lags 1, 2 ms); repeat 1 scheduled 0, 500,
    sent 3, 504 (lags 3, 4). On: lags 10, 20 and 30, 40 on the same schedules."""
    recs = []
    for side, sent in (("off", ((1, 252), (3, 504))), ("on", ((10, 270), (30, 540)))):
        for rep, sched in ((0, (0, 250)), (1, (0, 500))):
            recs += [record(side, "a", rep, 4, 50, s, rate=4.0, sched_ms=c) for c, s in zip(sched, sent[rep], strict=True)]
    recs.append(record("off", "a", 0, 4, 50, 900, rate=8.0, sched_ms=0))  # another rate
    recs.append(record("off", "a", 0, 4, 50, 900, level=1, sched_ms=0))  # a concurrency level
    recs.append(record("off", "a", 0, 4, 50, 700, rate=4.0).model_copy(update={"turn": 1}))  # a later turn: unscheduled
    off = level_lag(recs, 4.0, "off")
    assert (off.requests, off.p50_ms, off.max_ms) == (4, pytest.approx(2.5), pytest.approx(4.0))
    assert off.p99_ms == pytest.approx(3.97)  # linear between the 3rd and 4th of 1, 2, 3, 4
    # 2 gaps over 250 + 500 ms scheduled, over 251 + 501 ms sent
    assert off.scheduled_rate == pytest.approx(2 / 0.75) and off.achieved_rate == pytest.approx(2 / 0.752)
    assert not off.client_limited
    on = level_lag(recs, 4.0, "on")
    assert (on.requests, on.p50_ms, on.max_ms) == (4, pytest.approx(25.0), pytest.approx(40.0))
    assert on.client_limited and on.reason.startswith("the client, not the server, limited this run: send lag p99")


# ------------------------------------------------------------------------------ progress totals

def test_total_requests_with_one_prompt_at_a_rate_is_what_the_runner_sends(monkeypatch):
    import asyncio

    load = LoadSettings(request_rates=[2000.0], duration_s=0.004)
    settings = CompareSettings(concurrency=[1], repeat=2, warmup=1, load=load)
    # warm-up 1 per side; concurrency 1: 2 sides x 2 repeats; 2000 req/s for 4 ms: 8 arrivals per block
    assert total_requests(1, settings) == 2 + 2 * 2 + 2 * 2 * 8
    script = Script({"off": 4, "on": 4}, {"off": 1.0, "on": 1.0})
    monkeypatch.setattr(spread, "stream_request", script.stream_request)
    monkeypatch.setattr(compare, "settle_counters", lambda server: server.read_counters())
    prompts = [Prompt(id="only", prompt="x")]
    asyncio.run(compare.ABRunner(FakeServer("off"), FakeServer("on"), prompts, settings).run())
    assert sum(1 for ev, *_ in script.log if ev == "start") == total_requests(1, settings)


def test_total_requests_at_a_rate_counts_whole_requests_for_conversations():
    """4 prompts, one a conversation of 2 turns: 5 requests per pass. At 3 req/s for 1 s, 3 arrivals
    per block: 2 sides x 3 arrivals x 5/4 requests each = 7.5, counted as 7 whole requests."""
    chat = Prompt(id="c", messages=[ChatMessage(role="user", content="hi")], turns=["more"])
    prompts = [chat] + [Prompt(id=f"p{i}", prompt="x") for i in range(3)]
    settings = CompareSettings(concurrency=[1], repeat=1, warmup=0,
                               load=LoadSettings(request_rates=[3.0], duration_s=1.0))
    total = total_requests(4, settings, prompts)
    assert total == 2 * 5 + 7 and isinstance(total, int)


# ------------------------------------------------------------------------------ turn history

def test_a_later_turn_without_the_earlier_answer_on_record_is_asked_with_an_empty_answer():
    chat = Prompt(id="chat", messages=[ChatMessage(role="user", content="hi")], turns=["more", "again"])
    later = RequestRecord(prompt_id="chat", category="default", api="chat", side="off", turn=2, text="3rd")
    first = later.model_copy(update={"turn": 0, "text": "1st"})
    on_side = later.model_copy(update={"turn": 1, "side": "on", "text": "ON"})
    req = compare.turn_request([first, on_side, later], chat, later)
    assert [(m.role, m.content) for m in req.messages] == [
        ("user", "hi"), ("assistant", "1st"), ("user", "more"), ("assistant", ""), ("user", "again")]

"""The A/B runner and its analysis (orchestration/compare.py) without HTTP: a fake ``stream_request``
records what was sent, in which order, and answers with the tokens and times each side is
scripted to give, on an injected clock.

What is pinned here: the send order at concurrency 1 (alternating per prompt and per repeat),
the blocks at concurrency N (copies, one server at a time, alternating), pairing by copy, the
directions of the ratios (the sides get different token counts), block throughput as tokens
over wall time, the unit of independence, and the implied draft cost of theory_check.
"""

from __future__ import annotations

import asyncio
import math
import time

import pytest

from specadapt.adapters.base import ServerBase
from specadapt.analysis import speed
from specadapt.analysis.pairs import pair_records
from specadapt.analysis.speed import analyse, block_rate, speed_ratios, theory_check
from specadapt.analysis.stats import MIN_UNITS
from specadapt.load import spread
from specadapt.orchestration import compare
from specadapt.orchestration.compare import ABRunner, copies_for, total_requests
from specadapt.records import (
    AcceptanceSummary,
    CompareReport,
    CompareSettings,
    CounterPair,
    CounterSnapshot,
    LevelResult,
    Prompt,
    RatioCI,
    RequestRecord,
    ServerInfo,
    SpeedRatios,
)

MS = 1_000_000


class FakeServer(ServerBase):
    def __init__(self, name: str):
        self.backend, self.name = "fake", name

    @property
    def base_url(self) -> str:
        return f"http://{self.name}.invalid"

    @property
    def model_id(self) -> str:
        return f"model-{self.name}"

    def headers(self):
        return {}

    def describe(self):
        return ServerInfo(backend="fake", base_url=self.base_url, model_id=self.model_id)

    def read_counters(self):
        return CounterSnapshot()


class Script:
    """Answers each request as its side is scripted; logs (event, side, prompt, repeat, warmup)."""

    def __init__(self, tokens: dict[str, int], itl_ms: dict[str, float]):
        self.tokens, self.itl_ms, self.log = tokens, itl_ms, []

    async def stream_request(self, client, prompt, model, settings, t0, repeat=0, warmup=False):
        side = "on" if model == "model-on" else "off"
        assert str(client.base_url).startswith(f"http://{side}.invalid"), (side, client.base_url)  # its own client
        self.log.append(("start", side, prompt.id, repeat, warmup))
        sent = time.perf_counter_ns() - t0  # the run's clock, as stream_request does
        await asyncio.sleep(0)  # let the other requests of a block start
        n = self.tokens[side]
        chunk_ns = [20 * MS + int(i * self.itl_ms[side] * MS) for i in range(n)]
        self.log.append(("end", side, prompt.id, repeat, warmup))
        return RequestRecord(prompt_id=prompt.id, category="c", api="completions", repeat=repeat, warmup=warmup,
                             ok=True, sent_at_ns=sent, chunk_ns=chunk_ns, chunk_tokens=[1] * n, output_tokens=n,
                             e2e_ns=chunk_ns[-1] + MS, tokens=[f"t{i}" for i in range(n)])


PROMPTS = [Prompt(id=f"p{i}", prompt=f"prompt {i}") for i in range(2)]  # an even count


def run(monkeypatch, settings: CompareSettings, prompts=PROMPTS, tokens=None, itl=None):
    script = Script(tokens or {"off": 8, "on": 8}, itl or {"off": 10.0, "on": 10.0})
    monkeypatch.setattr(spread, "stream_request", script.stream_request)
    monkeypatch.setattr(compare, "settle_counters", lambda server: server.read_counters())
    runner = ABRunner(FakeServer("off"), FakeServer("on"), prompts, settings)
    records, _, _ = asyncio.run(runner.run())
    return script, records


def test_concurrency_1_alternates_who_goes_first_per_prompt_and_per_repeat(monkeypatch):
    script, records = run(monkeypatch, CompareSettings(concurrency=[1], repeat=4, warmup=1))
    sends = [(side, pid, r) for ev, side, pid, r, warm in script.log if ev == "start" and not warm]
    assert len(sends) == 2 * 4 * len(PROMPTS)
    pairs = [sends[j:j + 2] for j in range(0, len(sends), 2)]
    for i, ((s1, p1, r1), (s2, p2, r2)) in enumerate(pairs):
        r, k = divmod(i, len(PROMPTS))
        assert (p1, r1) == (p2, r2) == (PROMPTS[k].id, r)  # the pair is sent back to back
        assert (s1, s2) == (("off", "on") if (r + k) % 2 == 0 else ("on", "off")), (r, k)
    for p in PROMPTS:  # each prompt goes first on each side equally often
        firsts = [s1 for (s1, p1, _), _ in pairs if p1 == p.id]
        assert firsts.count("off") == firsts.count("on") == 2
    assert {r.replica for r in records if r.concurrency == 1} == {0} and all(r.sent_at_ns >= 0 for r in records)


def test_warmup_goes_to_both_servers_first():
    settings = CompareSettings(concurrency=[1, 4], repeat=2, warmup=3)
    assert total_requests(2, settings) == 2 * 3 + 2 * 2 * 2 * 1 + 2 * 2 * 2 * 4


def test_concurrency_n_runs_whole_blocks_one_server_at_a_time(monkeypatch):
    settings = CompareSettings(concurrency=[4], repeat=3, warmup=0)
    script, records = run(monkeypatch, settings)
    assert len(records) == total_requests(len(PROMPTS), settings)
    events = [(side, r) for ev, side, _, r, _ in script.log]
    # one block: 4 copies of the 2 prompts (>= 2N = 8 requests), starts and ends together
    blocks = [events[j:j + 16] for j in range(0, len(events), 16)]
    assert len(blocks) == 6
    assert [b[0] for b in blocks] == [("off", 0), ("on", 0), ("on", 1), ("off", 1), ("off", 2), ("on", 2)]
    for b in blocks:
        assert all(e == b[0] for e in b)  # no request of another block in between
    per_copy = {(r.side, r.repeat, r.prompt_id, r.replica) for r in records}
    assert len(per_copy) == len(records)  # every copy is told apart by its replica index
    assert {r.replica for r in records} == {0, 1, 2, 3}


@pytest.mark.parametrize("level, n_prompts, copies", [(1, 1, 1), (1, 2, 1), (1, 50, 1), (2, 1, 4), (4, 2, 4),
                                                      (4, 3, 3), (3, 5, 2), (2, 8, 1), (16, 8, 4)])
def test_copies_for_fill_a_block_to_at_least_2n_requests(level, n_prompts, copies):
    assert copies_for(level, n_prompts) == copies
    if level > 1:
        assert copies * n_prompts >= 2 * level > (copies - 1) * n_prompts


def rec(side, pid, repeat, tokens=10, e2e_ms=100.0, ttft_ms=10.0, replica=0, level=1, sent_ms=0.0, ok=True,
        warmup=False):
    """A finished request: ``tokens`` tokens, first at ttft, last at e2e - 1 ms."""
    step = (e2e_ms - 1 - ttft_ms) / (tokens - 1)
    chunk = [int((ttft_ms + i * step) * MS) for i in range(tokens)]
    return RequestRecord(prompt_id=pid, category="c", api="completions", side=side, repeat=repeat, replica=replica,
                         concurrency=level, ok=ok, warmup=warmup, sent_at_ns=int(sent_ms * MS), chunk_ns=chunk,
                         chunk_tokens=[1] * tokens, output_tokens=tokens, e2e_ns=int(e2e_ms * MS))


def test_pairs_match_prompt_repeat_and_copy():
    recs = []
    for cp in range(3):
        recs += [rec("off", "a", 0, e2e_ms=100 + cp, replica=cp, level=4),
                 rec("on", "a", 0, e2e_ms=200 + cp, replica=cp, level=4)]
    recs += [rec("off", "a", 1, level=4), rec("on", "a", 1, level=4, ok=False),  # failed: no pair
             rec("off", "a", 0, level=1), rec("on", "a", 0, level=1, warmup=True)]  # other level, warm-up
    pairs = pair_records(recs, 4)
    assert len(pairs) == 3
    for off, on in pairs:
        assert (off.side, on.side) == ("off", "on") and off.replica == on.replica
        assert on.e2e_ns - off.e2e_ns == 100 * MS
    assert pair_records(recs, 1) == []


def test_ratios_point_the_right_way_with_different_token_counts():
    """off: 10 tokens in 100 ms; on: 30 tokens in 150 ms. tokens/s on/off = 200/100 = 2;
    TPOT off 10 ms, on 5 ms: 2; E2E off/on = 100/150."""
    pairs = [(rec("off", f"p{i}", 0, tokens=10, e2e_ms=100.0, ttft_ms=10.0),
              rec("on", f"p{i}", 0, tokens=30, e2e_ms=150.0, ttft_ms=4.0)) for i in range(MIN_UNITS)]
    r = speed_ratios(pairs)
    assert r.throughput.point == pytest.approx(2.0)
    assert r.tpot.point == pytest.approx((90 / 9) / (146 / 29))  # (E2E - TTFT) / (tokens - 1)
    assert r.e2e.point == pytest.approx(100 / 150)
    assert (r.throughput.unit, r.throughput.n) == ("pairs", MIN_UNITS)


def test_block_throughput_is_tokens_over_the_block_wall_time():
    # off block: 4 requests sent together, 100 ms each: 40 tokens in 100 ms
    off = [rec("off", "a", 0, tokens=10, e2e_ms=100.0, replica=i, level=4) for i in range(4)]
    # on block: one after the other (sent 0, 50, 100, 150 ms), 50 ms each: 40 tokens in 200 ms
    on = [rec("on", "a", 0, tokens=10, e2e_ms=50.0, sent_ms=50.0 * i, replica=i, level=4) for i in range(4)]
    assert block_rate(off) == (40, 100 * MS) and block_rate(on) == (40, 200 * MS)
    assert block_rate(off + [rec("off", "b", 0, ok=False, sent_ms=500.0)]) == (40, 100 * MS)  # failed: left out
    assert block_rate([]) == (0, 0)
    later = [r.model_copy(update={"sent_at_ns": r.sent_at_ns + 5000 * MS}) for r in on]  # a block later in the run
    assert block_rate(later) == (40, 200 * MS)


def g(r: int) -> float:
    """The spec-on side's slowdown in repeat r (so the units are not all equal)."""
    return 1 + 0.02 * (r % 2)


def block_report(repeats: int, on_spec: bool | None = True) -> CompareReport:
    """Concurrency 4, prompts a and b x 4 copies per block. Off: 10 tokens per request, on: 20
    (a) and 22 (b). Every off request takes 100 f ms, all sent together; every on request
    100 f g ms, two at a time, so the on block's wall time is 200 f g. Repeat r scales every
    time by f = 1 + r/10 (the block effect)."""
    recs = []
    for r in range(repeats):
        f = 1 + r / 10
        for cp in range(4):
            for pid, on_tokens in (("a", 20), ("b", 22)):
                recs.append(rec("off", pid, r, tokens=10, e2e_ms=100 * f, replica=cp, level=4))
                recs.append(rec("on", pid, r, tokens=on_tokens, e2e_ms=100 * f * g(r), replica=cp, level=4,
                                sent_ms=100 * f * g(r) * (cp % 2)))
    info = ServerInfo(backend="fake", base_url="http://x", model_id="m")
    report = CompareReport(settings=CompareSettings(concurrency=[4], repeat=repeats), off_server=info,
                           on_server=info.model_copy(update={"spec_enabled": on_spec}), requests=recs)
    analyse(report)
    return report


def test_the_unit_at_concurrency_n_is_the_block_not_the_pair():
    n = MIN_UNITS + 1
    (lv,) = block_report(n).levels
    assert lv.pairs == n * 8
    for ratio in (lv.speed.throughput, lv.speed.tpot, lv.speed.e2e):
        assert (ratio.unit, ratio.n, ratio.too_few) == ("blocks", n, False)
    # block throughput: (168 tokens / 200 f g ms) / (80 tokens / 100 f ms) = 1.05 / g
    # (the requests' own rates would say 2 and 2.2)
    mean_log_g = sum(math.log(g(r)) for r in range(n)) / n
    assert lv.speed.throughput.point == pytest.approx(1.05 * math.exp(-mean_log_g))
    assert lv.speed.e2e.point == pytest.approx(math.exp(-mean_log_g))
    for p in lv.by_prompt:  # per prompt: its copies in each repeat's blocks, its requests' own rates
        assert (p.ratios.throughput.unit, p.ratios.throughput.n) == ("blocks", n)
    by = {p.prompt_id: p.ratios.throughput.point for p in lv.by_prompt}
    assert by["a"] == pytest.approx(2.0 * math.exp(-mean_log_g)) and by["b"] == pytest.approx(2.2 * math.exp(-mean_log_g))


def concurrency_1_report(repeats: int, prompts: int) -> CompareReport:
    recs = []
    for r in range(repeats):
        for k in range(prompts):
            recs += [rec("off", f"p{k}", r, tokens=10, e2e_ms=100 + 7 * r + k),
                     rec("on", f"p{k}", r, tokens=12, e2e_ms=90 + 5 * r + 2 * k)]
    info = ServerInfo(backend="fake", base_url="http://x", model_id="m", spec_enabled=True)
    report = CompareReport(settings=CompareSettings(concurrency=[1], repeat=repeats), off_server=info,
                           on_server=info, requests=recs)
    analyse(report)
    return report


def test_per_prompt_units_at_concurrency_1_are_its_repeats():
    (lv,) = concurrency_1_report(repeats=6, prompts=3).levels
    assert (lv.speed.throughput.n, lv.speed.throughput.unit) == (18, "pairs")
    for p in lv.by_prompt:
        assert (p.ratios.throughput.n, p.ratios.tpot.n, p.ratios.throughput.unit) == (6, 6, "pairs")
    (few,) = concurrency_1_report(repeats=3, prompts=3).levels
    assert all(p.ratios.tpot.too_few for p in few.by_prompt) and not few.speed.tpot.too_few


def theory_level(L: float, rates: list[float], known: bool = True, drafts: float = 100,
                 measured: float | None = 1.5) -> LevelResult:
    acc = AcceptanceSummary(known=known, drafts=drafts, draft_tokens=drafts * len(rates),
                            mean_acceptance_length=L, per_position_rate=rates)
    ratio = RatioCI(point=measured)
    return LevelResult.model_construct(concurrency=1, pairs=5, acceptance=acc,
                                       speed=SpeedRatios(tpot=ratio, e2e=ratio, throughput=ratio))


def speedup(a: float, k: int, c: float) -> float:
    """Expected tokens per pass for i.i.d. acceptance a, over the pass's cost k c + 1."""
    return sum(a ** i for i in range(k + 1)) / (k * c + 1)


def test_implied_draft_cost_inverts_the_cost_model():
    """A verify pass costs k*c + 1 decode steps and yields L tokens, so TPOT_on = TPOT_off * (k c + 1) / L.
    Build TPOT_on from a chosen c and check theory_check gives c back."""
    k, L, c, tpot_off = 2, 2.2, 0.16, 20.0
    tpot_on = tpot_off * (k * c + 1) / L
    level = theory_level(L, [0.7, 0.5])
    t = theory_check(level, tpot_off, tpot_on, None)
    assert t.implied_draft_cost == pytest.approx(c)
    assert t.k == k and t.tokens_per_pass == L and t.draft_cost_assumed == 0.0
    assert t.predicted_speedup == pytest.approx(1 + 0.7 + 0.5)
    assert t.measured_speedup == 1.5 and t.measured_over_predicted == pytest.approx(1.5 / 2.2)
    # i.i.d. acceptance a with 1 + a + a^2 = L, and the best k for it at the implied c (k = 0..16)
    a = t.iid_acceptance
    assert 1 + a + a * a == pytest.approx(L)
    assert t.best_k_iid == max(range(17), key=lambda kk: speedup(a, kk, c))
    assert t.best_k_measured_positions == 2  # (1 + .7 + .5) / (2c + 1) = 1.67 > (1 + .7) / (c + 1) = 1.47
    # a spec-on TPOT so low that c would be negative: c is 0, not less
    assert theory_check(level, tpot_off, tpot_off / L / 2, None).implied_draft_cost == 0.0


def test_theory_with_an_assumed_cost_and_a_weak_second_position():
    level = theory_level(1.8, [0.7, 0.1])
    t = theory_check(level, None, 12.0, 0.3)
    assert t.implied_draft_cost is None and t.draft_cost_assumed == 0.3
    assert t.predicted_speedup == pytest.approx(1.8 / (2 * 0.3 + 1))
    assert t.best_k_measured_positions == 1  # (1 + .7) / 1.3 = 1.31 > (1 + .8) / 1.6 = 1.13
    a = t.iid_acceptance
    assert t.best_k_iid == max(range(17), key=lambda kk: speedup(a, kk, 0.3))
    assert 1 + a + a * a == pytest.approx(1.8)


def test_best_measured_k_uses_the_implied_cost_and_is_at_least_1():
    # implied c = (TPOT_on * L / TPOT_off - 1) / k = (12 * 1.8 / 20 - 1) / 2 = 0.04: (1 + .7 + .1) / 1.08 > 1.7 / 1.04
    assert theory_check(theory_level(1.8, [0.7, 0.1]), 20.0, 12.0, None).best_k_measured_positions == 2
    # implied c = (14 * 1.8 / 20 - 1) / 2 = 0.13 > 0.0625: 1.7 / 1.13 > 1.8 / 1.26, though at c = 0 k = 2 would win
    assert theory_check(theory_level(1.8, [0.7, 0.1]), 20.0, 14.0, None).best_k_measured_positions == 1
    # implied c = (60 * 1.15 / 20 - 1) / 2 = 1.225: every k slows down (1.1 / 2.2), still k >= 1 is named
    t = theory_check(theory_level(1.15, [0.1, 0.05]), 20.0, 60.0, None)
    assert t.implied_draft_cost == pytest.approx(1.225) and t.best_k_measured_positions == 1


def test_no_measured_ratio_no_measured_over_predicted():
    t = theory_check(theory_level(1.8, [0.7, 0.1], measured=None), 20.0, 12.0, None)
    assert (t.measured_speedup, t.measured_over_predicted) == (None, None) and t.predicted_speedup == pytest.approx(1.8)


@pytest.mark.parametrize("L", [1.0, 3.0])
def test_no_iid_acceptance_at_the_ends(L):
    """L = 1 (nothing accepted) or L = k + 1 (everything): no a in (0, 1) explains it."""
    t = theory_check(theory_level(L, [0.5, 0.5]), 20.0, 10.0, None)
    assert (t.iid_acceptance, t.best_k_iid) == (None, None)
    assert theory_check(theory_level(1.5, [0.3, 0.2]), 20.0, 10.0, None).iid_acceptance == pytest.approx(
        (-1 + math.sqrt(1 + 4 * 0.5)) / 2)  # 1 + a + a^2 = 1.5


@pytest.mark.parametrize("known, drafts, rates", [(False, 100, [0.5]), (True, 0, [0.5]), (True, 100, [])])
def test_no_theory_without_acceptance(known, drafts, rates):
    assert theory_check(theory_level(1.5, rates, known=known, drafts=drafts), 20.0, 10.0, None) is None


def test_analyse_summarises_each_side_of_each_level_and_feeds_theory():
    """Level latency summaries count this level's requests of one side, warm-ups left out; theory
    gets the two sides' mean TPOT and the assumed draft cost."""
    recs = [rec("off", "w", 0, warmup=True), rec("on", "w", 0, warmup=True)]
    for r in range(MIN_UNITS):
        recs += [rec("off", "a", r, tokens=10, e2e_ms=100 + r), rec("on", "a", r, tokens=12, e2e_ms=80 + r)]
        recs += [rec("off", "a", r, tokens=10, e2e_ms=300, level=4), rec("on", "a", r, tokens=10, e2e_ms=300, level=4)]
    before = CounterSnapshot(drafts=0, draft_tokens=0, accepted_tokens=0, accepted_per_position={0: 0, 1: 0})
    after = CounterSnapshot(drafts=100, draft_tokens=200, accepted_tokens=90, accepted_per_position={0: 60, 1: 30})
    info = ServerInfo(backend="fake", base_url="http://x", model_id="m", spec_enabled=True)
    report = CompareReport(settings=CompareSettings(concurrency=[1, 4], repeat=MIN_UNITS, draft_cost=0.05),
                           off_server=info, on_server=info, requests=recs,
                           counters_on={1: CounterPair(before=before, after=after)})
    analyse(report)
    one, four = report.levels
    assert (one.off.requests, one.on.requests, four.off.requests) == (MIN_UNITS, MIN_UNITS, MIN_UNITS)
    assert (one.off.output_tokens, one.on.output_tokens) == (10 * MIN_UNITS, 12 * MIN_UNITS)
    tpot = {s: sum((x.e2e_ns - x.ttft_ns) / (x.output_tokens - 1) for x in recs if x.side == s and x.concurrency == 1
                   and not x.warmup) / MIN_UNITS / MS for s in ("off", "on")}
    assert one.off.tpot_ms.mean == pytest.approx(tpot["off"]) and one.on.tpot_ms.mean == pytest.approx(tpot["on"])
    L = 1.9
    assert one.theory.implied_draft_cost == pytest.approx((tpot["on"] * L / tpot["off"] - 1) / 2)
    assert one.theory.draft_cost_assumed == 0.05 and four.theory is None


def test_a_pair_without_a_tpot_on_one_side_is_left_out_of_tpot_only():
    pairs = [(rec("off", "a", r, e2e_ms=100 + r), rec("on", "a", r, e2e_ms=50 + r)) for r in range(MIN_UNITS)]
    pairs.append((rec("off", "b", 0), rec("on", "b", 0).model_copy(update={"output_tokens": 1})))  # 1 token: no TPOT
    r = speed_ratios(pairs)
    assert (r.tpot.n, r.e2e.n, r.throughput.n) == (MIN_UNITS, MIN_UNITS + 1, MIN_UNITS + 1)


def test_a_prompt_with_one_pair_is_named_with_its_category():
    pairs = [(rec("off", "a", r), rec("on", "a", r)) for r in range(MIN_UNITS)]
    lone = rec("off", "z", 0).model_copy(update={"category": "lonely"}), rec("on", "z", 0).model_copy(
        update={"category": "lonely"})
    _, by_prompt = speed.level_speed([], 1, pairs + [lone])
    assert [(p.prompt_id, p.category, p.ratios.tpot.n) for p in by_prompt] == [("a", "c", MIN_UNITS), ("z", "lonely", 1)]


def test_a_whole_run_through_the_runner_pairs_every_copy(monkeypatch):
    settings = CompareSettings(concurrency=[1, 4], repeat=MIN_UNITS, warmup=1)
    _, records = run(monkeypatch, settings, tokens={"off": 8, "on": 16}, itl={"off": 10.0, "on": 10.0})
    info = ServerInfo(backend="fake", base_url="http://x", model_id="m", spec_enabled=True)
    report = CompareReport(settings=settings, off_server=info, on_server=info, requests=records)
    analyse(report)
    one, four = report.levels
    assert one.pairs == MIN_UNITS * 2 and four.pairs == MIN_UNITS * 2 * copies_for(4, 2)
    assert (one.speed.tpot.unit, four.speed.tpot.unit) == ("pairs", "blocks")
    assert four.speed.tpot.n == MIN_UNITS
    # same ITL on both sides, twice the tokens on: each request's rate on/off is (16/E2E_on) / (8/E2E_off)
    e2e = {s: (20 + (n - 1) * 10.0 + 1) for s, n in (("off", 8), ("on", 16))}
    assert one.speed.throughput.point == pytest.approx((16 / e2e["on"]) / (8 / e2e["off"]))
    assert one.speed.tpot.point == pytest.approx((71 / 7) / (151 / 15))  # (E2E - TTFT) / (tokens - 1), off / on


def test_every_output_says_too_few_and_the_verdict(tmp_path):
    import io
    import json
    from html import unescape

    from rich.console import Console

    from specadapt.records import read_compare_report, write_report
    from specadapt.report.compare_render import render_console, to_markdown
    from specadapt.report.html import to_html

    report = block_report(MIN_UNITS - 1)
    say = f"(too few blocks, n = {MIN_UNITS - 1} < {MIN_UNITS})"
    buf = io.StringIO()
    render_console(report, Console(file=buf, width=400))
    console = buf.getvalue()
    md = to_markdown(report)
    html = unescape(to_html(report))
    for text in (console, md, html):
        assert say in text and "no clear difference" in text
        assert "95% t interval over independent units" in text
    assert f"| 4 | {4 * (MIN_UNITS - 1) * 2} | " in md and "| no clear difference |" in md
    path = tmp_path / "r.json"
    write_report(report, path)
    thr = json.loads(path.read_text())["levels"][0]["speed"]["throughput"]
    assert (thr["too_few"], thr["unit"], thr["method"], thr["n"], thr["min_n"], thr["low"], thr["verdict"]) == (
        True, "blocks", "t", MIN_UNITS - 1, MIN_UNITS, None, "no clear difference")
    again = read_compare_report(path)  # the saved verdict is recomputed on load, not a field to validate
    assert again.levels[0].speed.throughput == report.levels[0].speed.throughput
    assert again.crossover == report.crossover


def test_an_interval_and_its_verdict_in_the_outputs():
    from specadapt.report.compare_render import ci, to_markdown

    report = block_report(MIN_UNITS + 2)
    (lv,) = report.levels
    t = lv.speed.tpot
    assert ci(t) == f"{t.point:.2f}x [{t.low:.2f}, {t.high:.2f}]" and t.verdict == "faster"
    assert f"| {ci(lv.speed.throughput)} | {ci(t)} | {report.crossover.verdicts[4]} |" in to_markdown(report)
    nospec = block_report(MIN_UNITS + 2, on_spec=False)
    assert "| no speculation |" in to_markdown(nospec) and "no speed verdict" in to_markdown(nospec)


def test_a_report_saved_before_the_method_was_recorded_still_reads():
    old = {"point": 1.07, "low": 0.95, "high": 1.2, "n": 16}
    r = RatioCI.model_validate(old)
    assert (r.method, r.too_few, r.unit, r.verdict) == ("t", False, "pairs", "no clear difference")
    from specadapt.report.compare_render import ci

    assert ci(r) == "1.07x [0.95, 1.20]"
    named = RatioCI.model_validate({**old, "method": "percentile-bootstrap"})
    assert named.method == "percentile-bootstrap" and ci(named) == ci(r)


def test_a_report_with_the_retired_bootstrap_setting_still_reads(tmp_path):
    import json

    from specadapt.records import CompareSettings, read_compare_report, write_report

    report = block_report(MIN_UNITS + 2)
    path = tmp_path / "r.json"
    write_report(report, path)
    saved = json.loads(path.read_text())
    assert "bootstrap" not in saved["settings"]
    saved["settings"]["bootstrap"] = 2000
    path.write_text(json.dumps(saved))
    again = read_compare_report(path)
    assert again.settings == report.settings and "bootstrap" not in again.settings.model_dump()
    assert CompareSettings.model_validate({"repeat": 3, "bootstrap": 200}).repeat == 3

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
import types
import httpx
import orjson
from specadapt.load.engine import LoadEngine
from specadapt.orchestration.compare import ABRunner, finish_compare, run_compare, run_one_side, side_settings
from specadapt.records import (
    ChatMessage,
    CompareReport,
    CompareSettings,
    CounterSnapshot,
    Prompt,
    RequestRecord,
    RequestSettings,
    ServerInfo,
    Triage,
)
from specadapt.records.load import LoadSettings

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


# The A/B runner's wiring (orchestration/compare.py) without HTTP: what each side is sent (its request
# settings with the server's identity extras, the drill temperature), the warm-up and progress,
# the counters read around each level, the --duration blocks at concurrency N, and the whole
# run_compare / run_one_side / finish_compare path: identity, triage of each divergence with the
# spec-off server, its threshold and history, the reference scorer, readable tokens, counts,
# notes and the diagnosis.
#
# A fake ``stream_request`` answers from a script (token ids per prompt, side and turn) and
# counts each server's requests; the servers' counters follow what they served.


class Side(ServerBase):
    """One fake server: its identity extras, counters that follow the requests it served, and a
    log of its counting window (start_run / end_run)."""

    def __init__(self, name: str, extras: dict | None = None, spec: bool | None = None, k: int | None = None):
        self.backend, self.name, self.spec, self.k = "fake", name, spec, k
        self.identity_extras = extras or {}
        self.served = 0
        self.window: list[str] = []

    @property
    def base_url(self) -> str:
        return f"http://{self.name}.invalid"

    @property
    def model_id(self) -> str:
        return "m"  # the same model on both sides

    def headers(self):
        return {}

    def describe(self):
        return ServerInfo(backend="fake", base_url=self.base_url, model_id=self.model_id, spec_enabled=self.spec,
                          num_speculative_tokens=self.k)

    def read_counters(self):
        n = self.served
        if not self.spec:
            return CounterSnapshot(generation_tokens=4 * n)
        # per request: 2 verify passes of k=2 drafting 4 tokens, 3 accepted (2 at position 0, 1 at 1)
        return CounterSnapshot(drafts=2 * n, draft_tokens=4 * n, accepted_tokens=3 * n,
                               accepted_per_position={0: 2 * n, 1: n}, generation_tokens=4 * n)

    def start_run(self) -> None:
        self.window.append("start")

    def end_run(self) -> None:
        self.window.append("end")


def answer(side: str, prompt: Prompt, turn: int) -> list[str]:
    """Token ids the script answers: 4 tokens, the spec-on side diverging where the prompt says
    (prompt ids "tie" at token 2, "bug" at token 1; the conversation "chat" at turn 1, token 0)."""
    tokens = [f"token_id:{10 * turn + i}" for i in range(4)]
    at = {"tie": (0, 2), "bug": (0, 1), "chat": (1, 0)}.get(prompt.id)
    if side == "on" and at is not None and at[0] == turn:
        tokens[at[1]] = "token_id:99"
    return tokens


class Wire:
    """The fake ``stream_request``: logs each request (side, prompt, turn, repeat, warm-up, settings),
    counts it on its server, answers per ``answer``. ``clock``: advanced ``step_ns`` per request."""

    def __init__(self, servers: list[Side], clock=None, step_ns: int = 0, cap: int = 500):
        self.servers = servers
        self.log: list[tuple] = []
        self.clock, self.step_ns, self.cap = clock, step_ns, cap

    async def stream_request(self, client, prompt, model, settings, t0, repeat=0, warmup=False):
        (server,) = {id(s): s for s in self.servers if str(client.base_url).startswith(s.base_url)}.values()
        side = "on" if server.name == "on" else "off"
        assert model == server.model_id
        assert len(self.log) < self.cap, "the run does not stop"
        now = self.clock() if self.clock else t0
        if self.clock:
            self.clock.advance(self.step_ns)
        turn = (len(prompt.messages) - 1) // 2 if prompt.messages else 0
        self.log.append((side, prompt.id, turn, repeat, warmup, settings, prompt))
        server.served += 1
        await asyncio.sleep(0)
        tokens = answer(side, prompt, turn)
        chunk_ns = [20 * MS + i * 10 * MS for i in range(len(tokens))]
        return RequestRecord(prompt_id=prompt.id, category=prompt.category, api=prompt.api, repeat=repeat,
                             warmup=warmup, ok=True, sent_at_ns=now - t0, chunk_ns=chunk_ns,
                             chunk_tokens=[1] * len(tokens), output_tokens=len(tokens), e2e_ns=chunk_ns[-1] + MS,
                             tokens=tokens, text="".join(f"<{t[9:]}>" for t in tokens))


class Clock:
    def __init__(self):
        self.now = 1_000 * MS

    def __call__(self) -> int:
        return self.now

    def advance(self, ns: int) -> None:
        self.now += ns


def on_one_clock(wired, monkeypatch, off: Side, on: Side, step_ns: int) -> Clock:
    """Wire ``off`` and ``on`` on one fake clock, every request taking ``step_ns`` of it to start; the
    runner, the sending and the load engine read that clock."""
    clock = Clock()
    wired(off, on, clock=clock, step_ns=step_ns)
    monkeypatch.setattr(compare, "time", types.SimpleNamespace(perf_counter_ns=clock))
    monkeypatch.setattr(spread, "time", types.SimpleNamespace(perf_counter_ns=clock))
    monkeypatch.setattr(spread, "LoadEngine", lambda send, **kw: LoadEngine(send, clock=clock, **kw))
    return clock


PROMPTS_edge = [Prompt(id="p0", prompt="zero"), Prompt(id="p1", prompt="one")]


@pytest.fixture
def wired(monkeypatch):
    """Install a Wire for the given servers; counters read once (no settling wait)."""
    def install(*servers: Side, **kw) -> Wire:
        wire = Wire(list(servers), **kw)
        monkeypatch.setattr(spread, "stream_request", wire.stream_request)
        monkeypatch.setattr(compare, "settle_counters", lambda server: server.read_counters())
        return wire
    return install


# ------------------------------------------------------------------------------ request settings

def test_each_side_gets_its_servers_identity_extras_and_the_drill_temperature_goes_to_spec_on_only():
    base = RequestSettings(temperature=0.0, max_tokens=9, extra_body={"seed_extra": 7, "ids": "base"})
    off = side_settings(Side("off", {"ids": "off"}), base)
    on = side_settings(Side("on", {"ids": "on", "more": 1}), base, 0.6)
    assert (off.extra_body, off.temperature, off.max_tokens) == ({"seed_extra": 7, "ids": "off"}, 0.0, 9)
    assert (on.extra_body, on.temperature, on.max_tokens) == ({"seed_extra": 7, "ids": "on", "more": 1}, 0.6, 9)
    assert base.extra_body == {"seed_extra": 7, "ids": "base"} and base.temperature == 0.0  # the base is untouched
    plain = side_settings(Side("off"), base)
    assert plain == base and plain is not base


def test_the_runner_sends_each_side_its_own_settings(wired):
    off, on = Side("off", {"ids": "off"}), Side("on", {"ids": "on"})
    wire = wired(off, on)
    settings = CompareSettings(concurrency=[1, 2], repeat=2, warmup=1, on_temperature=0.5,
                               request=RequestSettings(temperature=0.1, extra_body={"k": 1}))
    asyncio.run(ABRunner(off, on, PROMPTS_edge, settings).run())
    sent = {side: {(s.temperature, tuple(sorted(s.extra_body.items()))) for sd, *_, s, _ in wire.log if sd == side}
            for side in ("off", "on")}
    assert sent == {"off": {(0.1, (("ids", "off"), ("k", 1)))}, "on": {(0.5, (("ids", "on"), ("k", 1)))}}
    assert len(wire.log) == 2 * (1 + 2 * 2 + 2 * 4)


# ------------------------------------------------------------------------------ warm-up, progress, counters

def test_progress_sees_every_request_and_the_warm_up_goes_first_to_both_sides(wired):
    off, on = Side("off"), Side("on", spec=True)
    wired(off, on)
    seen: list[RequestRecord] = []
    settings = CompareSettings(concurrency=[1], repeat=1, warmup=3)
    records, _, _ = asyncio.run(ABRunner(off, on, PROMPTS_edge, settings, seen.append).run())
    warm = [(r.side, r.prompt_id, r.concurrency, r.repeat, r.replica) for r in seen if r.warmup]
    # warm-up request i: prompt i (cycled), off then on, at concurrency 1, repeat 0, copy 0
    assert warm == [("off", "p0", 1, 0, 0), ("on", "p0", 1, 0, 0), ("off", "p1", 1, 0, 0), ("on", "p1", 1, 0, 0),
                    ("off", "p0", 1, 0, 0), ("on", "p0", 1, 0, 0)]
    assert seen[:6] == [r for r in seen if r.warmup]  # before any measured request
    assert seen[6:] == records and not any(r.warmup for r in records)  # the warm-up is not kept


def test_counters_are_read_around_each_level_on_both_sides(wired):
    """Each server's counters before and after each level: what it served in between."""
    off, on = Side("off"), Side("on", spec=True)
    wired(off, on)
    settings = CompareSettings(concurrency=[1, 2], repeat=1, warmup=1,
                               load=LoadSettings(request_rates=[float("inf")]))
    runner = ABRunner(off, on, PROMPTS_edge, settings)
    _, on_c, off_c = asyncio.run(runner.run())
    # served per side: 1 warm-up; level 1: 2 prompts; level 2: 2 copies x 2 prompts; rate inf: the set once
    assert {lv: (p.before.drafts, p.after.drafts) for lv, p in on_c.items()} == {1: (2, 6), 2: (6, 14)}
    assert {lv: (p.before.generation_tokens, p.after.generation_tokens) for lv, p in off_c.items()} == {
        1: (4, 12), 2: (12, 28)}
    assert {k: (p.before.drafts, p.after.drafts) for k, p in runner.rate_counters["on"].items()} == {"inf": (14, 18)}
    assert {k: (p.before.generation_tokens, p.after.generation_tokens)
            for k, p in runner.rate_counters["off"].items()} == {"inf": (28, 36)}


# ------------------------------------------------------------------------------ --duration at concurrency N

def test_a_duration_block_keeps_n_streams_busy_cycling_the_prompts_until_time_is_up(wired, monkeypatch):
    """--duration 0.055 at concurrency 2, every request taking 10 ms of the (fake) clock to start:
    requests start at 0, 10, ..., 50 ms of each block, so 6 per block (not the 2 copies of the
    prompt set a block without --duration holds), the prompts cycled, each pass a new copy; repeat 1
    starts the set at its second prompt (other partners and positions in the batches)."""
    off, on = Side("off"), Side("on")
    on_one_clock(wired, monkeypatch, off, on, 10 * MS)
    settings = CompareSettings(concurrency=[2], repeat=2, warmup=0, load=LoadSettings(duration_s=0.055))
    records, _, _ = asyncio.run(ABRunner(off, on, PROMPTS_edge, settings).run())
    blocks: list[tuple[str, int]] = []
    for r in records:
        if not blocks or blocks[-1] != (r.side, r.repeat):
            blocks.append((r.side, r.repeat))
    assert blocks == [("off", 0), ("on", 0), ("on", 1), ("off", 1)]
    for side, rep in blocks:
        block = [(r.prompt_id, r.replica, r.concurrency) for r in records if (r.side, r.repeat) == (side, rep)]
        first, second = ("p0", "p1") if rep == 0 else ("p1", "p0")
        assert block == [(first, 0, 2), (second, 0, 2), (first, 1, 2), (second, 1, 2), (first, 2, 2), (second, 2, 2)]
    assert len(records) == 24


# ------------------------------------------------------------------------------ run_compare / finish_compare

CHAT = Prompt(id="chat", category="talk", messages=[ChatMessage(role="user", content="hi")], turns=["more"])
MIXED = [Prompt(id="same", prompt="s"), Prompt(id="tie", prompt="t"), Prompt(id="bug", prompt="b"), CHAT]


class Triager:
    """compare's server_triage, recorded: near-tie for "tie", suspect for "bug", unknown otherwise."""

    def __init__(self):
        self.calls: list[tuple] = []

    def __call__(self, server, prompt, settings, div, off_tokens, threshold):
        self.calls.append((server, prompt, settings, div, off_tokens, threshold))
        verdict = {"tie": "near-tie", "bug": "suspect"}.get(prompt.id, "unknown")
        return Triage(verdict=verdict, source="server-logprobs" if verdict != "unknown" else "none",
                      threshold=threshold, margin=0.5)


@pytest.fixture
def triager(monkeypatch):
    t = Triager()
    monkeypatch.setattr(compare, "server_triage", t)
    return t


@pytest.fixture
def detokenizer(monkeypatch):
    """The spec-off server's POST /detokenize (only it answers): token id N reads "w<N>"."""
    asked: list[tuple[str, list[int]]] = []

    def handler(request):
        name = request.url.host.removesuffix(".invalid")
        if name != "off" or request.url.path != "/detokenize":
            raise httpx.ConnectError("no such server")
        tokens = orjson.loads(request.content)["tokens"]
        asked.append((name, tokens))
        return httpx.Response(200, json={"prompt": f"w{tokens[0]}"})

    monkeypatch.setattr(Side, "transport", httpx.MockTransport(handler), raising=False)  # the wire's seam
    return asked


def by_id(report: CompareReport) -> dict:
    return {p.prompt_id: p for p in report.identity}


def test_run_compare_runs_both_sides_and_triages_each_divergence_with_the_spec_off_server(wired, triager, detokenizer):
    off, on = Side("off", {"ids": "off"}, spec=False), Side("on", {"ids": "on"}, spec=True, k=2)
    wire = wired(off, on)
    ticks: list[RequestRecord] = []
    settings = CompareSettings(concurrency=[2, 1, 2], repeat=2, warmup=1, dtype="float32", draft_cost=0.05,
                               load=LoadSettings(request_rates=[float("inf")]))
    report = run_compare(off, on, MIXED, settings, ticks.append)
    assert report.settings.concurrency == [1, 2] and [lv.concurrency for lv in report.levels] == [1, 2]
    assert (report.off_server, report.on_server) == (off.describe(), on.describe())
    assert off.window == on.window == ["start", "end"]  # both servers' counting windows around the run
    # per side and repeat: level 1, then 1 copy at level 2 (4 prompts >= 2 x 2), then the set at rate inf;
    # the conversation has 2 turns: 5 requests per pass over the prompts
    assert len(report.requests) == 2 * 2 * 5 * 3 and len(ticks) == len(report.requests) + 2
    assert {(r.side, r.concurrency, r.request_rate) for r in report.requests} == {
        (s, lv, rate) for s in ("off", "on") for lv, rate in ((1, None), (2, None), (0, float("inf")))}
    # counters: the spec-on server's acceptance per level and per rate, the spec-off server's too
    assert {lv: p.after.drafts - p.before.drafts for lv, p in report.counters_on.items()} == {1: 20, 2: 20}
    assert {lv: p.after.generation_tokens - p.before.generation_tokens for lv, p in report.counters_off.items()} == {
        1: 40, 2: 40}
    assert {k: p.after.drafts - p.before.drafts for k, p in report.counters_on_rate.items()} == {"inf": 20}
    assert {k: p.after.generation_tokens - p.before.generation_tokens
            for k, p in report.counters_off_rate.items()} == {"inf": 40}
    assert report.levels[0].acceptance.mean_acceptance_length == pytest.approx(1 + 3 / 2)
    assert report.rate_levels[0].acceptance.mean_acceptance_length == pytest.approx(1 + 3 / 2)
    # identity: one triage per divergence origin, asked of the spec-off server with its settings
    ident = by_id(report)
    assert {p: i.verdict for p, i in ident.items()} == {"same": "identical", "tie": "near-tie", "bug": "suspect",
                                                       "chat": "unknown"}
    assert report.counts == {"identical": 1, "near-tie": 1, "suspect": 1, "unknown": 1}
    assert report.settings.near_tie_threshold == 0.01  # float32's default
    calls = {prompt.id: (server, settings_, div.token_index, div.turn, tokens, thr)
             for server, prompt, settings_, div, tokens, thr in triager.calls}
    assert len(triager.calls) == 3 and set(calls) == {"tie", "bug", "chat"}
    off_request = side_settings(off, settings.request)
    assert calls["tie"] == (off, off_request, 2, 0, answer("off", MIXED[1], 0), 0.01)
    assert calls["bug"] == (off, off_request, 1, 0, answer("off", MIXED[2], 0), 0.01)
    assert calls["chat"] == (off, off_request, 0, 1, answer("off", CHAT, 1), 0.01)
    # the later turn is triaged as it was sent: with the spec-off side's own earlier answer
    (chat_prompt,) = [prompt for _, prompt, *_ in triager.calls if prompt.id == "chat"]
    assert [(m.role, m.content) for m in chat_prompt.messages] == [
        ("user", "hi"), ("assistant", "<0><1><2><3>"), ("user", "more")]
    assert next(p for _, p, *_ in triager.calls if p.id == "tie") is MIXED[1]
    # the divergences' tokens made readable by the spec-off server
    assert (ident["tie"].divergence.off_token, ident["tie"].divergence.on_token) == ("w2 (id 2)", "w99 (id 99)")
    assert (ident["chat"].divergence.off_token, ident["chat"].divergence.on_token) == ("w10 (id 10)", "w99 (id 99)")
    assert sorted(detokenizer) == sorted([("off", [n]) for n in (2, 99, 1, 99, 10, 99)])
    # the diagnosis used --draft-cost, and no note: the sides differ in speculation only
    assert {f.draft_cost_source for f in report.diagnosis.levels} == {"--draft-cost"}
    assert report.notes == []
    assert all(s.extra_body["ids"] == "off" for sd, *_, s, _ in wire.log if sd == "off")


def test_finish_compare_uses_a_given_threshold_keeps_earlier_notes_and_skips_triage_when_asked(
        wired, triager, detokenizer):
    off, on = Side("off", spec=False), Side("on", spec=True, k=2)
    wired(off, on)
    settings = CompareSettings(concurrency=[1], repeat=1, warmup=0, near_tie_threshold=0.3, dtype="float32")
    runner = ABRunner(off, on, MIXED, settings)
    records, on_c, off_c = asyncio.run(runner.run())
    report = CompareReport(settings=settings, off_server=off.describe(), on_server=on.describe(), requests=records,
                           counters_on=on_c, counters_off=off_c, notes=["an earlier note"])
    out = finish_compare(report, off, MIXED, runner.req_off)
    assert out is report and report.settings.near_tie_threshold == 0.3
    assert {thr for *_, thr in triager.calls} == {0.3} and len(triager.calls) == 3
    assert report.notes == ["an earlier note"] and report.levels[0].pairs == 5
    assert report.diagnosis is not None and report.diagnosis.levels[0].draft_cost_source is None
    # --no-triage: no logprobs asked, every divergence unknown
    triager.calls.clear()
    settings.triage = False
    again = CompareReport(settings=settings, off_server=off.describe(), on_server=on.describe(), requests=records)
    finish_compare(again, off, MIXED, runner.req_off)
    assert triager.calls == []
    assert again.counts == {"identical": 1, "near-tie": 0, "suspect": 0, "unknown": 3}
    assert all(i.divergence.triage is None for i in again.identity if i.divergence)


def test_the_reference_scorer_triages_after_the_server(wired, triager, detokenizer, monkeypatch):
    made: list[str] = []
    scored: list[tuple] = []

    class Scorer:
        def __init__(self, model_dir):
            made.append(model_dir)

        def triage(self, server, prompt, div, off_rec, threshold, server_triage):
            scored.append((server, prompt.id, div.token_index, off_rec.side, off_rec.prompt_id, threshold,
                           server_triage.verdict if server_triage else None))
            return Triage(verdict="suspect", source="reference-float64", threshold=threshold, margin=2.0)

    monkeypatch.setattr(compare, "ReferenceScorer", Scorer)
    off, on = Side("off", spec=False), Side("on", spec=True)
    wired(off, on)
    settings = CompareSettings(concurrency=[1], repeat=1, warmup=0, reference="/models/ref", dtype="bfloat16")
    report = run_compare(off, on, MIXED, settings)
    assert made == ["/models/ref"]
    assert sorted(scored, key=lambda s: s[1]) == [(off, "bug", 1, "off", "bug", 0.75, "suspect"),
                                                  (off, "chat", 0, "off", "chat", 0.75, "unknown"),
                                                  (off, "tie", 2, "off", "tie", 0.75, "near-tie")]
    assert report.counts == {"identical": 1, "near-tie": 0, "suspect": 3, "unknown": 0}
    assert {i.divergence.triage.source for i in report.identity if i.divergence} == {"reference-float64"}


def test_run_one_side_runs_only_its_server_and_returns_its_counters(wired):
    for name in ("on", "off"):
        server = Side(name, {"ids": name}, spec=True)
        wire = wired(server)
        settings = CompareSettings(concurrency=[2, 1], repeat=1, warmup=1, on_temperature=0.9)
        seen: list[RequestRecord] = []
        info, records, counters = run_one_side(server, name, PROMPTS_edge, settings, seen.append)
        assert info == server.describe() and server.window == ["start", "end"]
        assert settings.concurrency == [1, 2]
        assert {r.side for r in records} == {name} and len(records) == 2 + 4 and len(seen) == 7
        assert {lv: (p.before.drafts, p.after.drafts) for lv, p in counters.items()} == {1: (2, 6), 2: (6, 14)}
        temps = {s.temperature for *_, s, _ in wire.log}
        assert temps == ({0.9} if name == "on" else {0.0})
        assert {s.extra_body["ids"] for *_, s, _ in wire.log} == {name}

"""Run until decided (orchestration/compare.py with ``settings.sequential``) without HTTP: a fake
``stream_request`` answers each request with an exact TPOT scripted per side, prompt and repeat, on
fake servers, so every unit's log ratio is known beforehand.

Where the runner must stop is computed here by another method than the code's: the confidence
sequence as the set of means m whose normal-mixture Bayes factor stays below 1/alpha, its ends
found by root finding (scipy's brentq) on the factor itself, not by the closed form
analysis/sequential.py uses. What is pinned: a clearly faster spec-on side stops after few units
with "faster", identical sides run to the cap ("no clear difference", or "equivalent" with a
margin), the floor holds, the unit above concurrency 1 is one repeat's off block + on block, the
run stops on identity at the stated count of diverged prompts, and the request counts (sent, the
fixed design's, the progress bars' most).
"""

from __future__ import annotations

import asyncio
import math

import numpy as np
import pytest
from scipy.optimize import brentq

from specadapt.adapters.base import ServerBase
from specadapt.errors import UsageError
from specadapt.load import spread
from specadapt.orchestration import compare
from specadapt.orchestration.compare import (
    ABRunner,
    ONE_AFTER_THE_OTHER,
    fixed_requests,
    run_compare,
    run_one_side,
    total_requests,
)
from specadapt.records import (
    ChatMessage,
    CompareSettings,
    CounterSnapshot,
    Prompt,
    RequestRecord,
    SequentialDesign,
    ServerInfo,
)
from specadapt.records.load import LoadSettings
from specadapt.records.sequential import FIRST_LOOK, PHI

MS = 1_000_000
TOKENS = 8
ALPHA = 0.05
# The least n with an interval at alpha 0.05 and the design's phi (0.1): r = 0.1/(0.1 + n) and the
# factor's supremum r^(-(n-1)/2) must pass 1/alpha = 20: n = 2 gives 21^0.5 = 4.6, n = 3 gives 31 > 20.
# The rule looks first at FIRST_LOOK units, so its first possible stop is the later of the two.
assert PHI == 0.1
LEAST = max(3, FIRST_LOOK)
# Per-unit noise of the spec-on side's log TPOT (a fixed, mean-free pattern), cycled over the units.
NOISE = [0.06, -0.04, 0.09, -0.07, 0.02, -0.05, 0.08, -0.09, 0.0, 0.04, -0.03, -0.01]


class Side(ServerBase):
    """One fake server with counters that follow the requests it served."""

    def __init__(self, name: str):
        self.backend, self.name, self.served = "fake", name, 0

    @property
    def base_url(self) -> str:
        return f"http://{self.name}.invalid"

    @property
    def model_id(self) -> str:
        return "m"

    def headers(self):
        return {}

    def describe(self):
        return ServerInfo(backend="fake", base_url=self.base_url, model_id=self.model_id, spec_enabled=True)

    def read_counters(self):
        n = self.served
        return CounterSnapshot(drafts=2 * n, draft_tokens=4 * n, accepted_tokens=3 * n,
                               accepted_per_position={0: 2 * n, 1: n}, generation_tokens=4 * n)

    def start_run(self) -> None:
        pass

    def end_run(self) -> None:
        pass


class Wire:
    """The fake ``stream_request``: ``tpot_ms(side, prompt_id, repeat)`` gives each answer's exact TPOT
    (e2e - first chunk over tokens - 1); the spec-on answers of the prompts in ``diverge`` differ in
    their last token. Logs (side, prompt id, turn, repeat, warm-up) per request."""

    def __init__(self, servers, tpot_ms, diverge=(), cap: int = 2000):
        self.servers, self.tpot_ms, self.diverge, self.cap = servers, tpot_ms, set(diverge), cap
        self.log: list[tuple] = []

    async def stream_request(self, client, prompt, model, settings, t0, repeat=0, warmup=False):
        (server,) = [s for s in self.servers if str(client.base_url).startswith(s.base_url)]
        side = server.name
        assert len(self.log) < self.cap, "the run does not stop"
        turn = (len(prompt.messages) - 1) // 2 if prompt.messages else 0
        self.log.append((side, prompt.id, turn, repeat, warmup))
        server.served += 1
        await asyncio.sleep(0)
        step = self.tpot_ms(side, prompt.id, repeat) * MS
        chunk_ns = [round(20 * MS + i * step) for i in range(TOKENS)]
        tokens = [f"a{i}" for i in range(TOKENS)]
        if side == "on" and prompt.id in self.diverge:
            tokens[-1] = "b"
        return RequestRecord(prompt_id=prompt.id, category="c", api=prompt.api, repeat=repeat, warmup=warmup,
                             ok=True, sent_at_ns=len(self.log) * 100 * MS, chunk_ns=chunk_ns,
                             chunk_tokens=[1] * TOKENS, output_tokens=TOKENS, e2e_ns=chunk_ns[-1], tokens=tokens,
                             text="".join(tokens))


PROMPTS = [Prompt(id=f"p{i}", prompt=f"prompt {i}") for i in range(3)]
INDEX = {p.id: i for i, p in enumerate(PROMPTS)}


def pair_tpot(speedup: float, scale: float = 1.0):
    """TPOT per request: spec off 10 ms * speedup, spec on 10 ms * exp(scale * noise of the unit) (the unit
    at concurrency 1: the pair's place in the cycle over the prompts, repeat by repeat)."""
    def tpot(side, pid, repeat):
        if side == "off":
            return 10.0 * speedup
        return 10.0 * math.exp(scale * NOISE[(repeat * len(PROMPTS) + INDEX.get(pid, 0)) % len(NOISE)])
    return tpot


def block_tpot(speedup: float, scale: float = 1.0):
    """As pair_tpot, the noise by repeat only: one figure per block."""
    def tpot(side, pid, repeat):
        return 10.0 * speedup if side == "off" else 10.0 * math.exp(scale * NOISE[repeat % len(NOISE)])
    return tpot


@pytest.fixture
def wired(monkeypatch):
    def install(tpot_ms, diverge=()) -> tuple[Side, Side, Wire]:
        off, on = Side("off"), Side("on")
        wire = Wire([off, on], tpot_ms, diverge)
        monkeypatch.setattr(spread, "stream_request", wire.stream_request)
        monkeypatch.setattr(compare, "settle_counters", lambda server: server.read_counters())
        return off, on, wire
    return install


def settings_of(concurrency=(1,), repeat=3, warmup=0, load=None, **design) -> CompareSettings:
    return CompareSettings(concurrency=list(concurrency), repeat=repeat, warmup=warmup, triage=False, load=load,
                           sequential=SequentialDesign(alpha=ALPHA, **design))


# ------------------------------------------------------------------ the reference: root finding on the factor

def reference_cs(logs: list[float], alpha: float = ALPHA, phi: float = PHI) -> tuple[float, float] | None:
    """The confidence sequence of the mean log ratio at n = len(logs): the means m with
    sqrt(r) ((1 + t^2/nu) / (1 + r t^2/nu))^((nu + 1)/2) < 1/alpha, t = (mean - m) / se, its ends by
    root finding in t; None while the factor cannot reach 1/alpha (no interval yet)."""
    x = np.asarray(logs, dtype=float)
    n = x.size
    if n < 2:
        return None
    nu, r = n - 1, phi / (phi + n)

    def excess(t: float) -> float:
        return (0.5 * math.log(r) + (nu + 1) / 2 * (math.log1p(t * t / nu) - math.log1p(r * t * t / nu))
                - math.log(1 / alpha))

    if excess(1e8) <= 0:
        return None
    t_star = brentq(excess, 0.0, 1e8, xtol=1e-12)
    se = x.std(ddof=1) / math.sqrt(n)
    return x.mean() - t_star * se, x.mean() + t_star * se


def reference_verdict(logs: list[float], margin: float | None = None) -> str | None:
    cs = reference_cs(logs)
    if cs is None:
        return None
    low, high = math.exp(cs[0]), math.exp(cs[1])
    if low > 1:
        return "faster"
    if high < 1:
        return "slower"
    if margin is not None and 1 / (1 + margin) < low and high < 1 + margin:
        return "equivalent"
    return None


def reference_stop(unit_logs: list[float], cap: int, margin: float | None = None, floor: int = 0
                   ) -> tuple[int, str]:
    """(units, verdict) where the rule stops over these units' log ratios."""
    for n in range(1, cap + 1):
        v = reference_verdict(unit_logs[:n], margin)
        if v is not None and n >= max(floor, FIRST_LOOK):
            return n, v
    return cap, "no clear difference"


def pair_logs(speedup: float, scale: float, n: int) -> list[float]:
    """The units' TPOT log ratios at concurrency 1 in the order they are sent (pair_tpot)."""
    return [math.log(speedup) - scale * NOISE[u % len(NOISE)] for u in range(n)]


# ------------------------------------------------------------------ concurrency 1: one pair per unit

def test_a_clearly_faster_spec_on_side_stops_after_few_pairs_with_faster(wired):
    _, _, wire = wired(pair_tpot(1.5))
    report = run_compare(*wire.servers, PROMPTS, settings_of(max_units=40))
    units, verdict = reference_stop(pair_logs(1.5, 1.0, 40), cap=40)
    assert (units, verdict) == (LEAST, "faster")  # the first look the rule can make already decides
    seq = report.levels[0].sequential
    assert (seq.verdict, seq.stopped, seq.units, seq.requests) == ("faster", "decided", LEAST, 2 * LEAST)
    assert seq.fixed_requests == 2 * 3 * len(PROMPTS)  # --repeat 3 over 3 prompts, both sides
    low, high = reference_cs(pair_logs(1.5, 1.0, LEAST))
    assert (seq.interval.low, seq.interval.high) == (pytest.approx(math.exp(low)), pytest.approx(math.exp(high)))
    assert seq.interval.low > 1 and seq.interval.method == "cs"
    # the pairs in today's order: prompt by prompt, cycling through the set, who goes first alternating
    sent = [(side, pid, r) for side, pid, _, r, warm in wire.log if not warm]
    expected = []
    for u in range(LEAST):
        r, i = divmod(u, len(PROMPTS))
        order = ("off", "on") if (r + i) % 2 == 0 else ("on", "off")
        expected += [(side, PROMPTS[i].id, r) for side in order]
    assert sent == expected
    assert seq.text.startswith(f"faster after {LEAST} pairs: TPOT 1.")
    assert LEAST == 6 and seq.text.endswith("; 12 requests against 18 for the fixed design (33% fewer)")


def test_a_small_speedup_takes_more_looks_and_stops_where_the_interval_first_clears_1(wired):
    units, verdict = reference_stop(pair_logs(1.08, 1.0, 40), cap=40)
    assert verdict == "faster" and LEAST < units < 40
    _, _, wire = wired(pair_tpot(1.08))
    report = run_compare(*wire.servers, PROMPTS, settings_of(max_units=40))
    seq = report.levels[0].sequential
    assert (seq.verdict, seq.stopped, seq.units, seq.requests) == ("faster", "decided", units, 2 * units)
    low, high = reference_cs(pair_logs(1.08, 1.0, units))
    assert (seq.interval.low, seq.interval.high) == (pytest.approx(math.exp(low)), pytest.approx(math.exp(high)))
    assert reference_cs(pair_logs(1.08, 1.0, units - 1))[0] <= 0  # one unit earlier it did not clear 1


def test_identical_sides_run_to_the_cap_with_no_clear_difference(wired):
    _, _, wire = wired(pair_tpot(1.0))
    cap = 12
    assert all(reference_verdict(pair_logs(1.0, 1.0, n)) is None for n in range(1, cap + 1))  # nothing to find
    report = run_compare(*wire.servers, PROMPTS, settings_of(max_units=cap))
    seq = report.levels[0].sequential
    assert (seq.verdict, seq.stopped, seq.units, seq.requests) == ("no clear difference", "cap", cap, 2 * cap)
    assert len([e for e in wire.log if not e[4]]) == 2 * cap
    assert seq.interval.low < 1 < seq.interval.high
    assert seq.text.startswith(f"no clear difference at the cap of {cap} pairs")


def test_identical_sides_within_the_margin_stop_as_equivalent(wired):
    scale = 0.6  # noise of sd about 0.035 in log: the interval lies within +-5% after some looks
    units, verdict = reference_stop(pair_logs(1.0, scale, 40), cap=40, margin=0.05)
    assert verdict == "equivalent" and LEAST < units < 40
    _, _, wire = wired(pair_tpot(1.0, scale))
    report = run_compare(*wire.servers, PROMPTS, settings_of(max_units=40, margin=0.05))
    seq = report.levels[0].sequential
    assert (seq.verdict, seq.stopped, seq.units) == ("equivalent", "decided", units)
    assert 1 / 1.05 < seq.interval.low and seq.interval.high < 1.05
    assert seq.text.startswith(f"equivalent within +-5% after {units} pairs")


def test_the_floor_holds_the_rule_at_concurrency_1_until_each_prompt_is_answered(wired):
    _, _, wire = wired(pair_tpot(1.5))
    floor = 8  # decided at 5 pairs, but the floor asks for 8
    report = run_compare(*wire.servers, PROMPTS, settings_of(max_units=40, min_units=floor))
    seq = report.levels[0].sequential
    assert (seq.verdict, seq.stopped, seq.units) == ("faster", "decided", floor)
    assert len([e for e in wire.log if not e[4]]) == 2 * floor


def test_a_failing_rule_reads_the_same_after_the_run(wired):
    """The analysis reaches the runner's verdict from the same records (one log-ratio code for both)."""
    _, _, wire = wired(pair_tpot(1 / 1.5))
    report = run_compare(*wire.servers, PROMPTS, settings_of(max_units=40))
    seq = report.levels[0].sequential
    assert (seq.verdict, seq.units) == reference_stop(pair_logs(1 / 1.5, 1.0, 40), cap=40)[::-1] == ("slower", LEAST)
    assert report.levels[0].speed.tpot.high < 1 and report.levels[0].speed.tpot.method == "cs"


# ------------------------------------------------------------------ above 1 and at rates: one repeat's blocks

def test_above_concurrency_1_the_unit_is_one_repeats_off_block_and_on_block(wired):
    _, _, wire = wired(block_tpot(1.5))
    report = run_compare(*wire.servers, PROMPTS, settings_of(concurrency=[2], max_units=40, min_units=20))
    block_logs = [math.log(1.5) - NOISE[r % len(NOISE)] for r in range(40)]
    assert reference_stop(block_logs, cap=40) == (LEAST, "faster")
    seq = report.levels[0].sequential
    # the floor (pairs at concurrency 1) does not hold blocks: each sends the whole prompt set
    assert (seq.verdict, seq.stopped, seq.units) == ("faster", "decided", LEAST)
    per_block = 2 * len(PROMPTS)  # copies_for(2, 3) = 2 copies of 3 prompts: at least 2N = 4 requests
    assert seq.requests == 2 * LEAST * per_block and seq.fixed_requests == 2 * 3 * per_block
    blocks = []
    for side, _, _, r, _ in wire.log:
        if not blocks or blocks[-1] != (side, r):
            blocks.append((side, r))
    assert blocks == [(s, r) for r in range(LEAST) for s in (("off", "on") if r % 2 == 0 else ("on", "off"))]


def test_at_an_arrival_rate_the_rule_decides_after_each_repeats_blocks(wired):
    _, _, wire = wired(block_tpot(1.0))
    cap = 7
    load = LoadSettings(request_rates=[float("inf")])
    report = run_compare(*wire.servers, PROMPTS, settings_of(concurrency=[1], max_units=cap, load=load))
    seq = report.rate_levels[0].sequential
    assert all(reference_verdict([-NOISE[r % len(NOISE)] for r in range(n)]) is None for n in range(1, cap + 1))
    assert (seq.verdict, seq.stopped, seq.units, seq.requests) == ("no clear difference", "cap", cap,
                                                                   2 * cap * len(PROMPTS))
    assert seq.fixed_requests == 2 * 3 * len(PROMPTS)
    assert {r for _, _, _, r, _ in wire.log if r is not None} >= set(range(cap))


def test_at_an_arrival_rate_a_clear_speedup_stops_at_the_first_look(wired):
    _, _, wire = wired(block_tpot(1.5))
    load = LoadSettings(request_rates=[float("inf")])
    report = run_compare(*wire.servers, PROMPTS, settings_of(concurrency=[1], max_units=40, load=load))
    assert reference_stop([math.log(1.5) - NOISE[r % len(NOISE)] for r in range(40)], cap=40) == (LEAST, "faster")
    seq = report.rate_levels[0].sequential
    assert (seq.verdict, seq.stopped, seq.units, seq.interval.unit) == ("faster", "decided", LEAST, "blocks")
    assert report.levels[0].sequential.units == LEAST  # concurrency 1 before it: its own rule, its own stop


# ------------------------------------------------------------------ identity: stop to fail

def test_the_run_stops_on_identity_at_the_stated_count_of_diverged_prompts(wired):
    prompts = [Prompt(id=f"q{i}", prompt=f"q {i}") for i in range(6)]
    _, _, wire = wired(lambda side, pid, r: 10.0, diverge={"q1", "q3", "q4"})
    settings = settings_of(concurrency=[1, 2], max_units=40, fail_divergences=2)
    report = run_compare(*wire.servers, prompts, settings)
    # q1 is the first divergence, q3 the second: the run stops after the pair of q3 (the 4th)
    sent = [(side, pid) for side, pid, *_ in wire.log]
    assert [pid for _, pid in sent[::2]] == ["q0", "q1", "q2", "q3"] and len(sent) == 8
    first, second = report.levels
    assert (first.sequential.stopped, first.sequential.units, first.sequential.verdict) == (
        "identity", 4, "no clear difference")
    assert (second.concurrency, second.pairs, second.sequential.units, second.sequential.stopped) == (
        2, 0, 0, "identity")
    assert second.sequential.text == "not run: the run stopped on identity before this level"
    (note,) = [n for n in report.notes if "stopped early to fail" in n]
    assert "2 prompt(s) diverged (q1, q3)" in note and "allow together (1)" in note
    assert report.counts["identical"] == 2 and sum(report.counts.values()) == 4


def test_fewer_divergences_than_the_count_do_not_stop_the_run(wired):
    _, _, wire = wired(pair_tpot(1.5), diverge={"p1"})
    report = run_compare(*wire.servers, PROMPTS, settings_of(max_units=40, fail_divergences=2))
    seq = report.levels[0].sequential
    assert (seq.stopped, seq.units) == ("decided", LEAST)
    assert not [n for n in report.notes if "stopped early to fail" in n]


def test_without_a_count_divergences_never_stop_the_run(wired):
    _, _, wire = wired(pair_tpot(1.5), diverge={"p0", "p1", "p2"})
    report = run_compare(*wire.servers, PROMPTS, settings_of(max_units=40))
    assert report.levels[0].sequential.stopped == "decided"


# ------------------------------------------------------------------ the requests: fixed design, progress

CHAT = Prompt(id="chat", messages=[ChatMessage(role="user", content="hi")], turns=["more"])


def test_the_fixed_design_s_requests_per_level_by_hand():
    prompts = [PROMPTS[0], CHAT]  # 3 requests per side per pass over the set
    load = LoadSettings(request_rates=[float("inf"), 2.0], duration_s=3.0)
    s = CompareSettings(concurrency=[1, 4], repeat=3, load=load)
    # concurrency 1: 2 sides x 3 repeats x 3 requests; concurrency 4 with --duration: the time sets a
    # block (None); rate inf: the set once per repeat; rate 2 for 3 s: 6 arrivals, the 2 prompts cycled,
    # each its turns: 6 x 3 / 2 = 9 requests per side and repeat
    assert fixed_requests(s, prompts) == {(1, None): 18, (4, None): None, (0, float("inf")): 18, (0, 2.0): 54}
    s2 = CompareSettings(concurrency=[4], repeat=2)  # copies_for(4, 2) = 4 copies: 2 x 2 x 3 x 4
    assert fixed_requests(s2, prompts) == {(4, None): 48}


def test_progress_counts_every_level_at_its_cap():
    prompts = [PROMPTS[0], CHAT]
    s = CompareSettings(concurrency=[1, 2], repeat=3, warmup=1, sequential=SequentialDesign(max_units=8))
    # warm-up 2; concurrency 1: units 1, 3, 4, 6, 7, 9 cycling turns 1 and 2: 9 pairs, 18 requests;
    # concurrency 2: 8 repeats x 2 sides x 3 requests x copies_for(2, 2) = 2
    assert total_requests(2, s, prompts) == 2 + 18 + 96
    assert total_requests(2, s.model_copy(update={"sequential": None}), prompts) == 2 + 18 + 36


def test_a_run_at_its_cap_sends_what_the_progress_bar_foresaw(wired):
    prompts = [PROMPTS[0], CHAT]
    _, _, wire = wired(lambda side, pid, r: 10.0)
    s = settings_of(concurrency=[1, 2], warmup=1, max_units=LEAST + 1)
    report = run_compare(*wire.servers, prompts, s)
    assert len(wire.log) == total_requests(len(prompts), s, prompts)
    assert [lv.sequential.stopped for lv in report.levels] == ["cap", "cap"]
    # at concurrency 1 a conversation's turns stay back to back, each turn one unit: 1, 3, 4, 6, 7 pairs
    assert LEAST + 1 == 7 and report.levels[0].sequential.units == 7


# ------------------------------------------------------------------ refusals and the fixed design

def test_the_rule_needs_both_servers_at_once(wired):
    off, on, _ = wired(pair_tpot(1.5))
    s = settings_of()
    with pytest.raises(UsageError, match="needs both servers up at once"):
        run_one_side(on, "on", PROMPTS, s)
    with pytest.raises(UsageError) as err:
        asyncio.run(ABRunner(off, on, PROMPTS, s).run(sides=("off",)))
    assert str(err.value) == ONE_AFTER_THE_OTHER and "--launch sequential" in ONE_AFTER_THE_OTHER


def test_without_the_rule_the_run_keeps_its_repeats_and_no_outcome(wired):
    _, _, wire = wired(pair_tpot(1.5))
    report = run_compare(*wire.servers, PROMPTS, CompareSettings(concurrency=[1], repeat=2, warmup=0, triage=False))
    assert len(wire.log) == 2 * 2 * len(PROMPTS)
    assert report.levels[0].sequential is None and report.levels[0].speed.tpot.method == "t"
    assert "sequential" not in report.model_dump(mode="json")["settings"]


def test_compare_servers_refuses_the_rule_one_after_the_other_before_any_server(monkeypatch):
    from specadapt.orchestration import ab
    from specadapt.orchestration.servers import ServerPlan
    from specadapt.orchestration.servers import Side as PlanSide

    opened = []
    monkeypatch.setattr(ab, "open_servers", lambda *a, **kw: opened.append(a))
    plan = ServerPlan(backend_name="fake", backend=None, sides=(PlanSide(label="spec-off"), PlanSide(label="spec-on")),
                      launch=(None, None), api_key=None, verify=True, startup_timeout_s=1)
    s = settings_of().model_copy(update={"interleaved": False})
    with pytest.raises(UsageError, match="needs both servers up at once"):
        ab.compare_servers(plan, PROMPTS, s)
    assert opened == []

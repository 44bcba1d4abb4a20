"""The A/B runner's wiring (orchestration/compare.py) without HTTP: what each side is sent (its request
settings with the server's identity extras, the drill temperature), the warm-up and progress,
the counters read around each level, the --duration blocks at concurrency N, and the whole
run_compare / run_one_side / finish_compare path: identity, triage of each divergence with the
spec-off server, its threshold and history, the reference scorer, readable tokens, counts,
notes and the diagnosis.

A fake ``stream_request`` answers from a script (token ids per prompt, side and turn) and
counts each server's requests; the servers' counters follow what they served.
"""

from __future__ import annotations

import asyncio
import types

import httpx
import orjson
import pytest

from specadapt.adapters.base import ServerBase
from specadapt.load import spread
from specadapt.load.engine import LoadEngine
from specadapt.orchestration import compare
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


PROMPTS = [Prompt(id="p0", prompt="zero"), Prompt(id="p1", prompt="one")]


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
    asyncio.run(ABRunner(off, on, PROMPTS, settings).run())
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
    records, _, _ = asyncio.run(ABRunner(off, on, PROMPTS, settings, seen.append).run())
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
    runner = ABRunner(off, on, PROMPTS, settings)
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
    clock = Clock()
    off, on = Side("off"), Side("on")
    wired(off, on, clock=clock, step_ns=10 * MS)
    monkeypatch.setattr(compare, "time", types.SimpleNamespace(perf_counter_ns=clock))
    monkeypatch.setattr(spread, "time", types.SimpleNamespace(perf_counter_ns=clock))
    monkeypatch.setattr(spread, "LoadEngine", lambda send, **kw: LoadEngine(send, clock=clock, **kw))
    settings = CompareSettings(concurrency=[2], repeat=2, warmup=0, load=LoadSettings(duration_s=0.055))
    records, _, _ = asyncio.run(ABRunner(off, on, PROMPTS, settings).run())
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
        info, records, counters = run_one_side(server, name, PROMPTS, settings, seen.append)
        assert info == server.describe() and server.window == ["start", "end"]
        assert settings.concurrency == [1, 2]
        assert {r.side for r in records} == {name} and len(records) == 2 + 4 and len(seen) == 7
        assert {lv: (p.before.drafts, p.after.drafts) for lv, p in counters.items()} == {1: (2, 6), 2: (6, 14)}
        temps = {s.temperature for *_, s, _ in wire.log}
        assert temps == ({0.9} if name == "on" else {0.0})
        assert {s.extra_body["ids"] for *_, s, _ in wire.log} == {name}

"""A TEST TOOL: the counters of a vLLM-like server under speculation, simulated over time.

Not a server and not a model of one's speed: a seeded, deterministic series of spec-decode
counters, a running-batch gauge and latency histograms whose truth is known, so that the
watcher's windows, restart handling, drift test and "costing time" state can be replayed over
days in a unit test, and served live by the scripted server (``POST /_script/metrics`` with
``{"mode": "timeline", "timeline": {...}}``).

Each step of ``step_s`` seconds: ``drafts_per_s * step_s`` verify passes (fractions carried), each
with ``k`` draft tokens; position i is accepted when position i-1 was and a draw with the
conditional acceptance ``a(t)`` succeeds (binomial chains, numpy's seeded generator). ``a(t)`` is
piecewise linear through the ``acceptance`` points ``[[t, a], ...]``; ``block_noise`` adds a
normal wobble of that standard deviation to ``a`` per ``noise_block_s`` seconds (traffic mix
changes: the spread between blocks that a binomial alone would not have). The running batch is
piecewise constant through ``running``. ``restarts`` are times at which every counter falls back
to zero. Generated tokens = passes + accepted; TPOT follows the model TPOT = itl_s * (v + c k) /
(1 + sum of per-position rates) with ``v``, ``c`` given; TTFT is constant.
"""

from __future__ import annotations

import bisect
from typing import Any

import numpy as np
from pydantic import BaseModel, Field

from specadapt.records import CounterSnapshot
from specadapt.records.watch import HistogramState, LiveSnapshot


class Timeline(BaseModel):
    k: int = 3
    drafts_per_s: float = 200.0
    acceptance: list[tuple[float, float]] = Field(default_factory=lambda: [(0.0, 0.7)])
    block_noise: float = 0.0
    noise_block_s: float = 60.0
    running: list[tuple[float, float]] = Field(default_factory=lambda: [(0.0, 4.0)])
    restarts: list[float] = Field(default_factory=list)
    step_s: float = 1.0
    seed: int = 0
    ttft_s: float = 0.05
    itl_s: float = 0.02
    v: float = 1.0
    c: float = 0.1
    requests_per_s: float = 2.0
    base: float = 0.0  # counters start here (a server up for a while)


def _interp(points: list[tuple[float, float]], t: float) -> float:
    ts = [p[0] for p in points]
    i = bisect.bisect_right(ts, t)
    if i == 0:
        return points[0][1]
    if i == len(points):
        return points[-1][1]
    (t0, a0), (t1, a1) = points[i - 1], points[i]
    return a0 + (a1 - a0) * (t - t0) / (t1 - t0)


def _step_value(points: list[tuple[float, float]], t: float) -> float:
    ts = [p[0] for p in points]
    i = bisect.bisect_right(ts, t)
    return points[max(0, i - 1)][1]


class Simulator:
    """Counters at increasing times ``t`` (seconds since the timeline started)."""

    def __init__(self, timeline: Timeline):
        self.tl = timeline
        self.rng = np.random.default_rng(timeline.seed)
        self.t = 0.0
        self._carry = 0.0
        self._noise_block = -1
        self._noise = 0.0
        self._restarts = sorted(timeline.restarts)
        self._zero(timeline.base)

    def _zero(self, base: float = 0.0) -> None:
        k = self.tl.k
        self.drafts = base
        self.per_pos = [base * 0.5 ** (i + 1) for i in range(k)]
        self.generation = base * 2
        self.ttft = HistogramState(sum=base * self.tl.ttft_s / 10, count=base / 10)
        self.tpot = HistogramState(sum=base * self.tl.itl_s, count=base)

    def restart(self) -> None:
        """Every counter falls back to zero now (a restart at the time reached so far)."""
        self._zero()

    def acceptance(self, t: float) -> float:
        return _interp(self.tl.acceptance, t)

    def _advance_to(self, t: float) -> None:
        tl = self.tl
        while self.t + tl.step_s <= t + 1e-9:
            mid = self.t + tl.step_s / 2
            while self._restarts and self._restarts[0] <= self.t + tl.step_s:
                self._restarts.pop(0)
                self._zero()
            block = int(mid // tl.noise_block_s)
            if block != self._noise_block:
                self._noise_block = block
                self._noise = float(self.rng.normal(0.0, tl.block_noise)) if tl.block_noise else 0.0
            a = min(1.0, max(0.0, self.acceptance(mid) + self._noise))
            want = tl.drafts_per_s * tl.step_s + self._carry
            n = int(want)
            self._carry = want - n
            alive, accepted = n, 0
            for i in range(tl.k):
                alive = int(self.rng.binomial(alive, a)) if alive else 0
                self.per_pos[i] += alive
                accepted += alive
            self.drafts += n
            tokens = n + accepted
            self.generation += tokens
            length = 1.0 + (accepted / n if n else 0.0)
            tpot = tl.itl_s * (tl.v + tl.c * tl.k) / length
            self.tpot = HistogramState(sum=self.tpot.sum + tokens * tpot, count=self.tpot.count + tokens)
            reqs = tl.requests_per_s * tl.step_s
            self.ttft = HistogramState(sum=self.ttft.sum + reqs * tl.ttft_s, count=self.ttft.count + reqs)
            self.t += tl.step_s

    def counters(self, t: float) -> CounterSnapshot:
        self._advance_to(t)
        k = self.tl.k
        return CounterSnapshot(drafts=self.drafts, draft_tokens=self.drafts * k, accepted_tokens=sum(self.per_pos),
                               accepted_per_position=dict(enumerate(self.per_pos)), generation_tokens=self.generation,
                               source="simulated")

    def live(self, t: float) -> LiveSnapshot:
        c = self.counters(t)
        return LiveSnapshot(at=t, counters=c, running=_step_value(self.tl.running, t), waiting=0.0,
                            ttft=self.ttft, tpot=self.tpot)

    def metrics_text(self, t: float, model: str = "scripted") -> str:
        """The state at ``t`` as vLLM's /metrics names it (Prometheus text)."""
        s = self.live(t)
        c = s.counters
        lab = f'engine="0",model_name="{model}"'
        out = []

        def counter(name: str, value: float, extra: str = "") -> None:
            out.append(f"# TYPE {name} counter")
            out.append(f"{name}_total{{{lab}{extra}}} {value}")

        counter("vllm:generation_tokens", c.generation_tokens)
        counter("vllm:spec_decode_num_drafts", c.drafts)
        counter("vllm:spec_decode_num_draft_tokens", c.draft_tokens)
        counter("vllm:spec_decode_num_accepted_tokens", c.accepted_tokens)
        out.append("# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter")
        out += [f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{lab},position="{i}"}} {v}'
                for i, v in c.accepted_per_position.items()]
        out += ["# TYPE vllm:num_requests_running gauge", f"vllm:num_requests_running{{{lab}}} {s.running}",
                "# TYPE vllm:num_requests_waiting gauge", f"vllm:num_requests_waiting{{{lab}}} {s.waiting}"]
        for name, h in (("vllm:time_to_first_token_seconds", s.ttft), ("vllm:inter_token_latency_seconds", s.tpot)):
            out += [f"# TYPE {name} histogram", f'{name}_bucket{{{lab},le="+Inf"}} {h.count}',
                    f"{name}_sum{{{lab}}} {h.sum}", f"{name}_count{{{lab}}} {h.count}"]
        return "\n".join(out) + "\n"


def replay(timeline: Timeline | dict[str, Any], until_s: float, every_s: float) -> list[LiveSnapshot]:
    """Reads every ``every_s`` seconds from 0 to ``until_s`` (a watcher's view of the series)."""
    tl = timeline if isinstance(timeline, Timeline) else Timeline.model_validate(timeline)
    sim = Simulator(tl)
    n = int(until_s / every_s)
    return [sim.live(i * every_s) for i in range(n + 1)]

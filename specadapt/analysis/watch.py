"""`specadapt watch`'s arithmetic over a series of server reads: intervals with restarts removed,
windowed figures per server and for the fleet, the drift test, and the expected speedup at the
live load.

Pure functions and small state machines over records (no I/O, no clock of their own: every
time comes in with the reads), so that the figures and alarms are mutation-tested and replayed.

Intervals. Two consecutive reads of one server give one interval: the differences of its
counters and histograms. A counter that went down means the server restarted (its counters
started again from zero): that interval is dropped, never read as a negative rate, and the
restart is counted. Counters that appear or vanish between reads are a restart too. A read
that failed makes no interval; the next good read pairs with the last good one (the interval
then spans the outage, and its rates are rates over that span).

Window. The figures of a server are sums over the intervals that ended within the last
``window_s`` seconds (a deque bounded by time, so memory is bounded however long the watch):
acceptance rate = accepted / draft tokens, mean acceptance length = 1 + accepted / drafts,
per-position rate i = accepted at i / drafts, throughputs = sums / seconds covered, running
batch = time-weighted mean of the gauge, TTFT/TPOT = d(histogram sum) / d(histogram count). The
fleet figures sum the servers' window sums (ratios of sums, never means of ratios).

Drift (DriftDetector). Acceptance is judged per block of ``block_s`` seconds of reads with at
least ``min_draft_tokens`` draft tokens (quieter blocks carry no information and are skipped).
The first ``learn_blocks`` such blocks are the reference window: their mean mu0 and standard
deviation (between blocks, which holds the real spread of traffic, not a binomial idealisation;
floored at the binomial spread of the block, and raised to its one-sided 95% upper confidence
bound for having been estimated from few blocks). Then a one-sided CUSUM of the fall,
S = max(0, S + (mu0 - x) / sigma - kappa), raises the alarm when S > h, and clears it when S
returns to 0. kappa = half the shift to detect fast (in sigmas); h is solved from the stated
false alarms per day with Siegmund's approximation of the in-control run length,
ARL0 = (exp(2 kappa b) - 2 kappa b - 1) / (2 kappa^2), b = h + 1.166, taking every block of the
day as active (a quieter server raises fewer). The expected delay for a fall of d sigmas is
Siegmund's ARL1 with kappa - d in place of kappa (``detection_delay_blocks``).

Paying (expected_speedup). A compare or tune report of the same deployment gives the verify cost
v + c k per level (analysis/tune_model.py: a compare report's single k gives the form 1 + c k).
At the live batch size (the mean running batch), v and c are interpolated linearly between the
two measured levels around it (outside them: the nearest, said so); the expected TPOT ratio
off/on is (1 + sum of the live per-position rates up to k) / (v + c k). Its interval: the live
rates' Wilson bounds (drafts as trials) times the level's measured TPOT interval around its
point, relative. "Costing time" is an upper bound below 1. The k the model would pick is the
argmax over 0..k (positions beyond the deployed k are not measured live).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import pairwise

from scipy.special import chdtri

from specadapt.analysis.tune_model import fit_level, predict_ratio
from specadapt.records import CompareReport
from specadapt.records.tune import TuneReport
from specadapt.records.watch import HistogramState, LiveSnapshot

# ----------------------------------------------------------------------------- intervals


@dataclass(frozen=True)
class Interval:
    """The differences between two good reads of one server (no restart in between)."""

    start: float
    end: float
    drafts: float | None = None
    draft_tokens: float | None = None
    accepted: float | None = None
    per_position: tuple[float, ...] = ()
    generation: float | None = None
    running: float | None = None  # the gauge: mean of the two reads
    ttft_sum: float = 0.0
    ttft_count: float = 0.0
    tpot_sum: float = 0.0
    tpot_count: float = 0.0

    @property
    def seconds(self) -> float:
        return self.end - self.start


def _d(before: float | None, after: float | None) -> float | None:
    if before is None or after is None:
        return None
    return after - before


def _hist_d(before: HistogramState | None, after: HistogramState | None) -> tuple[float, float]:
    if before is None or after is None:
        return (0.0, 0.0)
    return (after.sum - before.sum, after.count - before.count)


def _mean_gauge(a: float | None, b: float | None) -> float | None:
    if a is None or b is None:
        return b if a is None else a
    return (a + b) / 2.0


def interval_between(prev: LiveSnapshot, cur: LiveSnapshot) -> Interval | None:
    """The interval from ``prev`` to ``cur``, or None when the server restarted in between (a
    counter went down, or the spec-decode counters appeared or vanished)."""
    a, b = prev.counters, cur.counters
    if a.has_spec_counters != b.has_spec_counters:
        return None
    diffs = [_d(a.drafts, b.drafts), _d(a.draft_tokens, b.draft_tokens), _d(a.accepted_tokens, b.accepted_tokens),
             _d(a.generation_tokens, b.generation_tokens)]
    positions = sorted(set(a.accepted_per_position) | set(b.accepted_per_position))
    per_pos = [b.accepted_per_position.get(p, 0.0) - a.accepted_per_position.get(p, 0.0) for p in positions]
    hists = [_hist_d(prev.ttft, cur.ttft), _hist_d(prev.tpot, cur.tpot)]
    if any(x is not None and x < 0 for x in [*diffs, *per_pos]) or any(s < 0 or n < 0 for s, n in hists):
        return None
    (ts, tc), (ps, pc) = hists
    return Interval(start=prev.at, end=cur.at, drafts=diffs[0], draft_tokens=diffs[1], accepted=diffs[2],
                    per_position=tuple(per_pos), generation=diffs[3],
                    running=_mean_gauge(prev.running, cur.running), ttft_sum=ts, ttft_count=tc,
                    tpot_sum=ps, tpot_count=pc)


# ----------------------------------------------------------------------------- windows


@dataclass
class WindowSums:
    """Sums over the intervals of a window (one server, or the fleet)."""

    seconds: float = 0.0
    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted: float = 0.0
    per_position: list[float] = field(default_factory=list)
    generation: float = 0.0
    running_seconds: float = 0.0  # seconds covered by a running-gauge reading
    running_area: float = 0.0  # sum of running * seconds
    ttft_sum: float = 0.0
    ttft_count: float = 0.0
    tpot_sum: float = 0.0
    tpot_count: float = 0.0
    intervals: int = 0
    spec_intervals: int = 0  # intervals with spec-decode counters

    def add(self, iv: Interval) -> None:
        self.seconds += iv.seconds
        self.intervals += 1
        if iv.drafts is not None and iv.draft_tokens is not None and iv.accepted is not None:
            self.spec_intervals += 1
            self.drafts += iv.drafts
            self.draft_tokens += iv.draft_tokens
            self.accepted += iv.accepted
            if len(iv.per_position) > len(self.per_position):
                self.per_position += [0.0] * (len(iv.per_position) - len(self.per_position))
            for i, x in enumerate(iv.per_position):
                self.per_position[i] += x
        self.generation += iv.generation or 0.0
        if iv.running is not None:
            self.running_seconds += iv.seconds
            self.running_area += iv.running * iv.seconds
        self.ttft_sum += iv.ttft_sum
        self.ttft_count += iv.ttft_count
        self.tpot_sum += iv.tpot_sum
        self.tpot_count += iv.tpot_count

    def merge(self, other: WindowSums) -> None:
        """Add another window's sums (the fleet: running batch sizes add up)."""
        for name in ("seconds", "drafts", "draft_tokens", "accepted", "generation", "ttft_sum", "ttft_count",
                     "tpot_sum", "tpot_count", "intervals", "spec_intervals"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        if len(other.per_position) > len(self.per_position):
            self.per_position += [0.0] * (len(other.per_position) - len(self.per_position))
        for i, x in enumerate(other.per_position):
            self.per_position[i] += x
        if other.running_seconds:
            # a fleet's batch is the sum of the servers' mean batches; kept as area over one shared span
            mean = other.running_area / other.running_seconds
            self.running_area += mean
            self.running_seconds = 1.0


@dataclass(frozen=True)
class WindowFigures:
    """What a window says; None where it cannot say (no drafts, no histogram, no time)."""

    seconds: float
    acceptance_rate: float | None
    mean_acceptance_length: float | None
    per_position_rate: tuple[float, ...]
    drafts: float
    draft_tokens: float
    accepted: float
    draft_tokens_per_s: float | None
    accepted_per_s: float | None
    verify_passes_per_s: float | None
    generation_per_s: float | None
    running: float | None
    ttft_s: float | None
    tpot_s: float | None


def _per_s(x: float, seconds: float) -> float | None:
    return x / seconds if seconds > 0 else None


def figures(w: WindowSums) -> WindowFigures:
    rate = w.accepted / w.draft_tokens if w.draft_tokens > 0 else None
    length = 1.0 + w.accepted / w.drafts if w.drafts > 0 else None
    per_pos = tuple(x / w.drafts for x in w.per_position) if w.drafts > 0 else ()
    spec_seconds = w.seconds if w.spec_intervals else 0.0
    return WindowFigures(
        seconds=w.seconds, acceptance_rate=rate, mean_acceptance_length=length, per_position_rate=per_pos,
        drafts=w.drafts, draft_tokens=w.draft_tokens, accepted=w.accepted,
        draft_tokens_per_s=_per_s(w.draft_tokens, spec_seconds), accepted_per_s=_per_s(w.accepted, spec_seconds),
        verify_passes_per_s=_per_s(w.drafts, spec_seconds), generation_per_s=_per_s(w.generation, w.seconds),
        running=w.running_area / w.running_seconds if w.running_seconds > 0 else None,
        ttft_s=w.ttft_sum / w.ttft_count if w.ttft_count > 0 else None,
        tpot_s=w.tpot_sum / w.tpot_count if w.tpot_count > 0 else None)


class Window:
    """The intervals that ended within the last ``window_s`` seconds (bounded by time, and by
    ``max_intervals`` however short the intervals)."""

    def __init__(self, window_s: float, max_intervals: int = 100_000):
        if window_s <= 0:
            raise ValueError("window_s must be positive")
        self.window_s = window_s
        self._ivs: deque[Interval] = deque(maxlen=max_intervals)

    def add(self, iv: Interval) -> None:
        self._ivs.append(iv)
        self._trim(iv.end)

    def _trim(self, now: float) -> None:
        while self._ivs and self._ivs[0].end <= now - self.window_s:
            self._ivs.popleft()

    def sums(self, now: float | None = None) -> WindowSums:
        if now is not None:
            self._trim(now)
        out = WindowSums()
        for iv in self._ivs:
            out.add(iv)
        return out

    def __len__(self) -> int:
        return len(self._ivs)


def fleet_sums(windows: Iterable[WindowSums]) -> WindowSums:
    out = WindowSums()
    for w in windows:
        out.merge(w)
    return out


# ----------------------------------------------------------------------------- drift

SIEGMUND_OFFSET = 1.166


def arl0(kappa: float, h: float) -> float:
    """Siegmund's approximation of the in-control average run length (blocks) of a one-sided
    CUSUM of standard normal steps with reference value ``kappa`` and decision level ``h``."""
    b = h + SIEGMUND_OFFSET
    return (math.exp(2 * kappa * b) - 2 * kappa * b - 1) / (2 * kappa * kappa)


def detection_delay_blocks(kappa: float, h: float, shift_sigmas: float) -> float:
    """Siegmund's expected run length (blocks) when the mean has moved by ``shift_sigmas``."""
    delta = shift_sigmas - kappa
    b = h + SIEGMUND_OFFSET
    if abs(delta) < 1e-12:
        return b * b
    return (math.exp(-2 * delta * b) + 2 * delta * b - 1) / (2 * delta * delta)


def decision_level(kappa: float, blocks_per_day: float, false_alarms_per_day: float) -> float:
    """The h at which arl0(kappa, h) = blocks_per_day / false_alarms_per_day (bisection)."""
    if false_alarms_per_day <= 0 or blocks_per_day <= 0:
        raise ValueError("false alarms per day and blocks per day must be positive")
    target = blocks_per_day / false_alarms_per_day
    lo, hi = 0.0, 1.0
    while arl0(kappa, hi) < target:
        hi *= 2.0
    for _ in range(100):
        mid = (lo + hi) / 2.0
        if arl0(kappa, mid) < target:
            lo = mid
        else:
            hi = mid
    return hi


@dataclass(frozen=True)
class DriftSettings:
    block_s: float = 60.0
    learn_blocks: int = 30
    false_alarms_per_day: float = 0.1
    shift_sigmas: float = 2.0
    """The fall (in block standard deviations) the test is tuned to catch fastest; kappa is half of it."""
    min_draft_tokens: float = 200.0

    @property
    def kappa(self) -> float:
        return self.shift_sigmas / 2.0

    @property
    def h(self) -> float:
        return decision_level(self.kappa, 86400.0 / self.block_s, self.false_alarms_per_day)

    def delay_s(self, shift_sigmas: float | None = None) -> float:
        """Expected seconds from a fall of ``shift_sigmas`` (default: the tuned shift) to the alarm."""
        return detection_delay_blocks(self.kappa, self.h, shift_sigmas or self.shift_sigmas) * self.block_s


LEARN_CONFIDENCE = 0.95


def sigma_upper(sd: float, n: int, confidence: float = LEARN_CONFIDENCE) -> float:
    """One-sided upper confidence bound of a normal standard deviation estimated from n blocks."""
    if n < 2:
        return sd
    return sd * math.sqrt((n - 1) / chdtri(n - 1, confidence))


class DriftDetector:
    """One-sided CUSUM on block acceptance (see the module docstring)."""

    def __init__(self, settings: DriftSettings):
        self.s = settings
        self.h = settings.h
        self.learned: list[float] = []
        self.learned_tokens: list[float] = []
        self.mu0: float | None = None
        self.sigma: float | None = None
        self.statistic = 0.0
        self.alarm = False
        self.blocks = 0  # judged blocks (after learning)
        self.skipped = 0  # blocks too quiet to judge
        self.last_block: float | None = None
        self._acc = 0.0
        self._tok = 0.0
        self._seconds = 0.0

    @property
    def learning(self) -> bool:
        return self.mu0 is None

    def feed(self, iv: Interval) -> bool | None:
        """Add an interval; when it completes a block, judge it: True/False is the alarm after the
        block, None when no block completed (or the block was too quiet, or still learning)."""
        if iv.draft_tokens is None or iv.accepted is None:
            return None
        self._acc += iv.accepted
        self._tok += iv.draft_tokens
        self._seconds += iv.seconds
        if self._seconds < self.s.block_s:
            return None
        acc, tok = self._acc, self._tok
        self._acc = self._tok = self._seconds = 0.0
        if tok < self.s.min_draft_tokens:
            self.skipped += 1
            return None
        return self.judge(acc / tok, tok)

    def restart(self) -> None:
        """The server restarted: the block under way is dropped (its reads straddle the restart)."""
        self._acc = self._tok = self._seconds = 0.0

    def judge(self, x: float, tokens: float) -> bool | None:
        self.last_block = x
        if self.mu0 is None:
            self.learned.append(x)
            self.learned_tokens.append(tokens)
            if len(self.learned) >= self.s.learn_blocks:
                self._fit()
            return None
        self.blocks += 1
        z = (self.mu0 - x) / self.sigma
        self.statistic = max(0.0, self.statistic + z - self.s.kappa)
        if self.statistic > self.h:
            self.alarm = True
        elif self.statistic == 0.0:
            self.alarm = False
        return self.alarm

    def _fit(self) -> None:
        n = len(self.learned)
        mu = sum(self.learned) / n
        sd = math.sqrt(sum((x - mu) ** 2 for x in self.learned) / (n - 1)) if n > 1 else 0.0
        mean_tokens = sum(self.learned_tokens) / n
        binomial = math.sqrt(max(mu * (1.0 - mu), 1e-6) / mean_tokens)
        self.mu0 = mu
        self.sigma = max(sigma_upper(sd, n), binomial)


# ----------------------------------------------------------------------------- paying


@dataclass(frozen=True)
class LevelCost:
    concurrency: int
    v: float
    c: float
    rel_low: float  # the level's measured TPOT interval, relative to its point (below)
    rel_high: float


@dataclass(frozen=True)
class CostModel:
    """The baseline's verify cost per level, and what it was measured on."""

    levels: tuple[LevelCost, ...]
    k: int | None
    model_id: str | None
    spec_method: str | None
    source: str


def _rel(point: float | None, low: float | None, high: float | None) -> tuple[float, float]:
    if not point or low is None or high is None:
        return (0.0, 0.0)
    return (max(0.0, 1.0 - low / point), max(0.0, high / point - 1.0))


def cost_model_from_compare(report: CompareReport, source: str = "compare report") -> CostModel:
    """Per closed-loop level: the form 1 + c k from the level's TPOT ratio and acceptance length."""
    k = report.on_server.num_speculative_tokens
    levels = []
    for lv in report.levels:
        if not k or lv.concurrency <= 0:
            continue
        fit = fit_level(lv.concurrency, [(k, lv)])
        if fit.form == "none":  # no TPOT ratio or no acceptance length at this level
            continue
        t = lv.speed.tpot
        levels.append(LevelCost(lv.concurrency, fit.v, fit.c, *_rel(t.point, t.low, t.high)))
    return CostModel(levels=tuple(sorted(levels, key=lambda x: x.concurrency)), k=k,
                     model_id=report.on_server.model_id, spec_method=report.on_server.spec_method, source=source)


def cost_model_from_tune(report: TuneReport, variant: str = "", source: str = "tune report") -> CostModel:
    """Per level: the fitted v + c k of the sweep (the base variant), with the level's worst
    relative error of the fit at its measured points as the interval."""
    levels = []
    for fit in report.fits:
        if fit.variant != variant or fit.v is None or fit.c is None:
            continue
        err = fit.max_rel_error or 0.0
        lows = [_rel(p.measured, p.low, p.high)[0] for p in fit.points]
        highs = [_rel(p.measured, p.low, p.high)[1] for p in fit.points]
        levels.append(LevelCost(fit.concurrency, fit.v, fit.c, max([err, *lows]), max([err, *highs])))
    measured = [c for c in report.candidates if c.compare is not None]
    first = measured[0].compare.on_server if measured else None
    return CostModel(levels=tuple(sorted(levels, key=lambda x: x.concurrency)),
                     k=report.recommendation.k or None, model_id=first.model_id if first else None,
                     spec_method=first.spec_method if first else report.settings.base_spec.get("method"),
                     source=source)


def cost_at(model: CostModel, batch: float) -> tuple[LevelCost, str | None]:
    """v and c at a batch size: interpolated between the measured levels around it, or the nearest
    level outside them (with a note)."""
    lv = model.levels
    if not lv:
        raise ValueError("the cost model has no level")
    if batch <= lv[0].concurrency:
        return lv[0], None
    if batch >= lv[-1].concurrency:
        note = (f"batch {batch:.1f} is above the largest measured level ({lv[-1].concurrency}): its cost is "
                "taken as that level's") if batch > lv[-1].concurrency else None
        return lv[-1], note
    for level in lv:
        if level.concurrency == batch:  # a measured level: its own cost and interval
            return level, None
    for lo, hi in pairwise(lv):
        if lo.concurrency < batch < hi.concurrency:
            t = (batch - lo.concurrency) / (hi.concurrency - lo.concurrency)

            def mix(a: float, b: float, t: float = t) -> float:
                return a + t * (b - a)

            return LevelCost(round(batch), mix(lo.v, hi.v), mix(lo.c, hi.c), max(lo.rel_low, hi.rel_low),
                             max(lo.rel_high, hi.rel_high)), None
    raise AssertionError("unreachable: levels are sorted")  # pragma: no cover


def wilson(successes: float, trials: float, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval of a proportion (0, 1 with no trials)."""
    if trials <= 0:
        return (0.0, 1.0)
    p = min(1.0, max(0.0, successes / trials))
    denom = 1.0 + z * z / trials
    centre = (p + z * z / (2 * trials)) / denom
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


@dataclass(frozen=True)
class Expectation:
    point: float
    low: float
    high: float
    costing_time: bool
    best_k: int
    batch: float
    k: int
    note: str | None = None


def expected_speedup(model: CostModel, w: WindowFigures, k: int | None = None) -> Expectation | None:
    """The expected TPOT ratio off/on at the window's acceptance and batch size; None when the
    window has no drafts, no batch reading, or the model no level."""
    k = k or model.k or len(w.per_position_rate)
    rates = list(w.per_position_rate)
    if not model.levels or not rates or w.running is None:
        return None
    cost, note = cost_at(model, w.running)
    point = predict_ratio(rates, cost.v, cost.c, k)
    if point is None:
        return None
    bounds = [wilson(r * w.drafts, w.drafts) for r in rates[:k]]
    denom = cost.v + cost.c * k
    low = (1.0 + sum(b[0] for b in bounds)) / denom * (1.0 - cost.rel_low)
    high = (1.0 + sum(b[1] for b in bounds)) / denom * (1.0 + cost.rel_high)
    options = {j: predict_ratio(rates, cost.v, cost.c, j) for j in range(k + 1)}
    best = max((j for j in options if options[j] is not None), key=lambda j: (options[j], -j))
    return Expectation(point=point, low=low, high=high, costing_time=high < 1.0, best_k=best, batch=w.running,
                       k=k, note=note)


def baseline_problem(model: CostModel, live_model: str | None, live_method: str | None) -> str | None:
    """Why a baseline cannot judge this server (another model or method), or None."""
    if model.model_id and live_model and model.model_id != live_model:
        return f"it was measured on model {model.model_id!r}, the server serves {live_model!r}"
    if model.spec_method and live_method and _method(model.spec_method) != _method(live_method):
        return f"it was measured with speculation method {model.spec_method!r}, the server runs {live_method!r}"
    return None


def _method(name: str) -> str:
    return name.lower().strip("[]").replace("_", "").replace("-", "")

"""`specadapt watch`: read each server's counters on an interval, keep the windowed figures, the
drift test, the expected speedup and the canaries, and say when an alert is raised or cleared.

The arithmetic is analysis/watch.py's; this module owns the clock, the reads (in threads, so a
slow server delays no other), back-off for servers that fail, and the alert states. Memory is
bounded: windows by time, events and canary history by count.

Alert states per server (each raised and cleared as an event, with its reason):
- ``down``: the last read failed (unreachable, timed out, not Prometheus text); retried with
  back-off (interval, doubled per failure up to ``max_backoff_s``);
- ``no-counters``: the server answers but exposes no draft/accepted counters;
- ``costing-time``: with a baseline, the expected speedup's upper bound is below 1;
- ``drift``: the CUSUM of the fall in acceptance is above its decision level;
- ``canary``: the last canary round had a suspect divergence from the golden answers.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from specadapt.adapters.base import Server
from specadapt.analysis.canary import round_summary
from specadapt.analysis.watch import (
    CostModel,
    DriftDetector,
    DriftSettings,
    Expectation,
    Window,
    WindowFigures,
    baseline_problem,
    expected_speedup,
    figures,
    fleet_sums,
    interval_between,
)
from specadapt.errors import SpecadaptError
from specadapt.orchestration.canary import check_golden, run_canary_round
from specadapt.records import GoldenFile, ServerInfo
from specadapt.records.watch import FLEET, LiveSnapshot

ALERTS = ("down", "no-counters", "costing-time", "drift", "canary")
EVENTS_KEPT = 500


@dataclass(frozen=True)
class WatchSettings:
    interval_s: float = 10.0
    window_s: float = 300.0
    timeout_s: float = 5.0
    max_backoff_s: float = 300.0
    drift: DriftSettings = field(default_factory=DriftSettings)
    canary_every_s: float | None = None


@dataclass(frozen=True)
class Event:
    wall: float
    server: str
    alert: str
    raised: bool
    text: str


@dataclass
class CanaryStatus:
    verdict: str
    summary: str
    wall: float


CanaryFn = Callable[[Server], CanaryStatus]
"""Runs one canary round against a server and says its worst verdict (never raises)."""


class ServerWatch:
    """Everything the watcher keeps about one server."""

    def __init__(self, name: str, server: Server, settings: WatchSettings):
        self.name = name
        self.server = server
        self.window = Window(settings.window_s)
        self.drift = DriftDetector(settings.drift)
        self.last: LiveSnapshot | None = None
        self.info: ServerInfo | None = None
        self.up = False
        self.ever_up = False
        self.reads = 0
        self.errors = 0
        self.restarts = 0
        self.last_error: str | None = None
        self.last_success_wall: float | None = None
        self.has_counters: bool | None = None
        self.backoff = 0.0
        self.next_read = 0.0
        self.in_flight: cf.Future | None = None
        self.totals: dict[str, float] = {"drafts": 0.0, "draft_tokens": 0.0, "accepted": 0.0}
        self.expectation: Expectation | None = None
        self.baseline_refused: str | None = None
        self.canary: CanaryStatus | None = None
        self.canary_counts: dict[str, int] = {}
        self.next_canary = 0.0
        self.canary_future: cf.Future | None = None
        self.alerts: dict[str, str] = {}  # raised alert -> its reason

    @property
    def url(self) -> str:
        return self.server.base_url

    def figures(self, now: float) -> WindowFigures:
        return figures(self.window.sums(now))


class Watcher:
    """The watch loop's state; ``step()`` does one round of due reads, ``run()`` loops."""

    def __init__(self, servers: Sequence[tuple[str, Server]], settings: WatchSettings,
                 baseline: CostModel | None = None, canary: CanaryFn | None = None,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time):
        names = [n for n, _ in servers]
        if len(set(names)) != len(names):
            raise ValueError("server names must be distinct")
        self.settings = settings
        self.baseline = baseline
        self.canary_fn = canary
        self.clock, self.wall = clock, wall
        self.servers = [ServerWatch(n, s, settings) for n, s in servers]
        self.events: deque[Event] = deque(maxlen=EVENTS_KEPT)
        self.raised_ever = 0
        self.lock = threading.RLock()
        self.started = clock()
        self._pool = cf.ThreadPoolExecutor(max_workers=min(32, max(1, 2 * len(self.servers))),
                                           thread_name_prefix="specadapt-watch")

    # -- reads -----------------------------------------------------------------------
    def _read(self, sw: ServerWatch) -> tuple[LiveSnapshot, ServerInfo | None]:
        info = sw.info
        if info is None:
            info = sw.server.describe()
        snap = sw.server.read_live()
        if snap.counters.source.startswith("unavailable"):
            raise ServerReadError(snap.counters.source.removeprefix("unavailable: "))
        return snap.model_copy(update={"at": self.clock()}), info

    def step(self) -> list[Event]:
        """Start the reads that are due, wait for them up to the timeout, and fold them in."""
        now = self.clock()
        started = []
        for sw in self.servers:
            if sw.in_flight is None and now >= sw.next_read:
                sw.in_flight = self._pool.submit(self._read, sw)
                started.append(sw)
        if started:
            cf.wait([sw.in_flight for sw in started], timeout=self.settings.timeout_s)
        events: list[Event] = []
        for sw in self.servers:
            fut = sw.in_flight
            if fut is None:
                continue
            if not fut.done():
                if sw in started:  # cf.wait above returned at the timeout with this read unanswered
                    events += self._failed(sw, f"no answer within {self.settings.timeout_s:g} s")
                continue  # a slow read still under way: no new read until it ends
            sw.in_flight = None
            try:
                snap, info = fut.result()
            except (SpecadaptError, OSError, ValueError) as exc:
                events += self._failed(sw, str(exc).splitlines()[0][:300] or type(exc).__name__)
                continue
            events += self._fold(sw, snap, info)
        events += self._canaries()
        return events

    def _failed(self, sw: ServerWatch, reason: str) -> list[Event]:
        with self.lock:
            sw.errors += 1
            sw.up = False
            sw.last_error = reason
            sw.backoff = min(self.settings.max_backoff_s,
                             max(self.settings.interval_s, sw.backoff * 2 if sw.backoff else self.settings.interval_s))
            sw.next_read = self.clock() + sw.backoff
            return self._set(sw, "down", f"{reason}; next try in {sw.backoff:g} s")

    def _fold(self, sw: ServerWatch, snap: LiveSnapshot, info: ServerInfo | None) -> list[Event]:
        events: list[Event] = []
        with self.lock:
            sw.reads += 1
            sw.up = sw.ever_up = True
            sw.backoff = 0.0
            sw.next_read = snap.at + self.settings.interval_s
            sw.last_success_wall = self.wall()
            sw.last_error = None
            if info is not None and sw.info is None:
                sw.info = info
                if self.baseline is not None:
                    sw.baseline_refused = baseline_problem(self.baseline, info.model_id, info.spec_method)
            events += self._set(sw, "down", None)
            has = snap.counters.has_spec_counters
            sw.has_counters = has
            events += self._set(sw, "no-counters", None if has else
                                "the server exposes no spec-decode counters (speculation off, stats disabled, or a "
                                "backend that reports acceptance only as a gauge)")
            if sw.last is not None:
                iv = interval_between(sw.last, snap)
                if iv is None:
                    sw.restarts += 1
                    sw.drift.restart()
                    events.append(self._event(sw, "restart", True, "counters went down: the server restarted; "
                                                                   "the interval is dropped"))
                else:
                    sw.window.add(iv)
                    for key, val in (("drafts", iv.drafts), ("draft_tokens", iv.draft_tokens),
                                     ("accepted", iv.accepted)):
                        sw.totals[key] += val or 0.0
                    sw.drift.feed(iv)
                    events += self._set(sw, "drift", self._drift_reason(sw) if sw.drift.alarm else None)
            sw.last = snap
            events += self._judge_cost(sw, snap.at)
        return events

    def _drift_reason(self, sw: ServerWatch) -> str:
        d = sw.drift
        return (f"acceptance fell: last block {d.last_block:.3f} against the reference {d.mu0:.3f} "
                f"(CUSUM {d.statistic:.1f} > {d.h:.1f})")

    def _judge_cost(self, sw: ServerWatch, now: float) -> list[Event]:
        if self.baseline is None or sw.baseline_refused:
            return []
        k = sw.info.num_speculative_tokens if sw.info else None
        exp = expected_speedup(self.baseline, sw.figures(now), k)
        sw.expectation = exp
        if exp is None:
            return []
        reason = None
        if exp.costing_time:
            reason = (f"expected speedup {exp.point:.2f}x [{exp.low:.2f}, {exp.high:.2f}] at batch {exp.batch:.1f}: "
                      f"speculation is costing time at this load; the model would pick "
                      f"{'speculation off' if exp.best_k == 0 else f'k={exp.best_k}'}")
        return self._set(sw, "costing-time", reason)

    # -- canaries ----------------------------------------------------------------------
    def _canaries(self) -> list[Event]:
        """Start the rounds that are due (in the pool: a round's requests delay no read) and fold
        the rounds that have finished."""
        every = self.settings.canary_every_s
        if self.canary_fn is None or not every:
            return []
        events: list[Event] = []
        now = self.clock()
        for sw in self.servers:
            fut = sw.canary_future
            if fut is not None and fut.done():
                sw.canary_future = None
                try:
                    status = fut.result()
                except Exception as exc:  # a round must never end the watch
                    status = CanaryStatus(verdict="error", summary=f"canary round failed: {exc}", wall=self.wall())
                with self.lock:
                    sw.canary = status
                    sw.canary_counts[status.verdict] = sw.canary_counts.get(status.verdict, 0) + 1
                    events += self._set(sw, "canary", status.summary if status.verdict == "suspect" else None)
            if sw.up and sw.canary_future is None and now >= sw.next_canary:
                sw.next_canary = now + every
                sw.canary_future = self._pool.submit(self.canary_fn, sw.server)
        return events

    # -- alerts ------------------------------------------------------------------------
    def _event(self, sw: ServerWatch, alert: str, raised: bool, text: str) -> Event:
        ev = Event(wall=self.wall(), server=sw.name, alert=alert, raised=raised, text=text)
        self.events.append(ev)
        return ev

    def _set(self, sw: ServerWatch, alert: str, reason: str | None) -> list[Event]:
        """Raise (reason given) or clear (None) an alert; an event only when its state changes."""
        was = alert in sw.alerts
        if reason is not None:
            sw.alerts[alert] = reason
            if was:
                return []
            self.raised_ever += 1
            return [self._event(sw, alert, True, reason)]
        if not was:
            return []
        del sw.alerts[alert]
        return [self._event(sw, alert, False, "cleared")]

    # -- views -------------------------------------------------------------------------
    def fleet(self, now: float | None = None) -> WindowFigures:
        now = self.clock() if now is None else now
        with self.lock:
            return figures(fleet_sums(sw.window.sums(now) for sw in self.servers))

    def run(self, stop: threading.Event, until: float | None = None,
            on_events: Callable[[list[Event]], Any] | None = None) -> None:
        """Loop until ``stop`` is set or the clock passes ``until``."""
        while not stop.is_set() and (until is None or self.clock() < until):
            events = self.step()
            if on_events is not None:
                on_events(events)
            due = min((sw.next_read for sw in self.servers if sw.in_flight is None), default=self.clock() + 0.1)
            wait = max(0.01, due - self.clock())
            if until is not None:
                wait = min(wait, max(0.0, until - self.clock()))
            stop.wait(min(wait, self.settings.interval_s))

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


class ServerReadError(SpecadaptError):
    """A server answered its metrics route with something that is not its counters."""


__all__ = ["ALERTS", "FLEET", "CanaryStatus", "Event", "ServerWatch", "WatchSettings", "Watcher"]


@contextlib.contextmanager
def open_watch(targets: Sequence[tuple[str, str]], backend: str, settings: WatchSettings, api_key: str | None = None,
               verify: bool | Any = True, baseline: CostModel | None = None, baseline_name: str = "the baseline",
               golden: GoldenFile | None = None, canary_prompts: int = 4,
               warn: Callable[[str], Any] = lambda _text: None) -> Iterator[Watcher]:
    """Connect to every (name, url) through the backend and yield their Watcher; close all on exit.

    With a baseline, the servers that answer now are described first: a baseline of another
    model or method is refused (UsageError) before the watch; a server that does not answer yet
    is checked when it first does (``warn`` says so). With golden answers, canary rounds of
    ``canary_prompts`` prompts run every ``settings.canary_every_s``; a golden of another model
    (or max_model_len, dtype) than a server that answers now is refused the same way."""
    from specadapt.adapters.registry import get_backend
    from specadapt.errors import UsageError

    be = get_backend(backend)
    with contextlib.ExitStack() as stack:
        servers = []
        for name, url in targets:
            server = be.connect(url, api_key=api_key, verify=verify)
            stack.callback(server.close)
            servers.append((name, server))
        canary = canary_runner(golden, canary_prompts) if golden is not None else None
        w = Watcher(servers, settings, baseline=baseline, canary=canary)
        stack.callback(w.close)
        if baseline is not None or golden is not None:
            for sw in w.servers:
                try:
                    sw.info = sw.server.describe()
                except SpecadaptError as exc:
                    warn(f"{sw.name}: {exc}; it is checked against the baseline and golden answers when it answers")
                    continue
                problem = baseline_problem(baseline, sw.info.model_id, sw.info.spec_method) if baseline else None
                if problem:
                    raise UsageError(f"--baseline {baseline_name} cannot judge {sw.name} ({sw.url}): {problem}")
                if golden is not None:
                    try:
                        check_golden(sw.server, golden, sw.info)
                    except UsageError as exc:
                        raise UsageError(f"--golden cannot judge {sw.name} ({sw.url}): {exc}") from exc
        yield w


def canary_runner(golden: GoldenFile, max_prompts: int = 4) -> CanaryFn:
    """One canary round per call, rotating through the golden answers per server."""
    rounds: dict[str, int] = {}

    def run(server: Server) -> CanaryStatus:
        i = rounds[server.base_url] = rounds.get(server.base_url, -1) + 1
        r = run_canary_round(server, golden, max_prompts=max_prompts, round_index=i)
        return CanaryStatus(verdict=r.verdict, summary=round_summary(r), wall=r.finished_at)

    return run


def load_baseline(path) -> CostModel:
    """A compare or tune report as the cost model of its deployment (UsageError otherwise)."""
    from pathlib import Path

    from specadapt.analysis.watch import cost_model_from_compare, cost_model_from_tune
    from specadapt.errors import UsageError
    from specadapt.records import read_compare_report, report_kind
    from specadapt.records.reports import read_model
    from specadapt.records.tune import TuneReport

    path = Path(path)
    kind = report_kind(path)
    if kind == "compare":
        model = cost_model_from_compare(read_compare_report(path), source=f"compare report {path}")
    elif kind == "tune":
        model = cost_model_from_tune(read_model(path, TuneReport, "tune"), source=f"tune report {path}")
    elif not path.is_file():
        raise UsageError(f"--baseline {path} does not exist")
    else:
        raise UsageError(f"--baseline {path} is not a compare or tune report (kind: {kind or 'unreadable'}); "
                         "give the JSON that `specadapt compare --out` or `specadapt tune --out` wrote")
    if not model.levels:
        raise UsageError(f"--baseline {path} has no level with both a TPOT ratio and an acceptance length "
                         "(a report of a server without spec-decode counters?): it cannot give a cost model")
    return model

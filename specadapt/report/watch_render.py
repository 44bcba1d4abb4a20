"""The watcher for a person: a rich table per refresh, one line per alert event, and the end report."""

from __future__ import annotations

import dataclasses
import datetime as dt

from rich.table import Table

from specadapt import __version__
from specadapt.analysis.watch import WindowFigures
from specadapt.orchestration.watch import Event, ServerWatch, Watcher
from specadapt.records.watch import FLEET, WatchEvent, WatchReport, WatchServerSummary


def _num(x: float | None, fmt: str = "{:.3f}") -> str:
    return "-" if x is None else fmt.format(x)


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1000:.1f}"


def _row(name: str, f: WindowFigures, state: str, extra: list[str]) -> list[str]:
    return [name, state, _num(f.acceptance_rate), _num(f.mean_acceptance_length, "{:.2f}"),
            "/".join(f"{r:.2f}" for r in f.per_position_rate) or "-", _num(f.draft_tokens_per_s, "{:.0f}"),
            _num(f.running, "{:.1f}"), _ms(f.ttft_s), _ms(f.tpot_s), *extra]


def _state(sw: ServerWatch) -> str:
    if not sw.up:
        return "down" if sw.reads or sw.errors else "waiting"
    if sw.alerts:
        return "ALERT " + ", ".join(sorted(sw.alerts))
    return "learning" if sw.drift.learning else "ok"


def _drift(sw: ServerWatch) -> str:
    d = sw.drift
    if d.mu0 is None:
        return f"learning {len(d.learned)}/{d.s.learn_blocks}"
    return f"{d.statistic:.1f}/{d.h:.1f}"


def _speedup(sw: ServerWatch) -> str:
    e = sw.expectation
    if sw.baseline_refused:
        return "baseline refused"
    return "-" if e is None else f"{e.point:.2f}x [{e.low:.2f}, {e.high:.2f}]"


def status_table(w: Watcher) -> Table:
    """One row per server and one for the fleet: the window's figures and the alert states."""
    now = w.clock()
    t = Table(title=f"specadapt watch: window {w.settings.window_s:g} s, read every {w.settings.interval_s:g} s",
              title_justify="left")
    for col in ("server", "state", "accept", "length", "per position", "draft/s", "batch", "TTFT ms", "TPOT ms",
                "drift", "speedup", "canary"):
        t.add_column(col, no_wrap=col not in ("state", "speedup"))
    with w.lock:
        for sw in w.servers:
            canary = sw.canary.verdict if sw.canary else "-"
            t.add_row(*_row(sw.name, sw.figures(now), _state(sw), [_drift(sw), _speedup(sw), canary]))
        t.add_row(*_row(FLEET, w.fleet(now), "", ["", "", ""]))
    return t


def event_line(ev: Event) -> str:
    when = dt.datetime.fromtimestamp(ev.wall, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    if ev.alert == "restart":
        return f"{when} {ev.server}: {ev.text}"
    word = "ALERT" if ev.raised else "resolved"
    return f"{when} {word} {ev.alert} on {ev.server}: {ev.text}"


def status_lines(w: Watcher) -> list[str]:
    """The table's content as plain lines (logs of a pod: no terminal)."""
    now = w.clock()
    out = []
    with w.lock:
        for sw in w.servers:
            f = sw.figures(now)
            out.append(f"{sw.name}: {_state(sw)}; acceptance {_num(f.acceptance_rate)}, length "
                       f"{_num(f.mean_acceptance_length, '{:.2f}')}, batch {_num(f.running, '{:.1f}')}, drift "
                       f"{_drift(sw)}, expected speedup {_speedup(sw)}")
    return out


def _iso(wall: float) -> str:
    return dt.datetime.fromtimestamp(wall, dt.timezone.utc).isoformat(timespec="seconds")


def _plain(obj) -> dict | None:
    return None if obj is None else dataclasses.asdict(obj)


def watch_report(w: Watcher, started_wall: float, end_reason: str, baseline: str | None) -> WatchReport:
    now = w.clock()
    servers = []
    with w.lock:
        for sw in w.servers:
            d = sw.drift
            servers.append(WatchServerSummary(
                name=sw.name, url=sw.url, info=sw.info.model_dump(mode="json") if sw.info else None, reads=sw.reads,
                errors=sw.errors, restarts=sw.restarts, last_error=sw.last_error, spec_counters=sw.has_counters,
                figures=dataclasses.asdict(sw.figures(now)),
                drift={"reference": d.mu0, "sigma": d.sigma, "statistic": d.statistic, "h": d.h, "alarm": d.alarm,
                       "blocks": d.blocks, "skipped": d.skipped, "learned": len(d.learned)},
                expectation=_plain(sw.expectation), baseline_refused=sw.baseline_refused,
                canary_counts=dict(sw.canary_counts), alerts=dict(sw.alerts)))
        events = [WatchEvent(**dataclasses.asdict(e)) for e in w.events]
        fleet = dataclasses.asdict(w.fleet(now))
    s = w.settings
    return WatchReport(specadapt_version=__version__, started_at=_iso(started_wall), ended_at=_iso(w.wall()),
                       end_reason=end_reason, settings={**dataclasses.asdict(s)}, drift_h=s.drift.h,
                       drift_delay_s=s.drift.delay_s(), baseline=baseline, fleet=fleet, servers=servers,
                       events=events, alerts_raised=w.raised_ever)

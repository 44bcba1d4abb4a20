"""A saved watch report (`specadapt watch --out FILE`) rendered again: console and Markdown.

The live watcher has its own table (report/watch_render.py); this renders the end report, which
keeps each server's last window, its drift statistic, its alerts and the events of the watch.
"""

from __future__ import annotations

import datetime as dt

from rich.console import Console
from rich.table import Table
from rich.text import Text

from specadapt.records.watch import WatchEvent, WatchReport, WatchServerSummary

COLUMNS = ("server", "url", "reads", "errors", "restarts", "acceptance", "length", "drift", "alerts")


def _num(x, fmt: str = "{:.3f}") -> str:
    return "-" if x is None else fmt.format(x)


def _drift(s: WatchServerSummary) -> str:
    d = s.drift
    if d.get("reference") is None:
        return f"learning ({d.get('learned', 0)} blocks)" if d else "-"
    return f"{_num(d.get('statistic'), '{:.1f}')}/{_num(d.get('h'), '{:.1f}')}" + (" ALARM" if d.get("alarm") else "")


def server_row(s: WatchServerSummary) -> list[str]:
    """One row per server: reads, errors, restarts, the last window's acceptance and length, drift, alerts."""
    f = s.figures
    alerts = ", ".join(f"{name}: {why}" for name, why in s.alerts.items()) or "none"
    return [s.name, s.url, str(s.reads), str(s.errors), str(s.restarts), _num(f.get("acceptance_rate")),
            _num(f.get("mean_acceptance_length"), "{:.2f}"), _drift(s), alerts]


def event_text(ev: WatchEvent) -> str:
    when = dt.datetime.fromtimestamp(ev.wall, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    if ev.alert == "restart":
        return f"{when} {ev.server}: {ev.text}"
    return f"{when} {'ALERT' if ev.raised else 'resolved'} {ev.alert} on {ev.server}: {ev.text}"


def header_lines(report: WatchReport) -> list[str]:
    n = len(report.servers)
    return [f"watch of {n} server{'s' if n != 1 else ''} from {report.started_at} to {report.ended_at} "
            f"({report.end_reason}), specadapt {report.specadapt_version}",
            f"alerts raised during the watch: {report.alerts_raised}"
            + (f"; baseline {report.baseline}" if report.baseline else "")]


def render_console(report: WatchReport, console: Console) -> None:
    for line in header_lines(report):
        console.print(Text(line), soft_wrap=True)
    table = Table(title="servers at the end of the watch")
    for col in COLUMNS:
        table.add_column(col, overflow="fold")
    for s in report.servers:
        table.add_row(*(Text(cell) for cell in server_row(s)))
    console.print(table)
    for ev in report.events:
        console.print(Text(event_text(ev)), soft_wrap=True)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def to_markdown(report: WatchReport) -> str:
    out = ["## specadapt watch", ""] + [f"- {_cell(line)}" for line in header_lines(report)]
    out += ["", "| " + " | ".join(COLUMNS) + " |", "|" + " --- |" * len(COLUMNS)]
    out += ["| " + " | ".join(map(_cell, server_row(s))) + " |" for s in report.servers]
    if report.events:
        out += ["", "### Events", ""] + [f"- {_cell(event_text(ev))}" for ev in report.events]
    return "\n".join(out) + "\n"

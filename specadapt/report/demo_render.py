"""Renderers of a demo report: console, Markdown, one self-contained HTML page, JUnit XML, JSON.

Each run is a compare report and is rendered by the compare renderers under a heading of its
own; the demo adds what each run is there to show, its diagnosis where the report has one,
and a closing block: per run the headline (was the response faster and by how much, was the
text the same; analysis/headline.py), the speed ratios with their intervals and why they
disagree where they do, the diagnosis headline, then the machine and dtype the figures belong to.
"""

from __future__ import annotations

from pathlib import Path

from junitparser import JUnitXml, Skipped, TestCase, TestSuite
from rich.console import Console
from rich.markup import escape

from specadapt.analysis.headline import headline
from specadapt.records.demo import DemoReport, DemoRun
from specadapt.records.reports import atomic_write_text
from specadapt.report import compare_render
from specadapt.report.compare_render import ci, junit_text, level_verdict
from specadapt.report.hardware import hardware_text
from specadapt.report.html import STYLE, compare_body_html, environment

MACHINE_NOTE = ("These figures belong to this machine: its CPU model, instruction set and the dtype decide what "
                "a verify pass costs against a plain decode step (bfloat16 without AVX512-BF16 or AMX is "
                "emulated, and slow), so another machine gives other ratios.")
FILES = {"json": "report.json", "markdown": "summary.md", "html": "report.html", "junit": "junit.xml"}


def identity_counts(run: DemoRun) -> str:
    c = run.compare.counts
    return (f"{c.get('identical', 0)} identical, {c.get('near-tie', 0)} near-tie, {c.get('suspect', 0)} suspect, "
            f"{c.get('unknown', 0)} unknown (of {len(run.compare.identity)} prompts)")


def speed_text(run: DemoRun) -> str:
    """``TPOT 1.42x [1.20, 1.68], tokens/s 1.38x [1.15, 1.64]: faster`` at the first level."""
    report = run.compare
    if not report.levels:
        return "no pairs measured"
    lv = report.levels[0]
    return f"TPOT {ci(lv.speed.tpot)}, tokens/s {ci(lv.speed.throughput)}: {level_verdict(report, lv)}"


def lead_text(run: DemoRun) -> str:
    """What the lesson asks first: was the response faster (by how much), was the text the same; then the
    speed figures, and why they disagree where they do."""
    h = headline(run.compare)
    if h is None:
        return "no pairs measured"
    return (f"{h.response}; {h.text}. {h.figures}"
            + (f" (they disagree: {h.why_not})" if h.why_not else ""))


def run_line(run: DemoRun) -> str:
    """One line per run for the closing block."""
    d = run.compare.diagnosis
    return (f"{run.name}: {lead_text(run)}"
            + (f"; diagnosis: {d.headline}" if d is not None else ""))


def machine_line(report: DemoReport) -> str:
    return f"machine: {hardware_text(report.hardware)}; dtype {report.dtype} ({report.dtype_reason})"


def timing_line(report: DemoReport) -> str:
    t = report.timings
    runs = ", ".join(f"run {i} ({name}) {s:.0f} s" for i, (name, s) in enumerate(t.runs_s.items(), 1))
    return (f"time: draft {t.draft_s:.0f} s, servers {t.servers_s:.0f} s" + (f", {runs}" if runs else "")
            + f", total {t.total_s:.0f} s")


def closing_lines(report: DemoReport) -> list[str]:
    return [run_line(run) for run in report.runs] + [machine_line(report), MACHINE_NOTE]


# --- console -------------------------------------------------------------------------------------
def render_console(report: DemoReport, console: Console, timing: bool = True) -> None:
    """Each run under a rule of its own, then the closing block (``timing``: with where the time went)."""
    for i, run in enumerate(report.runs, 1):
        console.rule(f"[bold]run {i} of {len(report.runs)}: {escape(run.title)}[/]")
        console.print(f"draft: {escape(run.draft)}")
        console.print(f"what it should show: {escape(run.lesson)}")
        compare_render.render_console(run.compare, console)  # with its why section
    console.rule("[bold]what this run shows[/]")
    for line in closing_lines(report):
        console.print(escape(line))
    for note in report.notes:
        console.print(f"note: {escape(note)}")
    if timing:
        console.print(escape(timing_line(report)))


# --- Markdown ------------------------------------------------------------------------------------
def _demote(markdown: str, by: int) -> str:
    """Headings of an embedded Markdown document ``by`` levels lower."""
    return "\n".join("#" * by + ln if ln.startswith("#") else ln for ln in markdown.splitlines()) + "\n"


def to_markdown(report: DemoReport) -> str:
    out = ["# specadapt demo: speculative decoding on this machine", "", machine_line(report) + ".", "",
           "## What the runs show", ""]
    out += [f"- {line}" for line in (run_line(run) for run in report.runs)]
    out += ["", MACHINE_NOTE, ""]
    for i, run in enumerate(report.runs, 1):
        out += [f"## Run {i}: {run.title}", "", f"Draft: {run.draft}.", "", f"What it should show: {run.lesson}.", ""]
        out.append(_demote(compare_render.to_markdown(run.compare), 1))
    out += [f"- note: {n}" for n in report.notes]
    out += ["", timing_line(report) + "."]
    return "\n".join(out) + "\n"


# --- HTML ----------------------------------------------------------------------------------------
PAGE = """{% extends "base.html" %}
{% block title %}specadapt demo: {{ d.model }}{% endblock %}
{% block style %}""" + STYLE + """{% endblock %}
{% block body %}<h1>specadapt demo: speculative decoding on this machine</h1>
<p>{{ machine }}. Model {{ d.model }}; prompts {{ d.prompts|join(", ") }}; created {{ d.created_at }} by specadapt
{{ d.specadapt_version }}.</p>
<h2>What the runs show</h2>
<table><tr><th>run</th><th>draft</th><th>what it did, at concurrency 1</th><th>identity</th><th>diagnosis</th></tr>
{% for run in d.runs %}<tr><td>{{ run.name }}</td><td>{{ run.draft }}</td><td>{{ lead_text(run) }}</td>
<td>{{ identity_counts(run) }}</td><td>{{ run.compare.diagnosis.headline if run.compare.diagnosis else "-" }}</td></tr>{% endfor %}
</table>
<p>{{ machine_note }}</p>
{% for run in d.runs %}<h2>Run {{ loop.index }}: {{ run.title }}</h2>
<p>Draft: {{ run.draft }}.<br>What it should show: {{ run.lesson }}.</p>
{{ bodies[loop.index0] }}
{% endfor %}
{% if d.notes %}<h2>Notes</h2><ul>{% for n in d.notes %}<li>{{ n }}</li>{% endfor %}</ul>{% endif %}
<p>{{ timing }}.</p>{% endblock %}
"""
"""The demo's page (report/page.py's base): the closing block first, then each run's compare body."""


def to_html(report: DemoReport) -> str:
    env = environment(**{"demo.html": PAGE})
    env.globals.update(speed_text=speed_text, identity_counts=identity_counts, lead_text=lead_text)
    bodies = [compare_body_html(run.compare, top=3) for run in report.runs]
    return env.get_template("demo.html").render(d=report, bodies=bodies, machine=machine_line(report),
                                                machine_note=MACHINE_NOTE, timing=timing_line(report))


# --- JUnit ---------------------------------------------------------------------------------------
def to_junit(report: DemoReport) -> str:
    """One suite per run; its identity testcases with classnames ``<run>.identity.<category>``."""
    xml = JUnitXml()
    for run in report.runs:
        suite = TestSuite(f"specadapt.demo.{run.name}")
        for case in compare_render.identity_cases(run.compare, classname=f"{run.name}.identity"):
            suite.add_testcase(case)
        if not run.compare.identity:
            case = TestCase("identity", classname=f"{run.name}.identity")
            case.result = [Skipped("no prompt pair succeeded on both servers")]
            suite.add_testcase(case)
        xml.add_testsuite(suite)
    return junit_text(xml)


def write_demo_outputs(report: DemoReport, out_dir: Path | None = None, json_path: Path | None = None,
                       junit_path: Path | None = None, markdown_path: Path | None = None,
                       html_path: Path | None = None) -> list[Path]:
    """Every format asked for; ``out_dir`` asks for all four under their usual names."""
    if out_dir is not None:
        out_dir = Path(out_dir)
        json_path = json_path or out_dir / FILES["json"]
        junit_path = junit_path or out_dir / FILES["junit"]
        markdown_path = markdown_path or out_dir / FILES["markdown"]
        html_path = html_path or out_dir / FILES["html"]
    written = []
    for path, render in ((json_path, lambda: report.model_dump_json(indent=2)), (junit_path, lambda: to_junit(report)),
                         (markdown_path, lambda: to_markdown(report)), (html_path, lambda: to_html(report))):
        if path:
            atomic_write_text(path, render())
            written.append(path)
    return written

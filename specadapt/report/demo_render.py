"""Renderers of a demo report: console, Markdown, one self-contained HTML page, JUnit XML, JSON.

Each run is a compare report and is rendered by the compare renderers under a heading of its
own; the demo adds what each run is there to show, its diagnosis where the report has one,
and a closing block: per run the headline (was the response faster and by how much, was the
text the same; analysis/headline.py), the speed ratios with their intervals and why they
disagree where they do, the diagnosis headline, and, where the run stopped once decided, the requests it sent
against the fixed design's and the share saved; then the machine and dtype the figures belong to.

The lesson, pass by pass: the answers each run names (``DemoRun.shown_prompts``: the lesson's
example and one grounded prompt) drawn pass by pass for every run side by side (each pass: the
draft tokens the target accepted, then its own token; report/passes_render.py draws them), read
from the run's ``speculation`` section (analysis/passes.py): the first spec-on answer of each
prompt whose passes are known, else why none is drawn.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from junitparser import JUnitXml, Skipped, TestCase, TestSuite
from markupsafe import Markup
from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape
from rich.text import Text

from specadapt.analysis.headline import headline
from specadapt.analysis.passes import first_answer
from specadapt.analysis.sections import section_data
from specadapt.records import RequestRecord
from specadapt.records.demo import DemoReport, DemoRun
from specadapt.records.passes import RequestPasses, SpeculationSeen
from specadapt.records.reports import atomic_write_text
from specadapt.report import compare_render, passes_render
from specadapt.report.compare_render import all_levels, ci, junit_text, level_verdict
from specadapt.report.hardware import hardware_text
from specadapt.report.html import STYLE, compare_body_html, environment
from specadapt.report.passes_render import BOXES, HELPERS, answer_text, pass_tokens

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


def requests_used(run: DemoRun) -> tuple[int, int] | None:
    """(requests the run sent, requests the fixed design would have sent) over its levels where the rule ran
    and the fixed design's count is known; None for a run of the fixed design."""
    outs = [lv.sequential for lv in all_levels(run.compare)
            if lv.sequential is not None and lv.sequential.fixed_requests is not None]
    if run.compare.settings.sequential is None or not outs:
        return None
    return sum(o.requests for o in outs), sum(o.fixed_requests for o in outs)


def saved_text(used: int, fixed: int) -> str:
    """``12 requests against 20 for the fixed design (40% saved)``."""
    share = max(fixed - used, 0) / fixed if fixed else 0.0
    return f"{used} requests against {fixed} for the fixed design ({share:.0%} saved)"


def saving_text(run: DemoRun) -> str | None:
    """The run's requests against the fixed design's and the share saved; None for a fixed-design run."""
    used = requests_used(run)
    return None if used is None else saved_text(*used)


def total_saving_line(report: DemoReport) -> str | None:
    """All runs' requests against the fixed design's, where any run stopped by the rule."""
    used = [u for u in (requests_used(run) for run in report.runs) if u is not None]
    if not used:
        return None
    return "run until decided: " + saved_text(sum(u for u, _ in used), sum(f for _, f in used)) + " in all"


def run_line(run: DemoRun) -> str:
    """One line per run for the closing block."""
    d = run.compare.diagnosis
    saving = saving_text(run)
    return (f"{run.name}: {lead_text(run)}"
            + (f"; {saving}" if saving else "")
            + (f"; diagnosis: {d.headline}" if d is not None else ""))


def machine_line(report: DemoReport) -> str:
    return f"machine: {hardware_text(report.hardware)}; dtype {report.dtype} ({report.dtype_reason})"


def timing_line(report: DemoReport) -> str:
    t = report.timings
    runs = ", ".join(f"run {i} ({name}) {s:.0f} s" for i, (name, s) in enumerate(t.runs_s.items(), 1))
    return (f"time: draft {t.draft_s:.0f} s, servers {t.servers_s:.0f} s" + (f", {runs}" if runs else "")
            + f", total {t.total_s:.0f} s")


def closing_lines(report: DemoReport) -> list[str]:
    total = total_saving_line(report)
    return [run_line(run) for run in report.runs] + ([total] if total else []) + [machine_line(report), MACHINE_NOTE]


# --- the lesson, pass by pass --------------------------------------------------------------------
LESSON_HEADING = "The lesson, pass by pass"
LESSON = "Each box is one pass of the target: the draft's tokens it accepted, then one token of its own."
LESSON_TEXT = ("Each [ ] is one pass of the target: the draft's tokens it accepted, then, after the bar, one "
               "token of its own.")
"""The lesson's sentence where the passes are bracketed (console and Markdown), not boxed."""
LESSON_READ = ("Where the draft is well matched, one pass gives several tokens; where it is poorly matched, "
               "about one.")


@dataclass(frozen=True)
class ShownAnswer:
    """One run's answer to one of the prompts the demo draws, or why there is none."""

    run: DemoRun
    prompt_id: str
    answer: RequestPasses | None = None
    record: RequestRecord | None = None
    why: str = ""


def speculation(run: DemoRun) -> tuple[SpeculationSeen | None, str]:
    """The run's ``speculation`` section read back, or None and why."""
    try:
        seen = section_data(run.compare, "speculation")
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        return None, f"this run's speculation section does not read: {where}: {first['msg']}"
    if not isinstance(seen, SpeculationSeen):
        return None, "this run's report has no speculation per request"
    return seen, ""


def shown_answer(run: DemoRun, prompt_id: str) -> ShownAnswer:
    """The run's first spec-on answer of ``prompt_id`` whose passes are known (else its first answer,
    drawn as counts), from the run's speculation section; or why there is none."""
    seen, why = speculation(run)
    if seen is None:
        return ShownAnswer(run, prompt_id, why=why)
    if not seen.available:
        return ShownAnswer(run, prompt_id, why=seen.source_note or "per-request acceptance not available")
    a = first_answer(seen, prompt_id)  # the one the compare read back in words (CompareSettings.draw_prompts)
    if a is None:
        return ShownAnswer(run, prompt_id, why=f"no spec-on answer of {prompt_id} was read")
    requests = run.compare.requests
    record = requests[a.index] if 0 <= a.index < len(requests) else None
    return ShownAnswer(run, prompt_id, a, record)


def shown_prompts(report: DemoReport) -> list[str]:
    """The prompts any run names to draw, in the order the runs name them."""
    return list(dict.fromkeys(p for run in report.runs for p in run.shown_prompts))


def lesson_rows(report: DemoReport) -> list[tuple[str, list[ShownAnswer]]]:
    """Per prompt to draw: each run's answer (or why none), in run order."""
    return [(p, [shown_answer(run, p) for run in report.runs]) for p in shown_prompts(report)]


def shown_text(s: ShownAnswer, width: int = 80) -> Text:
    """The answer in the console's compact form (report/passes_render.py), or why there is none."""
    if s.answer is None:
        return Text(f"{s.prompt_id}: not drawn: {s.why}")
    record = s.record or RequestRecord(prompt_id=s.answer.prompt_id, category=s.answer.category, api="completions")
    return answer_text(record, s.answer, width)


def run_label(i: int, run: DemoRun) -> str:
    return f"run {i} ({run.name}): {run.draft}"


def render_lesson(report: DemoReport, console: Console) -> None:
    """Each prompt to draw, each run's answer pass by pass under it (nothing when no run names one)."""
    rows = lesson_rows(report)
    if not rows:
        return
    console.rule(f"[bold]{LESSON_HEADING.lower()}[/]")
    console.print(Text(f"{LESSON_TEXT} {LESSON_READ}"))
    width = min(console.width or 80, 80)
    for _prompt, answers in rows:
        for i, s in enumerate(answers, 1):
            console.print()
            console.print(Text(run_label(i, s.run), style="bold"))
            console.print(shown_text(s, width), soft_wrap=True)


# --- console -------------------------------------------------------------------------------------
def render_console(report: DemoReport, console: Console, timing: bool = True) -> None:
    """Each run under a rule of its own, the lesson pass by pass, then the closing block (``timing``:
    with where the time went)."""
    for i, run in enumerate(report.runs, 1):
        console.rule(f"[bold]run {i} of {len(report.runs)}: {escape(run.title)}[/]")
        console.print(f"draft: {escape(run.draft)}")
        console.print(f"what it should show: {escape(run.lesson)}")
        compare_render.render_console(run.compare, console)  # with its why section
    render_lesson(report, console)
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


def _fenced(body: str) -> list[str]:
    """``body`` in a code fence longer than any run of backticks in it."""
    longest, run = 0, 0
    for ch in body:
        run = run + 1 if ch == "`" else 0
        longest = max(longest, run)
    fence = "`" * max(3, longest + 1)
    return [fence, body, fence]


def lesson_markdown(report: DemoReport) -> list[str]:
    """The lesson pass by pass: per prompt to draw, each run's answer as plain text, its passes bracketed."""
    rows = lesson_rows(report)
    if not rows:
        return []
    out = [f"## {LESSON_HEADING}", "", f"{LESSON_TEXT} {LESSON_READ}", ""]
    for _prompt, answers in rows:
        for i, s in enumerate(answers, 1):
            out += [f"Run {i} ({s.run.name}): {s.run.draft}.", ""]
            out += [*_fenced(shown_text(s).plain), ""]
    return out


def to_markdown(report: DemoReport) -> str:
    out = ["# specadapt demo: speculative decoding on this machine", "", machine_line(report) + ".", "",
           "## What the runs show", ""]
    out += [f"- {line}" for line in (run_line(run) for run in report.runs)]
    total = total_saving_line(report)
    out += ["", total + "."] if total else []
    out += ["", MACHINE_NOTE, ""]
    out += lesson_markdown(report)
    for i, run in enumerate(report.runs, 1):
        out += [f"## Run {i}: {run.title}", "", f"Draft: {run.draft}.", "", f"What it should show: {run.lesson}.", ""]
        out.append(_demote(compare_render.to_markdown(run.compare), 1))
    out += [f"- note: {n}" for n in report.notes]
    out += ["", timing_line(report) + "."]
    return "\n".join(out) + "\n"


# --- HTML ----------------------------------------------------------------------------------------
LESSON_STYLE = """.lesson table.side-by-side { table-layout: fixed; width: 100%; }
.lesson table.side-by-side td, .lesson table.side-by-side th { vertical-align: top; text-align: left; }
.lesson .passes { white-space: normal; } .lesson .why { color: #555; }"""

PAGE = """{% extends "base.html" %}
{% block title %}specadapt demo: {{ d.model }}{% endblock %}
{% block style %}""" + STYLE + "\n" + passes_render.STYLE + "\n" + LESSON_STYLE + """{% endblock %}
{% block body %}<h1>specadapt demo: speculative decoding on this machine</h1>
<p>{{ machine }}. Model {{ d.model }}; prompts {{ d.prompts|join(", ") }}; created {{ d.created_at }} by specadapt
{{ d.specadapt_version }}.</p>
<h2>What the runs show</h2>
<table><tr><th>run</th><th>draft</th><th>what it did, at concurrency 1</th><th>identity</th><th>diagnosis</th>
{%- if total_saving %}<th>requests</th>{% endif %}</tr>
{% for run in d.runs %}<tr><td>{{ run.name }}</td><td>{{ run.draft }}</td><td>{{ lead_text(run) }}</td>
<td>{{ identity_counts(run) }}</td><td>{{ run.compare.diagnosis.headline if run.compare.diagnosis else "-" }}</td>
{%- if total_saving %}<td class="saving">{{ saving_text(run) or "fixed design" }}</td>{% endif %}</tr>{% endfor %}
</table>{% if total_saving %}
<p class="saving">{{ total_saving }}.</p>{% endif %}
<p>{{ machine_note }}</p>
{% if lesson %}<section class="speculation lesson"><h2>{{ lesson_heading }}</h2>
<p class="legend"><span class="pass"><span class="tok draft">accepted draft tokens</span><span class="tok own">the target's own token</span></span>
{{ lesson_sentence }} {{ lesson_read }} The dashed box is the first pass, which checks no draft; hover a box for
its draft length; ↵ is a line break.</p>
<table class="side-by-side"><tr>{% for run in d.runs %}<th>Run {{ loop.index }} ({{ run.name }}): {{ run.draft }}</th>{% endfor %}</tr>
{% for prompt, answers in lesson %}<tr>{% for s in answers %}<td>{{ answer_html(s) }}</td>{% endfor %}</tr>
{% endfor %}</table></section>{% endif %}
{% for run in d.runs %}<h2>Run {{ loop.index }}: {{ run.title }}</h2>
<p>Draft: {{ run.draft }}.<br>What it should show: {{ run.lesson }}.</p>
{{ bodies[loop.index0] }}
{% endfor %}
{% if d.notes %}<h2>Notes</h2><ul>{% for n in d.notes %}<li>{{ n }}</li>{% endfor %}</ul>{% endif %}
<p>{{ timing }}.</p>{% endblock %}
"""
"""The demo's page (report/page.py's base): the closing block first, then each run's compare body."""


ANSWER = """{% if s.answer is none %}<div class="answer missing" data-run="{{ s.run.name }}" data-prompt="{{ s.prompt_id }}">
<p class="caption">{{ s.prompt_id }}</p><p class="why">not drawn: {{ s.why }}</p></div>
{% else %}{% set a = s.answer %}<div class="answer" data-run="{{ s.run.name }}" data-prompt="{{ a.prompt_id }}">
<p class="caption">{{ a.prompt_id }} ({{ a.category }}): <span class="tokens-in-passes">{{ tokens_in_passes(a) }}</span></p>
{% include "pass_boxes.html" %}</div>{% endif %}"""
"""One run's answer drawn pass by pass: the boxes of report/passes_render.py (``BOXES``)."""


def to_html(report: DemoReport) -> str:
    env = environment(**{"demo.html": PAGE, "demo_answer.html": ANSWER, "pass_boxes.html": BOXES})
    env.globals.update(speed_text=speed_text, identity_counts=identity_counts, lead_text=lead_text,
                       saving_text=saving_text, **HELPERS)
    answer_t = env.get_template("demo_answer.html")

    def answer_html(s: ShownAnswer) -> Markup:
        cut = pass_tokens(s.record, s.answer) if s.answer is not None else None
        return Markup(answer_t.render(s=s, cut=cut))

    env.globals["answer_html"] = answer_html
    bodies = [compare_body_html(run.compare, top=3) for run in report.runs]
    return env.get_template("demo.html").render(d=report, bodies=bodies, machine=machine_line(report),
                                                machine_note=MACHINE_NOTE, timing=timing_line(report),
                                                lesson=lesson_rows(report), lesson_heading=LESSON_HEADING,
                                                lesson_sentence=LESSON, lesson_read=LESSON_READ,
                                                total_saving=total_saving_line(report))


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

"""Renderers of the compare report's sections: a fixed table, ``VIEWS`` (the analyses' side is
analysis/sections.py, a layer below; the kinds of whole reports are report/kinds.py).

A ``SectionView`` renders one section in the console, Markdown and HTML forms of a compare
report, from the section's model: by default the one its analysis left in
``report.sections[name]``, read back with the model of the analysis section of that name;
``data`` reads it from elsewhere (the diagnosis, a field of the report of its own). Each form
may be left out. The compare renderers show the sections where the diagnosis stands: after
the speed, load and per-prompt tables, before identity; in the order of ``VIEWS``. JUnit
carries none of them (its cases are identity and the gate).

A report without a section's data (the analysis had nothing to say, failed, or is not known
here) shows nothing for it. A renderer that raises, or saved data that no longer fits its
model, shows one line instead ("the NAME section could not be shown: ..."), and the rest
of the report is rendered as usual.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from markupsafe import Markup, escape
from pydantic import BaseModel
from rich.console import Console
from rich.text import Text

from specadapt.analysis.interference import duration
from specadapt.analysis.sections import one_line, section_data
from specadapt.records import CompareReport
from specadapt.records.diagnosis import Diagnosis
from specadapt.records.interference import InterferenceFinding, SideStalls
from specadapt.records.passes import SpeculationSeen
from specadapt.report.diagnosis_render import diagnosis_html, diagnosis_markdown, machine_line, render_diagnosis
from specadapt.report.passes_render import passes_html, passes_markdown, render_passes

ConsoleRenderer = Callable[[BaseModel, CompareReport, Console], None]
"""Prints the section (its model, the whole report for context) on the console."""
MarkdownRenderer = Callable[[BaseModel, CompareReport], list[str]]
"""The section's Markdown lines (the compare summary's own headings are ##, a section's ###)."""
HtmlRenderer = Callable[[BaseModel, CompareReport, int], str]
"""The section's HTML (escaped by the renderer), its heading an h<the int given>."""


@dataclass(frozen=True)
class SectionView:
    name: str
    console: ConsoleRenderer | None = None
    markdown: MarkdownRenderer | None = None
    html: HtmlRenderer | None = None
    data: Callable[[CompareReport], BaseModel | None] | None = None

    def model(self, report: CompareReport) -> BaseModel | None:
        return self.data(report) if self.data is not None else section_data(report, self.name)


# ------------------------------------------------------------------------------- the diagnosis

def _machine(report: CompareReport) -> str:
    return machine_line(report.on_server, report.settings.dtype)


def _diagnosis_console(d: Diagnosis, report: CompareReport, console: Console) -> None:
    render_diagnosis(d, console, _machine(report))


def _diagnosis_markdown(d: Diagnosis, report: CompareReport) -> list[str]:
    return diagnosis_markdown(d, _machine(report))


def _diagnosis_html(d: Diagnosis, report: CompareReport, heading: int) -> str:
    return diagnosis_html(d, _machine(report), heading)


DIAGNOSIS = SectionView("diagnosis", console=_diagnosis_console, markdown=_diagnosis_markdown,
                        html=_diagnosis_html, data=lambda report: report.diagnosis)
"""Why spec on was faster or slower: computed by the compare runner itself (it needs the draft's
cost, read from the models' configs) into ``report.diagnosis``."""

# ----------------------------------------------------------------------------- the interference

def shown(f: InterferenceFinding) -> bool:
    """Worth a line: something stalled, the order was judged, or it could not be for too few requests."""
    return f.stalls > 0 or f.order != "not judged" or any(s.bimodal for lv in f.levels for s in lv.sides)


def side_line(s: SideStalls) -> str:
    """'on: typical 150 ms; 4 of 8 first tokens stalled, about 1.0 s (4 right after the other side's
    request, 0 after its own)'."""
    head = f"{s.side}: typical {duration(s.typical_ms)}" if s.typical_ms is not None else f"{s.side}: no first token"
    if not s.stalls:
        return head + f"; none of {s.n} first tokens stalled"
    return (head + f"; {s.stalls} of {s.n} first tokens stalled, about {duration(s.stall_ms)} "
                   f"({s.stalls_after_other} right after the other side's request, {s.stalls_after_same} after its own)")


def interference_lines(report: CompareReport) -> list[tuple[str, list[str]]]:
    """(the finding's line, its sides' lines where something stalled): the check's before the run
    (always, when it ran), then the run's own (when worth a line)."""
    out: list[tuple[str, list[str]]] = []
    run = section_data(report, "interference")
    for f, label in ((report.interference_check, "the check before the run"), (run, "the run")):
        if f is None or (f.source == "run" and not shown(f)):
            continue
        host = f"; {f.host}" if f.host else ""
        out.append((f"{label}: {f.text}{host}", [side_line(s) for s in f.sides] if f.stalls else []))
    return out


def _interference_data(report: CompareReport) -> BaseModel | None:
    """Something to show: the run's finding or the check's (the lines read both from the report)."""
    return report.interference_check or section_data(report, "interference")


def _interference_console(_: BaseModel, report: CompareReport, console: Console) -> None:
    for line, sides in interference_lines(report):
        console.print(Text("interference, ", style="bold") + Text(line))
        for side in sides:
            console.print(Text(f"  {side}"))


def _interference_markdown(_: BaseModel, report: CompareReport) -> list[str]:
    lines = interference_lines(report)
    if not lines:
        return []
    out = ["", "### Interference between the sides", ""]
    for line, sides in lines:
        out += [f"- {line}"] + [f"  - {side}" for side in sides]
    return out


def _interference_html(_: BaseModel, report: CompareReport, heading: int) -> str:
    lines = interference_lines(report)
    if not lines:
        return ""
    items = "".join(f"<li>{escape(line)}" + ("<ul>" + "".join(f"<li>{escape(s)}</li>" for s in sides) + "</ul>"
                                              if sides else "") + "</li>" for line, sides in lines)
    return f'<h{heading}>Interference between the sides</h{heading}><ul class="interference">{items}</ul>'


INTERFERENCE = SectionView("interference", console=_interference_console, markdown=_interference_markdown,
                           html=_interference_html, data=_interference_data)
"""Did the servers stall each other's first token: the run's own finding (the ``interference``
section) and the check's before the run (``report.interference_check``)."""

# ----------------------------------------------------------------------------- the speculation seen

def _speculation_console(seen: SpeculationSeen, report: CompareReport, console: Console) -> None:
    render_passes(seen, report.requests, console, title="spec-on speculation")


def _speculation_markdown(seen: SpeculationSeen, report: CompareReport) -> list[str]:
    return passes_markdown(seen, report.requests)


def _speculation_html(seen: SpeculationSeen, report: CompareReport, heading: int) -> str:
    return passes_html(seen, report.requests, heading)


SPECULATION = SectionView("speculation", console=_speculation_console, markdown=_speculation_markdown,
                          html=_speculation_html)
"""Speculation per request and per pass of the spec-on answers (the ``speculation`` section):
figures per category and prompt, the checks against the counters, chosen answers pass by pass."""

VIEWS: tuple[SectionView, ...] = (INTERFERENCE, SPECULATION, DIAGNOSIS)
"""The views every compare report renders, in this order."""


def _failed(view: SectionView, exc: Exception) -> str:
    return f"the {view.name} section could not be shown: {one_line(exc)}"


def render_sections(report: CompareReport, console: Console) -> None:
    """Every section the report has, on the console."""
    for view in VIEWS:
        if view.console is None:
            continue
        try:
            data = view.model(report)
            if data is not None:
                view.console(data, report, console)
        except Exception as exc:  # one section must not stop the report
            console.print(Text(_failed(view, exc)))


def sections_markdown(report: CompareReport) -> list[str]:
    """Every section the report has, as Markdown lines."""
    out: list[str] = []
    for view in VIEWS:
        if view.markdown is None:
            continue
        try:
            data = view.model(report)
            if data is not None:
                out += view.markdown(data, report)
        except Exception as exc:
            out += ["", f"- {_failed(view, exc)}"]
    return out


def sections_html(report: CompareReport, heading: int) -> Markup:
    """Every section the report has, as HTML, headings h``heading``."""
    parts: list[str] = []
    for view in VIEWS:
        if view.html is None:
            continue
        try:
            data = view.model(report)
            if data is not None:
                parts.append(str(view.html(data, report, heading)))
        except Exception as exc:
            parts.append(f"<p>{escape(_failed(view, exc))}</p>")
    return Markup("".join(parts))


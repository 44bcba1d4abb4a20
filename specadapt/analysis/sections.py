"""Sections of the compare report that analyses add: a fixed table, ``SECTIONS``.

A section is one pure analysis of a finished compare report: ``analyse(report)`` returns an
instance of the section's pydantic ``model``, or None when it has nothing to say about this
report. The compare runner (orchestration/compare.py) calls ``analyse_sections`` twice: once
after identity for the sections marked ``before_diagnosis`` (the notes and the diagnosis read
them from ``report.sections``), once after the notes and the diagnosis for the others, so an
analysis sees all of those. Each result is kept as JSON in ``report.sections[name]``: a saved
report reads back, and renders, without rerunning anything. Its renderers (console, Markdown,
HTML) are the view of the same name in report/sections.py, a layer above the runner; the kinds
of whole reports and their renderers are report/kinds.py.

An analysis that raises does not lose the report: its section is left out and the report
gets one note, "the NAME section failed and is left out: ErrorType: first line of the
message"; the other sections are still computed.

Adding one: a module in this package with the model and the pure ``analyse``, one entry in
``SECTIONS`` below (its order is the order the reports show them in) and its view in
report/sections.py ``VIEWS``. The first, ``interference``, says whether the two servers stalled
each other's first token (analysis/interference.py); the diagnosis and the notes read it, so it
comes before them. The diagnosis is not one of them: the runner computes it itself, since it
needs the draft's cost, which it reads from the models' configs; it has a view only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pydantic import BaseModel

from specadapt.analysis.interference import report_interference
from specadapt.analysis.passes import compare_speculation
from specadapt.records import CompareReport
from specadapt.records.interference import InterferenceFinding
from specadapt.records.passes import SpeculationSeen


@dataclass(frozen=True)
class Section:
    """One analysis of the compare report. ``name``: the key in ``report.sections`` (and of its
    renderers); ``model``: the type ``analyse`` returns, which reads the saved JSON back."""

    name: str
    model: type[BaseModel]
    analyse: Callable[[CompareReport], BaseModel | None]
    before_diagnosis: bool = False
    """Analysed before the notes and the diagnosis (which may read it), not after them."""


INTERFERENCE = Section("interference", InterferenceFinding, report_interference, before_diagnosis=True)
"""Did the servers stall each other's first token (analysis/interference.py)?"""

SPECULATION = Section("speculation", SpeculationSeen, compare_speculation, before_diagnosis=True)
"""Speculation per request and per pass of the spec-on answers (analysis/passes.py); the diagnosis
names the prompts and categories where drafts land from it."""

SECTIONS: tuple[Section, ...] = (INTERFERENCE, SPECULATION)
"""The sections every compare report gets, in the order the reports show them."""


def section(name: str) -> Section | None:
    return next((s for s in SECTIONS if s.name == name), None)


def one_line(exc: BaseException) -> str:
    """'ValueError: the first line of its message' (the type alone when the message is empty)."""
    lines = str(exc).strip().splitlines()
    return type(exc).__name__ + (f": {lines[0]}" if lines else "")


def analyse_sections(report: CompareReport, before_diagnosis: bool | None = None) -> CompareReport:
    """Run the analyses of ``SECTIONS`` on ``report`` and keep each result in ``report.sections`` (JSON):
    all of them, or with ``before_diagnosis`` True / False those marked so / not; a section whose
    analysis raises, or returns something other than its model, is left out with one note saying why."""
    for s in SECTIONS:
        if before_diagnosis is not None and s.before_diagnosis != before_diagnosis:
            continue
        try:
            result = s.analyse(report)
            if result is not None and not isinstance(result, s.model):
                raise TypeError(f"analyse returned {type(result).__name__}, not {s.model.__name__}")
        except Exception as exc:  # one analysis must not lose the report or the other sections
            report.notes.append(f"the {s.name} section failed and is left out: {one_line(exc)}")
            continue
        if result is not None:
            report.sections[s.name] = result.model_dump(mode="json")
    return report


def section_data(report: CompareReport, name: str) -> BaseModel | None:
    """The section ``name`` of a report read back as its model; None when the report has no such
    section or no section of ``SECTIONS`` knows its model. ValidationError when the saved data does
    not fit the model."""
    data = report.sections.get(name)
    s = section(name)
    if data is None or s is None:
        return None
    return s.model.model_validate(data)

"""Every kind of saved report, as data: its model, how a saved JSON of it is recognised, and its
renderers.

A saved report says its kind in its ``kind`` field (each model's ``kind`` is a literal with that
default, so the table reads it from the model). A JSON without ``kind`` is read as a probe
report, the oldest kind. `specadapt report show` renders a saved report with its kind's
``console`` renderer; `specadapt report export` with its ``markdown``, ``html`` or ``junit``
one. A renderer a kind does not have is None: `report export` then names the forms it has.

==========  =======================================  =======  ========  ====  =====
kind        written by                               console  Markdown  HTML  JUnit
==========  =======================================  =======  ========  ====  =====
probe       probe --json, report merge -o            yes      yes       yes   -
compare     compare / equiv --json, --out DIR        yes      yes       yes   yes
features    equiv --features --json, --out DIR       yes      yes       yes   yes
sampling    equiv --sampling --json, --out DIR       yes      yes       -     yes
tune        tune --out DIR (report.json)             yes      yes       yes   -
demo        demo --out DIR (report.json)             yes      yes       yes   yes
watch       watch --out FILE                         yes      yes       -     -
==========  =======================================  =======  ========  ====  =====
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from rich.console import Console

from specadapt.errors import UsageError
from specadapt.records import CompareReport, ProbeReport
from specadapt.records.demo import DemoReport
from specadapt.records.features import FeatureReport
from specadapt.records.reports import read_model
from specadapt.records.sampling_report import SamplingReport
from specadapt.records.tune import TuneReport
from specadapt.records.watch import WatchReport
from specadapt.report import (
    compare_render,
    demo_render,
    features_render,
    html,
    probe_render,
    sampling_render,
    tune_render,
    watch_summary,
)
from specadapt.report.console import render_probe
from specadapt.report.scale import render_scale

FORMATS = ("markdown", "html", "junit")
"""The forms `report export` writes, in the order they are named."""
FORMAT_NAMES = {"markdown": "Markdown", "html": "HTML", "junit": "JUnit"}


@dataclass(frozen=True)
class ReportKind:
    """One kind of saved report. ``name``: its ``kind`` field; ``model``: the pydantic model that reads
    it back; ``written_by``: the commands that save it; ``console`` prints it (`report show`);
    ``markdown``, ``html``, ``junit`` return the text of that form, or are None where the kind has none."""

    name: str
    model: type[BaseModel]
    written_by: str
    console: Callable[[Any, Console], None]
    markdown: Callable[[Any], str] | None = None
    html: Callable[[Any], str] | None = None
    junit: Callable[[Any], str] | None = None

    def __post_init__(self) -> None:
        if self.model.model_fields["kind"].default != self.name:
            raise ValueError(f"the {self.name} kind's model {self.model.__name__} says another kind")

    def formats(self) -> tuple[str, ...]:
        """The forms of `report export` this kind has ("markdown", "html", "junit")."""
        return tuple(f for f in FORMATS if getattr(self, f) is not None)

    def renderer(self, fmt: str, path: Path | None = None) -> Callable[[Any], str]:
        """The renderer of form ``fmt``; UsageError in one line naming the forms the kind has when it
        lacks it (``path``: the saved report, named in the line)."""
        render = getattr(self, fmt, None) if fmt in FORMATS else None
        if render is None:
            what = f"{path} is a {self.name} report, which" if path is not None else f"a {self.name} report"
            raise UsageError(f"{what} has no {FORMAT_NAMES.get(fmt, fmt)} form: {self.formats_text()}")
        return render

    def formats_text(self) -> str:
        have = [FORMAT_NAMES[f] for f in self.formats()]
        if not have:
            return "it is only shown (specadapt report show)"
        return "it can be exported as " + (" or ".join(have) if len(have) < 3 else f"{have[0]}, {have[1]} or {have[2]}")

    def read(self, path: Path) -> BaseModel:
        """The saved report at ``path``; UsageError saying why the file is not one of this kind."""
        return read_model(path, self.model, self.name)


def _probe_console(report: ProbeReport, console: Console) -> None:
    render_probe(report, console)
    if report.scale is not None:
        render_scale(report.scale, console)


KINDS: tuple[ReportKind, ...] = (
    ReportKind("probe", ProbeReport, "specadapt probe --json FILE; specadapt report merge -o FILE", _probe_console,
               markdown=probe_render.to_markdown, html=probe_render.to_html),
    ReportKind("compare", CompareReport, "specadapt compare / equiv --json FILE or --out DIR (report.json)",
               compare_render.render_console, markdown=compare_render.to_markdown, html=html.to_html,
               junit=compare_render.to_junit),
    ReportKind("features", FeatureReport, "specadapt equiv --features --json FILE or --out DIR (report.json)",
               features_render.render_console, markdown=features_render.to_markdown, html=features_render.to_html,
               junit=features_render.to_junit),
    ReportKind("sampling", SamplingReport, "specadapt equiv --sampling --json FILE or --out DIR (report.json)",
               sampling_render.render_console, markdown=sampling_render.to_markdown, html=None,
               junit=sampling_render.to_junit),
    ReportKind("tune", TuneReport, "specadapt tune --out DIR (report.json)", tune_render.render_console,
               markdown=tune_render.render_markdown, html=tune_render.render_html, junit=None),
    ReportKind("demo", DemoReport, "specadapt demo --out DIR (report.json)", demo_render.render_console,
               markdown=demo_render.to_markdown, html=demo_render.to_html, junit=demo_render.to_junit),
    ReportKind("watch", WatchReport, "specadapt watch --out FILE", watch_summary.render_console,
               markdown=watch_summary.to_markdown, html=None, junit=None),
)
"""Every kind of report specadapt saves."""

BY_NAME: dict[str, ReportKind] = {k.name: k for k in KINDS}
DEFAULT = BY_NAME["probe"]
"""The kind of a saved JSON object without a ``kind`` field."""


def kind_named(name: str) -> ReportKind | None:
    return BY_NAME.get(name)


def kind_of(path: Path) -> ReportKind:
    """The kind of the saved report at ``path``, from its ``kind`` field (none: a probe report).
    UsageError in one line when the file is missing, or is JSON of a kind no report has; a file that
    is not JSON is left to the probe model, which says what is wrong with it."""
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"report {path} does not exist")
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return DEFAULT
    name = data.get("kind") if isinstance(data, dict) else None
    if name is None:
        return DEFAULT
    kind = BY_NAME.get(name) if isinstance(name, str) else None
    if kind is None:
        raise UsageError(f"{path} is not a specadapt report: its kind {name!r} is none of "
                         f"{', '.join(BY_NAME)}")
    return kind


def read(path: Path) -> tuple[ReportKind, BaseModel]:
    """The kind of the saved report at ``path`` and the report; UsageError saying why it is not one."""
    kind = kind_of(path)
    return kind, kind.read(path)

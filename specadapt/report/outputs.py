"""Write a saved report in every format asked for: JSON, then JUnit XML, Markdown and HTML, each
by its kind's renderer (report/kinds.py)."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel

from specadapt.records import CompareReport
from specadapt.records.features import FeatureReport
from specadapt.records.reports import atomic_write_text
from specadapt.records.sampling_report import SamplingReport
from specadapt.report import kinds


def write_forms(report: BaseModel, json_path: Path | None = None, junit_path: Path | None = None,
                markdown_path: Path | None = None, html_path: Path | None = None) -> list[Path]:
    """Write each form whose path is given, atomically, JSON first (a rendering error loses no
    measurement); the paths written, in order. ValueError for a form the report's kind has not."""
    kind = kinds.BY_NAME[report.kind]
    asked = [(fmt, path) for fmt, path in (("junit", junit_path), ("markdown", markdown_path), ("html", html_path))
             if path]
    lacking = [kinds.FORMAT_NAMES[fmt] for fmt, _ in asked if fmt not in kind.formats()]
    if lacking:
        raise ValueError(f"a {kind.name} report has no {' or '.join(lacking)} form")
    written = []
    if json_path:
        atomic_write_text(json_path, report.model_dump_json(indent=2))
        written.append(json_path)
    for fmt, path in asked:
        atomic_write_text(path, kind.renderer(fmt)(report))
        written.append(path)
    return written

def write_outputs(report: CompareReport, json_path: Path | None = None, junit_path: Path | None = None,
                  markdown_path: Path | None = None, html_path: Path | None = None) -> list[Path]:
    """A compare report (compare, equiv) as JSON, JUnit XML, Markdown and HTML."""
    return write_forms(report, json_path, junit_path, markdown_path, html_path)


def write_sampling_outputs(report: SamplingReport, json_path: Path | None = None, junit_path: Path | None = None,
                           markdown_path: Path | None = None) -> list[Path]:
    """The sampling report (equiv --sampling) as JSON, JUnit XML and Markdown."""
    return write_forms(report, json_path, junit_path, markdown_path)


def write_feature_outputs(report: FeatureReport, json_path: Path | None = None, junit_path: Path | None = None,
                          markdown_path: Path | None = None, html_path: Path | None = None) -> list[Path]:
    """The feature matrix (equiv --features) as JSON, JUnit XML, Markdown and HTML."""
    return write_forms(report, json_path, junit_path, markdown_path, html_path)

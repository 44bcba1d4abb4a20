"""Write a compare report in every format asked for: JSON, JUnit XML, Markdown, HTML."""

from __future__ import annotations

from pathlib import Path

from specadapt.records import CompareReport
from specadapt.records.features import FeatureReport
from specadapt.records.reports import atomic_write_text
from specadapt.records.sampling_report import SamplingReport
from specadapt.report import features_render, sampling_render
from specadapt.report.compare_render import to_junit, to_markdown
from specadapt.report.html import to_html


def write_outputs(report: CompareReport, json_path: Path | None = None, junit_path: Path | None = None,
                  markdown_path: Path | None = None, html_path: Path | None = None) -> list[Path]:
    written = []
    if json_path:
        atomic_write_text(json_path, report.model_dump_json(indent=2))
        written.append(json_path)
    if junit_path:
        atomic_write_text(junit_path, to_junit(report))
        written.append(junit_path)
    if markdown_path:
        atomic_write_text(markdown_path, to_markdown(report))
        written.append(markdown_path)
    if html_path:
        atomic_write_text(html_path, to_html(report))
        written.append(html_path)
    return written


def write_sampling_outputs(report: SamplingReport, json_path: Path | None = None, junit_path: Path | None = None,
                           markdown_path: Path | None = None) -> list[Path]:
    """The sampling report (equiv --sampling) as JSON, JUnit XML and Markdown."""
    return _write_each(((json_path, lambda: report.model_dump_json(indent=2)),
                        (junit_path, lambda: sampling_render.to_junit(report)),
                        (markdown_path, lambda: sampling_render.to_markdown(report))))


def write_feature_outputs(report: FeatureReport, json_path: Path | None = None, junit_path: Path | None = None,
                          markdown_path: Path | None = None, html_path: Path | None = None) -> list[Path]:
    """The feature matrix (equiv --features) as JSON, JUnit XML, Markdown and HTML."""
    return _write_each(((json_path, lambda: report.model_dump_json(indent=2)),
                        (junit_path, lambda: features_render.to_junit(report)),
                        (markdown_path, lambda: features_render.to_markdown(report)),
                        (html_path, lambda: features_render.to_html(report))))


def _write_each(outputs) -> list[Path]:
    """Write each (path, render) whose path is given; the paths written, in order."""
    written = []
    for path, render in outputs:
        if path:
            atomic_write_text(path, render())
            written.append(path)
    return written

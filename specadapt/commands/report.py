"""`specadapt report`: saved probe and compare reports, rendered again (report/ does the rendering)."""

from __future__ import annotations

from pathlib import Path

import click
from rich.console import Console

from specadapt.analysis.merge import merge_reports
from specadapt.commands._console import say, stderr
from specadapt.errors import UsageError
from specadapt.records import read_compare_report, read_report, report_kind, write_report
from specadapt.records.demo import read_demo_report
from specadapt.records.reports import read_model
from specadapt.records.tune import TuneReport
from specadapt.report import demo_render, tune_render
from specadapt.report.compare_render import render_console
from specadapt.report.console import render_probe
from specadapt.report.outputs import write_outputs
from specadapt.report.scale import render_scale
from specadapt.report.side_by_side import render_side_by_side


@click.group("report")
def report() -> None:
    """Re-render saved reports."""


@report.command("show")
@click.argument("path", type=click.Path(path_type=Path))
def show(path: Path) -> None:
    """Print a saved probe, compare, tune or demo report (from --json / --out) as tables."""
    if report_kind(path) == "demo":
        demo_render.render_console(read_demo_report(path), Console())
        return
    if report_kind(path) == "tune":
        tune_render.render_console(read_model(path, TuneReport, "tune"), Console())
        return
    if report_kind(path) == "compare":
        render_console(read_compare_report(path), Console())
        return
    saved = read_report(path)
    render_probe(saved, Console())
    if saved.scale is not None:
        render_scale(saved.scale, Console())


@report.command("export")
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--junit", "junit_out", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--markdown", "md_out", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--html", "html_out", type=click.Path(dir_okay=False, path_type=Path))
def export(path: Path, junit_out: Path | None, md_out: Path | None, html_out: Path | None) -> None:
    """Render a saved compare/equiv or demo report again as JUnit XML, Markdown or HTML (a tune report:
    Markdown, HTML)."""
    if not (junit_out or md_out or html_out):
        raise UsageError("give at least one of --junit, --markdown, --html")
    if report_kind(path) == "demo":
        for written in demo_render.write_demo_outputs(read_demo_report(path), junit_path=junit_out,
                                                      markdown_path=md_out, html_path=html_out):
            stderr.print(f"wrote {written}")
        return
    if report_kind(path) == "tune":
        if junit_out:
            raise UsageError(f"{path} is a tune report, which has no JUnit form: give --markdown or --html")
        for written in tune_render.write_tune_outputs(read_model(path, TuneReport, "tune"), markdown_path=md_out,
                                                      html_path=html_out):
            stderr.print(f"wrote {written}")
        return
    for written in write_outputs(read_compare_report(path), junit_path=junit_out, markdown_path=md_out,
                                 html_path=html_out):
        stderr.print(f"wrote {written}")


@report.command("compare")
@click.argument("off_path", type=click.Path(path_type=Path))
@click.argument("on_path", type=click.Path(path_type=Path))
def compare(off_path: Path, on_path: Path) -> None:
    """Two saved probe reports side by side: OFF_PATH (spec off) vs ON_PATH (spec on)."""
    render_side_by_side(read_report(off_path), read_report(on_path), Console())


@report.command("merge")
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("-o", "--output", "out", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="Write the merged report here.")
def merge(paths: tuple[Path, ...], out: Path) -> None:
    """Merge probe reports of separate runs of the same settings (one server or several replicas):
    every figure is recomputed from the merged requests; acceptance sums each server's counters once."""
    for path in paths:
        if report_kind(path) not in ("probe", None):
            raise UsageError(f"{path} is a {report_kind(path)} report; merge takes probe reports")
    merged = merge_reports([(str(p), read_report(p)) for p in paths])
    write_report(merged, out)
    render_probe(merged, Console())
    if merged.scale is not None:
        render_scale(merged.scale, Console())
    say(f"merged report written to {out}")

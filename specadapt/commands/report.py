"""`specadapt report`: saved reports rendered again (report/kinds.py maps each kind to its renderers)."""

from __future__ import annotations

from pathlib import Path

import click
from rich.console import Console

from specadapt.analysis.merge import merge_reports
from specadapt.commands._console import say, stderr
from specadapt.errors import UsageError
from specadapt.records import read_report, report_kind, write_report
from specadapt.records.reports import atomic_write_text
from specadapt.report import kinds
from specadapt.report.console import render_probe
from specadapt.report.scale import render_scale
from specadapt.report.side_by_side import render_side_by_side


@click.group("report")
def report() -> None:
    """Re-render saved reports."""


@report.command("show")
@click.argument("path", type=click.Path(path_type=Path))
def show(path: Path) -> None:
    """Print a saved report (probe, compare, equiv --features / --sampling, tune, demo or watch) as
    tables."""
    kind, saved = kinds.read(path)
    kind.console(saved, Console())


@report.command("export")
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--junit", "junit_out", type=click.Path(dir_okay=False, path_type=Path), help="Write JUnit XML here.")
@click.option("--markdown", "md_out", type=click.Path(dir_okay=False, path_type=Path), help="Write Markdown here.")
@click.option("--html", "html_out", type=click.Path(dir_okay=False, path_type=Path), help="Write HTML here.")
@click.option("--format", "fmt", type=click.Choice(kinds.FORMATS),
              help="Print this form on stdout (or write it to --output).")
@click.option("-o", "--output", "out", type=click.Path(dir_okay=False, path_type=Path),
              help="With --format: write the form here instead of stdout.")
def export(path: Path, junit_out: Path | None, md_out: Path | None, html_out: Path | None, fmt: str | None,
           out: Path | None) -> None:
    """Render a saved report again as Markdown, HTML or JUnit XML, each form the report's kind has
    (compare/equiv, --features and demo: all three; --sampling: Markdown, JUnit; tune: Markdown, HTML;
    watch: Markdown; probe: none, see `report show`)."""
    if out is not None and fmt is None:
        raise UsageError("--output goes with --format: give --format markdown, html or junit")
    asked = [(f, p) for f, p in (("junit", junit_out), ("markdown", md_out), ("html", html_out)) if p]
    if fmt is not None and out is not None:
        asked.append((fmt, out))
    if not asked and fmt is None:
        raise UsageError("give at least one of --junit, --markdown, --html, --format")
    kind, saved = kinds.read(path)
    for f in [f for f, _ in asked] + ([fmt] if fmt is not None else []):
        kind.renderer(f, path)  # every form asked is checked before any is written
    for f, target in asked:
        atomic_write_text(target, kind.renderer(f)(saved))
        stderr.print(f"wrote {target}")
    if fmt is not None and out is None:
        click.echo(kind.renderer(fmt)(saved), nl=False)


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

"""Report sections (analysis/sections.py ``SECTIONS``, report/sections.py ``VIEWS``): an analysis
added to the table with its view is computed by the compare runner, kept in the JSON report and
shown in the console, Markdown and HTML forms, without a change to the runner or the renderers;
an analysis or a renderer that fails costs its own section only."""

from __future__ import annotations

import json

import pytest
from pydantic import BaseModel
from rich.console import Console

from specadapt.analysis import sections as analyses
from specadapt.orchestration.compare import run_compare
from specadapt.records import CompareReport, CompareSettings
from specadapt.records.reports import read_compare_report
from specadapt.report import sections as views
from specadapt.report.compare_render import render_console, to_junit, to_markdown
from specadapt.report.html import to_html
from specadapt.report.outputs import write_outputs
from tests.unit.report.test_compare_render import make_report
from tests.unit.orchestration.test_compare import MIXED, Side, detokenizer, triager, wired  # noqa: F401 (fixtures)

# ------------------------------------------------------------------ a section, as a module would define it


class Tally(BaseModel):
    """Measured requests per side that finished, and the prompts that diverged."""

    off_ok: int
    on_ok: int
    diverged: list[str]


def tally(report: CompareReport) -> Tally | None:
    measured = [r for r in report.requests if r.ok and not r.warmup]
    if not measured:
        return None
    return Tally(off_ok=sum(r.side == "off" for r in measured), on_ok=sum(r.side == "on" for r in measured),
                 diverged=sorted(p.prompt_id for p in report.identity if p.divergence))


def tally_console(t: Tally, report: CompareReport, console: Console) -> None:
    console.print(f"tally: {t.off_ok} off, {t.on_ok} on; diverged <{', '.join(t.diverged)}>", markup=False)


def tally_markdown(t: Tally, report: CompareReport) -> list[str]:
    return ["", "### Tally", "", f"{t.off_ok} off, {t.on_ok} on; diverged <{', '.join(t.diverged)}>"]


def tally_html(t: Tally, report: CompareReport, heading: int) -> str:
    return f"<h{heading}>Tally</h{heading}><p>{t.off_ok} off, {t.on_ok} on; diverged &lt;{', '.join(t.diverged)}&gt;</p>"


TALLY = analyses.Section("tally", Tally, tally)
TALLY_VIEW = views.SectionView("tally", console=tally_console, markdown=tally_markdown, html=tally_html)


def broken(report: CompareReport) -> Tally:
    raise ValueError("no features measured\nsecond line")


@pytest.fixture
def added(monkeypatch):
    """Add sections (analysis and view) to the tables for one test, after the built-in ones; the
    tables are as they were afterwards."""

    def add(section: analyses.Section | None = None, view: views.SectionView | None = None) -> None:
        if section is not None:
            monkeypatch.setattr(analyses, "SECTIONS", (*analyses.SECTIONS, section))
        if view is not None:
            monkeypatch.setattr(views, "VIEWS", (*views.VIEWS, view))

    yield add


def compare_run(wired) -> CompareReport:  # noqa: F811 (the fixture, passed on)
    off, on = Side("off", spec=False), Side("on", spec=True, k=2)
    wired(off, on)
    return run_compare(off, on, MIXED, CompareSettings(concurrency=[1], repeat=2, warmup=0, dtype="float32"))


def console_text(report: CompareReport) -> str:
    console = Console(record=True, width=300)
    render_console(report, console)
    return console.export_text()


def in_order(text: str, *parts: str) -> bool:
    """Every part is in ``text``, each after the one before."""
    at = 0
    for part in parts:
        at = text.find(part, at)
        if at < 0:
            return False
        at += len(part)
    return True


# ------------------------------------------------------------------------------------------ tests

def test_a_registered_section_is_computed_saved_and_rendered_everywhere(
        added, wired, triager, detokenizer, tmp_path):  # noqa: F811
    added(TALLY, TALLY_VIEW)
    report = compare_run(wired)
    measured = [r for r in report.requests if r.ok and not r.warmup]
    expected = {"off_ok": sum(r.side == "off" for r in measured), "on_ok": sum(r.side == "on" for r in measured),
                "diverged": ["bug", "chat", "tie"]}
    assert expected["off_ok"] == expected["on_ok"] == 10  # 2 repeats x (3 prompts + a conversation of 2 turns)
    assert report.sections["tally"] == expected and set(report.sections) == {"interference", "speculation", "tally"}  # + built-in
    line = "10 off, 10 on; diverged <bug, chat, tie>"

    paths = [tmp_path / n for n in ("report.json", "junit.xml", "summary.md", "report.html")]
    write_outputs(report, *paths)
    assert json.loads(paths[0].read_text())["sections"] == report.sections
    # each form shows it after the diagnosis and before identity
    assert in_order(console_text(report), "why: ", f"tally: {line}", "identity: ")
    md = paths[2].read_text()
    assert in_order(md, "### Why", "### Tally", line, "Identity: ")
    page = paths[3].read_text()
    assert in_order(page, "<h2>Why</h2>", "<h2>Tally</h2>", f"<p>{line.replace('<', '&lt;').replace('>', '&gt;')}</p>",
                    "<h2>Identity</h2>")
    assert "Tally" not in paths[1].read_text()  # JUnit: identity and the gate only
    # the saved report renders the same without rerunning the analysis
    saved = read_compare_report(paths[0])
    assert saved.sections == report.sections
    assert (to_markdown(saved), console_text(saved)) == (md, console_text(report))


def test_an_analysis_that_raises_loses_its_section_only_and_says_why_in_one_note(
        added, wired, triager, detokenizer, tmp_path):  # noqa: F811
    added(analyses.Section("broken", Tally, broken), views.SectionView("broken", markdown=tally_markdown))
    added(analyses.Section("wrong", Tally, lambda report: {"off_ok": 1}))
    added(TALLY, TALLY_VIEW)
    report = compare_run(wired)
    assert set(report.sections) == {"interference", "speculation", "tally"} and report.diagnosis is not None and len(report.identity) == 4
    assert report.notes == ["the broken section failed and is left out: ValueError: no features measured",
                            "the wrong section failed and is left out: TypeError: analyse returned dict, not Tally"]
    write_outputs(report, json_path=tmp_path / "r.json", markdown_path=tmp_path / "r.md")
    saved = read_compare_report(tmp_path / "r.json")
    assert saved.notes == report.notes
    md = (tmp_path / "r.md").read_text()
    assert "### Tally" in md and md.count("### Tally") == 1  # the broken section's view has nothing to show
    assert "- note: the broken section failed and is left out: ValueError: no features measured" in md


def test_a_renderer_that_raises_shows_one_line_and_the_rest_of_the_report(added):
    def fail(*args):
        raise RuntimeError("cannot draw\nmore")

    added(TALLY, views.SectionView("tally", console=fail, markdown=fail, html=fail))
    report = CompareReport.model_validate_json(_saved_report())
    report.sections["tally"] = {"off_ok": 1, "on_ok": 2, "diverged": []}
    line = "the tally section could not be shown: RuntimeError: cannot draw"
    assert in_order(console_text(report), line, "identity: 2 identical")
    assert f"- {line}" in to_markdown(report) and "Identity: " in to_markdown(report)
    page = to_html(report)
    assert f"<p>{line}</p>" in page and "<h2>Identity</h2>" in page


def test_saved_data_that_does_not_fit_the_model_is_said_and_unknown_sections_are_kept(added):
    added(TALLY, TALLY_VIEW)
    report = CompareReport.model_validate_json(_saved_report())
    report.sections = {"tally": {"off_ok": "many"}, "from-elsewhere": {"x": 1}}
    md = to_markdown(report)
    assert "- the tally section could not be shown: ValidationError: 3 validation errors for Tally" in md
    assert "from-elsewhere" not in md and "from-elsewhere" not in to_html(report)
    again = CompareReport.model_validate_json(report.model_dump_json())
    assert again.sections == report.sections  # a section no code here knows survives a re-save


def test_a_report_without_sections_writes_no_sections_key_and_reads_back_the_same():
    text = _saved_report()
    assert "sections" not in json.loads(text)
    report = CompareReport.model_validate_json(text)
    assert report.sections == {} and report.model_dump_json(indent=2) == text
    assert "sections" not in to_junit(report)


def test_each_section_has_one_name_and_a_view_of_that_name():
    names = [s.name for s in analyses.SECTIONS]
    shown = [v.name for v in views.VIEWS]
    assert len(set(names)) == len(names) and len(set(shown)) == len(shown)
    assert set(names) <= set(shown)  # an analysis no view shows would be saved and never rendered
    assert analyses.section("interference") is analyses.INTERFERENCE and analyses.section("tally") is None


def test_a_section_not_in_the_table_reads_back_as_nothing():
    report = CompareReport.model_validate_json(_saved_report())
    report.sections["tally"] = {"off_ok": 1, "on_ok": 2, "diverged": []}
    assert analyses.section_data(report, "tally") is None and "tally" not in to_markdown(report)


def test_the_diagnosis_is_a_built_in_view_of_its_own_field():
    assert [v.name for v in views.VIEWS] == ["interference", "speculation", "diagnosis"]
    report = CompareReport.model_validate_json(_saved_report())
    assert views.DIAGNOSIS.model(report) is None and "Why" not in to_markdown(report)


def _saved_report() -> str:
    """A compare report as saved, without sections: one level, four prompts, two divergences."""
    report = make_report()
    report.created_at = "2026-01-01T00:00:00+00:00"
    return report.model_dump_json(indent=2)

"""The HTML report in a real headless browser (Debian's chromium), with the network off."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from tests.unit.report.test_compare_render import make_report  # same synthetic report

from specadapt.analysis.gate import apply_gate
from specadapt.report.html import to_html

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--proxy-server=http://0.0.0.0:9", "--proxy-bypass-list=<-loopback>"]  # any fetch would fail


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (make test installs it with apt-get)")
def test_html_renders_its_plots_offline(tmp_path):
    report = make_report()
    apply_gate(report)
    page = tmp_path / "report.html"
    page.write_text(to_html(report))
    common = [CHROMIUM, *FLAGS, f"--user-data-dir={tmp_path / 'profile'}"]
    dom = subprocess.run([*common, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-500:]
    assert dom.stdout.count("<svg") >= 3 and "Speedup vs concurrency" in dom.stdout
    shot = tmp_path / "shot.png"
    subprocess.run([*common, "--window-size=1200,1600", f"--screenshot={shot}", page.as_uri()],
                   capture_output=True, timeout=120)
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 30_000  # a page with plots, not a blank one


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (make test installs it with apt-get)")
def test_the_demo_page_renders_both_runs_offline(tmp_path):
    from tests.unit.report.test_demo_render import demo_report

    from specadapt.report.demo_render import to_html as demo_html

    page = tmp_path / "report.html"
    page.write_text(demo_html(demo_report()))
    common = [CHROMIUM, *FLAGS, f"--user-data-dir={tmp_path / 'profile'}"]
    dom = subprocess.run([*common, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-500:]
    assert dom.stdout.count("<svg") >= 6 and dom.stdout.count("Speedup vs concurrency") == 2
    assert "Run 1: spec off vs a well-matched draft" in dom.stdout and "Run 2: spec off vs a poorly" in dom.stdout


DOCS_IMAGE = Path(__file__).resolve().parents[3] / "docs" / "img" / "passes.png"
"""The picture of docs/passes.md, written by ``passes_in_a_browser`` when SPECADAPT_WRITE_DOCS_IMAGES=1."""


def passes_in_a_browser(tmp_path: Path) -> tuple[str, bytes]:
    """A compare report with the lesson's answers rendered and screenshot by chromium: (its DOM, the
    PNG of the whole page); with SPECADAPT_WRITE_DOCS_IMAGES=1 also docs/img/passes.png, the
    answers pass by pass alone."""
    from tests.unit.report.test_passes_render import lesson_compare_report

    from specadapt.analysis.sections import section_data
    from specadapt.report import page
    from specadapt.report.passes_render import answers_html

    report = lesson_compare_report()
    path = tmp_path / "report.html"
    path.write_text(to_html(report))
    common = [CHROMIUM, *FLAGS, f"--user-data-dir={tmp_path / 'profile'}"]
    dom = subprocess.run([*common, "--dump-dom", path.as_uri()], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-500:]
    shot = tmp_path / "shot.png"
    subprocess.run([*common, "--window-size=1200,3000", f"--screenshot={shot}", path.as_uri()],
                   capture_output=True, timeout=120)
    if os.environ.get("SPECADAPT_WRITE_DOCS_IMAGES") == "1":
        alone = tmp_path / "passes.html"
        template = '{% extends "base.html" %}{% block width %}56em{% endblock %}{% block body %}{{ body }}{% endblock %}'
        seen = section_data(report, "speculation")
        lesson_first = sorted(seen.shown, key=lambda i: seen.requests[i].prompt_id != "capital")
        alone.write_text(page.environment({"alone.html": template}).get_template("alone.html").render(
            body=answers_html(seen.model_copy(update={"shown": lesson_first}), report.requests, 2)))
        DOCS_IMAGE.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([*common, "--hide-scrollbars", "--window-size=1000,345", f"--screenshot={DOCS_IMAGE}",
                        alone.as_uri()],
                       capture_output=True, timeout=120)
    return dom.stdout, shot.read_bytes()


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (make test installs it with apt-get)")
def test_the_answers_are_drawn_pass_by_pass_in_a_real_browser(tmp_path):
    from tests.unit.report.test_passes_render import LESSON_PASSES, Tree

    dom, png = passes_in_a_browser(tmp_path)
    tree = Tree(dom)
    (capital,) = [a for a in tree.having("answer") if a["attrs"]["data-prompt"] == "capital"]
    lesson = [e for e in tree.having("pass", inside=capital) if "data-pass" in e["attrs"]]
    assert [b["text"] for b in lesson] == ["↵", "La capital de Francia es París", "."]
    assert len(lesson) == len(LESSON_PASSES) and "draft length 5" in lesson[1]["attrs"]["title"]
    assert [t["text"] for t in tree.having("tok", "draft", inside=lesson[1])] == ["La", " capital", " de", " Francia",
                                                                                  " es"]
    assert [f["attrs"].get("class") for f in tree.elements if f["tag"] == "figure"] == ["histogram", "positions"]
    positions = next(f for f in tree.elements if f["tag"] == "figure" and f["attrs"].get("class") == "positions")
    assert positions["attrs"]["aria-label"] == "acceptance by position in the answer"
    assert any(e["tag"] == "svg" and e["parent"] is positions for e in tree.elements)
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 30_000  # a page with plots and passes, not a blank one

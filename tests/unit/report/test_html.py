"""The HTML report in a real headless browser (Debian's chromium), with the network off."""

import shutil
import subprocess

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

"""The demo report's renderers on constructed compare reports: console, Markdown, one HTML page
with both runs, JUnit with run-prefixed classnames, JSON read back; `report show/export` on it."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from click.testing import CliRunner
from rich.console import Console

from specadapt.analysis.identity import identity_report
from specadapt.analysis.speed import analyse
from specadapt.cli import cli
from specadapt.records import (
    CompareReport,
    CompareSettings,
    CounterPair,
    CounterSnapshot,
    HardwareInfo,
    ServerInfo,
    Triage,
)
from specadapt.records.demo import DemoReport, DemoRun, DemoTimings, read_demo_report
from specadapt.records.diagnosis import Advice, Cause, Diagnosis
from specadapt.records.reports import report_kind
from specadapt.report import demo_render
from specadapt.report.html import compare_body_html, to_html
from tests.unit.report.test_compare_render import PROMPTS, rec


def compare(on_ms: float, suspect: bool, accepted: int) -> CompareReport:
    """Four prompts x 3 repeats; spec off at 40 ms per token, spec on at ``on_ms``; prompt p3
    diverges on the spec-on side (suspect or near-tie)."""
    recs = []
    for r in range(3):
        for p in PROMPTS:
            base = [f"t{j}" for j in range(20)]
            on = list(base)
            if p.id == "p3":
                on[7] = "X"
            recs += [rec("off", p.id, r, base, 40 + r), rec("on", p.id, r, on, on_ms + r)]
    zero = CounterSnapshot(drafts=0, draft_tokens=0, accepted_tokens=0, accepted_per_position={0: 0},
                           generation_tokens=0)
    after = CounterSnapshot(drafts=100, draft_tokens=100, accepted_tokens=accepted,
                            accepted_per_position={0: accepted}, generation_tokens=240)
    info = ServerInfo(backend="vllm", base_url="http://off", model_id="m", version="0.32.0")
    report = CompareReport(settings=CompareSettings(repeat=3), off_server=info,
                           on_server=info.model_copy(update={"base_url": "http://on", "spec_enabled": True,
                                                             "num_speculative_tokens": 1}),
                           requests=recs, counters_on={1: CounterPair(before=zero, after=after)})
    analyse(report)
    verdict = "suspect" if suspect else "near-tie"
    report.identity = identity_report(recs, PROMPTS, lambda prompt, div, off: Triage(
        verdict=verdict, source="server-logprobs", margin=2.0 if suspect else 0.1, threshold=0.5))
    report.counts = {v: sum(1 for p in report.identity if p.verdict == v)
                     for v in ("identical", "near-tie", "suspect", "unknown")}
    return report


def demo_report() -> DemoReport:
    fast = compare(on_ms=20, suspect=False, accepted=80)
    slow = compare(on_ms=90, suspect=True, accepted=1)
    slow.diagnosis = Diagnosis(
        headline="Spec on is 2.2x slower: the draft is almost never accepted.",
        causes=[Cause(code="low-acceptance", level="concurrency 1", text="1% of draft tokens accepted")],
        advice=[Advice(code="draft", text="use a draft that predicts the target")])
    runs = [DemoRun(name="ngram", title="spec off vs a well-matched draft", draft="n-gram k=4", lesson="it pays",
                    spec_config={"method": "ngram"}, compare=fast),
            DemoRun(name="draft-model", title="spec off vs a poorly-matched draft", draft="first 8 of 30 layers",
                    lesson="it loses", spec_config={"method": "draft_model"}, compare=slow)]
    return DemoReport(model="/m", dtype="bfloat16", dtype_reason="the CPU has avx512_bf16",
                      hardware=HardwareInfo(source="this machine", cpu_model="Some CPU", cores=2,
                                            cpu_flags=["avx512_bf16"], native_dtypes=["float32", "bfloat16"]),
                      prompts=[p.id for p in PROMPTS], runs=runs,
                      timings=DemoTimings(draft_s=1, servers_s=80, runs_s={"ngram": 60, "draft-model": 120},
                                          total_s=265), notes=["every server runs with --enforce-eager"])


def console_text(report: DemoReport, **kw) -> str:
    console = Console(record=True, width=400)
    demo_render.render_console(report, console, **kw)
    return console.export_text()


def test_the_closing_lines_carry_the_ratios_verdicts_identity_and_diagnosis():
    report = demo_report()
    fast, slow = (demo_render.run_line(r) for r in report.runs)
    assert re.fullmatch(r"ngram: the response came 1\.9\dx faster with speculation \(4\d% less time per answer\); "
                        r"the text was identical for 3 of 4 prompts \(1 near-tie\)\. TPOT 1\.9\dx \[\d\.\d\d, "
                        r"\d\.\d\d\] faster, E2E 1\.9\dx \[.*\] faster, tokens/s 1\.9\dx \[.*\] faster", fast)
    assert re.fullmatch(r"draft-model: the response came 2\.\d\dx slower with speculation \(1\d\d% more time per "
                        r"answer\); the text was identical for 3 of 4 prompts \(1 suspect\)\. TPOT 0\.\d\dx \[.*\] "
                        r"slower, E2E 0\.\d\dx \[.*\] slower, tokens/s 0\.\d\dx \[.*\] slower; diagnosis: Spec on "
                        r"is 2\.2x slower: the draft is almost never accepted\.", slow)
    assert demo_render.machine_line(report) == ("machine: Some CPU, 2 CPUs, AVX512-BF16; native: float32, bfloat16; "
                                                "dtype bfloat16 (the CPU has avx512_bf16)")
    assert demo_render.timing_line(report) == ("time: draft 1 s, servers 80 s, run 1 (ngram) 60 s, "
                                               "run 2 (draft-model) 120 s, total 265 s")


def test_console_renders_each_run_then_what_the_run_shows():
    report = demo_report()
    text = console_text(report)
    first, second, closing = (text.index(s) for s in ("run 1 of 2: spec off vs a well-matched draft",
                                                      "run 2 of 2: spec off vs a poorly-matched draft",
                                                      "what this run shows"))
    assert first < second < closing
    assert text.count("compare: off http://off") == 2  # the compare renderer, once per run
    assert "cause (concurrency 1): 1% of draft tokens accepted" in text[second:closing]
    assert "to do: use a draft that predicts the target" in text[second:closing]  # compare's why section
    assert text.count("why: ") == 1  # the diagnosis is not printed twice
    tail = text[closing:]
    for line in demo_render.closing_lines(report):
        assert line in tail
    assert "instruction set and the dtype" in tail and "time: draft 1 s" in tail
    assert "time: draft" not in console_text(report, timing=False)


def test_markdown_has_both_runs_under_headings_of_their_own():
    md = demo_render.to_markdown(demo_report())
    assert md.startswith("# specadapt demo: speculative decoding on this machine\n")
    assert md.count("### specadapt: speculative decoding on vs off") == 2  # compare's own heading, one lower
    assert md.index("## Run 1: spec off vs a well-matched draft") < md.index("## Run 2: spec off vs a poorly")
    assert "#### Why\n\nSpec on is 2.2x slower" in md and "- to do: use a draft that predicts the target" in md
    assert md.count("Spec on is 2.2x slower") == 2  # the closing line and the run's why section
    assert "- ngram: the response came" in md and "`p3`: **suspect** at token 7" in md


def test_html_is_one_self_contained_page_with_both_runs():
    report = demo_report()
    html = demo_render.to_html(report)
    assert html.count("<!doctype html>") == 1 and html.count("<body>") == 1 and html.count("</html>") == 1
    assert html.count("<svg") >= 6  # three plots per run
    assert not re.search(r"""(src|href)=["']https?://""", html) and "<script" not in html
    assert html.count("<h3>Speculative decoding on vs off: m</h3>") == 2 and html.count("<h4>Speed</h4>") == 2
    assert "Run 2: spec off vs a poorly-matched draft" in html and "Spec on is 2.2x slower" in html
    assert "instruction set and the dtype" in html


def test_compare_html_keeps_its_own_headings_and_the_body_starts_where_asked():
    report = demo_report().runs[0].compare
    page = to_html(report)
    assert "<h1>Speculative decoding on vs off: m</h1>" in page and "<h2>Speed</h2>" in page
    body = compare_body_html(report, top=2)
    assert body.startswith("<h2>Speculative decoding on vs off: m</h2>") and "<h3>Identity</h3>" in body
    assert "<html" not in body and "<style>" not in body


def test_junit_has_one_suite_per_run_with_prefixed_classnames():
    root = ET.fromstring(demo_render.to_junit(demo_report()))
    suites = root.findall("testsuite")
    assert [s.get("name") for s in suites] == ["specadapt.demo.ngram", "specadapt.demo.draft-model"]
    for suite, run, failures in zip(suites, ("ngram", "draft-model"), (0, 1)):
        cases = suite.findall("testcase")
        assert len(cases) == 4 and all(c.get("classname").startswith(f"{run}.identity.") for c in cases)
        assert sum(1 for c in cases if c.find("failure") is not None) == failures


def test_files_are_written_and_the_json_reads_back(tmp_path):
    report = demo_report()
    written = demo_render.write_demo_outputs(report, tmp_path / "out")
    assert sorted(p.name for p in written) == ["junit.xml", "report.html", "report.json", "summary.md"]
    path = tmp_path / "out" / "report.json"
    assert report_kind(path) == "demo"
    again = read_demo_report(path)
    assert again.model_dump() == report.model_dump()
    assert again.runs[1].compare.diagnosis.headline == "Spec on is 2.2x slower: the draft is almost never accepted."


def test_report_show_and_export_take_a_demo_report(tmp_path):
    report = demo_report()
    (path,) = demo_render.write_demo_outputs(report, json_path=tmp_path / "report.json")
    runner = CliRunner()
    shown = runner.invoke(cli, ["report", "show", str(path)])
    assert shown.exit_code == 0, shown.output
    words = " ".join(shown.output.split())  # the console wraps at its width
    assert "run 2 of 2: spec off vs a poorly-matched draft" in words
    assert demo_render.run_line(report.runs[0]) in words and demo_render.timing_line(report) in words
    exported = runner.invoke(cli, ["report", "export", str(path), "--markdown", str(tmp_path / "s.md"),
                                   "--junit", str(tmp_path / "j.xml"), "--html", str(tmp_path / "r.html")])
    assert exported.exit_code == 0, exported.output
    assert (tmp_path / "s.md").read_text() == demo_render.to_markdown(report)
    assert len(ET.parse(tmp_path / "j.xml").getroot().findall("testsuite")) == 2
    assert (tmp_path / "r.html").read_text().count("<h4>Speed</h4>") == 2

"""Every kind of saved report, round-tripped through the CLI: built, saved as its command saves it,
then `specadapt report show` and `specadapt report export --format X` for each form the kind has
(report/kinds.py); a form it lacks, and a JSON of no known kind, get one line and exit 2."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

from specadapt.analysis.gate import apply_gate
from specadapt.analysis.probe_report import build_probe_report
from specadapt.cli import cli
from specadapt.records import (
    CounterSnapshot,
    ProbeSettings,
    RequestRecord,
    RequestSettings,
    ServerInfo,
    write_report,
)
from specadapt.records.reports import atomic_write_text
from specadapt.records.sampling import SamplingStats
from specadapt.records.sampling_report import PromptTokens, SamplingGate, SamplingReport, SamplingSettings
from specadapt.records.tune import Candidate, TuneReport, TuneSettings, Verification
from specadapt.records.watch import WatchEvent, WatchReport, WatchServerSummary
from specadapt.report import demo_render, features_render, html, kinds, page, probe_render, tune_render
from specadapt.report.demo_render import write_demo_outputs
from specadapt.report.outputs import write_feature_outputs, write_outputs, write_sampling_outputs
from specadapt.report.tune_render import write_tune_outputs
from tests.unit.report.test_compare_render import make_report as make_compare
from tests.unit.report.test_demo_render import demo_report
from tests.unit.report.test_features_render import cell
from tests.unit.report.test_features_render import report as feature_report


def probe(path: Path) -> None:
    rec = RequestRecord(prompt_id="p0", category="a", api="completions", ok=True, chunk_ns=[10, 20, 30],
                        chunk_tokens=[1, 1, 1], e2e_ns=35, output_tokens=3, token_source="usage")
    before = CounterSnapshot(drafts=0, draft_tokens=0, accepted_tokens=0, generation_tokens=0, source="m")
    after = CounterSnapshot(drafts=4, draft_tokens=16, accepted_tokens=6, generation_tokens=3, source="m")
    settings = ProbeSettings(concurrency=2, repeat=1, warmup=0, prompts_source="built-in", request=RequestSettings())
    report = build_probe_report(ServerInfo(backend="vllm", base_url="http://probe:8000", model_id="probe-model"),
                                settings, [rec], before, after, scale=None)
    write_report(report, path)  # specadapt probe --json


def compare(path: Path) -> None:
    report = make_compare()
    apply_gate(report)
    write_outputs(report, json_path=path)  # specadapt compare / equiv --json


def features(path: Path) -> None:
    report = feature_report(cell("seed-cell", "pass"), cell("logit-bias-cell", "fail", "tokens differ at 3"))
    write_feature_outputs(report, json_path=path)  # specadapt equiv --features --json


def sampling(path: Path) -> None:
    settings = SamplingSettings(samples=32, max_tokens=16, alpha=0.01, top_logprobs=10, concurrency=4, seed=0,
                                request_timeout_s=60, source="server", tokenizer="the spec-off server's /tokenize")
    st = SamplingStats(status="consistent", passed=True, n_tokens=512, min_tokens=100, alpha=0.01,
                       per_test_alpha=0.01 / 3, power=0.8, bins=20, seed=0, pit_histogram=[0] * 20,
                       pit_expected_per_bin=25.6, rank_categories=[], summary="s")
    on = ServerInfo(backend="vllm", base_url="http://on", version="0.32.0", model_id="m", spec_enabled=True,
                    num_speculative_tokens=4)
    report = SamplingReport(settings=settings, on_server=on, source="src", stats=st, gate=SamplingGate(passed=True),
                            prompts=[PromptTokens(prompt_id="p", category="c", prompt_tokens=3, samples=32,
                                                  tokens=512, in_top_k=500)])
    write_sampling_outputs(report, json_path=path)  # specadapt equiv --sampling --json


def tune(path: Path) -> None:
    """Every candidate failed (no plots to draw)."""
    settings = TuneSettings(backend="trtllm", base_spec={"method": "eagle"}, ks=[0, 3], concurrency=[1], repeat=3,
                            warmup=0, request=RequestSettings(), objective="throughput")
    report = TuneReport(settings=settings, candidates=[
        Candidate(label="k=3", variant="", k=3, status="failed", error="engine build failed: [Errno 28] no space"),
        Candidate(label="k=5", variant="", k=5, status="not run")],
        verification=Verification(status="not run", reason="nothing to verify"))
    write_tune_outputs(report, json_path=path)  # specadapt tune --out DIR


def demo(path: Path) -> None:
    write_demo_outputs(demo_report(), json_path=path)  # specadapt demo --out DIR


def watch(path: Path) -> None:
    server = WatchServerSummary(name="edge-a", url="http://edge-a:8000", reads=42, errors=1, restarts=0,
                                figures={"acceptance_rate": 0.625, "mean_acceptance_length": 2.5},
                                drift={"reference": 0.7, "statistic": 1.5, "h": 4.0, "alarm": False},
                                alerts={"acceptance-drift": "acceptance fell"})
    report = WatchReport(specadapt_version="1.0", started_at="2026-01-01T00:00:00+00:00",
                         ended_at="2026-01-01T01:00:00+00:00", end_reason="ended after --duration", settings={},
                         drift_h=4.0, drift_delay_s=120.0, servers=[server], alerts_raised=1,
                         events=[WatchEvent(wall=1767225600.0, server="edge-a", alert="acceptance-drift",
                                            raised=True, text="acceptance fell")])
    atomic_write_text(path, report.model_dump_json(indent=2))  # specadapt watch --out FILE


# kind: (how its command saves it, what its console shows, what each form it has shows)
CASES: dict[str, tuple[Callable[[Path], None], list[str], dict[str, list[str]]]] = {
    "probe": (probe, ["probe-model", "http://probe:8000", "output tokens 3"],
              {"markdown": ["# specadapt probe: probe-model", "output tokens 3", "per-request acceptance not available"],
               "html": ["<h1>specadapt probe: probe-model</h1>", "per-request acceptance not available"]}),
    "compare": (compare, ["identity: 2 identical, 1 near-tie, 1 suspect"],
                {"markdown": ["## specadapt: speculative decoding on vs off", "BUG"],
                 "html": ["<h1>Speculative decoding on vs off: m</h1>"], "junit": ["p3"]}),
    "features": (features, ["logit-bias-cell: fail: tokens differ at 3", "gate: FAIL"],
                 {"markdown": ["request features", "`logit-bias-cell`"], "html": ["<code>logit-bias-cell</code>"],
                  "junit": ["logit-bias-cell", "tokens differ at 3"]}),
    "sampling": (sampling, ["sampling: spec-on http://on", "512 sampled tokens"],
                 {"markdown": ["sampling distribution", "512 sampled tokens"], "junit": ["zero-probability-tokens"]}),
    "tune": (tune, ["engine build failed"], {"markdown": ["engine build failed"], "html": ["engine build failed"]}),
    "demo": (demo, ["run 2 of 2: spec off vs a poorly-matched draft"],
             {"markdown": ["# specadapt demo", "Run 2: spec off vs a poorly-matched draft"],
              "html": ["<h2>Run 1: spec off vs a well-matched draft</h2>"], "junit": ["specadapt.demo.ngram"]}),
    "watch": (watch, ["watch of 1 server", "edge-a", "0.625", "acceptance fell"],
              {"markdown": ["## specadapt watch", "| edge-a | http://edge-a:8000 | 42 | 1 | 0 | 0.625 | 2.50 |"]}),
}


def test_every_kind_the_tool_writes_is_in_the_table_and_has_a_case():
    assert set(CASES) == set(kinds.BY_NAME) == {"probe", "compare", "features", "sampling", "tune", "demo", "watch"}
    for kind in kinds.KINDS:
        assert kind.model.model_fields["kind"].default == kind.name
        assert set(CASES[kind.name][2]) == set(kind.formats()), kind.name


BASE_HEAD = '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">\n<title>'
SHARED_STYLE = "th { background: #f3f3f3; } .plots { display: flex; flex-wrap: wrap; gap: 1em; }"


def test_every_html_page_extends_the_one_base_template():
    assert page.BASE.startswith(BASE_HEAD) and SHARED_STYLE in page.BASE
    pages = [html.PAGE, demo_render.PAGE, tune_render.TEMPLATE, features_render.PAGE, probe_render.PAGE]
    assert all(p.startswith('{% extends "base.html" %}') for p in pages)
    assert {k.html for k in kinds.KINDS if k.html} == {html.to_html, demo_render.to_html, tune_render.render_html,
                                                       features_render.to_html, probe_render.to_html}


def undated(text: str) -> str:
    """Without the plots' SVG (matplotlib stamps each with the time and random ids)."""
    return re.sub(r"<svg.*?</svg>", "<svg/>", text, flags=re.S)


def words(text: str) -> str:
    """The console wraps at its width: compare text with every run of whitespace as one space."""
    return " ".join(text.split())


@pytest.mark.parametrize("name", list(CASES))
def test_show_and_export_round_trip_each_kind(tmp_path, name):
    save, shown_text, forms = CASES[name]
    path = tmp_path / f"{name}.json"
    save(path)
    assert json.loads(path.read_text())["kind"] == name
    kind = kinds.kind_of(path)
    assert kind.name == name
    runner = CliRunner()
    shown = runner.invoke(cli, ["report", "show", str(path)])
    assert shown.exit_code == 0, shown.output
    for text in shown_text:
        assert text in words(shown.output), (name, text, shown.output)
    saved = kind.read(path)
    for fmt, needles in forms.items():
        out = runner.invoke(cli, ["report", "export", str(path), "--format", fmt])
        assert out.exit_code == 0, (name, fmt, out.output)
        assert undated(out.stdout) == undated(kind.renderer(fmt)(saved))
        for text in needles:
            assert text in out.stdout, (name, fmt, text)
        if fmt == "junit":
            ET.fromstring(out.stdout)  # well-formed XML
        if fmt == "html":  # the one base page: its head and shared style, once
            assert out.stdout.startswith(BASE_HEAD) and out.stdout.count("<!doctype html>") == 1
            assert SHARED_STYLE in out.stdout and out.stdout.rstrip().endswith("</body></html>")
        written = tmp_path / f"{name}.{fmt}"
        again = runner.invoke(cli, ["report", "export", str(path), "--format", fmt, "-o", str(written)])
        assert again.exit_code == 0 and undated(written.read_text()) == undated(out.stdout)
    for fmt in set(kinds.FORMATS) - set(forms):
        refused = runner.invoke(cli, ["report", "export", str(path), "--format", fmt])
        assert refused.exit_code == 2, (name, fmt, refused.output)
        line = refused.output.strip()
        assert "\n" not in line and "Traceback" not in line
        assert line.startswith(f"error: {path} is a {name} report, which has no {kinds.FORMAT_NAMES[fmt]} form")
        for other in forms:
            assert kinds.FORMAT_NAMES[other] in line


def test_show_on_a_features_report_is_not_refused_as_a_probe_report(tmp_path):
    path = tmp_path / "report.json"
    features(path)
    shown = CliRunner().invoke(cli, ["report", "show", str(path)])
    assert shown.exit_code == 0 and "not a specadapt probe report" not in shown.output
    assert "cells: 1 pass, 1 fail" in words(shown.output)


def test_a_form_a_kind_lacks_is_refused_and_the_line_says_where_to_look(tmp_path):
    path = tmp_path / "probe.json"
    probe(path)
    out = CliRunner().invoke(cli, ["report", "export", str(path), "--junit", str(tmp_path / "j.xml")])
    assert out.exit_code == 2 and not (tmp_path / "j.xml").exists()
    assert out.output.strip() == (f"error: {path} is a probe report, which has no JUnit form: it can be exported as "
                                  "Markdown or HTML")
    shown_only = kinds.ReportKind("probe", kinds.ProbeReport, "specadapt probe --json FILE", kinds.render_probe)
    assert shown_only.formats() == () and shown_only.formats_text() == "it is only shown (specadapt report show)"


def test_every_form_asked_is_checked_before_any_is_written(tmp_path):
    path = tmp_path / "sampling.json"
    sampling(path)
    md, page = tmp_path / "s.md", tmp_path / "r.html"
    out = CliRunner().invoke(cli, ["report", "export", str(path), "--markdown", str(md), "--html", str(page)])
    assert out.exit_code == 2 and not md.exists() and not page.exists()
    assert "has no HTML form: it can be exported as Markdown or JUnit" in out.output


@pytest.mark.parametrize("content, says", [
    ('{"kind": "golden", "answers": []}', "is not a specadapt report: its kind 'golden' is none of probe, compare, "
                                          "features, sampling, tune, demo, watch"),
    ('{"kind": "weekly"}', "is not a specadapt report: its kind 'weekly' is none of probe"),
    ('{"hello": 1}', "is not a specadapt probe report (6 problems; first: Field required)"),
    ("not json at all", "is not a specadapt probe report (1 problems; first: Invalid JSON"),
])
@pytest.mark.parametrize("command", [["show"], ["export", "--format", "markdown"]])
def test_an_unknown_json_gets_one_line_and_exit_2(tmp_path, content, says, command):
    path = tmp_path / "r.json"
    path.write_text(content)
    out = CliRunner().invoke(cli, ["report", command[0], str(path), *command[1:]])
    assert out.exit_code == 2, out.output
    line = out.output.strip()
    assert "\n" not in line and line.startswith(f"error: {path} ") and says in line, line


def test_export_needs_a_form_and_output_needs_format(tmp_path):
    path = tmp_path / "watch.json"
    watch(path)
    none = CliRunner().invoke(cli, ["report", "export", str(path)])
    assert none.exit_code == 2 and "give at least one of --junit, --markdown, --html, --format" in none.output
    alone = CliRunner().invoke(cli, ["report", "export", str(path), "-o", str(tmp_path / "x")])
    assert alone.exit_code == 2 and "--output goes with --format" in alone.output


def test_writing_a_form_the_kind_has_not_is_refused_before_anything_is_written(tmp_path):
    from specadapt.report.outputs import write_forms

    saved = tmp_path / "tune.json"
    tune(saved)
    report = kinds.kind_of(saved).read(saved)
    with pytest.raises(ValueError, match="a tune report has no JUnit form"):
        write_forms(report, json_path=tmp_path / "again.json", junit_path=tmp_path / "j.xml")
    assert not (tmp_path / "again.json").exists() and not (tmp_path / "j.xml").exists()
    assert write_forms(report, json_path=tmp_path / "again.json") == [tmp_path / "again.json"]
    assert (tmp_path / "again.json").read_text() == saved.read_text()

"""The tune report's renderers (console, Markdown, HTML), its writer and `report show/export` on it,
from a TuneReport built by hand."""

from __future__ import annotations

import base64
import functools
import html
import io
import re
import subprocess
import xml.etree.ElementTree as ET

import pytest
from click.testing import CliRunner
from rich.console import Console
from tests.unit.report.test_html import CHROMIUM, FLAGS  # the same headless browser, network off

from specadapt.records import (
    AcceptanceSummary,
    CompareReport,
    CompareSettings,
    Distribution,
    LatencySummary,
    LevelResult,
    RatioCI,
    RequestSettings,
    ServerInfo,
    SpeedRatios,
)
from specadapt.records.reports import read_model
from specadapt.records.tune import (
    Candidate,
    FitPoint,
    HonourCheck,
    LevelChoice,
    LevelFit,
    LevelVerify,
    Recommendation,
    TuneReport,
    TuneSettings,
    Verification,
    WrittenConfig,
)
from specadapt.report import tune_render
from specadapt.report.tune_render import render_console, render_html, render_markdown, write_tune_outputs

CREATED = "2026-12-01T12:00:00+00:00"  # fixed, so that equal reports render once (page_of)
OFF = ServerInfo(backend="vllm", base_url="http://127.0.0.1:8001", model_id="tiny-llama", version="0.32.0")


def r(point, low=None, high=None, n=6, unit="pairs", too_few=False, min_n=5):
    return RatioCI(point=point, low=low, high=high, n=n, unit=unit, too_few=too_few, min_n=min_n)


def latency() -> LatencySummary:
    d = Distribution(count=10, mean=20.0)
    return LatencySummary(requests=10, succeeded=10, failed=0, output_tokens=640, duration_s=4.0,
                          output_tokens_per_s=160.0, ttft_ms=d, itl_ms=d, tpot_ms=d, e2e_ms=d,
                          tokens_per_chunk_mean=2.0)


def level(concurrency, tpot, e2e, thr, rates, mean_len) -> LevelResult:
    acc = AcceptanceSummary(known=True, drafts=100, draft_tokens=100 * len(rates), accepted_tokens=100 * sum(rates),
                            acceptance_rate=sum(rates) / len(rates), mean_acceptance_length=mean_len,
                            per_position_rate=rates, generation_tokens=100 * mean_len)
    return LevelResult(concurrency=concurrency, pairs=12 if concurrency == 1 else 6,
                       speed=SpeedRatios(tpot=tpot, e2e=e2e, throughput=thr), off=latency(), on=latency(),
                       acceptance=acc)


def compare(k, levels, counts) -> CompareReport:
    return CompareReport(created_at=CREATED, settings=CompareSettings(concurrency=[1, 8], repeat=6), off_server=OFF,
                         on_server=OFF.model_copy(update={"base_url": f"http://127.0.0.1:80{10 + k}",
                                                          "spec_enabled": True, "num_speculative_tokens": k}),
                         levels=levels, counts=counts)


def make_tune_report() -> TuneReport:
    """k = 0 (off), 2, 4 measured at concurrency 1 and 8, k = 6 failed; a schedule 4 -> 2 whose
    verification fails at 8, where the server does not honour it."""
    k2 = compare(2, [level(1, r(1.45, 1.30, 1.62), r(1.40, 1.27, 1.55), r(1.38, 1.25, 1.52), [0.71, 0.52], 2.23),
                     level(8, r(1.10, 0.98, 1.22, unit="blocks"), r(1.07, 0.97, 1.18, unit="blocks"),
                           r(1.08, 0.99, 1.19, unit="blocks"), [0.70, 0.51], 2.21)],
                 {"identical": 7, "near-tie": 1, "suspect": 0, "unknown": 0})
    k4 = compare(4, [level(1, r(1.62, 1.48, 1.77), r(1.55, 1.41, 1.70), r(1.51, 1.39, 1.66),
                           [0.71, 0.52, 0.36, 0.21], 2.80),
                     level(8, r(0.92, 0.85, 0.99, unit="blocks"), r(0.95, n=3, unit="blocks", too_few=True),
                           r(0.93, 0.86, 1.01, unit="blocks"), [0.70, 0.50, 0.34, 0.19], 2.73)],
                 {"identical": 8, "near-tie": 0, "suspect": 0, "unknown": 0})
    settings = TuneSettings(backend="vllm", base_spec={"method": "ngram", "num_speculative_tokens": 4},
                            ks=[0, 2, 4, 6], concurrency=[1, 8], repeat=6, warmup=1, request=RequestSettings())
    candidates = [
        Candidate(label="off", variant="", k=0, status="baseline", url=OFF.base_url),
        Candidate(label="k=2", variant="", k=2, spec={"method": "ngram", "num_speculative_tokens": 2},
                  url="http://127.0.0.1:8012", compare=k2),
        Candidate(label="k=4", variant="", k=4, spec={"method": "ngram", "num_speculative_tokens": 4},
                  url="http://127.0.0.1:8014", compare=k4),
        Candidate(label="k=6", variant="", k=6, spec={"method": "ngram", "num_speculative_tokens": 6},
                  status="failed", error="its server exited with code 1 | CUDA out of memory [rank0] at startup"),
    ]
    fits = [
        LevelFit(concurrency=1, form="1 + c k", v=1.0, c=0.1093, per_position_rate=[0.71, 0.52, 0.36, 0.21],
                 points=[FitPoint(k=2, measured=1.45, low=1.30, high=1.62, tokens_per_pass=2.23, predicted=1.3968,
                                  inside=True),
                         FitPoint(k=4, measured=1.62, low=1.48, high=1.77, tokens_per_pass=2.80, predicted=1.7027,
                                  inside=True)],
                 max_rel_error=0.0511, predicted={0: 1.0, 1: 1.5418, 2: 1.3968, 3: 1.7712, 4: 1.7027},
                 model_best_k=3),
        LevelFit(concurrency=8, form="1 + c k", v=1.0, c=0.4021, per_position_rate=[0.70, 0.50, 0.34, 0.19],
                 points=[FitPoint(k=2, measured=1.10, low=0.98, high=1.22, tokens_per_pass=2.21, predicted=1.2266,
                                  inside=False),
                         FitPoint(k=4, measured=0.92, low=0.85, high=0.99, tokens_per_pass=2.73, predicted=1.0431,
                                  inside=False)],
                 max_rel_error=0.1338, predicted={0: 1.0, 1: 1.2125, 2: 1.2266, 3: 1.1144, 4: 1.0431},
                 model_best_k=2),
    ]
    choices = [
        LevelChoice(concurrency=1, k=4, label="k=4", ratio=r(1.62, 1.48, 1.77), runner_up_k=2, runner_up_ratio=1.45,
                    certainty="clear", reason="k=4: TPOT 1.62x [1.48, 1.77] vs off; ahead of k=2 (1.45x) beyond "
                                              "its interval", excluded={6: "its server failed to start"},
                    model_best_k=3, model_note="the model predicts k=3 at 1.77x; it was not measured: add it to "
                                               "--k to test it"),
        LevelChoice(concurrency=8, k=2, label="k=2", ratio=r(1.10, 0.98, 1.22, unit="blocks"), runner_up_k=0,
                    runner_up_ratio=1.0, certainty="leaning", reason="k=2: TPOT 1.10x [0.98, 1.22] vs off; its "
                                                                      "interval reaches off (1.00x)",
                    excluded={6: "its server failed to start"}, model_best_k=2),
    ]
    honour = HonourCheck(concurrency=8, scheduled_k=2, engine_k=4, schedule_rate=0.081, fixed_rate=0.094,
                         fixed_count=212.0, ratio=0.86, verdict="not honoured",
                         reason="accepted above k=2: 0.081 per token vs 0.094 in the fixed k=4 run (0.86 of it)")
    verification = Verification(
        status="failed", url="http://127.0.0.1:8020", honoured="not honoured", suspect=0, near_tie=1,
        levels=[LevelVerify(concurrency=1, scheduled_k=4, ratio=r(1.58, 1.44, 1.73), best_fixed_k=4,
                            best_fixed_ratio=r(1.62, 1.48, 1.77), as_good=True,
                            honour=HonourCheck(concurrency=1, scheduled_k=4, engine_k=4, verdict="not applicable",
                                               reason="the schedule runs the engine's k here")),
                LevelVerify(concurrency=8, scheduled_k=2, ratio=r(0.91, 0.86, 0.96, unit="blocks"), best_fixed_k=2,
                            best_fixed_ratio=r(1.10, 0.98, 1.22, unit="blocks"), as_good=False, honour=honour)],
        reasons=["concurrency 8: the written config's TPOT ratio 0.91x [0.86, 0.96] does not reach k=2's "
                 "1.10x [0.98, 1.22]"])
    rec = Recommendation(form="schedule", k=4, schedule=[(1, 7, 4), (8, 8, 2)], fixed_fallback_k=2, verified=False,
                         summary="Run k=4 up to batch size 7 and k=2 from 8 (least certain: leaning at 8); "
                                 "where schedules are not honoured, run k=2.")
    return TuneReport(created_at=CREATED, settings=settings, off_server=OFF,
                      candidates=candidates, fits=fits, choices=choices,
                      schedule_ranges_note="batch sizes 2-7 were not measured: they take k=4 of batch size 1; the "
                                           "engines carry k=2 to batch sizes above 8.",
                      recommendation=rec,
                      configs=[WrittenConfig(engine="vllm", path="tune-out/vllm-spec.json", form="schedule",
                                             checked_by=["vllm SpeculativeConfig"]),
                               WrittenConfig(engine="trtllm", form=None, note="TensorRT-LLM takes one k: use the "
                                                                              "fixed fallback k=2")],
                      verification=verification, notes=["k=6 was not measured: its server failed to start."])


def bare_report() -> TuneReport:
    """Every candidate failed: no compare, no fit, no choice, no schedule, verification not run."""
    settings = TuneSettings(backend="trtllm", base_spec={"method": "eagle"}, ks=[0, 3], concurrency=[1],
                            repeat=3, warmup=0, request=RequestSettings(), objective="throughput")
    return TuneReport(settings=settings, candidates=[
        Candidate(label="k=3", variant="", k=3, status="failed", error="engine build failed: [Errno 28] no space"),
        Candidate(label="k=5", variant="", k=5, status="not run")],
        verification=Verification(status="not run", reason="nothing to verify"))


def ci_text(x: RatioCI) -> str:
    return f"{x.point:.2f}x [{x.low:.2f}, {x.high:.2f}]"


def expected(report: TuneReport) -> list[str]:
    """What every form must show, formatted from the records' own values. A deliberate second copy
    of the renderers' formatting (ranges, percentages, intervals), written out here as an oracle
    rather than imported from analysis/text.py or tune_model.ranges_text, so a change there shows."""
    out = [report.recommendation.summary, report.schedule_ranges_note, *report.notes,
           report.verification.honoured, report.verification.reasons[0], f"k={report.recommendation.fixed_fallback_k}"]
    out += [(f"{a}-{b}" if b > a else f"{a}") + f": k={k}" for a, b, k in report.recommendation.schedule]
    out += [c.error for c in report.candidates if c.error]
    for c in report.candidates:
        for lv in c.compare.levels if c.compare else []:
            s = lv.speed
            out += [ci_text(x) if not x.too_few else f"{x.point:.2f}x (too few {x.unit}, n = {x.n} < {x.min_n})"
                    for x in (s.tpot, s.e2e, s.throughput)]
            out += [f"{lv.acceptance.mean_acceptance_length:.2f}",
                    " / ".join(f"{round(100 * p)}%" for p in lv.acceptance.per_position_rate)]
    for f in report.fits:
        out += [f.form, f"{f.c:.3f}", f"{f.v:.3f}", f"{100 * f.max_rel_error:.1f}%"]
        out += [f"{p.predicted:.2f}x" for p in f.points]
        out += [f"{p.tokens_per_pass:.2f}" for p in f.points]
    for ch in report.choices:
        out += [ch.certainty, ch.reason, ch.excluded[6]]
        out += [ch.model_note] if ch.model_note else []
    for lv in report.verification.levels:
        out += [ci_text(lv.ratio), ci_text(lv.best_fixed_ratio), lv.honour.verdict, lv.honour.reason]
    out += [c.path for c in report.configs if c.path] + [c.note for c in report.configs if c.note]
    out += [f"{report.verification.suspect} suspect, {report.verification.near_tie} near-tie"]
    return out


def console_text(report: TuneReport) -> str:
    console = Console(file=io.StringIO(), width=1000, record=True)  # wide: no cell is wrapped
    render_console(report, console)
    return console.export_text()


def html_text(page: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", " ", re.sub(r'src="[^"]*"', "", page)))


@functools.cache
def page_of(report_json: str) -> str:
    """render_html of a report, once per report (matplotlib takes a second)."""
    return render_html(TuneReport.model_validate_json(report_json))


RENDERERS = {"console": console_text, "markdown": lambda rep: render_markdown(rep).replace("\\|", "|"),
             "html": lambda rep: html_text(page_of(rep.model_dump_json()))}


@pytest.mark.parametrize("form", RENDERERS)
def test_every_form_shows_what_matters(form):
    report = make_tune_report()
    text = RENDERERS[form](report)
    missing = [s for s in expected(report) if s not in text]
    assert not missing
    assert text.index("Recommendation:") < text.index(report.candidates[-1].error)  # the answer comes first
    assert "PARTIAL" not in text


@pytest.mark.parametrize("form", RENDERERS)
def test_partial_reason_comes_first(form):
    report = bare_report().model_copy(update={"partial": True, "partial_reason": "interrupted after k=3 (Ctrl-C)"})
    text = RENDERERS[form](report)
    assert report.partial_reason in text
    assert text.index(report.partial_reason) < text.index("Recommendation")


@pytest.mark.parametrize("form", RENDERERS)
def test_failed_candidates_without_fit_or_verification(form):
    report = bare_report()
    text = RENDERERS[form](report)
    assert "engine build failed: [Errno 28] no space" in text  # rich keeps the brackets
    assert "Verification: not run (nothing to verify)" in text and "not run" in text
    assert "No fit" in text and "No choice" in text and "nothing was measured" in text


def test_markdown_tables_keep_their_columns():
    md = render_markdown(make_tune_report())
    tables: list[list[int]] = []
    previous = ""
    for line in md.splitlines():
        if line.startswith("|"):
            cells = len(re.split(r"(?<!\\)\|", line)) - 2
            if not previous.startswith("|"):
                tables.append([])
            tables[-1].append(cells)
        previous = line
    assert len(tables) >= 6 and all(len(set(t)) == 1 for t in tables)  # the escaped | of an error splits nothing


def markdown_tables(md: str) -> dict[str, list[dict[str, str]]]:
    """{title: rows as {header: cell}} of the Markdown's tables (title: the line before the table)."""
    tables: dict[str, list[dict[str, str]]] = {}
    lines = md.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("|") and not lines[i - 1].startswith("|"):
            title, headers = lines[i - 2].rstrip(":").lower(), None
            tables[title] = []
            for row in lines[i:]:
                if not row.startswith("|"):
                    break
                cells = [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", row)[1:-1]]
                if headers is None:
                    headers = cells
                elif set(cells) != {"---"}:
                    tables[title].append(dict(zip(headers, cells)))
    return tables


def test_markdown_rows_put_each_figure_in_its_column():
    report = make_tune_report()
    tables = markdown_tables(render_markdown(report))
    yes_no = {True: "yes", False: "no", None: "no interval"}
    verify = {row["concurrency"]: row for row in tables["the written config against the best fixed k"]}
    for lv in report.verification.levels:
        row = verify[str(lv.concurrency)]
        assert row["TPOT ratio"] == ci_text(lv.ratio) and row["its ratio in the sweep"] == ci_text(lv.best_fixed_ratio)
        assert row["as good"] == yes_no[lv.as_good] and "why" not in row
        assert f"- concurrency {lv.concurrency}: {lv.honour.reason}" in render_markdown(report).splitlines()
        assert row["schedule honoured"].startswith(lv.honour.verdict)
    points = tables["measured vs predicted tpot ratio"]
    assert [(row["k"], row["inside interval"]) for row in points] == [
        (f"k={p.k}", yes_no[p.inside]) for f in report.fits for p in f.points]
    chosen = tables["the k chosen per level"]
    assert [(row["concurrency"], row["chosen"], row["TPOT ratio"], row["certainty"], row["reason"])
            for row in chosen] == [(str(ch.concurrency), ch.label, ci_text(ch.ratio), ch.certainty, ch.reason)
                                   for ch in report.choices]
    fits = tables["fit per level"]
    assert [row["model best k"] for row in fits] == [f"k={f.model_best_k}" for f in report.fits]
    (failed,) = [row for row in tables["candidates"] if row["status"] == "failed"]
    assert failed["note"] == report.candidates[-1].error
    speed = tables["speed vs off"]
    assert list(speed[0])[3] == "TPOT ratio (objective)"  # the objective first among the ratios
    e2e = report.model_copy(update={"settings": report.settings.model_copy(update={"objective": "e2e"})})
    rows = markdown_tables(render_markdown(e2e))["speed vs off"]
    assert list(rows[0])[3] == "E2E ratio (objective)"
    assert rows[0]["E2E ratio (objective)"] == ci_text(report.candidates[1].compare.levels[0].speed.e2e)


def test_plots_draw_the_records_figures():
    import matplotlib.pyplot as plt

    report = make_tune_report()
    report.settings.objective = "e2e"  # the plot follows the objective
    figs = tune_render.figures(report)
    try:
        speed = figs["speedup"][0].axes[0]
        bars = {c.get_label(): c for c in speed.containers}
        for cand in report.candidates[1:3]:
            line = bars[cand.label].lines[0]
            assert list(line.get_ydata()) == [lv.speed.e2e.point for lv in cand.compare.levels]
            assert list(line.get_xdata()) == pytest.approx([lv.concurrency for lv in cand.compare.levels], rel=0.05)
            ends = [y for seg in bars[cand.label].lines[2][0].get_segments() for y in (seg[0][1], seg[1][1])]
            e2e = [lv.speed.e2e for lv in cand.compare.levels]
            assert ends == pytest.approx([y for r in e2e for y in (r.point if r.low is None else r.low,
                                                                   r.point if r.high is None else r.high)])
        chosen = {line.get_label(): line for line in speed.get_lines()}["chosen k per level"]
        assert list(chosen.get_xdata()) == [ch.concurrency for ch in report.choices]
        assert list(chosen.get_ydata()) == [ch.ratio.point for ch in report.choices]
        verified = bars["verification (written config)"].lines[0]
        assert list(verified.get_xdata()) == [lv.concurrency for lv in report.verification.levels]
        assert list(verified.get_ydata()) == [lv.ratio.point for lv in report.verification.levels]
        assert speed.get_xscale() == "log"

        panels = [ax for ax in figs["acceptance"][0].axes if ax.get_title()]
        assert [ax.get_title() for ax in panels] == [f"concurrency {c}" for c in report.settings.concurrency]
        for ax, i in zip(panels, range(len(panels))):
            drawn = {line.get_label(): list(line.get_ydata()) for line in ax.get_lines()}
            assert drawn == {c.label: c.compare.levels[i].acceptance.per_position_rate for c in report.candidates[1:3]}

        fit = figs["fit"][0].axes[0]
        lines = {line.get_label(): line for line in fit.get_lines()}
        measured = {c.get_label(): c.lines[0] for c in fit.containers}
        for f in report.fits:
            (predicted,) = [line for label, line in lines.items() if label.startswith(f"concurrency {f.concurrency}: "
                                                                                       "predicted")]
            assert list(predicted.get_ydata()) == [f.predicted[k] for k in sorted(f.predicted)]
            points = measured[f"concurrency {f.concurrency}: measured"]
            assert list(points.get_xdata()) == [p.k for p in f.points]
            assert list(points.get_ydata()) == [p.measured for p in f.points]
    finally:
        for fig, _alt in figs.values():
            plt.close(fig)


def images(page: str) -> list[str]:
    return re.findall(r'<img src="([^"]*)"', page)


def test_html_is_self_contained_with_three_plots():
    page = page_of(make_tune_report().model_dump_json())
    assert not re.search(r'(src|href)\s*=\s*["\']?\s*(https?:)?//', page, re.I)
    srcs = images(page)
    assert len(srcs) == 3 and page.count("<img") == 3
    svgs = []
    for src in srcs:
        prefix = "data:image/svg+xml;base64,"
        assert src.startswith(prefix)
        svgs.append(base64.b64decode(src[len(prefix):]).decode())
        assert ET.fromstring(svgs[-1]).tag.endswith("svg")
        assert "http://www.w3.org/Graphics" not in svgs[-1]  # no DTD to fetch
    speedup, acceptance, fit = svgs
    # the legends name what is drawn: every measured k, the schedule and the verification; one
    # acceptance panel per level; the fit per level
    for label in ("k=2", "k=4", "chosen k per level", "verification"):
        assert f"<!-- {label}" in speedup
    assert "<!-- concurrency 1 -->" in acceptance and "<!-- concurrency 8 -->" in acceptance
    assert "<!-- concurrency 1: measured -->" in fit and "<!-- concurrency 8: measured -->" in fit


def test_html_draws_only_plots_with_something_to_show():
    assert images(render_html(bare_report())) == []
    report = make_tune_report()
    report.fits = []
    for c in report.candidates:
        for lv in c.compare.levels if c.compare else []:
            lv.acceptance = AcceptanceSummary(known=False, reason="no spec-decode counters")
    assert len(images(render_html(report))) == 1


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (make test installs it with apt-get)")
def test_html_opens_offline_with_its_plots_decoded(tmp_path):
    page = page_of(make_tune_report().model_dump_json())
    probe = ("<script>addEventListener('load', () => document.body.setAttribute('data-widths', "
             "[...document.images].map(i => i.naturalWidth).join(',')));</script></body>")
    path = tmp_path / "tune.html"
    path.write_text(page.replace("</body>", probe))
    dom = subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom",
                          path.as_uri()], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-500:]
    widths = re.search(r'data-widths="([^"]*)"', dom.stdout)
    assert widths, dom.stdout[:300]
    assert [int(w) > 100 for w in widths.group(1).split(",")] == [True] * 3
    assert "Recommendation" in dom.stdout


def test_writer_writes_each_form_and_json_first(tmp_path, monkeypatch):
    report = make_tune_report()
    paths = tmp_path / "t.json", tmp_path / "t.md"  # HTML: see the `report export` test
    assert write_tune_outputs(report, *paths) == list(paths)
    assert read_model(paths[0], TuneReport, "tune") == report
    assert paths[1].read_text() == render_markdown(report)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.json", "t.md"]  # no temp file left

    def broken(_report):
        raise RuntimeError("renderer broke")

    monkeypatch.setattr(tune_render, "render_html", broken)
    again = tmp_path / "again"
    with pytest.raises(RuntimeError):
        write_tune_outputs(report, again / "t.json", html_path=again / "t.html")
    assert read_model(again / "t.json", TuneReport, "tune") == report  # the measurements are kept
    assert [p.name for p in again.iterdir()] == ["t.json"]


def test_report_show_and_export_read_a_saved_tune_report(tmp_path):
    from specadapt.cli import cli

    report = make_tune_report()
    saved = tmp_path / "tune.json"
    write_tune_outputs(report, saved)
    shown = CliRunner().invoke(cli, ["report", "show", str(saved)])
    assert shown.exit_code == 0 and report.recommendation.summary in " ".join(shown.output.split())
    md, page, bare = tmp_path / "tune.md", tmp_path / "tune.html", tmp_path / "bare.json"
    bare_one = bare_report()  # one report: its creation time is in the page
    write_tune_outputs(bare_one, bare)  # no plots: matplotlib is timed in the tests above
    out = CliRunner().invoke(cli, ["report", "export", str(saved), "--markdown", str(md)])
    assert out.exit_code == 0 and md.read_text() == render_markdown(report)
    out = CliRunner().invoke(cli, ["report", "export", str(bare), "--html", str(page)])
    assert out.exit_code == 0 and page.read_text() == render_html(bare_one)
    refused = CliRunner().invoke(cli, ["report", "export", str(saved), "--junit", str(tmp_path / "j.xml")])
    assert refused.exit_code == 2 and "no JUnit form" in refused.output and "Traceback" not in refused.output
    assert not (tmp_path / "j.xml").exists()
    saved.write_text(saved.read_text().replace('"form": "schedule"', '"form": "weekly"', 1))
    bad = CliRunner().invoke(cli, ["report", "show", str(saved)])
    assert bad.exit_code == 2 and "is not a specadapt tune report" in bad.output


@pytest.mark.parametrize("form", RENDERERS)
def test_every_form_says_the_hardware_and_a_candidate_on_other_hardware(form):
    from specadapt.records import GpuInfo, HardwareInfo
    from specadapt.report.hardware import hardware_text

    here = HardwareInfo(source="this machine (specadapt started the server here)", cpu_model="AMD EPYC", cores=2,
                        cpu_flags=["avx2", "avx512_bf16"], native_dtypes=["float32", "bfloat16"])
    other = HardwareInfo(source="this machine (the server's address is loopback)", cpu_model="AMD EPYC", cores=2,
                         gpus=[GpuInfo(name="NVIDIA H200", memory_mib=143771, compute_capability="9.0")])
    report = make_tune_report()
    report.off_server = OFF.model_copy(update={"hardware": here})
    measured = next(c for c in report.candidates if c.compare is not None)
    measured.compare.on_server = measured.compare.on_server.model_copy(update={"hardware": other})
    text = RENDERERS[form](report)
    assert (f"Hardware of the spec-off server: {hardware_text(here)}; facts from this machine (specadapt started "
            "the server here).") in text
    assert f"Candidate {measured.label} ran on other hardware: {hardware_text(other)}" in text
    unknown = RENDERERS[form](make_tune_report())
    assert "Hardware of the spec-off server: not known." in unknown and "ran on other hardware" not in unknown


def rule_report() -> TuneReport:
    """make_tune_report under --until-decided: k=2's cell at concurrency 1 decided, k=4's dropped."""
    from specadapt.records import SequentialDesign
    from specadapt.records.tune import CellOutcome

    report = make_tune_report()
    report.settings.sequential = SequentialDesign(max_units=20)
    cand = [c for c in report.candidates if c.compare is not None]
    cand[0].cells = [CellOutcome(concurrency=1, stopped="decided", verdict="faster", units=6, requests=12,
                                 fixed_requests=30, interval=r(1.5, 1.2, 1.8), text="faster after 6 pairs: T1")]
    cand[-1].cells = [CellOutcome(concurrency=1, stopped="dropped", verdict="no clear difference", units=7,
                                  requests=14, fixed_requests=30, interval=r(1.0, 0.9, 1.1), best_label="k=2",
                                  best_interval=r(1.5, 1.2, 1.8), text="dropped after 7 pairs: T2")]
    return report


@pytest.mark.parametrize("form", RENDERERS)
def test_the_rule_s_design_total_and_one_line_per_cell(form):
    report = rule_report()
    labels = [c.label for c in report.candidates if c.cells]
    text = RENDERERS[form](report)
    assert "Run until decided" in text
    assert "Design: run until decided: after each unit the anytime-valid 95% t confidence sequence" in text
    assert "at most 20 units per level" in text and "the verification keeps the fixed design (--repeat" in text
    # 12 + 14 = 26 of 30 + 30 = 60: 57% fewer
    assert "The sweep: 26 requests against 60 for the fixed design (57% fewer)." in text
    assert f"{labels[0]} at concurrency 1: faster after 6 pairs: T1" in text
    assert f"{labels[1]} at concurrency 1: dropped after 7 pairs: T2" in text
    assert "Run until decided" not in RENDERERS[form](make_tune_report())  # the fixed design: no such section

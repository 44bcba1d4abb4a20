"""The demo report's renderers on constructed compare reports: console, Markdown, one HTML page
with both runs, JUnit with run-prefixed classnames, JSON read back; `report show/export` on it;
the lesson's answers pass by pass for both runs side by side (speculation sections set by hand),
in a real browser too."""

from __future__ import annotations

import re
import subprocess
import xml.etree.ElementTree as ET
from html import unescape

import pytest
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
from specadapt.records.passes import RequestPasses, SpeculationSeen
from specadapt.records.reports import report_kind
from specadapt.report import demo_render
from specadapt.report.html import compare_body_html, to_html
from tests.unit.report.test_compare_render import PROMPTS, rec
from tests.unit.report.test_html import CHROMIUM, FLAGS
from tests.unit.report.test_passes_render import Tree, within


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


# --- the lesson, pass by pass ---------------------------------------------------------------------
# The lesson's answer: the prefill's token, then (n-gram) the draft's ' capital of France is' accepted
# and ' Paris' the target's own in one pass, then '.'; the poorly matched draft: one token a pass.
LESSON_TOKENS = ["The", " capital", " of", " France", " is", " Paris", "."]
PASSES = {"ngram": {"capital-sentence": [1, 5, 1], "p0": [1, 5, 5, 5, 4]},
          "draft-model": {"capital-sentence": [1] * 7, "p0": [1] * 20}}
K = {"ngram": 4, "draft-model": 3}


def answer(index: int, r, passes: list[int] | None, k: int) -> RequestPasses:
    if passes is None:  # the answer's own counts only: no pass order
        return RequestPasses(index=index, prompt_id=r.prompt_id, category=r.category, repeat=r.repeat,
                             source="response", output_tokens=r.output_tokens, accepted=2, drafted=k)
    return RequestPasses(index=index, prompt_id=r.prompt_id, category=r.category, repeat=r.repeat,
                         source="chunks+response", passes=passes, drafted_per_pass=[None] + [k] * (len(passes) - 1),
                         output_tokens=sum(passes), accepted=sum(t - 1 for t in passes), drafted=k * (len(passes) - 1),
                         spec_steps=len(passes) - 1)


def with_speculation(run: DemoRun, passes: dict[str, list[int]], k: int, first_without: bool = False) -> None:
    """The lesson's answers (three repeats) added to the run's spec-on side, and a speculation section
    whose passes are ``passes`` per prompt; ``first_without``: the first answer of each has no passes."""
    report = run.compare
    report.requests += [rec("on", "capital-sentence", r, LESSON_TOKENS, 20).model_copy(update={"category": "lesson"})
                        for r in range(3)]
    answers = []
    for i, r in enumerate(report.requests):
        if r.side == "on" and r.prompt_id in passes:
            none_yet = first_without and not any(a.prompt_id == r.prompt_id for a in answers)
            answers.append(answer(i, r, None if none_yet else passes[r.prompt_id], k))
    seen = SpeculationSeen(available=True, source="chunks+response", source_note="the streamed chunks", k=k,
                           requests=answers)
    report.sections["speculation"] = seen.model_dump(mode="json")
    run.shown_prompts = ["capital-sentence", "p0"]


def lesson_report(first_without: bool = False) -> DemoReport:
    report = demo_report()
    for run in report.runs:
        with_speculation(run, PASSES[run.name], K[run.name], first_without)
    return report


def test_each_run_draws_the_first_answer_with_passes_of_each_prompt_it_names():
    report = lesson_report(first_without=True)
    rows = demo_render.lesson_rows(report)
    assert [p for p, _ in rows] == ["capital-sentence", "p0"]
    for prompt, shown in rows:
        assert [s.run.name for s in shown] == ["ngram", "draft-model"]
        for s in shown:
            assert (s.answer.prompt_id, s.answer.repeat, s.answer.passes) == (prompt, 1, PASSES[s.run.name][prompt])
            assert s.record is s.run.compare.requests[s.answer.index] and s.record.prompt_id == prompt


def test_a_run_without_the_section_or_the_answer_says_why_none_is_drawn():
    report = lesson_report()
    fast, slow = report.runs
    del fast.compare.sections["speculation"]
    slow.compare.sections["speculation"] = SpeculationSeen(
        available=False, source_note="per-request acceptance not available: no counts").model_dump(mode="json")
    assert demo_render.shown_answer(fast, "p0").why == "this run's report has no speculation per request"
    assert demo_render.shown_answer(slow, "p0").why == "per-request acceptance not available: no counts"
    assert demo_render.shown_answer(lesson_report().runs[0], "p3").why == "no spec-on answer of p3 was read"
    broken = lesson_report().runs[0]
    broken.compare.sections["speculation"] = {"available": "sometimes", "requests": 3}
    assert demo_render.shown_answer(broken, "p0").why == ("this run's speculation section does not read: "
                                                          "available: Input should be a valid boolean, unable to "
                                                          "interpret input")
    fast.shown_prompts = ["p3"]
    text = console_text(report)
    assert "p3: not drawn: this run's report has no speculation per request" in text
    assert "p3: not drawn: per-request acceptance not available: no counts" in text


def test_a_report_whose_runs_name_no_prompt_has_no_lesson_block():
    report = demo_report()
    assert demo_render.lesson_rows(report) == []
    assert "pass by pass" not in console_text(report) and "pass by pass" not in demo_render.to_markdown(report)
    assert 'class="speculation lesson"' not in demo_render.to_html(report)


# Each run's answers in the console's bracketed form, worked out by hand from PASSES and the tokens.
DRAWN = {("ngram", "capital-sentence"): ("capital-sentence (lesson): 7 tokens in 3 passes of the target",
                                         "[The][ capital of France is| Paris][.]"),
         ("draft-model", "capital-sentence"): ("capital-sentence (lesson): 7 tokens in 7 passes of the target",
                                               "[The][ capital][ of][ France][ is][ Paris][.]"),
         ("ngram", "p0"): ("p0 (x): 20 tokens in 5 passes of the target",
                           "[t0][t1t2t3t4|t5][t6t7t8t9|t10][t11t12t13t14|t15][t16t17t18|t19]"),
         ("draft-model", "p0"): ("p0 (x): 20 tokens in 20 passes of the target",
                                 "".join(f"[t{j}]" for j in range(20)))}


def test_console_draws_the_lessons_answer_pass_by_pass_for_both_runs_within_80_columns():
    report = lesson_report()
    console = Console(record=True, width=80)
    demo_render.render_console(report, console)
    text = console.export_text()
    lesson, closing = text.index("the lesson, pass by pass"), text.index("what this run shows")
    assert text.index("run 2 of 2") < lesson < closing
    block = text[lesson:closing]
    flat = " ".join(block.split())
    assert " ".join(demo_render.LESSON_TEXT.split()) in flat
    at = [block.index(caption) for caption, _ in DRAWN.values()]
    assert at[0] < at[1] < at[2] < at[3]  # per prompt, each run's answer in run order
    for caption, passes in DRAWN.values():
        assert caption in block and passes in block.replace("\n", "")
    assert block.index("run 1 (ngram): n-gram k=4") < at[0] < block.index("run 2 (draft-model): first 8") < at[1]
    assert max(len(line) for line in block.splitlines()) <= 80


def test_markdown_draws_the_lesson_before_the_runs_each_answer_in_a_fence():
    md = demo_render.to_markdown(lesson_report())
    lesson = md.index("## The lesson, pass by pass\n")
    assert md.index("## What the runs show") < lesson < md.index("## Run 1:")
    assert demo_render.LESSON_TEXT in md
    for caption, passes in DRAWN.values():
        body = md[md.index(f"```\n{caption}\n"):]
        body = body[:body.index("\n```\n", 3)].removeprefix(f"```\n{caption}\n")
        assert body.replace("\n", "") == passes and max(len(line) for line in body.splitlines()) <= 80
    assert md.index("Run 1 (ngram): n-gram k=4.\n\n```\ncapital-sentence (lesson): 7 tokens in 3") < \
           md.index("Run 2 (draft-model): first 8 of 30 layers.\n\n```\ncapital-sentence (lesson): 7 tokens in 7")


def test_html_draws_both_runs_side_by_side_one_box_per_pass():
    html = demo_render.to_html(lesson_report())
    assert html.index("What the runs show") < html.index("The lesson, pass by pass") < html.index("Run 1: spec off")
    assert demo_render.LESSON in unescape(html)
    tree = Tree(html)
    (table,) = tree.having("side-by-side")
    answers = [a for a in tree.having("answer") if "data-run" in a["attrs"]]
    assert [(a["attrs"]["data-run"], a["attrs"]["data-prompt"]) for a in answers] == list(DRAWN)
    boxes = [b for b in tree.having("pass") if "data-pass" in b["attrs"]]
    assert [b["text"] for b in boxes[:3]] == ["The", " capital of France is Paris", "."]
    assert boxes[1]["attrs"]["title"] == "pass 2: 5 tokens: 4 accepted draft tokens and the target's own; draft length 4"
    assert [b["text"] for b in boxes[3:10]] == LESSON_TOKENS  # the poorly matched draft: a token a pass
    assert boxes[4]["attrs"]["title"] == "pass 2: 1 token, the target's own; draft length 3"
    assert len(boxes) == sum(len(p) for run in PASSES.values() for p in run.values())
    lesson_drafts = [e["text"] for e in tree.having("tok", "draft")][1:5]  # after the legend's
    assert lesson_drafts == [" capital", " of", " France", " is"]
    captions = [e["text"] for e in tree.having("tokens-in-passes")]
    assert captions == [c.split(": ", 1)[1] for c, _ in DRAWN.values()]
    assert table["text"].count("Run ") == 2 and html.count("<th>Run") == 2  # one column per run


def test_the_lessons_runs_read_back_from_json(tmp_path):
    report = lesson_report()
    (path,) = demo_render.write_demo_outputs(report, json_path=tmp_path / "report.json")
    again = read_demo_report(path)
    assert [r.shown_prompts for r in again.runs] == [["capital-sentence", "p0"]] * 2
    assert demo_render.to_markdown(again) == demo_render.to_markdown(report)


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (make test installs it with apt-get)")
def test_the_lesson_is_drawn_side_by_side_in_a_real_browser(tmp_path):
    page = tmp_path / "report.html"
    page.write_text(demo_render.to_html(lesson_report()))
    common = [CHROMIUM, *FLAGS, f"--user-data-dir={tmp_path / 'profile'}"]
    dom = subprocess.run([*common, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-500:]
    tree = Tree(dom.stdout)
    (table,) = tree.having("side-by-side")
    rows = [r for r in tree.elements if r["tag"] == "tr" and within(r, table)][1:]  # the first: the runs
    beside = [[(a["attrs"]["data-run"], a["attrs"]["data-prompt"]) for a in tree.having("answer", inside=r)]
              for r in rows]
    assert beside == [[("ngram", p), ("draft-model", p)] for p in ("capital-sentence", "p0")]  # a row per prompt
    drawn = {(a["attrs"]["data-run"], a["attrs"]["data-prompt"]): [b["text"] for b in tree.having("pass", inside=a)]
             for a in tree.having("answer", inside=table)}
    assert drawn[("ngram", "capital-sentence")] == ["The", " capital of France is Paris", "."]
    assert drawn[("draft-model", "capital-sentence")] == LESSON_TOKENS
    shot = tmp_path / "shot.png"
    subprocess.run([*common, "--window-size=1000,1400", f"--screenshot={shot}", page.as_uri()],
                   capture_output=True, timeout=120)
    png = shot.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 30_000  # a page with plots and passes, not a blank one


def analysed_compare(passes: dict[str, list[int]]) -> CompareReport:
    """A compare report whose spec-on answers stream one chunk per pass with their own counts, its
    speculation section computed by the analysis (analysis/passes.py), as the demo's compares are
    (show 0: no answer of its own choosing)."""
    from tests.unit.report.test_passes_render import analysed_compare as compare_of

    tokens = {"capital-sentence": LESSON_TOKENS, "p0": [f"t{j}" for j in range(20)]}
    return compare_of([(pid, "lesson" if pid == "capital-sentence" else "rag", tokens[pid], ps)
                       for pid, ps in passes.items()], show=0)


def test_the_answers_drawn_are_those_the_analysis_read_from_the_streamed_chunks():
    report = demo_report()
    for run in report.runs:
        run.compare = analysed_compare(PASSES[run.name])
        run.shown_prompts = ["capital-sentence", "p0"]
        seen, _ = demo_render.speculation(run)
        assert [c.agree for c in seen.checks] == [True] and seen.shown == []  # the sums add up to the counters
    for _prompt, shown in demo_render.lesson_rows(report):
        for s in shown:
            assert s.answer.source == "chunks+response" and s.answer.repeat == 0
            assert s.answer.passes == PASSES[s.run.name][s.prompt_id]
    text = console_text(report)
    for caption, passes in DRAWN.values():
        assert caption.replace("(x)", "(rag)") in text and passes in text.replace("\n", "")
    assert text.count("[The][ capital of France is| Paris][.]") == 1  # the compares draw none of their own


# --- run until decided: the requests each run saved ---------------------------------------------
def decided_demo_report(fixed_second: bool = False) -> DemoReport:
    """demo_report's runs as the rule left them: the n-gram run decided after 6 of at most 12 pairs, the
    draft-model run after 8 (or, ``fixed_second``, ran the fixed design); the fixed design: 24 requests each."""
    from specadapt.records import RatioCI
    from specadapt.records.sequential import SequentialDesign, SequentialOutcome

    report = demo_report()
    for run, units, verdict in zip(report.runs, (6, 8), ("faster", "slower"), strict=True):
        if fixed_second and run.name == "draft-model":
            continue
        run.compare.settings.sequential = SequentialDesign(max_units=12, min_units=4)
        cs = RatioCI(point=1.9 if verdict == "faster" else 0.45, low=1.5 if verdict == "faster" else 0.3,
                     high=2.4 if verdict == "faster" else 0.7, n=units, method="cs", min_n=5)
        run.compare.levels[0].sequential = SequentialOutcome(verdict=verdict, stopped="decided", units=units,
                                                             requests=2 * units, fixed_requests=24, interval=cs,
                                                             text="(the analysis' sentence)")
    return report


def test_each_run_says_the_requests_it_sent_against_the_fixed_designs_and_the_share_saved():
    report = decided_demo_report()
    ngram, draft = report.runs
    # 6 pairs: 12 of 24 requests, half saved; 8 pairs: 16 of 24, a third saved; 28 of 48 in all: 20/48 = 41.7%
    assert demo_render.saving_text(ngram) == "12 requests against 24 for the fixed design (50% saved)"
    assert demo_render.saving_text(draft) == "16 requests against 24 for the fixed design (33% saved)"
    assert demo_render.run_line(ngram).endswith("; 12 requests against 24 for the fixed design (50% saved)")
    assert demo_render.run_line(draft).endswith("; 16 requests against 24 for the fixed design (33% saved); "
                                                "diagnosis: Spec on is 2.2x slower: the draft is almost never "
                                                "accepted.")
    total = "run until decided: 28 requests against 48 for the fixed design (42% saved) in all"
    assert demo_render.total_saving_line(report) == total
    closing = demo_render.closing_lines(report)
    assert closing[2] == total and closing[3].startswith("machine: ")
    text = " ".join(console_text(report).split())
    assert total in text and "(50% saved)" in text and "(33% saved)" in text
    md = demo_render.to_markdown(report)
    assert f"\n{total}.\n" in md and md.index(total) < md.index("## Run 1:")
    assert "- ngram: the response came" in md and "(50% saved)\n" in md
    html = unescape(demo_render.to_html(report))
    assert "<th>requests</th>" in html
    assert '<td class="saving">12 requests against 24 for the fixed design (50% saved)</td>' in html
    assert '<td class="saving">16 requests against 24 for the fixed design (33% saved)</td>' in html
    assert f'<p class="saving">{total}.</p>' in html
    # each run's compare body states the design and its outcome beside the verdict
    assert html.count('<p class="sequential">Design: run until decided') == 2


def test_a_fixed_design_run_saves_nothing_and_says_so():
    report = decided_demo_report(fixed_second=True)
    assert demo_render.saving_text(report.runs[1]) is None
    assert "saved" not in demo_render.run_line(report.runs[1])
    assert demo_render.total_saving_line(report) == ("run until decided: 12 requests against 24 for the fixed "
                                                     "design (50% saved) in all")
    assert '<td class="saving">fixed design</td>' in unescape(demo_render.to_html(report))
    old = demo_report()  # no run stopped by the rule: nothing of the rule anywhere
    assert demo_render.total_saving_line(old) is None
    assert "saved" not in demo_render.to_markdown(old) and "saved" not in console_text(old)
    assert "<th>requests</th>" not in demo_render.to_html(old)

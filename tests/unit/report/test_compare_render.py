"""Compare reports from synthetic records: analysis, gate, JUnit, Markdown, HTML."""

import re
import xml.etree.ElementTree as ET

import pytest
from junitparser import JUnitXml

from specadapt.analysis.gate import apply_gate
from specadapt.analysis.identity import identity_report
from specadapt.analysis.speed import analyse
from specadapt.records import (
    CompareReport,
    CompareSettings,
    CounterPair,
    CounterSnapshot,
    Prompt,
    RequestRecord,
    ServerInfo,
    Triage,
)
from specadapt.report.compare_render import to_junit, to_markdown
from specadapt.report.html import to_html

PROMPTS = [Prompt(id=f"p{i}", category="grounded" if i < 2 else "open", prompt=f"prompt {i}") for i in range(4)]


def rec(side, pid, repeat, tokens, ms_per_token):
    n = len(tokens)
    chunk_ns = [int(20e6 + i * ms_per_token * 1e6) for i in range(n)]
    return RequestRecord(prompt_id=pid, category="x", api="completions", side=side, repeat=repeat, ok=True,
                         tokens=tokens, text="".join(tokens), output_tokens=n, chunk_ns=chunk_ns,
                         chunk_tokens=[1] * n, e2e_ns=chunk_ns[-1] + 1_000_000)


def make_report():
    recs = []
    for r in range(3):
        for i, p in enumerate(PROMPTS):
            base = [f"t{j}" for j in range(20)]
            on = list(base)
            if p.id == "p1":
                on[5] = "DIFF"
            if p.id == "p3":
                on[9] = "BUG"
            recs += [rec("off", p.id, r, base, 50 + r), rec("on", p.id, r, on, 25 + r)]
    before = CounterSnapshot(drafts=0, draft_tokens=0, accepted_tokens=0, accepted_per_position={0: 0, 1: 0},
                             generation_tokens=0)
    after = CounterSnapshot(drafts=100, draft_tokens=200, accepted_tokens=120, accepted_per_position={0: 70, 1: 50},
                            generation_tokens=240)
    info = ServerInfo(backend="vllm", base_url="http://x", model_id="m", version="0.32.0")
    report = CompareReport(settings=CompareSettings(repeat=3), off_server=info,
                           on_server=info.model_copy(update={"spec_enabled": True, "num_speculative_tokens": 2}),
                           requests=recs, counters_on={1: CounterPair(before=before, after=after)})
    analyse(report)

    def triage(prompt, div, off):
        if prompt.id == "p1":
            return Triage(verdict="near-tie", source="server-logprobs", margin=0.1, threshold=0.5)
        return Triage(verdict="suspect", source="server-logprobs", margin=3.0, threshold=0.5)

    report.identity = identity_report(recs, PROMPTS, triage)
    report.counts = {v: sum(1 for p in report.identity if p.verdict == v)
                     for v in ("identical", "near-tie", "suspect", "unknown")}
    return report


def test_analysis_speed_and_acceptance():
    report = make_report()
    (lv,) = report.levels
    assert lv.pairs == 12
    # ITL halves: TPOT ratio ~ (50+r)/(25+r) averaged, clearly > 1.8
    assert lv.speed.tpot.point > 1.8 and lv.speed.tpot.low <= lv.speed.tpot.point <= lv.speed.tpot.high
    assert lv.acceptance.acceptance_rate == pytest.approx(0.6)
    assert lv.acceptance.mean_acceptance_length == pytest.approx(2.2)
    assert lv.theory.predicted_speedup == pytest.approx(2.2)  # c = 0: tokens per pass
    assert [p.prompt_id for p in lv.by_prompt] == ["p0", "p1", "p2", "p3"]


def test_gate_and_counts():
    report = make_report()
    assert report.counts == {"identical": 2, "near-tie": 1, "suspect": 1, "unknown": 0}
    gate = apply_gate(report, max_suspect=0)
    assert not gate.passed and "p3" in gate.reasons[0]
    assert apply_gate(report, max_suspect=1).passed
    assert not apply_gate(report, max_suspect=1, max_near_tie=0).passed
    assert not apply_gate(report, max_suspect=1, min_speedup=5.0).passed


def test_junit_round_trip_counts():
    report = make_report()
    apply_gate(report, max_suspect=0, min_speedup=1.0)
    xml_text = to_junit(report)
    path_cases = JUnitXml.fromstring(xml_text)
    suites = list(path_cases) if not hasattr(path_cases, "name") or path_cases._tag == "testsuites" else [path_cases]
    cases = [c for s in suites for c in s]
    assert {c.name for c in cases} == {"p0", "p1", "p2", "p3", "speedup", "lossless-config"}
    failed = {c.name for c in cases if c.result and type(c.result[0]).__name__ == "Failure"}
    assert failed == {"p3"}
    root = ET.fromstring(xml_text)  # plain XML consumers too
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    assert int(suite.get("tests")) == 6 and int(suite.get("failures")) == 1


def test_markdown_summary():
    report = make_report()
    apply_gate(report)
    md = to_markdown(report)
    assert "**Gate: FAIL**" in md and "`p3`: **suspect** at token 9" in md and "`p1`: **near-tie**" in md


def test_html_is_self_contained_with_three_plots():
    report = make_report()
    apply_gate(report)
    html = to_html(report)
    assert html.count("<svg") >= 3
    assert not re.search(r"""(src|href)=["']https?://""", html)
    assert "<script" not in html
    assert "suspect" in html and "FAIL" in html


def test_saved_compare_report_is_shown_and_exported_again(tmp_path):
    from click.testing import CliRunner

    from specadapt.cli import cli
    from specadapt.records import write_report

    report = make_report()
    apply_gate(report)
    saved = tmp_path / "report.json"
    write_report(report, saved)
    shown = CliRunner().invoke(cli, ["report", "show", str(saved)])
    assert shown.exit_code == 0 and "identity: 2 identical, 1 near-tie, 1 suspect" in shown.output
    out = CliRunner().invoke(cli, ["report", "export", str(saved), "--markdown", str(tmp_path / "s.md"),
                                   "--junit", str(tmp_path / "j.xml")])
    assert out.exit_code == 0, out.output
    assert (tmp_path / "s.md").read_text() == to_markdown(report)
    assert (tmp_path / "j.xml").read_text() == to_junit(report)
    refused = CliRunner().invoke(cli, ["report", "export", str(saved)])
    assert refused.exit_code == 2 and "give at least one of" in refused.output


# ------------------------------------------------------------------------------ what the gate certifies, rendered

def certified_report(ran=True, lossy=(), concurrency_only=True):
    """make_report's prompts with speculation's activity: p0 never used an accepted draft, p3's suspect
    divergence appeared only under concurrency and its path was scored."""
    from specadapt.analysis.activity import spec_activity

    report = make_report()
    for r in report.requests:
        if r.side == "on" and r.prompt_id != "p0":
            r.chunk_tokens = [1, 3] + [1] * 16  # 20 tokens in 18 chunks: 2 accepted
    report.activity = spec_activity(report)
    if ran is not True:
        report.activity.ran, report.activity.evidence = ran, "the spec-on server says speculation is off"
    report.lossy = list(lossy)
    p3 = next(p for p in report.identity if p.prompt_id == "p3")
    p3.concurrency_only, p3.diverged_levels = concurrency_only, [4]
    p3.divergence.triage.path_checked, p3.divergence.triage.path_margin = 11, 3.0
    p3.divergence.triage.path_position, p3.divergence.triage.path_token = 9, "BUG"
    return report


def test_console_says_whether_it_ran_where_and_what_the_run_proves():
    from rich.console import Console

    from specadapt.report.compare_render import render_console

    report = certified_report()
    apply_gate(report, max_suspect=1, max_suspect_rate=0.01)
    console = Console(record=True, width=300)
    render_console(report, console)
    text = console.export_text()
    assert "identity: 2 identical, 1 near-tie, 1 suspect, 0 unknown (of 4 prompts), 1 of them only under concurrency" in text
    assert "speculation ran: the spec-on server's counters: 200 draft tokens proposed, 120 accepted" in text
    # 18 accepted by the chunks against 120 by the counters: more than k = 2 per request apart
    assert ("per prompt: not known (the chunks count 18 accepted tokens at concurrency 1, the server's counters 120: "
            "chunks are not one engine step each there)") in text
    assert "proof: no prompt used an accepted draft: the run bounds no suspect rate" in text
    assert "p3: SUSPECT ONLY UNDER CONCURRENCY at token 9" in text
    assert "on path: 11 tokens scored, largest margin 3.000 at token 9 ('BUG')" in text
    assert "gate: FAIL" in text and "more exercised prompts would be needed" in text


def test_every_format_states_the_activity_the_lossy_settings_and_the_bound():
    from specadapt.analysis.activity import spec_activity

    report = certified_report(lossy=["rejection_sample_method 'synthetic': forced"])
    report.counters_on = {}  # no counters: the chunks are used unchecked
    report.activity = spec_activity(report)
    apply_gate(report, max_suspect=1)
    md = to_markdown(report)
    assert "- per prompt (streamed chunks, one engine step each (not checked: the server gives no spec-decode " \
           "counters)): 3 of 4 prompts exercised; 18 of 240 output tokens came from accepted drafts (8%)" in md
    assert "- not exercised (no accepted draft; not counted in the proof): p0" in md
    assert "- lossy by configuration: rejection_sample_method 'synthetic': forced" in md
    assert "- proof: 1 suspect in 3 exercised prompts: suspect rate below 86.5% at 95% confidence" in md
    assert "`p3`: **suspect** only under concurrency at token 9" in md
    assert "  - on its own path: 11 tokens scored, largest margin 3.000 at token 9" in md
    html = to_html(report)
    assert "only under concurrency" in html and "lossy by configuration: rejection_sample_method" in html
    assert "on its own path: 11 tokens," in html and "suspect rate below 86.5%" in html
    cases = junit_cases(report)
    assert cases["lossless-config"].result[0].message.startswith("lossy by configuration, so identity is not promised")
    assert not cases["speculation-ran"].result and "suspect rate below 86.5%" in cases["suspect-rate"].system_out
    assert "not exercised" in cases["p0"].system_out and not cases["p0"].result
    assert report.gate.bound.exercised_prompts == 3 and report.model_dump()["gate"]["bound"]["upper"] > 0.86


def junit_cases(report) -> dict:
    root = JUnitXml.fromstring(to_junit(report))
    suites = list(root) if root._tag == "testsuites" else [root]
    return {c.name: c for suite in suites for c in suite}


def test_junit_fails_the_speculation_case_when_it_did_not_run():
    report = certified_report(ran=False)
    apply_gate(report, max_suspect=1)
    cases = junit_cases(report)
    assert cases["speculation-ran"].result[0].message.startswith("speculation did not run")
    assert not cases["lossless-config"].result


# ------------------------------------------------------------------------------ run until decided, rendered

def decided_report(stopped="decided", verdict="faster", margin=None, fail_divergences=None, gate=True):
    """make_report's level as the rule left it (design and outcome set by hand)."""
    from specadapt.records import RatioCI
    from specadapt.records.sequential import SequentialDesign, SequentialOutcome

    report = make_report()
    report.settings.sequential = SequentialDesign(alpha=0.05, phi=1.0, max_units=40, first_look=6, min_units=4,
                                                  margin=margin, fail_divergences=fail_divergences)
    interval = {"decided": RatioCI(point=1.62, low=1.21, high=2.17, n=7, method="cs", min_n=5),
                "cap": RatioCI(point=1.01, low=0.91, high=1.12, n=40, method="cs", min_n=5),
                "identity": RatioCI(point=1.8, n=3, method="cs", min_n=5, too_few=True)}[stopped]
    units = interval.n
    report.levels[0].sequential = SequentialOutcome(verdict=verdict, stopped=stopped, units=units,
                                                    requests=2 * units, fixed_requests=72, interval=interval,
                                                    text="(the analysis' sentence)")
    if gate:
        apply_gate(report, max_suspect=1, min_speedup=1.0)
    return report


DESIGN_LINE = ("run until decided: after each unit, the anytime-valid 95% t confidence sequence of the TPOT ratio "
               "(alpha 0.05, valid at any stop; normal mixture, phi 1) decides faster or slower (no equivalence "
               "margin); first look after 6 units; cap 40 units per level; floor 4 units per level; E2E and "
               "tokens/s have their own sequences at alpha 0.05, each valid at the stop on its own; for all three "
               "ratios at once the error rate is at most 3 x alpha = 0.15 (alpha/3 = 0.0167 each for 0.05 together)")
DECIDED = ("concurrency 1: TPOT 1.62x [1.21, 2.17] faster: decided after 7 of at most 40 pairs (anytime-valid 95% "
           "interval, alpha 0.05: valid at any stop); 14 requests against 72 for the fixed design")


def test_the_design_and_each_levels_outcome_stand_beside_the_verdict_in_every_format():
    from rich.console import Console

    from specadapt.report.compare_render import render_console, sequential_lines

    report = decided_report()
    assert sequential_lines(report) == [DESIGN_LINE, DECIDED]
    console = Console(record=True, width=400)
    render_console(report, console)
    text = " ".join(console.export_text().split())  # long lines wrap
    assert DESIGN_LINE in text and DECIDED in text
    assert "anytime-valid 95% intervals (confidence sequences)" in text and "95% t interval" not in text
    md = to_markdown(report)
    assert f"\nDesign: {DESIGN_LINE}.\n\n- {DECIDED}\n" in md
    assert md.index("| concurrency / rate |") < md.index("Design: ") < md.index("Identity: ")
    html = to_html(report)
    plain = re.sub(r"\s+", " ", html)
    from html import unescape
    assert f'<p class="sequential">Design: {DESIGN_LINE}.</p>' in unescape(plain)
    assert f"<li>{DECIDED}</li>" in unescape(plain)
    case = junit_cases(report)["speedup"]
    assert case.system_out == f"{DESIGN_LINE}\n{DECIDED}"


@pytest.mark.parametrize("stopped, verdict, margin, fail, line", [
    ("cap", "no clear difference", None, None,
     "concurrency 1: TPOT no clear difference: interval [0.91, 1.12] at the cap of 40 pairs; 80 requests against 72 "
     "for the fixed design"),
    ("decided", "equivalent", 0.05, None,
     "concurrency 1: TPOT 1.62x [1.21, 2.17] equivalent within +-5%: decided after 7 of at most 40 pairs "
     "(anytime-valid 95% interval, alpha 0.05: valid at any stop); 14 requests against 72 for the fixed design"),
    # make_report: p1 (a near-tie) and p3 (suspect) diverged; the stop counts every divergence, before triage
    ("identity", "no clear difference", None, 1,
     "concurrency 1: stopped to fail after 3 of at most 40 pairs: 2 prompts diverged (the gate cannot pass); "
     "TPOT 1.80x (too few pairs, n = 3 < 5) so far; 6 requests against 72 for the fixed design"),
])
def test_the_cap_the_margin_and_the_stop_to_fail_in_one_sentence_each(stopped, verdict, margin, fail, line):
    from specadapt.report.compare_render import sequential_lines

    report = decided_report(stopped, verdict, margin, fail)
    design, *levels = sequential_lines(report)
    assert levels == [line]
    assert ("equivalent within +-5%; first look" in design) == (margin is not None)
    assert ("; stops to fail once 1 prompt diverged;" in design) == (fail is not None)
    assert line in to_markdown(report) and junit_cases(report)["speedup"].system_out.endswith(line)


def test_a_level_the_stop_to_fail_came_before_says_it_was_not_run():
    from specadapt.records import RatioCI
    from specadapt.report.compare_render import outcome_text

    report = decided_report("identity", "no clear difference", None, 1)
    lv = report.levels[0]
    lv.sequential = lv.sequential.model_copy(update={"units": 0, "requests": 0,
                                                     "interval": RatioCI(point=None, method="cs", min_n=5)})
    assert outcome_text(report, lv) == ("not run: the run stopped to fail before this level: 2 prompts diverged "
                                        "(the gate cannot pass)")


def test_without_a_speed_gate_the_rules_verdicts_are_a_passing_speed_case():
    report = decided_report(gate=False)
    cases = junit_cases(report)
    assert not cases["speed"].result and cases["speed"].system_out == f"{DESIGN_LINE}\n{DECIDED}"
    assert cases["speed"].classname == "specadapt.speed" and "speedup" not in cases


def test_a_fixed_design_report_says_nothing_of_the_rule():
    from specadapt.report.compare_render import INTERVAL_NOTE, interval_note, sequential_lines

    report = make_report()
    apply_gate(report)
    assert report.settings.sequential is None and sequential_lines(report) == []
    assert interval_note(report) == INTERVAL_NOTE
    assert "Design:" not in to_markdown(report) and 'class="sequential"' not in to_html(report)
    assert "speed" not in junit_cases(report)
    # the rule set but no level has its outcome yet (a run stopped before any): the design line only
    decided = decided_report(gate=False)
    decided.levels[0].sequential = None
    assert sequential_lines(decided) == [DESIGN_LINE]

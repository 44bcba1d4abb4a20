"""The why section in each format: the figures, causes, advice and gaps of a constructed diagnosis."""

from __future__ import annotations

from rich.console import Console

from specadapt.records import RatioCI
from specadapt.records.diagnosis import Advice, Cause, Diagnosis, LevelFigures
from specadapt.report.diagnosis_render import diagnosis_html, diagnosis_markdown, level_line, render_diagnosis

FIG = LevelFigures(level="concurrency 1", concurrency=1, k=4, verdict="slower",
                   tpot_ratio=RatioCI(point=0.83, low=0.76, high=0.89, n=8, method="t"), tokens_per_pass=3.01,
                   pass_cost=3.63, pass_cost_low=3.38, pass_cost_high=3.96, draft_cost_per_pass=0.0,
                   break_even_tokens_per_pass=3.63, break_even_acceptance=0.71, break_even_possible=True,
                   ideal_speedup=2.9, measured_over_ideal=0.29, model="1 + c k", model_best_k=0,
                   model_best_speedup=1.0)
D = Diagnosis(headline="Spec on is slower at concurrency 1 <because>", levels=[FIG],
              causes=[Cause(code="verify-compute-bound", level="concurrency 1", text="a pass costs 3.63 & more")],
              advice=[Advice(code="dtype", text="serve float32")], evidence_gaps=["too few [things]"])


def test_the_console_says_each_level_in_a_sentence_and_every_cause_advice_and_gap():
    console = Console(record=True, width=300)
    render_diagnosis(D, console, machine="AMD EPYC, 2 CPUs; dtype bfloat16")
    text = console.export_text()
    assert text.startswith("why: Spec on is slower at concurrency 1 <because>")
    line = level_line(FIG)
    assert line == ("concurrency 1: TPOT 0.83x [0.76, 0.89] slower; 3.01 tokens per pass; a pass costs 3.63 "
                    "[3.38, 3.96] decode steps; break-even 3.63 tokens (acceptance 71%); ideal 2.90x (measured "
                    "0.29 of it); model's best off (1.00x, 1 + c k)")
    assert line in text
    assert "cause (concurrency 1): a pass costs 3.63 & more" in text and "to do: serve float32" in text
    assert "not enough evidence: too few [things]" in text  # brackets are text, not markup
    assert "spec-on server's machine: AMD EPYC, 2 CPUs; dtype bfloat16" in text
    empty = Console(record=True)
    render_diagnosis(None, empty)
    assert empty.export_text() == ""


def test_markdown_and_html_hold_the_table_and_escape_the_text():
    md = "\n".join(diagnosis_markdown(D, "a machine"))
    assert "### Why" in md and "| concurrency 1 | 0.83x [0.76, 0.89] slower | 3.01 | 3.63 [3.38, 3.96] |" in md
    assert "- to do: serve float32" in md and "- spec-on server's machine: a machine" in md
    html = str(diagnosis_html(D, "a <machine>", heading=3))
    assert html.startswith("<h3>Why</h3>")
    assert "&lt;because&gt;" in html and "3.63 &amp; more" in html and "a &lt;machine&gt;" in html
    assert "<tr><td>concurrency 1</td>" in html and html.count("<td class=\"num\">") == 7
    impossible = FIG.model_copy(update={"break_even_possible": False, "pass_cost": 6.0,
                                        "break_even_tokens_per_pass": 6.0})
    assert "6.00 tokens: > k + 1, impossible" in level_line(impossible)
    assert diagnosis_markdown(None) == [] and str(diagnosis_html(None)) == ""


def test_where_drafts_land_is_one_line_in_each_format_and_absent_when_empty():
    landed = D.model_copy(update={"drafts_land": "Drafts land on code <x> (acceptance 71%); they do not on chat [y]."})
    console = Console(record=True, width=300)
    render_diagnosis(landed, console)
    lines = console.export_text().splitlines()
    line = "  by category: Drafts land on code <x> (acceptance 71%); they do not on chat [y]."
    assert line in lines and lines.index(line) == lines.index("  cause (concurrency 1): a pass costs 3.63 & more") + 1
    md = diagnosis_markdown(landed)
    assert md[md.index("- cause (concurrency 1): a pass costs 3.63 & more") + 1] == (
        "- by category: Drafts land on code <x> (acceptance 71%); they do not on chat [y].")
    html = str(diagnosis_html(landed))
    assert ("<li>cause (concurrency 1): a pass costs 3.63 &amp; more</li><li>by category: Drafts land on code &lt;x&gt; "
            "(acceptance 71%); they do not on chat [y].</li><li>to do: serve float32</li>") in html
    plain = Console(record=True, width=300)
    render_diagnosis(D, plain)
    assert "by category" not in plain.export_text()
    assert not any("by category" in x for x in diagnosis_markdown(D)) and "by category" not in str(diagnosis_html(D))

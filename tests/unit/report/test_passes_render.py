"""Speculation per request and per pass, rendered (report/passes_render.py): the lesson's answer
pass by pass in the console, Markdown and HTML, from records built by hand; the counts-only
forms; escaping; the not-available line; the compare section and the probe page."""

from __future__ import annotations

import io
from html.parser import HTMLParser

from rich.cells import cell_len
from rich.console import Console

from specadapt.analysis.passes import NOT_AVAILABLE, figures, positions
from specadapt.analysis.sections import analyse_sections
from specadapt.analysis.speed import analyse
from specadapt.records import (
    CompareReport,
    CompareSettings,
    CounterPair,
    CounterSnapshot,
    RequestRecord,
    ServerInfo,
)
from specadapt.records.passes import CounterCheck, RequestPasses, SpeculationSeen
from specadapt.report.passes_render import (
    DRAFT_STYLE,
    OWN_STYLE,
    answer_text,
    passes_html,
    passes_markdown,
    render_passes,
)

K = 5
# The lesson: after the prefill's token, the draft proposes 'La capital de Francia es', the target
# keeps all five and adds 'París' itself (six tokens in one pass); then a pass that keeps nothing.
LESSON_TOKENS = ["\n", "La", " capital", " de", " Francia", " es", " París", "."]
LESSON_PASSES = [1, 6, 1]
# A poorly matched draft: one token per pass; its tokens need escaping.
POOR_TOKENS = ["<b>&", " \"x\"", "\t", " y", "z"]
POOR_PASSES = [1, 1, 1, 1, 1]


def record(prompt_id: str, category: str, tokens: list[str], passes: list[int], side: str = "on",
           repeat: int = 0, ms: float = 20.0) -> RequestRecord:
    """One streamed answer, one chunk per pass; the answer's own counts (vLLM detailed) where ``side`` is on."""
    chunk_ns = [int((i + 1) * ms * 1e6) for i in range(len(passes))]
    decode = passes[1:]
    own = {} if side != "on" else dict(
        spec_accepted=sum(t - 1 for t in decode), spec_drafted=K * len(decode), spec_steps=len(decode),
        spec_step_accepted=[t - 1 for t in decode], spec_step_drafted=[K] * len(decode), spec_k=K)
    return RequestRecord(prompt_id=prompt_id, category=category, api="completions", side=side, repeat=repeat,
                         ok=True, tokens=tokens, text="".join(tokens), output_tokens=len(tokens), chunk_ns=chunk_ns,
                         chunk_tokens=passes, token_source="usage", e2e_ns=chunk_ns[-1] + 1_000_000, **own)


def answer(index: int, rec: RequestRecord, passes: list[int] | None, drafted: list[int | None] | None = None
           ) -> RequestPasses:
    decode = (passes or [])[1:]
    return RequestPasses(index=index, prompt_id=rec.prompt_id, category=rec.category, source="chunks+response",
                         passes=passes, drafted_per_pass=drafted, output_tokens=rec.output_tokens,
                         accepted=sum(t - 1 for t in decode), drafted=K * len(decode), spec_steps=len(decode))


def lesson_seen(shown: list[int] | None = None) -> tuple[SpeculationSeen, list[RequestRecord]]:
    """The lesson's answer and the poorly matched one, by hand."""
    recs = [record("capital", "factual", LESSON_TOKENS, LESSON_PASSES), record("poor", "open", POOR_TOKENS, POOR_PASSES)]
    answers = [answer(0, recs[0], LESSON_PASSES, [0, K, K]), answer(1, recs[1], POOR_PASSES, None)]
    seen = SpeculationSeen(
        available=True, source="chunks+response", source_note="the streamed chunks, checked", k=K, requests=answers,
        overall=figures("all", answers), prompts=[figures(a.prompt_id, [a]) for a in answers],
        categories=[figures(a.category, [a]) for a in answers], positions=positions(answers),
        checks=[CounterCheck(level="concurrency 1", requests=2, accepted_requests=5, accepted_counters=6, agree=False,
                             text="concurrency 1: the counts disagree")],
        findings=["concurrency 1: the counts disagree"], shown=[0, 1] if shown is None else shown)
    return seen, recs


def console_text(render, width: int = 80) -> str:
    buf = io.StringIO()
    render(Console(file=buf, width=width, color_system=None))
    return buf.getvalue()


# ----------------------------------------------------------------------------- console

def test_the_console_brackets_exactly_the_lessons_passes_and_sets_the_targets_token_apart():
    seen, recs = lesson_seen()
    text = answer_text(recs[0], seen.requests[0])
    caption, body = text.plain.split("\n")
    assert caption == f"capital (factual): {len(LESSON_TOKENS)} tokens in {len(LESSON_PASSES)} passes of the target"
    assert body == "[↵][La capital de Francia es| París][.]"
    styled = {style: [text.plain[s.start:s.end] for s in text.spans if s.style == style]
              for style in (DRAFT_STYLE, OWN_STYLE)}
    assert styled[DRAFT_STYLE] == ["La capital de Francia es"]  # the five accepted draft tokens, one pass
    assert styled[OWN_STYLE] == ["↵", " París", "."]  # each pass's own token


def test_without_matching_token_strings_the_passes_are_counts_and_without_passes_the_answers_own_counts():
    seen, recs = lesson_seen()
    a = seen.requests[0]
    for rec in (recs[0].model_copy(update={"tokens": []}), recs[0].model_copy(update={"tokens": ["La", "x"]})):
        assert "[1][6][1]" in answer_text(rec, a).plain
    unknown = a.model_copy(update={"passes": None, "source": "response"})
    plain = answer_text(recs[0], unknown).plain
    assert f"{a.output_tokens} tokens" in plain and f"passes not known: 5 of {2 * K} draft tokens accepted" in plain


def test_every_console_line_fits_the_width_even_for_long_and_wide_tokens():
    tokens = ["~" * 130, *["漢字" * 3] * 30, *[" word"] * 40]
    passes = [1, 30, *[4] * 10]
    rec = record("long", "open", tokens, passes)
    seen, _ = lesson_seen()
    a = answer(2, rec, passes)
    seen = seen.model_copy(update={"requests": [*seen.requests, a], "shown": [0, 1, 2]})
    for width in (80, 33):
        assert all(cell_len(line) <= width for line in answer_text(rec, a, width).plain.split("\n"))
    out = console_text(lambda c: render_passes(seen, [*lesson_seen()[1], rec], c))
    assert all(cell_len(line) <= 80 for line in out.splitlines())
    assert "[La capital de Francia es| París]" in out and "~" * 70 in out  # the long token is cut, not lost
    assert out.count("~") == 130


def test_the_console_gives_figures_per_category_the_checks_and_findings_then_the_answers():
    seen, recs = lesson_seen()
    out = console_text(lambda c: render_passes(seen, recs, c))
    # factual: 5 of 10 drafted accepted, 8 tokens in 3 passes; open: 0 accepted, one token per pass
    assert "factual: acceptance 50%, 2.67 tokens per pass (p50 2.67), 1 answer" in out
    assert "open: acceptance 0%, 1.00 tokens per pass" in out
    assert "check (DISAGREES): concurrency 1: the counts disagree" in out
    assert "finding: concurrency 1: the counts disagree" in out
    assert out.index("factual:") < out.index("[La capital") and "[<b>&][ \"x\"][⇥][ y][z]" in out
    none = console_text(lambda c: render_passes(seen.model_copy(update={"shown": []}), recs, c))
    assert "[La capital" not in none and "factual:" in none


def test_not_available_is_said_in_every_form_and_nothing_is_drawn():
    why = NOT_AVAILABLE + "concurrency 4: several requests were in flight"
    seen = SpeculationSeen(available=False, source_note=why, k=K)
    _, recs = lesson_seen()
    assert why in " ".join(console_text(lambda c: render_passes(seen, recs, c)).split())
    assert why in passes_markdown(seen, recs)
    html = str(passes_html(seen, recs, 2))
    assert f'<p class="not-available">{why}</p>' in html and 'class="pass' not in html and "<svg" not in html


# ----------------------------------------------------------------------------- Markdown

def test_markdown_tables_per_category_and_prompt_and_the_answers_in_a_fence():
    seen, recs = lesson_seen()
    md = passes_markdown(seen, recs)
    assert md[1] == "### Speculation per request and per pass"
    rows = [line for line in md if line.startswith("| factual |") or line.startswith("| capital |")]
    assert len(rows) == 2 and all(" | 1 | 50% | 5 / 10 | 2.67 | 2.67 / 2.67 / 2.67 | 50% / 50% / 50% |" in r
                                  for r in rows)
    assert "Passes by tokens produced: 1: 7, 2: 0, 3: 0, 4: 0, 5: 0, 6: 1." in md
    assert "- **finding: concurrency 1: the counts disagree**" in md
    i = md.index("capital (factual): 8 tokens in 3 passes of the target\n[↵][La capital de Francia es| París][.]")
    assert md[i - 1] == md[i + 1] == "```"
    fenced = recs[1].model_copy(update={"tokens": ["```", "a", "b", "c", "d"]})
    md = passes_markdown(seen, [recs[0], fenced])
    j = next(i for i, line in enumerate(md) if line.endswith("\n[```][a][b][c][d]"))
    assert md[j - 1] == md[j + 1] == "````"  # a fence longer than any run of backticks in the answer


# ----------------------------------------------------------------------------- HTML

class Tree(HTMLParser):
    """Elements as (tag, attrs, text inside) in document order."""

    VOID = {"br", "img", "meta", "hr", "input", "link"}

    def __init__(self, html: str):
        super().__init__(convert_charrefs=True)
        self.elements: list[dict] = []
        self.open: list[dict] = []
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        el = {"tag": tag, "attrs": dict(attrs), "text": "", "classes": set((dict(attrs).get("class") or "").split()),
              "parent": self.open[-1] if self.open else None}
        self.elements.append(el)
        if tag not in self.VOID:
            self.open.append(el)

    def handle_endtag(self, tag):
        while self.open:
            if self.open.pop()["tag"] == tag:
                break

    def handle_data(self, data):
        for el in self.open:
            el["text"] += data

    def having(self, *classes: str, inside: dict | None = None) -> list[dict]:
        """The elements with all of ``classes`` (only those within ``inside``, where given)."""
        return [e for e in self.elements if set(classes) <= e["classes"] and (inside is None or within(e, inside))]


def within(el: dict, ancestor: dict) -> bool:
    while el["parent"] is not None:
        el = el["parent"]
        if el is ancestor:
            return True
    return False


def test_html_draws_one_box_per_pass_its_tokens_styled_apart_and_a_hover_with_the_draft_length():
    seen, recs = lesson_seen()
    tree = Tree(str(passes_html(seen, recs, 2)))
    answers = tree.having("answer")
    assert [a["attrs"]["data-prompt"] for a in answers] == ["capital", "poor"]
    boxes = tree.having("pass")
    boxes = [b for b in boxes if "data-pass" in b["attrs"]]
    assert len(boxes) == len(LESSON_PASSES) + len(POOR_PASSES)
    lesson = boxes[:len(LESSON_PASSES)]
    assert [b["text"] for b in lesson] == ["↵", "La capital de Francia es París", "."]
    assert "prefill" in lesson[0]["classes"] and not any("prefill" in b["classes"] for b in lesson[1:])
    assert [b["attrs"]["title"] for b in lesson] == [
        "pass 1 (prefill): 1 token, the target's own; no draft",
        f"pass 2: 6 tokens: 5 accepted draft tokens and the target's own; draft length {K}",
        f"pass 3: 1 token, the target's own; draft length {K}"]
    assert "draft length not known" in boxes[len(LESSON_PASSES) + 1]["attrs"]["title"]
    drafts = [e["text"] for e in tree.having("tok", "draft") if e["text"] != "accepted draft token"]
    owns = [e["text"] for e in tree.having("tok", "own") if e["text"] != "the target's own token"]
    assert drafts == ["La", " capital", " de", " Francia", " es"]
    assert owns == ["↵", " París", ".", "<b>&", " \"x\"", "⇥", " y", "z"]
    captions = [e["text"] for e in tree.having("tokens-in-passes")]
    assert captions == ["8 tokens in 3 passes of the target", "5 tokens in 5 passes of the target"]
    assert tree.having("legend")


def test_html_escapes_tokens_and_plots_the_histogram_and_acceptance_by_position():
    seen, recs = lesson_seen()
    html = str(passes_html(seen, recs, 2))
    assert "<b>&" not in html and '<span class="tok own">&lt;b&gt;&amp;</span>' in html
    assert '<figure class="positions" aria-label="acceptance by position in the answer"><svg' in html
    assert '<figure class="histogram" aria-label="tokens per pass of the target"><svg' in html
    assert html.count('<table class="pass-figures">') == 2


def test_html_without_token_strings_draws_the_passes_as_counts():
    seen, recs = lesson_seen(shown=[0])
    tree = Tree(str(passes_html(seen, [recs[0].model_copy(update={"tokens": []}), recs[1]], 3)))
    boxes = [b for b in tree.having("pass", "count")]
    assert [b["text"] for b in boxes] == ["1", "6", "1"] and not tree.having("tok", "draft")[1:]


# ----------------------------------------------------------------------------- in the reports

def lesson_compare_report(show: int = 3) -> CompareReport:
    """A compare report whose spec-on answers stream one chunk per pass with their own counts (the
    counters agree): the lesson's answer, a grounded answer and a poorly matched one, twice each."""
    grounded = ["The", " report", " says", ":", " \"", "revenue", " rose", " 12", "%", " to", " $", "4", ".",
                "2", "B", "\"", " in", " Q", "3", " <", "per", " the", " filing", ">", "\n", "Costs", " fell", "."]
    grounded_passes = [1, 4, 1, 5, 3, 6, 2, 1, 4, 1]
    poor = ["Maybe", " a", " poem", " about", " the", " sea", ":", "\n", "waves", " &", " foam"]
    cases = [("capital", "factual", LESSON_TOKENS, LESSON_PASSES), ("grounded", "grounded", grounded, grounded_passes),
             ("poor", "open", poor, [1] * len(poor))]
    return analysed_compare(cases, show)


def analysed_compare(cases, show: int) -> CompareReport:
    """A compare report of ``cases`` ((prompt id, category, token strings, passes) each), twice each:
    the spec-off answers one token per chunk, the spec-on ones one chunk per pass with their own counts
    (the counters agree), analysed as compare does (the speculation section included)."""
    recs: list[RequestRecord] = []
    for repeat in range(2):
        for pid, cat, tokens, passes in cases:
            recs.append(record(pid, cat, tokens, [1] * len(tokens), side="off", repeat=repeat, ms=30))
            recs.append(record(pid, cat, tokens, passes, side="on", repeat=repeat, ms=30))
    on = [r for r in recs if r.side == "on"]
    before = CounterSnapshot(drafts=0, draft_tokens=0, accepted_tokens=0, generation_tokens=0)
    after = CounterSnapshot(drafts=sum(r.spec_steps for r in on), draft_tokens=sum(r.spec_drafted for r in on),
                            accepted_tokens=sum(r.spec_accepted for r in on),
                            generation_tokens=sum(r.output_tokens for r in on))
    info = ServerInfo(backend="vllm", base_url="http://x", model_id="m", version="0.32.0")
    report = CompareReport(settings=CompareSettings(repeat=2, show=show),
                           off_server=info.model_copy(update={"base_url": "http://off"}),
                           on_server=info.model_copy(update={"spec_enabled": True, "num_speculative_tokens": K}),
                           requests=recs, counters_on={1: CounterPair(before=before, after=after)})
    analyse(report)
    analyse_sections(report)
    return report


def test_a_compare_report_shows_the_section_in_every_form_before_identity():
    from specadapt.report.compare_render import render_console, to_markdown
    from specadapt.report.html import to_html

    report = lesson_compare_report()
    assert "speculation" in report.sections
    out = console_text(lambda c: render_console(report, c), width=80)
    assert "[↵][La capital de Francia es| París][.]" in out and out.index("[La capital") < out.index("identity:")
    assert "add up to the server's counters" in " ".join(out.split())
    md = to_markdown(report)
    assert md.index("### Speculation per request and per pass") < md.index("Identity:")
    html = to_html(report)
    assert html.index("Speculation per request and per pass") < html.index(">Identity<")
    assert html.count('data-pass="') == len(LESSON_PASSES) + 10 + 11  # the three answers' passes


def test_the_probe_console_and_pages_show_the_speculation():
    from specadapt.analysis.probe_report import build_probe_report
    from specadapt.records import ProbeSettings, RequestSettings
    from specadapt.report.console import render_probe
    from specadapt.report.probe_render import to_html, to_markdown

    rec = record("capital", "factual", LESSON_TOKENS, LESSON_PASSES)
    acc = rec.spec_accepted
    before = CounterSnapshot(drafts=0, draft_tokens=0, accepted_tokens=0, generation_tokens=0, source="m")
    after = CounterSnapshot(drafts=rec.spec_steps, draft_tokens=rec.spec_drafted, accepted_tokens=acc,
                            generation_tokens=rec.output_tokens, source="m")
    settings = ProbeSettings(concurrency=1, repeat=1, warmup=0, prompts_source="built-in", request=RequestSettings())
    server = ServerInfo(backend="vllm", base_url="http://p", model_id="pm", spec_enabled=True, num_speculative_tokens=K)
    report = build_probe_report(server, settings, [rec], before, after, scale=None)
    assert report.speculation is not None and report.speculation.shown == [0]
    out = console_text(lambda c: render_probe(report, c))
    assert "[↵][La capital de Francia es| París][.]" in out
    assert "[↵][La capital de Francia es| París][.]" in to_markdown(report)
    page = to_html(report)
    assert page.count('data-pass="') == len(LESSON_PASSES) and "<h3>Speculation per request and per pass</h3>" in page

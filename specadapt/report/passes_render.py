"""Speculation per request and per pass (records/passes.py), in the console, Markdown and HTML:
the figures per category and per prompt, the checks against the server's counters, and chosen
answers drawn pass by pass.

A pass of the target produces its accepted draft tokens and one token of its own. The console
and Markdown forms bracket each pass and set the target's own token apart with a bar,
``[ capital de Francia es| París]``; the console colours them too (accepted draft tokens green,
the target's own bold). The HTML form draws each pass as a box, its draft tokens and the
target's own token styled apart, a hover giving the pass's number, its tokens and its draft
length. Whitespace in tokens is kept and shown: a line break as ``↵``, a tab as ``⇥``, other
control characters as their escapes. Where the answer's token strings are not kept, or do not
add up to its passes, the passes are shown as counts.
"""

from __future__ import annotations

from collections.abc import Sequence

from jinja2 import Environment
from markupsafe import Markup
from rich.cells import cell_len
from rich.console import Console
from rich.text import Text

from specadapt.analysis.passes import percent, tokens_in_passes
from specadapt.records import RequestRecord
from specadapt.records.passes import PassFigures, RequestPasses, SpeculationSeen
from specadapt.report import page

DRAFT_STYLE = "green"
OWN_STYLE = "bold"
MARK_STYLE = "dim"
HEADING = "Speculation per request and per pass"
LEGEND = "[accepted draft tokens|the target's own token]: one pass of the target"
VISIBLE = {"\n": "↵", "\t": "⇥", "\r": "␍"}


# ----------------------------------------------------------------------------- shared pieces

def visible(token: str) -> str:
    """The token with its whitespace shown: a line break as ↵, a tab as ⇥, a carriage return as ␍,
    other control characters as escapes; spaces stay spaces."""
    out = []
    for ch in token:
        if ch in VISIBLE:
            out.append(VISIBLE[ch])
        elif not ch.isprintable() and ch != " ":
            out.append(ch.encode("unicode_escape").decode("ascii"))
        else:
            out.append(ch)
    return "".join(out)


def pass_tokens(rec: RequestRecord | None, a: RequestPasses) -> list[list[str]] | None:
    """The answer's tokens cut into its passes: their texts read back from the server where its token
    strings are ids (``a.texts``), else its token strings; None where the passes are not known or the
    tokens are not kept or do not add up to them."""
    tokens = a.texts if a.texts is not None else (rec.tokens if rec is not None else None)
    if not a.passes or not tokens or len(tokens) != sum(a.passes):
        return None
    out, at = [], 0
    for t in a.passes:
        out.append(list(tokens[at:at + t]))
        at += t
    return out


def draft_length(a: RequestPasses, i: int) -> int | None:
    """Draft tokens pass ``i`` checked, where known."""
    d = a.drafted_per_pass
    return d[i] if d is not None and 0 <= i < len(d) else None


def pass_title(a: RequestPasses, i: int) -> str:
    """The hover of pass ``i``: its number, the tokens it produced and its draft length."""
    t = (a.passes or [])[i]
    if i == 0:
        return f"pass 1 (prefill): {t} token{'s' if t != 1 else ''}, the target's own; no draft"
    d = draft_length(a, i)
    made = f"pass {i + 1}: {t} token{'s' if t != 1 else ''}"
    if t == 1:
        made += ", the target's own"
    else:
        made += f": {t - 1} accepted draft token{'s' if t != 2 else ''} and the target's own"
    return made + f"; draft length {'not known' if d is None else d}"


def _record(requests: Sequence[RequestRecord], a: RequestPasses) -> RequestRecord:
    if 0 <= a.index < len(requests):
        return requests[a.index]
    return RequestRecord(prompt_id=a.prompt_id, category=a.category, api="completions")


def caption(a: RequestPasses) -> str:
    """'prompt (category): N tokens in M passes of the target'."""
    return f"{a.prompt_id} ({a.category}): {tokens_in_passes(a)}"


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def _pcts(d: dict[str, float], fmt) -> str:
    return " / ".join(fmt(d.get(q)) for q in ("p10", "p50", "p90")) if d else "-"


def figure_cells(f: PassFigures) -> list[str]:
    """name, answers, acceptance, accepted/drafted, tokens per pass, its p10/p50/p90, acceptance p10/p50/p90."""
    counts = f"{f.accepted} / {'-' if f.drafted is None else f.drafted}"
    return [f.name, str(f.requests), percent(f.acceptance_rate), counts, _num(f.tokens_per_pass),
            _pcts(f.tokens_per_pass_pct, _num), _pcts(f.acceptance_rate_pct, percent)]


FIGURE_COLUMNS = ["", "answers", "acceptance", "accepted / drafted", "tokens per pass",
                  "tokens per pass p10 / p50 / p90", "acceptance p10 / p50 / p90"]


def figure_line(f: PassFigures) -> str:
    """'name: acceptance 60%, 2.20 tokens per pass (p50 2.10), 4 answers'."""
    p50 = f.tokens_per_pass_pct.get("p50")
    tpp = "tokens per pass not known" if f.tokens_per_pass is None else (
        f"{f.tokens_per_pass:.2f} tokens per pass" + ("" if p50 is None else f" (p50 {p50:.2f})"))
    return f"{f.name}: acceptance {percent(f.acceptance_rate)}, {tpp}, {f.requests} answer{'s' if f.requests != 1 else ''}"


def _shown(seen: SpeculationSeen) -> list[RequestPasses]:
    return [seen.requests[i] for i in seen.shown if 0 <= i < len(seen.requests)]


# ----------------------------------------------------------------------------- console

def _wrap(pieces: Sequence[Text], width: int) -> Text:
    """``pieces`` laid out in lines of at most ``width`` cells, a piece split only where it alone is wider."""
    out = Text()
    used = 0
    for piece in pieces:
        n = cell_len(piece.plain)
        if used and used + n > width:
            out.append("\n")
            used = 0
        while used + n > width:  # wider than a line: cut it
            cut, cells = 0, 0
            for ch in piece.plain:
                w = cell_len(ch)
                if used + cells + w > width:
                    break
                cells += w
                cut += 1
            cut = max(cut, 1)
            out.append_text(piece[:cut])
            out.append("\n")
            piece, used = piece[cut:], 0
            n = cell_len(piece.plain)
        out.append_text(piece)
        used += n
    return out


def answer_text(rec: RequestRecord, a: RequestPasses, width: int = 80) -> Text:
    """One answer in the console's compact form: its caption ('N tokens in M passes of the target'),
    then its passes bracketed, the accepted draft tokens (green) apart from the target's own token
    (bold, after a bar), in lines of at most ``width`` columns. Without the token strings, or where
    they do not add up to the passes, the passes as counts; without passes, the counts the answer gave."""
    width = max(width, 8)
    head = _wrap([Text(w + " ") for w in caption(a).split(" ")], width)
    head.rstrip()
    text = Text()
    text.append_text(head)
    text.append("\n")
    cut = pass_tokens(rec, a)
    pieces: list[Text] = []
    if cut is not None:
        for toks in cut:
            piece = Text("[", style=MARK_STYLE)
            if len(toks) > 1:
                piece.append("".join(visible(t) for t in toks[:-1]), style=DRAFT_STYLE)
                piece.append("|", style=MARK_STYLE)
            piece.append(visible(toks[-1]), style=OWN_STYLE)
            piece.append("]", style=MARK_STYLE)
            pieces.append(piece)
    elif a.passes:
        pieces.append(Text("tokens per pass (no token strings that match them): "))
        pieces += [Text(f"[{t}]", style=DRAFT_STYLE if t > 1 else OWN_STYLE) for t in a.passes]
    else:
        drafted = "-" if a.drafted is None else str(a.drafted)
        pieces.append(Text(f"passes not known: {a.accepted} of {drafted} draft tokens accepted"))
    text.append_text(_wrap(pieces, width))
    return text


def render_passes(seen: SpeculationSeen, requests: list[RequestRecord], console: Console,
                  title: str = "speculation") -> None:
    """The console form: where the figures come from, acceptance and tokens per pass per category,
    the checks against the counters, findings (bold), then the chosen answers pass by pass."""
    console.print(Text(f"{title} per request", style="bold"))
    if not seen.available:
        console.print(Text(seen.source_note or "per-request acceptance not available: no answer to read"))
    else:
        console.print(Text(f"source: {seen.source_note}"))
        groups = list(seen.categories)
        if seen.overall is not None and len(groups) != 1:
            groups.append(seen.overall)
        for f in groups:
            console.print(Text(f"  {figure_line(f)}"))
    for c in seen.checks:
        console.print(Text(f"  check ({'agrees' if c.agree else 'DISAGREES'}): {c.text}"))
    for finding in seen.findings:
        console.print(Text(f"finding: {finding}", style="bold"))
    shown = _shown(seen) if seen.available else []
    if shown:
        console.print(Text(LEGEND, style=MARK_STYLE))
    width = min(console.width or 80, 80)
    for a in shown:
        console.print(answer_text(_record(requests, a), a, width), soft_wrap=True)


# ----------------------------------------------------------------------------- Markdown

def _cell(text: str) -> str:
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def _table(rows: Sequence[Sequence[str]], first: str) -> list[str]:
    head = [first, *FIGURE_COLUMNS[1:]]
    out = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    out += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return out


def _fence(body: str) -> str:
    run, longest = 0, 0
    for ch in body:
        run = run + 1 if ch == "`" else 0
        longest = max(longest, run)
    return "`" * max(3, longest + 1)


def passes_markdown(seen: SpeculationSeen, requests: list[RequestRecord]) -> list[str]:
    """The Markdown lines: the source, tables per category and per prompt (with percentiles across
    answers), the histogram of tokens per pass, the checks, findings, and the chosen answers as
    plain text with their passes bracketed."""
    out = ["", f"### {HEADING}", ""]
    if not seen.available:
        out.append(seen.source_note or "per-request acceptance not available: no answer to read")
    else:
        out += [f"Source: {seen.source_note}.", ""]
        rows = [figure_cells(f) for f in seen.categories]
        if seen.overall is not None:
            rows.append(figure_cells(seen.overall))
        out += _table(rows, "category")
        if seen.prompts:
            out += [""] + _table([figure_cells(f) for f in seen.prompts], "prompt")
        hist = seen.overall.tokens_histogram if seen.overall is not None else []
        if hist:
            out += ["", "Passes by tokens produced: " + ", ".join(f"{i + 1}: {n}" for i, n in enumerate(hist)) + "."]
        if seen.positions:
            out += ["", "Accepted draft tokens by position in the answer: "
                    + ", ".join(f"{b.start}-{b.end - 1}: {percent(b.share)}" for b in seen.positions) + "."]
    if seen.checks or seen.findings:
        out.append("")
    out += [f"- check ({'agrees' if c.agree else 'disagrees'}): {c.text}" for c in seen.checks]
    out += [f"- **finding: {f}**" for f in seen.findings]
    shown = _shown(seen) if seen.available else []
    if shown:
        out += ["", LEGEND + ":"]
    for a in shown:
        body = answer_text(_record(requests, a), a, width=100).plain
        fence = _fence(body)
        out += ["", fence, body, fence]
    return out


# ----------------------------------------------------------------------------- HTML

STYLE = """.speculation .answer { margin: 1em 0; } .speculation .caption { margin: .2em 0; font-weight: bold; }
.speculation .passes { font-family: ui-monospace, monospace; font-size: .95em; line-height: 2.1; }
.speculation .pass { border: 1px solid #888; border-radius: 3px; padding: .15em .1em; margin-right: .25em;
  white-space: pre; background: #fff; }
.speculation .pass.prefill { border-style: dashed; }
.speculation .tok { white-space: pre; padding: 0 .05em; }
.speculation .tok + .tok { box-shadow: inset 1px 0 0 #8b8; }
.speculation .tok.draft { background: #d7f2dd; color: #064; }
.speculation .tok.own { background: #fde7c8; color: #630; font-weight: bold; }
.speculation .pass.count { padding: .15em .4em; }
.speculation .legend span { margin-right: 1em; } .speculation svg { max-width: 100%; height: auto; }
.speculation td.num { text-align: right; font-variant-numeric: tabular-nums; }
.speculation .finding { font-weight: bold; color: #c00; }"""

SECTION = """<section class="speculation"><style>{{ style }}</style>
<h{{ h }}>{{ heading }}</h{{ h }}>
{% if not s.available %}<p class="not-available">{{ s.source_note or "per-request acceptance not available: no answer to read" }}</p>
{% else %}<p class="source">Source: {{ s.source_note }}.</p>
{{ table(rows_cat, "category") }}{% if s.prompts %}{{ table(rows_prompt, "prompt") }}{% endif %}
<div class="plots">{{ plots.histogram }}{{ plots.positions }}</div>{% endif %}
{% if s.checks %}<ul class="checks">{% for c in s.checks %}<li class="{{ 'agrees' if c.agree else 'disagrees' }}">check ({{ 'agrees' if c.agree else 'disagrees' }}): {{ c.text }}</li>{% endfor %}</ul>{% endif %}
{% for f in s.findings %}<p class="finding">finding: {{ f }}</p>{% endfor %}
{% include "pass_answers.html" %}</section>"""

ANSWERS = """{% if answers %}<h{{ h + 1 }}>Answers pass by pass</h{{ h + 1 }}>
<p class="legend"><span class="pass"><span class="tok draft">accepted draft token</span><span class="tok own">the target's own token</span></span>
one box: one pass of the target (dashed: the prefill, which checks no draft); hover a pass for its draft length; ↵ is a line break.</p>
{% for a, cut in answers %}<div class="answer" data-prompt="{{ a.prompt_id }}"><p class="caption">{{ a.prompt_id }} ({{ a.category }}): <span class="tokens-in-passes">{{ tokens_in_passes(a) }}</span></p>
{% include "pass_boxes.html" %}</div>
{% endfor %}{% endif %}"""
"""The chosen answers pass by pass, the legend first (in the section, or alone: ``answers_html``)."""

BOXES = """<div class="passes">{% if cut %}{% for toks in cut %}{% set i = loop.index0 %}<span class="pass{{ ' prefill' if i == 0 }}" data-pass="{{ i + 1 }}" title="{{ title(a, i) }}">{% for t in toks[:-1] %}<span class="tok draft">{{ visible(t) }}</span>{% endfor %}<span class="tok own">{{ visible(toks[-1]) }}</span></span><wbr>{% endfor %}
{% elif a.passes %}<span class="note">no token strings that match the passes; tokens per pass:</span> {% for t in a.passes %}{% set i = loop.index0 %}<span class="pass count{{ ' prefill' if i == 0 }}" data-pass="{{ i + 1 }}" title="{{ title(a, i) }}">{{ t }}</span><wbr>{% endfor %}
{% else %}<span class="note">passes not known: {{ a.accepted }} of {{ a.drafted if a.drafted is not none else "-" }} draft tokens accepted</span>{% endif %}</div>"""
"""One answer ``a`` as boxes, one per pass (``cut``: its tokens cut into passes, or None), a line
allowed to break between two boxes; needs ``title`` and ``visible`` (``HELPERS``)."""

HELPERS = dict(visible=visible, title=pass_title, tokens_in_passes=tokens_in_passes)
"""What the answer templates call."""

TABLE = """<table class="pass-figures"><tr><th>{{ first }}</th>{% for c in columns[1:] %}<th>{{ c }}</th>{% endfor %}</tr>
{% for row in rows %}<tr><td>{{ row[0] }}</td>{% for c in row[1:] %}<td class="num">{{ c }}</td>{% endfor %}</tr>{% endfor %}</table>"""


def _plots(seen: SpeculationSeen) -> dict[str, Markup]:
    """The histogram of tokens per pass and the acceptance by position in the answer, as inline SVG."""
    plt = page.pyplot()
    plots: dict[str, Markup] = {}
    hist = seen.overall.tokens_histogram if seen.overall is not None else []
    if hist:
        fig, ax = plt.subplots(figsize=(5, 3.2))
        xs = list(range(1, len(hist) + 1))
        ax.bar(xs, hist, color="tab:green")
        ax.set_xticks(xs)
        ax.set_xlabel("tokens a pass produced (accepted + 1)")
        ax.set_ylabel("passes")
        ax.set_title("Tokens per pass of the target")
        plots["histogram"] = Markup(f'<figure class="histogram" aria-label="tokens per pass of the target">{page.inline_svg(fig)}</figure>')
        plt.close(fig)
    if seen.positions:
        fig, ax = plt.subplots(figsize=(5, 3.2))
        mids = [(b.start + b.end - 1) / 2 for b in seen.positions]
        widths = [max(b.end - b.start, 1) * 0.9 for b in seen.positions]
        ax.bar(mids, [b.share for b in seen.positions], width=widths, color="tab:green")
        ax.set_ylim(0, 1)
        ax.set_xlabel("position in the answer (tokens)")
        ax.set_ylabel("share from accepted drafts")
        ax.set_title("Acceptance by position in the answer")
        plots["positions"] = Markup(f'<figure class="positions" aria-label="acceptance by position in the answer">{page.inline_svg(fig)}'
                                     '</figure>')
        plt.close(fig)
    return plots


def _environment() -> Environment:
    return page.environment({"passes.html": SECTION, "pass_answers.html": ANSWERS, "pass_table.html": TABLE,
                             "pass_boxes.html": BOXES}, **HELPERS)


def passes_html(seen: SpeculationSeen, requests: list[RequestRecord], heading: int) -> Markup:
    """The HTML section (heading h``heading``): the source, tables, the histogram of tokens per pass,
    acceptance by position in the answer (inline SVG), the checks and findings, and each chosen
    answer drawn token by token, one box per pass."""
    env = _environment()
    table_t = env.get_template("pass_table.html")

    def table(rows: list[list[str]], first: str) -> Markup:
        return Markup(table_t.render(rows=rows, first=first, columns=FIGURE_COLUMNS))

    rows_cat = [figure_cells(f) for f in seen.categories]
    if seen.overall is not None:
        rows_cat.append(figure_cells(seen.overall))
    shown = _shown(seen) if seen.available else []
    answers = [(a, pass_tokens(_record(requests, a), a)) for a in shown]
    return Markup(env.get_template("passes.html").render(
        s=seen, h=heading, heading=HEADING, style=Markup(STYLE), rows_cat=rows_cat,
        rows_prompt=[figure_cells(f) for f in seen.prompts], table=table,
        plots=_plots(seen) if seen.available else {}, answers=answers))


def answers_html(seen: SpeculationSeen, requests: list[RequestRecord], heading: int) -> Markup:
    """The chosen answers pass by pass alone (legend, then one line of boxes per answer), with their
    style, in a ``section.speculation``; empty where none is to be drawn."""
    shown = _shown(seen) if seen.available else []
    if not shown:
        return Markup("")
    answers = [(a, pass_tokens(_record(requests, a), a)) for a in shown]
    body = _environment().get_template("pass_answers.html").render(h=heading - 1, answers=answers)
    return Markup(f'<section class="speculation"><style>{STYLE}</style>{body}</section>')

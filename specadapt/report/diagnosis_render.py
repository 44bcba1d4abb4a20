"""The diagnosis ("why is it faster or slower here") in every format: console, Markdown, HTML."""

from __future__ import annotations

from markupsafe import Markup
from markupsafe import escape as _escape
from rich.console import Console
from rich.text import Text

from specadapt.analysis.diagnosis import ratio_text
from specadapt.analysis.text import k_text, pct
from specadapt.records import ServerInfo
from specadapt.records.diagnosis import Diagnosis, LevelFigures
from specadapt.report.hardware import hardware_text

COLUMNS = ("level", "TPOT ratio", "tokens per pass", "pass cost (decode steps)", "break-even",
           "ideal (pass = 1 step)", "measured / ideal", "model best k")
LANDING = "by category"
"""The label of the sentence on where drafts land (per-request acceptance per category and prompt)."""
COST_NOTE = ("pass cost: the time of one verify pass (k + 1 tokens, the draft included) in spec-off decode "
             "steps; speculation pays when tokens per pass exceed it")


def _num(v: float | None, fmt: str = "{:.2f}") -> str:
    return "-" if v is None else fmt.format(v)


def _tpot(f: LevelFigures) -> str:
    if f.tpot_ratio is None or f.tpot_ratio.point is None:
        return "-"
    return ratio_text(f.tpot_ratio) + ("" if f.verdict == "unknown" else f" {f.verdict}")


def _cost(f: LevelFigures) -> str:
    if f.pass_cost is None:
        return "-"
    text = f"{f.pass_cost:.2f}"
    if f.pass_cost_low is not None and f.pass_cost_high is not None:
        text += f" [{f.pass_cost_low:.2f}, {f.pass_cost_high:.2f}]"
    if f.draft_cost_per_pass:
        text += f" (draft {f.draft_cost_per_pass:.2f})"
    return text


def _break_even(f: LevelFigures) -> str:
    if f.break_even_tokens_per_pass is None:
        return "-"
    if f.break_even_possible is False:
        return f"{f.break_even_tokens_per_pass:.2f} tokens: > k + 1, impossible"
    acc = "" if f.break_even_acceptance is None else f" (acceptance {pct(f.break_even_acceptance, 0)})"
    return f"{f.break_even_tokens_per_pass:.2f} tokens{acc}"


def _best(f: LevelFigures) -> str:
    if f.model_best_k is None:
        return "-"
    return f"{k_text(f.model_best_k)} ({_num(f.model_best_speedup, '{:.2f}x')}, {f.model})"


def row(f: LevelFigures) -> tuple[str, ...]:
    """One level's figures as the table's cells."""
    return (f.level, _tpot(f), _num(f.tokens_per_pass), _cost(f), _break_even(f),
            _num(f.ideal_speedup, "{:.2f}x"), _num(f.measured_over_ideal), _best(f))


def level_line(f: LevelFigures) -> str:
    """One level's arithmetic in a sentence (the console's form of the table)."""
    parts = [f"TPOT {_tpot(f)}"]
    if f.tokens_per_pass is not None:
        parts.append(f"{f.tokens_per_pass:.2f} tokens per pass")
    if f.pass_cost is not None:
        parts.append(f"a pass costs {_cost(f)} decode steps")
    if f.break_even_tokens_per_pass is not None:
        parts.append(f"break-even {_break_even(f)}")
    if f.ideal_speedup is not None:
        parts.append(f"ideal {f.ideal_speedup:.2f}x (measured {_num(f.measured_over_ideal)} of it)")
    if f.model_best_k is not None:
        parts.append(f"model's best {_best(f)}")
    return f"{f.level}: " + "; ".join(parts)


def render_diagnosis(d: Diagnosis | None, console: Console, machine: str | None = None) -> None:
    """The why section; ``machine``: the spec-on server's hardware and dtype, in one line."""
    if d is None:
        return
    console.print(Text("why: ", style="bold") + Text(d.headline))
    if any(f.pass_cost is not None for f in d.levels):
        console.print(f"  ({COST_NOTE})")
        for f in d.levels:
            console.print(Text("  " + level_line(f)))
    for c in d.causes:
        console.print(Text(f"  cause ({c.level}): {c.text}"))
    if d.drafts_land:
        console.print(Text(f"  {LANDING}: {d.drafts_land}"))
    for a in d.advice:
        console.print(Text(f"  to do: {a.text}"))
    for g in d.evidence_gaps:
        console.print(Text(f"  not enough evidence: {g}"))
    if machine:
        console.print(Text(f"  spec-on server's machine: {machine}"))


def diagnosis_markdown(d: Diagnosis | None, machine: str | None = None) -> list[str]:
    if d is None:
        return []
    out = ["", "### Why", "", d.headline, ""]
    if any(f.pass_cost is not None for f in d.levels):
        out += [f"The arithmetic ({COST_NOTE}):", "", "| " + " | ".join(COLUMNS) + " |",
                "| --- |" + " --- |" * (len(COLUMNS) - 1)]
        out += ["| " + " | ".join(row(f)) + " |" for f in d.levels]
        out.append("")
    out += [f"- cause ({c.level}): {c.text}" for c in d.causes]
    out += [f"- {LANDING}: {d.drafts_land}"] if d.drafts_land else []
    out += [f"- to do: {a.text}" for a in d.advice]
    out += [f"- not enough evidence: {g}" for g in d.evidence_gaps]
    if machine:
        out.append(f"- spec-on server's machine: {machine}")
    return out


def escape(text: str) -> str:
    """HTML-escaped text as a plain str (so that joining it with markup does not escape twice)."""
    return str(_escape(text))


def diagnosis_html(d: Diagnosis | None, machine: str | None = None, heading: int = 2) -> Markup:
    """The why section as HTML, under an h``heading``."""
    if d is None:
        return Markup("")
    parts = [f"<h{heading}>Why</h{heading}>", f"<p><strong>{escape(d.headline)}</strong></p>"]
    if any(f.pass_cost is not None for f in d.levels):
        parts.append(f"<p>{escape(COST_NOTE)}.</p><table><tr>"
                     + "".join(f"<th>{escape(c)}</th>" for c in COLUMNS) + "</tr>")
        for f in d.levels:
            cells = row(f)
            parts.append("<tr><td>" + escape(cells[0]) + "</td>"
                         + "".join(f'<td class="num">{escape(c)}</td>' for c in cells[1:]) + "</tr>")
        parts.append("</table>")
    items = [f"<li>cause ({escape(c.level)}): {escape(c.text)}</li>" for c in d.causes]
    items += [f"<li>{LANDING}: {escape(d.drafts_land)}</li>"] if d.drafts_land else []
    items += [f"<li>to do: {escape(a.text)}</li>" for a in d.advice]
    items += [f"<li>not enough evidence: {escape(g)}</li>" for g in d.evidence_gaps]
    if machine:
        items.append(f"<li>spec-on server's machine: {escape(machine)}</li>")
    if items:
        parts.append('<ul class="diagnosis">' + "".join(items) + "</ul>")
    return Markup("".join(parts))


def machine_line(info: ServerInfo, dtype: str | None) -> str:
    """The spec-on server's hardware and the dtype served, in one line."""
    served = info.dtype or dtype
    return hardware_text(info.hardware) + (f"; dtype {served}" if served else "; dtype not known")

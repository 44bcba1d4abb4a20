"""Renderers of a tune report: console (rich), Markdown, self-contained HTML, and the writer.

All three text forms render the same sections (``sections``): the recommendation, the candidates,
their speed per level, the fitted model, the choice per level, the written configs, the
verification and the notes; a partial sweep says so first. HTML adds three plots (matplotlib,
imported lazily), embedded as data URIs so the page needs no network.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.table import Table
from rich.text import Text

from specadapt.analysis.text import k_text, pct
from specadapt.analysis.tune_model import objective_ratio, ranges_text, requests_text, sweep_requests
from specadapt.records import RatioCI
from specadapt.records.reports import atomic_write_text, write_report
from specadapt.records.tune import Candidate, LevelChoice, LevelFit, TuneReport
from specadapt.report import page
from specadapt.report.compare_render import INTERVAL_NOTE, ci
from specadapt.report.diagnosis_render import COLUMNS, COST_NOTE, machine_line, row
from specadapt.report.hardware import hardware_source_text, hardware_text

OBJECTIVE_NAME = {"tpot": "TPOT", "e2e": "E2E", "throughput": "tokens/s"}
RATIO_ORDER = ("tpot", "e2e", "throughput")


@dataclass
class Line:
    """One paragraph (``strong``: the thing to see first; ``bullet``: an item of a list)."""

    text: str
    strong: bool = False
    bullet: bool = False


@dataclass
class Grid:
    """One table: a title, column headers and rows of plain strings."""

    title: str
    headers: list[str]
    rows: list[list[str]]


@dataclass
class Section:
    heading: str
    parts: list[Line | Grid] = field(default_factory=list)
    plots: list[str] = field(default_factory=list)  # names of the HTML plots shown after this section


# ---------------------------------------------------------------------------------- formatting


def times(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def num(v: float | None, digits: int = 3) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def per_position(rates: list[float]) -> str:
    return " / ".join(f"{r:.0%}" for r in rates) if rates else "-"


def interval(point: float, low: float | None, high: float | None) -> str:
    return f"{point:.2f}x" if low is None or high is None else f"{point:.2f}x [{low:.2f}, {high:.2f}]"


def identity_counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{counts.get(v, 0)} {v}" for v in ("identical", "near-tie", "suspect", "unknown"))


def yes_no(v: bool | None, none: str = "-") -> str:
    return none if v is None else ("yes" if v else "no")


# ---------------------------------------------------------------------------------- sections


def _header(report: TuneReport) -> Section:
    s, parts = report.settings, []
    if report.partial:
        parts.append(Line(f"PARTIAL: the sweep stopped early: {report.partial_reason or 'no reason recorded'}; "
                          "the candidates measured are kept.", strong=True))
    off = report.off_server
    server = "-" if off is None else (f"{off.backend} {off.version or '?'} at {off.base_url}, model "
                                      f"{off.model_id or '?'}")
    windows = f"; n-gram windows {', '.join(map(str, s.ngram_max))}" if s.ngram_max else ""
    parts.append(Line(f"Backend {s.backend}; spec-off server {server}. Draft lengths k "
                      f"{', '.join(map(str, s.ks))}{windows}; concurrency {', '.join(map(str, s.concurrency))}; "
                      f"repeat {s.repeat}, warmup {s.warmup}; prompts {s.prompts_source}; objective "
                      f"{OBJECTIVE_NAME[s.objective]} ratio. Created {report.created_at} by specadapt "
                      f"{report.specadapt_version}."))
    if off is not None:
        parts.append(Line(f"Hardware of the spec-off server: {hardware_source_text(off.hardware)}."))
        for c in report.candidates:
            on = c.compare.on_server if c.compare is not None else None
            if on is not None and on.hardware is not None and off.hardware is not None \
                    and hardware_text(on.hardware) != hardware_text(off.hardware):
                parts.append(Line(f"Candidate {c.label} ran on other hardware: {hardware_source_text(on.hardware)}.",
                                  strong=True))
    return Section("specadapt tune", parts)


def _recommendation(report: TuneReport) -> Section:
    r = report.recommendation
    variant = f" ({r.variant})" if r.variant else ""
    head = {"schedule": f"a per-batch-size schedule{variant}, engine k={r.k}",
            "fixed": f"one fixed draft length{variant}, k={r.k}",
            "off": "speculation off",
            "none": "none (nothing was measured)"}[r.form]
    parts = [Line(f"Recommendation: {head}; {'verified' if r.verified else 'not verified'}.", strong=True)]
    if r.schedule:
        parts.append(Line(f"Schedule: {ranges_text(r.schedule, 'report')}."))
    if r.fixed_fallback_k is not None:
        parts.append(Line("Fixed-k fallback (for engines that do not honour schedules): "
                          f"{k_text(r.fixed_fallback_k)}."))
    if r.summary:
        parts.append(Line(r.summary))
    if report.schedule_ranges_note:
        parts.append(Line(report.schedule_ranges_note))
    return Section("Recommendation", parts)


def _candidate_note(c: Candidate) -> str:
    if c.error:
        return c.error
    if c.status == "baseline" or c.k == 0:
        return "the spec-off server (ratio 1 by definition)"
    if c.suspect:
        return f"{c.suspect} suspect divergence(s): may not be chosen"
    return "-"


def _candidates(report: TuneReport) -> Section:
    rows = [[c.label, c.variant or "-", c.status, c.url or "-",
             identity_counts(c.compare.counts) if c.compare else "-", _candidate_note(c)]
            for c in report.candidates]
    if not rows:
        return Section("Candidates", [Line("No candidate was run.")])
    return Section("Candidates", [Grid("candidates", ["candidate", "variant", "status", "server", "identity",
                                                      "note"], rows)])


def _cells(report: TuneReport) -> list[Section]:
    """Run until decided: the design in one line, the requests against the fixed design's, and one
    line per (k, batch size) cell (why it stopped); nothing in the fixed design."""
    design = report.settings.sequential
    if design is None:
        return []
    cells = [(c, cell) for c in report.candidates for cell in c.cells]
    parts: list[Line | Grid] = [Line(f"Design: {design.rule}; a cell also stops, dropped, once its interval lies "
                                     f"below the best cell's so far at its batch size (both at "
                                     f"{1 - design.alpha:.0%}: it cannot beat it); the verification keeps the fixed "
                                     f"design (--repeat {report.settings.repeat}).")]
    if cells:
        sent, fixed = sweep_requests([cell for _, cell in cells])
        parts.append(Line(f"The sweep: {requests_text(sent, fixed)}.", strong=True))
    parts += [Line(f"{c.label} at concurrency {cell.concurrency}: {cell.text}", bullet=True) for c, cell in cells]
    return [Section("Run until decided", parts)]


def _speed(report: TuneReport) -> Section:
    obj = report.settings.objective
    order = [obj, *(o for o in RATIO_ORDER if o != obj)]
    headers = ["candidate", "concurrency", "pairs", f"{OBJECTIVE_NAME[obj]} ratio (objective)",
               *(f"{OBJECTIVE_NAME[o]} ratio" for o in order[1:]), "mean acceptance length",
               "acceptance per position"]
    rows = []
    for c in report.candidates:
        if c.compare is None:
            continue
        for lv in c.compare.levels:
            a = lv.acceptance
            rows.append([c.label, str(lv.concurrency), str(lv.pairs), *(ci(getattr(lv.speed, o)) for o in order),
                         num(a.mean_acceptance_length, 2),
                         per_position(a.per_position_rate) if a.known else f"unknown: {a.reason or '-'}"])
    if not rows:
        return Section("Speed per candidate and level", [Line("No candidate was measured.")])
    return Section("Speed per candidate and level",
                   [Line(f"Ratios of each candidate against the spec-off server ({INTERVAL_NOTE})."),
                    Grid("speed vs off", headers, rows)], ["speedup", "acceptance"])


def _fit_row(f: LevelFit, variants: bool) -> list[str]:
    predicted = ", ".join(f"k={k} {v:.2f}x" for k, v in sorted(f.predicted.items()))
    return [str(f.concurrency), *([f.variant or "-"] if variants else []), f.form, num(f.v), num(f.c),
            pct(f.max_rel_error), num(f.r2), "-" if f.model_best_k is None else k_text(f.model_best_k),
            per_position(f.per_position_rate), predicted or "-"]


def _fits(report: TuneReport) -> Section:
    if not report.fits:
        return Section("Cost model per level", [Line("No fit: no candidate was measured.")])
    variants = any(f.variant for f in report.fits)
    parts: list[Line | Grid] = [
        Line("A verify pass with k drafts costs v + c k plain decode steps and yields 1 + the accepted-per-draft "
             "rates of its first k positions; the predicted TPOT ratio is their quotient."),
        Grid("fit per level", ["concurrency", *(["variant"] if variants else []), "form", "v", "c", "max rel error",
                               "R2", "model best k", "acceptance per position", "predicted TPOT ratio"],
             [_fit_row(f, variants) for f in report.fits])]
    points = [[str(f.concurrency), *([f.variant or "-"] if variants else []), k_text(p.k),
               interval(p.measured, p.low, p.high), num(p.tokens_per_pass, 2), times(p.predicted),
               yes_no(p.inside, "no interval")]
              for f in report.fits for p in f.points]
    if points:
        parts.append(Grid("measured vs predicted TPOT ratio", ["concurrency", *(["variant"] if variants else []), "k",
                                                               "measured", "tokens per pass", "predicted",
                                                               "inside interval"], points))
    return Section("Cost model per level", parts, ["fit"])


def _choice_row(ch: LevelChoice) -> list[str]:
    ratio = ci(ch.ratio) if ch.ratio is not None else "1.00x (off)"
    runner = "-" if ch.runner_up_k is None else f"{k_text(ch.runner_up_k)} ({times(ch.runner_up_ratio)})"
    excluded = "; ".join(f"k={k}: {why}" for k, why in sorted(ch.excluded.items())) or "-"
    model = ch.model_note or ("-" if ch.model_best_k is None else f"model best {k_text(ch.model_best_k)}")
    return [str(ch.concurrency), ch.label, ratio, runner, ch.certainty, ch.reason, excluded, model]


def _choices(report: TuneReport) -> Section:
    if not report.choices:
        return Section("Choice per level", [Line("No choice: nothing was measured.")])
    obj = OBJECTIVE_NAME[report.settings.objective]
    return Section("Choice per level", [Grid("the k chosen per level", [
        "concurrency", "chosen", f"{obj} ratio", "runner-up", "certainty", "reason", "excluded", "model"],
        [_choice_row(ch) for ch in report.choices])])


def _configs(report: TuneReport) -> Section:
    if not report.configs:
        return Section("Configs written", [Line("No config was written.")])
    rows = [[c.engine, c.form or "-", c.path or "not written", ", ".join(c.checked_by) or "-"] for c in report.configs]
    notes = [Line(f"{c.engine} {c.form or ''}: {c.note}".replace("  ", " "), bullet=True) for c in report.configs
             if c.note]
    return Section("Configs written", [Grid("configs", ["engine", "form", "file", "checked by"], rows), *notes])


def _verification(report: TuneReport) -> Section:
    v = report.verification
    head = f"Verification: {v.status}" + (f" ({v.reason})" if v.reason else "") + (f"; ran on {v.url}" if v.url else "")
    parts: list[Line | Grid] = [Line(head + ".", strong=True)]
    if v.status == "not run":
        return Section("Verification", parts)
    obj = OBJECTIVE_NAME[report.settings.objective]
    rows = []
    for lv in v.levels:
        h = lv.honour
        rows.append([str(lv.concurrency), k_text(lv.scheduled_k), ci(lv.ratio), k_text(lv.best_fixed_k),
                     ci(lv.best_fixed_ratio) if lv.best_fixed_ratio is not None else "1.00x (off)",
                     yes_no(lv.as_good, "no interval"),
                     "-" if h is None else f"{h.verdict} (engine k={h.engine_k})"])
    if rows:
        parts.append(Grid("the written config against the best fixed k", [
            "concurrency", "scheduled k", f"{obj} ratio", "best fixed k", "its ratio in the sweep", "as good",
            "schedule honoured"], rows))
    parts += [Line(f"concurrency {lv.concurrency}: {lv.honour.reason}", bullet=True) for lv in v.levels
              if lv.honour is not None]
    parts.append(Line(f"Schedule honoured by the server: {v.honoured}."))
    counts = f"{v.suspect} suspect, {v.near_tie} near-tie"
    if v.compare is not None:
        counts += f" (all prompts: {identity_counts(v.compare.counts)})"
    parts.append(Line(f"Identity against the spec-off server: {counts}."))
    parts += [Line(f"fails: {reason}", bullet=True) for reason in v.reasons]
    return Section("Verification", parts)


def _diagnosis(report: TuneReport) -> list[Section]:
    """Why: the largest k measured through the fitted model (the same section as compare's)."""
    d = report.diagnosis
    if d is None:
        return []
    parts: list[Line | Grid] = [Line(d.headline, strong=True)]
    if any(f.pass_cost is not None for f in d.levels):
        parts.append(Grid(f"the arithmetic ({COST_NOTE})", list(COLUMNS), [list(row(f)) for f in d.levels]))
    parts += [Line(f"cause ({c.level}): {c.text}", bullet=True) for c in d.causes]
    parts += [Line(f"to do: {a.text}", bullet=True) for a in d.advice]
    parts += [Line(f"not enough evidence: {g}", bullet=True) for g in d.evidence_gaps]
    top = max((c for c in report.candidates if c.compare is not None), key=lambda c: c.k, default=None)
    if top is not None:
        parts.append(Line(f"spec-on server's machine: {machine_line(top.compare.on_server, report.settings.dtype)}",
                          bullet=True))
    return [Section("Why", parts)]


def sections(report: TuneReport) -> list[Section]:
    """The report's content, in reading order, for every renderer."""
    out = [_header(report), _recommendation(report), _candidates(report), *_cells(report), _speed(report),
           _fits(report),
           _choices(report), *_diagnosis(report), _configs(report), _verification(report)]
    if report.notes:
        out.append(Section("Notes", [Line(n, bullet=True) for n in report.notes]))
    return out


# ---------------------------------------------------------------------------------- console


def render_console(report: TuneReport, console: Console) -> None:
    for i, sec in enumerate(sections(report)):
        if i:
            console.print()
        console.print(Text(sec.heading, style="bold underline"))
        for part in sec.parts:
            if isinstance(part, Line):
                console.print(Text(("  - " if part.bullet else "") + part.text, style="bold" if part.strong else ""))
                continue
            table = Table(title=part.title)
            for h in part.headers:
                table.add_column(h)
            for row in part.rows:
                table.add_row(*(Text(cell) for cell in row))  # Text: brackets in reasons are not markup
            console.print(table)


# ---------------------------------------------------------------------------------- Markdown


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_markdown(report: TuneReport) -> str:
    out: list[str] = []
    for i, sec in enumerate(sections(report)):
        out += [("## " if i == 0 else "### ") + sec.heading, ""]
        for part in sec.parts:
            if not (isinstance(part, Line) and part.bullet) and out[-1] != "":
                out.append("")  # a list ends before the next paragraph or table
            if isinstance(part, Line):
                text = f"**{part.text}**" if part.strong else part.text
                out += [f"- {text}"] if part.bullet else [text, ""]
                continue
            out += [f"{part.title[:1].upper()}{part.title[1:]}:", "",
                    "| " + " | ".join(map(_cell, part.headers)) + " |", "|" + " --- |" * len(part.headers)]
            out += ["| " + " | ".join(map(_cell, row)) + " |" for row in part.rows]
            out.append("")
        if out[-1] != "":
            out.append("")
    return "\n".join(out).rstrip("\n") + "\n"


# ---------------------------------------------------------------------------------- HTML

TEMPLATE = """{% extends "base.html" %}
{% block title %}specadapt tune: {{ title }}{% endblock %}
{% block width %}80em{% endblock %}
{% block style %}caption { text-align: left; font-style: italic; }
p.strong { font-weight: bold; } td.short { white-space: nowrap; } .plots img { max-width: 100%; height: auto; }
{% endblock %}
{% block body %}
{% for sec in sections %}{% if loop.first %}<h1>{{ sec.heading }}: {{ title }}</h1>{% else %}<h2>{{ sec.heading }}</h2>{% endif %}
{% for part in sec.parts %}{% if part.headers is defined %}<table><caption>{{ part.title }}</caption>
<tr>{% for h in part.headers %}<th>{{ h }}</th>{% endfor %}</tr>
{% for row in part.rows %}<tr>{% for cell in row %}<td{% if cell|length < 28 %} class="short"{% endif %}>{{ cell }}</td>{% endfor %}</tr>{% endfor %}
</table>
{% elif part.bullet %}{% if not loop.previtem or not loop.previtem.bullet %}<ul>{% endif %}<li>{{ part.text }}</li>
{% if not loop.nextitem or not loop.nextitem.bullet %}</ul>{% endif %}
{% else %}<p{% if part.strong %} class="strong"{% endif %}>{{ part.text }}</p>
{% endif %}{% endfor %}
{% set shown = sec.plots|select("in", plots)|list %}{% if shown %}<div class="plots">
{% for name in shown %}<img src="{{ plots[name].src }}" alt="{{ plots[name].alt }}">{% endfor %}</div>
{% endif %}{% endfor %}
{% endblock %}
"""
"""The tune report's page (report/page.py's base): the sections in reading order, plots after theirs."""


@dataclass
class Plot:
    src: str  # a data: URI
    alt: str


def _data_uri(fig) -> str:
    svg = page.svg_text(fig)
    return "data:image/svg+xml;base64," + base64.b64encode(svg.encode()).decode("ascii")


def _measured(report: TuneReport) -> list[Candidate]:
    return [c for c in report.candidates if c.k > 0 and c.compare is not None and c.compare.levels]


def _log_x(ax, xs: list[int]) -> None:
    xs = sorted(set(xs))
    if len(xs) > 1:
        ax.set_xscale("log", base=2)
    if xs:
        ax.set_xticks(xs, [str(x) for x in xs])
        ax.minorticks_off()


def _errorbar(ax, xs, ratios: list[RatioCI], **kw):
    ys = [r.point for r in ratios]
    lo = [y - (r.low if r.low is not None else y) for y, r in zip(ys, ratios)]
    hi = [(r.high if r.high is not None else y) - y for y, r in zip(ys, ratios)]
    return ax.errorbar(xs, ys, yerr=[lo, hi], capsize=3, **kw)


def _speedup_figure(report: TuneReport, plt):
    obj = report.settings.objective
    fig, ax = plt.subplots(figsize=(6.5, 4))
    cands, all_x = _measured(report), list(report.settings.concurrency)
    for i, c in enumerate(cands):
        pts = [(lv.concurrency, objective_ratio(lv, obj)) for lv in c.compare.levels
               if objective_ratio(lv, obj).point is not None]
        if not pts:
            continue
        shift = 2 ** ((i - (len(cands) - 1) / 2) * 0.03)  # side by side, so the intervals do not overlap
        _errorbar(ax, [x * shift for x, _ in pts], [r for _, r in pts], marker="o", markersize=4, alpha=0.8,
                  label=c.label)
        all_x += [x for x, _ in pts]
    ax.axhline(1.0, color="grey", linestyle="--", linewidth=1, label="off (k=0)")
    choices = sorted(report.choices, key=lambda ch: ch.concurrency)
    if choices:
        xs = [ch.concurrency for ch in choices]
        ys = [ch.ratio.point if ch.ratio is not None and ch.ratio.point is not None else 1.0 for ch in choices]
        ax.plot(xs, ys, color="black", linewidth=3, alpha=0.3, label="chosen k per level")
        ax.scatter(xs, ys, s=160, facecolors="none", edgecolors="black", linewidths=1.5, zorder=5)
        for x, y, ch in zip(xs, ys, choices):
            ax.annotate(ch.label, (x, y), textcoords="offset points", xytext=(6, 8), fontsize=8)
        all_x += xs
    verified = [lv for lv in report.verification.levels if lv.ratio.point is not None]
    if verified:
        _errorbar(ax, [lv.concurrency for lv in verified], [lv.ratio for lv in verified], fmt="*", color="crimson",
                  markersize=11, zorder=6, label="verification (written config)")
        all_x += [lv.concurrency for lv in verified]
    _log_x(ax, all_x)
    ax.set_xlabel("concurrency (batch size)")
    ax.set_ylabel(f"{OBJECTIVE_NAME[obj]} ratio off/on vs off (95% CI)" if obj != "throughput"
                  else "tokens/s ratio on/off (95% CI)")
    ax.set_title("Speedup vs concurrency per draft length")
    ax.legend(fontsize=7, loc="best")
    alt = "speedup vs concurrency per draft length, with the chosen schedule and the verification run"
    return fig, alt


def _acceptance_levels(report: TuneReport) -> list[int]:
    return sorted({lv.concurrency for c in _measured(report) for lv in c.compare.levels
                   if lv.acceptance.known and lv.acceptance.per_position_rate})


def _acceptance_figure(report: TuneReport, plt):
    cands, levels = _measured(report), _acceptance_levels(report)
    n = len(levels)
    cols = min(n, 3)
    rows = -(-n // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, 3 * rows), squeeze=False, sharey=True,
                             layout="constrained")
    for ax, level in zip(axes.flat, levels):
        for c in cands:
            lv = next((lv for lv in c.compare.levels if lv.concurrency == level), None)
            if lv is None or not lv.acceptance.known or not lv.acceptance.per_position_rate:
                continue
            rates = lv.acceptance.per_position_rate
            ax.plot(range(1, len(rates) + 1), rates, "o-", label=c.label)
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.set_title(f"concurrency {level}", fontsize=9)
        ax.set_ylim(0, 1.05)
        ax.set_xlabel("draft position")
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(levels):]:
        ax.axis("off")
    axes.flat[0].set_ylabel("accepted per draft")
    fig.suptitle("Acceptance per position per candidate")
    return fig, "acceptance per draft position per candidate, one panel per concurrency"


def _fit_figure(report: TuneReport, plt):
    fig, ax = plt.subplots(figsize=(6.5, 4))
    fits = [f for f in report.fits if f.form != "none"]
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, f in enumerate(fits):
        color = colors[i % len(colors)]
        name = f"concurrency {f.concurrency}" + (f" {f.variant}" if f.variant else "")
        ks = sorted(f.predicted)
        if ks:
            r2 = "" if f.r2 is None else f", R2 {f.r2:.2f}"
            ax.plot(ks, [f.predicted[k] for k in ks], "-", color=color, alpha=0.7,
                    label=f"{name}: predicted ({f.form}{r2})")
        if f.points:
            pts = sorted(f.points, key=lambda p: p.k)
            ys = [p.measured for p in pts]
            lo = [p.measured - (p.low if p.low is not None else p.measured) for p in pts]
            hi = [(p.high if p.high is not None else p.measured) - p.measured for p in pts]
            ax.errorbar([p.k for p in pts], ys, yerr=[lo, hi], fmt="o", color=color, capsize=3,
                        label=f"{name}: measured")
    ax.axhline(1.0, color="grey", linestyle="--", linewidth=1)
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_xlabel("draft length k")
    ax.set_ylabel("TPOT ratio off/on")
    ax.set_title("Cost model: measured vs predicted TPOT ratio")
    ax.legend(fontsize=7)
    return fig, "measured and predicted TPOT ratio per draft length, one colour per concurrency"


def figures(report: TuneReport) -> dict:
    """The matplotlib figures that have something to show, {name: (figure, alt text)}: speedup (a
    candidate measured), acceptance (per-position acceptance known), fit (a level fitted). The
    caller closes them (plots() does)."""
    wanted = {"speedup": _speedup_figure if _measured(report) else None,
              "acceptance": _acceptance_figure if _acceptance_levels(report) else None,
              "fit": _fit_figure if any(f.form != "none" for f in report.fits) else None}
    if not any(wanted.values()):
        return {}
    plt = page.pyplot()
    return {name: draw(report, plt) for name, draw in wanted.items() if draw}


def plots(report: TuneReport) -> dict[str, Plot]:
    """figures() as SVG data URIs."""
    out = {}
    for name, (fig, alt) in figures(report).items():
        import matplotlib.pyplot as plt  # loaded by figures()

        out[name] = Plot(_data_uri(fig), alt)
        plt.close(fig)
    return out


def render_html(report: TuneReport) -> str:
    off = report.off_server
    title = (off.model_id if off and off.model_id else report.settings.backend)
    env = page.environment({"tune.html": TEMPLATE})
    return env.get_template("tune.html").render(sections=sections(report), plots=plots(report), title=title)


# ---------------------------------------------------------------------------------- files


def write_tune_outputs(report: TuneReport, json_path: Path | None = None, markdown_path: Path | None = None,
                       html_path: Path | None = None) -> list[Path]:
    """Write each form asked for, atomically; JSON first, so a rendering error loses no measurement."""
    written: list[Path] = []
    if json_path:
        write_report(report, Path(json_path))
        written.append(Path(json_path))
    for path, render in ((markdown_path, render_markdown), (html_path, render_html)):
        if path:
            atomic_write_text(Path(path), render(report))
            written.append(Path(path))
    return written

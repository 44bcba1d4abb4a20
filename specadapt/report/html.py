"""Self-contained HTML report of a compare run: inline SVG plots (matplotlib), no external assets;
the page extends the one base template (report/page.py)."""

from __future__ import annotations


from jinja2 import Environment
from markupsafe import Markup

from specadapt.analysis.latency import tpot_ns
from specadapt.analysis.slo import slo_text
from specadapt.analysis.text import pct
from specadapt.records import CompareReport
from specadapt.report.compare_render import (
    activity_lines,
    all_levels,
    ci,
    concurrency_text,
    goodput_rows,
    identity_line,
    interval_note,
    lag_text,
    level_name,
    level_verdict,
    load_text,
    sequential_lines,
)
from specadapt.report import page
from specadapt.report.sections import sections_html

STYLE = """.pass { color: #096; font-weight: bold; } .fail { color: #c00; font-weight: bold; }
.identical { color: #096; } .near-tie { color: #b80; } .suspect, .unknown { color: #c00; font-weight: bold; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
pre { background: #f7f7f7; padding: .5em; white-space: pre-wrap; } .plots svg { max-width: 100%; height: auto; }"""
"""CSS of a page that shows compare reports, added to the shared style of page.BASE."""

# The body of one compare report; its headings start at h{{ top }} (1 on a page of its own).
BODY = """<h{{ top }}>Speculative decoding on vs off: {{ r.on_server.model_id }}</h{{ top }}>
<p>{{ r.on_server.backend }} {{ r.on_server.version or "?" }}; off: {{ r.off_server.base_url }}, on: {{ r.on_server.base_url }}
(k={{ r.on_server.num_speculative_tokens or "?" }}); {{ r.identity|length }} prompts, repeat {{ r.settings.repeat }};
created {{ r.created_at }} by specadapt {{ r.specadapt_version }}.</p>
{% if r.gate %}<p>Gate: <span class="{{ 'pass' if r.gate.passed else 'fail' }}">{{ 'PASS' if r.gate.passed else 'FAIL' }}</span>
{% for reason in r.gate.reasons %}<br>{{ reason }}{% endfor %}</p>{% endif %}
<h{{ top + 1 }}>Speed</h{{ top + 1 }}>
<p>{{ interval_note(r) }}.</p>
<table><tr><th>concurrency / rate</th><th>pairs</th><th>tokens/s ratio [95% CI]</th><th>TPOT ratio</th><th>E2E ratio</th>
<th>tokens/s verdict</th><th>acceptance</th><th>mean length</th></tr>
{% for lv in levels %}<tr><td class="num">{{ level_name(lv) }}</td><td class="num">{{ lv.pairs }}</td>
<td class="num">{{ ci(lv.speed.throughput) }}</td><td class="num">{{ ci(lv.speed.tpot) }}</td><td class="num">{{ ci(lv.speed.e2e) }}</td>
<td>{{ level_verdict(r, lv) }}</td>
<td class="num">{{ pct(lv.acceptance.acceptance_rate) }}</td><td class="num">{{ num(lv.acceptance.mean_acceptance_length) }}</td></tr>{% endfor %}
</table>
{% set decided = sequential_lines(r) %}{% if decided %}<p class="sequential">Design: {{ decided[0] }}.</p>
<ul class="sequential">{% for line in decided[1:] %}<li>{{ line }}</li>{% endfor %}</ul>
{% endif %}{% if r.crossover and r.levels %}<p>Load: {{ load_text(r) }}.</p>{% endif %}
{% if r.rate_crossover %}<p>Load by request rate: {{ r.rate_crossover.text }}.</p>{% endif %}
{% if r.rate_levels %}<h{{ top + 1 }}>Send lag</h{{ top + 1 }}><p>Sent - scheduled, per request rate; CLIENT-LIMITED: the client could not keep
the schedule, so the figures at that rate describe the client, not the server.</p>
<table><tr><th>rate</th><th>spec-off</th><th>spec-on</th></tr>
{% for lv in r.rate_levels %}<tr><td class="num">{{ level_name(lv) }}</td><td class="num">{{ lag_text(lv.send_lag_off) }}</td>
<td class="num">{{ lag_text(lv.send_lag_on) }}</td></tr>{% endfor %}</table>{% endif %}
{% set with_goodput = levels|selectattr("goodput")|list %}
{% if with_goodput %}<h{{ top + 1 }}>Goodput</h{{ top + 1 }}><p>Requests within every SLO ({{ slo_text(with_goodput[0].goodput.off.slo_ms) }}) per second;
ratio and share difference over units.</p>
<table><tr><th>level</th><th>spec-off</th><th>spec-on</th><th>goodput ratio on/off</th><th>good share on - off</th></tr>
{% for lv in with_goodput %}{% set g = goodput_rows(lv.goodput) %}<tr><td class="num">{{ level_name(lv) }}</td>
<td class="num">{{ g[0] }}</td><td class="num">{{ g[1] }}</td><td class="num">{{ g[2] }}</td><td class="num">{{ g[3] }}</td></tr>{% endfor %}
</table>{% endif %}
{% set cats = levels|selectattr("by_category")|list %}
{% if cats and cats[0].by_category|length > 1 %}<h{{ top + 1 }}>Per prompt category</h{{ top + 1 }}><table><tr><th>level</th><th>category</th>
<th>tokens/s ratio</th><th>TPOT ratio</th></tr>
{% for lv in cats %}{% for name, sr in lv.by_category.items() %}<tr><td class="num">{{ level_name(lv) }}</td><td>{{ name }}</td>
<td class="num">{{ ci(sr.throughput) }}</td><td class="num">{{ ci(sr.tpot) }}</td></tr>{% endfor %}{% endfor %}</table>{% endif %}
<div class="plots">{{ plots.speedup }}{{ plots.latency }}{{ plots.acceptance }}</div>
{{ sections }}
<h{{ top + 1 }}>Identity</h{{ top + 1 }}>
<p>{{ r.counts.get('identical', 0) }} identical, {{ r.counts.get('near-tie', 0) }} near-tie,
{{ r.counts.get('suspect', 0) }} suspect, {{ r.counts.get('unknown', 0) }} unknown{{ concurrency_text(r) }}.</p>
{% set certify = activity_lines(r) %}{% if certify %}<ul class="certify">{% for line in certify %}<li>{{ line }}</li>{% endfor %}</ul>{% endif %}
<table><tr><th>prompt</th><th>verdict</th><th>where</th><th>margin (nats)</th><th>context</th></tr>
{% for p in r.identity %}<tr><td>{{ p.prompt_id }}</td><td class="{{ p.verdict }}">{{ p.verdict }}{% if p.concurrency_only %}<br>only under concurrency{% endif %}</td>
{% if p.divergence %}<td>token {{ p.divergence.token_index }}, char {{ p.divergence.char_index }}<br>
off {{ p.divergence.off_token }} / on {{ p.divergence.on_token }}</td>
<td class="num">{% if p.divergence.triage and p.divergence.triage.margin is not none %}{{ '>=' if p.divergence.triage.margin_is_lower_bound }}{{ "%.3f"|format(p.divergence.triage.margin) }}
({{ p.divergence.triage.source }}; threshold {{ p.divergence.triage.threshold }}){% else %}-{% endif %}
{% if p.divergence.triage and p.divergence.triage.path_margin is not none %}<br>on its own path: {{ p.divergence.triage.path_checked }} tokens,
largest {{ "%.3f"|format(p.divergence.triage.path_margin) }} at token {{ p.divergence.triage.path_position }}{% endif %}</td>
<td><pre>off: …{{ p.divergence.off_context }}
on:  …{{ p.divergence.on_context }}</pre>{% if p.divergence.triage and p.divergence.triage.note %}{{ p.divergence.triage.note }}{% endif %}</td>
{% else %}<td>-</td><td>-</td><td>{{ p.identical_pairs }}/{{ p.pairs }} pairs identical</td>{% endif %}</tr>{% endfor %}
</table>
{% if r.notes %}<h{{ top + 1 }}>Notes</h{{ top + 1 }}><ul>{% for n in r.notes %}<li>{{ n }}</li>{% endfor %}</ul>{% endif %}
"""

PAGE = """{% extends "base.html" %}
{% block title %}specadapt compare: {{ r.on_server.model_id }}{% endblock %}
{% block style %}""" + STYLE + """{% endblock %}
{% block body %}{% include "compare_body.html" %}{% endblock %}
"""
"""One compare report on a page of its own."""


def _plots(report: CompareReport) -> dict[str, Markup]:
    plt = page.pyplot()
    plots: dict[str, Markup] = {}
    levels = [lv for lv in report.levels if lv.speed.throughput.point is not None]
    fig, ax = plt.subplots(figsize=(5, 3.2))
    if levels:
        xs = [lv.concurrency for lv in levels]
        ys = [lv.speed.throughput.point for lv in levels]
        lo = [y - (lv.speed.throughput.low if lv.speed.throughput.low is not None else y) for y, lv in zip(ys, levels)]
        hi = [(lv.speed.throughput.high if lv.speed.throughput.high is not None else y) - y for y, lv in zip(ys, levels)]
        ax.errorbar(xs, ys, yerr=[lo, hi], marker="o", capsize=4,
                    label="tokens/s on / off (95% CI; no bar: too few units)")
        if len(xs) > 1:
            ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [str(x) for x in xs])
    ax.axhline(1.0, color="grey", linestyle="--", linewidth=1)
    if report.crossover and report.crossover.estimate:
        ax.axvline(report.crossover.estimate, color="red", linestyle=":", label=f"crossover ~{report.crossover.estimate:.1f}")
    ax.set_xlabel("concurrency")
    ax.set_ylabel("speedup")
    ax.set_title("Speedup vs concurrency")
    ax.legend(fontsize=8)
    plots["speedup"] = page.inline_svg(fig)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(5, 3.2))
    first = report.levels[0].concurrency if report.levels else 1
    for side, color in (("off", "tab:blue"), ("on", "tab:orange")):
        vals = [t / 1e6 for r in report.requests if r.side == side and r.ok and not r.warmup
                and r.concurrency == first and (t := tpot_ns(r)) is not None]
        if vals:
            ax.hist(vals, bins=min(20, max(5, len(vals) // 2)), alpha=0.6, color=color, label=f"spec {side}")
    ax.set_xlabel("TPOT per request (ms)")
    ax.set_ylabel("requests")
    ax.set_title(f"Latency distribution (concurrency {first})")
    ax.legend(fontsize=8)
    plots["latency"] = page.inline_svg(fig)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(5, 3.2))
    acc = report.levels[0].acceptance if report.levels else None
    if acc and acc.known and acc.per_position_rate:
        pos = list(range(len(acc.per_position_rate)))
        ax.bar(pos, acc.per_position_rate, label="accepted / drafts")
        cond = [c if c is not None else 0 for c in acc.per_position_conditional]
        ax.plot(pos, cond, "o-", color="tab:red", label="conditional")
        ax.set_xticks(pos)
        ax.set_ylim(0, 1)
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "acceptance unknown", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("draft position")
    ax.set_title("Acceptance per position")
    plots["acceptance"] = page.inline_svg(fig)
    plt.close(fig)
    return plots


def environment(**templates: str) -> Environment:
    """The jinja environment of the HTML reports that show compare reports: page.BASE, the compare
    body (``compare_body.html``) and page (``compare.html``), ``templates``; autoescaped, the
    renderers' helpers as globals."""
    return page.environment({"compare_body.html": BODY, "compare.html": PAGE, **templates},
                            ci=ci, identity_line=identity_line, activity_lines=activity_lines,
                            concurrency_text=concurrency_text, level_verdict=level_verdict,
                            interval_note=interval_note, sequential_lines=sequential_lines,
                            level_name=level_name, lag_text=lag_text,
                            goodput_rows=goodput_rows, slo_text=slo_text, pct=pct, load_text=load_text,
                            num=lambda v: "-" if v is None else f"{v:.2f}")


def _context(report: CompareReport, top: int) -> dict:
    return dict(r=report, plots=_plots(report), levels=all_levels(report), top=top,
                sections=sections_html(report, top + 1))


def compare_body_html(report: CompareReport, top: int = 2) -> Markup:
    """One compare report as a part of a larger page: its tables, plots and identity, headings
    from h``top`` down (the page supplies the document, the style and the title)."""
    return Markup(environment().get_template("compare_body.html").render(**_context(report, top)))


def to_html(report: CompareReport) -> str:
    """One compare report as a self-contained HTML document."""
    return environment().get_template("compare.html").render(**_context(report, 1))

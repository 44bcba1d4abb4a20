"""A probe report as Markdown and as one self-contained HTML page (the console form is
report/console.py): the server, latency, figures per prompt category and per arrival rate,
acceptance by the server's counters, then speculation per request and per pass
(report/passes_render.py), failures and notes. The page extends the one base template
(report/page.py)."""

from __future__ import annotations

from markupsafe import Markup

from specadapt.analysis.slo import slo_text
from specadapt.analysis.text import pct
from specadapt.records import Distribution, LatencySummary, ProbeReport
from specadapt.report import page
from specadapt.report.console import goodput_text, lag_text, rate_text
from specadapt.report.passes_render import passes_html, passes_markdown

SPEC = {True: "on", False: "off", None: "unknown"}
METRICS = ("TTFT", "ITL (per token)", "TPOT", "E2E")


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:,.1f}"


def server_line(report: ProbeReport) -> str:
    """'vllm 0.32.0 at http://x, model m, max_model_len 4096; speculative decoding on (method ngram, k=4)'."""
    s = report.server
    details = [d for d in (f"method {s.spec_method}" if s.spec_method else "",
                           f"k={s.num_speculative_tokens}" if s.num_speculative_tokens else "") if d]
    return (f"{s.backend} {s.version or '?'} at {s.base_url}, model {s.model_id}, max_model_len "
            f"{s.max_model_len or '?'}; speculative decoding {SPEC[s.spec_enabled]}"
            + (f" ({', '.join(details)})" if details else ""))


def level_text(report: ProbeReport) -> str:
    load = report.settings.load
    if load and load.request_rates:
        return f"request rates {', '.join(rate_text(r) for r in load.request_rates)} req/s"
    return f"concurrency {report.settings.concurrency}"


def latency_rows(lat: LatencySummary) -> list[list[str]]:
    """metric, mean, p50, p90, p99, n (ms)."""
    dists: list[Distribution] = [lat.ttft_ms, lat.itl_ms, lat.tpot_ms, lat.e2e_ms]
    return [[name, _ms(d.mean), _ms(d.p50), _ms(d.p90), _ms(d.p99), str(d.count)] for name, d in zip(METRICS, dists)]


def output_line(report: ProbeReport) -> str:
    lat = report.latency
    tps = "-" if lat.output_tokens_per_s is None else f"{lat.output_tokens_per_s:,.1f}"
    tpc = "-" if lat.tokens_per_chunk_mean is None else f"{lat.tokens_per_chunk_mean:.2f}"
    return (f"output tokens {lat.output_tokens} in {lat.duration_s:.2f} s: {tps} tokens/s; tokens per chunk {tpc}; "
            f"token counts from {', '.join(report.token_sources) or '-'}")


def category_rows(report: ProbeReport) -> list[list[str]]:
    """category, requests, tokens/s, TPOT mean, E2E mean."""
    return [[name, str(c.requests), "-" if c.output_tokens_per_s is None else f"{c.output_tokens_per_s:.1f}",
             _ms(c.tpot_ms.mean), _ms(c.e2e_ms.mean)] for name, c in report.by_category.items()]


def rate_rows(report: ProbeReport) -> list[list[str]]:
    """rate, ok, tokens/s, TPOT p50, E2E p50, send lag, goodput."""
    return [[rate_text(lv.request_rate), f"{lv.latency.succeeded}/{lv.latency.requests}",
             "-" if lv.latency.output_tokens_per_s is None else f"{lv.latency.output_tokens_per_s:.1f}",
             _ms(lv.latency.tpot_ms.p50), _ms(lv.latency.e2e_ms.p50), lag_text(lv.send_lag),
             goodput_text(lv.goodput)] for lv in report.rates]


def acceptance_line(report: ProbeReport) -> str:
    acc = report.acceptance
    if not acc.known:
        return f"acceptance by the server's counters: unknown ({acc.reason})"
    length = "-" if acc.mean_acceptance_length is None else f"{acc.mean_acceptance_length:.2f}"
    return (f"acceptance by the server's counters: {pct(acc.acceptance_rate)} ({acc.accepted_tokens:.0f} of "
            f"{acc.draft_tokens:.0f} draft tokens, {acc.drafts:.0f} drafts); mean acceptance length {length}")


def failure_lines(report: ProbeReport) -> list[str]:
    out = []
    if report.partial:
        out.append(f"PARTIAL RUN: {report.partial_reason}")
    if report.failures:
        out.append("failed requests by kind: " + ", ".join(f"{k} {n}" for k, n in report.failures.items()))
    out += [f"failed {r.prompt_id} (repeat {r.repeat}): {r.error}" for r in report.requests if not r.ok][:10]
    return out


def _md_table(head: list[str], rows: list[list[str]]) -> list[str]:
    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")

    return (["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
            + ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows])


LATENCY_HEAD = ["metric", "mean", "p50", "p90", "p99", "n"]
CATEGORY_HEAD = ["category", "requests", "tokens/s", "TPOT mean", "E2E mean"]
RATE_HEAD = ["rate req/s", "ok", "tokens/s", "TPOT p50", "E2E p50", "send lag", "goodput"]


def to_markdown(report: ProbeReport) -> str:
    """The probe report as Markdown."""
    lat = report.latency
    out = [f"# specadapt probe: {report.server.model_id}", "", server_line(report) + ".", "",
           f"Created {report.created_at} by specadapt {report.specadapt_version}.", "",
           f"## Latency, ms ({level_text(report)}, {lat.succeeded}/{lat.requests} requests ok)", ""]
    out += _md_table(LATENCY_HEAD, latency_rows(lat))
    out += ["", output_line(report) + "."]
    if report.goodput is not None:
        out += ["", f"Goodput ({slo_text(report.goodput.slo_ms)}): {goodput_text(report.goodput)}."]
    if report.rates:
        out += ["", "## By request rate (open loop)", ""] + _md_table(RATE_HEAD, rate_rows(report))
    if len(report.by_category) > 1:
        out += ["", "## By prompt category", ""] + _md_table(CATEGORY_HEAD, category_rows(report))
    out += ["", "## Acceptance", "", acceptance_line(report) + "."]
    if report.speculation is not None:
        out += passes_markdown(report.speculation, report.requests)
    problems = failure_lines(report)
    if problems:
        out += ["", "## Failures", ""] + [f"- {line}" for line in problems]
    if report.notes:
        out += ["", "## Notes", ""] + [f"- {n}" for n in report.notes]
    return "\n".join(out) + "\n"


PAGE = """{% extends "base.html" %}
{% block title %}specadapt probe: {{ r.server.model_id }}{% endblock %}
{% block style %}td.num { text-align: right; font-variant-numeric: tabular-nums; } .fail { color: #c00; }{% endblock %}
{% block body %}<h1>specadapt probe: {{ r.server.model_id }}</h1>
<p>{{ server_line(r) }}; created {{ r.created_at }} by specadapt {{ r.specadapt_version }}.</p>
<h2>Latency, ms ({{ level_text(r) }}, {{ r.latency.succeeded }}/{{ r.latency.requests }} requests ok)</h2>
{{ table(latency_head, latency_rows(r.latency)) }}
<p>{{ output_line(r) }}.</p>
{% if r.goodput %}<p>Goodput ({{ slo_text(r.goodput.slo_ms) }}): {{ goodput_text(r.goodput) }}.</p>{% endif %}
{% if r.rates %}<h2>By request rate (open loop)</h2>{{ table(rate_head, rate_rows(r)) }}{% endif %}
{% if r.by_category|length > 1 %}<h2>By prompt category</h2>{{ table(category_head, category_rows(r)) }}{% endif %}
<h2>Acceptance</h2><p>{{ acceptance_line(r) }}.</p>
{{ speculation }}
{% set problems = failure_lines(r) %}{% if problems %}<h2>Failures</h2><ul class="fail">{% for p in problems %}<li>{{ p }}</li>{% endfor %}</ul>{% endif %}
{% if r.notes %}<h2>Notes</h2><ul>{% for n in r.notes %}<li>{{ n }}</li>{% endfor %}</ul>{% endif %}
{% endblock %}
"""

TABLE = """<table><tr>{% for h in head %}<th>{{ h }}</th>{% endfor %}</tr>
{% for row in rows %}<tr><td>{{ row[0] }}</td>{% for c in row[1:] %}<td class="num">{{ c }}</td>{% endfor %}</tr>{% endfor %}</table>"""


def to_html(report: ProbeReport) -> str:
    """The probe report as one self-contained HTML page."""
    env = page.environment({"probe.html": PAGE, "table.html": TABLE}, server_line=server_line, level_text=level_text,
                           latency_rows=latency_rows, output_line=output_line, category_rows=category_rows,
                           rate_rows=rate_rows, acceptance_line=acceptance_line, failure_lines=failure_lines,
                           goodput_text=goodput_text, slo_text=slo_text, latency_head=LATENCY_HEAD,
                           category_head=CATEGORY_HEAD, rate_head=RATE_HEAD)
    table_t = env.get_template("table.html")

    def table(head: list[str], rows: list[list[str]]) -> Markup:
        return Markup(table_t.render(head=head, rows=rows))

    speculation = (passes_html(report.speculation, report.requests, 3) if report.speculation is not None
                   else Markup(""))
    return env.get_template("probe.html").render(r=report, table=table, speculation=speculation)

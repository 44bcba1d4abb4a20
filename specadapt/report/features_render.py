"""The feature matrix (`equiv --features`) as console tables, Markdown, HTML and JUnit XML."""

from __future__ import annotations

from junitparser import Failure, JUnitXml, Skipped, TestCase, TestSuite
from rich.console import Console
from rich.table import Table
from rich.text import Text

from specadapt.analysis.sampling_stats import look_alphas
from specadapt.records.features import GATE_EFFECT, CellResult, FeatureReport
from specadapt.records.server import ServerInfo
from specadapt.report import page

STYLE = {"pass": "green", "near-tie": "green", "fail": "bold red", "error": "bold red", "inactive": "yellow",
         "unsupported": "yellow", "not-exact": "yellow", "lossy": "magenta"}
LABEL = {"inactive": "speculation inactive", "unsupported": "unsupported by the server",
         "not-exact": "cannot be checked exactly", "lossy": "lossy by configuration"}


def verdict_text(cell: CellResult) -> str:
    return LABEL.get(cell.verdict, cell.verdict)


def activity_text(cell: CellResult) -> str:
    return cell.activity.text if cell.activity is not None else "-"


def _server(info: ServerInfo | None) -> str:
    if info is None:
        return "-"
    spec = "spec ON" if info.spec_enabled else "spec OFF" if info.spec_enabled is False else "spec ?"
    k = f", k={info.num_speculative_tokens}" if info.num_speculative_tokens else ""
    method = f" {info.spec_method}" if info.spec_method and info.spec_enabled else ""
    return f"{info.base_url} ({info.backend} {info.version or '?'}, {spec}{method}{k})"


def header_lines(report: FeatureReport) -> list[str]:
    s = report.settings
    source = (f"the target recomputed in float64 from {s.reference}" if s.source == "reference"
              else f"the spec-off server's top {s.top_logprobs} prompt logprobs")
    ran = "" if len(report.cells) == len(s.features) else f" ({len(report.cells)} ran)"
    lines = [f"features: spec-on {_server(report.on_server)}; model {report.on_server.model_id}",
             f"baseline: spec-off {_server(report.baseline_server)}",
             f"{len(s.features)} cells{ran}; greedy cells up to {s.max_tokens} tokens; distribution cells "
             f"{s.samples} samples per prompt of {s.sample_tokens} tokens at alpha {s.alpha:g}, p from {source}; "
             f"near-tie threshold {s.near_tie_threshold:g} nats"]
    if s.looks is not None:
        lines.append(looks_line(s.alpha, s.looks))
    if report.lossy:
        lines.append(f"lossy by configuration: {report.lossy}")
    return lines


def looks_line(alpha: float, looks: int) -> str:
    """The design of --until-decided: the looks of each distribution cell and the alpha each spends."""
    alphas = look_alphas(alpha, looks)
    split = (f"{alphas[0]:.3g} at each of looks 1-{looks - 1} and {alphas[-1]:.3g} at the last" if looks > 1
             else f"{alphas[0]:.3g} at the only look")
    return (f"until decided: each distribution cell sends its samples in {looks} looks and stops early only to "
            f"reject; alpha {alpha:g} split over the looks: {split} (at most alpha per cell in all); a pass is "
            "decided at the last look only")


def counts(report: FeatureReport) -> str:
    by: dict[str, int] = {}
    for c in report.cells:
        by[verdict_text(c)] = by.get(verdict_text(c), 0) + 1
    return ", ".join(f"{n} {v}" for v, n in by.items())


def render_console(report: FeatureReport, console: Console) -> None:
    for line in header_lines(report):
        console.print(line, soft_wrap=True, markup=False)
    table = Table(title="request features, speculation on vs off")
    for col in ("feature", "kind", "verdict", "speculation", "s"):
        table.add_column(col, overflow="fold", justify="right" if col == "s" else "left")
    for c in report.cells:
        table.add_row(c.name, c.kind, Text(verdict_text(c), style=STYLE[c.verdict]), activity_text(c),
                      f"{c.seconds:.1f}" if c.seconds is not None else "-")
    console.print(table)
    for c in report.cells:
        if c.verdict not in ("pass",):
            console.print(Text(f"{c.name}: {verdict_text(c)}: {c.reason}", style=STYLE[c.verdict]), soft_wrap=True)
        for note in c.notes:
            console.print(f"{c.name}: {note}", soft_wrap=True, markup=False)
    for note in report.notes:
        console.print(f"note: {note}", soft_wrap=True, markup=False)
    if report.partial:
        console.print(f"partial: {report.stopped}", soft_wrap=True, markup=False)
    console.print(f"cells: {counts(report)}", soft_wrap=True, markup=False)
    console.print(f"gate: [bold]{'PASS' if report.gate.passed else 'FAIL'}[/]"
                  + ("" if report.gate.passed else ": " + "; ".join(report.gate.reasons)), soft_wrap=True)


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def to_markdown(report: FeatureReport) -> str:
    out = ["## specadapt: request features, speculative decoding on vs off", "",
           f"**Gate: {'PASS' if report.gate.passed else 'FAIL'}**"
           + ("" if report.gate.passed else " - " + "; ".join(report.gate.reasons)), ""]
    out += [f"- {_md(line)}" for line in header_lines(report)]
    out += ["", "| feature | kind | verdict | speculation | why |", "| --- | --- | --- | --- | --- |"]
    out += [f"| `{c.name}` | {c.kind} | {verdict_text(c)} | {_md(activity_text(c))} | {_md(c.reason)} |"
            for c in report.cells]
    out.append("")
    out += [f"- {c.name}: {_md(n)}" for c in report.cells for n in c.notes]
    out += [f"- note: {_md(n)}" for n in report.notes]
    out.append(f"- cells: {counts(report)}")
    return "\n".join(out) + "\n"


PAGE = """{% extends "base.html" %}
{% block title %}specadapt request features{% endblock %}
{% block style %}td, th { vertical-align: top; } .fail td, .error td { background: #fdd; }
.pass td, .near-tie td { background: #efe; } .inactive td, .unsupported td, .not-exact td { background: #ffd; }
.lossy td { background: #fef; }
{% endblock %}
{% block body %}<h1>Request features, speculative decoding on vs off</h1>
<p><b>Gate: {{ gate }}</b></p><ul>{% for line in head %}<li>{{ line }}</li>{% endfor %}</ul>
<table><tr><th>feature</th><th>kind</th><th>verdict</th><th>speculation</th><th>why</th></tr>
{% for c in r.cells %}<tr class='{{ c.verdict }}'><td><code>{{ c.name }}</code></td><td>{{ c.kind }}</td><td>{{ verdict_text(c) }}</td>
<td>{{ activity_text(c) }}</td><td>{{ c.reason }}</td></tr>
{% endfor %}</table>
<ul>{% for c in r.cells %}{% for n in c.notes %}<li>{{ c.name }}: {{ n }}</li>{% endfor %}{% endfor %}
{% for n in r.notes %}<li>note: {{ n }}</li>{% endfor %}</ul>
<p>cells: {{ counts(r) }}</p>{% endblock %}
"""
"""The feature matrix's page (report/page.py's base)."""


def to_html(report: FeatureReport) -> str:
    env = page.environment({"features.html": PAGE}, verdict_text=verdict_text, activity_text=activity_text,
                           counts=counts)
    gate = "PASS" if report.gate.passed else "FAIL: " + "; ".join(report.gate.reasons)
    return env.get_template("features.html").render(r=report, gate=gate, head=header_lines(report))


def to_junit(report: FeatureReport) -> str:
    """One testcase per cell: a failure when the cell fails (or errs), skipped when it says nothing about
    speculation (inactive, unsupported, not exact, lossy by configuration), passed otherwise."""
    suite = TestSuite("specadapt.equiv.features")
    for c in report.cells:
        case = TestCase(c.name, classname=f"specadapt.features.{c.kind}")
        effect = GATE_EFFECT[c.verdict]
        if effect is False:
            case.result = [Failure(c.reason)]
        elif effect is None:
            case.result = [Skipped(f"{verdict_text(c)}: {c.reason}")]
        else:
            case.system_out = f"{c.verdict}: {c.reason}; speculation: {activity_text(c)}"
        suite.add_testcase(case)
    xml = JUnitXml()
    xml.add_testsuite(suite)
    text = xml.tostring()
    return text.decode() if isinstance(text, bytes) else text

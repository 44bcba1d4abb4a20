"""Renderers of a sampling report (`equiv --sampling`): console (rich), Markdown, JUnit XML."""

from __future__ import annotations

from junitparser import Failure, JUnitXml, TestCase, TestSuite
from rich.console import Console
from rich.table import Table

from specadapt.analysis.text import pct
from specadapt.records import ServerInfo
from specadapt.records.sampling_report import SamplingReport

_BLOCKS = " ▁▂▃▄▅▆▇█"


def _server(info: ServerInfo) -> str:
    spec = "spec ON" if info.spec_enabled else ("spec off" if info.spec_enabled is False else "spec ?")
    k = f", k={info.num_speculative_tokens}" if info.num_speculative_tokens else ""
    return f"{info.base_url} ({info.backend} {info.version or '?'}, {spec}{k})"


def source_line(report: SamplingReport) -> str:
    return f"p from {report.source}; prompt ids from {report.settings.tokenizer}"


def workload_line(report: SamplingReport) -> str:
    s = report.settings
    n_prompts = len(report.prompts)
    return (f"{s.samples} samples per prompt x {n_prompts} prompt{'s' if n_prompts != 1 else ''}, up to "
            f"{s.max_tokens} tokens each at temperature {s.temperature:g}, top_p {s.top_p:g}, EOS ignored, seeds "
            f"{s.seed}..{s.seed + s.samples * n_prompts - 1}: {report.stats.n_tokens} sampled tokens scored "
            f"against the top {s.top_logprobs}")


def looks_line(report: SamplingReport) -> str | None:
    """With --until-decided: the looks, their alphas, where the run stopped and the samples it used."""
    if report.looks is None:
        return None
    return f"until decided: {report.looks.text}"


def acceptance_line(report: SamplingReport) -> str | None:
    a = report.acceptance
    if a is None:
        return None
    if not a.known:
        return f"acceptance on the spec-on server: unknown ({a.reason})"
    rate = pct(a.acceptance_rate)
    length = "-" if a.mean_acceptance_length is None else f"{a.mean_acceptance_length:.2f}"
    return (f"acceptance on the spec-on server while sampling: {rate} of {a.draft_tokens or 0:g} draft tokens, "
            f"mean acceptance length {length}")


def power_lines(report: SamplingReport) -> list[str]:
    """alpha, the detectable TV at the stated power, and the tokens other TVs would need, in words."""
    st = report.stats
    n_tests = len(st.tests)
    family = (f"over {n_tests} tests, each at {st.per_test_alpha:.3g}" if n_tests
              else "no test was run")
    if report.looks is not None:
        overall = report.settings.alpha
        lines = [f"false-alarm rate: alpha = {overall:g} over {report.looks.looks} look"
                 f"{'s' if report.looks.looks != 1 else ''} (the look that decided: {st.alpha:.3g} family-wise, "
                 f"{family}): a correct server fails at most 1 run in {round(1 / overall):,}"]
    else:
        lines = [f"false-alarm rate: alpha = {st.alpha:g} family-wise ({family}): a correct server fails about "
                 f"1 run in {round(1 / st.alpha):,}"]
    if st.detectable_tv is not None:
        lines.append(f"power: with {st.n_tokens:,} tokens this run catches a PIT total-variation distance of "
                     f"{st.detectable_tv:.3f} or more with {st.power:.0%} probability")
    if st.samples_needed:
        lines.append(f"tokens needed at {st.power:.0%} power: " + ", ".join(
            f"TV {t.tv:g}: {t.samples_needed:,}" for t in st.samples_needed))
    return lines


def histogram_bar(counts: list[int]) -> str:
    """One character per PIT bin, its height relative to the fullest bin."""
    top = max(counts, default=0)
    if top <= 0:
        return ""
    return "".join(_BLOCKS[round(c / top * (len(_BLOCKS) - 1))] for c in counts)


def render_console(report: SamplingReport, console: Console) -> None:
    st = report.stats
    console.print(f"[bold]sampling[/]: spec-on {_server(report.on_server)}; model {report.on_server.model_id}",
                  soft_wrap=True)
    console.print(source_line(report), soft_wrap=True, markup=False)
    console.print(workload_line(report), soft_wrap=True)
    looks = looks_line(report)
    if looks:
        console.print(looks, soft_wrap=True, markup=False)
    acc = acceptance_line(report)
    if acc:
        console.print(acc)
    if st.tests:
        table = Table(title=f"tests (family-wise alpha {st.alpha:g})")
        for col in ("test", "statistic", "dof", "p-value", "rejected"):
            table.add_column(col, justify="left" if col == "test" else "right")
        for t in st.tests:
            table.add_row(t.name, f"{t.statistic:.4g}", "-" if t.dof is None else str(t.dof), f"{t.p_value:.3g}",
                          "[red]yes[/]" if t.rejected else "no")
        console.print(table)
    if st.pit_histogram:
        console.print(f"PIT histogram ({st.bins} bins, {st.pit_expected_per_bin:.1f} expected per bin): "
                      f"|{histogram_bar(st.pit_histogram)}|  min {min(st.pit_histogram)}, max {max(st.pit_histogram)}")
    if st.rank_categories:
        ranks = Table(title="rank in the source's top K")
        for col in ("rank", "observed", "expected"):
            ranks.add_column(col, justify="left" if col == "rank" else "right")
        for c in st.rank_categories:
            ranks.add_row(c.name, str(c.observed), f"{c.expected:.1f}")
        console.print(ranks)
    per = Table(title="per prompt")
    for col in ("prompt", "prompt tokens", "samples", "tokens", "in top K"):
        per.add_column(col, justify="left" if col == "prompt" else "right")
    for p in report.prompts:
        per.add_row(p.prompt_id, str(p.prompt_tokens), str(p.samples), str(p.tokens), str(p.in_top_k))
    console.print(per)
    for line in power_lines(report):
        console.print(line)
    for note in report.notes:
        console.print(f"note: {note}", soft_wrap=True, markup=False)
    console.print(f"gate: [bold]{'PASS' if report.gate.passed else 'FAIL'}[/]"
                  + ("" if report.gate.passed else ": " + "; ".join(report.gate.reasons)), soft_wrap=True)


def to_markdown(report: SamplingReport) -> str:
    st = report.stats
    out = ["## specadapt: sampling distribution, speculative decoding on", "",
           f"**Gate: {'PASS' if report.gate.passed else 'FAIL'}**"
           + ("" if report.gate.passed else " - " + "; ".join(report.gate.reasons)), "",
           f"Spec-on `{report.on_server.model_id}` at {_server(report.on_server)}; {source_line(report)}.", "",
           workload_line(report) + ".", ""]
    looks = looks_line(report)
    if looks:
        out += [looks[0].upper() + looks[1:] + ".", ""]
    acc = acceptance_line(report)
    if acc:
        out += [acc[0].upper() + acc[1:] + ".", ""]
    if st.tests:
        out += ["| test | statistic | dof | p-value | rejected |", "| --- | --- | --- | --- | --- |"]
        out += [f"| {t.name} | {t.statistic:.4g} | {'-' if t.dof is None else t.dof} | {t.p_value:.3g} | "
                f"{'**yes**' if t.rejected else 'no'} |" for t in st.tests]
        out.append("")
    out += [f"- {line}" for line in power_lines(report)]
    out += ["", "| prompt | prompt tokens | samples | tokens | in top K |", "| --- | --- | --- | --- | --- |"]
    out += [f"| `{p.prompt_id}` | {p.prompt_tokens} | {p.samples} | {p.tokens} | {p.in_top_k} |"
            for p in report.prompts]
    out += [""] + [f"- note: {n}" for n in report.notes]
    return "\n".join(out) + "\n"


def to_junit(report: SamplingReport) -> str:
    """One testcase per statistical test (a failure when it rejects), plus one for probability-zero
    tokens and, when too few tokens were sampled to decide, a failing sample-size case."""
    st = report.stats
    suite = TestSuite("specadapt.equiv.sampling")
    for t in st.tests:
        case = TestCase(t.name, classname="specadapt.sampling")
        message = (f"{t.name}: statistic {t.statistic:.4g}" + ("" if t.dof is None else f", dof {t.dof}")
                   + f", p = {t.p_value:.3g} (per-test alpha {st.per_test_alpha:.3g})")
        if t.rejected:
            case.result = [Failure(message + ": the samples are not from the target distribution")]
        else:
            case.system_out = message
        suite.add_testcase(case)
    zero = TestCase("zero-probability-tokens", classname="specadapt.sampling")
    if st.zero_probability_tokens:
        zero.result = [Failure(f"{st.zero_probability_tokens} sampled token(s) have probability zero under the "
                               "source")]
    suite.add_testcase(zero)
    if st.status == "too-few":
        case = TestCase("sample-size", classname="specadapt.sampling")
        case.result = [Failure("; ".join(report.gate.reasons) or "too few tokens to decide")]
        suite.add_testcase(case)
    xml = JUnitXml()
    xml.add_testsuite(suite)
    text = xml.tostring()
    return text.decode() if isinstance(text, bytes) else text

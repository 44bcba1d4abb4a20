"""Renderers of a compare report: console (rich), Markdown, JUnit XML. HTML is in html.py."""

from __future__ import annotations

from junitparser import Failure, JUnitXml, Skipped, TestCase, TestSuite
from rich.console import Console
from rich.table import Table

from specadapt.analysis.gate import bound_text
from specadapt.analysis.interference import detected_interference
from specadapt.analysis.slo import slo_text
from specadapt.analysis.text import pct
from specadapt.records import CompareReport, LevelResult, PromptIdentity, RatioCI
from specadapt.records.load import DiffCI, GoodputComparison
from specadapt.records.sequential import SequentialDesign, SequentialOutcome
from specadapt.report.console import goodput_text, lag_text, rate_text
from specadapt.report.sections import render_sections, sections_markdown

INTERVAL_NOTE = ("> 1x: spec on is faster; 95% t interval over independent units: "
                 "off/on pairs at concurrency 1, off+on blocks above")
SEQUENTIAL_NOTE = ("> 1x: spec on is faster; anytime-valid {level} intervals (confidence sequences) over independent "
                   "units, valid whenever the run stopped: off/on pairs at concurrency 1, off+on blocks above")
RATIO_NAMES = {"tpot": "TPOT", "e2e": "E2E", "throughput": "tokens/s"}


def ci(r: RatioCI) -> str:
    """``1.23x [1.10, 1.38]``; with too few units the point and why there is no interval."""
    if r.point is None:
        return "-"
    if r.too_few:
        return f"{r.point:.2f}x (too few {r.unit}, n = {r.n} < {r.min_n})"
    if r.low is None:
        return f"{r.point:.2f}x"
    return f"{r.point:.2f}x [{r.low:.2f}, {r.high:.2f}]"


def interval_note(report: CompareReport) -> str:
    """What the speed intervals are: the fixed design's t intervals, or the rule's confidence sequences."""
    design = report.settings.sequential
    return INTERVAL_NOTE if design is None else SEQUENTIAL_NOTE.format(level=f"{1 - design.alpha:.0%}")


# --- run until decided ---------------------------------------------------------------------------
def _alpha(a: float) -> str:
    return f"{a:.3g}"


def secondary_text(design: SequentialDesign) -> str:
    """How the ratios other than the primary are covered at the stop."""
    others = " and ".join(RATIO_NAMES[p] for p in RATIO_NAMES if p != design.primary)
    return (f"{others} have their own sequences at alpha {_alpha(design.alpha)}, each valid at the stop on its "
            f"own; for all three ratios at once the error rate is at most 3 x alpha = {_alpha(3 * design.alpha)} "
            f"(alpha/3 = {_alpha(design.alpha / 3)} each for {_alpha(design.alpha)} together)")


def design_text(design: SequentialDesign) -> str:
    """The design in one line: the rule, alpha, phi, margin, first look, cap, floor, the stop to fail, the other
    ratios."""
    decides = "faster or slower" + (f", or equivalent within +-{design.margin:.0%}" if design.margin is not None
                                    else " (no equivalence margin)")
    parts = [f"run until decided: after each unit, the anytime-valid {1 - design.alpha:.0%} t confidence sequence "
             f"of the {RATIO_NAMES[design.primary]} ratio (alpha {_alpha(design.alpha)}, valid at any stop; "
             f"normal mixture, phi {design.phi:g}) decides {decides}",
             f"first look after {design.first_look} units",
             f"cap {design.max_units} units per level"]
    if design.min_units:
        parts.append(f"floor {design.min_units} units per level")
    if design.fail_divergences is not None:
        parts.append(f"stops to fail once {design.fail_divergences} prompt"
                     f"{'s' if design.fail_divergences != 1 else ''} diverged")
    parts.append(secondary_text(design))
    return "; ".join(parts)


def _diverged(report: CompareReport) -> int:
    """Prompts that diverged, as the stop to fail counts them (any divergence, before triage)."""
    return sum(1 for p in report.identity if p.divergence is not None)


def requests_text(out: SequentialOutcome) -> str:
    """``14 requests against 72 for the fixed design``."""
    sent = f"{out.requests} request{'s' if out.requests != 1 else ''}"
    return sent if out.fixed_requests is None else f"{sent} against {out.fixed_requests} for the fixed design"


def outcome_text(report: CompareReport, lv: LevelResult) -> str | None:
    """The rule's outcome at the level in one sentence, beside the verdict; None without the rule."""
    design, out = report.settings.sequential, lv.sequential
    if design is None or out is None:
        return None
    name = RATIO_NAMES[design.primary]
    unit = out.interval.unit
    cs = out.interval
    if out.stopped == "identity":
        n = _diverged(report) or design.fail_divergences
        why = (f"{n} prompt{'s' if n != 1 else ''} diverged" if n else "prompts diverged") + " (the gate cannot pass)"
        if out.units == 0:
            return f"not run: the run stopped to fail before this level: {why}"
        head = (f"stopped to fail after {out.units} of at most {design.max_units} {unit}: {why}; "
                f"{name} {ci(cs)} so far")
    elif out.stopped == "cap":
        reached = (f"interval [{cs.low:.2f}, {cs.high:.2f}]" if cs.low is not None and cs.high is not None
                   else "no interval yet")
        head = f"{name} {out.verdict}: {reached} at the cap of {design.max_units} {unit}"
    else:
        verdict = out.verdict + (f" within +-{design.margin:.0%}" if out.verdict == "equivalent"
                                 and design.margin is not None else "")
        head = (f"{name} {ci(cs)} {verdict}: decided after {out.units} of at most {design.max_units} {unit} "
                f"(anytime-valid {cs.level:.0%} interval, alpha {_alpha(design.alpha)}: valid at any stop)")
    return f"{head}; {requests_text(out)}"


def sequential_lines(report: CompareReport) -> list[str]:
    """The design, then one line per level with the rule's outcome ("LEVEL: SENTENCE"); none without the rule."""
    if report.settings.sequential is None:
        return []
    lines = [design_text(report.settings.sequential)]
    for lv in all_levels(report):
        text = outcome_text(report, lv)
        if text is not None:
            lines.append(f"{level_title(lv)}: {text}")
    return lines


def level_title(lv: LevelResult) -> str:
    """'concurrency 4' or 'rate 2 req/s'."""
    return f"concurrency {lv.concurrency}" if lv.request_rate is None else f"rate {level_name(lv)}"


def level_verdict(report: CompareReport, lv: LevelResult) -> str:
    """The level's speed verdict as the crossover decided it (faster only with speculation seen)."""
    if lv.request_rate is not None:
        cross, key = report.rate_crossover, lv.request_rate
    else:
        cross, key = report.crossover, lv.concurrency
    if cross and key in cross.verdicts:
        return cross.verdicts[key]
    return "-"


LOAD_STALLS = "at concurrency 1 tokens/s include the servers' stalls of each other's first token: see interference"


def load_text(report: CompareReport) -> str:
    """The load verdict (the crossover's text), with the stalls where the servers stalled each other."""
    stalled = detected_interference(report) is not None and any(lv.concurrency == 1 for lv in report.levels)
    return report.crossover.text + (f" ({LOAD_STALLS})" if stalled else "")


def level_name(lv: LevelResult) -> str:
    """'4' for a concurrency, '2 req/s' for an arrival rate."""
    return str(lv.concurrency) if lv.request_rate is None else f"{rate_text(lv.request_rate)} req/s"


def diff_text(d: DiffCI) -> str:
    if d.point is None:
        return "-"
    if d.low is None:
        return f"{100 * d.point:+.1f} pts (too few units, n = {d.n})"
    return f"{100 * d.point:+.1f} pts [{100 * d.low:+.1f}, {100 * d.high:+.1f}]"


def goodput_rows(g: GoodputComparison) -> tuple[str, str, str, str]:
    """(off, on, on/off ratio, share difference) of one level's goodput."""
    ratio = ci(g.ratio) + (f" ({g.units_without_good} unit(s) without a good request left out)"
                           if g.units_without_good else "")
    return goodput_text(g.off), goodput_text(g.on), ratio, diff_text(g.share_difference)


def all_levels(report: CompareReport) -> list[LevelResult]:
    return [*report.levels, *report.rate_levels]


def identity_line(p: PromptIdentity) -> str:
    d = p.divergence
    if d is None:
        return f"{p.prompt_id}: identical ({p.identical_pairs}/{p.pairs} pairs)"
    t = d.triage
    margin = "-" if t is None or t.margin is None else (">=" if t.margin_is_lower_bound else "") + f"{t.margin:.3f}"
    src = t.source if t else "none"
    where = " ONLY UNDER CONCURRENCY" if p.concurrency_only else ""
    path = ""
    if t is not None and t.path_margin is not None:
        path = (f"; on path: {t.path_checked} tokens scored, largest margin {t.path_margin:.3f} at token "
                f"{t.path_position} ({t.path_token!r})")
    levels = ", ".join(str(c) for c in p.diverged_levels)
    return (f"{p.prompt_id}: {p.verdict.upper()}{where} at token {d.token_index} / char {d.char_index} "
            f"(off {d.off_token!r} vs on {d.on_token!r}; margin {margin} nats by {src}, threshold "
            f"{t.threshold if t else '-'}{path}; {p.pairs - p.identical_pairs}/{p.pairs} pairs diverged"
            + (f", at concurrency {levels}" if levels else "") + ")")


def activity_lines(report: CompareReport) -> list[str]:
    """Whether speculation ran, on which prompts, how much of the text it made, the lossy settings
    and (with a gate) what the run proves; plain sentences, one per line."""
    out: list[str] = []
    a = report.activity
    if a is not None:
        state = {True: "ran", False: "DID NOT RUN", None: "NOT SHOWN to run"}[a.ran]
        out.append(f"speculation {state}: {a.evidence}")
        if a.source == "none":
            out.append(f"per prompt: not known ({a.source_note})")
        else:
            share = (f"; {a.accepted_output_tokens} of {a.output_tokens} output tokens came from accepted drafts"
                     f" ({a.accepted_output_tokens / a.output_tokens:.0%})"
                     if a.accepted_output_tokens is not None and a.output_tokens else "")
            out.append(f"per prompt ({a.source_note}): {a.exercised_prompts} of {len(a.prompts)} prompts exercised"
                       + share)
            idle = [p.prompt_id for p in a.prompts if p.exercised is False]
            if idle:
                out.append(f"not exercised (no accepted draft; not counted in the proof): {', '.join(idle[:10])}"
                           + (f" and {len(idle) - 10} more" if len(idle) > 10 else ""))
    for reason in report.lossy:
        out.append(f"lossy by configuration: {reason}")
    out += report.server_exits
    if report.gate is not None and report.gate.bound is not None:
        out.append(f"proof: {bound_text(report.gate.bound)}")
    return out


def render_console(report: CompareReport, console: Console) -> None:
    on, off = report.on_server, report.off_server
    console.print(f"[bold]compare[/]: off {off.base_url} ({off.backend} {off.version or '?'}, spec "
                  f"{'on' if off.spec_enabled else 'off'}) vs on {on.base_url} (spec "
                  f"{'ON' if on.spec_enabled else 'off?'}{', k=' + str(on.num_speculative_tokens) if on.num_speculative_tokens else ''})"
                  f"; model {on.model_id}")
    table = Table(title=f"speed, spec on vs off ({interval_note(report)})")
    for col in ("concurrency / rate", "pairs", "tokens/s ratio", "TPOT ratio", "E2E ratio", "tokens/s verdict",
                "acceptance", "mean len"):
        table.add_column(col, justify="right")
    for lv in all_levels(report):
        table.add_row(level_name(lv), str(lv.pairs), ci(lv.speed.throughput), ci(lv.speed.tpot), ci(lv.speed.e2e),
                      level_verdict(report, lv),
                      pct(lv.acceptance.acceptance_rate),
                      "-" if lv.acceptance.mean_acceptance_length is None else f"{lv.acceptance.mean_acceptance_length:.2f}")
    console.print(table)
    for line in sequential_lines(report):
        console.print(line, markup=False, highlight=False)
    if report.crossover and report.levels:
        console.print(f"load: {load_text(report)}")
    if report.rate_crossover:
        console.print(f"load by request rate: {report.rate_crossover.text}")
    render_load(report, console)
    first = report.levels[0] if report.levels else None
    if first and first.by_prompt:
        per = Table(title=f"per prompt at concurrency {first.concurrency}")
        for col in ("prompt", "category", "tokens/s ratio", "TPOT ratio"):
            per.add_column(col, justify="left" if col in ("prompt", "category") else "right")
        for p in first.by_prompt:
            per.add_row(p.prompt_id, p.category, ci(p.ratios.throughput), ci(p.ratios.tpot))
        console.print(per)
    if first and first.acceptance.known:
        console.print("acceptance per position: " + " / ".join(f"{r:.0%}" for r in first.acceptance.per_position_rate))
    render_sections(report, console)
    c = report.counts
    console.print(f"identity: {c.get('identical', 0)} identical, {c.get('near-tie', 0)} near-tie, "
                  f"{c.get('suspect', 0)} suspect, {c.get('unknown', 0)} unknown (of {len(report.identity)} prompts)"
                  + concurrency_text(report))
    for line in activity_lines(report):
        console.print(line, markup=False, highlight=False)
    for p in report.identity:
        if p.divergence:
            console.print("  " + identity_line(p))
            console.print(f"    off: …{p.divergence.off_context!r}")
            console.print(f"    on:  …{p.divergence.on_context!r}")
            if p.divergence.triage and p.divergence.triage.note:
                console.print(f"    note: {p.divergence.triage.note}")
    for note in report.notes:
        console.print(f"note: {note}")
    if report.gate:
        g = report.gate
        console.print(f"gate: [bold]{'PASS' if g.passed else 'FAIL'}[/]" + ("" if g.passed else ": " + "; ".join(g.reasons)))


def render_load(report: CompareReport, console: Console) -> None:
    """Send lag per rate, goodput per level, ratios per prompt category."""
    if report.rate_levels:
        lag = Table(title="send lag per request rate (sent - scheduled)")
        for col in ("rate", "spec-off", "spec-on"):
            lag.add_column(col, justify="right")
        for lv in report.rate_levels:
            lag.add_row(level_name(lv), lag_text(lv.send_lag_off), lag_text(lv.send_lag_on))
        console.print(lag)
    with_goodput = [lv for lv in all_levels(report) if lv.goodput is not None]
    if with_goodput:
        g = Table(title=f"goodput ({slo_text(with_goodput[0].goodput.off.slo_ms)}; ratio and share difference "
                        "over units)")
        for col in ("level", "spec-off", "spec-on", "goodput ratio on/off", "good share on - off"):
            g.add_column(col, justify="right")
        for lv in with_goodput:
            g.add_row(level_name(lv), *goodput_rows(lv.goodput))
        console.print(g)
    cats = [lv for lv in all_levels(report) if len(lv.by_category) > 1]
    if cats:
        t = Table(title="tokens/s ratio per prompt category")
        t.add_column("level", justify="right")
        names = sorted({c for lv in cats for c in lv.by_category})
        for n in names:
            t.add_column(n, justify="right")
        for lv in cats:
            t.add_row(level_name(lv), *(ci(lv.by_category[n].throughput) if n in lv.by_category else "-"
                                        for n in names))
        console.print(t)


def load_markdown(report: CompareReport) -> list[str]:
    out: list[str] = []
    if report.rate_levels:
        out += ["", "Send lag (sent - scheduled) per request rate:", "", "| rate | spec-off | spec-on |",
                "| --- | --- | --- |"]
        out += [f"| {level_name(lv)} | {lag_text(lv.send_lag_off)} | {lag_text(lv.send_lag_on)} |"
                for lv in report.rate_levels]
    with_goodput = [lv for lv in all_levels(report) if lv.goodput is not None]
    if with_goodput:
        out += ["", f"Goodput ({slo_text(with_goodput[0].goodput.off.slo_ms)}):", "",
                "| level | spec-off | spec-on | goodput ratio on/off | good share on - off |",
                "| --- | --- | --- | --- | --- |"]
        out += ["| " + " | ".join([level_name(lv), *goodput_rows(lv.goodput)]) + " |" for lv in with_goodput]
    cats = [lv for lv in all_levels(report) if len(lv.by_category) > 1]
    if cats:
        names = sorted({c for lv in cats for c in lv.by_category})
        out += ["", "Tokens/s ratio per prompt category:", "", "| level | " + " | ".join(names) + " |",
                "| --- |" + " --- |" * len(names)]
        out += ["| " + " | ".join([level_name(lv), *(ci(lv.by_category[n].throughput) if n in lv.by_category
                                                     else "-" for n in names)]) + " |" for lv in cats]
    return out


def to_markdown(report: CompareReport) -> str:
    out = ["## specadapt: speculative decoding on vs off", ""]
    if report.gate:
        out += [f"**Gate: {'PASS' if report.gate.passed else 'FAIL'}**"
                + ("" if report.gate.passed else " - " + "; ".join(report.gate.reasons)), ""]
    on = report.on_server
    out += [f"Model `{on.model_id}`, {on.backend} {on.version or '?'}, k={on.num_speculative_tokens or '?'}; "
            f"{len(report.identity)} prompts, repeat {report.settings.repeat}.", "",
            f"Speed ({interval_note(report)}):", "",
            "| concurrency / rate | pairs | tokens/s ratio [95% CI] | TPOT ratio | tokens/s verdict | acceptance | mean length |",
            "| --- | --- | --- | --- | --- | --- | --- |"]
    for lv in all_levels(report):
        a = lv.acceptance
        out.append(f"| {level_name(lv)} | {lv.pairs} | {ci(lv.speed.throughput)} | {ci(lv.speed.tpot)} | "
                   f"{level_verdict(report, lv)} | {pct(a.acceptance_rate)} | {'-' if a.mean_acceptance_length is None else f'{a.mean_acceptance_length:.2f}'} |")
    seq = sequential_lines(report)
    if seq:
        out += ["", f"Design: {seq[0]}.", ""] + [f"- {line}" for line in seq[1:]]
    if report.crossover and report.levels:
        out += ["", f"Load: {load_text(report)}."]
    if report.rate_crossover:
        out += ["", f"Load by request rate: {report.rate_crossover.text}."]
    out += load_markdown(report)
    out += sections_markdown(report)
    c = report.counts
    out += ["", f"Identity: {c.get('identical', 0)} identical, {c.get('near-tie', 0)} near-tie, "
                f"{c.get('suspect', 0)} suspect, {c.get('unknown', 0)} unknown{concurrency_text(report)}.", ""]
    out += [f"- {line}" for line in activity_lines(report)]
    if report.activity is not None or report.lossy:
        out.append("")
    for p in report.identity:
        if p.divergence:
            d = p.divergence
            off_ctx, on_ctx = (c.replace("`", "'") for c in (d.off_context, d.on_context))
            where = " only under concurrency" if p.concurrency_only else ""
            out += [f"- `{p.prompt_id}`: **{p.verdict}**{where} at token {d.token_index}, char {d.char_index}",
                    f"  - off: `…{off_ctx}`",
                    f"  - on: `…{on_ctx}`"]
            if d.triage and d.triage.margin is not None:
                out.append(f"  - margin {d.triage.margin:.3f} nats ({d.triage.source}), threshold {d.triage.threshold}")
            if d.triage and d.triage.path_margin is not None:
                out.append(f"  - on its own path: {d.triage.path_checked} tokens scored, largest margin "
                           f"{d.triage.path_margin:.3f} at token {d.triage.path_position}")
    for n in report.notes:
        out.append(f"- note: {n}")
    return "\n".join(out) + "\n"


def concurrency_text(report: CompareReport) -> str:
    """", 2 of them only under concurrency" where a prompt diverged only inside concurrent batches."""
    n = sum(1 for p in report.identity if p.concurrency_only)
    return f", {n} of them only under concurrency" if n else ""


def identity_cases(report: CompareReport, classname: str = "specadapt.identity") -> list[TestCase]:
    """One testcase per prompt, classname ``<classname>.<category>``: identical passes, near-tie
    passes (with a message unless the gate's max_near_tie was exceeded), suspect/unknown fail."""
    gate = report.gate
    near_fail = gate is not None and gate.max_near_tie is not None and report.counts.get("near-tie", 0) > gate.max_near_tie
    exercised = {p.prompt_id: p.exercised for p in report.activity.prompts} if report.activity else {}
    cases = []
    for p in report.identity:
        case = TestCase(p.prompt_id, classname=f"{classname}.{p.category}")
        if p.verdict in ("suspect", "unknown") or (p.verdict == "near-tie" and near_fail):
            fail = Failure(identity_line(p))
            fail.text = "" if not p.divergence else f"off: {p.divergence.off_context}\non: {p.divergence.on_context}"
            case.result = [fail]
        elif p.verdict == "near-tie":
            case.system_out = identity_line(p)
        if exercised.get(p.prompt_id) is False:
            case.system_out = ((case.system_out or "") + "\nnot exercised: no accepted draft in its spec-on answers, "
                               "so it is not counted in the proof").lstrip()
        cases.append(case)
    return cases


def certification_cases(report: CompareReport) -> list[TestCase]:
    """With a gate: a case for each thing it certifies beyond the prompts: speculation ran, the
    configuration promises identity, and (its message) the bound on the suspect rate."""
    gate = report.gate
    if gate is None:
        return []
    cases = []
    if report.activity is not None:
        case = TestCase("speculation-ran", classname="specadapt.certify")
        failed = [r for r in gate.reasons if r.startswith("speculation")]
        if failed:
            case.result = [Failure(failed[0])]
        else:
            case.system_out = report.activity.evidence
        cases.append(case)
    case = TestCase("lossless-config", classname="specadapt.certify")
    lossy = [r for r in gate.reasons if r.startswith("lossy by configuration")]
    if lossy:
        case.result = [Failure(lossy[0])]
    elif report.lossy:
        case.system_out = "allowed (--allow-lossy): " + "; ".join(report.lossy)
    cases.append(case)
    if gate.bound is not None:
        case = TestCase("suspect-rate", classname="specadapt.certify")
        too_high = [r for r in gate.reasons if r.startswith("suspect rate") or r.startswith("--max-suspect-rate")]
        if too_high:
            case.result = [Failure(too_high[0])]
        case.system_out = bound_text(gate.bound)
        cases.append(case)
    return cases


def junit_text(xml: JUnitXml) -> str:
    return xml.tostring().decode() if isinstance(xml.tostring(), bytes) else xml.tostring()


def to_junit(report: CompareReport) -> str:
    """One testcase per prompt: identical passes, near-tie passes (with a message unless the
    gate's max_near_tie was exceeded), suspect/unknown fail; plus one case for the speed gate. Run until
    decided, the speed case carries the design and each level's outcome (its output), and is there without a
    speed gate too (``speed``, passing: the verdicts are information)."""
    suite = TestSuite("specadapt.equiv")
    gate = report.gate
    for case in identity_cases(report):
        suite.add_testcase(case)
    decided = sequential_lines(report)
    if gate is not None and gate.min_speedup is not None:
        case = TestCase("speedup", classname="specadapt.speed")
        speed_reasons = [r for r in gate.reasons if r.startswith("throughput speedup")]
        if speed_reasons:
            case.result = [Failure(speed_reasons[0])]
        if decided:
            case.system_out = "\n".join(decided)
        suite.add_testcase(case)
    elif decided:
        case = TestCase("speed", classname="specadapt.speed")  # the rule's verdicts, information only
        case.system_out = "\n".join(decided)
        suite.add_testcase(case)
    if not report.identity:
        case = TestCase("identity", classname="specadapt.identity")
        case.result = [Skipped("no prompt pair succeeded on both servers")]
        suite.add_testcase(case)
    for case in certification_cases(report):
        suite.add_testcase(case)
    xml = JUnitXml()
    xml.add_testsuite(suite)
    return junit_text(xml)

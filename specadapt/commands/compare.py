"""`specadapt compare` and `specadapt equiv`: spec off against spec on (orchestration.ab.compare_servers does the
work; the command parses the options, applies the gate and prints)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click
from rich.console import Console

from specadapt.analysis.gate import apply_gate
from specadapt.analysis.sequential import fewest_units_to_decide
from specadapt.commands._console import ConsoleRun, stderr
from specadapt.commands._load import load_options, show_option
from specadapt.commands._server import ServerOptions, server_options
from specadapt.commands._workload import load_workload, workload_options
from specadapt.errors import UsageError
from specadapt.load.engine import turns_of
from specadapt.orchestration.ab import compare_servers
from specadapt.orchestration.compare import ONE_AFTER_THE_OTHER
from specadapt.orchestration.servers import ab_sides, plan_servers
from specadapt.records import CompareSettings, Prompt, RequestSettings, SequentialDesign, WorkloadInfo
from specadapt.report.compare_render import render_console
from specadapt.report.outputs import write_outputs


def parse_levels(value: str) -> list[int]:
    """``--concurrency 1,2,4`` -> [1, 2, 4] (sorted, without repeats)."""
    try:
        levels = sorted({int(x) for x in value.split(",") if x.strip()})
    except ValueError as exc:
        raise UsageError(f"--concurrency {value!r}: give comma-separated integers, e.g. 1,2,4,8") from exc
    if not levels or levels[0] < 1:
        raise UsageError(f"--concurrency {value!r}: every level must be an integer >= 1")
    return levels


# equiv --sampling defaults (commands/sampling.py runs it)
SAMPLES = 8
ALPHA = 0.01
TOP_LOGPROBS = 20  # vLLM's default --max-logprobs

MAX_UNITS = SequentialDesign.model_fields["max_units"].default  # --max-units by default
RULE_ALPHA = SequentialDesign.model_fields["alpha"].default  # --alpha of --until-decided by default
RULE_OPTIONS = (("max_units", "--max-units"), ("equivalence_margin", "--equivalence-margin"), ("alpha", "--alpha"))


def ab_options(f):
    """The load, analysis and output options of compare and equiv."""
    opts = [
        click.option("--concurrency", default="1", show_default=True,
                     help="Levels of the sweep, e.g. 1,2,4,8 (equiv's greedy gate: 1,4 unless given)."),
        click.option("--repeat", type=click.IntRange(1), default=3, show_default=True,
                     help="Send the prompt set this many times per level."),
        click.option("--warmup", type=click.IntRange(0), default=1, show_default=True,
                     help="Requests sent first (to each server) and discarded."),
        click.option("--max-tokens", type=click.IntRange(1), default=128, show_default=True),
        click.option("--seed", type=int, default=0, show_default=True),
        click.option("--request-timeout", type=click.FloatRange(0.1), default=300, show_default=True,
                     help="Seconds per request."),
        click.option("--near-tie-threshold", type=click.FloatRange(0), help="Nats (default: by --dtype; see docs/compare.md)."),
        click.option("--reference", type=click.Path(path_type=Path),
                     help="Local HF model dir: recompute the target in float64 at each divergence."),
        click.option("--no-triage", is_flag=True, help="Do not ask the spec-off server for logprobs at divergences."),
        click.option("--interference-check/--no-interference-check", default=True, show_default=True,
                     help="After the warm-up of a run with fewer than 10 pairs at concurrency 1, 20 short requests "
                          "that tell whether the two servers stall each other's first token (see docs/compare.md)."),
        click.option("--draft-cost", type=click.FloatRange(0), help="Draft/target cost ratio c for theory (ngram: 0)."),
        click.option("--until-decided", is_flag=True,
                     help="Run until decided: after each unit (an off/on pair at concurrency 1, one repeat's off "
                          "block + on block above 1 and at request rates) the anytime-valid confidence sequence of "
                          "the TPOT ratio decides faster, slower or equivalent (--equivalence-margin); at "
                          "--max-units, no clear difference with the interval reached. --repeat then sets only "
                          "the fixed design the requests are set against. See docs/compare.md."),
        click.option("--max-units", type=click.IntRange(1), metavar="N",
                     help=f"With --until-decided: most units per level [default: {MAX_UNITS}; equiv: at least "
                          "one pass over the prompts at concurrency 1]."),
        click.option("--equivalence-margin", type=float, metavar="DELTA",
                     help="With --until-decided: 'equivalent' when the interval lies within 1/(1+DELTA) and "
                          "1+DELTA (0.05: +-5%); 0 < DELTA < 1."),
        click.option("--alpha", type=click.FloatRange(0, 1, min_open=True, max_open=True),
                     help=f"Error rate. With --until-decided: the rule's, below 0.5 [default: {RULE_ALPHA}]; with "
                          f"equiv --sampling: the family-wise false-alarm rate of the tests [default: {ALPHA}]."),
        click.option("--on-temperature", type=click.FloatRange(0), hidden=True,
                     help="Drill: sample the spec-on side at this temperature (the gate must catch it)."),
        show_option,
        click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path),
                     help="Write report.json, junit.xml, summary.md and report.html here."),
        click.option("--json", "json_out", type=click.Path(dir_okay=False, path_type=Path),
                     help="Write the versioned JSON report here."),
        click.option("--junit", "junit_out", type=click.Path(dir_okay=False, path_type=Path),
                     help="Write JUnit XML here (one testcase per prompt)."),
        click.option("--markdown", "md_out", type=click.Path(dir_okay=False, path_type=Path),
                     help="Write the Markdown summary here."),
        click.option("--html", "html_out", type=click.Path(dir_okay=False, path_type=Path),
                     help="Write the self-contained HTML report (with plots) here."),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return workload_options(load_options(f))


def check_rule_options(kw: dict[str, Any]) -> None:
    """The options of --until-decided, checked before anything runs (one line each)."""
    if not kw.get("until_decided"):
        given = [flag for name, flag in RULE_OPTIONS if kw.get(name) is not None]
        if given:
            raise UsageError(f"{', '.join(given)} belong{'s' if len(given) == 1 else ''} to --until-decided: add "
                             "--until-decided, or leave them out")
        return
    alpha = RULE_ALPHA if kw.get("alpha") is None else kw["alpha"]
    if not 0 < alpha < 0.5:
        raise UsageError(f"--alpha {alpha:g}: the rule's error rate must be between 0 and 0.5, exclusive (e.g. 0.05)")
    margin = kw.get("equivalence_margin")
    if margin is not None and not 0 < margin < 1:
        raise UsageError(f"--equivalence-margin {margin:g}: give a margin between 0 and 1, exclusive (0.05 for "
                         "+-5%)")
    least = fewest_units_to_decide(SequentialDesign(alpha=alpha))
    cap = kw.get("max_units")
    if cap is not None and cap < least:
        raise UsageError(f"--max-units {cap} cannot decide: the rule needs at least {least} units (at --alpha "
                         f"{alpha:g})")


def sequential_design(kw: dict[str, Any], prompts: list[Prompt], gate: dict | None) -> SequentialDesign | None:
    """The run-until-decided rule of --until-decided (None without it). For equiv's gate (``gate``):
    a floor of one pass over the prompts at concurrency 1 (identity answers each prompt alone once;
    the cap is raised to it unless given), and a stop to fail once more prompts diverged than the
    gate allows (with --max-near-tie: a divergence is a suspect or a near-tie, so at max_suspect +
    max_near_tie + 1 of them it cannot pass; without it near-ties are unlimited and no count fails)."""
    if not kw.get("until_decided"):
        return None
    alpha = RULE_ALPHA if kw.get("alpha") is None else kw["alpha"]
    cap = kw.get("max_units")
    floor, fail = 0, None
    if gate is not None:
        if 1 in parse_levels(kw["concurrency"]):
            floor = sum(turns_of(p) for p in prompts)
        if cap is not None and cap < floor:
            raise UsageError(f"--max-units {cap} is below the {floor} pairs that answer each prompt once at "
                             f"concurrency 1, which equiv's identity check needs: give at least {floor}")
        if gate.get("max_near_tie") is not None:
            fail = gate["max_suspect"] + gate["max_near_tie"] + 1
    return SequentialDesign(alpha=alpha, margin=kw.get("equivalence_margin"),
                            max_units=cap if cap is not None else max(MAX_UNITS, floor), min_units=floor,
                            fail_divergences=fail)


def _settings(kw: dict[str, Any], dtype: str | None, interleaved: bool,
              workload: WorkloadInfo | None = None) -> CompareSettings:
    request = RequestSettings(max_tokens=kw["max_tokens"], seed=kw["seed"], top_logprobs=0, logprobs=True,
                              request_timeout_s=kw["request_timeout"])
    return CompareSettings(concurrency=parse_levels(kw["concurrency"]), repeat=kw["repeat"], warmup=kw["warmup"],
                           request=request, on_temperature=kw["on_temperature"],
                           prompts_source=workload.source if workload else "built-in", draft_cost=kw["draft_cost"],
                           near_tie_threshold=kw["near_tie_threshold"], dtype=dtype, triage=not kw["no_triage"],
                           reference=str(kw["reference"]) if kw["reference"] else None, interleaved=interleaved,
                           load=kw.get("load"), workload=workload, workers=kw.get("workers", 1),
                           ray_address=kw.get("ray_address"), interference_check=kw["interference_check"],
                           show=kw["show"])


def _run(server_opts: ServerOptions, off_url: str | None, on_url: str | None, launch: str, kw: dict[str, Any],
         gate: dict | None) -> int:
    if bool(off_url) != bool(on_url):
        raise UsageError("give both --off URL and --on URL, or neither (then both servers are started)")
    connect = bool(off_url)
    if not connect and not server_opts.spec_config:
        raise UsageError("to start the servers, give the spec-on side's --spec-config (or --off and --on URLs)")
    if kw["reference"] and not (Path(kw["reference"]) / "config.json").is_file():
        raise UsageError(f"--reference {kw['reference']} is not a local HF model directory (no config.json)")
    check_rule_options(kw)
    interleaved = connect or launch != "sequential"
    if kw.get("until_decided") and not interleaved:
        raise UsageError(ONE_AFTER_THE_OTHER)
    prompts, workload = load_workload(**kw["workload_opts"])
    settings = _settings(kw, server_opts.dtype, interleaved=interleaved, workload=workload)
    settings.sequential = sequential_design(kw, prompts, gate)
    with ConsoleRun() as console:
        plan = plan_servers(server_opts, ab_sides(off_url, on_url), console.messages, launch=launch)
        settings = settings.model_copy(update={"dtype": plan.dtype})  # --dtype auto as the started servers run it
        report = compare_servers(plan, prompts, settings, console.bars, console.messages)
    if gate is not None:
        apply_gate(report, **gate)
    out = kw["out_dir"]
    written = write_outputs(report, json_path=kw["json_out"] or (out / "report.json" if out else None),
                            junit_path=kw["junit_out"] or (out / "junit.xml" if out else None),
                            markdown_path=kw["md_out"] or (out / "summary.md" if out else None),
                            html_path=kw["html_out"] or (out / "report.html" if out else None))
    render_console(report, Console())
    for path in written:
        stderr.print(f"wrote {path}")
    if gate is not None:
        return 0 if report.gate.passed else 1
    return 0


@click.command("compare")
@server_options(sides=2)
@ab_options
def compare(server_opts: ServerOptions, off_url, on_url, launch, **kw) -> None:
    """Same prompts with speculative decoding on and off: speed with confidence, load crossover,
    acceptance and theory, and output identity with triage of every divergence."""
    sys.exit(_run(server_opts, off_url, on_url, launch, kw, gate=None))


# equiv's greedy gate: each prompt alone and inside batches of 4 (a concurrency-only fault shows there)
EQUIV_CONCURRENCY = "1,4"
@click.command("equiv")
@server_options(sides=2)
@ab_options
@click.option("--max-suspect", type=click.IntRange(0), default=0, show_default=True,
              help="Most prompts allowed to diverge for a reason other than a near-tie (untriaged count here).")
@click.option("--max-near-tie", type=click.IntRange(0), help="Most near-tie divergences allowed (default: any).")
@click.option("--min-speedup", type=click.FloatRange(0), help="Least tokens/s ratio on/off at the first level.")
@click.option("--sampling", is_flag=True,
              help="Check the sampling distribution instead of greedy identity: sample the spec-on server at "
                   "temperature 1 and test the tokens against the target's distribution (the spec-off server's "
                   "prompt_logprobs, or --reference in float64). With --until-decided: in 4 looks, stopping early "
                   "only to reject (alpha split over the looks). See docs/sampling.md.")
@click.option("--samples", type=click.IntRange(1), default=SAMPLES, show_default=True,
              help="With --sampling: completions per prompt (seeds --seed, --seed + 1, ...).")
@click.option("--top-logprobs", type=click.IntRange(1), default=TOP_LOGPROBS, show_default=True,
              help="With --sampling: K, the source's top-K log-probabilities per position (vLLM allows up to "
                   "its --max-logprobs, default 20).")
@click.option("--features", "features_", metavar="LIST",
              help="Check request features instead: a matrix of cells (stop strings, max/min tokens, penalties, "
                   "logit_bias, logprobs, structured output, prefix cache, long prompts, multi-turn, temperature/"
                   "top-p/top-k/min-p distributions, seeds), one verdict each; 'all', a group or names (see "
                   "--list-features). With --until-decided: each distribution cell in 4 looks, stopping early "
                   "only to reject (alpha split over the looks). See docs/features.md.")
@click.option("--list-features", is_flag=True, help="List the cells of --features and exit.")
@click.option("--require-active", is_flag=True,
              help="With --features: a cell in which the spec-on server proposed no draft fails the gate.")
@click.option("--max-suspect-rate", type=float, metavar="P",
              help="Fail unless the run shows, at 95% confidence, that the rate of suspect divergences per exercised "
                   "prompt is below P (0 < P < 1); 0 suspects in n prompts show 1 - 0.05^(1/n): 299 prompts for 0.01.")
@click.option("--allow-inactive", is_flag=True,
              help="Pass even when the spec-on server drafted nothing, or nothing shows it did (by default such a run "
                   "fails: its identity proves nothing about speculation).")
@click.option("--allow-lossy", is_flag=True,
              help="Pass even when the spec-on side's configuration is lossy by design (e.g. vLLM synthetic "
                   "acceptance, SGLang accept thresholds below 1, TensorRT-LLM relaxed acceptance).")
def equiv(server_opts: ServerOptions, off_url, on_url, launch, max_suspect, max_near_tie, min_speedup, sampling,
          samples, alpha, top_logprobs, features_, list_features, require_active, max_suspect_rate, allow_inactive,
          allow_lossy, **kw) -> None:
    """Staging gate: exit 0 within the thresholds, 1 outside them, 2 on usage or connection errors.

    Writes the versioned JSON report, JUnit XML (one testcase per prompt), a Markdown summary and
    a self-contained HTML report (--out DIR for all four).

    With --sampling: exit 0 when the spec-on server's samples are consistent with the target's
    distribution, 1 when they are not or too few tokens were sampled to decide, 2 on usage or
    connection errors; --max-tokens defaults to 64 and --concurrency is one number, the requests
    in flight (default 4). Temperature 1 and top_p 1 only.

    With --features LIST: one verdict per request feature; exit 0 when no cell fails, 1 when one does,
    2 on usage or connection errors; --max-tokens defaults to 32, --samples to 8.

    Greedy identity (the default) answers each prompt alone and inside concurrent batches
    (--concurrency defaults to 1,4 here), fails when speculation did not run (--allow-inactive) or
    the configuration is lossy (--allow-lossy), and states what the prompts prove: the 95% upper
    bound on the rate of suspect divergences (--max-suspect-rate gates it)."""
    from specadapt.commands import sampling as sampling_command  # scipy: only when asked for

    ctx = click.get_current_context()
    rule = [flag for name, flag in (("until_decided", "--until-decided"), ("max_units", "--max-units"),
                                    ("equivalence_margin", "--equivalence-margin"))
            if kw.get(name) not in (None, False)]
    if (sampling or features_) and not list_features:  # --sampling, --features: stop early only to reject
        rule = [flag for flag in rule if flag != "--until-decided"]
    if rule and (sampling or features_ or list_features):
        raise UsageError(f"{', '.join(rule)} belong{'s' if len(rule) == 1 else ''} to compare and equiv's identity "
                         "gate, not to --sampling or --features (they decide on their own samples)")
    rule_alpha, alpha = alpha, ALPHA if alpha is None else alpha  # the rule's --alpha; the tests' by default
    if allow_inactive and require_active:
        raise UsageError("--allow-inactive and --require-active ask for opposite things: give one of them")
    if max_suspect_rate is not None and not 0 < max_suspect_rate < 1:
        raise UsageError(f"--max-suspect-rate {max_suspect_rate:g}: give a rate between 0 and 1, exclusive "
                         "(e.g. 0.05 for 5%)")
    if list_features or features_:
        from specadapt.commands import features as features_command  # scipy: only when asked for

        if list_features:
            features_command.list_features(Console())
            sys.exit(0)
        if sampling:
            raise UsageError("--features and --sampling are two checks: give one of them (the distribution cells of "
                             "--features sample at their own settings)")
        sys.exit(features_command.run_features(ctx, server_opts, off_url, on_url,
                                               dict(kw, samples=samples, alpha=alpha, top_logprobs=top_logprobs, features=features_,
                                                    require_active=require_active)))
    if require_active:
        raise UsageError("--require-active belongs to --features: add --features, or leave it out")
    if sampling:
        sys.exit(sampling_command.run_sampling(ctx, server_opts, off_url, on_url, launch,
                                               dict(kw, samples=samples, alpha=alpha, top_logprobs=top_logprobs)))
    _refuse_sampling_options(ctx, kw["until_decided"])
    kw["alpha"] = rule_alpha
    if not sampling_command._given(ctx, "concurrency"):
        kw["concurrency"] = EQUIV_CONCURRENCY
    sys.exit(_run(server_opts, off_url, on_url, launch, kw,
                  gate=dict(max_suspect=max_suspect, max_near_tie=max_near_tie, min_speedup=min_speedup,
                            max_suspect_rate=max_suspect_rate, allow_inactive=allow_inactive,
                            allow_lossy=allow_lossy)))


def _refuse_sampling_options(ctx: click.Context, until_decided: bool) -> None:
    """Without --sampling its own options are a mistake; --alpha too, unless --until-decided takes it."""
    from specadapt.commands import sampling as sampling_command

    if not until_decided:
        sampling_command.refuse_sampling_options(ctx)
        return
    given = [sampling_command._flag(ctx, name) for name in ("samples", "top_logprobs")
             if sampling_command._given(ctx, name)]
    if given:
        raise UsageError(f"{', '.join(given)} belong{'s' if len(given) == 1 else ''} to --sampling: add --sampling, "
                         "or leave them out")

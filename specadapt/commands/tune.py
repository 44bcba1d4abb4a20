"""`specadapt tune`: measure draft lengths at each load, choose k per batch size, write the configs
for vLLM and TensorRT-LLM, and verify the emitted one (orchestration.tune_run runs it as library calls)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click
from rich.console import Console

from specadapt.adapters.spec_config import load_spec_config
from specadapt.analysis import tune_model
from specadapt.analysis.stats import MIN_UNITS
from specadapt.commands._console import ConsoleRun, say
from specadapt.commands._load import spread_options
from specadapt.commands._server import ServerOptions, sweep_server_options
from specadapt.commands._workload import load_workload, workload_options
from specadapt.commands.compare import MAX_UNITS, RULE_ALPHA, check_rule_options, parse_levels
from specadapt.configs.spec import SpecConfig
from specadapt.configs.spec_input import neutral_form
from specadapt.errors import ServerDied, ServerError, UsageError
from specadapt.load.engine import turns_of
from specadapt.orchestration import tune_run
from specadapt.orchestration.tune import exit_code
from specadapt.records import RequestSettings, SequentialDesign
from specadapt.records.schedule import read_schedule, schedule_problems
from specadapt.records.tune import TuneReport, TuneSettings
from specadapt.report.tune_render import render_console, write_tune_outputs


def parse_ks(value: str) -> list[int]:
    """``--k 0,2,4`` -> [0, 2, 4]; a range ``1-4`` -> [1, 2, 3, 4]."""
    out: set[int] = set()
    try:
        for part in (p.strip() for p in value.split(",") if p.strip()):
            lo, dash, hi = part.partition("-")
            if dash and int(hi) < int(lo):
                raise UsageError(f"--k {value!r}: the range {part} is empty: write it low-high, e.g. 0-4")
            out.update(range(int(lo), int(hi) + 1) if dash else [int(part)])
    except ValueError as exc:
        raise UsageError(f"--k {value!r}: give draft lengths as comma-separated integers or ranges, e.g. 0,2,4 or "
                         "0-4") from exc
    if not out or min(out) < 0:
        raise UsageError(f"--k {value!r}: every draft length must be an integer >= 0 (0: speculation off)")
    if max(out) == 0:
        raise UsageError(f"--k {value!r}: give at least one draft length above 0 to measure")
    return sorted(out)


def parse_on(value: str) -> tuple[int | None, str]:
    """``--on URL`` or ``--on K=URL``."""
    head, eq, rest = value.partition("=")
    if eq and head.strip().isdigit():
        return int(head), rest
    return None, value


@click.command("tune")
@sweep_server_options
@workload_options
@click.option("--k", "ks", default="0,2,4", show_default=True,
              help="Draft lengths to measure, e.g. 0,2,4 or 0-4 (0: the spec-off server; the spec-off server "
                   "always runs, as the baseline).")
@click.option("--ngram-max", help="n-gram only: lookup windows (prompt_lookup_max) to measure, e.g. 2,4; each "
                                  "is a variant with every k.")
@click.option("--concurrency", default="1,4", show_default=True,
              help="Load levels (closed-loop concurrency = the server's batch size while every stream is busy).")
@click.option("--repeat", type=click.IntRange(1), default=5, show_default=True,
              help="Send the prompt set this many times per level (at concurrency N > 1 each repeat is one "
                   "independent unit; intervals need 5).")
@click.option("--warmup", type=click.IntRange(0), default=1, show_default=True)
@click.option("--max-tokens", type=click.IntRange(1), default=128, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--request-timeout", type=click.FloatRange(0.1), default=300, show_default=True,
              help="Seconds per request.")
@click.option("--objective", type=click.Choice(["tpot", "e2e", "throughput"]), default="tpot", show_default=True,
              help="The ratio that picks k at each level: time per output token, request latency, or tokens/s.")
@click.option("--max-batch-size", type=click.IntRange(1),
              help="End the schedule's last range here (default: at the highest level; engines carry its k "
                   "to larger batch sizes).")
@click.option("--schedule", "given_schedule",
              help="Verify this schedule instead of the one tune chooses, vLLM's form [[start, end, k], ...] "
                   "(inline JSON or a file); the sweep still runs: it gives the best fixed k to beat at each level.")
@click.option("--near-tie-threshold", type=click.FloatRange(0), help="Nats (default: by --dtype).")
@click.option("--no-triage", is_flag=True, help="Do not ask the spec-off server for logprobs at divergences.")
@click.option("--no-verify", is_flag=True, help="Write the recommendation without running the verification.")
@click.option("--until-decided", is_flag=True,
              help="Run until decided: each (k, batch size) cell stops once the anytime-valid confidence sequence of "
                   "its --objective ratio against spec-off decides faster, slower or equivalent "
                   "(--equivalence-margin), at --max-units, or once its interval lies below the best cell's so far "
                   "at that batch size (dropped). The verification keeps the fixed design (--repeat). See "
                   "docs/tune.md.")
@click.option("--max-units", type=click.IntRange(1), metavar="N",
              help=f"With --until-decided: most units per cell [default: {MAX_UNITS}].")
@click.option("--equivalence-margin", type=float, metavar="DELTA",
              help="With --until-decided: 'equivalent' when the interval lies within 1/(1+DELTA) and 1+DELTA.")
@click.option("--alpha", type=click.FloatRange(0, 1, min_open=True, max_open=True),
              help=f"With --until-decided: the rule's error rate, below 0.5 [default: {RULE_ALPHA}].")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Write report.json, summary.md, report.html and the configs here.")
@spread_options
def tune(server_opts: ServerOptions, off_url, on_urls, verify_url, workload_opts, ks, ngram_max, concurrency, repeat,
         warmup, max_tokens, seed, request_timeout, objective, max_batch_size, given_schedule, near_tie_threshold,
         no_triage, no_verify, until_decided, max_units, equivalence_margin, alpha, out_dir, workers,
         ray_address) -> None:
    """Measure draft lengths at each load level, choose the best k per batch size (off where
    speculation loses), write it as a vLLM speculative config and a TensorRT-LLM YAML, then run
    the emitted configuration and verify speed, output identity and that the server honoured it.

    Exit 0: a recommendation (verified, or a measured fixed k where the server does not apply
    schedules); 1: the verification failed (slower than the best fixed k, or a suspect
    divergence); 2: bad input, a server that failed to start, or the spec-off server died (the
    partial report is written)."""
    sys.exit(run_tune(server_opts, off_url, list(on_urls), verify_url, workload_opts, dict(
        ks=ks, ngram_max=ngram_max, concurrency=concurrency, repeat=repeat, warmup=warmup, max_tokens=max_tokens,
        seed=seed, request_timeout=request_timeout, objective=objective, max_batch_size=max_batch_size,
        given_schedule=given_schedule, near_tie_threshold=near_tie_threshold, no_triage=no_triage,
        no_verify=no_verify, out_dir=out_dir, workers=workers, ray_address=ray_address, until_decided=until_decided,
        max_units=max_units, equivalence_margin=equivalence_margin, alpha=alpha)))


def _base_spec(opts: ServerOptions) -> SpecConfig:
    if not opts.spec_config:
        raise UsageError("tune needs --spec-config: the base speculative config whose k it varies (and the "
                         "configs it writes start from), e.g. '{\"method\": \"ngram\", \"k\": 4}'")
    spec = load_spec_config(opts.spec_config, opts.backend)
    if not spec.enabled:
        raise UsageError("--spec-config says method 'off': give the speculative config to tune")
    return spec


def parse_schedule(value: str, ks: list[int]) -> list[tuple[int, int, int]]:
    """--schedule: inline JSON or a JSON/YAML file with [[start, end, k], ...]; its largest k must be
    one of --k (the fixed run the honour check compares against)."""
    data = read_schedule(value, "--schedule")
    problems = schedule_problems(data, None)
    if problems:
        raise UsageError(f"--schedule: {problems[0]}")
    ranges = [tuple(r) for r in data]
    top = max(k for _, _, k in ranges)
    if top not in ks:
        raise UsageError(f"--schedule drafts up to k={top}, which --k does not measure: add {top} to --k")
    return ranges


def sequential_design(kw: dict[str, Any]) -> SequentialDesign | None:
    """The rule of --until-decided (None without it), checked as compare checks it (one line each);
    its primary ratio is the --objective."""
    check_rule_options(kw)
    if not kw.get("until_decided"):
        return None
    return SequentialDesign(alpha=RULE_ALPHA if kw.get("alpha") is None else kw["alpha"],
                            margin=kw.get("equivalence_margin"), primary=kw.get("objective") or "tpot",
                            max_units=MAX_UNITS if kw.get("max_units") is None else kw["max_units"])


def run_tune(opts: ServerOptions, off_url: str | None, on_urls: list[str], verify_url: str | None,
             workload_opts: dict[str, Any], kw: dict[str, Any]) -> int:
    design = sequential_design(kw)
    base = _base_spec(opts)
    ks = parse_ks(kw["ks"])
    windows = sorted(set(parse_levels(kw["ngram_max"]))) if kw["ngram_max"] else []
    if windows and base.method != "ngram":
        raise UsageError(f"--ngram-max is for n-gram speculation; the base config's method is {base.method}")
    levels = parse_levels(kw["concurrency"])
    given_schedule = parse_schedule(kw["given_schedule"], ks) if kw["given_schedule"] else None
    given = [parse_on(v) for v in on_urls]
    if len({u for _, u in given}) != len(given):
        raise UsageError("an --on URL is given twice: give each running candidate once")
    prompts, workload = load_workload(**workload_opts)
    per_set = sum(turns_of(p) for p in prompts)
    problem = tune_model.units_problem(levels, per_set, kw["repeat"], MIN_UNITS)
    if problem:
        raise UsageError(problem)
    request = RequestSettings(max_tokens=kw["max_tokens"], seed=kw["seed"], top_logprobs=0, logprobs=True,
                              request_timeout_s=kw["request_timeout"])
    settings = TuneSettings(backend=opts.backend, base_spec=neutral_form(base), ks=ks, ngram_max=windows,
                            concurrency=levels, repeat=kw["repeat"], warmup=kw["warmup"], request=request,
                            objective=kw["objective"], prompts_source=workload.source, workload=workload,
                            near_tie_threshold=kw["near_tie_threshold"], dtype=opts.dtype, triage=not kw["no_triage"],
                            verify=not kw["no_verify"], max_batch_size=kw["max_batch_size"],
                            given_schedule=given_schedule, workers=kw["workers"], ray_address=kw["ray_address"],
                            sequential=design)

    out_dir: Path = kw["out_dir"]
    plan = None
    try:
        with ConsoleRun() as console:
            plan = tune_run.plan_tune(opts, base, settings, off_url, given, verify_url, console.messages)
            report = tune_run.run_tune(plan, prompts, console.bars, console.messages)
    except (KeyboardInterrupt, SystemExit) as exc:  # Ctrl-C; SIGTERM/SIGHUP arrive as SystemExit
        partial = getattr(exc, "report", None)
        if plan is not None and partial is not None:
            _finish(partial, plan, out_dir, quiet=True)
        raise
    written = _finish(report, plan, out_dir)
    if report.recommendation.form == "none":
        failed = next((c.error for c in report.candidates if c.error), "no candidate ran")
        raise ServerError(f"no candidate could be measured ({failed}); the report is in {out_dir}")
    if report.partial:
        raise ServerDied(f"{report.partial_reason}; the partial report is in {out_dir}")
    for path in written:
        say(f"wrote {path}")
    return exit_code(report)


def _finish(report: TuneReport, plan: tune_run.TunePlan, out_dir: Path, quiet: bool = False) -> list[Path]:
    """Configs (for a finished analysis), then the report in every format; the console summary."""
    written = tune_run.write_configs(report, plan, out_dir)
    written += write_tune_outputs(report, json_path=out_dir / "report.json", markdown_path=out_dir / "summary.md",
                                  html_path=out_dir / "report.html")
    if not quiet:
        render_console(report, Console())
    return written

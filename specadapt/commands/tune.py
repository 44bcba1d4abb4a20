"""`specadapt tune`: measure draft lengths at each load, choose k per batch size, write the configs
for vLLM and TensorRT-LLM, and verify the emitted one (orchestration.tune does the work)."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import click
from rich.console import Console

from specadapt.adapters.base import Server
from specadapt.adapters.registry import get_backend
from specadapt.adapters.spec_config import load_spec_config
from specadapt.analysis import tune_model
from specadapt.analysis.stats import MIN_UNITS
from specadapt.commands._console import progress_bar, say
from specadapt.commands._server import (
    ServerOptions,
    ServerPlan,
    Side,
    api_key_from,
    launch_options_for,
    open_servers,
    resolve_dtype,
    sweep_server_options,
    tls_verify,
)
from specadapt.commands._workload import load_workload, workload_options
from specadapt.commands.compare import parse_levels
from specadapt.configs.render import validate
from specadapt.configs.spec import SpecConfig
from specadapt.configs.spec_input import neutral_form
from specadapt.configs.tuned import write_tuned_configs
from specadapt.errors import ServerDied, ServerError, UsageError
from specadapt.load.engine import turns_of
from specadapt.orchestration import tune as tuning
from specadapt.orchestration.compare import total_requests
from specadapt.records import CompareSettings, RequestSettings
from specadapt.records.schedule import read_schedule, schedule_problems
from specadapt.records.tune import TuneReport, TuneSettings, Verification
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
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Write report.json, summary.md, report.html and the configs here.")
def tune(server_opts: ServerOptions, off_url, on_urls, verify_url, workload_opts, ks, ngram_max, concurrency, repeat,
         warmup, max_tokens, seed, request_timeout, objective, max_batch_size, given_schedule, near_tie_threshold,
         no_triage, no_verify, out_dir) -> None:
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
        no_verify=no_verify, out_dir=out_dir)))


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


def run_tune(opts: ServerOptions, off_url: str | None, on_urls: list[str], verify_url: str | None,
             workload_opts: dict[str, Any], kw: dict[str, Any]) -> int:
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

    backend = get_backend(opts.backend)
    verify = tls_verify(opts.insecure, opts.ca_bundle)
    api_key = api_key_from(opts.api_key)
    plan = ServerPlan(backend_name=opts.backend, backend=backend, sides=(), launch=(), api_key=api_key, verify=verify,
                      startup_timeout_s=opts.startup_timeout)

    # which candidates run where: given ones first (their k read from the server), the rest started
    connected: dict[int, str] = {}
    for k, url in given:
        if k is None:
            with open_servers(replace(plan, sides=(Side(url=url, label="spec-on"),), launch=(None,))) as (server,):
                k = server.describe().num_speculative_tokens
            if not k:
                raise UsageError(f"cannot tell the draft length of --on {url}: write it as --on K={url}")
        if k in connected:
            raise UsageError(f"two --on servers have k={k}: give one server per draft length")
        connected[k] = url
    all_ks = sorted(set(ks) | set(connected) | {0})
    candidates = tuning.candidates_for(base, all_ks, windows)
    candidates = [replace(c, url=connected.get(c.k)) if (c.k in connected and not c.variant) else c
                  for c in candidates]
    to_start = [c for c in candidates if c.k > 0 and not c.url]
    need_start = bool(to_start) or not off_url or (not verify_url and not kw["no_verify"])
    model = None
    launches: dict[str, Any] = {}
    if need_start:
        if not backend.capabilities.launch:
            raise UsageError(f"backend {opts.backend} cannot start servers: give --off URL, one --on URL per draft "
                             "length and --verify-url (or --no-verify)")
        opts = resolve_dtype(opts)  # --dtype auto as the started servers will run it
        model = str(backend.resolve_model(opts.model))
        for c in to_start:  # every candidate's launch checked before anything starts
            launches[c.label] = launch_options_for(backend, opts, model, c.spec, None)
            if backend.spec_support.rules:  # the configs package's rules, model directories included
                validate(c.spec.model_copy(update={"target": model}), backend.spec_support.rules)
        if not off_url:
            launches["off"] = launch_options_for(backend, opts, model, None, None)
        for launch in launches.values():
            backend.check_launch(launch)
        if not verify_url and not kw["no_verify"] and not backend.spec_support.batch_schedule:
            raise UsageError(f"tune starts the verification server with a per-batch-size schedule, which backend "
                             f"{opts.backend} does not take: give --verify-url of a running server with the emitted "
                             "config, or --no-verify")

    request = RequestSettings(max_tokens=kw["max_tokens"], seed=kw["seed"], top_logprobs=0, logprobs=True,
                              request_timeout_s=kw["request_timeout"])
    compare_settings = CompareSettings(concurrency=levels, repeat=kw["repeat"], warmup=kw["warmup"], request=request,
                                       prompts_source=workload.source, near_tie_threshold=kw["near_tie_threshold"],
                                       dtype=opts.dtype, triage=not kw["no_triage"], interleaved=True,
                                       workload=workload)
    settings = TuneSettings(backend=opts.backend, base_spec=neutral_form(base), ks=all_ks, ngram_max=windows,
                            concurrency=levels, repeat=kw["repeat"], warmup=kw["warmup"], request=request,
                            objective=kw["objective"], prompts_source=workload.source, workload=workload,
                            near_tie_threshold=kw["near_tie_threshold"], dtype=opts.dtype, triage=not kw["no_triage"],
                            verify=not kw["no_verify"], max_batch_size=kw["max_batch_size"],
                            given_schedule=given_schedule)
    report = TuneReport(settings=settings)
    per_side = total_requests(len(prompts), compare_settings, prompts) // 2
    measured = [c for c in candidates if c.k > 0]
    say(f"tune: {len(measured)} candidate(s) ({', '.join(c.label for c in measured)}) beside the spec-off server, "
        f"one at a time, at concurrency {','.join(map(str, levels))}; {per_side} requests per server "
        f"({len(to_start)} candidate server(s) to start)")

    out_dir: Path = kw["out_dir"]
    try:
        _sweep_and_verify(report, plan, off_url, launches, candidates, verify_url, base, prompts, compare_settings,
                          per_side, opts, model, given_schedule)
    except (KeyboardInterrupt, SystemExit):  # Ctrl-C; SIGTERM/SIGHUP arrive as SystemExit
        report.partial, report.partial_reason = True, "interrupted (Ctrl-C or a signal); the candidates measured " \
                                                      "before are kept"
        _finish(report, base, out_dir, model or opts.model, quiet=True)
        raise
    written = _finish(report, base, out_dir, model or opts.model)
    if report.recommendation.form == "none":
        failed = next((c.error for c in report.candidates if c.error), "no candidate ran")
        raise ServerError(f"no candidate could be measured ({failed}); the report is in {out_dir}")
    if report.partial:
        raise ServerDied(f"{report.partial_reason}; the partial report is in {out_dir}")
    for path in written:
        say(f"wrote {path}")
    return tuning.exit_code(report)


def _sweep_and_verify(report: TuneReport, plan: ServerPlan, off_url: str | None, launches: dict[str, Any],
                      candidates: list[tuning.SweepCandidate], verify_url: str | None, base: SpecConfig,
                      prompts, compare_settings: CompareSettings, per_side: int, opts: ServerOptions,
                      model: str | None, given_schedule: list | None) -> None:
    off_plan = replace(plan, sides=(Side(url=off_url, spec=False, label="spec-off"),),
                       launch=(None if off_url else launches["off"],))

    def one(url: str | None, launch) -> contextlib.AbstractContextManager[list[Server]]:
        return open_servers(replace(plan, sides=(Side(url=url, label="spec-on"),), launch=(launch,)))

    @contextlib.contextmanager
    def open_candidate(cand: tuning.SweepCandidate) -> Iterator[Server]:
        with one(cand.url, None if cand.url else launches[cand.label]) as (server,):
            yield server

    @contextlib.contextmanager
    def open_verify(spec: SpecConfig) -> Iterator[Server]:
        launch = None if verify_url else launch_options_for(plan.backend, opts, model or "", spec, None)
        with one(verify_url, launch) as (server,):
            yield server

    @contextlib.contextmanager
    def progress(description: str, total: int):
        with progress_bar() as bar:
            task = bar.add_task(description, total=total)
            yield lambda rec: bar.advance(task)

    with open_servers(off_plan) as (off,):
        report.off_server = off.describe()
        tuning.run_sweep(report, off, candidates, open_candidate, prompts, compare_settings, progress, per_side)
        tuning.analyse(report, given_schedule)
        if report.partial:
            return
        spec = tuning.verification_spec(report, base)
        if spec is None:
            report.verification = Verification(status="not run", reason=(
                "speculation off is the recommendation: the spec-off server is the baseline itself"
                if report.recommendation.form == "off" else "nothing to verify"))
        elif not report.settings.verify:
            report.verification = Verification(status="not run", reason="--no-verify")
        else:
            say(f"verifying the emitted configuration: {_describe(report)}")
            tuning.run_verification(report, off, open_verify, spec, prompts, compare_settings, progress, per_side)
        tuning.settle_recommendation(report)


def _describe(report: TuneReport) -> str:
    rec = report.recommendation
    if rec.form == "schedule":
        return "k per batch size " + tuning.ranges_text(rec.schedule)
    return f"fixed k={rec.k}"


def _finish(report: TuneReport, base: SpecConfig, out_dir: Path, model: str | None, quiet: bool = False) -> list:
    """Configs (for a finished analysis), then the report in every format; the console summary."""
    written: list = []
    if not report.partial and report.recommendation.form != "none":
        spec = tuning.recommended_spec(report, base)
        spec = spec.model_copy(update={"target": spec.target or model})
        try:
            report.configs = write_tuned_configs(spec, report.recommendation, out_dir)
        except UsageError as err:
            report.notes.append(f"the configs could not be written: {err}")
        written += [Path(c.path) for c in report.configs if c.path]
    written += write_tune_outputs(report, json_path=out_dir / "report.json", markdown_path=out_dir / "summary.md",
                                  html_path=out_dir / "report.html")
    if not quiet:
        render_console(report, Console())
    return written

"""`specadapt compare` and `specadapt equiv`: click wiring around probes.compare."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import click
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)

from specadapt.errors import UsageError
from specadapt.probes.cli import api_key_from, stderr, tls_verify


def parse_levels(value: str) -> list[int]:
    try:
        levels = sorted({int(x) for x in value.split(",") if x.strip()})
    except ValueError as exc:
        raise UsageError(f"--concurrency {value!r}: give comma-separated integers, e.g. 1,2,4,8") from exc
    if not levels or levels[0] < 1:
        raise UsageError(f"--concurrency {value!r}: every level must be an integer >= 1")
    return levels


def ab_options(f):
    opts = [
        click.option("--backend", default="vllm", show_default=True, help="Server kind for both sides."),
        click.option("--off", "off_url", help="URL of the running spec-off server."),
        click.option("--on", "on_url", help="URL of the running spec-on server."),
        click.option("--api-key", help="Bearer token (default: $SPECADAPT_API_KEY, then $OPENAI_API_KEY)."),
        click.option("--insecure", is_flag=True, help="Do not verify TLS certificates (warns)."),
        click.option("--ca-bundle", type=click.Path(exists=True, dir_okay=False, path_type=Path)),
        click.option("--model", help="Start both servers from this local model (default: the embedded model)."),
        click.option("--spec-config", help="The spec-on server's speculative config (vLLM JSON, inline or file)."),
        click.option("--launch", type=click.Choice(["parallel", "sequential"]), default="parallel", show_default=True,
                     help="Started servers side by side (requests interleaved), or one after the other."),
        click.option("--python", default=sys.executable, show_default="this interpreter"),
        click.option("--dtype", help="Server dtype; also picks the default near-tie threshold."),
        click.option("--max-model-len", type=click.IntRange(16), default=2048, show_default=True),
        click.option("--server-arg", "server_args", multiple=True, help="Extra server argument (both servers)."),
        click.option("--startup-timeout", type=click.FloatRange(1), default=900, show_default=True),
        click.option("--prompts", "prompts_file", type=click.Path(path_type=Path)),
        click.option("--concurrency", default="1", show_default=True, help="Levels of the sweep, e.g. 1,2,4,8."),
        click.option("--repeat", type=click.IntRange(1), default=3, show_default=True),
        click.option("--warmup", type=click.IntRange(0), default=1, show_default=True),
        click.option("--max-tokens", type=click.IntRange(1), default=128, show_default=True),
        click.option("--seed", type=int, default=0, show_default=True),
        click.option("--request-timeout", type=click.FloatRange(0.1), default=300, show_default=True),
        click.option("--near-tie-threshold", type=click.FloatRange(0), help="Nats (default: by --dtype; see README)."),
        click.option("--reference", type=click.Path(path_type=Path),
                     help="Local HF model dir: recompute the target in float64 at each divergence."),
        click.option("--no-triage", is_flag=True, help="Do not ask the spec-off server for logprobs at divergences."),
        click.option("--draft-cost", type=click.FloatRange(0), help="Draft/target cost ratio c for theory (ngram: 0)."),
        click.option("--on-temperature", type=click.FloatRange(0), hidden=True,
                     help="Drill: sample the spec-on side at this temperature (the gate must catch it)."),
        click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path),
                     help="Write report.json, junit.xml, summary.md and report.html here."),
        click.option("--json", "json_out", type=click.Path(dir_okay=False, path_type=Path)),
        click.option("--junit", "junit_out", type=click.Path(dir_okay=False, path_type=Path)),
        click.option("--markdown", "md_out", type=click.Path(dir_okay=False, path_type=Path)),
        click.option("--html", "html_out", type=click.Path(dir_okay=False, path_type=Path)),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


def _run(kw: dict, gate: dict | None) -> int:
    from specadapt.adapters.registry import get_backend
    from specadapt.probes.prompts import load_prompts
    from specadapt.records import CompareSettings, RequestSettings
    from specadapt.report.compare_render import render_console
    from specadapt.report.outputs import write_outputs
    from specadapt.probes.gate import apply_gate

    urls = (kw["off_url"], kw["on_url"])
    if any(urls) and not all(urls):
        raise UsageError("give both --off URL and --on URL, or neither (then both servers are started)")
    if all(urls) and (kw["model"] or kw["spec_config"]):
        raise UsageError("--off/--on connect to running servers; --model/--spec-config start them: not both")
    if not all(urls) and not kw["spec_config"]:
        raise UsageError("to start the servers, give the spec-on side's --spec-config (or --off and --on URLs)")
    if kw["reference"] and not (Path(kw["reference"]) / "config.json").is_file():
        raise UsageError(f"--reference {kw['reference']} is not a local HF model directory (no config.json)")
    prompts = load_prompts(kw["prompts_file"])
    request = RequestSettings(max_tokens=kw["max_tokens"], seed=kw["seed"], top_logprobs=0, logprobs=True,
                              request_timeout_s=kw["request_timeout"])
    settings = CompareSettings(concurrency=parse_levels(kw["concurrency"]), repeat=kw["repeat"], warmup=kw["warmup"],
                               request=request, on_temperature=kw["on_temperature"],
                               prompts_source=str(kw["prompts_file"] or "built-in"), draft_cost=kw["draft_cost"],
                               near_tie_threshold=kw["near_tie_threshold"], dtype=kw["dtype"],
                               triage=not kw["no_triage"], reference=str(kw["reference"]) if kw["reference"] else None,
                               interleaved=kw["launch"] == "parallel" or all(urls))
    backend = get_backend(kw["backend"])
    verify = tls_verify(kw["insecure"], kw["ca_bundle"])
    api_key = api_key_from(kw["api_key"])

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=stderr, transient=True) as bar, contextlib.ExitStack() as stack:
        task = bar.add_task("comparing", total=None)

        def progress(_rec):
            bar.advance(task)

        if all(urls):
            off = stack.enter_context(contextlib.closing(backend.connect(urls[0], api_key=api_key, verify=verify)))
            on = stack.enter_context(contextlib.closing(backend.connect(urls[1], api_key=api_key, verify=verify)))
            report = _parallel(off, on, prompts, settings, bar, task, progress)
        else:
            report = _launched(kw, backend, prompts, settings, bar, task, progress, stack)
    if gate is not None:
        apply_gate(report, **gate)
    out = kw["out_dir"]
    paths = dict(json_path=kw["json_out"] or (out / "report.json" if out else None),
                 junit_path=kw["junit_out"] or (out / "junit.xml" if out else None),
                 markdown_path=kw["md_out"] or (out / "summary.md" if out else None),
                 html_path=kw["html_out"] or (out / "report.html" if out else None))
    written = write_outputs(report, **paths)
    render_console(report, Console())
    for path in written:
        stderr.print(f"wrote {path}")
    if gate is not None:
        return 0 if report.gate.passed else 1
    return 0


def _parallel(off, on, prompts, settings, bar, task, progress):
    """Both servers up: the interleaved run."""
    from specadapt.probes.compare import run_compare, total_requests

    bar.update(task, total=total_requests(len(prompts), settings))
    return run_compare(off, on, prompts, settings, progress)


def _launched(kw, backend, prompts, settings, bar, task, progress, stack):
    """Start the servers (side by side, or one after the other) and run the comparison."""
    from specadapt.configs.spec_input import load_spec_json
    from specadapt.models import resolve_model_dir
    from specadapt.probes.compare import (
        finish_compare,
        run_one_side,
        side_settings,
        total_requests,
    )
    from specadapt.records import CompareReport

    if "launch" not in backend.capabilities:
        raise UsageError(f"backend {kw['backend']} cannot start servers: pass --off and --on URLs")
    model = str(resolve_model_dir(kw["model"]))
    spec = load_spec_json(kw["spec_config"])
    common = dict(model=model, python=kw["python"], dtype=kw["dtype"], max_model_len=kw["max_model_len"],
                  extra_args=list(kw["server_args"]))
    off_opts = backend.launch_options(spec_config=None, **common)
    on_opts = backend.launch_options(spec_config=spec, **common)

    def on_plan(plan, log_path):
        stderr.print(f"starting {'spec-on' if plan.spec_enabled else 'spec-off'} server: {plan.printable()}")
        stderr.print(f"  log: {log_path}")

    timeout = kw["startup_timeout"]
    if kw["launch"] == "parallel":
        bar.update(task, description="starting both servers")
        many = getattr(backend, "launched_many", None)
        if many is not None:
            off, on = stack.enter_context(many([off_opts, on_opts], startup_timeout_s=timeout, on_plan=on_plan))
        else:  # a backend that starts one server at a time: both up before any request
            off = stack.enter_context(backend.launched(off_opts, startup_timeout_s=timeout, on_plan=on_plan))
            on = stack.enter_context(backend.launched(on_opts, startup_timeout_s=timeout, on_plan=on_plan))
        bar.update(task, description="comparing")
        return _parallel(off, on, prompts, settings, bar, task, progress)
    # one after the other: spec on first, then spec off (which stays up for the triage)
    bar.update(task, total=total_requests(len(prompts), settings), description="spec on")
    with backend.launched(on_opts, startup_timeout_s=timeout, on_plan=on_plan) as on:
        on_info, on_recs, on_counters = run_one_side(on, "on", prompts, settings, progress)
    bar.update(task, description="spec off")
    off = stack.enter_context(backend.launched(off_opts, startup_timeout_s=timeout, on_plan=on_plan))
    off_info, off_recs, off_counters = run_one_side(off, "off", prompts, settings, progress)
    report = CompareReport(settings=settings, off_server=off_info, on_server=on_info, requests=off_recs + on_recs,
                           counters_on=on_counters, counters_off=off_counters)
    return finish_compare(report, off, prompts, side_settings(off, settings.request))


@click.command("compare")
@ab_options
def compare(**kw) -> None:
    """Same prompts with speculative decoding on and off: speed with confidence, load crossover,
    acceptance and theory, and output identity with triage of every divergence."""
    sys.exit(_run(kw, gate=None))


@click.command("equiv")
@ab_options
@click.option("--max-suspect", type=click.IntRange(0), default=0, show_default=True,
              help="Most prompts allowed to diverge for a reason other than a near-tie (untriaged count here).")
@click.option("--max-near-tie", type=click.IntRange(0), help="Most near-tie divergences allowed (default: any).")
@click.option("--min-speedup", type=click.FloatRange(0), help="Least tokens/s ratio on/off at the first level.")
def equiv(max_suspect, max_near_tie, min_speedup, **kw) -> None:
    """Staging gate: exit 0 within the thresholds, 1 outside them, 2 on usage or connection errors.

    Writes the versioned JSON report, JUnit XML (one testcase per prompt), a Markdown summary and
    a self-contained HTML report (--out DIR for all four)."""
    sys.exit(_run(kw, gate=dict(max_suspect=max_suspect, max_near_tie=max_near_tie, min_speedup=min_speedup)))

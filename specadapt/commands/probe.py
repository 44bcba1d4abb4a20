"""`specadapt probe`: one server or several replicas, checked and measured (orchestration.probe does the
work, from this process or spread over worker processes or Ray actors)."""

from __future__ import annotations

import sys
from pathlib import Path

import click
from rich.console import Console

from specadapt.analysis.probe_report import failed_count, server_log_tail
from specadapt.commands._console import ConsoleRun, stderr
from specadapt.commands._load import load_options, show_option
from specadapt.commands._server import ServerOptions, server_options
from specadapt.commands._workload import load_workload, workload_options
from specadapt.errors import ServerDied, SpecadaptError
from specadapt.orchestration.probe import probe_servers
from specadapt.orchestration.servers import plan_servers, replica_sides
from specadapt.records import ProbeReport, RequestSettings, write_report
from specadapt.report.console import render_probe
from specadapt.report.scale import render_scale


@click.command("probe")
@server_options(sides=1)
@workload_options
@click.option("--concurrency", type=click.IntRange(1, 4096), default=1, show_default=True)
@click.option("--repeat", type=click.IntRange(1), default=1, show_default=True, help="Send the prompt set this many times.")
@click.option("--warmup", type=click.IntRange(0), default=1, show_default=True, help="Requests sent first and discarded.")
@click.option("--max-tokens", type=click.IntRange(1), default=128, show_default=True)
@click.option("--temperature", type=click.FloatRange(0), default=0.0, show_default=True, help="0 is greedy.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--top-logprobs", type=click.IntRange(0, 20), default=0, show_default=True)
@click.option("--no-logprobs", is_flag=True, help="Do not ask for logprobs (token counts then rely on usage).")
@click.option("--request-timeout", type=click.FloatRange(0.1), default=300, show_default=True, help="Seconds per request.")
@click.option("--retries", type=click.IntRange(0, 10), default=0, show_default=True,
              help="Resend a request after HTTP 429/5xx or a refused connection (before any token); "
                   "retried requests are reported apart. Off by default: retries distort latency.")
@show_option
@click.option("--json", "json_out", type=click.Path(dir_okay=False, path_type=Path), help="Write the report here.")
@load_options
def probe(server_opts: ServerOptions, url, port, workload_opts, concurrency, repeat, warmup, max_tokens, temperature,
          seed, top_logprobs, no_logprobs, request_timeout, retries, show, workers, ray_address, json_out,
          load) -> None:
    """Check a server's configuration and measure latency (TTFT, ITL, TPOT, E2E) and acceptance.

    Exit 0 when every request succeeded, 1 when any failed (the report is written either way),
    2 on bad input, when the server cannot be reached or started, or when a server specadapt
    started or a worker dies mid-run (the partial report is still written); 130 on Ctrl-C
    (the requests finished so far are still written).
    """
    prompts, workload = load_workload(**workload_opts)
    settings = RequestSettings(max_tokens=max_tokens, temperature=temperature, seed=seed,
                               logprobs=not no_logprobs, top_logprobs=top_logprobs,
                               request_timeout_s=request_timeout, retries=retries)
    interrupted: KeyboardInterrupt | None = None
    with ConsoleRun() as console:
        plan = plan_servers(server_opts, replica_sides(url, port), console.messages)
        try:
            report = probe_servers(plan, prompts, settings, concurrency, repeat, warmup, load, workers=workers,
                                   ray_address=ray_address, workload=workload, bars=console.bars,
                                   messages=console.messages, show=show)
        except KeyboardInterrupt as exc:
            if getattr(exc, "report", None) is None:
                raise
            interrupted, report = exc, exc.report  # type: ignore[attr-defined]
    if json_out:
        write_report(report, json_out)
    render_probe(report, Console())
    if report.scale is not None:
        render_scale(report.scale, Console())
    if json_out:
        stderr.print(f"report written to {json_out}")
    if interrupted is not None:
        raise interrupted
    if report.partial:
        log_tail = server_log_tail(report)
        if log_tail:  # a server specadapt started died: its log's last lines go with the error
            raise ServerDied(report.partial_reason or "the server exited during the run", log_tail=log_tail)
        raise SpecadaptError(report.partial_reason or "a worker stopped early")
    if failed_count(report):
        sys.exit(1)

"""`specadapt probe` and `specadapt report`: click wiring around probes.runner."""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

import click
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)

from specadapt.errors import ServerDied, UsageError

if TYPE_CHECKING:
    import ssl

stderr = Console(stderr=True)
API_KEY_ENVS = ("SPECADAPT_API_KEY", "OPENAI_API_KEY")


def api_key_from(option: str | None) -> str | None:
    if option:
        return option
    for env in API_KEY_ENVS:
        if os.environ.get(env):
            return os.environ[env]
    return None


def tls_verify(insecure: bool, ca_bundle: Path | None) -> bool | ssl.SSLContext:
    """What httpx's ``verify`` gets: on by default, a context trusting ``ca_bundle``, or off (warned)."""
    if insecure:
        stderr.print("[yellow]warning:[/] TLS certificate verification is off (--insecure)")
        return False
    if ca_bundle:
        import ssl

        try:
            return ssl.create_default_context(cafile=str(ca_bundle))
        except (ssl.SSLError, OSError) as exc:
            raise UsageError(f"--ca-bundle {ca_bundle} is not a PEM CA bundle ({exc})") from exc
    return True


@contextlib.contextmanager
def open_server(backend_name: str, url: str | None, model: str | None, spec_config: str | None,
                api_key: str | None, verify: bool | str, launch: dict,
                startup_timeout_s: float = 900.0) -> Iterator[object]:
    """Connect to ``url``, or launch a managed server (stopped when the block exits)."""
    from specadapt.adapters.registry import get_backend

    backend = get_backend(backend_name)
    with contextlib.ExitStack() as stack:
        if url:
            if model or spec_config:
                raise UsageError("--url connects to a running server; --model and --spec-config are for "
                                 "starting one: give one or the other")
            server = backend.connect(url, api_key=api_key, verify=verify)
            stack.callback(server.close)
            yield server
            return
        if "launch" not in backend.capabilities:
            raise UsageError(f"backend {backend_name} cannot start servers: pass --url of a running one")
        from specadapt.configs.spec_input import load_spec_json
        from specadapt.models import resolve_model_dir

        model_dir = getattr(backend, "resolve_model", resolve_model_dir)(model)
        spec = load_spec_json(spec_config) if spec_config else None
        try:
            opts = backend.launch_options(model=str(model_dir), spec_config=spec, **launch)
        except ValueError as exc:  # pydantic.ValidationError: a launch option this backend refuses
            first = exc.errors()[0] if hasattr(exc, "errors") else {"loc": (), "msg": str(exc)}
            where = ".".join(str(p) for p in first["loc"]) or "launch options"
            raise UsageError(f"--backend {backend_name}: {where}: {first['msg']}") from exc
        with stderr.status("starting server...") as status:
            def on_plan(plan, log_path):
                stderr.print(f"starting {backend_name}: {plan.printable()}")
                stderr.print(f"server log: {log_path}")
                for note in getattr(plan, "notes", []):
                    stderr.print(f"note: {note}")

            def on_wait(elapsed: float, last_line: str):
                status.update(f"waiting for the server to answer ({elapsed:.0f} s): {last_line[-90:]}")

            server = stack.enter_context(backend.launched(opts, startup_timeout_s=startup_timeout_s,
                                                          on_wait=on_wait, on_plan=on_plan))
        yield server


def server_options(f):
    """Options shared by every command that talks to or starts a server."""
    opts = [
        click.option("--backend", default="vllm", show_default=True, help="Server kind (see the backends registry)."),
        click.option("--url", help="Base URL of a running server, e.g. http://127.0.0.1:8000."),
        click.option("--api-key", help="Bearer token for --url (default: $SPECADAPT_API_KEY, then $OPENAI_API_KEY)."),
        click.option("--insecure", is_flag=True, help="Do not verify TLS certificates (warns)."),
        click.option("--ca-bundle", type=click.Path(exists=True, dir_okay=False, path_type=Path),
                     help="CA bundle for TLS verification."),
        click.option("--model", "model", help="Local HF model directory to serve (default: the embedded model)."),
        click.option("--spec-config", help="Speculative config as vLLM JSON, inline or a .json/.yaml file (default: off)."),
        click.option("--python", "python", default=sys.executable, show_default="this interpreter",
                     help="Interpreter that has the server installed."),
        click.option("--host", default="127.0.0.1", show_default=True, help="Host a started server binds."),
        click.option("--port", type=click.IntRange(1, 65535), help="Port for a started server (default: a free one)."),
        click.option("--dtype", help="Server dtype (auto, bfloat16, float16, float32)."),
        click.option("--max-model-len", type=click.IntRange(16), default=2048, show_default=True),
        click.option("--server-arg", "server_args", multiple=True,
                     help="Extra argument for the server, verbatim; repeat for several."),
        click.option("--startup-timeout", type=click.FloatRange(1), default=900, show_default=True,
                     help="Seconds to wait for a started server to answer."),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


@click.command("probe")
@server_options
@click.option("--prompts", "prompts_file", type=click.Path(path_type=Path), help="JSONL prompt file (default: built-in set).")
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
@click.option("--json", "json_out", type=click.Path(dir_okay=False, path_type=Path), help="Write the report here.")
def probe(backend, url, api_key, insecure, ca_bundle, model, spec_config, python, host, port, dtype, max_model_len,
          server_args, startup_timeout, prompts_file, concurrency, repeat, warmup, max_tokens, temperature, seed,
          top_logprobs, no_logprobs, request_timeout, retries, json_out) -> None:
    """Check a server's configuration and measure latency (TTFT, ITL, TPOT, E2E) and acceptance.

    Exit 0 when every request succeeded, 1 when any failed (the report is written either way),
    2 on bad input, when the server cannot be reached or started, or when a server specadapt
    started dies mid-run (the partial report is still written).
    """
    from specadapt.probes.prompts import load_prompts
    from specadapt.probes.runner import failed_count, run_probe, server_log_tail
    from specadapt.records import RequestSettings, write_report
    from specadapt.report.console import render_probe

    prompts = load_prompts(prompts_file)
    settings = RequestSettings(max_tokens=max_tokens, temperature=temperature, seed=seed,
                               logprobs=not no_logprobs, top_logprobs=top_logprobs,
                               request_timeout_s=request_timeout, retries=retries)
    launch = dict(python=python, host=host, port=port, dtype=dtype, max_model_len=max_model_len,
                  extra_args=list(server_args))
    verify = tls_verify(insecure, ca_bundle)
    with open_server(backend, url, model, spec_config, api_key_from(api_key), verify, launch,
                     startup_timeout) as server:
        total = len(prompts) * repeat + warmup
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=stderr, transient=True) as bar:
            task = bar.add_task("probing", total=total)
            report = run_probe(server, prompts, settings, concurrency=concurrency, repeat=repeat, warmup=warmup,
                               prompts_source=str(prompts_file) if prompts_file else "built-in",
                               progress=lambda rec: bar.advance(task))
    if json_out:
        write_report(report, json_out)
    render_probe(report, Console())
    if json_out:
        stderr.print(f"report written to {json_out}")
    if report.partial:
        raise ServerDied(report.partial_reason or "the server exited during the run",
                         log_tail=server_log_tail(report))
    if failed_count(report):
        sys.exit(1)


@click.group("report")
def report_group() -> None:
    """Re-render saved reports."""


@report_group.command("show")
@click.argument("path", type=click.Path(path_type=Path))
def report_show(path: Path) -> None:
    """Print a saved probe or compare report (from --json / --out) as tables."""
    from specadapt.records import read_report, report_kind
    from specadapt.report.console import render_probe

    if report_kind(path) == "compare":
        from specadapt.records import read_compare_report
        from specadapt.report.compare_render import render_console

        render_console(read_compare_report(path), Console())
        return
    render_probe(read_report(path), Console())


@report_group.command("export")
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--junit", "junit_out", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--markdown", "md_out", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--html", "html_out", type=click.Path(dir_okay=False, path_type=Path))
def report_export(path: Path, junit_out: Path | None, md_out: Path | None, html_out: Path | None) -> None:
    """Render a saved compare/equiv report again as JUnit XML, Markdown or HTML."""
    from specadapt.records import read_compare_report
    from specadapt.report.outputs import write_outputs

    if not (junit_out or md_out or html_out):
        raise UsageError("give at least one of --junit, --markdown, --html")
    for written in write_outputs(read_compare_report(path), junit_path=junit_out, markdown_path=md_out,
                                 html_path=html_out):
        stderr.print(f"wrote {written}")


@report_group.command("compare")
@click.argument("off_path", type=click.Path(path_type=Path))
@click.argument("on_path", type=click.Path(path_type=Path))
def report_compare(off_path: Path, on_path: Path) -> None:
    """Two saved probe reports side by side: OFF_PATH (spec off) vs ON_PATH (spec on)."""
    from specadapt.records import read_report
    from specadapt.report.side_by_side import render_side_by_side

    render_side_by_side(read_report(off_path), read_report(on_path), Console())

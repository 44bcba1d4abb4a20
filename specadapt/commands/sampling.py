"""`specadapt equiv --sampling`: the spec-on server's samples against the target's distribution
(orchestration/sampling.py does the work; imported only when --sampling is given, since the
statistics need scipy)."""

from __future__ import annotations

from typing import Any

import click
from click.core import ParameterSource
from rich.console import Console

from specadapt.commands._console import ConsoleRun, stderr
from specadapt.commands._server import ServerOptions
from specadapt.commands._workload import load_workload
from specadapt.errors import UsageError
from specadapt.orchestration import sampling
from specadapt.orchestration.servers import plan_servers
from specadapt.records.sampling_report import SamplingSettings
from specadapt.report import sampling_render
from specadapt.report.outputs import write_sampling_outputs

SAMPLING_MAX_TOKENS = 64
SAMPLING_CONCURRENCY = 4
ONLY_SAMPLING = ("samples", "alpha", "top_logprobs")
NOT_SAMPLING = ("repeat", "warmup", "near_tie_threshold", "no_triage", "draft_cost", "on_temperature", "html_out",
                "max_suspect", "max_near_tie", "min_speedup", "request_rate", "burstiness", "duration", "slo",
                "workers", "ray_address", "interference_check", "max_suspect_rate", "allow_inactive", "allow_lossy")


def refuse_sampling_options(ctx: click.Context) -> None:
    """Without --sampling, its own options are a mistake."""
    given = [_flag(ctx, name) for name in ONLY_SAMPLING if _given(ctx, name)]
    if given:
        raise UsageError(f"{', '.join(given)} belong{'s' if len(given) == 1 else ''} to --sampling: add --sampling, "
                         "or leave them out")


def _given(ctx: click.Context, name: str) -> bool:
    return ctx.get_parameter_source(name) not in (None, ParameterSource.DEFAULT)


def _flag(ctx: click.Context, name: str) -> str:
    param = next(p for p in ctx.command.params if p.name == name)
    return max(param.opts, key=len)


def sampling_concurrency(ctx: click.Context, value: str) -> int:
    """--concurrency under --sampling: one integer, the requests in flight per server."""
    if not _given(ctx, "concurrency"):
        return SAMPLING_CONCURRENCY
    try:
        n = int(value)
    except ValueError:
        raise UsageError(f"--concurrency {value!r}: with --sampling give one integer, the requests in flight "
                         "(e.g. 4)") from None
    if n < 1:
        raise UsageError(f"--concurrency {value!r}: must be an integer >= 1")
    return n


def run_sampling(ctx: click.Context, server_opts: ServerOptions, off_url: str | None, on_url: str | None,
                  launch: str, kw: dict[str, Any]) -> int:
    wrong = [_flag(ctx, name) for name in NOT_SAMPLING if _given(ctx, name)]
    if wrong:
        raise UsageError(f"{', '.join(wrong)} do{'es' if len(wrong) == 1 else ''} not apply to --sampling: leave "
                         f"{'it' if len(wrong) == 1 else 'them'} out")
    reference = kw["reference"]
    sides = sampling.sampling_sides(off_url, on_url, reference)
    if not on_url and not server_opts.spec_config:
        raise UsageError("to start the servers, give the spec-on side's --spec-config (or --on and --off URLs)")
    ref = sampling.ReferenceDistribution(reference) if reference else None
    prompts, workload = load_workload(**kw["workload_opts"])
    max_tokens = kw["max_tokens"] if _given(ctx, "max_tokens") else SAMPLING_MAX_TOKENS
    sequential = len(sides) == 2 and not on_url and launch == "sequential"
    tokenizer = sampling.tokenizer_text(len(sides) == 2, sequential, reference)
    settings = SamplingSettings(samples=kw["samples"], max_tokens=max_tokens, alpha=kw["alpha"],
                                top_logprobs=kw["top_logprobs"], concurrency=sampling_concurrency(ctx, kw["concurrency"]),
                                seed=kw["seed"], request_timeout_s=kw["request_timeout"],
                                prompts_source=workload.source,
                                source="reference" if reference else "server",
                                reference=str(reference) if reference else None, tokenizer=tokenizer,
                                looks=sampling.LOOKS if kw.get("until_decided") else None)
    with ConsoleRun() as console:
        plan = plan_servers(server_opts, sides, console.messages, launch=launch)
        report = sampling.check_sampling(plan, prompts, settings, ref, sequential, console.bars, console.messages)
    out = kw["out_dir"]
    written = write_sampling_outputs(report, json_path=kw["json_out"] or (out / "report.json" if out else None),
                                     junit_path=kw["junit_out"] or (out / "junit.xml" if out else None),
                                     markdown_path=kw["md_out"] or (out / "summary.md" if out else None))
    sampling_render.render_console(report, Console())
    for path in written:
        stderr.print(f"wrote {path}")
    return 0 if report.gate.passed else 1

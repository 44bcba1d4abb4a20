"""`specadapt equiv --features`: the request-feature matrix (orchestration/features.py does the work;
imported only when --features or --list-features is given, since the statistics need scipy)."""

from __future__ import annotations

from typing import Any

import click
from rich.console import Console
from rich.table import Table

from specadapt.analysis.features import FEATURES, GROUPS, parse_features
from specadapt.analysis.identity import default_threshold
from specadapt.analysis.sampling_check import LOOKS
from specadapt.commands._console import ConsoleRun, stderr
from specadapt.commands._server import ServerOptions
from specadapt.commands.sampling import _flag, _given, sampling_concurrency
from specadapt.errors import UsageError
from specadapt.orchestration import features, sampling
from specadapt.orchestration.servers import ab_sides, plan_servers
from specadapt.records.features import FeatureSettings
from specadapt.report import features_render
from specadapt.report.outputs import write_feature_outputs

FEATURE_MAX_TOKENS = 32
FEATURE_SAMPLES = 8
NOT_FEATURES = ("repeat", "warmup", "no_triage", "draft_cost", "on_temperature", "max_suspect", "max_near_tie",
                "min_speedup", "request_rate", "burstiness", "duration", "slo", "workers", "ray_address", "prompts_file",
                "dataset", "workload", "num_prompts", "category", "max_turns", "interference_check",
                "max_suspect_rate", "allow_inactive", "allow_lossy")


def list_features(console: Console) -> None:
    """The catalogue: every cell with its kind and what it sends, then the group names."""
    table = Table(title="equiv --features")
    for col in ("feature", "kind", "what it sends"):
        table.add_column(col)
    for f in FEATURES:
        table.add_row(f.name, f.kind, f.title)
    console.print(table)
    console.print("groups: " + ", ".join(f"{g} ({len(names)})" for g, names in GROUPS.items()), soft_wrap=True)


def run_features(ctx: click.Context, server_opts: ServerOptions, off_url: str | None, on_url: str | None,
                 kw: dict[str, Any]) -> int:
    wrong = [_flag(ctx, name) for name in NOT_FEATURES if name in ctx.params and _given(ctx, name)]
    if wrong:
        raise UsageError(f"{', '.join(wrong)} do{'es' if len(wrong) == 1 else ''} not apply to --features: leave "
                         f"{'it' if len(wrong) == 1 else 'them'} out")
    names = parse_features(kw["features"])
    if bool(off_url) != bool(on_url):
        raise UsageError("--features needs both servers: give --off URL and --on URL, or neither (both are started)")
    if not on_url and not server_opts.spec_config:
        raise UsageError("to start the servers, give the spec-on side's --spec-config (or --off and --on URLs)")
    reference = kw["reference"]
    ref = sampling.ReferenceDistribution(reference) if reference else None
    max_tokens = kw["max_tokens"] if _given(ctx, "max_tokens") else FEATURE_MAX_TOKENS
    samples = kw["samples"] if _given(ctx, "samples") else FEATURE_SAMPLES
    threshold = kw["near_tie_threshold"]
    with ConsoleRun() as console:
        plan = plan_servers(server_opts, ab_sides(off_url, on_url), console.messages)
        settings = FeatureSettings(
            features=names, max_tokens=max_tokens, samples=samples, sample_tokens=max_tokens, alpha=kw["alpha"],
            top_logprobs=kw["top_logprobs"], concurrency=sampling_concurrency(ctx, kw["concurrency"]),
            seed=kw["seed"], request_timeout_s=kw["request_timeout"],
            near_tie_threshold=threshold if threshold is not None else _planned_threshold(plan.dtype),
            source="reference" if reference else "server", reference=str(reference) if reference else None,
            require_active=kw["require_active"], looks=LOOKS if kw.get("until_decided") else None)
        report = features.check_features(plan, settings, ref, console.bars, console.messages)
    out = kw["out_dir"]
    written = write_feature_outputs(report, json_path=kw["json_out"] or (out / "report.json" if out else None),
                                    junit_path=kw["junit_out"] or (out / "junit.xml" if out else None),
                                    markdown_path=kw["md_out"] or (out / "summary.md" if out else None),
                                    html_path=kw["html_out"] or (out / "report.html" if out else None))
    features_render.render_console(report, Console())
    for path in written:
        stderr.print(f"wrote {path}")
    if report.partial and report.stopped == "interrupted (Ctrl-C)":
        return 130
    return 0 if report.gate.passed else 1


def _planned_threshold(dtype: str | None) -> float | None:
    """The near-tie threshold of the dtype the started servers run; None for servers given by URL (the
    run takes it from the spec-off server's own dtype)."""
    return default_threshold(dtype) if dtype else None

"""`specadapt equiv --sampling`: the spec-on server's samples against the target's distribution
(orchestration/sampling.py does the work; imported only when --sampling is given, since the
statistics need scipy)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource
from rich.console import Console

from specadapt.adapters.base import TokenRequests
from specadapt.analysis.acceptance import acceptance_summary
from specadapt.commands._console import progress_bar, stderr
from specadapt.commands._server import ServerOptions, ServerPlan, Side, open_servers, plan_servers
from specadapt.commands._workload import load_workload
from specadapt.errors import UsageError
from specadapt.orchestration import sampling
from specadapt.orchestration.probe import counting, settle_counters
from specadapt.records import Prompt
from specadapt.records.sampling_report import SamplingReport, SamplingSettings
from specadapt.report import sampling_render
from specadapt.report.outputs import write_sampling_outputs

SAMPLING_MAX_TOKENS = 64
SAMPLING_CONCURRENCY = 4
ONLY_SAMPLING = ("samples", "alpha", "top_logprobs")
NOT_SAMPLING = ("repeat", "warmup", "near_tie_threshold", "no_triage", "draft_cost", "on_temperature", "html_out",
                "max_suspect", "max_near_tie", "min_speedup", "request_rate", "burstiness", "duration", "slo")


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


def _sampling_sides(off_url: str | None, on_url: str | None, reference: Path | None) -> list[Side]:
    """The servers --sampling needs: spec on always; spec off unless --reference gives p (and no --off)."""
    if off_url and not on_url:
        raise UsageError("--sampling samples the spec-on server: give --on URL (with --off URL or --reference DIR), "
                         "or neither URL to start the servers")
    if on_url and not off_url and not reference:
        raise UsageError("--sampling needs the target's distribution: give --off URL (its prompt_logprobs) or "
                         "--reference DIR (recomputed in float64)")
    on = Side(url=on_url, spec=True, label="spec-on", url_flag="--on")
    if (on_url and off_url) or (not on_url and not reference):
        return [Side(url=off_url, spec=False, label="spec-off", url_flag="--off"), on]
    return [on]


def run_sampling(ctx: click.Context, server_opts: ServerOptions, off_url: str | None, on_url: str | None,
                  launch: str, kw: dict[str, Any]) -> int:
    wrong = [_flag(ctx, name) for name in NOT_SAMPLING if _given(ctx, name)]
    if wrong:
        raise UsageError(f"{', '.join(wrong)} do{'es' if len(wrong) == 1 else ''} not apply to --sampling: leave "
                         f"{'it' if len(wrong) == 1 else 'them'} out")
    reference = kw["reference"]
    sides = _sampling_sides(off_url, on_url, reference)
    if not on_url and not server_opts.spec_config:
        raise UsageError("to start the servers, give the spec-on side's --spec-config (or --on and --off URLs)")
    ref = sampling.ReferenceDistribution(reference) if reference else None
    prompts, workload = load_workload(**kw["workload_opts"])
    max_tokens = kw["max_tokens"] if _given(ctx, "max_tokens") else SAMPLING_MAX_TOKENS
    tokenizer = ("the spec-off server's /tokenize" if len(sides) == 2 and (on_url or launch == "parallel") else
                 "the spec-on server's /tokenize (servers started one after the other)" if len(sides) == 2 else
                 f"the local tokenizer of {reference}")
    settings = SamplingSettings(samples=kw["samples"], max_tokens=max_tokens, alpha=kw["alpha"],
                                top_logprobs=kw["top_logprobs"], concurrency=sampling_concurrency(ctx, kw["concurrency"]),
                                seed=kw["seed"], request_timeout_s=kw["request_timeout"],
                                prompts_source=workload.source,
                                source="reference" if reference else "server",
                                reference=str(reference) if reference else None, tokenizer=tokenizer)
    plan = plan_servers(server_opts, sides)
    sampling.check_token_requests(plan.backend_name, plan.backend.token_requests, scoring=reference is None)
    if len(sides) == 2 and not on_url and launch == "sequential":
        report = _sampling_one_after_the_other(plan, prompts, settings, ref)
    else:
        report = _sampling_side_by_side(plan, prompts, settings, ref)
    out = kw["out_dir"]
    written = write_sampling_outputs(report, json_path=kw["json_out"] or (out / "report.json" if out else None),
                                     junit_path=kw["junit_out"] or (out / "junit.xml" if out else None),
                                     markdown_path=kw["md_out"] or (out / "summary.md" if out else None))
    sampling_render.render_console(report, Console())
    for path in written:
        stderr.print(f"wrote {path}")
    return 0 if report.gate.passed else 1


def _sample_on(on, inputs: list[sampling.PromptInput], settings: SamplingSettings, requests: TokenRequests):
    """Samples from the spec-on server (a progress bar), with its acceptance over them."""
    with counting(on):
        before = settle_counters(on)
        with progress_bar() as bar:
            task = bar.add_task("sampling", total=len(inputs) * settings.samples)
            samples = asyncio.run(sampling.draw_samples(on, inputs, settings.samples, settings.seed,
                                                        settings.concurrency, settings.request_timeout_s,
                                                        lambda: bar.advance(task), requests=requests))
        after = settle_counters(on)
    return samples, acceptance_summary(before, after)


def _score(source, samples: list[sampling.Sample], settings: SamplingSettings, requests: TokenRequests):
    """The target's top K at every sampled position: from the source server, or the float64 reference."""
    with progress_bar() as bar:
        task = bar.add_task("scoring", total=len(samples))
        if isinstance(source, sampling.ReferenceDistribution):
            return sampling.score_on_reference(source, samples, settings.top_logprobs, lambda: bar.advance(task))
        return asyncio.run(sampling.score_on_server(source, samples, settings.top_logprobs, settings.concurrency,
                                                    settings.request_timeout_s, lambda: bar.advance(task),
                                                    requests=requests))


def _prompt_inputs(tokenizer, prompts: list[Prompt], settings: SamplingSettings) -> list[sampling.PromptInput]:
    if isinstance(tokenizer, sampling.ReferenceDistribution):
        ids = [tokenizer.tokenize(p) for p in prompts]
    else:
        ids = asyncio.run(sampling.tokenize_on_server(tokenizer, prompts, settings.request_timeout_s))
    return sampling.inputs_for(prompts, ids, settings.max_tokens)


def _sampling_side_by_side(plan: ServerPlan, prompts: list[Prompt], settings: SamplingSettings,
                           ref: sampling.ReferenceDistribution | None) -> SamplingReport:
    with open_servers(plan) as servers:
        off, on = (servers[0], servers[1]) if len(servers) == 2 else (None, servers[0])
        inputs = _prompt_inputs(off or ref, prompts, settings)
        samples, acceptance = _sample_on(on, inputs, settings, plan.backend.token_requests)
        draws = _score(ref or off, samples, settings, plan.backend.token_requests)
        return sampling.sampling_report(settings, on.describe(), off.describe() if off else None, inputs, samples,
                                        draws, acceptance)


def _sampling_one_after_the_other(plan: ServerPlan, prompts: list[Prompt], settings: SamplingSettings,
                                  ref: sampling.ReferenceDistribution | None) -> SamplingReport:
    """Spec on alone (tokenize and sample), then spec off alone (score)."""
    with open_servers(plan.only("spec-on")) as (on,):
        inputs = _prompt_inputs(on, prompts, settings)
        samples, acceptance = _sample_on(on, inputs, settings, plan.backend.token_requests)
        on_info = on.describe()
    with open_servers(plan.only("spec-off")) as (off,):
        draws = _score(ref or off, samples, settings, plan.backend.token_requests)
        return sampling.sampling_report(settings, on_info, off.describe(), inputs, samples, draws, acceptance)

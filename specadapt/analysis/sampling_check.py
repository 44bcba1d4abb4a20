"""`equiv --sampling` without servers: the samples as the check holds them, the per-prompt
counts, the notes, the gate and the report from the scored tokens (pure: the statistics are
analysis/sampling_stats.py's; orchestration/sampling.py draws and scores)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from specadapt.analysis.sampling_stats import TokenDraw, sampling_verdict
from specadapt.analysis.sides import side_notes
from specadapt.records import AcceptanceSummary, Prompt, ServerInfo
from specadapt.records.reports import PassGate
from specadapt.records.sampling import SamplingStats
from specadapt.records.sampling_report import PromptTokens, SamplingReport, SamplingSettings


@dataclass(frozen=True)
class PromptInput:
    """One prompt as token ids, and the tokens to sample after it."""

    prompt: Prompt
    ids: tuple[int, ...]
    max_tokens: int


@dataclass(frozen=True)
class Sample:
    """One completion drawn from the spec-on server."""

    prompt_id: str
    index: int  # global sample index (0, 1, ... over all prompts); its seed is base seed + index
    seed: int
    prompt_ids: tuple[int, ...]
    tokens: tuple[int, ...]
    finish_reason: str | None = None


def plan_samples(inputs: Sequence[PromptInput], samples: int, seed: int) -> list[tuple[PromptInput, int, int]]:
    """(input, global index, seed) of every sample: ``samples`` per prompt, seed = base seed + index."""
    per_sample = [inp for inp in inputs for _ in range(samples)]
    return [(inp, n, seed + n) for n, inp in enumerate(per_sample)]


def inputs_for(prompts: Sequence[Prompt], ids: Sequence[Sequence[int]], max_tokens: int) -> list[PromptInput]:
    return [PromptInput(prompt=p, ids=tuple(i), max_tokens=p.max_tokens or max_tokens) for p, i in zip(prompts, ids,
                                                                                                         strict=True)]


def prompt_counts(inputs: Sequence[PromptInput], samples: Sequence[Sample],
                  draws: Sequence[Sequence[TokenDraw]]) -> list[PromptTokens]:
    """Samples and sampled tokens per prompt, and how many of those tokens were in the top K."""
    out = []
    for inp in inputs:
        mine = [ds for s, ds in zip(samples, draws, strict=True) if s.prompt_id == inp.prompt.id]
        tokens = [d for ds in mine for d in ds]
        out.append(PromptTokens(prompt_id=inp.prompt.id, category=inp.prompt.category, prompt_tokens=len(inp.ids),
                                samples=len(mine), tokens=len(tokens),
                                in_top_k=sum(1 for d in tokens if d.token in d.top)))
    return out


def sampling_gate(stats: SamplingStats) -> PassGate:
    """Pass only when the statistics say consistent; too few tokens is not a pass."""
    if stats.status == "consistent":
        return PassGate(passed=True)
    if stats.status == "too-few":
        return PassGate(passed=False, reasons=[
            f"too few tokens to decide: {stats.n_tokens} sampled, {stats.min_tokens} needed; raise --samples, "
            "--max-tokens or the number of prompts"])
    rejected = [f"{t.name} p={t.p_value:.3g}" for t in stats.tests if t.rejected]
    if stats.zero_probability_tokens:
        rejected.append(f"{stats.zero_probability_tokens} sampled token(s) of probability zero under the source")
    return PassGate(passed=False, reasons=[
        "the samples are not from the target distribution (" + "; ".join(rejected or [stats.summary]) + ")"])


def sampling_notes(acceptance: AcceptanceSummary | None, samples: Sequence[Sample],
                   spec_looks_off: bool = False) -> list[str]:
    """Caveats of the run: the setting checked, speculation not exercised, samples cut short.
    ``spec_looks_off``: already said (side_notes), so unknown acceptance is not said again."""
    notes = ["sampled at temperature 1 and top_p 1, the only setting this checks: prompt logprobs are the "
             "target's raw distribution"]
    if acceptance is not None and acceptance.known and not acceptance.accepted_tokens:
        notes.append("the spec-on server accepted no draft token during sampling: speculation was not exercised, "
                     "so the test says nothing about it")
    elif acceptance is not None and not acceptance.known and not spec_looks_off:
        notes.append(f"acceptance of the spec-on server is unknown ({acceptance.reason}): the run cannot show "
                     "that speculation was exercised")
    short = [s for s in samples if s.finish_reason not in (None, "length")]
    if short:
        notes.append(f"{len(short)} sample(s) ended before max_tokens ({short[0].finish_reason}): a stop the "
                     "server applied although ignore_eos was set")
    return notes


def source_text(settings: SamplingSettings, source_info: ServerInfo | None) -> str:
    if settings.source == "reference":
        return (f"the target recomputed in float64 from {settings.reference} (--reference), top "
                f"{settings.top_logprobs}")
    where = source_info.base_url if source_info else "?"
    return f"the spec-off server's prompt_logprobs at {where}, top {settings.top_logprobs}"


def sampling_report(settings: SamplingSettings, on_info: ServerInfo, source_info: ServerInfo | None,
                    inputs: Sequence[PromptInput], samples: Sequence[Sample],
                    draws: Sequence[Sequence[TokenDraw]], acceptance: AcceptanceSummary | None = None) -> SamplingReport:
    """The verdict on all sampled tokens, per-prompt counts, notes and the gate."""
    stats = sampling_verdict([d for ds in draws for d in ds], alpha=settings.alpha, bins=settings.bins,
                             seed=settings.seed, power=settings.power, tv_targets=tuple(settings.tv_targets))
    return SamplingReport(settings=settings, on_server=on_info, source_server=source_info,
                          source=source_text(settings, source_info), stats=stats,
                          prompts=prompt_counts(inputs, samples, draws), acceptance=acceptance,
                          notes=[*side_notes(source_info, on_info, differences=source_info is not None
                                            and source_info.base_url != on_info.base_url),
                                 *sampling_notes(acceptance, samples, spec_looks_off=on_info.spec_enabled is False)],
                          gate=sampling_gate(stats))

"""`equiv --sampling` without servers: the samples as the check holds them, the per-prompt
counts, the notes, the gate and the report from the scored tokens (pure: the statistics are
analysis/sampling_stats.py's; orchestration/sampling.py draws and scores)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from specadapt.analysis.sampling_stats import TokenDraw, look_alphas, sampling_verdict
from specadapt.analysis.sides import side_notes
from specadapt.records import AcceptanceSummary, Prompt, ServerInfo
from specadapt.records.reports import PassGate
from specadapt.records.sampling import SamplingStats
from specadapt.records.sampling_report import (
    PromptTokens,
    SamplingLook,
    SamplingLooks,
    SamplingReport,
    SamplingSettings,
)

LOOKS = 4  # looks of `equiv --sampling --until-decided`


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


def look_batches(inputs: Sequence[PromptInput], samples: int, seed: int,
                 looks: int) -> list[list[tuple[PromptInput, int, int]]]:
    """The samples of ``plan_samples`` (same indices, same seeds) in ``looks`` batches of equal size
    (sizes differ by at most one): taken round the prompts (each prompt's first sample, then each
    one's second, ...), so every batch draws on every prompt as evenly as the counts allow. Fewer
    batches when there are fewer samples than looks (no batch is empty)."""
    planned = plan_samples(inputs, samples, seed)
    order = sorted(range(len(planned)), key=lambda n: (n % samples, n // samples))  # n = prompt * samples + j
    k = min(looks, len(order))
    bounds = [len(order) * i // k for i in range(k + 1)]
    return [[planned[n] for n in order[bounds[i]:bounds[i + 1]]] for i in range(k)]


def by_index(samples: Sequence[Sample],
             draws: Sequence[Sequence[TokenDraw]]) -> tuple[list[Sample], list[Sequence[TokenDraw]]]:
    """Samples and their draws in the order of their index: the fixed design's order, so the last look
    of a run with looks tests the very tokens (and PIT draws) the fixed design would."""
    pairs = sorted(zip(samples, draws, strict=True), key=lambda sd: sd[0].index)
    return [s for s, _ in pairs], [d for _, d in pairs]


def look_stats(settings: SamplingSettings, samples: Sequence[Sample], draws: Sequence[Sequence[TokenDraw]],
               alpha: float) -> SamplingStats:
    """The verdict at one look on every sample scored so far, at the look's ``alpha``."""
    _, ordered = by_index(samples, draws)
    return sampling_verdict([d for ds in ordered for d in ds], alpha=alpha, bins=settings.bins, seed=settings.seed,
                            power=settings.power, tv_targets=tuple(settings.tv_targets))


def look_record(look: int, samples: int, alpha: float, stats: SamplingStats) -> SamplingLook:
    return SamplingLook(look=look, samples=samples, tokens=stats.n_tokens, alpha=alpha, status=stats.status,
                        smallest_p=min((t.p_value for t in stats.tests), default=None))


def stops(look: int, looks: int, stats: SamplingStats) -> bool:
    """Whether the run stops after this look: at the last, or when the look rejects."""
    return look >= looks or stats.status == "inconsistent"


def looks_outcome(alpha: float, planned_looks: int, fixed: int, history: Sequence[SamplingLook]) -> SamplingLooks:
    """The design (``planned_looks`` looks, the alpha of each; ``fixed``: the fixed design's samples)
    and where the run stopped (the last look of ``history``)."""
    alphas = look_alphas(alpha, planned_looks)
    last = history[-1]
    split = (f"alpha {alpha:g} split over {planned_looks} looks: "
             + (f"{alphas[0]:.3g} at each of looks 1-{planned_looks - 1} and {alphas[-1]:.3g} at the last"
                if planned_looks > 2 else f"{alphas[0]:.3g} at look 1 and {alphas[-1]:.3g} at the last"
                if planned_looks == 2 else f"{alphas[0]:.3g} at the only look"))
    if last.look < planned_looks:
        where = (f"stopped at look {last.look} of {planned_looks}: the sampling distribution differs "
                 f"(p={last.smallest_p:.3g} <= {last.alpha / 3:.3g})" if last.smallest_p is not None
                 and last.smallest_p <= last.alpha / 3 else
                 f"stopped at look {last.look} of {planned_looks}: a sampled token has probability zero under "
                 "the source")
    else:
        where = f"ran all {planned_looks} looks (an interim look only rejects; acceptance is decided at the last)"
    text = (f"{where}, after {last.samples:,} of the fixed design's {fixed:,} samples; {split} (each look's three "
            "tests at a third of its alpha; at most alpha in all)")
    return SamplingLooks(looks=planned_looks, alphas=alphas, stopped_at=last.look, samples=last.samples,
                         fixed_samples=fixed, history=list(history), text=text)


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
                    draws: Sequence[Sequence[TokenDraw]], acceptance: AcceptanceSummary | None = None,
                    looks: tuple[SamplingStats, SamplingLooks] | None = None) -> SamplingReport:
    """The verdict on all sampled tokens, per-prompt counts, notes and the gate; ``looks``: with
    --until-decided, the verdict of the look the run stopped at and the course of the looks."""
    if looks is None:
        stats = sampling_verdict([d for ds in draws for d in ds], alpha=settings.alpha, bins=settings.bins,
                                 seed=settings.seed, power=settings.power, tv_targets=tuple(settings.tv_targets))
    else:
        stats = looks[0]
        samples, draws = by_index(samples, draws)
    return SamplingReport(settings=settings, on_server=on_info, source_server=source_info,
                          source=source_text(settings, source_info), stats=stats,
                          prompts=prompt_counts(inputs, samples, draws), acceptance=acceptance,
                          notes=[*side_notes(source_info, on_info, differences=source_info is not None
                                            and source_info.base_url != on_info.base_url),
                                 *sampling_notes(acceptance, samples, spec_looks_off=on_info.spec_enabled is False)],
                          gate=sampling_gate(stats), looks=looks[1] if looks else None)

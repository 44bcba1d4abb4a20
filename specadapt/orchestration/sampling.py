"""Sampling-distribution equivalence: are the spec-on server's samples drawn from the target?

Greedy identity (analysis/identity.py) cannot see a rejection sampler that is wrong, since
greedy decoding never calls it. This probe samples the spec-on server at temperature 1 and
asks a *source* of the target's distribution p how likely each sampled token was:

1. prompt ids: the source server's ``POST /tokenize`` (chat prompts with the chat template
   and ``add_generation_prompt``), or the local tokenizer of ``--reference DIR``;
2. samples: ``/v1/completions`` on the spec-on server with the prompt as token ids,
   temperature 1, top_p 1, a distinct seed per sample (base seed + sample index),
   ``ignore_eos`` (stopping at EOS would select samples on their own values) and the sampled
   ids in the logprobs;
3. scoring, one request per sample on the source server: the prompt logprobs of the prompt
   ids plus the sampled ids; the top K (rank <= K) is the distribution's fixed head, and the
   token at the position is the sample. With ``--reference DIR`` the same top K and the
   sampled token's log-probability come from the model recomputed in float64 on the CPU
   (orchestration/reference_target.py).

The requests and their answers are orchestration/sampling_requests.py's, every request goes
through the wire (specadapt/wire), and the statistics, the gate and the report are
analysis/sampling_stats.py's and analysis/sampling_check.py's: this module draws, scores and
runs the whole check on planned servers (``check_sampling``, orchestration/servers.py).

Temperature 1 and top_p 1 only: prompt logprobs are the raw distribution of the model, so
they are the distribution the server samples only when nothing reshapes it.

A backend that declares it cannot do either (None) is refused before any server starts
(``check_token_requests``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from specadapt.adapters.base import Server, TokenRequests
from specadapt.analysis.features import Setting, draw_from_top, draw_from_vocab
from specadapt.analysis.sampling_check import (
    LOOKS,
    PromptInput,
    Sample,
    inputs_for,
    look_batches,
    look_record,
    look_stats,
    looks_outcome,
    plan_samples,
    sampling_report,
    stops,
)
from specadapt.analysis.sampling_stats import TokenDraw, look_alphas
from specadapt.errors import NotAServer, RequestRefused, ServerError, ServerUnreachable, UsageError
from specadapt.load.client import run as run_loop
from specadapt.load.progress import Progress, ProgressBars, no_bars
from specadapt.orchestration.counters import counter_window
from specadapt.orchestration.reference_target import ReferenceTarget
from specadapt.orchestration.sampling_requests import (
    ASKED,
    check_token_requests,
    parse_sample,
    parse_scores,
    refuses_k,
    sample_body,
    score_body,
)
from specadapt.orchestration.servers import LOGGED, Messages, ServerPlan, Side, open_servers
from specadapt.records import AcceptanceSummary, Prompt, RequestRecord
from specadapt.records.sampling import SamplingStats
from specadapt.records.sampling_report import SamplingLook, SamplingLooks, SamplingReport, SamplingSettings
from specadapt.wire.http import Transport, Wire, fault_kind
from specadapt.wire.openai import error_message, parse_tokenize, tokenize_body

ReferenceDistribution = ReferenceTarget  # the name `--reference DIR` is built by in the commands
RAW = Setting()  # temperature 1, top_p 1: what `equiv --sampling` samples and checks


# --- HTTP --------------------------------------------------------------------------------------
async def _post(client: Wire, path: str, body: dict[str, Any], who: str) -> tuple[int, Any, str]:
    """(status, JSON or None, the server's error sentence) of one POST; no answer raises ServerUnreachable."""
    try:
        resp = await client.apost(path, body)
    except ServerUnreachable as exc:
        cause = exc.__cause__
        if fault_kind(exc) == "timeout":
            raise ServerUnreachable(f"the {who} did not answer {path} in time ({type(cause).__name__}): "
                                    "raise --request-timeout or lower --concurrency") from cause
        detail = str(cause).splitlines()[0] if str(cause) else "no detail"
        raise ServerUnreachable(f"the {who} at {client.base_url} cannot be reached ({type(cause).__name__}: "
                                f"{detail})") from cause
    if resp.status_code != 200:
        return resp.status_code, None, error_message(resp.content)
    try:
        return 200, resp.json(), ""
    except ValueError as exc:
        raise NotAServer(f"the {who} answered {path} with something that is not JSON") from exc


async def _bounded(jobs: list, concurrency: int) -> list:
    sem = asyncio.Semaphore(concurrency)

    async def one(job):
        async with sem:
            return await job()

    return list(await asyncio.gather(*(one(j) for j in jobs)))


async def tokenize_on_server(server: Server, prompts: Sequence[Prompt], timeout_s: float,
                             transport: Transport | None = None) -> list[list[int]]:
    """Prompt ids by the server's own tokenizer and chat template (POST /tokenize)."""
    async with Wire.for_server(server, timeout_s=timeout_s, transport=transport) as client:
        out = []
        for p in prompts:
            status, data, msg = await _post(client, "/tokenize", tokenize_body(p, server.model_id), "source server")
            if status != 200:
                raise ServerError(f"the server refused POST /tokenize for prompt {p.id!r} (HTTP {status}: {msg}); "
                                  "it needs vLLM's /tokenize, or give --reference DIR to tokenize locally")
            out.append(parse_tokenize(data))
        return out


def finished(prompt_id: str, category: str, output_tokens: int, finish_reason: str | None,
             status_code: int | None) -> RequestRecord:
    """The record a Progress gets for one finished request of the check (a sample, a scoring request,
    or one sample scored on the reference): what it was for and how many tokens it returned."""
    return RequestRecord(prompt_id=prompt_id, category=category, api="completions", ok=True, status_code=status_code,
                         output_tokens=output_tokens, finish_reason=finish_reason)


async def draw_samples(server: Server, inputs: Sequence[PromptInput], samples: int, seed: int, concurrency: int,
                       timeout_s: float, progress: Progress | None = None,
                       transport: Transport | None = None,
                       requests: TokenRequests = ASKED, sampling: dict[str, Any] | None = None,
                       planned: Sequence[tuple[PromptInput, int, int]] | None = None) -> list[Sample]:
    """``samples`` completions per prompt from the spec-on server, ``concurrency`` in flight;
    ``requests``: how the server's backend is asked for the sampled ids; ``sampling``: settings
    other than temperature 1, top_p 1 (``equiv --features``); ``planned``: only these samples of
    ``plan_samples`` (one look's batch, ``look_batches``) instead of all of them."""
    async with Wire.for_server(server, timeout_s=timeout_s, concurrency=concurrency, transport=transport) as client:
        async def one(inp: PromptInput, index: int, s: int) -> Sample:
            status, data, msg = await _post(client, "/v1/completions",
                                            sample_body(inp.ids, server.model_id, inp.max_tokens, s, requests, sampling),
                                            "spec-on server")
            if status != 200:
                said = f"the spec-on server refused a sampling request for prompt {inp.prompt.id!r} (HTTP {status}: {msg})"
                raise RequestRefused(said, status, msg) if 400 <= status < 500 else ServerError(said)
            tokens, finish = parse_sample(data, requests)
            if progress:
                progress(finished(inp.prompt.id, inp.prompt.category, len(tokens), finish, status))
            return Sample(prompt_id=inp.prompt.id, index=index, seed=s, prompt_ids=inp.ids, tokens=tuple(tokens),
                          finish_reason=finish)

        todo = plan_samples(inputs, samples, seed) if planned is None else planned
        jobs = [lambda a=a: one(*a) for a in todo]
        return await _bounded(jobs, concurrency)


async def score_on_server(server: Server, samples: Sequence[Sample], k: int, concurrency: int, timeout_s: float,
                          progress: Progress | None = None,
                          transport: Transport | None = None,
                          requests: TokenRequests = ASKED) -> list[list[TokenDraw]]:
    """The source server's top-K prompt logprobs at every sampled position (one request per sample);
    ``requests``: how the server's backend is asked for them."""
    async with Wire.for_server(server, timeout_s=timeout_s, concurrency=concurrency, transport=transport) as client:
        async def one(sample: Sample) -> list[TokenDraw]:
            status, data, msg = await _post(client, "/v1/completions",
                                            score_body(sample, server.model_id, k, requests), "source server")
            if status != 200:
                if status == 400 and refuses_k(msg):
                    raise UsageError(f"the source server refused prompt_logprobs={k} ({msg}): lower --top-logprobs, "
                                     f"or start vLLM with --max-logprobs {k} or more")
                raise ServerError(f"the source server refused a prompt-logprobs request (HTTP {status}: {msg}); "
                                  "it needs prompt_logprobs as vLLM has them, or give --reference DIR")
            draws = parse_scores(data, sample, k)
            if progress:
                progress(finished(sample.prompt_id, "", 1, None, status))
            return draws

        return await _bounded([lambda s=s: one(s) for s in samples], concurrency)


def score_on_reference(reference: ReferenceTarget, samples: Sequence[Sample], k: int,
                       progress: Progress | None = None) -> list[list[TokenDraw]]:
    out = []
    for s in samples:
        out.append(reference.score(s, k))
        if progress:
            progress(finished(s.prompt_id, "", 0, None, None))
    return out


async def score_samples(source: Server | ReferenceTarget, samples: Sequence[Sample], setting: Setting, k: int,
                  concurrency: int, timeout_s: float, progress: Progress | None = None,
                  requests: TokenRequests = ASKED) -> list[list[TokenDraw]]:
    """Every sampled token under the distribution of ``setting``, per sample: at the raw setting
    (temperature 1, nothing cut: `equiv --sampling`) the source's own top K at each position, the
    rest lumped; at any other (the distribution cells of `equiv --features`) the exact distribution
    of the setting (analysis/features.py ``draw_from_vocab`` on the float64 reference's whole
    vocabulary, ``draw_from_top`` on a server's top K where it holds the support). ``source``: the
    float64 reference, or the spec-off server's prompt logprobs."""
    if isinstance(source, ReferenceTarget):
        if setting.raw:
            return score_on_reference(source, samples, k, progress)
        return [_reference_draws(source, s, setting, k) for s in samples]
    scored = await score_on_server(source, samples, k, concurrency, timeout_s, progress, requests=requests)
    if setting.raw:
        return scored
    return [[draw_from_top(d.top, d.token, setting, d.position, d.prompt_id) for d in ds] for ds in scored]


def _reference_draws(reference: ReferenceTarget, sample: Sample, setting: Setting, k: int) -> list[TokenDraw]:
    rows = reference.logprob_rows(sample)
    return [draw_from_vocab(rows[j], token, setting, k, j, sample.prompt_id) for j, token in enumerate(sample.tokens)]


# --- the whole check ------------------------------------------------------------------------------
def sampling_sides(off_url: str | None, on_url: str | None, reference: str | Path | None) -> list[Side]:
    """The servers the check needs: spec on always; spec off unless ``reference`` gives p (and no
    spec-off URL is given). Each side at its URL, or started where it has none."""
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


def tokenizer_text(two_servers: bool, sequential: bool, reference: str | Path | None) -> str:
    """What turns the prompts into ids in check_sampling (the settings' ``tokenizer``): the spec-off
    server, the spec-on one when the two run one after the other, or the reference's own tokenizer."""
    if two_servers and not sequential:
        return "the spec-off server's /tokenize"
    if two_servers:
        return "the spec-on server's /tokenize (servers started one after the other)"
    return f"the local tokenizer of {reference}"


def check_sampling(plan: ServerPlan, prompts: list[Prompt], settings: SamplingSettings,
                   reference: ReferenceTarget | None = None, sequential: bool = False,
                   bars: ProgressBars = no_bars, messages: Messages = LOGGED) -> SamplingReport:
    """The whole check on the servers of ``plan`` (e.g. ``sampling_sides``): the spec-on server samples,
    and the target's distribution comes from ``reference`` when given, else from the spec-off server.
    Both servers up at once (the spec-off server, or the reference, tokenizes), or with ``sequential``
    one after the other: spec on alone first (it tokenizes and samples), then spec off alone (it
    scores). Every server started here is stopped when this returns or raises."""
    labels = [s.label for s in plan.sides]
    if "spec-on" not in labels or not set(labels) <= {"spec-on", "spec-off"}:
        raise ValueError(f"check_sampling needs a plan of a spec-on side and, optionally, a spec-off side, "
                         f"not {labels}")
    if "spec-off" not in labels and reference is None:
        raise ValueError("check_sampling without a spec-off side needs the reference distribution")
    requests = plan.backend.token_requests
    check_token_requests(plan.backend_name, requests, scoring=reference is None)
    if settings.looks is not None and sequential and len(labels) == 2:
        raise UsageError(ONE_AFTER_THE_OTHER)
    if sequential and len(labels) == 2:
        with open_servers(plan.only("spec-on"), messages) as (on,):
            inputs = prompt_inputs(on, prompts, settings)
            samples, acceptance = sample_on(on, inputs, settings, bars, requests)
            on_info = on.describe()
        with open_servers(plan.only("spec-off"), messages) as (off,):
            draws = score(reference or off, samples, settings, bars, requests)
            return sampling_report(settings, on_info, off.describe(), inputs, samples, draws, acceptance)
    with open_servers(plan, messages) as opened:
        by = dict(zip(labels, opened, strict=True))
        off, on = by.get("spec-off"), by["spec-on"]
        inputs = prompt_inputs(off or reference, prompts, settings)
        if settings.looks is not None:
            samples, draws, acceptance, looks = sample_and_score_in_looks(on, reference or off, inputs, settings, bars,
                                                                           requests)
        else:
            samples, acceptance = sample_on(on, inputs, settings, bars, requests)
            draws, looks = score(reference or off, samples, settings, bars, requests), None
        return sampling_report(settings, on.describe(), off.describe() if off else None, inputs, samples, draws,
                               acceptance, looks)


ONE_AFTER_THE_OTHER = ("--until-decided needs both servers up at once (each look's samples are scored as they "
                       "come): leave out --launch sequential, or --until-decided")


Draw = Callable[[list], Awaitable[list[Sample]]]
"""Draws one look's planned samples on the spec-on server."""
Score = Callable[[list[Sample]], Awaitable[list[list[TokenDraw]]]]
"""Scores those samples on the source."""
Verdict = Callable[[list[Sample], list[list[TokenDraw]], float], SamplingStats]
"""The test on every sample so far at one look's alpha."""


async def in_looks(batches: Sequence[list], alpha: float, draw: Draw, score: Score, verdict: Verdict,
                   ) -> tuple[list[Sample], list[list[TokenDraw]], SamplingStats, SamplingLooks]:
    """The looks of `--until-decided` (analysis/sampling_check.py): each batch of ``batches`` drawn and
    scored, then ``verdict`` on everything so far at the look's share of ``alpha`` (``look_alphas``);
    an interim look that rejects stops, and the last look, on every sample of the fixed design,
    decides either way. Shared by `equiv --sampling` and the distribution cells of `--features`."""
    samples: list[Sample] = []
    draws: list[list[TokenDraw]] = []
    history: list[SamplingLook] = []
    alphas = look_alphas(alpha, len(batches))
    for look, (batch, look_alpha) in enumerate(zip(batches, alphas, strict=True), start=1):
        new = await draw(batch)
        samples += new
        draws += await score(new)
        stats = verdict(samples, draws, look_alpha)
        history.append(look_record(look, len(samples), look_alpha, stats))
        if stops(look, len(batches), stats):
            break
    return samples, draws, stats, looks_outcome(alpha, len(batches), sum(len(b) for b in batches), history)


def sample_and_score_in_looks(on: Server, source: Server | ReferenceTarget, inputs: Sequence[PromptInput],
                              settings: SamplingSettings, bars: ProgressBars = no_bars,
                              requests: TokenRequests = ASKED,
                              ) -> tuple[list[Sample], list[list[TokenDraw]], AcceptanceSummary,
                                         tuple[SamplingStats, SamplingLooks]]:
    """The samples in ``settings.looks`` batches (``look_batches``), each drawn on the spec-on server
    and scored on ``source``, looked at as ``in_looks`` says. The bars count against the fixed design."""
    if settings.looks is None:
        raise ValueError("sample_and_score_in_looks needs settings.looks")
    batches = look_batches(inputs, settings.samples, settings.seed, settings.looks)
    total = sum(len(b) for b in batches)
    sampled, scored = bars("sampling", total), bars("scoring", total)

    def draw(batch: list) -> Awaitable[list[Sample]]:
        return draw_samples(on, inputs, settings.samples, settings.seed, settings.concurrency,
                            settings.request_timeout_s, sampled, requests=requests, sampling=RAW.body(), planned=batch)

    def score(new: list[Sample]) -> Awaitable[list[list[TokenDraw]]]:
        return score_samples(source, new, RAW, settings.top_logprobs, settings.concurrency,
                             settings.request_timeout_s, scored, requests)

    def verdict(samples: list[Sample], draws: list[list[TokenDraw]], alpha: float) -> SamplingStats:
        return look_stats(settings, samples, draws, alpha)

    with counter_window(on) as window:
        samples, draws, stats, looks = run_loop(in_looks(batches, settings.alpha, draw, score, verdict))
    return samples, draws, window.acceptance, (stats, looks)


def prompt_inputs(tokenizer: Server | ReferenceTarget, prompts: Sequence[Prompt],
                  settings: SamplingSettings) -> list[PromptInput]:
    """The prompts as ids, by a server's /tokenize or the reference's tokenizer."""
    if isinstance(tokenizer, ReferenceTarget):
        ids = [tokenizer.tokenize(p) for p in prompts]
    else:
        ids = run_loop(tokenize_on_server(tokenizer, prompts, settings.request_timeout_s))
    return inputs_for(prompts, ids, settings.max_tokens)


def sample_on(on: Server, inputs: Sequence[PromptInput], settings: SamplingSettings,
              bars: ProgressBars = no_bars, requests: TokenRequests = ASKED) -> tuple[list[Sample], AcceptanceSummary]:
    """The samples from the spec-on server (one bar, 'sampling'), with its acceptance over them."""
    with counter_window(on) as window:
        samples = run_loop(draw_samples(on, inputs, settings.samples, settings.seed, settings.concurrency,
                                        settings.request_timeout_s, bars("sampling", len(inputs) * settings.samples),
                                        requests=requests, sampling=RAW.body()))
    return samples, window.acceptance


def score(source: Server | ReferenceTarget, samples: Sequence[Sample], settings: SamplingSettings,
          bars: ProgressBars = no_bars, requests: TokenRequests = ASKED) -> list[list[TokenDraw]]:
    """The target's top K at every sampled position (one bar, 'scoring'): from the source server's
    prompt logprobs, or the float64 reference."""
    return run_loop(score_samples(source, samples, RAW, settings.top_logprobs, settings.concurrency,
                                  settings.request_timeout_s, bars("scoring", len(samples)), requests))

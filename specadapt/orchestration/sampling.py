"""Sampling-distribution equivalence: are the spec-on server's samples drawn from the target?

Greedy identity (analysis/identity.py) cannot see a rejection sampler that is wrong, since
greedy decoding never calls it. This probe samples the spec-on server at temperature 1 and
asks a *source* of the target's distribution p how likely each sampled token was:

1. prompt ids: the source server's ``POST /tokenize`` (chat prompts with the chat template
   and ``add_generation_prompt``), or the local tokenizer of ``--reference DIR``;
2. samples: ``/v1/completions`` on the spec-on server with the prompt as token ids,
   temperature 1, top_p 1, a distinct seed per sample (base seed + sample index),
   ``ignore_eos`` (stopping at EOS would select samples on their own values) and
   ``logprobs: 0`` with the keys the backend declares for sampled ids
   (``TokenRequests.sampled_ids``; vLLM: ``return_tokens_as_token_ids``), so the sampled
   ids come back;
3. scoring, one request per sample on the source server: the prompt is the prompt ids plus
   the sampled ids, ``max_tokens`` 1, ``prompt_logprobs`` K (with the keys of
   ``TokenRequests.prompt_logprobs``), temperature 0. vLLM answers,
   for every prompt position after the first, ``{token id: {"logprob", "rank",
   "decoded_token"}}`` holding the top K *and* the token actually at that position; the top
   K (rank <= K) is the distribution's fixed head, and the token at the position is the
   sample. With ``--reference DIR`` the same top K and the sampled token's log-probability
   come from the model recomputed in float64 on the CPU (torch imported only then).

The statistics (randomized PIT over the top K by probability plus the lumped rest, tests,
power) are analysis/sampling_stats.py's; this module gets the TokenDraws to it.
``check_sampling`` runs the whole check on planned servers (orchestration/servers.py) and
returns the report.

Temperature 1 and top_p 1 only: prompt logprobs are the raw distribution of the model, so
they are the distribution the server samples only when nothing reshapes it.

A backend that declares it cannot do either (None) is refused before any server starts
(``check_token_requests``).
"""

from __future__ import annotations

import asyncio
import copy
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from specadapt.adapters.base import Server, TokenRequests
from specadapt.analysis.sampling_stats import TokenDraw, sampling_verdict
from specadapt.analysis import sides
from specadapt.errors import NotAServer, ServerError, ServerUnreachable, UsageError, require
from specadapt.load.client import run as run_loop
from specadapt.load.progress import Progress, ProgressBars, no_bars
from specadapt.orchestration.counters import counter_window
from specadapt.orchestration.servers import LOGGED, Messages, ServerPlan, Side, open_servers
from specadapt.records import AcceptanceSummary, Prompt, RequestRecord, ServerInfo
from specadapt.records.sampling import SamplingStats
from specadapt.records.sampling_report import PromptTokens, SamplingGate, SamplingReport, SamplingSettings

TEMPERATURE = 1.0
TOP_P = 1.0
PROMPT_STATES = 8  # prompts whose float64 state the reference keeps
_TOKEN_ID = re.compile(r"^token_id:(-?\d+)$")
_ASKED = TokenRequests()  # what the request builders add when the caller names no backend's declaration


class RequestRefused(ServerError):
    """The server answered a request with a 4xx: it refuses what was asked (not a failure of the server)."""


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


# --- request bodies and response parsing (pure) --------------------------------------------------
def tokenize_body(prompt: Prompt, model: str) -> dict[str, Any]:
    """vLLM's POST /tokenize body: chat messages with the chat template and the generation prompt."""
    if prompt.api == "chat":
        return {"model": model, "messages": [m.model_dump() for m in prompt.messages or []],
                "add_generation_prompt": True}
    return {"model": model, "prompt": prompt.prompt}


def parse_tokenize(data: Any) -> list[int]:
    tokens = data.get("tokens") if isinstance(data, dict) else None
    if not isinstance(tokens, list) or not tokens or not all(isinstance(t, int) for t in tokens):
        raise NotAServer("the server's /tokenize answer has no list of token ids ('tokens')")
    return list(tokens)


def check_token_requests(backend: str, requests: TokenRequests, scoring: bool) -> None:
    """UsageError, before any server starts, when ``backend`` declares that its servers cannot
    return the sampled token ids, or (``scoring``: the spec-off server is the source) the
    prompt logprobs."""
    if requests.sampled_ids is None:
        raise UsageError(f"--sampling needs the sampled token ids, which backend {backend} cannot return: run it "
                         "on a backend that can (specadapt backends --json lists token_requests)")
    if scoring and requests.prompt_logprobs is None:
        raise UsageError(f"--sampling scores the samples with the spec-off server's prompt logprobs, which backend "
                         f"{backend} cannot return: give --reference DIR to recompute them from the target")


def sample_body(ids: Sequence[int], model: str, max_tokens: int, seed: int,
                requests: TokenRequests = _ASKED, sampling: dict[str, Any] | None = None) -> dict[str, Any]:
    """One sample from the spec-on server: the raw distribution (or the ``sampling`` settings given),
    a seed of its own, no stop at EOS, the sampled ids in the logprobs (the keys
    ``requests.sampled_ids`` declares)."""
    return {"model": model, "prompt": list(ids), "max_tokens": max_tokens, "temperature": TEMPERATURE,
            "top_p": TOP_P, **(sampling or {}), "seed": seed, "ignore_eos": True, "logprobs": 0,
            **(requests.sampled_ids or {}), "stream": False}


def _keys(extras: dict[str, Any] | None) -> str:
    return " and ".join(f"'{k}'" for k in extras or {}) or "its declared keys"


def parse_sample(data: Any, requests: TokenRequests = _ASKED) -> tuple[list[int], str | None]:
    """(sampled token ids, finish reason) of a non-streamed completion with token-id logprobs."""
    try:
        choice = data["choices"][0]
    except (KeyError, IndexError, TypeError) as exc:
        raise NotAServer("the spec-on server's completion has no choices") from exc
    tokens = (choice.get("logprobs") or {}).get("tokens")
    if not isinstance(tokens, list) or not tokens:
        raise NotAServer("the spec-on server returned no logprobs tokens: it must honour 'logprobs' and "
                         f"{_keys(requests.sampled_ids)} (vLLM does)")
    ids = []
    for t in tokens:
        m = _TOKEN_ID.match(t) if isinstance(t, str) else None
        if m is None:
            raise NotAServer(f"the spec-on server returned token {t!r}, not 'token_id:N': it must honour "
                             f"{_keys(requests.sampled_ids)} (vLLM does)")
        ids.append(int(m.group(1)))
    return ids, choice.get("finish_reason")


def score_body(sample: Sample, model: str, k: int, requests: TokenRequests = _ASKED) -> dict[str, Any]:
    """The source's log-probabilities at every sampled position: prompt logprobs of prompt + sample
    (with the keys ``requests.prompt_logprobs`` declares)."""
    return {"model": model, "prompt": [*sample.prompt_ids, *sample.tokens], "max_tokens": 1, "temperature": 0.0,
            "prompt_logprobs": k, **(requests.prompt_logprobs or {}), "stream": False}


def _entries(raw: Any, where: str) -> dict[int, tuple[float, int | None]]:
    """{token id: (logprob, rank)} of one vLLM prompt_logprobs position."""
    if not isinstance(raw, dict) or not raw:
        raise NotAServer(f"the source server gave no prompt logprobs at {where}")
    out: dict[int, tuple[float, int | None]] = {}
    for key, value in raw.items():
        try:
            tid = int(key)
            logprob = float(value["logprob"] if isinstance(value, dict) else value)
            rank = value.get("rank") if isinstance(value, dict) else None
        except (TypeError, ValueError, KeyError) as exc:
            raise NotAServer(f"the source server's prompt logprobs at {where} are not "
                             "{token id: {'logprob': ...}}") from exc
        out[tid] = (logprob, int(rank) if isinstance(rank, int) else None)
    return out


def top_k_of(entries: dict[int, tuple[float, int | None]], k: int) -> dict[int, float]:
    """The distribution's head: the entries ranked 1..k. vLLM adds the token at the position
    (with its own rank) when it is not among them; that entry is dropped, since a head that
    depended on the sampled token would not be a fixed ordering. Without ranks: the k largest."""
    if all(rank is not None for _, rank in entries.values()):
        return {t: lp for t, (lp, rank) in entries.items() if rank is not None and rank <= k}
    ordered = sorted(entries.items(), key=lambda e: (-e[1][0], e[0]))
    return {t: lp for t, (lp, _) in ordered[:k]}


def parse_scores(data: Any, sample: Sample, k: int) -> list[TokenDraw]:
    """One TokenDraw per sampled token from the source's prompt logprobs; checks that the
    source saw exactly the ids that were sent (its echo and the token at each position)."""
    try:
        choice = data["choices"][0]
    except (KeyError, IndexError, TypeError) as exc:
        raise NotAServer("the source server's completion has no choices") from exc
    sent = [*sample.prompt_ids, *sample.tokens]
    echoed = choice.get("prompt_token_ids")
    if echoed is not None and list(echoed) != sent:
        i = next((j for j, (a, b) in enumerate(zip(echoed, sent)) if a != b), min(len(echoed), len(sent)))
        raise NotAServer(f"the source server's prompt differs from the ids sent (first at position {i} of "
                         f"{len(sent)}): it must take the prompt as token ids")
    plps = choice.get("prompt_logprobs")
    if plps is None:
        raise NotAServer("the source server returned no 'prompt_logprobs': it cannot be the source of the "
                         "target's distribution (vLLM and `specadapt reference serve` can; or give --reference DIR)")
    if not isinstance(plps, list) or len(plps) != len(sent):
        n = len(plps) if isinstance(plps, list) else "no list of"
        raise NotAServer(f"the source server returned {n} prompt logprobs for a prompt of {len(sent)} tokens")
    draws = []
    n_prompt = len(sample.prompt_ids)
    for j, token in enumerate(sample.tokens):
        where = f"sampled position {j} of prompt {sample.prompt_id!r} (sample {sample.index})"
        entries = _entries(plps[n_prompt + j], where)
        if token not in entries:
            raise NotAServer(f"the source server's prompt logprobs at {where} do not hold the sampled token "
                             f"{token}: it scored other ids than were sent")
        draws.append(TokenDraw(top=top_k_of(entries, k), token=token, logprob=entries[token][0], position=j,
                               prompt_id=sample.prompt_id))
    return draws


def error_message(resp: httpx.Response) -> str:
    """The server's own error sentence (vLLM: {"error": {"message"}}), on one line."""
    try:
        data = resp.json()
    except ValueError:
        data = None
    msg = None
    if isinstance(data, dict):
        err = data.get("error")
        msg = err.get("message") if isinstance(err, dict) else (err if isinstance(err, str) else None)
        msg = msg or data.get("message") or data.get("detail")
    text = str(msg) if msg else resp.text
    return " ".join(text.split())[:300] or "no detail"


def refuses_k(message: str) -> bool:
    """Whether a 400 is vLLM refusing the number of (prompt) logprobs asked for."""
    low = message.lower()
    return "logprobs" in low and ("max allowed" in low or "max_logprobs" in low or "greater than" in low)


# --- HTTP --------------------------------------------------------------------------------------
def async_client(server: Server, timeout_s: float, concurrency: int,
                 transport: httpx.AsyncBaseTransport | None = None) -> httpx.AsyncClient:
    """A client with the server's auth and TLS settings and ``concurrency`` connections
    (``transport``: tests answer the requests themselves)."""
    timeout = httpx.Timeout(connect=10.0, read=timeout_s, write=30.0, pool=None)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    return httpx.AsyncClient(base_url=server.base_url, headers=server.headers(), timeout=timeout, limits=limits,
                             verify=server.verify, transport=transport)


async def _post(client: httpx.AsyncClient, path: str, body: dict[str, Any], who: str) -> tuple[int, Any, str]:
    """(status, JSON or None, error message) of one POST; connection faults raise ServerUnreachable."""
    try:
        resp = await client.post(path, json=body)
    except httpx.TimeoutException as exc:
        raise ServerUnreachable(f"the {who} did not answer {path} in time ({type(exc).__name__}): "
                                "raise --request-timeout or lower --concurrency") from exc
    except httpx.HTTPError as exc:
        detail = str(exc).splitlines()[0] if str(exc) else "no detail"
        raise ServerUnreachable(f"the {who} at {client.base_url} cannot be reached ({type(exc).__name__}: "
                                f"{detail})") from exc
    if resp.status_code != 200:
        return resp.status_code, None, error_message(resp)
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
                             transport: httpx.AsyncBaseTransport | None = None) -> list[list[int]]:
    """Prompt ids by the server's own tokenizer and chat template (POST /tokenize)."""
    async with async_client(server, timeout_s, 1, transport) as client:
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


def inputs_for(prompts: Sequence[Prompt], ids: Sequence[Sequence[int]], max_tokens: int) -> list[PromptInput]:
    return [PromptInput(prompt=p, ids=tuple(i), max_tokens=p.max_tokens or max_tokens) for p, i in zip(prompts, ids,
                                                                                                         strict=True)]


def plan_samples(inputs: Sequence[PromptInput], samples: int, seed: int) -> list[tuple[PromptInput, int, int]]:
    """(input, global index, seed) of every sample: ``samples`` per prompt, seed = base seed + index."""
    per_sample = [inp for inp in inputs for _ in range(samples)]
    return [(inp, n, seed + n) for n, inp in enumerate(per_sample)]


async def draw_samples(server: Server, inputs: Sequence[PromptInput], samples: int, seed: int, concurrency: int,
                       timeout_s: float, progress: Progress | None = None,
                       transport: httpx.AsyncBaseTransport | None = None,
                       requests: TokenRequests = _ASKED, sampling: dict[str, Any] | None = None) -> list[Sample]:
    """``samples`` completions per prompt from the spec-on server, ``concurrency`` in flight;
    ``requests``: how the server's backend is asked for the sampled ids; ``sampling``: settings
    other than temperature 1, top_p 1 (``equiv --features``)."""
    async with async_client(server, timeout_s, concurrency, transport) as client:
        async def one(inp: PromptInput, index: int, s: int) -> Sample:
            status, data, msg = await _post(client, "/v1/completions",
                                            sample_body(inp.ids, server.model_id, inp.max_tokens, s, requests, sampling),
                                            "spec-on server")
            if status != 200:
                kind = RequestRefused if 400 <= status < 500 else ServerError
                raise kind(f"the spec-on server refused a sampling request for prompt {inp.prompt.id!r} "
                           f"(HTTP {status}: {msg})")
            tokens, finish = parse_sample(data, requests)
            if progress:
                progress(finished(inp.prompt.id, inp.prompt.category, len(tokens), finish, status))
            return Sample(prompt_id=inp.prompt.id, index=index, seed=s, prompt_ids=inp.ids, tokens=tuple(tokens),
                          finish_reason=finish)

        jobs = [lambda a=a: one(*a) for a in plan_samples(inputs, samples, seed)]
        return await _bounded(jobs, concurrency)


async def score_on_server(server: Server, samples: Sequence[Sample], k: int, concurrency: int, timeout_s: float,
                          progress: Progress | None = None,
                          transport: httpx.AsyncBaseTransport | None = None,
                          requests: TokenRequests = _ASKED) -> list[list[TokenDraw]]:
    """The source server's top-K prompt logprobs at every sampled position (one request per sample);
    ``requests``: how the server's backend is asked for them."""
    async with async_client(server, timeout_s, concurrency, transport) as client:
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


# --- the float64 reference ---------------------------------------------------------------------
class ReferenceDistribution:
    """The target recomputed in float64 on the CPU (``--reference DIR``): its tokenizer gives
    prompt ids when no source server does, its log-softmax the top K at each sampled position.
    torch and transformers are imported on first use."""

    def __init__(self, model_dir: str | Path):
        self.model_dir = Path(model_dir)
        if not (self.model_dir / "config.json").is_file():
            raise UsageError(f"--reference {model_dir} is not a local HF model directory (no config.json)")
        self._model = None
        self._tokenizer = None
        self._prompts: dict = {}  # prompt ids -> (log-probabilities after them, their KV cache)

    def _transformers(self):
        purpose = "--reference (float64 recomputation)"
        self._torch = require("torch", "reference", purpose)
        transformers = require("transformers", "reference", purpose)
        transformers.utils.logging.disable_progress_bar()
        return transformers

    def tokenize(self, prompt: Prompt) -> list[int]:
        if self._tokenizer is None:
            self._tokenizer = self._transformers().AutoTokenizer.from_pretrained(str(self.model_dir))
        tok = self._tokenizer
        if prompt.api == "chat":
            if not tok.chat_template:
                raise UsageError(f"--reference {self.model_dir} has no chat template: give completion prompts "
                                 "('prompt') or a model with one")
            out = tok.apply_chat_template([m.model_dump() for m in prompt.messages or []],
                                          add_generation_prompt=True, tokenize=True)
            ids = out["input_ids"] if isinstance(out, dict) or hasattr(out, "keys") else out
            return [int(t) for t in ids]
        return [int(t) for t in tok(prompt.prompt)["input_ids"]]

    def _load(self):
        if self._model is None:
            transformers = self._transformers()
            self._model = transformers.AutoModelForCausalLM.from_pretrained(
                str(self.model_dir), dtype=self._torch.float64).eval()
        return self._model

    def _prompt_state(self, prompt_ids: tuple[int, ...]):
        """(log-probabilities after the prompt, the prompt's KV cache), computed once per prompt and kept
        for the last ``PROMPT_STATES`` prompts: the samples of a prompt share it, so only their own tokens
        are run (and a run that samples the same prompts at several settings computes each once)."""
        state = self._prompts.pop(prompt_ids, None)
        if state is None:
            torch = self._torch
            with torch.no_grad():
                out = self._load()(torch.tensor([list(prompt_ids)]), use_cache=True)
            state = (torch.log_softmax(out.logits[0, -1:].to(torch.float64), dim=-1), out.past_key_values)
        self._prompts[prompt_ids] = state  # the most recent last
        while len(self._prompts) > PROMPT_STATES:
            self._prompts.pop(next(iter(self._prompts)))
        return state

    def _rows(self, sample: Sample):
        """The target's float64 log-probabilities ``[n, V]`` (torch): row j is the distribution of sampled
        token j."""
        model = self._load()
        torch = self._torch
        first, cache = self._prompt_state(sample.prompt_ids)
        rows = [first]
        if len(sample.tokens) > 1:
            with torch.no_grad():
                out = model(torch.tensor([list(sample.tokens[:-1])]), past_key_values=copy.deepcopy(cache),
                            use_cache=True)
            rows.append(torch.log_softmax(out.logits[0].to(torch.float64), dim=-1))
        return torch.cat(rows)

    def logprob_rows(self, sample: Sample):
        """``_rows`` as a numpy array (the raw distribution at every sampled position)."""
        return self._rows(sample).numpy()

    def score(self, sample: Sample, k: int) -> list[TokenDraw]:
        logp = self._rows(sample)
        torch = self._torch
        values, indices = torch.topk(logp, k, dim=-1)
        draws = []
        for j, token in enumerate(sample.tokens):
            top = {int(t): float(v) for t, v in zip(indices[j].tolist(), values[j].tolist())}
            draws.append(TokenDraw(top=top, token=token, logprob=float(logp[j, token]), position=j,
                                   prompt_id=sample.prompt_id))
        return draws


def score_on_reference(reference: ReferenceDistribution, samples: Sequence[Sample], k: int,
                       progress: Progress | None = None) -> list[list[TokenDraw]]:
    out = []
    for s in samples:
        out.append(reference.score(s, k))
        if progress:
            progress(finished(s.prompt_id, "", 0, None, None))
    return out


# --- the verdict and the report ------------------------------------------------------------------
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


def sampling_gate(stats: SamplingStats) -> SamplingGate:
    """Pass only when the statistics say consistent; too few tokens is not a pass."""
    if stats.status == "consistent":
        return SamplingGate(passed=True)
    if stats.status == "too-few":
        return SamplingGate(passed=False, reasons=[
            f"too few tokens to decide: {stats.n_tokens} sampled, {stats.min_tokens} needed; raise --samples, "
            "--max-tokens or the number of prompts"])
    rejected = [f"{t.name} p={t.p_value:.3g}" for t in stats.tests if t.rejected]
    if stats.zero_probability_tokens:
        rejected.append(f"{stats.zero_probability_tokens} sampled token(s) of probability zero under the source")
    return SamplingGate(passed=False, reasons=[
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


def side_notes(on_info: ServerInfo, source_info: ServerInfo | None) -> list[str]:
    """What looks wrong about the two servers themselves (analysis/sides.py ``side_notes``)."""
    return sides.side_notes(source_info, on_info, differences=source_info is not None
                            and source_info.base_url != on_info.base_url)


def sampling_report(settings: SamplingSettings, on_info: ServerInfo, source_info: ServerInfo | None,
                    inputs: Sequence[PromptInput], samples: Sequence[Sample],
                    draws: Sequence[Sequence[TokenDraw]], acceptance: AcceptanceSummary | None = None) -> SamplingReport:
    """The verdict on all sampled tokens, per-prompt counts, notes and the gate."""
    stats = sampling_verdict([d for ds in draws for d in ds], alpha=settings.alpha, bins=settings.bins,
                             seed=settings.seed, power=settings.power, tv_targets=tuple(settings.tv_targets))
    return SamplingReport(settings=settings, on_server=on_info, source_server=source_info,
                          source=source_text(settings, source_info), stats=stats,
                          prompts=prompt_counts(inputs, samples, draws), acceptance=acceptance,
                          notes=[*side_notes(on_info, source_info),
                                 *sampling_notes(acceptance, samples, spec_looks_off=on_info.spec_enabled is False)],
                          gate=sampling_gate(stats))


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
                   reference: ReferenceDistribution | None = None, sequential: bool = False,
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
        samples, acceptance = sample_on(on, inputs, settings, bars, requests)
        draws = score(reference or off, samples, settings, bars, requests)
        return sampling_report(settings, on.describe(), off.describe() if off else None, inputs, samples, draws,
                               acceptance)


def prompt_inputs(tokenizer: Server | ReferenceDistribution, prompts: Sequence[Prompt],
                  settings: SamplingSettings) -> list[PromptInput]:
    """The prompts as ids, by a server's /tokenize or the reference's tokenizer."""
    if isinstance(tokenizer, ReferenceDistribution):
        ids = [tokenizer.tokenize(p) for p in prompts]
    else:
        ids = run_loop(tokenize_on_server(tokenizer, prompts, settings.request_timeout_s))
    return inputs_for(prompts, ids, settings.max_tokens)


def sample_on(on: Server, inputs: Sequence[PromptInput], settings: SamplingSettings,
              bars: ProgressBars = no_bars, requests: TokenRequests = _ASKED) -> tuple[list[Sample], AcceptanceSummary]:
    """The samples from the spec-on server (one bar, 'sampling'), with its acceptance over them."""
    with counter_window(on) as window:
        samples = run_loop(draw_samples(on, inputs, settings.samples, settings.seed, settings.concurrency,
                                        settings.request_timeout_s, bars("sampling", len(inputs) * settings.samples),
                                        requests=requests))
    return samples, window.acceptance


def score(source: Server | ReferenceDistribution, samples: Sequence[Sample], settings: SamplingSettings,
          bars: ProgressBars = no_bars, requests: TokenRequests = _ASKED) -> list[list[TokenDraw]]:
    """The target's top K at every sampled position (one bar, 'scoring'): from the source server's
    prompt logprobs, or the float64 reference."""
    progress = bars("scoring", len(samples))
    if isinstance(source, ReferenceDistribution):
        return score_on_reference(source, samples, settings.top_logprobs, progress)
    return run_loop(score_on_server(source, samples, settings.top_logprobs, settings.concurrency,
                                    settings.request_timeout_s, progress, requests=requests))

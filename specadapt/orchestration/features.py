"""`equiv --features`: the request-feature matrix run against a spec-on server and its spec-off
baseline. Each cell is one definition in analysis/features.py (its request, its derivation, how
often it is sent, its invariant); this module runs any cell as it is defined, and sends.

Cells run one after the other, so that the spec-on server's counters, read before and after each
cell's own requests (orchestration/counters.py), tell whether speculation ran for that feature.
A cell's derivation asks the servers through the ``Matrix`` (analysis/features.py ``Ask``): the
spec-on server's greedy answer streamed with its token ids, whose chunks (one per engine step,
several tokens when drafts were accepted) say where a stop or a limit falls inside an accepted
chunk; the spec-off server's own answer; its tokenizer.

Distribution cells sample the spec-on server with the cell's setting (seed per sample, EOS
ignored) and score every sampled token against the exact distribution of that setting
(orchestration/sampling.py ``score_samples``, as `equiv --sampling` does at temperature 1): from
the target recomputed in float64 (``--reference DIR``: the whole vocabulary), or from the
spec-off server's prompt logprobs where its top K holds the whole support (top_k <= K). Any other
cell is refused as "not-exact", with the reason, rather than approximated. With --until-decided
(``FeatureSettings.looks``) a distribution cell sends its samples in looks and stops early only to
reject, as `equiv --sampling --until-decided` does (``sample_in_looks``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from typing import Any

from specadapt.adapters.base import Server, TokenRequests
from specadapt.analysis import features as F
from specadapt.analysis.identity import default_threshold
from specadapt.analysis.lossy import lossy_reasons_of
from specadapt.analysis.sampling_check import (
    PromptInput,
    Sample,
    by_index,
    look_batches,
)
from specadapt.analysis.sampling_stats import TokenDraw
from specadapt.analysis.sides import side_notes
from specadapt.errors import NotAServer, RequestRefused, ServerError, ServerUnreachable, UsageError
from specadapt.load.client import run as run_loop
from specadapt.load.progress import ProgressBars, no_bars
from specadapt.orchestration.counters import counter_window
from specadapt.orchestration.reference_target import ReferenceTarget
from specadapt.orchestration.sampling import draw_samples, finished, in_looks, score_samples
from specadapt.orchestration.servers import LOGGED, Messages, ServerPlan, open_servers
from specadapt.records import Divergence, Prompt, ServerInfo
from specadapt.records.features import CellCheck, CellResult, FeatureReport, FeatureSettings
from specadapt.records.sampling import SamplingStats
from specadapt.records.sampling_report import SamplingLooks
from specadapt.wire.http import Wire, fault_kind
from specadapt.wire.openai import (
    detokenize_body,
    error_message,
    first_choice,
    parse_detokenize,
    parse_tokenize,
    tokenize_body,
)

SAMPLE_BINS = 10  # PIT bins of a distribution cell: 50 tokens decide (5 expected per bin)


def refused(side: str, status: int, message: str) -> RequestRefused:
    """A side answered a cell's request with a 4xx: the feature is not supported there."""
    return RequestRefused(f"the {side} server refuses it (HTTP {status}: {message})", status, message)


# --- one request -----------------------------------------------------------------------------------
@dataclass
class Endpoint:
    """One side, with its wire for the run."""

    label: str  # "spec-on" / "spec-off"
    server: Server
    wire: Wire
    requests: TokenRequests

    async def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        try:
            resp = await self.wire.apost(path, body)
        except ServerUnreachable as exc:
            if fault_kind(exc) == "timeout":
                raise ServerUnreachable(f"the {self.label} server did not answer {path} in time: raise "
                                        "--request-timeout") from exc.__cause__
            raise ServerUnreachable(f"the {self.label} server at {self.server.base_url} cannot be reached "
                                    f"({type(exc.__cause__).__name__})") from exc.__cause__
        if 400 <= resp.status_code < 500 and resp.status_code not in (401, 403, 404):
            raise refused(self.label, resp.status_code, error_message(resp.content))
        if resp.status_code != 200:
            raise ServerError(f"the {self.label} server failed on this feature (HTTP {resp.status_code} on {path}: "
                              f"{error_message(resp.content)})")
        try:
            return resp.json()
        except ValueError as exc:
            raise NotAServer(f"the {self.label} server answered {path} with something that is not JSON") from exc


def request_body(prompt: str | list[int] | list[dict], model: str, params: dict[str, Any], max_tokens: int,
                 requests: TokenRequests) -> tuple[str, dict[str, Any]]:
    """(path, body) of one greedy request with the cell's parameters, asking for the generated ids
    (the keys the backend declares in ``requests.output_ids``)."""
    chat = isinstance(prompt, list) and prompt and isinstance(prompt[0], dict)
    body: dict[str, Any] = {"model": model, "max_tokens": max_tokens, "temperature": 0.0, "stream": False,
                            **(requests.output_ids or {}), **params}
    if chat:
        body["messages"] = prompt
        if "logprobs" in params:  # chat: logprobs is a flag, top_logprobs the count
            body["logprobs"], body["top_logprobs"] = True, params["logprobs"]
    else:
        body["prompt"] = prompt
    return ("/v1/chat/completions" if chat else "/v1/completions"), body


def parse_answer(data: dict[str, Any]) -> F.Answer:
    """An Answer from a non-streamed completion or chat completion (vLLM's shapes)."""
    choice = first_choice(data, "the answer")
    message = choice.get("message")
    text = (message or {}).get("content") if message is not None else choice.get("text")
    usage = data.get("usage") or {}
    ids = choice.get("token_ids")
    lps, tops = _logprobs(choice.get("logprobs"))
    return F.Answer(text=text or "", finish_reason=choice.get("finish_reason"),
                    token_ids=tuple(ids) if isinstance(ids, list) else None,
                    completion_tokens=usage.get("completion_tokens"), prompt_tokens=usage.get("prompt_tokens"),
                    stop_reason=choice.get("stop_reason"), logprobs=lps, top_logprobs=tops)


def _logprobs(raw: Any) -> tuple[tuple[float, ...] | None, tuple | None]:
    if not isinstance(raw, dict):
        return None, None
    if "content" in raw:  # chat
        content = raw.get("content") or []
        return (tuple(float(e["logprob"]) for e in content),
                tuple(tuple((t["token"], float(t["logprob"])) for t in e.get("top_logprobs") or []) for e in content))
    values = raw.get("token_logprobs")
    tops = raw.get("top_logprobs")
    return (tuple(float(v) for v in values) if isinstance(values, list) else None,
            tuple(tuple(sorted(((k, float(v)) for k, v in (t or {}).items()), key=lambda e: -e[1]))
                  for t in tops) if isinstance(tops, list) else None)


async def stream_chunks(side: Endpoint, prompt: str | list[int], params: dict[str, Any],
                        max_tokens: int) -> list[list[int]]:
    """The token ids of a streamed greedy answer, one list per streamed chunk (one engine step)."""
    path, body = request_body(prompt, side.server.model_id, params, max_tokens, side.requests)
    body["stream"] = True
    chunks: list[list[int]] = []
    try:
        async for event in side.wire.stream_events(path, body):
            for choice in event.get("choices") or []:
                ids = choice.get("token_ids")
                if ids:
                    chunks.append(list(ids))
    except RequestRefused as exc:
        raise refused(side.label, exc.status, exc.server_message) from exc
    if not chunks:
        raise NotAServer(f"the {side.label} server streamed no token ids: it must honour "
                         f"{list(side.requests.output_ids or {})} in streamed answers (vLLM does)")
    return chunks


async def detokenize(side: Endpoint, ids: Sequence[int]) -> str:
    return parse_detokenize(await side.post("/detokenize", detokenize_body(side.server.model_id, list(ids)))) or ""


async def tokenize(side: Endpoint, text: str) -> list[int]:
    prompt = Prompt(id="features", category="features", prompt=text)
    return parse_tokenize(await side.post("/tokenize", tokenize_body(prompt, side.server.model_id)))


# --- the matrix ------------------------------------------------------------------------------------
@dataclass
class Matrix:
    """What every cell needs: the two sides, the settings, the distribution source."""

    on: Endpoint
    off: Endpoint
    settings: FeatureSettings
    reference: ReferenceTarget | None
    lossy: str | None
    max_model_len: int | None

    # --- what a cell's derivation asks (analysis/features.py ``Ask``) ---
    @property
    def max_tokens(self) -> int:
        return self.settings.max_tokens

    async def stream_chunks(self, prompt: Any, max_tokens: int) -> list[list[int]]:
        return await stream_chunks(self.on, prompt, {}, max_tokens)

    async def detokenize(self, ids: Sequence[int]) -> str:
        return await detokenize(self.on, ids)

    async def baseline(self, prompt: Any, max_tokens: int) -> F.Answer:
        path, body = request_body(prompt, self.off.server.model_id, {}, max_tokens, self.off.requests)
        return parse_answer(await self.off.post(path, body))

    async def tokenize(self, text: str) -> list[int]:
        return await tokenize(self.off, text)


async def _both(m: Matrix, prompt, params: dict[str, Any], max_tokens: int,
                sends: int = 1) -> tuple[F.Answer, F.Answer, F.Answer | None]:
    """The spec-off answer, the spec-on answer (and with ``sends`` 2, the spec-on server's first of two)."""
    async def ask(side: Endpoint) -> F.Answer:
        path, body = request_body(prompt, side.server.model_id, params, max_tokens, side.requests)
        return parse_answer(await side.post(path, body))

    async def answers(side: Endpoint) -> list[F.Answer]:
        return [await ask(side) for _ in range(sends)]

    # the two servers answer at the same time (each side's requests in order): the texts do not depend on it
    offs, ons = await asyncio.gather(answers(m.off), answers(m.on))
    return offs[0], ons[-1], ons[0] if sends > 1 else None


async def deterministic_cell(m: Matrix, feature: F.Feature) -> CellResult:
    cell = F.Derived(prompt=feature.prompt, params=dict(feature.params))
    base = dict(name=feature.name, kind=feature.kind, title=feature.title)
    if feature.derive is not None:
        try:
            cell = await feature.derive(m, cell)
        except F.NotExercised as exc:
            return CellResult(**base, params=dict(feature.params), verdict="inactive",
                              reason=f"speculation not exercised: {exc}")
        except F.CannotDerive as exc:
            return CellResult(**base, params=dict(feature.params), verdict="not-exact", reason=str(exc))
    prompt, params = cell.prompt, cell.params
    max_tokens = params.pop("max_tokens", m.settings.max_tokens)
    shown = dict(params, max_tokens=max_tokens)
    with counter_window(m.on.server) as window:
        off, on, first = await _both(m, prompt, params, max_tokens, sends=feature.sends)
    checks = _deterministic_checks(m, feature, shown, off, on, first)
    near_tie = False
    div = F.divergence(off, on)
    if div is not None:
        check, near_tie = await _triage(m, feature, prompt, params, off, on, div)
        checks = [c for c in checks if c.name != "identity"] + [check]
    activity = F.activity_of(window.acceptance)
    verdict, reason = F.cell_verdict(checks, activity, near_tie=near_tie, lossy=m.lossy)
    return CellResult(**base, params=shown, verdict=verdict, reason=reason, checks=checks, activity=activity,
                      requests=feature.sends, tokens=on.n_tokens or 0, notes=cell.notes)


def _deterministic_checks(m: Matrix, feature: F.Feature, params: dict[str, Any], off: F.Answer, on: F.Answer,
                          first: F.Answer | None) -> list[CellCheck]:
    checks = [CellCheck(name="identity", ok=True, detail=f"identical ({on.n_tokens} tokens)")]
    for label, answer in (("spec-on", on), ("spec-off", off)):
        problems = feature.invariant(answer, params, m.max_model_len)
        checks.append(CellCheck(name=f"invariant ({label})", ok=not problems,
                                detail="; ".join(problems) if problems else ""))
    if params.get("logprobs") is not None:
        diffs = F.logprob_differences(off, on, m.settings.near_tie_threshold)
        if off.logprobs is None or on.logprobs is None:
            diffs = [f"no logprobs returned by the {'spec-on' if on.logprobs is None else 'spec-off'} server"]
        checks.append(CellCheck(name="logprobs", ok=not diffs, detail="; ".join(diffs) if diffs else
                                f"{len(on.logprobs or ())} logprobs within {m.settings.near_tie_threshold:g} nats, "
                                "same ranking"))
    if first is not None:
        again = F.divergence(first, on)
        checks.append(CellCheck(name="cache hit", ok=again is None, detail="" if again is None else
                                "the spec-on server's second answer differs from its first: "
                                + F.difference_text(first, on, again)))
    return checks


async def _triage(m: Matrix, feature: F.Feature, prompt, params: dict[str, Any], off: F.Answer, on: F.Answer,
                  div: Divergence) -> tuple[CellCheck, bool]:
    """The identity check of a divergence: a near-tie where the spec-off server's own top logprobs at the
    first differing token put the two tokens within the threshold (analysis/features.py ``identity_check``)."""
    text = F.difference_text(off, on, div)
    tok = div.token_index
    if not feature.raw_logits or tok < 0 or off.token_ids is None or on.token_ids is None \
            or tok >= min(len(off.token_ids), len(on.token_ids)):
        why = ("the server's logprobs are taken before this feature's logits processing" if not feature.raw_logits
               else "no token ids at the divergence")
        return CellCheck(name="identity", ok=False, detail=f"{text} (not triaged: {why})"), False
    prefix_params = {k: v for k, v in params.items() if k not in ("logprobs", "stop", "stop_token_ids")}
    path, body = request_body(prompt, m.off.server.model_id, dict(prefix_params, logprobs=F.TOP_LOGPROBS,
                                                                  **(m.off.requests.sampled_ids or {})),
                              tok + 1, m.off.requests)
    try:
        answer = parse_answer(await m.off.post(path, body))
    except (RequestRefused, ServerError, NotAServer) as exc:
        return CellCheck(name="identity", ok=False, detail=f"{text} (not triaged: {exc})"), False
    tops = answer.top_logprobs or ()
    return F.identity_check(off, on, div, tops[tok] if tok < len(tops) else (), m.settings.near_tie_threshold)


async def distribution_cell(m: Matrix, feature: F.Feature, inputs: Sequence[PromptInput]) -> CellResult:
    from specadapt.analysis.sampling_stats import sampling_verdict  # scipy

    setting = F.Setting.of(feature.sampling)
    s = m.settings
    base = dict(name=feature.name, kind=feature.kind, title=feature.title, params=setting.body())
    problem = F.exactness_problem(setting, s.top_logprobs, s.source)
    if problem:
        return CellResult(**base, verdict="not-exact", reason=problem)
    looks = None
    with counter_window(m.on.server) as window:
        if s.looks is not None:
            samples, stats, looks = await sample_in_looks(m, setting, inputs)
        else:
            samples = await draw_samples(m.on.server, inputs, s.samples, s.seed, s.concurrency, s.request_timeout_s,
                                         requests=m.on.requests, sampling=setting.body())
    if looks is None:
        scored = await score_samples(m.reference or m.off.server, samples, setting, s.top_logprobs, s.concurrency,
                                     s.request_timeout_s, requests=m.off.requests)
        stats = sampling_verdict([d for ds in scored for d in ds], alpha=s.alpha, bins=SAMPLE_BINS, seed=s.seed)
    ok = stats.status == "consistent"
    detail = stats.summary if stats.status != "too-few" else (
        f"too few tokens to decide ({stats.n_tokens} sampled, {stats.min_tokens} needed): raise --samples")
    if stats.zero_probability_tokens:
        detail += f"; {stats.zero_probability_tokens} sampled token(s) outside the setting's support"
    checks = [CellCheck(name="distribution", ok=ok, detail=detail)]
    activity = F.activity_of(window.acceptance)
    verdict, reason = F.cell_verdict(checks, activity, lossy=m.lossy)
    return CellResult(**base, verdict=verdict, reason=reason, checks=checks, activity=activity, stats=stats,
                      requests=len(samples), tokens=sum(len(x.tokens) for x in samples), looks=looks,
                      notes=[f"until decided: {looks.text}"] if looks else [])


async def sample_in_looks(m: Matrix, setting: F.Setting, inputs: Sequence[PromptInput],
                          ) -> tuple[list[Sample], SamplingStats, SamplingLooks]:
    """A distribution cell with --until-decided, in the looks of `equiv --sampling --until-decided`
    (orchestration/sampling.py ``in_looks``): the cell's samples in ``settings.looks`` batches
    (``look_batches``), the test at each look on every sample so far, in the fixed design's order (the
    last look tests its very tokens)."""
    from specadapt.analysis.sampling_stats import sampling_verdict  # scipy

    s = m.settings
    if s.looks is None:
        raise ValueError("sample_in_looks needs settings.looks")

    def draw(batch: list) -> Awaitable[list[Sample]]:
        return draw_samples(m.on.server, inputs, s.samples, s.seed, s.concurrency, s.request_timeout_s,
                            requests=m.on.requests, sampling=setting.body(), planned=batch)

    def score(new: list[Sample]) -> Awaitable[list[list[TokenDraw]]]:
        return score_samples(m.reference or m.off.server, new, setting, s.top_logprobs, s.concurrency,
                             s.request_timeout_s, requests=m.off.requests)

    def verdict(samples: list[Sample], draws: list[list[TokenDraw]], alpha: float) -> SamplingStats:
        _, ordered = by_index(samples, draws)
        return sampling_verdict([d for ds in ordered for d in ds], alpha=alpha, bins=SAMPLE_BINS, seed=s.seed)

    samples, _, stats, looks = await in_looks(look_batches(inputs, s.samples, s.seed, s.looks), s.alpha, draw,
                                              score, verdict)
    return samples, stats, looks


async def seed_cell(m: Matrix, feature: F.Feature, prompt_ids: Sequence[int]) -> CellResult:
    """The same seed twice (one after the other, nothing else in flight) and three other seeds."""
    setting = F.Setting.of(feature.sampling)
    seed = m.settings.seed
    params = dict(setting.body(), ignore_eos=True)
    base = dict(name=feature.name, kind=feature.kind, title=feature.title, params=dict(params, seed=seed))
    with counter_window(m.on.server) as window:
        texts = []
        for s in (seed, seed, seed + 1, seed + 2, seed + 3):
            path, body = request_body(list(prompt_ids), m.on.server.model_id, dict(params, seed=s),
                                      m.settings.max_tokens, m.on.requests)
            texts.append(parse_answer(await m.on.post(path, body)).text)
    same = texts[0] == texts[1]
    varied = len(set(texts[1:])) > 1
    twice = "the same text" if same else f"different texts ({texts[0][:30]!r} vs {texts[1][:30]!r})"
    four = "texts differ" if varied else "all four texts are the same: the seed is not used"
    checks = [CellCheck(name="same seed", ok=same, detail=f"seed {seed} twice: {twice}"),
              CellCheck(name="seed honoured", ok=varied, detail=f"seeds {seed + 1}..{seed + 3} and {seed}: {four}")]
    activity = F.activity_of(window.acceptance)
    verdict, reason = F.cell_verdict(checks, activity, lossy=m.lossy)
    return CellResult(**base, verdict=verdict, reason=reason, checks=checks, activity=activity, requests=5,
                      notes=["the requests were sent one at a time: a batching engine may give a seeded request "
                             "other text when other requests share its batch"])


async def run_cell(m: Matrix, feature: F.Feature, inputs: Sequence[PromptInput]) -> CellResult:
    """One cell, timed; a 4xx from either side is "unsupported", a server error is "error"."""
    t0 = time.monotonic()
    cell = await _cell(m, feature, inputs)
    cell.seconds = round(time.monotonic() - t0, 3)
    return cell


async def _cell(m: Matrix, feature: F.Feature, inputs: Sequence[PromptInput]) -> CellResult:
    try:
        if feature.kind == "deterministic":
            return await deterministic_cell(m, feature)
        if feature.kind == "distribution":
            return await distribution_cell(m, feature, inputs)
        return await seed_cell(m, feature, inputs[0].ids)
    except ServerUnreachable:
        raise  # not this cell's verdict: the run stops (check_features)
    except RequestRefused as exc:
        return CellResult(name=feature.name, kind=feature.kind, title=feature.title, params=dict(feature.params),
                          verdict="unsupported", reason=str(exc))
    except (ServerError, NotAServer, UsageError) as exc:
        return CellResult(name=feature.name, kind=feature.kind, title=feature.title, params=dict(feature.params),
                          verdict="error", reason=str(exc))


def lossy_of(info: ServerInfo) -> str | None:
    """Why the spec-on side is lossy by design (analysis/lossy.py), every setting found; None: it is not."""
    return "; ".join(lossy_reasons_of(info)) or None


async def _inputs(m: Matrix, texts: Sequence[str]) -> list[PromptInput]:
    """The distribution prompts as ids: by the reference's tokenizer, else the spec-off server's /tokenize."""
    out = []
    for i, text in enumerate(texts):
        prompt = Prompt(id=f"p{i}", category="features", prompt=text)
        ids = m.reference.tokenize(prompt) if m.reference else await tokenize(m.off, text)
        out.append(PromptInput(prompt=prompt, ids=tuple(ids),
                               max_tokens=m.settings.sample_tokens))
    return out


def check_features(plan: ServerPlan, settings: FeatureSettings, reference: ReferenceTarget | None = None,
                   bars: ProgressBars = no_bars, messages: Messages = LOGGED) -> FeatureReport:
    """The whole matrix on the servers of ``plan`` (a spec-off and a spec-on side); every server started
    here is stopped when this returns or raises. Ctrl-C keeps the cells finished so far (partial report)."""
    labels = [s.label for s in plan.sides]
    if sorted(labels) != ["spec-off", "spec-on"]:
        raise ValueError(f"check_features needs a spec-off and a spec-on side, not {labels}")
    features = [F.BY_NAME[name] for name in settings.features]
    with open_servers(plan, messages) as opened:
        by = dict(zip(labels, opened, strict=True))
        on, off = by["spec-on"], by["spec-off"]
        on_info, off_info = on.describe(), off.describe()
        if settings.near_tie_threshold is None:
            settings = settings.model_copy(update={"near_tie_threshold": default_threshold(off_info.dtype)})
        report = FeatureReport(settings=settings, on_server=on_info, baseline_server=off_info,
                               lossy=lossy_of(on_info), gate={"passed": False})
        report.notes += side_notes(off_info, on_info, no_counters="every cell's activity is unknown",
                                   differences=False)
        progress = bars("cells", len(features))
        try:
            run_loop(_run_all(plan, on, off, settings, reference, report, features, progress))
        except KeyboardInterrupt:
            report.partial, report.stopped = True, "interrupted (Ctrl-C)"
        report.gate = F.feature_gate([(c.name, c.verdict) for c in report.cells], settings.require_active)
        return report


async def _run_all(plan: ServerPlan, on: Server, off: Server, settings: FeatureSettings,
                   reference: ReferenceTarget | None, report: FeatureReport, features: list[F.Feature],
                   progress) -> None:
    requests = plan.backend.token_requests
    async with Wire.for_server(on, timeout_s=settings.request_timeout_s, concurrency=settings.concurrency) as on_wire, \
            Wire.for_server(off, timeout_s=settings.request_timeout_s, concurrency=settings.concurrency) as off_wire:
        m = Matrix(on=Endpoint("spec-on", on, on_wire, requests), off=Endpoint("spec-off", off, off_wire, requests),
                   settings=settings, reference=reference, lossy=report.lossy,
                   max_model_len=report.on_server.max_model_len or report.baseline_server.max_model_len)
        inputs = await _inputs(m, F.DISTRIBUTION_PROMPTS) if any(f.kind != "deterministic" for f in features) else []
        for feature in features:
            try:
                cell = await run_cell(m, feature, inputs)
            except ServerUnreachable as exc:  # the server went away (a feature may have killed it): stop here
                report.partial, report.stopped = True, f"{exc}; {feature.name} and the cells after it did not run"
                report.cells.append(CellResult(name=feature.name, kind=feature.kind, title=feature.title,
                                               params=dict(feature.params), verdict="error", reason=str(exc)))
                return
            report.cells.append(cell)
            progress(finished(feature.name, feature.kind, cell.tokens, cell.verdict, None))

"""Canaries: golden answers recorded from the spec-off server at staging, and canary rounds that
hold a production server's answers against them (the verdicts: analysis/canary.py).

Every canary request is one greedy, non-streamed request with the top 5 logprobs and the
backend's identity keys (vLLM: token ids), and it is labelled, so that the server's logs and
any gateway can tell it from user traffic: the header ``X-Specadapt-Canary: 1`` and the
OpenAI ``user`` field ``"specadapt-canary"`` (vLLM takes ``user`` in completion and chat
requests and ignores it; servers that copy its API do the same).

A round is gentle on a production server: at most ``max_prompts`` requests, one at a time,
at least ``min_gap_s`` apart. It never raises: a request that fails or times out, or a server
that is not the golden's target, is a result with verdict ``error`` and the reason.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from specadapt.adapters.base import Server
from specadapt.analysis.canary import canary_max_tokens, canary_round, golden_mismatch, judge, spec_on_refusal
from specadapt.analysis.identity import TOP_LOGPROBS, choice_logprobs, default_threshold
from specadapt.errors import NotAServer, ServerError, ServerUnreachable, UsageError
from specadapt.load.client import complete_body
from specadapt.orchestration.compare import side_settings
from specadapt.records import (
    CanaryResult,
    CanaryRound,
    GoldenAnswer,
    GoldenFile,
    Prompt,
    RequestRecord,
    RequestSettings,
    ServerInfo,
)
from specadapt.wire.http import Wire, fault_kind
from specadapt.wire.openai import first_choice

CANARY_HEADER = "X-Specadapt-Canary"
CANARY_USER = "specadapt-canary"
"""The labels of every canary request: this header (value "1") and the OpenAI ``user`` field."""
MAX_TOKENS = 64
MAX_PROMPTS = 4
MIN_GAP_S = 1.0
TIMEOUT_S = 60.0


def canary_request(prompt: Prompt, model: str, settings: RequestSettings, max_tokens: int) -> tuple[str, dict]:
    """(path, JSON body) of one canary or golden request: ``settings`` as complete_body reads them,
    non-streamed, ``max_tokens`` tokens, labelled with the canary ``user``."""
    path, body = complete_body(prompt, model, settings, max_tokens)
    body["user"] = CANARY_USER
    return path, body


def ask(server: Server, prompt: Prompt, settings: RequestSettings, max_tokens: int,
        timeout_s: float = TIMEOUT_S) -> RequestRecord:
    """One labelled canary request; the answer as a RequestRecord (text, tokens, top logprobs per
    position, finish reason; e2e_ns). Never raises: a failure is ``ok`` False with ``error``."""
    rec = RequestRecord(prompt_id=prompt.id, category=prompt.category, api=prompt.api, side="on")
    path, body = canary_request(prompt, server.model_id, settings, max_tokens)
    t0 = time.perf_counter_ns()
    try:
        with Wire.for_server(server, timeout_s=timeout_s) as wire:
            resp = wire.post(path, body, headers={CANARY_HEADER: "1"})
    except ServerUnreachable as exc:
        return rec.model_copy(update={"error": str(exc), "error_kind": fault_kind(exc)})
    rec.e2e_ns, rec.status_code = time.perf_counter_ns() - t0, resp.status_code
    if resp.status_code != 200:
        rec.error, rec.error_kind = f"HTTP {resp.status_code}: {resp.text.strip()[:200]}", "http_status"
        return rec
    try:
        choice = first_choice(resp.json())
        tokens, tops = choice_logprobs(choice, prompt.api)
        text = (choice["message"]["content"] if prompt.api == "chat" else choice["text"]) or ""
    except (ValueError, KeyError, IndexError, TypeError, AttributeError, NotAServer) as exc:
        rec.error, rec.error_kind = f"the answer is not an OpenAI completion ({type(exc).__name__}: {exc})", "malformed"
        return rec
    return rec.model_copy(update={"ok": True, "text": text, "tokens": tokens, "top_logprobs": tops,
                                  "output_tokens": len(tokens), "finish_reason": choice.get("finish_reason")})


def golden_settings(server: Server, settings: RequestSettings | None = None) -> RequestSettings:
    """How golden answers (and later their canaries) are asked: ``settings`` made greedy with the
    top 5 logprobs, the server's identity keys (vLLM: token ids) merged in."""
    greedy = (settings or RequestSettings()).model_copy(
        update={"temperature": 0.0, "logprobs": True, "top_logprobs": TOP_LOGPROBS})
    return side_settings(server, greedy)


def record_golden(server: Server, prompts: Sequence[Prompt], max_tokens: int = MAX_TOKENS,
                  settings: RequestSettings | None = None, *, dtype: str | None = None,
                  near_tie_threshold: float | None = None, allow_spec_on: bool = False,
                  timeout_s: float = 120.0, info: ServerInfo | None = None) -> GoldenFile:
    """Golden answers from ``server`` (the spec-off server at staging): each prompt once,
    greedy, with its top logprobs. ``max_tokens`` per answer unless the prompt sets its own.
    ``dtype`` is recorded when the server does not say its own (it picks the near-tie
    threshold, unless ``near_tie_threshold`` is given). UsageError when the server runs
    speculative decoding (unless ``allow_spec_on``) or a prompt is a multi-turn conversation;
    ServerError when a request fails or the server gives no logprobs."""
    for p in prompts:
        if p.turns:
            raise UsageError(f"prompt {p.id} is a multi-turn conversation: a canary is one request; give "
                             "single-turn prompts")
    if not prompts:
        raise UsageError("no prompts to record")
    info = info or server.describe()
    refusal = spec_on_refusal(info)
    if refusal and not allow_spec_on:
        raise UsageError(refusal)
    req = golden_settings(server, settings)
    answers = []
    for p in prompts:
        n = p.max_tokens or max_tokens
        rec = ask(server, p, req, n, timeout_s)
        if not rec.ok:
            raise ServerError(f"prompt {p.id}: {rec.error}")
        if not rec.tokens or len(rec.top_logprobs) < len(rec.tokens) or not all(rec.top_logprobs[:len(rec.tokens)]):
            raise ServerError(f"{server.base_url} gave no logprobs for prompt {p.id}: golden answers need the top "
                              f"{TOP_LOGPROBS} logprobs at every position (pick the matching --backend)")
        answers.append(GoldenAnswer(prompt_id=p.id, prompt=p, api=p.api, max_tokens=n, text=rec.text,
                                    tokens=rec.tokens, top_logprobs=rec.top_logprobs[:len(rec.tokens)],
                                    finish_reason=rec.finish_reason))
    dtype = info.dtype or dtype
    threshold = near_tie_threshold if near_tie_threshold is not None else default_threshold(dtype)
    return GoldenFile(server=info, dtype=dtype, near_tie_threshold=threshold, settings=req,
                      spec_on_allowed=bool(refusal), answers=answers)


def check_golden(server: Server, golden: GoldenFile, info: ServerInfo | None = None) -> ServerInfo:
    """UsageError when ``golden`` is not of ``server``'s target (another model, max_model_len or
    dtype); else the server's ServerInfo (for a watcher to check once, at start)."""
    info = info or server.describe()
    reasons = golden_mismatch(golden, info)
    if reasons:
        raise UsageError(f"the golden answers cannot judge {server.base_url}: {'; '.join(reasons)}; record golden "
                         "answers from this target's spec-off server")
    return info


def canary_answers(golden: GoldenFile, max_prompts: int = MAX_PROMPTS, round_index: int = 0) -> list[GoldenAnswer]:
    """The golden answers round ``round_index`` sends: ``max_prompts`` of them, the next ones
    each round (round robin over the golden file)."""
    n = len(golden.answers)
    k = min(max(max_prompts, 0), n)
    start = (round_index * k) % n if n else 0
    return [golden.answers[(start + j) % n] for j in range(k)]


def run_canary_round(server: Server, golden: GoldenFile, threshold: float | None = None,
                     timeout_s: float = TIMEOUT_S, now: Callable[[], float] = time.time, *,
                     max_prompts: int = MAX_PROMPTS, min_gap_s: float = MIN_GAP_S, round_index: int = 0,
                     max_tokens: int | None = None, info: ServerInfo | None = None,
                     sleep: Callable[[float], None] = time.sleep,
                     clock: Callable[[], float] = time.monotonic) -> CanaryRound:
    """One canary round against ``server``: ``canary_answers(golden, max_prompts, round_index)``
    asked one at a time, sends at least ``min_gap_s`` apart, each judged against its golden
    answer (``threshold``: nats, default the golden's). ``info``: the server's ServerInfo when
    the caller has it (else the round describes the server, and a server that is not the
    golden's target makes every result an error). ``now``: wall clock (Unix seconds) for the
    round's times; ``sleep``/``clock`` pace the requests. Never raises."""
    started = now()
    answers = canary_answers(golden, max_prompts, round_index)
    try:
        reasons = golden_mismatch(golden, info or server.describe())
    except Exception as exc:  # noqa: BLE001 - a watcher's round must survive whatever the server does
        reasons = [f"could not ask the server what it serves ({exc})"]
    if reasons:
        why = "; ".join(reasons)
        return canary_round(server.base_url, started, now(),
                            [CanaryResult(prompt_id=a.prompt_id, verdict="error", error=why) for a in answers])
    limit = golden.near_tie_threshold if threshold is None else threshold
    settings = side_settings(server, golden.settings)
    results: list[CanaryResult] = []
    notes: list[str] = []
    last: float | None = None
    for a in answers:
        if last is not None and (wait := min_gap_s - (clock() - last)) > 0:
            sleep(wait)
        n, note = canary_max_tokens(a, max_tokens)
        if note and note not in notes:
            notes.append(note)
        last = clock()
        try:
            result = judge(a, ask(server, a.prompt, settings, n, timeout_s), limit)
        except Exception as exc:  # noqa: BLE001 - one bad answer is an error result, never the watcher's end
            result = CanaryResult(prompt_id=a.prompt_id, verdict="error", error=f"{type(exc).__name__}: {exc}")
        results.append(result)
    return canary_round(server.base_url, started, now(), results, notes)

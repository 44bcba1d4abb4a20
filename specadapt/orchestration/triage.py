"""Triage of a divergence by asking a server: the spec-off server's top logprobs at the position
(its verdict: analysis/identity.py), the spec-on answer scored on its own path from there
(``path_triage``), and token ids made readable through its /detokenize."""

from __future__ import annotations

from collections.abc import Sequence

from specadapt.adapters.base import Server, TokenRequests
from specadapt.analysis.identity import TOP_LOGPROBS, path_verdict, token_id, triage_from_logprobs
from specadapt.errors import SpecadaptError
from specadapt.load.client import complete_body
from specadapt.orchestration.sampling import Sample, parse_scores, score_body
from specadapt.records import Divergence, Prompt, RequestRecord, RequestSettings, Triage
from specadapt.wire.http import Wire
from specadapt.wire.openai import detokenize_body, first_choice, parse_detokenize, parse_tokenize, tokenize_body

DETOKENIZE_TIMEOUT_S = 10.0
MAX_IDS = 4096
"""Distinct token ids ``token_texts`` reads back at most in one call (with its cache, for one report)."""


def _triage_body(prompt: Prompt, model: str, settings: RequestSettings, n_tokens: int) -> tuple[str, dict]:
    req = settings.model_copy(update={"logprobs": True, "top_logprobs": TOP_LOGPROBS})
    return complete_body(prompt, model, req, n_tokens)


def server_triage(server: Server, prompt: Prompt, settings: RequestSettings, div: Divergence,
                  off_tokens: list[str], threshold: float, timeout_s: float = 120.0) -> Triage:
    """Ask the spec-off server for its top logprobs at the divergence and classify."""
    if div.token_index < 0:
        return Triage(verdict="unknown", source="none", threshold=threshold,
                      note="the servers returned no tokens (no logprobs), so no position to triage")
    i = div.token_index
    path, body = _triage_body(prompt, server.model_id, settings, i + 1)
    try:
        with Wire.for_server(server, timeout_s=timeout_s) as wire:
            choice = first_choice(wire.post_json(path, body), "the spec-off server")
    except SpecadaptError as exc:  # no answer, a refusal or failure, not JSON, no choice
        return Triage(verdict="unknown", source="none", threshold=threshold,
                      note=f"could not get logprobs from the spec-off server: {exc}")
    return triage_from_logprobs(choice, prompt.api, div, off_tokens, threshold)


def readable_tokens(server: Server, divergences: list[Divergence]) -> None:
    """Replace "token_id:N" in divergences by the token's text, via the server's POST /detokenize
    (vLLM); left as ids where the server cannot say."""
    for d in divergences:
        d.off_token = readable_token(server, d.off_token)
        d.on_token = readable_token(server, d.on_token)


def readable_token(server: Server, token: str | None) -> str | None:
    """"token_id:N" -> "text (id N)" when the server can detokenize N; anything else unchanged."""
    tid = token_id(token or "")
    texts = token_texts(server, [token]) if tid is not None else None
    return f"{texts[0]} (id {tid})" if texts is not None else token


def token_texts(server: Server, tokens: Sequence[str], known: dict[int, str] | None = None) -> list[str] | None:
    """The text of each token, ``tokens`` being "token_id:N" strings; None when a token is not an id or
    the server cannot detokenize one. ``known``: texts read before (filled in as ids are read)."""
    ids = [token_id(t) for t in tokens]
    if not ids or any(i is None for i in ids):
        return None
    cache = known if known is not None else {}
    try:
        with Wire.for_server(server, timeout_s=DETOKENIZE_TIMEOUT_S) as wire:
            for i in dict.fromkeys(ids):
                if i not in cache:
                    if len(cache) >= MAX_IDS:
                        return None
                    text = parse_detokenize(wire.post_json("/detokenize", detokenize_body(server.model_id, [i])))
                    if text is None:
                        return None
                    cache[i] = text
    except SpecadaptError:
        return None
    return [cache[i] for i in ids]


def path_triage(server: Server, prompt: Prompt, on_rec: RequestRecord, div: Divergence, base: Triage | None,
                threshold: float, requests: TokenRequests, timeout_s: float = 120.0) -> Triage | None:
    """Every token of the spec-on answer from the divergence on, judged on the answer's own prefix.

    A greedy answer is, token by token, the target's top choice given what came before it, up to
    near-ties; a dropped or garbled token breaks that at its position even where the first
    differing token looks like a near-tie. The spec-off server scores prompt + the spec-on tokens
    (``prompt_logprobs``, the top ``TOP_LOGPROBS`` and the token at each position); the margin at
    position j is logp(top token) - logp(spec-on token j), and the largest one from the
    divergence on decides (analysis/identity.py ``path_verdict``). ``base``: the triage so far,
    returned with the path's figures and verdict folded in (None where nothing could be checked
    and there was no triage)."""
    base = base or Triage(verdict="unknown", source="none", threshold=threshold)
    ids = [token_id(t) for t in on_rec.tokens]
    why = None
    if requests.prompt_logprobs is None:
        why = "the spec-off server gives no prompt logprobs"
    elif div.token_index < 0 or not ids or None in ids:
        why = "the spec-on answer carries no token ids"
    elif div.token_index >= len(ids):
        why = "the spec-on answer ends at the divergence"
    if why is not None:
        return base.model_copy(update={"note": _joined(base.note, f"rest of the spec-on answer not checked: {why}")})
    try:
        with Wire.for_server(server, timeout_s=timeout_s) as wire:
            prompt_ids = parse_tokenize(wire.post_json("/tokenize", tokenize_body(prompt, server.model_id)))
            sample = Sample(prompt_id=prompt.id, index=0, seed=0, prompt_ids=tuple(prompt_ids), tokens=tuple(ids))
            data = wire.post_json("/v1/completions", score_body(sample, server.model_id, TOP_LOGPROBS, requests))
    except SpecadaptError as exc:  # no answer, a refusal or failure, not JSON, no token ids from /tokenize
        return base.model_copy(update={"note": _joined(
            base.note, f"rest of the spec-on answer not checked: the spec-off server could not score it: {exc}")})
    try:
        draws = parse_scores(data, sample, TOP_LOGPROBS)
    except ValueError as exc:
        return base.model_copy(update={"note": _joined(
            base.note, f"rest of the spec-on answer not checked: the spec-off server could not score it "
                       f"({type(exc).__name__})")})
    except SpecadaptError as exc:
        return base.model_copy(update={"note": _joined(
            base.note, f"rest of the spec-on answer not checked: {exc}")})
    margins = [max([*d.top.values(), d.logprob]) - d.logprob for d in draws[div.token_index:]]
    return path_verdict(base, margins, div.token_index, on_rec.tokens, threshold)


def _joined(note: str, more: str) -> str:
    return f"{note}; {more}" if note else more

"""The requests of `equiv --sampling` and of the distribution cells of `equiv --features`, and
their answers (pure: no transport): a sample from the spec-on server, the source's prompt
logprobs of prompt + sample, and what a backend must be able to return for them.

vLLM's shapes: a sample asks ``logprobs: 0`` with the keys the backend declares for sampled ids
(``TokenRequests.sampled_ids``; vLLM: ``return_tokens_as_token_ids``), so the sampled ids come
back as "token_id:N"; the scoring asks ``prompt_logprobs`` K (``TokenRequests.prompt_logprobs``)
for the prompt plus the sampled ids, answered per position as ``{token id: {"logprob", "rank",
"decoded_token"}}`` holding the top K and the token at that position."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from specadapt.adapters.base import TokenRequests
from specadapt.analysis.sampling_check import Sample
from specadapt.analysis.sampling_stats import TokenDraw
from specadapt.errors import NotAServer, UsageError
from specadapt.wire.openai import first_choice

TEMPERATURE = 1.0
TOP_P = 1.0
_TOKEN_ID = re.compile(r"^token_id:(-?\d+)$")
ASKED = TokenRequests()  # what the request builders add when the caller names no backend's declaration


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
                requests: TokenRequests = ASKED, sampling: dict[str, Any] | None = None) -> dict[str, Any]:
    """One sample from the spec-on server: the raw distribution (or the ``sampling`` settings given),
    a seed of its own, no stop at EOS, the sampled ids in the logprobs (the keys
    ``requests.sampled_ids`` declares)."""
    return {"model": model, "prompt": list(ids), "max_tokens": max_tokens, "temperature": TEMPERATURE,
            "top_p": TOP_P, **(sampling or {}), "seed": seed, "ignore_eos": True, "logprobs": 0,
            **(requests.sampled_ids or {}), "stream": False}


def _keys(extras: dict[str, Any] | None) -> str:
    return " and ".join(f"'{k}'" for k in extras or {}) or "its declared keys"


def parse_sample(data: Any, requests: TokenRequests = ASKED) -> tuple[list[int], str | None]:
    """(sampled token ids, finish reason) of a non-streamed completion with token-id logprobs."""
    choice = first_choice(data, "the spec-on server")
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


def score_body(sample: Sample, model: str, k: int, requests: TokenRequests = ASKED) -> dict[str, Any]:
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
    choice = first_choice(data, "the source server")
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


def refuses_k(message: str) -> bool:
    """Whether a 400 is vLLM refusing the number of (prompt) logprobs asked for."""
    low = message.lower()
    return "logprobs" in low and ("max allowed" in low or "max_logprobs" in low or "greater than" in low)

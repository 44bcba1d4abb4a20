"""Output identity of spec-on vs spec-off, the first divergence, and the verdicts of its triage
(orchestration/triage.py asks the servers).

Identity is decided on tokens (the logprobs' token ids when the server gives them, as
vLLM does with ``return_tokens_as_token_ids``), so that a difference cannot hide behind
detokenization; the character position and 40 characters of context come from the texts.

Triage of a divergence at token i (everything after i follows from it, so only the first
divergence of a pair is reported, and a prompt's divergences that share an origin are
reported once):
- server logprobs: the spec-off server is asked the same request for i+1 tokens with its
  top 5 logprobs; margin = logp(off token) - logp(on token) at i. If the on token is not
  in the top 5, the margin is at least logp(off token) - min(top 5) (a lower bound).
- reference (``--reference DIR``): the target is recomputed in float64 on the same prefix
  (prompt ids from the server's /tokenize, then the spec-off tokens before i): the true
  margin, decisive where the server's own logprobs carry its dtype's noise.
- the spec-on answer's own path (``path_verdict``): the spec-off server scores the prompt
  plus the spec-on tokens; at each position from i on, margin = logp(top token) -
  logp(spec-on token) on the spec-on answer's own prefix. A greedy answer is the target's
  choice at every position up to near-ties, so a dropped or garbled token after i (or at i,
  where its first margin looked small) shows as a large margin there: suspect.
- verdict: |margin| below the threshold is a "numerical near-tie" (the server's
  arithmetic can flip it); above it, "suspect".
- under concurrency (``PromptIdentity.concurrency_only``): a prompt whose pairs answered
  alone were identical but whose pairs inside concurrent batches diverged. The default threshold depends on the
  server dtype (see NEAR_TIE_THRESHOLDS and the README for how they were measured).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, Literal

from specadapt.analysis.pairs import sides_by_pair
from specadapt.records import Divergence, Prompt, PromptIdentity, RequestRecord, Triage

CONTEXT_CHARS = 40
TOP_LOGPROBS = 5
# Nats. Measured with benchmarks/near_tie_noise.py (README "Near-tie threshold"): the
# largest change of a top-2 logprob margin between float64 and each dtype, times 2
# (bfloat16 0.375 -> 0.75, float16 0.059 -> 0.12); float32 moved no margin by 1e-4 on the
# CPU, and 0.01 leaves room for GPU kernels and batch shapes.
NEAR_TIE_THRESHOLDS = {"bfloat16": 0.75, "float16": 0.12, "float32": 0.01, "float64": 1e-6}
DEFAULT_THRESHOLD = 0.75  # unknown dtype: assume the noisiest common one (bfloat16)
_VERDICT_RANK = {"identical": 0, "near-tie": 1, "unknown": 2, "suspect": 3}
_TOKEN_ID = re.compile(r"^token_id:(\d+)$")


_DTYPE_ALIASES = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32", "float": "float32",
                  "fp64": "float64", "double": "float64"}


def canonical_dtype(dtype: str) -> str:
    """A dtype by its one name: "bf16" -> "bfloat16", "torch.float16" -> "float16", "FP32" -> "float32"."""
    d = dtype.lower().removeprefix("torch.")
    return _DTYPE_ALIASES.get(d, d)


def default_threshold(dtype: str | None) -> float:
    if dtype is None:
        return DEFAULT_THRESHOLD
    return NEAR_TIE_THRESHOLDS.get(canonical_dtype(dtype), DEFAULT_THRESHOLD)


def token_id(token: str) -> int | None:
    m = _TOKEN_ID.match(token)
    return int(m.group(1)) if m else None


def _common_prefix(a: list[str] | str, b: list[str] | str) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def first_divergence(off: RequestRecord, on: RequestRecord) -> Divergence | None:
    """None when the outputs are identical token for token (and character for character)."""
    if off.tokens and on.tokens:
        i = _common_prefix(off.tokens, on.tokens)
        if i == len(off.tokens) == len(on.tokens) and off.text == on.text:
            return None
        same_tokens_len = len(off.tokens) == len(on.tokens)
        kind = "length" if i == min(len(off.tokens), len(on.tokens)) and not same_tokens_len else "token"
        off_tok = off.tokens[i] if i < len(off.tokens) else None
        on_tok = on.tokens[i] if i < len(on.tokens) else None
    else:  # no logprobs: texts only
        if off.text == on.text:
            return None
        i, kind, off_tok, on_tok = -1, "token", None, None
    j = _common_prefix(off.text, on.text)
    lo = max(0, j - CONTEXT_CHARS)
    return Divergence(prompt_id=off.prompt_id, category=off.category, concurrency=off.concurrency,
                      repeat=off.repeat, replica=off.replica, turn=off.turn, kind=kind, token_index=i, char_index=j,
                      off_token=off_tok, on_token=on_tok, off_context=off.text[lo:j + CONTEXT_CHARS],
                      on_context=on.text[lo:j + CONTEXT_CHARS], off_tokens=len(off.tokens) or off.output_tokens,
                      on_tokens=len(on.tokens) or on.output_tokens)


def triage_from_logprobs(choice: dict[str, Any], api: str, div: Divergence, off_tokens: list[str],
                         threshold: float) -> Triage:
    """The verdict at ``div`` from the spec-off server's answer (``choice``: its first choice, with
    top logprobs over the first token_index + 1 tokens)."""
    i = div.token_index
    tokens, tops = choice_logprobs(choice, api)
    note = ""
    if tokens[:i] != off_tokens[:i]:
        note = "the spec-off server's output changed between runs before this position; "
    top = tops[i] if i < len(tops) else {}
    return triage_at(top, tokens[i] if i < len(tokens) else None, div, threshold, note)


def triage_at(top: dict[str, float], off_token: str | None, div: Divergence, threshold: float, note: str = "",
              source: Literal["server-logprobs", "golden-logprobs"] = "server-logprobs") -> Triage:
    """The verdict at ``div`` from the spec-off top logprobs at its position (``top``, the
    spec-off token's own logprob included; ``off_token``: the spec-off token there when
    ``div.off_token`` is not in ``top``); ``note`` starts the triage's note."""
    if not top:
        return Triage(verdict="unknown", source="none", threshold=threshold,
                      note=note + "the spec-off server gave no logprobs at this position")
    off_tok = div.off_token if div.off_token in top else off_token
    if off_tok is None or div.on_token is None:
        return Triage(verdict="unknown", source=source, threshold=threshold, top_logprobs=top,
                      note=note + "one output ended here (end of sequence): its token's logprob is not known")
    lp_off = top.get(off_tok, max(top.values()))
    if div.on_token in top:
        margin, lower = lp_off - top[div.on_token], False
    else:
        margin, lower = lp_off - min(top.values()), True
    verdict = "suspect" if (lower and margin >= threshold) or (not lower and abs(margin) >= threshold) else "near-tie"
    if lower and margin < threshold:
        verdict = "unknown"
        note += f"the spec-on token is not in the top {TOP_LOGPROBS}, margin only known to be >= {margin:.3f}; "
    return Triage(verdict=verdict, source=source, margin=margin, margin_is_lower_bound=lower,
                  threshold=threshold, server_margin=margin, top_logprobs=top, note=note.rstrip("; "))


def path_verdict(base: Triage, margins: list[float], start: int, on_tokens: list[str], threshold: float) -> Triage:
    """Fold the spec-on answer's own-path margins into a triage. ``margins[j]``: logp(target's top
    token) - logp(spec-on token) at output position start + j, the target scored on the spec-on
    answer's own prefix (exact: the scoring gives the spec-on token's logprob).

    - the largest margin at or above ``threshold``: suspect (that token is not the target's choice
      on its own prefix, whatever the first differing token looked like);
    - else a triage still "unknown" becomes a near-tie: every token from the divergence on is
      within the threshold of the target's top choice, the first of them included;
    - else the verdict stands, with the path's figures added."""
    if not margins:
        return base.model_copy(update={"note": _joined(base.note, "rest of the spec-on answer not checked: "
                                                                  "no token scored")})
    j = max(range(len(margins)), key=margins.__getitem__)
    worst = margins[j]
    update: dict[str, Any] = {"path_checked": len(margins), "path_margin": worst, "path_position": start + j,
                              "path_token": on_tokens[start + j]}
    if worst >= threshold:
        update["verdict"] = "suspect"
        update["note"] = _joined(base.note, f"spec-on token {start + j} is not the target's choice on the spec-on "
                                            f"answer's own prefix (margin {worst:.3f} >= {threshold:g})")
    elif base.verdict == "unknown":
        update.update(verdict="near-tie", margin=margins[0], margin_is_lower_bound=False,
                      note=_joined(base.note, f"all {len(margins)} spec-on tokens from the divergence on are within "
                                              f"{threshold:g} of the target's top choice on their own prefix"))
    if base.source == "none":
        update["source"] = "server-logprobs"
    return base.model_copy(update=update)


def _joined(note: str, more: str) -> str:
    return f"{note}; {more}" if note else more


def choice_logprobs(choice: dict[str, Any], api: str) -> tuple[list[str], list[dict[str, float]]]:
    """(tokens, top logprobs per position) of a non-streamed answer's choice; each position's
    top holds its own token's logprob too."""
    lp = choice.get("logprobs") or {}
    if api == "chat":
        entries = lp.get("content") or []
        tops = []
        for e in entries:
            top = {t["token"]: float(t["logprob"]) for t in (e.get("top_logprobs") or [])}
            top.setdefault(e["token"], float(e["logprob"]))
            tops.append(top)
        return [e["token"] for e in entries], tops
    tokens = list(lp.get("tokens") or [])
    raw = lp.get("top_logprobs") or []
    own = lp.get("token_logprobs") or []
    tops = [{k: float(v) for k, v in (raw[i] or {}).items()} if i < len(raw) else {}
            for i in range(max(len(tokens), len(raw)))]
    for i in range(min(len(tokens), len(own))):
        tops[i].setdefault(tokens[i], float(own[i]))
    return tokens, tops


def _origin_order(d: Divergence) -> tuple[int, int, int, int]:
    """Earliest first: turn, token, then the pair's concurrency and repeat."""
    return d.turn, d.token_index, d.concurrency, d.repeat


def identity_report(records: list[RequestRecord], prompts: list[Prompt],
                    triage: Callable[[Prompt, Divergence, RequestRecord], Triage] | None) -> list[PromptIdentity]:
    """Per prompt: identical pairs, and the origin of divergence with its triage."""
    by_prompt = {p.id: p for p in prompts}
    keyed = sides_by_pair(records)
    diverged_at: dict[tuple, int] = {}  # conversation -> its first diverging turn
    for key, v in keyed.items():
        if "off" in v and "on" in v and first_divergence(v["off"], v["on"]) is not None:
            diverged_at[key[:-1]] = min(diverged_at.get(key[:-1], key[-1]), key[-1])
    out: list[PromptIdentity] = []
    for pid in by_prompt:
        both = [(k, v["off"], v["on"]) for k, v in keyed.items() if k[0] == pid and "off" in v and "on" in v]
        if not both:
            continue
        later = [k for k, *_ in both if k[-1] > diverged_at.get(k[:-1], k[-1])]
        pairs = [(off, on) for k, off, on in both if k not in later]
        divs = [(d, off) for off, on in pairs if (d := first_divergence(off, on)) is not None]
        levels = sorted({off.concurrency for _, off in divs})
        ident = PromptIdentity(prompt_id=pid, category=by_prompt[pid].category, pairs=len(pairs),
                               identical_pairs=len(pairs) - len(divs), verdict="identical",
                               different_history_pairs=len(later), diverged_levels=levels,
                               concurrency_only=bool(levels) and 1 not in levels
                               and any(off.concurrency == 1 for off, _ in pairs))
        if divs:
            origins: dict[tuple, tuple[Divergence, RequestRecord]] = {}
            for d, off in sorted(divs, key=lambda x: _origin_order(x[0])):
                origins.setdefault((d.turn, d.token_index, d.off_token, d.on_token), (d, off))
            worst = None
            for d, off in origins.values():
                d.triage = triage(by_prompt[pid], d, off) if triage else None
                v = d.triage.verdict if d.triage else "unknown"
                if worst is None or _VERDICT_RANK[v] > _VERDICT_RANK[worst[0]]:
                    worst = (v, d)
            ident.verdict, ident.divergence = worst
            ident.same_origin_pairs = sum(1 for d, _ in divs if d.token_index == worst[1].token_index) - 1
        out.append(ident)
    return out

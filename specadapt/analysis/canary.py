"""Canary verdicts: a production server's greedy answer held against its golden answer.

A golden answer (records/canary.py) is the target's own greedy output, recorded at staging
from the spec-off server with its top logprobs at every position. A canary round asks the
production (spec-on) server the same requests, and each answer is judged here:

- identity on tokens, as ``specadapt equiv`` decides it (``first_divergence``: token ids where
  the backend gives them, then the texts);
- at the first divergence, triage from the **golden's own recorded logprobs**
  (``triage_at``, as equiv's triage from the spec-off server), so production needs no
  spec-off server: margin = logp(golden token) - logp(live token) at that position, against
  the near-tie threshold of the golden's dtype (analysis/identity.py).

Verdicts, best to worst (a round's verdict is the worst of its results):

- ``identical``: the same tokens (and text) over the compared length.
- ``near-tie``: diverged where the golden's logprobs put the two tokens within the threshold:
  the server's arithmetic (batch shape, kernels) can flip such a choice; expected in bfloat16.
- ``unknown``: diverged, and the golden's logprobs cannot bound the margin to either side:
  the live token is outside the golden's top 5 and even the most it can weigh leaves the gap
  below the threshold (the golden's position is flat), the golden answer ended where the
  live one went on (no logprobs past the golden's end), or the two texts differ on the same
  tokens (detokenization). **Shown and counted, not paged.** An unknown is by construction a
  position where the golden itself does not show a clear winner, the kind of position that
  numerical noise flips; paging on it would page on noise. The canary pages only when the
  golden proves the gap. An unknown that repeats on the same prompt is worth an
  ``equiv --reference`` run, whose float64 recomputation gives the true margin.
- ``error``: no answer to judge (the request failed, timed out, or the server is not the
  golden's target): the canary could not look; the watcher's other signals say why.
- ``suspect``: the live answer left the golden one where the golden's logprobs show a gap of
  at least the threshold: a greedy answer a correct speculative decoder cannot give. Page.
  A suspect outranks an error: one proved wrong answer is the alarm, whatever else failed.

Bounds where the live token is not in the golden's top 5: its probability is at most the
smallest listed one and at most the mass the top 5 leave over, so the margin is at least
logp(golden) - log(min of the two). Where the live answer ended (end of sequence) while the
golden went on, the end token is the live token: it is either listed (then at most the largest
listed other token) or not (then at most the mass left over), which bounds the margin the
same way.

A shorter live answer that stopped at its length limit (``finish_reason`` "length": asked
with fewer max_tokens than the golden, or cut by the server's context) is compared on its
own length: a prefix of the greedy answer is the greedy answer of the shorter request.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from specadapt.analysis.identity import canonical_dtype, first_divergence, token_id, triage_at
from specadapt.records import (
    CANARY_VERDICTS,
    CanaryResult,
    CanaryRound,
    CanaryVerdict,
    Divergence,
    GoldenAnswer,
    GoldenFile,
    RequestRecord,
    ServerInfo,
    Triage,
)

RANK: dict[str, int] = {v: i for i, v in enumerate(CANARY_VERDICTS)}
"""Verdict -> rank, best (identical, 0) to worst (suspect)."""
PAGED: tuple[CanaryVerdict, ...] = ("suspect",)
"""The verdicts an operator is paged on."""
MASS_FLOOR = 1e-9
"""The least probability mass left over by the top logprobs: noise can make them sum past 1."""


def worst(verdicts: Iterable[CanaryVerdict]) -> CanaryVerdict:
    """The worst of ``verdicts``; ``identical`` when there are none."""
    return max(verdicts, key=RANK.__getitem__, default="identical")


def golden_mismatch(golden: GoldenFile, live: ServerInfo) -> list[str]:
    """Why ``golden`` cannot judge the server ``live`` describes (one sentence each; [] when it
    can): another model, and, where both are known, another max_model_len or dtype."""
    was = golden.server
    reasons = []
    if was.model_id is not None and live.model_id is not None and was.model_id != live.model_id:
        reasons.append(f"the golden answers are of model {was.model_id}, the server serves {live.model_id}")
    if was.max_model_len is not None and live.max_model_len is not None and was.max_model_len != live.max_model_len:
        reasons.append(f"the golden answers were recorded at max_model_len {was.max_model_len}, the server runs "
                       f"{live.max_model_len}")
    if golden.dtype is not None and live.dtype is not None and canonical_dtype(golden.dtype) != canonical_dtype(
            live.dtype):
        reasons.append(f"the golden answers were recorded in {golden.dtype}, the server runs {live.dtype}")
    return reasons


def spec_on_refusal(info: ServerInfo) -> str | None:
    """Why answers of ``info``'s server cannot be golden: it runs speculative decoding (a
    golden answer must be the target's own output); None when it is off or cannot tell."""
    if not info.spec_enabled:
        return None
    how = ", ".join(x for x in (info.spec_method, f"k={info.num_speculative_tokens}" if info.num_speculative_tokens
                                else None) if x)
    return (f"{info.base_url} runs speculative decoding{f' ({how})' if how else ''}: golden answers must be the "
            "target's own output; record them from the spec-off server, or pass --allow-spec-on")


def canary_max_tokens(answer: GoldenAnswer, asked: int | None) -> tuple[int, str | None]:
    """The max_tokens a canary sends for ``answer`` and, when it differs from ``asked``, why:
    the golden's own by default; a smaller ``asked`` is sent (the golden is then compared on
    the live answer's length); a larger one is cut to the golden's (nothing is known past it)."""
    if asked is None or asked == answer.max_tokens:
        return answer.max_tokens, None
    if asked < answer.max_tokens:
        return asked, None
    return answer.max_tokens, (f"max_tokens {asked} is more than the golden answers were recorded with "
                               f"({answer.max_tokens}): asked {answer.max_tokens}")


def judge(golden: GoldenAnswer, live: RequestRecord, threshold: float) -> CanaryResult:
    """One live answer against its golden answer (``live.ok`` False: verdict error)."""
    pid = golden.prompt_id
    if not live.ok:
        return CanaryResult(prompt_id=pid, verdict="error", error=live.error or "the request failed")
    tokens, text, note = golden.tokens, golden.text, ""
    if live.finish_reason == "length" and len(live.tokens) < len(tokens):
        tokens = tokens[:len(live.tokens)]
        text = live.text if golden.text.startswith(live.text) else golden.text
        note = (f"compared on the first {len(tokens)} of the golden's {len(golden.tokens)} tokens: the live answer "
                "stopped at its length limit")
    if tokens and live.tokens and (token_id(tokens[0]) is None) != (token_id(live.tokens[0]) is None):
        return CanaryResult(prompt_id=pid, verdict="error", compared_tokens=len(tokens),
                            error="the golden answer and the server name tokens differently (ids on one side, text "
                                  "on the other): record the golden answers with the same backend")
    # the golden as the spec-off side of the comparison: only its text and tokens are compared
    off = RequestRecord(prompt_id=pid, category=golden.prompt.category, api=golden.api, text=text, tokens=tokens)
    div = first_divergence(off, live)
    if div is None:
        return CanaryResult(prompt_id=pid, verdict="identical", compared_tokens=len(tokens), note=note)
    div.triage = _triage(golden, div, threshold)
    return CanaryResult(prompt_id=pid, verdict=div.triage.verdict, divergence=div, compared_tokens=len(tokens),
                        note=note)


def _triage(golden: GoldenAnswer, div: Divergence, threshold: float) -> Triage:
    i = div.token_index
    if i < 0:
        return Triage(verdict="unknown", source="none", threshold=threshold,
                      note="the answers carry no tokens (no logprobs), so no position to triage")
    if div.off_token is None and div.on_token is None:
        return Triage(verdict="unknown", source="none", threshold=threshold,
                      note="the same tokens, a different text: a detokenization difference")
    if div.off_token is None:
        return Triage(verdict="unknown", source="none", threshold=threshold,
                      note="the golden answer ended here and the live one went on: the golden has no logprobs past "
                           "its end")
    top = golden.top_logprobs[i] if i < len(golden.top_logprobs) else {}
    triage = triage_at(top, div.off_token, div, threshold, source="golden-logprobs")
    if div.off_token not in top or div.on_token in top:
        return triage
    # the live token is unlisted, or the live answer ended here: bound it by what the top 5 leave
    lp_golden = top[div.off_token]
    left = max(1.0 - sum(math.exp(v) for v in top.values()), MASS_FLOOR)
    others = [math.exp(v) for t, v in top.items() if t != div.off_token]
    if div.on_token is None:  # the end token: listed (at most the largest other) or not (at most what is left)
        ceiling = max([left, *others])
        what = "the live answer ended here"
    else:
        ceiling = min([left, *others])
        what = f"the live token is not in the golden's top {len(top)}"
    margin = lp_golden - math.log(ceiling)
    verdict = "suspect" if margin >= threshold else "unknown"
    return triage.model_copy(update={
        "verdict": verdict, "margin": margin, "margin_is_lower_bound": True, "server_margin": margin,
        "note": f"{what}; from the golden's logprobs the margin is at least {margin:.3f}"})


def canary_round(server: str, started_at: float, finished_at: float, results: list[CanaryResult],
                 notes: list[str] | None = None) -> CanaryRound:
    """A round from its results: the worst verdict, and the count of every verdict."""
    counts = {v: sum(r.verdict == v for r in results) for v in CANARY_VERDICTS}
    return CanaryRound(server=server, started_at=started_at, finished_at=finished_at,
                       verdict=worst(r.verdict for r in results), results=results, counts=counts,
                       notes=list(notes or []))


def round_summary(r: CanaryRound) -> str:
    """One line for a round: its verdict, the counts, and the worst result's prompt and reason."""
    counts = ", ".join(f"{n} {v}" for v, n in r.counts.items() if n)
    line = f"canary {r.verdict}" + (f" ({counts})" if counts else " (no prompts)")
    bad = max(r.results, key=lambda x: RANK[x.verdict], default=None)
    if bad is None or bad.verdict == "identical":
        return line
    if bad.error:
        return f"{line}: {bad.prompt_id}: {bad.error}"
    d = bad.divergence
    if d is None:
        return f"{line}: {bad.prompt_id}"
    margin = d.triage.margin if d.triage else None
    how = f", margin {'>= ' if d.triage.margin_is_lower_bound else ''}{margin:.3f} nats" if margin is not None else ""
    return f"{line}: {bad.prompt_id} at token {d.token_index}: {d.on_token!r} where the golden has {d.off_token!r}{how}"

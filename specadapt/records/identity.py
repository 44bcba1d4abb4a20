"""Output identity of spec-on vs spec-off pairs: divergences, their triage, per-prompt verdicts."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

Verdict = Literal["identical", "near-tie", "suspect", "unknown"]


class Triage(BaseModel):
    verdict: Literal["near-tie", "suspect", "unknown"]
    source: Literal["server-logprobs", "golden-logprobs", "reference-float64", "none"] = Field(
        description="server-logprobs: the spec-off server asked at the divergence; golden-logprobs: the logprobs "
                    "recorded with a canary's golden answer; reference-float64: the target recomputed in float64.")
    margin: float | None = Field(None, description="logp(off token) - logp(on token), nats, at the divergence.")
    margin_is_lower_bound: bool = Field(False, description="The on token was not in the top logprobs.")
    threshold: float
    server_margin: float | None = None
    reference_margin: float | None = None
    top_logprobs: dict[str, float] = Field(default_factory=dict, description="Spec-off server's top logprobs there "
                                                                             "(a canary: the golden answer's).")
    note: str = ""
    path_checked: int = Field(0, description="Tokens of the spec-on answer, from the divergence on, scored by the "
                                             "spec-off server on the spec-on answer's own prefix (0: not checked).")
    path_margin: float | None = Field(None, description="The largest of those margins, logp(target's top token) - "
                                                        "logp(spec-on token), nats; a lower bound where that token "
                                                        "was not among the scored top tokens.")
    path_position: int | None = Field(None, description="The output token index of that largest margin.")
    path_token: str | None = Field(None, description="The spec-on token there.")


class Divergence(BaseModel):
    """The first place where spec-on output left spec-off output, for one pair."""

    prompt_id: str
    category: str
    concurrency: int
    repeat: int
    replica: int = 0
    turn: int = Field(0, description="Multi-turn conversations: the turn whose outputs diverge.")
    kind: Literal["token", "length"] = Field(description="token: different token; length: one output ended first.")
    token_index: int
    char_index: int
    off_token: str | None
    on_token: str | None
    off_context: str
    on_context: str
    off_tokens: int
    on_tokens: int
    triage: Triage | None = None


class PromptIdentity(BaseModel):
    prompt_id: str
    category: str
    pairs: int
    identical_pairs: int
    verdict: Verdict
    divergence: Divergence | None = Field(None, description="The origin: the earliest first-divergence seen.")
    same_origin_pairs: int = Field(0, description="Other pairs diverging at the same token: reported once.")
    different_history_pairs: int = Field(0, description="Multi-turn: pairs of a later turn after an earlier turn "
                                                        "diverged; the two sides' histories differ, so their "
                                                        "differences are not verdicts of their own.")
    diverged_levels: list[int] = Field(default_factory=list, description="Concurrency levels (0: arrival rates) "
                                                                         "at which a pair of this prompt diverged.")
    concurrency_only: bool = Field(False, description="Diverged only inside concurrent batches: every pair "
                                                      "answered alone (concurrency 1) was identical.")


SpecSource = Literal["response", "chunks", "none"]


class PromptActivity(BaseModel):
    """What the spec-on server drafted and accepted on one prompt's compared answers."""

    prompt_id: str
    category: str
    requests: int = Field(description="Spec-on answers of this prompt that were compared.")
    output_tokens: int
    drafted: int | None = Field(None, description="Draft tokens proposed (per-request data only).")
    accepted: int | None = Field(None, description="Accepted draft tokens; None where not known.")
    exercised: bool | None = Field(None, description="At least one draft token was accepted in its answers: "
                                                     "speculation took part in the text that was compared. "
                                                     "None: not known.")


class SpecActivity(BaseModel):
    """Did speculation run on the spec-on server, and on which prompts (analysis/activity.py)."""

    ran: bool | None = Field(description="True: drafts were proposed during the run; False: none were (or the "
                                          "server says speculation is off); None: nothing could tell.")
    evidence: str = Field(description="What showed it, in one sentence.")
    drafted: float | None = Field(None, description="Draft tokens over the compared levels (counters, else the "
                                                    "per-request sums).")
    accepted: float | None = None
    source: SpecSource = Field("none", description="Where the per-prompt figures come from: response (the "
                                                   "answers' own counts), chunks (one engine step per streamed "
                                                   "chunk: accepted = tokens - chunks), none.")
    source_note: str = Field("", description="Why that source, and how it was checked (or why none holds).")
    prompts: list[PromptActivity] = Field(default_factory=list)
    exercised_prompts: int = 0
    output_tokens: int = Field(0, description="Output tokens of the compared spec-on answers.")
    accepted_output_tokens: int | None = Field(None, description="Of those, tokens that came from accepted drafts.")

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

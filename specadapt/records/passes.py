"""Speculation seen per request and per pass of the target (analysis/passes.py computes them).

A pass of the target is one forward of the big model over a request: it checks the draft tokens
proposed for it, keeps the longest agreeing run (the accepted draft tokens) and adds one token
of its own. A pass therefore produces accepted + 1 tokens; the request's first pass (the
prefill) produces one token and checks no draft.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

PassSource = Literal["chunks+response", "chunks", "response", "none"]
"""Where a request's figures come from: ``chunks+response`` (the passes from the streamed chunks,
one engine step each, checked against the answer's own counts), ``chunks`` (the passes from the
chunks, checked against the server's counters), ``response`` (the answer's own counts only: no
pass order), ``none``."""


class RequestPasses(BaseModel):
    """What speculation did in one answer."""

    model_config = ConfigDict(ser_json_inf_nan="strings")

    index: int = Field(description="The request's place in the report's ``requests``.")
    prompt_id: str
    category: str
    repeat: int = 0
    concurrency: int = 1
    request_rate: float | None = None
    source: PassSource
    passes: list[int] | None = Field(None, description="Tokens each pass of the target produced (accepted draft "
                                                       "tokens + its own), in answer order, the first pass (the "
                                                       "prefill) first; None: the order is not known.")
    drafted_per_pass: list[int | None] | None = Field(None, description="Draft tokens each pass checked, where "
                                                                        "known (None for a pass where not).")
    output_tokens: int
    accepted: int = Field(description="Accepted draft tokens (the answer's own count where it gives one: it "
                                      "counts tokens a length or stop limit then cut; else the passes' sum).")
    drafted: int | None = Field(None, description="Draft tokens proposed; None: not known.")
    spec_steps: int | None = Field(None, description="Passes that checked a draft; None: not known.")
    texts: list[str] | None = Field(None, exclude_if=lambda v: v is None, description=(
        "The text of each output token, where the answer's own token strings are token ids (identity runs ask "
        "vLLM for ids): read back from the server for the answers a report draws; None otherwise."))

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    @property
    def tokens_per_pass(self) -> float | None:
        return self.output_tokens / len(self.passes) if self.passes else None

    @property
    def acceptance_length(self) -> float | None:
        """1 + accepted / passes that checked a draft (vLLM's mean acceptance length)."""
        return 1.0 + self.accepted / self.spec_steps if self.spec_steps else None


class PassFigures(BaseModel):
    """Speculation over a group of answers (one prompt, one category, or all)."""

    name: str
    requests: int
    output_tokens: int
    accepted: int
    drafted: int | None = None
    passes: int | None = Field(None, description="Passes of the target over answers whose passes are known.")
    passes_tokens: int | None = Field(None, description="Output tokens of those answers.")
    acceptance_rate: float | None = Field(None, description="accepted / drafted over the group.")
    tokens_per_pass: float | None = Field(None, description="passes_tokens / passes.")
    tokens_per_pass_pct: dict[str, float] = Field(default_factory=dict,
                                                  description="Across answers: p10, p50, p90 of tokens per pass.")
    acceptance_rate_pct: dict[str, float] = Field(default_factory=dict,
                                                  description="Across answers: p10, p50, p90 of acceptance rate.")
    tokens_histogram: list[int] = Field(default_factory=list, description="Index i: passes that produced i + 1 "
                                                                          "tokens (passes known only).")


class PositionBin(BaseModel):
    """Acceptance by position in the answer: of the tokens at positions [start, end), how many came
    from accepted draft tokens."""

    start: int
    end: int
    tokens: int
    from_draft: int

    @property
    def share(self) -> float:
        return self.from_draft / self.tokens if self.tokens else 0.0


class CounterCheck(BaseModel):
    """The per-request sums against the server's counter deltas over the same requests."""

    model_config = ConfigDict(ser_json_inf_nan="strings")

    level: str = Field(description="The requests compared: 'concurrency 1', 'request rate 2/s', 'the run'.")
    requests: int
    accepted_requests: int
    accepted_counters: float
    drafted_requests: int | None = None
    drafted_counters: float | None = None
    agree: bool
    text: str


class SpeculationSeen(BaseModel):
    """Speculation per request and per pass: the section of probe and compare reports (compare:
    the spec-on side's answers)."""

    available: bool
    source: PassSource = "none"
    source_note: str = Field("", description="Which source, why, and how it was checked; or why none holds "
                                             "('per-request acceptance not available: ...').")
    k: int | None = Field(None, description="The draft length (num_speculative_tokens), where known.")
    requests: list[RequestPasses] = Field(default_factory=list)
    overall: PassFigures | None = None
    prompts: list[PassFigures] = Field(default_factory=list)
    categories: list[PassFigures] = Field(default_factory=list)
    positions: list[PositionBin] = Field(default_factory=list)
    checks: list[CounterCheck] = Field(default_factory=list)
    findings: list[str] = Field(default_factory=list, description="Disagreements between the server's counts, "
                                                                  "said as findings about the server.")
    shown: list[int] = Field(default_factory=list, description="Indices into ``requests`` of the answers drawn "
                                                               "pass by pass (--show N; the demo's).")

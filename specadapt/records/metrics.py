"""Summaries computed from request records and counters: latency, acceptance, ratio intervals.

The formulas live beside the code that computes them (probes.latency, probes.acceptance,
probes.stats); these are the results as every layer above sees them.
"""

from __future__ import annotations

from pydantic import BaseModel, Field


class Distribution(BaseModel):
    """Summary of one metric in milliseconds; all None when there are no values."""

    count: int = 0
    mean: float | None = None
    p50: float | None = None
    p90: float | None = None
    p99: float | None = None
    min: float | None = None
    max: float | None = None


class LatencySummary(BaseModel):
    requests: int
    succeeded: int
    failed: int
    output_tokens: int
    duration_s: float
    output_tokens_per_s: float | None
    ttft_ms: Distribution
    itl_ms: Distribution
    tpot_ms: Distribution
    e2e_ms: Distribution
    tokens_per_chunk_mean: float | None


class AcceptanceSummary(BaseModel):
    known: bool
    reason: str | None = Field(None, description="Why the figures are unknown, when they are.")
    drafts: float | None = None
    draft_tokens: float | None = None
    accepted_tokens: float | None = None
    acceptance_rate: float | None = None
    mean_acceptance_length: float | None = None
    per_position_rate: list[float] = Field(default_factory=list)
    per_position_conditional: list[float | None] = Field(default_factory=list)
    generation_tokens: float | None = Field(None, description="Server-counted generated tokens over the run.")


class RatioCI(BaseModel):
    """A ratio with its 95% bootstrap interval; ``n`` pairs behind it."""

    point: float | None
    low: float | None = None
    high: float | None = None
    n: int = 0

    @property
    def significant_faster(self) -> bool:
        return self.low is not None and self.low > 1.0

    @property
    def significant_slower(self) -> bool:
        return self.high is not None and self.high < 1.0


class Crossover(BaseModel):
    """Where spec on stops being faster, from ratios (on/off throughput) per concurrency."""

    status: str  # "faster-everywhere" | "never-faster" | "crosses"
    last_faster: int | None = None
    first_slower: int | None = None
    estimate: float | None = None
    text: str

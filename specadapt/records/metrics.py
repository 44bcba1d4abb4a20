"""Summaries computed from request records and counters: latency, acceptance, ratio intervals.

The formulas live beside the code that computes them (analysis.latency, analysis.acceptance,
analysis.stats); these are the results as every layer above sees them.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, computed_field


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


Verdict = Literal["faster", "slower", "no clear difference"]


def above_one(low: float | None) -> bool:
    """Whether an interval with this low end lies wholly above 1 (spec on significantly faster)."""
    return low is not None and low > 1.0


def below_one(high: float | None) -> bool:
    """Whether an interval with this high end lies wholly below 1 (spec on significantly slower)."""
    return high is not None and high < 1.0


def interval_verdict(low: float | None, high: float | None) -> Verdict:
    """faster: the interval lies above 1; slower: below 1; otherwise (also without an
    interval) no clear difference."""
    if above_one(low):
        return "faster"
    if below_one(high):
        return "slower"
    return "no clear difference"


class RatioCI(BaseModel):
    """A ratio (> 1: spec on is faster) with its interval over ``n`` independent units.

    ``too_few``: fewer units than ``min_n``, the least at which the method's coverage holds;
    then only the point is given (``low``/``high`` None)."""

    point: float | None
    low: float | None = None
    high: float | None = None
    n: int = Field(0, description="Independent units behind the ratio (pairs or blocks).")
    unit: Literal["pairs", "blocks"] = Field("pairs", description="pairs: one off/on pair of requests sent back "
                                                                  "to back; blocks: one off block + one on block.")
    method: str = Field("t", description="t: exp(mean +- t_{n-1} sd / sqrt(n)) of the units' log ratios "
                                         "(analysis/stats.py); reports that name another method keep it.")
    level: float = Field(0.95, description="Stated coverage of the interval.")
    min_n: int | None = Field(None, description="Fewest units for which the interval is given.")
    too_few: bool = Field(False, description="Fewer than min_n units: point only, no interval.")

    @property
    def significant_faster(self) -> bool:
        return above_one(self.low)

    @property
    def significant_slower(self) -> bool:
        return below_one(self.high)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def verdict(self) -> Verdict:
        """faster: the interval lies above 1; slower: below 1; otherwise (also without an
        interval) no clear difference (interval_verdict)."""
        return interval_verdict(self.low, self.high)


class Crossover(BaseModel):
    """Where spec on stops being faster, from the throughput interval (on/off) at each concurrency
    (or each request rate: levels may then be floats, inf written "Infinity")."""

    model_config = ConfigDict(ser_json_inf_nan="strings")

    status: str = Field(description="faster-everywhere | crosses | faster-at-some | never-faster | "
                                    "no-clear-difference | mixed | no-speculation | unknown")
    last_faster: int | float | None = None
    first_slower: int | float | None = None
    estimate: float | None = Field(None, description="Concurrency where the point ratios cross 1 (log2 "
                                                     "interpolation), only when a faster level is followed by a "
                                                     "slower one.")
    verdicts: dict[int | float, str] = Field(default_factory=dict, description="Per concurrency: faster, slower, no clear "
                                                                       "difference, or no speculation.")
    text: str

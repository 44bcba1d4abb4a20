"""Why speculation was faster or slower: the figures behind it, the causes they support, what to do.

Built by analysis/diagnosis.py from what a compare (or tune) run measured; rendered by every
report format. Every sentence in ``causes`` and ``advice`` carries the figure it rests on.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from specadapt.records.metrics import RatioCI

CauseCode = Literal[
    "pays", "verify-compute-bound", "low-acceptance", "k-too-long", "draft-expensive", "past-crossover",
    "overhead", "speculation-off", "interference",
]
AdviceCode = Literal["k", "off", "dtype", "batch-size", "draft", "workload", "evidence", "interference"]
LandingClass = Literal["land", "partly", "not", "unknown"]
"""Whether a group's drafts land (analysis/diagnosis.py ``land_class``): ``land`` (most draft tokens
accepted), ``partly``, ``not`` (few or none), ``unknown`` (neither drafted counts nor k known)."""


class LevelFigures(BaseModel):
    """The arithmetic of one level: what a verify pass yields and what it costs, in decode steps."""

    level: str = Field(description="'concurrency 4' or '2 req/s'.")
    concurrency: int = Field(description="Closed-loop level; 0 at an arrival rate.")
    request_rate: float | None = None
    k: int | None = Field(None, description="Draft tokens per verify pass (the spec-on server's k).")
    tpot_ratio: RatioCI | None = Field(None, description="Measured TPOT ratio off/on (> 1: spec on is faster).")
    verdict: Literal["faster", "slower", "no clear difference", "unknown"] = "unknown"
    tokens_per_pass: float | None = Field(None, description="Tokens per verify pass: 1 + accepted / drafts "
                                                            "(per-position acceptance summed, the bonus counted).")
    per_position_rate: list[float] = Field(default_factory=list, description="Accepted per draft, by position.")
    acceptance_rate: float | None = None
    verify_passes: float | None = Field(None, description="Verify passes (drafts) the spec-on server counted.")
    plain_steps: float | None = Field(None, description="Decode steps without a draft (e.g. n-gram found no match): "
                                                        "the spec-on side's decode tokens - accepted - passes.")
    tokens_per_step: float | None = Field(None, description="Decode tokens per decode step of the spec-on side "
                                                            "(passes and plain steps together).")
    pass_cost: float | None = Field(None, description="Cost of one verify pass in spec-off decode steps "
                                                      "(memory-bound ideal: 1; the draft's own cost included).")
    pass_cost_low: float | None = None
    pass_cost_high: float | None = None
    pass_cost_source: str | None = Field(None, description="How the pass cost was measured.")
    draft_cost_per_pass: float | None = Field(None, description="The draft's own share of a pass, in decode "
                                                                "steps (k x cost per draft token); 0 for n-gram.")
    draft_cost_source: str | None = None
    break_even_tokens_per_pass: float | None = Field(None, description="Tokens per pass at which speculation "
                                                                       "breaks even at this pass cost.")
    break_even_acceptance: float | None = Field(None, description="The i.i.d. per-token acceptance that yields "
                                                                  "the break-even tokens per pass at this k.")
    break_even_possible: bool | None = Field(None, description="False: the pass costs more than k + 1 decode "
                                                               "steps, so no acceptance rate can pay for it.")
    ideal_speedup: float | None = Field(None, description="The ratio if a pass cost what the draft costs plus "
                                                          "one decode step (the memory-bound limit).")
    measured_over_ideal: float | None = None
    model: str | None = Field(None, description="The cost model: 'v + c k' (tune's fit over several k) or "
                                                "'1 + c k' (one k measured).")
    model_v: float | None = None
    model_c: float | None = Field(None, description="Cost per draft token, in decode steps.")
    model_speedup: float | None = Field(None, description="The model's TPOT ratio at this k.")
    measured_over_model: float | None = None
    model_best_k: int | None = Field(None, description="The k (0 = off) the model predicts best, k <= the "
                                                       "measured k.")
    model_best_speedup: float | None = None
    ttft_ratio: RatioCI | None = Field(None, description="TTFT on / off over the pairs at concurrency 1 (> 1: "
                                                         "the first token comes later with spec on).")
    e2e_ratio: RatioCI | None = None


class Cause(BaseModel):
    """One cause the figures support, in words, with the figures it rests on."""

    code: CauseCode
    level: str = Field(description="Where it holds: 'concurrency 1', 'concurrency 4 and above', 'all levels'.")
    text: str
    figures: dict[str, float] = Field(default_factory=dict)


class Advice(BaseModel):
    code: AdviceCode
    text: str


class Landing(BaseModel):
    """Where drafts land: one prompt category, or one prompt of a category that holds several, its
    per-request acceptance (the speculation section's figures) beside its speed."""

    kind: Literal["category", "prompt"]
    name: str
    category: str = Field(description="The category (a category's own name for a category).")
    requests: int
    acceptance_rate: float | None = Field(None, description="Accepted / drafted draft tokens over its answers.")
    drafted: int | None = Field(None, description="Draft tokens proposed; None: not known.")
    tokens_per_pass: float | None = Field(None, description="Output tokens / passes of the target.")
    land_rate: float | None = Field(None, description="The acceptance its landing is judged by: accepted / "
                                                      "drafted, or (tokens per pass - 1) / k where the drafted "
                                                      "tokens are not known.")
    lands: LandingClass
    tpot_ratio: RatioCI | None = Field(None, description="Its TPOT ratio off/on at the first level (categories).")


class Diagnosis(BaseModel):
    """The answer to "why is it faster or slower here", from the run's own figures."""

    headline: str = Field(description="One or two sentences: the verdict and its main cause.")
    levels: list[LevelFigures] = Field(default_factory=list)
    causes: list[Cause] = Field(default_factory=list)
    advice: list[Advice] = Field(default_factory=list)
    evidence_gaps: list[str] = Field(default_factory=list, description="What the run cannot tell, and why.")
    landing: list[Landing] = Field(default_factory=list, description="Per category (and per prompt where a "
                                                                     "category holds several): do drafts land?")
    drafts_land: str = Field("", description="In words: the categories and prompts where drafts land and where "
                                             "they do not, by acceptance and by speed; or why per-request "
                                             "acceptance is not available ('' where the report has no "
                                             "speculation section).")
    thresholds: dict[str, float] = Field(default_factory=dict, description="The thresholds the causes used.")

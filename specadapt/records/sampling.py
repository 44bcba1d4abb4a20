"""The verdict on whether sampled tokens follow the target's distribution.

Computed by ``specadapt.analysis.sampling_stats`` (the formulas are there and in
docs/sampling.md); this is the result as the report and the gate see it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

SamplingStatus = Literal["consistent", "inconsistent", "too-few"]


class SamplingTest(BaseModel):
    """One hypothesis test of the family; it rejects when ``p_value <= per_test_alpha``."""

    name: str = Field(description="pit-chi-square | pit-ks | rank-chi-square")
    statistic: float
    dof: int | None = Field(None, description="Degrees of freedom of the chi-square reference; None for KS.")
    p_value: float
    rejected: bool


class RankCategory(BaseModel):
    """Sampled tokens by their rank in the source's top-K, observed vs expected under the target."""

    name: str = Field(description="rank 1 | rank 2 | ranks 3-5 | ranks 6-K | outside top-K")
    observed: int
    expected: float = Field(description="Sum over positions of the category's probability under the source.")


class TvTarget(BaseModel):
    """How many tokens the PIT chi-square needs to catch a binned-PIT TV of ``tv`` at the stated power."""

    tv: float
    samples_needed: int


class SamplingStats(BaseModel):
    """Whether the sampled tokens are consistent with the source (target) distribution."""

    status: SamplingStatus = Field(
        description="consistent: no test rejects; inconsistent: a test rejects or a token of probability "
                    "zero was sampled; too-few: fewer tokens than the chi-square approximation needs, "
                    "nothing was decided.")
    passed: bool = Field(description="True only when status is consistent.")
    n_tokens: int
    min_tokens: int = Field(description="Fewest tokens the verdict decides on: 5 expected per PIT bin.")
    alpha: float = Field(description="Family-wise false-alarm rate (Bonferroni over the tests).")
    per_test_alpha: float = Field(description="alpha divided by the number of tests.")
    power: float = Field(description="The power that detectable_tv and samples_needed are stated at.")
    bins: int
    seed: int = Field(description="Seed of the PIT randomisation.")
    tests: list[SamplingTest] = Field(default_factory=list, description="Empty when status is too-few.")
    pit_histogram: list[int] = Field(description="Randomised PITs per equal bin of [0, 1].")
    pit_expected_per_bin: float
    rank_categories: list[RankCategory]
    rank_test_groups: list[str] = Field(
        default_factory=list,
        description="The categories the rank test used: neighbours with fewer than 5 expected are merged "
                    "('+' joins the merged names).")
    top1_z: float | None = Field(None, description="(observed - expected) / sd of rank-1 tokens; None "
                                                   "when rank 1 has no variance.")
    zero_probability_tokens: int = Field(0, description="Sampled tokens the source gives probability zero.")
    detectable_tv: float | None = Field(
        None, description="Smallest binned-PIT total-variation distance from uniform caught with at least "
                          "`power`, whatever its shape (None without tokens).")
    samples_needed: list[TvTarget] = Field(default_factory=list)
    summary: str

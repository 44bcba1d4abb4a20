"""The sequential design of a compare or equiv run ("run until decided") and its outcome per level.

The rule (computed in analysis/sequential.py): after each unit (an off/on pair at concurrency 1,
one repeat's off block + on block above 1 and at arrival rates), the anytime-valid t confidence
sequence of the primary ratio over the units so far decides "faster", "slower", "equivalent"
(within the margin), or, at the cap, "no clear difference" with the interval reached. A
confidence sequence covers at every stopping time at once, so looking after every unit keeps
the stated error rate.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from specadapt.records.metrics import RatioCI

PRIMARIES = ("tpot", "e2e", "throughput")
SEQUENTIAL_VERDICTS = ("faster", "slower", "equivalent", "no clear difference")

PHI = 0.1
"""The mixing precision of the confidence sequence (benchmarks/sequential_design.py, docs/benchmarks.md)."""
FIRST_LOOK = 6
"""The fewest units before the rule may stop (benchmarks/sequential_design.py, docs/benchmarks.md)."""


class SequentialDesign(BaseModel):
    """Run until decided: after each unit, the anytime-valid interval of the primary ratio decides."""

    alpha: float = Field(0.05, gt=0.0, lt=1.0,
                         description="Stated error rate of the rule: the chance that the primary ratio's "
                                     "confidence sequence ever misses the true ratio, whenever the run stops. "
                                     "Each secondary ratio (the other two of TPOT, E2E, tokens/s) gets its own "
                                     "sequence at the same alpha, valid at the stop on its own; for all three "
                                     "at once the error rate is at most 3 alpha.")
    phi: float = Field(PHI, gt=0.0,
                       description="Mixing precision of the confidence sequence (normal mixture over the "
                                   "standardized effect, mean log ratio / sd, of prior precision phi; "
                                   "r = phi / (phi + n)). Chosen by simulation "
                                   "(benchmarks/sequential_design.py, docs/benchmarks.md): with the first look "
                                   "at 6 units, 0.1 gives the fewest expected units to a correct verdict on a "
                                   "true 1.5x with a per-unit sd of 0.1-0.2 among the values whose false alarms "
                                   "stay below alpha with a look after every unit, also for units in two states "
                                   "(a quiet or a busy moment); a smaller phi suits larger standardized effects, "
                                   "a larger one smaller effects.")
    primary: Literal["tpot", "e2e", "throughput"] = Field(
        "tpot", description="The ratio whose confidence sequence decides: tpot, e2e or throughput (output tokens/s).")
    margin: float | None = Field(None, gt=0.0,
                                 description="Equivalence margin delta (0.05: +-5%): 'equivalent' when the "
                                             "interval lies within (1/(1+delta), 1+delta) and decides neither "
                                             "faster nor slower. None: no equivalence verdict.")
    max_units: int = Field(40, ge=2, description="The cap: most units per level; reached undecided, the verdict is "
                                                 "'no clear difference' with the interval reached.")
    first_look: int = Field(FIRST_LOOK, ge=2,
                            description="Fewest units per level before the rule may stop, whatever the interval. The "
                                        "sequence is exact for Gaussian log ratios; when a unit lands in one of two "
                                        "states (a quiet or a busy moment of the machine), a few units all in one "
                                        "state look decisive: with looks from the first interval on (3 units at "
                                        "phi 0.1) false alarms reach about 17-24%, with the first look at 6 units "
                                        "about 4.5% (benchmarks/sequential_design.py).")
    min_units: int = Field(0, ge=0, description="Fewest units per level before a stop for the run's own needs "
                                                "(equiv's identity check needs each prompt once).")
    fail_divergences: int | None = Field(None, ge=1,
                                         description="Stop the whole run to fail once this many prompts diverged "
                                                     "(the identity gate can no longer pass). None: no such stop.")

    @property
    def rule(self) -> str:
        """The rule in one sentence, for the reports."""
        margin = f", equivalent within +-{self.margin:.0%}" if self.margin is not None else ""
        floor = f", at least {max(self.first_look, self.min_units)} units"
        return (f"run until decided: after each unit the anytime-valid {1 - self.alpha:.0%} t confidence sequence "
                f"(phi {self.phi:g}) of the {self.primary} ratio decides faster or slower{margin}; at most "
                f"{self.max_units} units per level{floor}; error rate {self.alpha:g} whenever the run stops")


class SequentialOutcome(BaseModel):
    """How the rule ended at one level."""

    verdict: Literal["faster", "slower", "equivalent", "no clear difference"] = Field(
        description="faster: the primary ratio's interval lies above 1; slower: below 1; equivalent: within the "
                    "margin; no clear difference: the cap (or the identity stop) came first.")
    stopped: Literal["decided", "cap", "identity", "dropped"] = Field(
        description="decided: the interval decided; cap: max_units reached undecided; identity: the run stopped "
                    "to fail on divergences; dropped: a tune cell whose interval could not beat the best cell so "
                    "far at its batch size.")
    units: int = Field(description="Units measured at the level when it stopped.")
    requests: int = Field(description="Measured requests sent at the level, both sides.")
    fixed_requests: int | None = Field(None, description="Measured requests today's fixed design (prompts x "
                                                         "--repeat) would have sent at the level, both sides.")
    interval: RatioCI = Field(description="The primary ratio's confidence sequence at the stop (method cs).")
    text: str = Field(description="The outcome in one sentence.")

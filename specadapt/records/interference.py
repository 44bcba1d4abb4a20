"""Whether the two servers of a compare stalled each other's first token: the finding.

Built by analysis/interference.py from a run's records (the report's ``interference`` section)
or from the short check before the run (``CompareReport.interference_check``).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

OrderStatus = Literal["judged", "too few", "not judged"]
Source = Literal["run", "check"]


class SideStalls(BaseModel):
    """One side's first tokens: how many stalled, and after which side's request."""

    side: Literal["off", "on"]
    n: int = Field(description="Measured requests with a first token.")
    after_other: int = Field(0, description="Those sent right after the other side's request.")
    after_same: int = Field(0, description="Those sent right after a request of this side.")
    stalls: int = Field(0, description="First tokens later than the typical TTFT + the margin.")
    stalls_after_other: int = 0
    stalls_after_same: int = 0
    typical_ms: float | None = Field(None, description="The side's typical TTFT: the median of its faster half.")
    margin_ms: float | None = Field(None, description="How much later than typical a first token must come to be a "
                                                      "stall: max(floor, a multiple of the faster half's MAD).")
    stall_ms: float | None = Field(None, description="The stall size: the median excess of the stalls over typical.")
    bimodal: bool = Field(False, description="A cluster of stalls far above typical (at least two).")


class LevelStalls(BaseModel):
    """A level whose requests overlap (concurrency > 1, an arrival rate): stalls per side, no order."""

    level: str = Field(description="'concurrency 4' or '2 req/s'.")
    sides: list[SideStalls] = Field(default_factory=list)


class InterferenceFinding(BaseModel):
    """Did the sides stall each other? The figures at concurrency 1 (the order judged there) and the
    bimodality of the other levels, in one sentence."""

    source: Source = Field("run", description="run: the measured requests of the compare; "
                                                               "check: the short check before it.")
    detected: bool = Field(False, description="Stalls tied to the order of the sides beyond chance.")
    order: OrderStatus = Field("not judged", description="judged: the test ran; too few: not enough requests or "
                                                         "stalls for it to show anything; not judged: no order "
                                                         "to judge (sides one after the other, overlapping "
                                                         "requests, no send times).")
    reason: str | None = Field(None, description="Why the order was not judged or could not show anything.")
    p_value: float | None = Field(None, description="One-sided exact p-value of the stalls falling after the "
                                                    "other side's request this often by chance.")
    alpha: float = Field(description="The test's false-alarm rate.")
    requests: int = Field(0, description="Measured first tokens at concurrency 1 whose previous request is known.")
    stalls: int = Field(0, description="Their stalls, both sides.")
    stalls_after_other: int = 0
    stall_ms: float | None = Field(None, description="The median excess of every stall over its side's typical.")
    similar_size: bool | None = Field(None, description="Both sides stall, by about the same amount (None: not "
                                                        "both stall).")
    sides: list[SideStalls] = Field(default_factory=list, description="Concurrency 1, per side.")
    levels: list[LevelStalls] = Field(default_factory=list, description="Levels whose requests overlap.")
    host: str | None = Field(None, description="Both servers share a machine, as far as their URLs tell.")
    text: str = Field("", description="The finding in one sentence.")

"""The report of `specadapt equiv --features`: one verdict per request feature (a cell), the
speculation activity of the spec-on server during each cell, and the gate."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from specadapt.records.metrics import AcceptanceSummary
from specadapt.records.reports import PassGate, ReportEnvelope
from specadapt.records.sampling import SamplingStats
from specadapt.records.sampling_report import SamplingLooks
from specadapt.records.server import ServerInfo

CellKind = Literal["deterministic", "distribution", "seed"]
CellVerdict = Literal["pass", "near-tie", "fail", "inactive", "unsupported", "not-exact", "lossy", "error"]
# What each verdict means for the gate: True passes, False fails, None neither (shown, not counted).
GATE_EFFECT: dict[str, bool | None] = {"pass": True, "near-tie": True, "fail": False, "error": False,
                                       "inactive": None, "unsupported": None, "not-exact": None, "lossy": None}


class Activity(BaseModel):
    """Speculation on the spec-on server over one cell: its counters before and after."""

    state: Literal["active", "inactive", "unknown"]
    acceptance: AcceptanceSummary | None = None

    @property
    def text(self) -> str:
        a = self.acceptance
        if self.state == "unknown":
            return "unknown" + (f" ({a.reason})" if a and a.reason else "")
        if self.state == "inactive":
            return "no draft proposed"
        rate = f"{a.acceptance_rate:.0%}" if a and a.acceptance_rate is not None else "?"
        return f"{int(a.draft_tokens or 0)} drafted, {rate} accepted" if a else "active"


class CellCheck(BaseModel):
    """One thing a cell checked, and what it found."""

    name: str = Field(description="identity, invariant (on/off), logprobs, distribution, seed, ...")
    ok: bool
    detail: str = ""


class CellResult(BaseModel):
    name: str
    kind: CellKind
    title: str = Field(description="What the cell sends, in words.")
    params: dict[str, Any] = Field(default_factory=dict, description="The request parameters the cell sent "
                                                                     "(derived ones included).")
    verdict: CellVerdict
    reason: str = Field(description="One line: why this verdict.")
    checks: list[CellCheck] = Field(default_factory=list)
    activity: Activity | None = None
    requests: int = Field(0, description="Requests sent to the spec-on server (probes included).")
    tokens: int = Field(0, description="Tokens the spec-on server generated for the cell's own requests.")
    stats: SamplingStats | None = Field(None, description="Distribution cells: the statistics of the sampled tokens.")
    seconds: float | None = Field(None, description="Wall time of the cell, derivation and scoring included.")
    looks: SamplingLooks | None = Field(None, description=(
        "Distribution cells with --until-decided: the looks, their alphas, the look the cell stopped at and the "
        "samples it used against the fixed design's; None for the fixed design and for the other cells."))
    notes: list[str] = Field(default_factory=list)


class FeatureSettings(BaseModel):
    features: list[str]
    max_tokens: int = Field(description="Tokens per greedy request of a deterministic cell.")
    samples: int = Field(description="Distribution cells: completions per prompt.")
    sample_tokens: int = Field(description="Distribution cells: tokens per completion (EOS ignored).")
    alpha: float = Field(description="Distribution cells: family-wise false-alarm rate per cell.")
    top_logprobs: int = Field(description="K of the distribution source's top K.")
    concurrency: int
    seed: int
    request_timeout_s: float
    near_tie_threshold: float | None = Field(None, description=(
        "Nats: a divergence or a logprob difference within it is a near-tie (None until the run resolves it from "
        "the spec-off server's dtype)."))
    source: Literal["server", "reference"] = Field(description="The distribution cells' source of p.")
    reference: str | None = None
    require_active: bool = Field(False, description="An inactive cell fails the gate.")
    prompts_source: str = "built-in"
    looks: int | None = Field(None, description=(
        "With --until-decided: each distribution cell sends its samples in this many equal batches and tests after "
        "each; an interim look stops the cell only to reject. None: all samples, one test."))


FeatureGate = PassGate  # the one pass/fail gate (records/reports.py)


class FeatureReport(ReportEnvelope):
    kind: Literal["features"] = "features"
    settings: FeatureSettings
    on_server: ServerInfo
    baseline_server: ServerInfo | None = Field(None, description="The spec-off server (None when only the "
                                                                 "reference recompute was the baseline).")
    lossy: str | None = Field(None, description="Why the spec-on configuration is lossy by design, when it is.")
    cells: list[CellResult] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)
    gate: FeatureGate
    partial: bool = Field(False, description="The run stopped early; only finished cells are in.")
    stopped: str | None = None

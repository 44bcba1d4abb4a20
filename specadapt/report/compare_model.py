"""The versioned A/B report (`compare` and `equiv`): settings, raw records, analysis, verdict."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from specadapt.adapters.base import CounterSnapshot, ServerInfo
from specadapt.probes.acceptance import AcceptanceSummary
from specadapt.probes.client import RequestRecord, RequestSettings
from specadapt.probes.latency import LatencySummary
from specadapt.probes.stats import Crossover, RatioCI
from specadapt.report.model import ReportEnvelope


class CompareSettings(BaseModel):
    concurrency: list[int] = Field(default_factory=lambda: [1], description="Levels of the sweep, ascending.")
    repeat: int = 3
    warmup: int = 1
    request: RequestSettings = Field(default_factory=RequestSettings)
    on_temperature: float | None = Field(None, description="Drill knob: another temperature for the spec-on side.")
    prompts_source: str = "built-in"
    bootstrap: int = 2000
    seed: int = 0
    draft_cost: float | None = Field(None, description="Draft/target cost ratio c for theory (ngram: 0).")
    near_tie_threshold: float | None = Field(None, description="Nats; None: the default for the dtype.")
    dtype: str | None = Field(None, description="Server dtype, for the default near-tie threshold.")
    triage: bool = True
    reference: str | None = Field(None, description="Local HF model dir for float64 recomputation.")
    interleaved: bool = True


class CounterPair(BaseModel):
    before: CounterSnapshot
    after: CounterSnapshot


class SpeedRatios(BaseModel):
    """> 1 means spec on is faster. TPOT and E2E: mean(off)/mean(on); throughput: on/off tokens/s."""

    tpot: RatioCI
    e2e: RatioCI
    throughput: RatioCI


class PromptSpeed(BaseModel):
    prompt_id: str
    category: str
    ratios: SpeedRatios


class TheoryCheck(BaseModel):
    """Theory beside measurement (native_reference/theory.py formulas)."""

    k: int
    tokens_per_pass: float = Field(description="Measured mean acceptance length (accepted + bonus).")
    draft_cost_assumed: float = Field(description="c used for the prediction (ngram: 0).")
    predicted_speedup: float = Field(description="(1 + sum_i accepted_i/drafts) / (k c + 1).")
    measured_speedup: float | None = Field(description="Measured TPOT ratio off/on.")
    measured_over_predicted: float | None
    implied_draft_cost: float | None = Field(
        description="The c that makes theory match the timings: (TPOT_on * L / TPOT_off - 1) / k; "
                    "for ngram it is the verify-pass overhead per draft token.")
    iid_acceptance: float | None = Field(description="The i.i.d. a that explains the mean length.")
    best_k_iid: int | None = Field(description="Best k (0..16) for that a and the implied c.")
    best_k_measured_positions: int | None = Field(description="Best k <= current k from per-position acceptance.")


class LevelResult(BaseModel):
    concurrency: int
    pairs: int
    speed: SpeedRatios
    by_prompt: list[PromptSpeed] = Field(default_factory=list)
    off: LatencySummary
    on: LatencySummary
    acceptance: AcceptanceSummary
    theory: TheoryCheck | None = None


Verdict = Literal["identical", "near-tie", "suspect", "unknown"]


class Triage(BaseModel):
    verdict: Literal["near-tie", "suspect", "unknown"]
    source: Literal["server-logprobs", "reference-float64", "none"]
    margin: float | None = Field(None, description="logp(off token) - logp(on token), nats, at the divergence.")
    margin_is_lower_bound: bool = Field(False, description="The on token was not in the top logprobs.")
    threshold: float
    server_margin: float | None = None
    reference_margin: float | None = None
    top_logprobs: dict[str, float] = Field(default_factory=dict, description="Spec-off server's top logprobs there.")
    note: str = ""


class Divergence(BaseModel):
    """The first place where spec-on output left spec-off output, for one pair."""

    prompt_id: str
    category: str
    concurrency: int
    repeat: int
    replica: int = 0
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


class Gate(BaseModel):
    max_suspect: int = 0
    max_near_tie: int | None = None
    min_speedup: float | None = None
    passed: bool = True
    reasons: list[str] = Field(default_factory=list)


class CompareReport(ReportEnvelope):
    kind: Literal["compare"] = "compare"
    settings: CompareSettings
    off_server: ServerInfo
    on_server: ServerInfo
    levels: list[LevelResult] = Field(default_factory=list)
    crossover: Crossover | None = None
    identity: list[PromptIdentity] = Field(default_factory=list)
    counts: dict[str, int] = Field(default_factory=dict, description="Prompts per identity verdict.")
    gate: Gate | None = None
    notes: list[str] = Field(default_factory=list)
    counters_on: dict[int, CounterPair] = Field(default_factory=dict)
    counters_off: dict[int, CounterPair] = Field(default_factory=dict)
    requests: list[RequestRecord] = Field(default_factory=list)


def read_compare_report(path: Path) -> CompareReport:
    from specadapt.report.model import read_model

    return read_model(path, CompareReport, "compare")

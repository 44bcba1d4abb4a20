"""`specadapt tune`: the sweep, the fitted model, the per-batch-size choice, the emitted
configs and their verification (computed in orchestration/tune.py and analysis/tune_model.py).

Vocabulary. A *candidate* is one speculative configuration of the sweep: the user's base
config with one draft length ``k`` (and, for n-gram, one lookup window). Candidates that
differ in anything but ``k`` belong to different *variants*: a schedule chooses k per batch
size within one variant. ``k = 0`` is the spec-off server itself (ratio 1 by definition).
A *level* is one closed-loop concurrency of the workload; in closed loop the server's batch
size is the concurrency while every stream is busy.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from specadapt.records.diagnosis import Diagnosis
from specadapt.records.metrics import RatioCI
from specadapt.records.reports import CompareReport, ReportEnvelope
from specadapt.records.requests import RequestSettings
from specadapt.records.sequential import SequentialDesign
from specadapt.records.server import ServerInfo
from specadapt.records.workload import WorkloadInfo

Objective = Literal["tpot", "e2e", "throughput"]
Certainty = Literal["clear", "leaning", "no interval"]
HonourVerdict = Literal["honoured", "not honoured", "undetermined", "not applicable"]


class TuneSettings(BaseModel):
    """What the sweep ran: candidates, levels, workload, and how the winner is judged."""

    backend: str
    base_spec: dict = Field(description="The starting speculative config (neutral form); candidates vary k "
                                        "and, for n-gram, the lookup window.")
    ks: list[int] = Field(description="Draft lengths of the sweep, ascending; 0 is the spec-off server.")
    ngram_max: list[int] = Field(default_factory=list, description="n-gram lookup windows (prompt_lookup_max) "
                                                                   "swept; empty: the base config's.")
    concurrency: list[int] = Field(description="Closed-loop levels, ascending.")
    repeat: int
    warmup: int
    request: RequestSettings
    objective: Objective = Field("tpot", description="The ratio that picks the winner at each level.")
    prompts_source: str = "built-in"
    workload: WorkloadInfo | None = None
    near_tie_threshold: float | None = None
    dtype: str | None = None
    triage: bool = True
    verify: bool = True
    given_schedule: list[tuple[int, int, int]] | None = Field(None, description="--schedule: the schedule verified "
                                                                                "instead of the chosen one.")
    max_batch_size: int | None = Field(None, description="The last schedule range ends here (None: at the "
                                                         "highest level; the engines carry its k beyond).")
    workers: int = Field(1, description="Worker processes (with ray_address: Ray actors) that sent each block.")
    ray_address: str | None = None
    sequential: SequentialDesign | None = Field(
        None, description="--until-decided: each (k, batch size) cell of the sweep runs until its objective ratio "
                          "against spec-off is decided, or is dropped once it cannot beat the best cell so far at its "
                          "batch size (its primary is the objective); the verification keeps the fixed design. "
                          "None: the fixed design (--repeat) everywhere.")


class CellOutcome(BaseModel):
    """How run until decided ended one (k, batch size) cell of the sweep."""

    concurrency: int
    stopped: Literal["decided", "cap", "dropped", "identity"] = Field(
        description="decided: its interval against spec-off decided; cap: --max-units reached undecided; dropped: "
                    "its interval lay wholly below the best cell's so far at the same batch size; identity: the "
                    "run stopped on divergences.")
    verdict: Literal["faster", "slower", "equivalent", "no clear difference"]
    units: int
    requests: int = Field(description="Measured requests the cell sent, both sides.")
    fixed_requests: int | None = Field(None, description="What the fixed design (--repeat) would have sent there.")
    interval: RatioCI = Field(description="The objective ratio's confidence sequence at the stop.")
    best_label: str | None = Field(None, description="Dropped: the cell it could not beat (same batch size).")
    best_interval: RatioCI | None = Field(None, description="Dropped: that cell's interval.")
    text: str = Field(description="The outcome in one sentence.")


class Candidate(BaseModel):
    """One configuration of the sweep and what measuring it gave."""

    label: str = Field(description="e.g. 'k=4' or 'k=4 ngram_max=3'.")
    variant: str = Field(description="What the candidate is besides k, e.g. 'ngram_max=3' ('' for the base).")
    k: int
    spec: dict | None = Field(None, description="Its speculative config (neutral form); None for k = 0.")
    status: Literal["measured", "failed", "not run", "baseline"] = "measured"
    error: str | None = Field(None, description="Why it was not measured (its server failed, died, ...).")
    url: str | None = Field(None, description="Where it ran (given with --on, or started).")
    compare: CompareReport | None = Field(None, description="Its A/B against the spec-off server (k > 0).")
    suspect: int = Field(0, description="Prompts whose divergence is not a near-tie: the candidate is excluded.")
    cells: list[CellOutcome] = Field(default_factory=list, description="Run until decided: how each level (cell) "
                                                                       "ended; empty in the fixed design.")


class FitPoint(BaseModel):
    """One measured candidate beside the model's prediction at one level."""

    k: int
    measured: float = Field(description="Measured TPOT ratio off/on (point).")
    low: float | None = None
    high: float | None = None
    tokens_per_pass: float = Field(description="Its own measured mean acceptance length.")
    predicted: float = Field(description="The fitted model's TPOT ratio at this k.")
    inside: bool | None = Field(None, description="Prediction inside the measured interval (None: no interval).")


class LevelFit(BaseModel):
    """Cost model of one level: time of a verify pass with k drafts, relative to a plain decode
    step, is v + c k; tokens per pass from per-position acceptance; speedup = tokens / cost."""

    concurrency: int
    variant: str = ""
    form: Literal["v + c k", "1 + c k", "none"] = Field(
        description="'v + c k' (v, c least squares) with 3 or more speculating candidates, '1 + c k' with 1-2 "
                    "(v = 1: the classic memory-bound assumption), 'none' without a measured candidate.")
    v: float | None = None
    c: float | None = Field(None, description="Verify cost per draft token relative to a decode step.")
    per_position_rate: list[float] = Field(default_factory=list, description=(
        "Accepted per draft at each position, from the largest measured k (a shorter proposal is its prefix)."))
    points: list[FitPoint] = Field(default_factory=list)
    max_rel_error: float | None = Field(None, description="Largest |predicted - measured| / measured.")
    r2: float | None = Field(None, description="R^2 of predicted against measured TPOT ratios (3+ points).")
    predicted: dict[int, float] = Field(default_factory=dict, description="Predicted TPOT ratio for k = 0..max k.")
    model_best_k: int | None = Field(None, description="The k the model predicts best (may be unmeasured).")


class LevelChoice(BaseModel):
    """The k chosen at one level among the measured candidates, and how sure that is."""

    concurrency: int
    k: int
    label: str = Field(description="The chosen candidate ('off' for k = 0).")
    ratio: RatioCI | None = Field(None, description="The chosen candidate's objective ratio vs off (None: off).")
    runner_up_k: int | None = None
    runner_up_ratio: float | None = None
    certainty: Certainty
    reason: str = Field(description="One sentence: why this k, how sure, what else was close.")
    excluded: dict[int, str] = Field(default_factory=dict, description="k -> why it could not be chosen.")
    model_best_k: int | None = None
    model_note: str | None = Field(None, description="Where the model prefers an unmeasured k.")


class WrittenConfig(BaseModel):
    engine: Literal["vllm", "trtllm"]
    path: str | None = Field(None, description="The file written; None when this engine got no file.")
    form: Literal["schedule", "fixed", "max_concurrency", "off"] | None = None
    note: str | None = Field(None, description="Why it was not written, or what to know about it.")
    checked_by: list[str] = Field(default_factory=list, description="Validations it passed.")


class HonourCheck(BaseModel):
    """Did the server draft fewer tokens where the schedule says so? At a level whose scheduled k
    is below the engine's k, the accepted counts at positions above the scheduled k (per generated
    token) are set against the fixed-k run at the engine's k at the same level."""

    concurrency: int
    scheduled_k: int
    engine_k: int
    schedule_rate: float | None = Field(None, description="Accepted at positions > scheduled k per generated "
                                                          "token, in the verification run.")
    fixed_rate: float | None = Field(None, description="The same in the sweep's run at the engine's k.")
    fixed_count: float | None = Field(None, description="Accepted tokens at those positions in the fixed run.")
    ratio: float | None = None
    verdict: HonourVerdict
    reason: str


class LevelVerify(BaseModel):
    concurrency: int
    scheduled_k: int
    ratio: RatioCI = Field(description="The emitted config's objective ratio vs off in the verification run.")
    best_fixed_k: int
    best_fixed_ratio: RatioCI | None = Field(None, description="The best fixed-k candidate's ratio in the sweep "
                                                               "(None: off was best, ratio 1).")
    as_good: bool | None = Field(None, description="Its interval reaches the best fixed-k's (None: no interval).")
    honour: HonourCheck | None = None


class Verification(BaseModel):
    status: Literal["passed", "failed", "not run"]
    reason: str | None = None
    url: str | None = None
    compare: CompareReport | None = None
    levels: list[LevelVerify] = Field(default_factory=list)
    honoured: HonourVerdict = "not applicable"
    suspect: int = 0
    near_tie: int = 0
    reasons: list[str] = Field(default_factory=list, description="Why it failed, one line each.")


class Recommendation(BaseModel):
    form: Literal["schedule", "fixed", "off", "none"] = Field(
        description="A per-batch-size schedule, one fixed k, speculation off, or nothing (nothing measured).")
    variant: str = ""
    k: int = Field(0, description="The engine's k (the schedule's largest, or the fixed k).")
    schedule: list[tuple[int, int, int]] = Field(default_factory=list, description="[start, end, k] ranges.")
    fixed_fallback_k: int | None = Field(None, description="The best single k over all levels (for engines "
                                                           "that do not honour schedules).")
    verified: bool = False
    summary: str = Field("", description="One paragraph an operator can act on.")


class TuneReport(ReportEnvelope):
    kind: Literal["tune"] = "tune"
    settings: TuneSettings
    off_server: ServerInfo | None = None
    candidates: list[Candidate] = Field(default_factory=list)
    fits: list[LevelFit] = Field(default_factory=list)
    choices: list[LevelChoice] = Field(default_factory=list)
    schedule_ranges_note: str | None = Field(None, description="How the levels became batch-size ranges.")
    recommendation: Recommendation = Field(default_factory=lambda: Recommendation(form="none"))
    configs: list[WrittenConfig] = Field(default_factory=list)
    verification: Verification = Field(default_factory=lambda: Verification(status="not run"))
    diagnosis: Diagnosis | None = Field(None, description="Why the largest k measured was faster or slower, "
                                                          "read through the fitted cost model.")
    partial: bool = Field(False, description="The sweep stopped early; the candidates measured are kept.")
    partial_reason: str | None = None
    notes: list[str] = Field(default_factory=list)

"""The versioned reports (probe, compare/equiv; tune and demo in their own modules) and how
they are saved and read.

Every output format renders from a saved report; a report is written atomically.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from specadapt import __version__
from specadapt.errors import UsageError
from specadapt.records.client_load import ClientLoad
from specadapt.records.diagnosis import Diagnosis
from specadapt.records.identity import PromptIdentity, SpecActivity
from specadapt.records.interference import InterferenceFinding
from specadapt.records.load import Goodput, GoodputComparison, LoadSettings, RateLevel, SendLag
from specadapt.records.passes import SpeculationSeen
from specadapt.records.metrics import (
    AcceptanceSummary,
    Crossover,
    LatencySummary,
    RatioCI,
)
from specadapt.records.requests import RequestRecord, RequestSettings
from specadapt.records.scale import ScaleLayout
from specadapt.records.sequential import SequentialDesign, SequentialOutcome
from specadapt.records.server import CounterSnapshot, ServerInfo
from specadapt.records.workload import WorkloadInfo

SCHEMA_VERSION = 1
"""Raised when a saved field changes its meaning or goes. A field added with a default (as
``CompareReport.sections``) keeps the version: older reports read as before, older readers ignore it."""


class ProbeSettings(BaseModel):
    concurrency: int
    repeat: int
    warmup: int
    prompts_source: str
    request: RequestSettings
    load: LoadSettings | None = None
    workload: WorkloadInfo | None = None
    show: int = Field(1, ge=0, description="Answers drawn pass by pass in the reports (--show).")


class ReportEnvelope(BaseModel):
    """What every report starts with: schema version, kind, who wrote it and when."""

    schema_version: int = SCHEMA_VERSION
    kind: str
    specadapt_version: str = __version__
    created_at: str = Field(default_factory=lambda: _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"))


class ProbeReport(ReportEnvelope):
    """One probe run against one server."""

    kind: Literal["probe"] = "probe"
    server: ServerInfo
    settings: ProbeSettings
    partial: bool = Field(False, description="The run stopped early (the server died); only finished requests are in.")
    partial_reason: str | None = Field(None, description="Why the run is partial, with the server's exit code.")
    latency: LatencySummary = Field(description="Requests answered on their first send (all of them with retries off).")
    latency_retried: LatencySummary | None = Field(
        None, description="Requests that needed more than one send (retries on); kept apart, their times include the waits.")
    failures: dict[str, int] = Field(default_factory=dict, description="Failed requests per error kind (HTTP errors per status: http_429, ...).")
    by_category: dict[str, LatencySummary] = Field(default_factory=dict)
    acceptance: AcceptanceSummary
    counters_before: CounterSnapshot
    counters_after: CounterSnapshot
    token_sources: dict[str, int] = Field(default_factory=dict, description="Requests per token-count source.")
    goodput: Goodput | None = Field(None, description="With --slo: requests within every SLO per second, all levels.")
    rates: list[RateLevel] = Field(default_factory=list, description="With --request-rate: figures per arrival rate.")
    notes: list[str] = Field(default_factory=list)
    client: ClientLoad | None = Field(None, description="The probe client's own CPU and event-loop lag over the "
                                                        "run (one process).")
    scale: ScaleLayout | None = Field(None, description="Worker processes, Ray actors, replicas or merged sources; "
                                                        "None: one process, one server.")
    speculation: SpeculationSeen | None = Field(
        None, exclude_if=lambda v: v is None, description="Speculation per request and per pass of the target "
                                                          "(analysis/passes.py); None: the server says it is off.")
    requests: list[RequestRecord] = Field(default_factory=list)


class CompareSettings(BaseModel):
    concurrency: list[int] = Field(default_factory=lambda: [1], description="Levels of the sweep, ascending.")
    repeat: int = 3
    warmup: int = 1
    request: RequestSettings = Field(default_factory=RequestSettings)
    on_temperature: float | None = Field(None, description="Drill knob: another temperature for the spec-on side.")
    prompts_source: str = "built-in"
    seed: int = 0
    draft_cost: float | None = Field(None, description="Draft/target cost ratio c for theory (ngram: 0).")
    near_tie_threshold: float | None = Field(None, description="Nats; None: the default for the dtype.")
    workload: WorkloadInfo | None = None
    dtype: str | None = Field(None, description="Server dtype, for the default near-tie threshold.")
    triage: bool = True
    reference: str | None = Field(None, description="Local HF model dir for float64 recomputation.")
    interleaved: bool = True
    load: LoadSettings | None = Field(None, description="Arrival rates (levels besides concurrency), --duration, SLOs.")
    workers: int = Field(1, description="Worker processes (with ray_address: Ray actors) that sent each block.")
    ray_address: str | None = Field(None, description="The Ray cluster the workers ran on, when they were Ray actors.")
    interference_check: bool = Field(False, description="Before the run, a short check whether the servers stall "
                                                        "each other's first token (concurrency 1, sides "
                                                        "interleaved; orchestration/interference_check.py).")
    show: int = Field(1, ge=0, description="Spec-on answers drawn pass by pass in the reports (--show).")
    draw_prompts: list[str] = Field(default_factory=list, description="Prompts whose first spec-on answer the "
                                    "reports draw pass by pass besides --show's (the demo's).")
    sequential: SequentialDesign | None = Field(
        None, exclude_if=lambda v: v is None,
        description="Run until decided (--until-decided): the rule that stopped each level; None: the fixed design "
                    "(--repeat passes per level), left out of the JSON.")


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
    model_config = ConfigDict(ser_json_inf_nan="strings")
    concurrency: int = Field(description="Closed-loop level; 0 at an arrival rate.")
    request_rate: float | None = Field(None, description="Arrival-rate level (requests/s, inf: all at once).")
    pairs: int
    speed: SpeedRatios
    by_prompt: list[PromptSpeed] = Field(default_factory=list)
    by_category: dict[str, SpeedRatios] = Field(default_factory=dict, description="Per prompt category, on the "
                                                "level's units (pairs at concurrency 1, block pairs otherwise).")
    send_lag_off: SendLag | None = None
    send_lag_on: SendLag | None = None
    goodput: GoodputComparison | None = None
    off: LatencySummary
    on: LatencySummary
    acceptance: AcceptanceSummary
    theory: TheoryCheck | None = None
    sequential: SequentialOutcome | None = Field(
        None, exclude_if=lambda v: v is None,
        description="How the run-until-decided rule ended at this level (its verdict, units, requests and the "
                    "primary ratio's confidence sequence); None: the fixed design, left out of the JSON.")


class RateBound(BaseModel):
    """What a gate run proves: the exact one-sided upper confidence bound (Clopper-Pearson) on the rate of
    suspect divergences, over the prompts on which speculation took part."""

    exercised_prompts: int = Field(description="Prompts whose compared spec-on answers used accepted drafts.")
    suspect_prompts: int = Field(description="Of those, prompts with a suspect (or untriaged) divergence.")
    confidence: float = Field(description="The bound's confidence level (0.95).")
    upper: float = Field(description="The rate of suspect divergences per prompt is below this at `confidence`.")
    prompts_for: dict[str, int] = Field(default_factory=dict, description="Exercised prompts needed, at the "
                                        "current suspect count, for the bound to reach each rate ('0.01': 1%).")
    exercised_tokens: int | None = Field(None, description="Output tokens of the exercised answers that came from "
                                                           "accepted drafts, where known.")


class PassGate(BaseModel):
    """A gate that is its verdict and its reasons only (`equiv --sampling`, `equiv --features`)."""

    passed: bool
    reasons: list[str] = Field(default_factory=list)


class Gate(BaseModel):
    max_suspect: int = 0
    max_near_tie: int | None = None
    min_speedup: float | None = None
    max_suspect_rate: float | None = Field(None, description="Fail when the bound on the suspect rate is above.")
    allow_inactive: bool = Field(False, description="Pass even where speculation did not run.")
    allow_lossy: bool = Field(False, description="Pass even where the configuration is lossy by design.")
    bound: RateBound | None = None
    passed: bool = True
    reasons: list[str] = Field(default_factory=list)


class CompareReport(ReportEnvelope):
    kind: Literal["compare"] = "compare"
    settings: CompareSettings
    off_server: ServerInfo
    on_server: ServerInfo
    levels: list[LevelResult] = Field(default_factory=list)
    crossover: Crossover | None = None
    rate_levels: list[LevelResult] = Field(default_factory=list, description="Arrival-rate levels (--request-rate).")
    rate_crossover: Crossover | None = Field(None, description="Where spec on stops being faster, in request rate.")
    identity: list[PromptIdentity] = Field(default_factory=list)
    counts: dict[str, int] = Field(default_factory=dict, description="Prompts per identity verdict.")
    activity: SpecActivity | None = Field(None, description="Did speculation run on the spec-on server, and on "
                                                            "which prompts (analysis/activity.py).")
    lossy: list[str] = Field(default_factory=list, description="Settings of the spec-on side that make its output "
                                                               "not the target's by design (analysis/lossy.py).")
    server_exits: list[str] = Field(default_factory=list, description="Servers specadapt started that exited during "
                                                                      "the run, each with the line of its log that "
                                                                      "says why.")
    gate: Gate | None = None
    diagnosis: Diagnosis | None = Field(None, description="Why spec on was faster or slower here, from the "
                                                          "measured figures (analysis/diagnosis.py).")
    interference_check: InterferenceFinding | None = Field(
        None, exclude_if=lambda check: check is None, description="The check before the run: did the servers stall each other's first token "
                          "(analysis/interference.py)? None: not run (left out of the JSON).")
    sections: dict[str, dict[str, Any]] = Field(
        default_factory=dict, exclude_if=lambda sections: not sections,
        description="The results of the analyses registered as report sections (analysis/sections.py), as JSON "
                    "by section name; left out of the JSON when there are none.")
    notes: list[str] = Field(default_factory=list)
    counters_on: dict[int, CounterPair] = Field(default_factory=dict)
    counters_off: dict[int, CounterPair] = Field(default_factory=dict)
    counters_on_rate: dict[str, CounterPair] = Field(default_factory=dict, description="Per request rate ('inf', '2').")
    counters_off_rate: dict[str, CounterPair] = Field(default_factory=dict)
    requests: list[RequestRecord] = Field(default_factory=list)


def atomic_write_text(path: Path, text: str) -> None:
    """Write a file atomically: a temp file in the same directory, flushed to disk, then renamed
    over ``path``; a crash at any point leaves the old file or none, never half a report that a
    staging gate could read as valid."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_report(report: BaseModel, path: Path) -> None:
    """Write a report model as JSON, atomically."""
    atomic_write_text(path, report.model_dump_json(indent=2))


def read_model(path: Path, model: type[BaseModel], what: str):
    """A saved report of one kind, or UsageError saying why the file is not one."""
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"report {path} does not exist")
    try:
        return model.model_validate_json(path.read_text())
    except ValidationError as exc:
        raise UsageError(f"{path} is not a specadapt {what} report ({exc.error_count()} problems; "
                         f"first: {exc.errors()[0]['msg']})") from exc


def report_kind(path: Path) -> str | None:
    """The ``kind`` field of a saved report ("probe", "compare", "tune", "demo"), None if unreadable."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return data.get("kind") if isinstance(data, dict) else None


def read_report(path: Path) -> ProbeReport:
    return read_model(path, ProbeReport, "probe")


def read_compare_report(path: Path) -> CompareReport:
    return read_model(path, CompareReport, "compare")

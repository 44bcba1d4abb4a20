"""The demo report: one machine, one dtype, several spec-off vs spec-on comparisons, each with
the lesson it is there to teach (``specadapt demo``; orchestration/demo.py runs it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from specadapt.records.reports import CompareReport, ReportEnvelope, read_model
from specadapt.records.server import HardwareInfo


class DemoRun(BaseModel):
    """One comparison of the demo: the spec-off server against one spec-on server."""

    name: str = Field(description="Short name: 'ngram', 'draft-model'.")
    title: str = Field(description="What is compared, in words.")
    draft: str = Field(description="What the draft is (the method and k, or the draft model).")
    lesson: str = Field(description="What this comparison is there to show.")
    spec_config: dict[str, Any] = Field(default_factory=dict, description="The spec-on server's "
                                                                          "--speculative-config.")
    seconds: float | None = Field(None, description="Wall time of the run (requests, analysis and triage).")
    compare: CompareReport
    shown_prompts: list[str] = Field(default_factory=list, description="Ids of the prompts whose spec-on answers "
                                                                       "the reports draw pass by pass (the same for "
                                                                       "every run, so they read side by side).")


class DemoTimings(BaseModel):
    """Where the demo's time went, in seconds."""

    draft_s: float = Field(0.0, description="Making (or finding) the truncated draft.")
    servers_s: float = Field(0.0, description="Starting every server until all answered.")
    runs_s: dict[str, float] = Field(default_factory=dict, description="Per run, by name.")
    total_s: float = 0.0


class DemoReport(ReportEnvelope):
    """``specadapt demo``: the well-matched and the poorly-matched draft against the same spec-off server."""

    kind: Literal["demo"] = "demo"
    model: str = Field(description="The target model directory.")
    dtype: str = Field(description="The dtype every server ran in.")
    dtype_reason: str = Field(description="Why that dtype (chosen for the machine, or asked for).")
    hardware: HardwareInfo | None = Field(None, description="The machine the servers ran on, as far as it was read.")
    prompts: list[str] = Field(default_factory=list, description="Ids of the prompts sent.")
    runs: list[DemoRun] = Field(default_factory=list)
    timings: DemoTimings = Field(default_factory=DemoTimings)
    notes: list[str] = Field(default_factory=list)


def read_demo_report(path: Path) -> DemoReport:
    return read_model(path, DemoReport, "demo")

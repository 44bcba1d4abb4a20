"""Canaries of `specadapt watch`: golden answers recorded at staging, and the rounds that judge
a production server's answers against them (analysis/canary.py decides, orchestration/canary.py
asks the servers)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from specadapt.records.identity import Divergence
from specadapt.records.prompts import Prompt
from specadapt.records.reports import ReportEnvelope, read_model, write_report
from specadapt.records.requests import RequestSettings
from specadapt.records.server import ServerInfo

CanaryVerdict = Literal["identical", "near-tie", "unknown", "suspect", "error"]
CANARY_VERDICTS: tuple[CanaryVerdict, ...] = ("identical", "near-tie", "unknown", "error", "suspect")
"""Every canary verdict, from best to worst (a round's verdict is the worst of its results)."""


class GoldenAnswer(BaseModel):
    """One prompt's greedy answer from the spec-off server, with what triage needs later."""

    prompt_id: str
    prompt: Prompt
    api: Literal["chat", "completions"]
    max_tokens: int = Field(description="The max_tokens the answer was asked with (a canary asks the same).")
    text: str
    tokens: list[str] = Field(description="Tokens as the server named them ('token_id:N' where the backend "
                                          "gives ids).")
    top_logprobs: list[dict[str, float]] = Field(
        description="Per position: the server's top logprobs there, the answer's own token included (nats).")
    finish_reason: str | None = None


class GoldenFile(ReportEnvelope):
    """Golden answers of one target (model, dtype, engine), recorded from its spec-off server."""

    kind: Literal["golden"] = "golden"
    server: ServerInfo = Field(description="The server the answers came from, with its speculation state.")
    dtype: str | None = Field(None, description="Server dtype (what it says, else what the user said).")
    near_tie_threshold: float = Field(description="Nats: the default near-tie threshold of the rounds.")
    settings: RequestSettings = Field(description="How the answers were asked (greedy, logprobs, the backend's "
                                                  "token-id keys); a canary asks the same.")
    spec_on_allowed: bool = Field(False, description="Recorded from a spec-on server on purpose (--allow-spec-on).")
    answers: list[GoldenAnswer]


class CanaryResult(BaseModel):
    """One canary prompt judged against its golden answer."""

    prompt_id: str
    verdict: CanaryVerdict
    divergence: Divergence | None = Field(None, description="Where the live answer left the golden one, with its "
                                                            "triage from the golden's logprobs.")
    error: str | None = Field(None, description="verdict error: why there is no answer to judge.")
    compared_tokens: int = Field(0, description="Golden tokens the live answer was held against.")
    note: str = ""


class CanaryRound(BaseModel):
    """A few canary prompts sent one after the other to one server, each judged."""

    server: str = Field(description="Base URL of the server the round asked.")
    started_at: float = Field(description="Unix time (s) the round started.")
    finished_at: float = Field(description="Unix time (s) the round finished.")
    verdict: CanaryVerdict = Field(description="The worst verdict of the results.")
    results: list[CanaryResult] = Field(default_factory=list)
    counts: dict[str, int] = Field(default_factory=dict, description="Results per verdict (every verdict listed).")
    notes: list[str] = Field(default_factory=list)

    @property
    def suspect(self) -> bool:
        return self.verdict == "suspect"


def write_golden(golden: GoldenFile, path: Path) -> None:
    """Write a golden file atomically."""
    write_report(golden, path)


def read_golden(path: Path) -> GoldenFile:
    """A saved golden file, or UsageError saying why the file is not one."""
    return read_model(path, GoldenFile, "golden")

"""The report of `specadapt equiv --sampling`: settings, the servers, the statistics, the gate."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from specadapt.records.metrics import AcceptanceSummary
from specadapt.records.reports import PassGate, ReportEnvelope
from specadapt.records.sampling import SamplingStats
from specadapt.records.server import ServerInfo


class SamplingSettings(BaseModel):
    samples: int = Field(description="Completions drawn per prompt.")
    max_tokens: int = Field(description="Tokens per completion (a prompt's own max_tokens wins); EOS is ignored.")
    alpha: float = Field(description="Family-wise false-alarm rate of the tests.")
    top_logprobs: int = Field(description="K: the source's top-K per position; the rest is lumped.")
    concurrency: int = Field(description="Requests in flight per server.")
    seed: int = Field(description="Sample i is drawn with seed + i; the PIT randomisation uses this seed too.")
    temperature: float = Field(1.0, description="Always 1: prompt logprobs are the raw distribution.")
    top_p: float = Field(1.0, description="Always 1, for the same reason.")
    request_timeout_s: float
    prompts_source: str = "built-in"
    source: Literal["server", "reference"] = Field(
        description="Where p comes from: the spec-off server's prompt_logprobs, or --reference in float64.")
    reference: str | None = Field(None, description="Local HF model dir recomputing p (--reference).")
    tokenizer: str = Field(description="What turned the prompts into ids: a server's /tokenize or the local one.")
    bins: int = 20
    power: float = 0.8
    tv_targets: list[float] = Field(default_factory=lambda: [0.01, 0.02, 0.05])


class PromptTokens(BaseModel):
    """How many sampled tokens one prompt contributed."""

    prompt_id: str
    category: str
    prompt_tokens: int
    samples: int
    tokens: int
    in_top_k: int = Field(description="Sampled tokens that were among the source's top K at their position.")


SamplingGate = PassGate  # the one pass/fail gate (records/reports.py)


class SamplingReport(ReportEnvelope):
    kind: Literal["sampling"] = "sampling"
    settings: SamplingSettings
    on_server: ServerInfo
    source_server: ServerInfo | None = Field(None, description="The spec-off server that scored the samples "
                                                               "(None with --reference and no --off).")
    source: str = Field(description="The source of the target's distribution, in words.")
    stats: SamplingStats
    prompts: list[PromptTokens] = Field(default_factory=list)
    acceptance: AcceptanceSummary | None = Field(
        None, description="The spec-on server's acceptance over the sampling requests: no accepted draft "
                          "means the run did not exercise speculation.")
    notes: list[str] = Field(default_factory=list)
    gate: SamplingGate

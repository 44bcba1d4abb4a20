"""The report of `specadapt equiv --sampling`: settings, the servers, the statistics, the gate."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from specadapt.records.metrics import AcceptanceSummary
from specadapt.records.reports import PassGate, ReportEnvelope
from specadapt.records.sampling import SamplingStats, SamplingStatus
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
    looks: int | None = Field(
        None, description="With --until-decided: the samples are sent in this many equal batches and tested after "
                          "each; an interim look stops the run only to reject. None: all samples, one test.")


class PromptTokens(BaseModel):
    """How many sampled tokens one prompt contributed."""

    prompt_id: str
    category: str
    prompt_tokens: int
    samples: int
    tokens: int
    in_top_k: int = Field(description="Sampled tokens that were among the source's top K at their position.")


class SamplingLook(BaseModel):
    """One look of a run with --until-decided: the test on every sample sent so far."""

    look: int = Field(description="1, 2, ...")
    samples: int = Field(description="Samples sent and scored so far.")
    tokens: int
    alpha: float = Field(description="The false-alarm rate this look spends (its three tests at a third each).")
    status: SamplingStatus = Field(description="The verdict at this look's alpha; at an interim look only "
                                               "inconsistent stops the run.")
    smallest_p: float | None = Field(None, description="The smallest p-value of the look's tests (None: too few "
                                                       "tokens to test).")


class SamplingLooks(BaseModel):
    """The design and course of a run with --until-decided."""

    looks: int = Field(description="K: looks planned, the last one on every sample of the fixed design.")
    alphas: list[float] = Field(description="The false-alarm rate of each look; they add up to the run's alpha.")
    stopped_at: int = Field(description="The look the run stopped at (K unless an interim look rejected).")
    samples: int = Field(description="Samples sent (and scored).")
    fixed_samples: int = Field(description="Samples the fixed design (--samples per prompt) sends.")
    history: list[SamplingLook] = Field(default_factory=list)
    text: str = Field(description="The design and where it stopped, in one sentence.")


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
    looks: SamplingLooks | None = Field(None, description="With --until-decided: the looks, their alphas and where "
                                                          "the run stopped; None for the fixed design.")

"""What a streamed request asked for and what happened to it (times in integer nanoseconds)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

TokenSource = Literal["usage", "logprobs", "chunks"]


ErrorKind = Literal["timeout", "http_status", "connect", "disconnect", "malformed", "no_done", "no_tokens",
                    "server_error", "not_sent", "other"]


class RequestSettings(BaseModel):
    max_tokens: int = 128
    temperature: float = 0.0
    seed: int | None = 0
    logprobs: bool = True
    top_logprobs: int = 0
    request_timeout_s: float = Field(300.0, description="Limit per attempt, send to end of stream.")
    retries: int = Field(0, ge=0, description="Resends after 429/5xx or connect errors before any token; 0: off.")
    retry_backoff_s: float = Field(0.5, ge=0, description="Wait before resend n: n times this.")
    extra_body: dict[str, Any] = Field(default_factory=dict,
                                       description="Backend-specific request fields, merged into the body.")


class RequestRecord(BaseModel):
    """What happened to one request. Times are integer nanoseconds from the send."""

    model_config = ConfigDict(ser_json_inf_nan="strings")  # request_rate inf ("all at once") survives JSON

    prompt_id: str
    category: str
    api: Literal["chat", "completions"]
    repeat: int = 0
    turn: int = Field(0, description="Multi-turn conversations: 0 for the first user message, n for turn n.")
    warmup: bool = False
    side: Literal["on", "off", ""] = Field("", description="A/B runs: which server answered.")
    concurrency: int = Field(1, description="Closed-loop level; 0 for an arrival-rate run (see request_rate).")
    request_rate: float | None = Field(None, description="Arrival-rate runs: the rate level (requests/s; inf: "
                                                         "all at once).")
    replica: int = Field(0, description="A/B runs: copy of the prompt within one block at this concurrency.")
    target: str = Field("", description="Runs over several servers (--url repeated, merged reports): the base URL "
                                        "of the server that answered.")
    ok: bool = False
    error: str | None = None
    error_kind: ErrorKind | None = None
    attempts: int = Field(1, description="Sends of this request (more than 1 only with retries on).")
    retried_errors: list[str] = Field(default_factory=list, description="Errors of the earlier attempts.")
    status_code: int | None = None
    sent_at_ns: int = Field(0, description="Send time, ns since the run started.")
    scheduled_at_ns: int | None = Field(None, description="Arrival-rate runs: when the schedule wanted it sent, "
                                                          "ns since the run started (sent_at_ns - this is the lag).")
    chunk_ns: list[int] = Field(default_factory=list, description="Arrival of each chunk that carried tokens.")
    chunk_tokens: list[int] = Field(default_factory=list, description="Tokens in each of those chunks.")
    e2e_ns: int | None = Field(None, description="Send to end of stream.")
    output_tokens: int = 0
    prompt_tokens: int | None = None
    token_source: TokenSource | None = None
    finish_reason: str | None = None
    text: str = ""
    tokens: list[str] = Field(default_factory=list, description="Token strings from logprobs, when asked.")
    token_logprobs: list[float] = Field(default_factory=list)
    top_logprobs: list[dict[str, float]] = Field(default_factory=list)
    spec_drafted: int | None = Field(None, exclude_if=lambda v: v is None, description=(
        "Draft tokens proposed for this request, as the server's own answer states it (vLLM with "
        "--per-request-spec-decode-metrics: metrics.speculative_decoding; SGLang with return_spec_tokens_details: "
        "sglext.spec_tokens_details; llama.cpp: timings.draft_n); None: the answer did not say."))
    spec_accepted: int | None = Field(None, exclude_if=lambda v: v is None,
                                      description="Of those, the draft tokens the target accepted (same source).")
    spec_steps: int | None = Field(None, exclude_if=lambda v: v is None,
                                   description="Verify passes that had a draft (vLLM's num_spec_steps, SGLang's "
                                               "spec_verify_ct), where given.")
    spec_step_accepted: list[int] | None = Field(None, exclude_if=lambda v: v is None, description=(
        "Accepted draft tokens of each verify pass that had a draft, in order, where the answer lists them "
        "(vLLM --per-request-spec-decode-metrics detailed: per_step_accepted)."))
    spec_step_drafted: list[int] | None = Field(None, exclude_if=lambda v: v is None,
                                                description="Draft tokens of each of those passes (per_step_drafted).")
    spec_histogram: list[int] | None = Field(None, exclude_if=lambda v: v is None, description=(
        "Index j: verify passes that accepted exactly j draft tokens, where the answer gives it (vLLM "
        "acceptance_histogram, SGLang spec_correct_drafts_histogram)."))
    spec_k: int | None = Field(None, exclude_if=lambda v: v is None,
                               description="The draft length the answer states (vLLM num_spec_tokens).")

    @property
    def ttft_ns(self) -> int | None:
        return self.chunk_ns[0] if self.chunk_ns else None

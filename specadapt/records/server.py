"""What a server says about itself and its speculative-decoding counters at one moment."""

from __future__ import annotations

from pydantic import BaseModel, Field


class CounterSnapshot(BaseModel):
    """Speculative-decoding and token counters at one moment (summed over label sets).

    ``None`` means the server does not expose that counter.
    """

    drafts: float | None = None
    draft_tokens: float | None = None
    accepted_tokens: float | None = None
    accepted_per_position: dict[int, float] = Field(default_factory=dict)
    generation_tokens: float | None = None
    prompt_tokens: float | None = None
    source: str = Field("", description="Where the numbers came from, e.g. 'GET /metrics (Prometheus text)'.")

    @property
    def has_spec_counters(self) -> bool:
        return self.drafts is not None and self.draft_tokens is not None and self.accepted_tokens is not None


class ServerInfo(BaseModel):
    """What a running server says about itself; ``spec_enabled`` is None when it cannot tell."""

    backend: str
    base_url: str
    version: str | None = None
    model_id: str | None = None
    model_root: str | None = None
    max_model_len: int | None = None
    spec_enabled: bool | None = None
    spec_method: str | None = None
    num_speculative_tokens: int | None = None
    spec_counters: list[str] = Field(default_factory=list, description="Spec-decode counter names found.")
    spec_signal: str | None = Field(None, description="Which server signal told whether speculation is on.")
    metrics_available: bool = False
    notes: list[str] = Field(default_factory=list, description="Plain statements of what could not be told and why.")

"""What the probe client's own process spent on a run: its CPU and its event loop's lag."""

from __future__ import annotations

from pydantic import BaseModel, Field


class ClientLoad(BaseModel):
    """The client's self-report over one run (``specadapt.analysis.client_load.measure_client``).

    A client that is short of CPU reads each chunk late, and every time it records is late
    by as much: these figures say whether the run measured the server or the client."""

    wall_s: float = Field(description="Length of the measured span.")
    cpu_s: float = Field(description="CPU seconds of the client process (all its threads, user + system).")
    chunks: int = Field(0, description="SSE events the client read in the span.")
    cpu_ms_per_chunk: float | None = Field(None, description="cpu_s per chunk, ms; None without chunks.")
    cpu_fraction: float = Field(description="cpu_s / wall_s: 1.0 is one core kept busy.")
    loop_lag_ms_p50: float | None = Field(None, description="How late a 10 ms sleep of the event loop woke, p50.")
    loop_lag_ms_p99: float | None = Field(None, description="The same, p99: the delay a chunk can wait to be read.")
    loop_lag_ms_max: float | None = Field(None, description="The same, the worst wake-up.")
    lag_samples: int = Field(0, description="Wake-ups measured.")

"""How a probe's load was spread: worker processes, Ray actors, replicas, merged reports.

A probe report carries one ``ScaleLayout`` when its load did not come from one event loop
in one process against one server, or when it was merged from several saved reports.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from specadapt.records.metrics import AcceptanceSummary, LatencySummary
from specadapt.records.server import CounterSnapshot, ServerInfo


class WorkerInfo(BaseModel):
    """One worker (a process on this machine or a Ray actor) and its share of the jobs."""

    worker: int
    kind: Literal["process", "ray"]
    pid: int | None = None
    node: str | None = Field(None, description="Host name of the machine the worker ran on.")
    node_id: str | None = Field(None, description="Ray node id (Ray workers only).")
    jobs: int = Field(description="Requests in the worker's share (a conversation's turns each; with --duration, "
                                  "one pass of its jobs).")
    concurrency: int = Field(description="Streams the worker kept open at most.")
    finished: int = Field(0, description="Records that came back from the worker.")
    t0_mono_ns: int | None = Field(None, description="The worker's own monotonic clock at the start of the run; "
                                                     "its records' send times count from here.")
    start_lag_ms: float | None = Field(None, description="Ray: how late after the agreed wall-clock start instant "
                                                         "the worker began (its sleep overshoot).")
    clock_offset_ms: float | None = Field(None, description="Ray: the worker's wall clock minus the driver's, "
                                                            "estimated from a round trip (half the round trip "
                                                            "is the uncertainty).")
    clock_uncertainty_ms: float | None = None
    error: str | None = Field(None, description="Why the worker stopped early, when it did.")


class ReplicaResult(BaseModel):
    """One replica's share of a run: its own latency and acceptance (its counters before/after)."""

    target: str = Field(description="The replica's base URL (RequestRecord.target of its requests).")
    server: ServerInfo
    latency: LatencySummary
    acceptance: AcceptanceSummary
    counters_before: CounterSnapshot
    counters_after: CounterSnapshot


class MergeSource(BaseModel):
    """One saved report that went into a merged report."""

    path: str
    created_at: str
    server: ServerInfo
    requests: int
    partial: bool = False
    replicas: list[str] = Field(default_factory=list, description="Replica URLs of the source run (if several).")


class ScaleLayout(BaseModel):
    """Where the load came from and where it went."""

    executor: Literal["process", "workers", "ray", "merged"] = Field(
        description="process: one event loop here; workers: local worker processes; ray: Ray actors; "
                    "merged: 'specadapt report merge' of several reports.")
    workers_requested: int = 1
    workers: list[WorkerInfo] = Field(default_factory=list)
    ray_address: str | None = None
    replicas: list[ReplicaResult] = Field(default_factory=list,
                                          description="Per replica, when more than one server took requests.")
    sources: list[MergeSource] = Field(default_factory=list, description="Merged reports: each source run.")

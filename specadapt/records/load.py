"""Arrival-rate runs and SLOs: their settings and figures (computed in load/arrivals.py and
analysis/slo.py). Rates may be ``inf`` (all at once): it is written "Infinity" in JSON."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from specadapt.records.metrics import LatencySummary, RatioCI

_INF = ConfigDict(ser_json_inf_nan="strings")


class LoadSettings(BaseModel):
    """Arrival rates, run length and SLOs."""

    model_config = _INF
    request_rates: list[float] = Field(default_factory=list, description="Open-loop levels, requests/s, ascending "
                                                                         "(inf: all at once).")
    burstiness: float = Field(1.0, description="Gamma shape of the gaps between arrivals (1: Poisson).")
    duration_s: float | None = Field(None, description="Send for this long (cycling the prompts) instead of a "
                                                       "fixed count; at a rate it sets the arrivals: ceil(rate * s).")
    seed: int = Field(0, description="Seed of the arrival schedules (both A/B sides get the same).")
    slo_ms: dict[str, float] = Field(default_factory=dict, description="Per-request limits in ms (ttft, tpot, itl, e2e).")


class SendLag(BaseModel):
    """How late requests left against their schedule, and whether the client kept up."""

    model_config = _INF
    requests: int = 0
    p50_ms: float | None = None
    p99_ms: float | None = None
    max_ms: float | None = None
    scheduled_rate: float | None = Field(None, description="Requests/s the schedule asked for "
                                                           "(arrivals after the first over the scheduled span).")
    achieved_rate: float | None = Field(None, description="Requests/s actually sent, the same way over the send times.")
    client_limited: bool = False
    reason: str | None = Field(None, description="Why the run counts as limited by the client.")


class Goodput(BaseModel):
    """Requests meeting every SLO per second, and the share meeting each."""

    slo_ms: dict[str, float]
    requests: int
    good: int
    duration_s: float
    goodput: float | None = Field(None, description="Good requests per second of the run's wall time.")
    share_good: float | None = Field(None, description="Good requests / all requests.")
    share_per_slo: dict[str, float] = Field(default_factory=dict, description="Per SLO: requests meeting it / all.")


class DiffCI(BaseModel):
    """A difference on - off (of shares) with its t interval over ``n`` units."""

    point: float | None
    low: float | None = None
    high: float | None = None
    n: int = 0
    too_few: bool = False


class GoodputComparison(BaseModel):
    """Goodput of both sides at one level and the on/off ratio over units."""

    off: Goodput
    on: Goodput
    ratio: RatioCI = Field(description="goodput on / off (> 1: spec on serves more requests within the SLOs).")
    share_difference: DiffCI = Field(description="Share of good requests, on - off, over the same units.")
    units_without_good: int = Field(0, description="Units left out of the ratio: a side had no good request.")


class RateLevel(BaseModel):
    """A probe's figures at one arrival rate."""

    model_config = _INF
    request_rate: float
    latency: LatencySummary
    send_lag: SendLag
    goodput: Goodput | None = None


def rate_label(rate: float) -> str:
    """'inf', '2', '0.5': how a rate is written in reports."""
    return f"{rate:g}"  # inf -> 'inf'; 2.0 -> '2'; 0.5 -> '0.5'

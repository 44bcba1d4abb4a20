"""What `specadapt watch` reads from a server each interval, and the metrics it exports.

The metric catalogue (``METRICS``) is the one list that the exporter, the alerting rules and
the Grafana dashboard are written from, so a name cannot drift between them. Names follow the
Prometheus conventions: a ``specadapt_`` prefix, snake_case, base units (seconds), ``_ratio``
for a ratio in [0, 1], ``_total`` for counters (prometheus_client adds it), and one name per
meaning with labels for the server and the draft position.

The ``server`` label carries the name given with ``--url NAME=URL`` (else the URL); the fleet
aggregate is exported under ``server="fleet"`` (that name is refused for a server).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from specadapt.records.server import CounterSnapshot

FLEET = "fleet"
"""The ``server`` label value of the aggregate over every watched server."""
PREFIX = "specadapt_"


class MetricSpec(BaseModel):
    """One exported metric: its name as exposed (counters end in ``_total``), type, help and labels."""

    name: str
    kind: Literal["gauge", "counter", "info"]
    help: str
    labels: tuple[str, ...] = ("server",)

    @property
    def family(self) -> str:
        """The name prometheus_client is given (counters without ``_total``, info without ``_info``)."""
        if self.kind == "counter":
            return self.name.removesuffix("_total")
        if self.kind == "info":
            return self.name.removesuffix("_info")
        return self.name


def _m(name: str, kind: Literal["gauge", "counter", "info"], help_: str,
       labels: tuple[str, ...] = ("server",)) -> MetricSpec:
    return MetricSpec(name=PREFIX + name, kind=kind, help=help_, labels=labels)


METRICS: dict[str, MetricSpec] = {m.name.removeprefix(PREFIX): m for m in (
    _m("watch_info", "info", "The specadapt version running the watcher and its settings.",
       ("version", "window_seconds", "interval_seconds")),
    _m("server_up", "gauge", "1 when the last read of the server's metrics succeeded, else 0."),
    _m("server_last_success_timestamp_seconds", "gauge", "Unix time of the last successful read of the server."),
    _m("server_scrape_errors_total", "counter", "Reads of the server's metrics that failed (unreachable, slow, "
                                                "not Prometheus text)."),
    _m("server_restarts_total", "counter", "Counter resets seen (the server restarted): the interval is dropped, "
                                           "never read as a negative rate."),
    _m("speculation_counters", "gauge", "1 when the server exposes draft and accepted-token counters, else 0."),
    _m("drafts_total", "counter", "Verify passes that carried drafts, summed over the server's lifetimes while "
                                  "watched (resets removed)."),
    _m("draft_tokens_total", "counter", "Draft tokens proposed, resets removed."),
    _m("accepted_tokens_total", "counter", "Draft tokens accepted, resets removed."),
    _m("acceptance_ratio", "gauge", "Accepted draft tokens / draft tokens over the window."),
    _m("acceptance_length_tokens", "gauge", "Mean tokens per verify pass over the window: 1 + accepted / drafts "
                                            "(counts the bonus token)."),
    _m("position_acceptance_ratio", "gauge", "Accepted at draft position / verify passes over the window "
                                             "(unconditional).", ("server", "position")),
    _m("draft_tokens_per_second", "gauge", "Draft tokens proposed per second over the window."),
    _m("accepted_tokens_per_second", "gauge", "Draft tokens accepted per second over the window."),
    _m("verify_passes_per_second", "gauge", "Verify passes with drafts per second over the window."),
    _m("generation_tokens_per_second", "gauge", "Generated tokens per second over the window."),
    _m("running_requests", "gauge", "Mean of the server's running batch size over the window."),
    _m("ttft_seconds", "gauge", "Mean time to first token over the window, from the server's own histogram."),
    _m("tpot_seconds", "gauge", "Mean time between output tokens over the window, from the server's own "
                                "histogram."),
    _m("expected_speedup_ratio", "gauge", "Expected TPOT ratio spec-off / spec-on at the live acceptance and "
                                          "batch size, from the baseline's fitted cost model (bound: point, low, "
                                          "high).", ("server", "bound")),
    _m("costing_time", "gauge", "1 when speculation is expected to cost time at this load (the expected speedup's "
                                "upper bound is below 1), else 0."),
    _m("model_best_k", "gauge", "The draft length the baseline's cost model would pick at the live acceptance and "
                                "batch size (0: speculation off)."),
    _m("acceptance_baseline_ratio", "gauge", "Acceptance ratio of the drift test's reference window."),
    _m("acceptance_drift_statistic", "gauge", "One-sided CUSUM of the fall in acceptance, in standard deviations "
                                              "of a block."),
    _m("acceptance_drift_threshold", "gauge", "The CUSUM level that raises the drift alarm (from the stated "
                                              "false-alarm rate)."),
    _m("acceptance_drift", "gauge", "1 while the drift alarm is raised (acceptance fell below its reference), "
                                    "else 0."),
    _m("canary_rounds_total", "counter", "Canary rounds by verdict (identical, near-tie, unknown, error, suspect).",
       ("server", "verdict")),
    _m("canary_suspect", "gauge", "1 when the last canary round had a suspect divergence from the golden "
                                  "answers, else 0."),
    _m("canary_last_round_timestamp_seconds", "gauge", "Unix time of the last finished canary round."),
)}


def metric(key: str) -> MetricSpec:
    """The catalogue entry by short name (without the prefix), e.g. ``metric("acceptance_ratio")``."""
    return METRICS[key]


class HistogramState(BaseModel):
    """A server histogram's running sum and count (label sets summed)."""

    sum: float
    count: float


class LiveSnapshot(BaseModel):
    """One read of a server for the watcher: the spec-decode counters plus what it says about load
    and latency, at a moment of the watcher's clock."""

    at: float = Field(description="Watcher clock (seconds, monotonic) when the read finished.")
    counters: CounterSnapshot
    running: float | None = Field(None, description="Requests in the running batch (a gauge).")
    waiting: float | None = Field(None, description="Requests waiting for the batch (a gauge).")
    ttft: HistogramState | None = None
    tpot: HistogramState | None = Field(None, description="Inter-token latency histogram.")


class WatchServerSummary(BaseModel):
    """One server at the end of a watch."""

    name: str
    url: str
    info: dict | None = Field(None, description="What the server said about itself (ServerInfo), when it answered.")
    reads: int
    errors: int
    restarts: int
    last_error: str | None = None
    spec_counters: bool | None = None
    figures: dict = Field(default_factory=dict, description="The last window's figures (analysis.watch).")
    drift: dict = Field(default_factory=dict, description="Reference mean and sigma, CUSUM statistic, level, "
                                                          "blocks judged and skipped.")
    expectation: dict | None = Field(None, description="Expected speedup at the live load (with --baseline).")
    baseline_refused: str | None = None
    canary_counts: dict[str, int] = Field(default_factory=dict)
    alerts: dict[str, str] = Field(default_factory=dict, description="Alerts raised at the end, with their reason.")


class WatchEvent(BaseModel):
    wall: float = Field(description="Unix time.")
    server: str
    alert: str
    raised: bool
    text: str


class WatchReport(BaseModel):
    """What `specadapt watch --out FILE` writes when it ends (however it ends)."""

    kind: Literal["watch"] = "watch"
    specadapt_version: str
    started_at: str
    ended_at: str
    end_reason: str
    settings: dict
    drift_h: float = Field(description="The CUSUM decision level from the stated false-alarm rate.")
    drift_delay_s: float = Field(description="Expected seconds to the alarm after a fall of the tuned shift.")
    baseline: str | None = None
    fleet: dict = Field(default_factory=dict)
    servers: list[WatchServerSummary] = Field(default_factory=list)
    events: list[WatchEvent] = Field(default_factory=list)
    alerts_raised: int = 0

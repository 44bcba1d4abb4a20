"""The watcher's state as Prometheus metrics (prometheus_client), served over HTTP.

Every metric comes from the catalogue in records/watch.py, so the alerting rules and the
dashboard written from the same catalogue cannot name a metric this exporter does not serve.
The collector reads the watcher's state at scrape time under its lock: a scrape sees one
consistent state and costs no extra read of any server.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.registry import Collector

from specadapt import __version__
from specadapt.analysis.watch import WindowFigures
from specadapt.orchestration.watch import ServerWatch, Watcher
from specadapt.records.watch import FLEET, METRICS


def _family(key: str) -> Metric:
    spec = METRICS[key]
    labels = list(spec.labels)
    if spec.kind == "counter":
        return CounterMetricFamily(spec.family, spec.help, labels=labels)
    if spec.kind == "info":
        return InfoMetricFamily(spec.family, spec.help)
    return GaugeMetricFamily(spec.family, spec.help, labels=labels)


class WatchCollector(Collector):
    def __init__(self, watcher: Watcher):
        self.w = watcher

    def collect(self) -> Iterator[Metric]:
        w = self.w
        fams = {key: _family(key) for key in METRICS}
        s = w.settings
        fams["watch_info"].add_metric([], {"version": __version__, "window_seconds": f"{s.window_s:g}",
                                           "interval_seconds": f"{s.interval_s:g}"})
        now = w.clock()
        with w.lock:
            for sw in w.servers:
                self._server(fams, sw, now)
            self._figures(fams, FLEET, w.fleet(now))
        yield from fams.values()

    def _server(self, fams: dict[str, Metric], sw: ServerWatch, now: float) -> None:
        name = sw.name

        def g(key: str, value: float | None, *extra: str) -> None:
            if value is not None:
                fams[key].add_metric([name, *extra], float(value))

        g("server_up", 1.0 if sw.up else 0.0)
        g("server_last_success_timestamp_seconds", sw.last_success_wall)
        g("server_scrape_errors_total", sw.errors)
        g("server_restarts_total", sw.restarts)
        if sw.has_counters is not None:
            g("speculation_counters", 1.0 if sw.has_counters else 0.0)
        if sw.has_counters:
            g("drafts_total", sw.totals["drafts"])
            g("draft_tokens_total", sw.totals["draft_tokens"])
            g("accepted_tokens_total", sw.totals["accepted"])
        self._figures(fams, name, sw.figures(now))
        exp = sw.expectation
        if exp is not None:
            for bound, value in (("point", exp.point), ("low", exp.low), ("high", exp.high)):
                g("expected_speedup_ratio", value, bound)
            g("costing_time", 1.0 if exp.costing_time else 0.0)
            g("model_best_k", exp.best_k)
        d = sw.drift
        g("acceptance_baseline_ratio", d.mu0)
        if d.mu0 is not None:
            g("acceptance_drift_statistic", d.statistic)
            g("acceptance_drift", 1.0 if d.alarm else 0.0)
        g("acceptance_drift_threshold", d.h)
        if sw.canary is not None:
            for verdict, n in sorted(sw.canary_counts.items()):
                g("canary_rounds_total", n, verdict)
            g("canary_suspect", 1.0 if sw.canary.verdict == "suspect" else 0.0)
            g("canary_last_round_timestamp_seconds", sw.canary.wall)

    @staticmethod
    def _figures(fams: dict[str, Metric], name: str, f: WindowFigures) -> None:
        def g(key: str, value: float | None, *extra: str) -> None:
            if value is not None:
                fams[key].add_metric([name, *extra], float(value))

        g("acceptance_ratio", f.acceptance_rate)
        g("acceptance_length_tokens", f.mean_acceptance_length)
        for i, r in enumerate(f.per_position_rate):
            g("position_acceptance_ratio", r, str(i))
        g("draft_tokens_per_second", f.draft_tokens_per_s)
        g("accepted_tokens_per_second", f.accepted_per_s)
        g("verify_passes_per_second", f.verify_passes_per_s)
        g("generation_tokens_per_second", f.generation_per_s)
        g("running_requests", f.running)
        g("ttft_seconds", f.ttft_s)
        g("tpot_seconds", f.tpot_s)


class Exporter:
    """The /metrics endpoint of one watcher; ``close()`` stops it."""

    def __init__(self, watcher: Watcher, host: str, port: int):
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(WatchCollector(watcher))
        self._server, self._thread = start_http_server(port, addr=host, registry=self.registry)
        self.host, self.port = host, self._server.server_port

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

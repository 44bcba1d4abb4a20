"""What runs beside `specadapt watch`: Prometheus alerting rules, a Grafana dashboard, and the
Kubernetes objects that run the watcher (one pod for a fleet, or a sidecar beside each server).

Every metric name below is taken from the watcher's catalogue (``records.watch.METRICS``), so a
rule or a panel cannot name a series the exporter does not write. Per-server rules exclude the
fleet aggregate (``server="fleet"``).

Formats: a Prometheus rule file (``groups:``; checked with ``promtool check rules``), a Grafana
dashboard JSON model (schema version ``SCHEMA_VERSION``, checked against the schema vendored
under schemas/, see schemas/README.md), and Kubernetes apps/v1 + v1 objects (checked with
``manifest.check_manifests``).
"""

from __future__ import annotations

import json
import re
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from specadapt import __version__
from specadapt.configs import yamlio
from specadapt.errors import UsageError
from specadapt.records.reports import atomic_write_text
from specadapt.records.watch import FLEET, metric

WATCH_PORT = 9400
METRICS_PATH = "/metrics"
DEFAULT_IMAGE = f"specadapt:{__version__}"
"""The watcher's container image unless one is given: an image with specadapt installed
(`pip install specadapt`), built and pushed under this name."""
WATCH_NAME = "specadapt-watch"
SCHEMA_VERSION = 42  # the dashboard JSON model's schemaVersion (Grafana 12)
DASHBOARD_UID = "specadapt-watch"
ALERTS_FILE = "specadapt-alerts.yaml"
DASHBOARD_FILE = "specadapt-dashboard.json"
DEPLOY_FILE = "specadapt-watch.yaml"
SCRAPE = "prometheus.io/scrape"
SCRAPE_PORT = "prometheus.io/port"
SCRAPE_PATH = "prometheus.io/path"
_DURATION = re.compile(r"^(\d+(ms|s|m|h|d|w|y))+$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


def _n(key: str) -> str:
    """The exported name of a catalogue entry (KeyError for a name the catalogue lacks)."""
    return metric(key).name


def _per_server(key: str) -> str:
    return f'{_n(key)}{{server!="{FLEET}"}}'


def _duration(flag: str, value: str) -> str:
    if not isinstance(value, str) or not _DURATION.match(value):
        raise UsageError(f"{flag} {value!r} is not a Prometheus duration: write it like 5m, 1h "
                         "or 90s.")
    return value


# ------------------------------------------------------------------ alerting rules

def alert_rules(*, low_acceptance: float = 0.05, high_acceptance: float = 0.98,
                acceptance_for: str = "15m", target_down_for: str = "5m",
                counters_missing_for: str = "15m", costing_time_for: str = "10m",
                drift_for: str = "5m", canary_for: str = "0m", max_restarts: int = 3,
                restarts_window: str = "1h", watcher_absent_for: str = "10m") -> dict[str, Any]:
    """A Prometheus rule file (one group) alerting on what the watcher exports."""
    if not 0 <= low_acceptance < high_acceptance <= 1:
        raise UsageError(f"acceptance thresholds low {low_acceptance} / high {high_acceptance}"
                         " must satisfy 0 <= low < high <= 1.")
    if max_restarts < 0:
        raise UsageError(f"max restarts {max_restarts} must be 0 or more.")
    for flag, value in (("acceptance for", acceptance_for), ("target-down for", target_down_for),
                        ("counters-missing for", counters_missing_for),
                        ("costing-time for", costing_time_for), ("drift for", drift_for),
                        ("canary for", canary_for), ("restarts window", restarts_window),
                        ("watcher-absent for", watcher_absent_for)):
        _duration(flag, value)
    on_server = "{{ $labels.server }}"
    best_k = (f'{{{{ with printf "{_n("model_best_k")}{{server=%q}}" $labels.server | query }}}}'
              "{{ . | first | value }}{{ else }}unknown{{ end }}")
    baseline = (f'{{{{ with printf "{_n("acceptance_baseline_ratio")}{{server=%q}}" '
                "$labels.server | query }}{{ . | first | value | humanizePercentage }}"
                "{{ else }}unknown{{ end }}")
    rules = [
        _alert("SpeculationWatchTargetDown", f"{_per_server('server_up')} == 0",
               target_down_for, "page",
               f"specadapt watch cannot read the metrics of {on_server}",
               f"The last reads of {on_server}'s metrics endpoint failed for {target_down_for} "
               f"(server_up = {{{{ $value }}}}): the server is down, unreachable from the "
               "watcher, or not serving Prometheus text."),
        _alert("SpeculationCountersMissing", f"{_per_server('speculation_counters')} == 0",
               counters_missing_for, "ticket",
               f"{on_server} exposes no speculative-decoding counters",
               f"For {counters_missing_for} {on_server} has served metrics without draft and "
               "accepted-token counters (value {{ $value }}): speculation is off, or the "
               "server version names them differently, so acceptance cannot be watched."),
        _alert("SpeculationCostingTime", f"{_per_server('costing_time')} == 1",
               costing_time_for, "ticket",
               f"Speculation is expected to cost time on {on_server}",
               f"At the live acceptance and batch size the upper bound of the expected speedup "
               f"on {on_server} has been below 1 for {costing_time_for} (costing_time = "
               f"{{{{ $value }}}}): speculation slows decoding here. The cost model would pick "
               f"draft length {best_k} ({_n('model_best_k')}; 0 means speculation off)."),
        _alert("SpeculationAcceptanceDrift", f"{_per_server('acceptance_drift')} == 1",
               drift_for, "ticket",
               f"Acceptance on {on_server} fell below its reference",
               f"The drift test on {on_server} raised its alarm (acceptance_drift = "
               f"{{{{ $value }}}}): acceptance fell below the reference window's "
               f"{_n('acceptance_baseline_ratio')} ({baseline}), e.g. after a change of traffic,"
               " model or draft."),
        _alert("SpeculationCanaryDivergence", f"{_per_server('canary_suspect')} == 1",
               canary_for, "page",
               f"Canary outputs on {on_server} diverge from the golden answers",
               f"The last canary round on {on_server} had a suspect divergence from the golden "
               "answers (canary_suspect = {{ $value }}): greedy output with speculation differs "
               "where it must be identical, so the server may be returning wrong text."),
        _alert("SpeculationAcceptanceLow", f"{_per_server('acceptance_ratio')} < {low_acceptance}",
               acceptance_for, "ticket",
               f"Acceptance on {on_server} is very low",
               f"Draft acceptance on {on_server} has been {{{{ $value | humanizePercentage }}}}, "
               f"below {low_acceptance:g}, for {acceptance_for}: the draft and target disagree "
               "almost always, which can mean a mismatched draft or garbage output."),
        _alert("SpeculationAcceptanceHigh", f"{_per_server('acceptance_ratio')} > {high_acceptance}",
               acceptance_for, "ticket",
               f"Acceptance on {on_server} is suspiciously high",
               f"Draft acceptance on {on_server} has been {{{{ $value | humanizePercentage }}}}, "
               f"above {high_acceptance:g}, for {acceptance_for}: almost every draft token is "
               "accepted, which can mean the model is stuck in a repetition loop."),
        _alert("SpeculationServerRestarts",
               f"increase({_per_server('server_restarts_total')}[{restarts_window}]) > "
               f"{max_restarts}", "0m", "ticket",
               f"{on_server} restarted repeatedly",
               f"{{{{ $value | humanize }}}} counter resets (restarts) of {on_server} in the last "
               f"{restarts_window}, more than {max_restarts}: the server is crash-looping or "
               "being rescheduled."),
        _alert("SpeculationWatcherAbsent", f"absent({_n('watch_info')})", watcher_absent_for,
               "page", "specadapt watch is not being scraped",
               f"No {_n('watch_info')} series for {watcher_absent_for}: the watcher is down or "
               "Prometheus does not scrape it, so none of the other speculation alerts can "
               "fire."),
    ]
    return {"groups": [{"name": "specadapt-speculation", "rules": rules}]}


def _alert(name: str, expr: str, for_: str, severity: str, summary: str,
           description: str) -> dict[str, Any]:
    return {"alert": name, "expr": expr, "for": for_, "labels": {"severity": severity},
            "annotations": {"summary": summary, "description": description}}


# ------------------------------------------------------------------ Grafana dashboard

DS = {"type": "prometheus", "uid": "${datasource}"}
SEL = 'server=~"$server"'


def _q(key: str, extra: str = "") -> str:
    return f"{_n(key)}{{{SEL}{extra}}}"


def _target(expr: str, legend: str, ref: str) -> dict[str, Any]:
    return {"refId": ref, "datasource": DS, "expr": expr, "legendFormat": legend,
            "range": True}


def _timeseries(title: str, targets: list[tuple[str, str]], *, unit: str = "short",
                description: str = "", min_: float | None = None, max_: float | None = None,
                threshold: float | None = None, draw: str = "line") -> dict[str, Any]:
    defaults: dict[str, Any] = {
        "unit": unit,
        "custom": {"drawStyle": draw, "lineWidth": 1, "fillOpacity": 10,
                   "showPoints": "never", "spanNulls": False,
                   "thresholdsStyle": {"mode": "line" if threshold is not None else "off"}},
        "thresholds": {"mode": "absolute", "steps": [{"value": None, "color": "green"}] + (
            [{"value": threshold, "color": "red"}] if threshold is not None else [])},
    }
    if min_ is not None:
        defaults["min"] = min_
    if max_ is not None:
        defaults["max"] = max_
    return {"type": "timeseries", "title": title, "description": description,
            "datasource": DS,
            "targets": [_target(e, legend, chr(ord("A") + i))
                        for i, (e, legend) in enumerate(targets)],
            "fieldConfig": {"defaults": defaults, "overrides": []},
            "options": {"legend": {"displayMode": "list", "placement": "bottom",
                                   "showLegend": True, "calcs": []},
                        "tooltip": {"mode": "multi", "sort": "none"}}}


ALARM = (("green", None), ("red", 1))  # 1 is bad
HEALTH = (("red", None), ("green", 1))  # 1 is good
NEUTRAL = (("blue", None),)


def _stat(title: str, expr: str, *, description: str = "", steps=ALARM,
          mappings: dict[str, str] | None = None, unit: str = "none") -> dict[str, Any]:
    """A stat of the last value per server, coloured by ``steps`` ((colour, from value), ...)."""
    defaults: dict[str, Any] = {
        "unit": unit,
        "thresholds": {"mode": "absolute", "steps": [{"value": v, "color": c}
                                                     for c, v in steps]}}
    if mappings:
        defaults["mappings"] = [{"type": "value", "options": {
            k: {"text": v} for k, v in mappings.items()}}]
    return {"type": "stat", "title": title, "description": description, "datasource": DS,
            "targets": [_target(expr, "{{server}}", "A")],
            "fieldConfig": {"defaults": defaults, "overrides": []},
            "options": {"graphMode": "none", "colorMode": "background", "justifyMode": "auto",
                        "textMode": "value_and_name", "wideLayout": True,
                        "showPercentChange": False, "percentChangeColorMode": "standard",
                        "orientation": "auto",
                        "reduceOptions": {"values": False, "calcs": ["lastNotNull"],
                                          "fields": ""}}}


def _help(*keys: str) -> str:
    return " ".join(f"{_n(k)}: {metric(k).help}" for k in keys)


def _panel_rows() -> list[tuple[int, list[tuple[int, dict[str, Any]]]]]:
    """(height, [(width, panel), ...]) per row of the dashboard."""
    srv = "{{server}}"
    rounds = f'sum by (server, verdict) (increase({_q("canary_rounds_total")}[$__rate_interval]))'
    return [
        (8, [
            (8, _timeseries("Acceptance ratio", [(_q("acceptance_ratio"), srv)],
                            unit="percentunit", min_=0, max_=1,
                            description=_help("acceptance_ratio"))),
            (8, _timeseries("Acceptance length", [(_q("acceptance_length_tokens"), srv)],
                            description=_help("acceptance_length_tokens"), min_=1)),
            (8, _timeseries("Acceptance by draft position",
                            [(_q("position_acceptance_ratio"), "{{server}} pos {{position}}")],
                            unit="percentunit", min_=0, max_=1,
                            description=_help("position_acceptance_ratio"))),
        ]),
        (8, [
            (12, _timeseries("Draft, accepted and verify throughput", [
                (_q("draft_tokens_per_second"), "{{server}} drafted"),
                (_q("accepted_tokens_per_second"), "{{server}} accepted"),
                (_q("verify_passes_per_second"), "{{server}} verify passes"),
                (_q("generation_tokens_per_second"), "{{server}} generated")],
                unit="ops", min_=0,
                description=_help("draft_tokens_per_second", "accepted_tokens_per_second",
                                  "verify_passes_per_second"))),
            (6, _timeseries("Running batch", [(_q("running_requests"), srv)], min_=0,
                            description=_help("running_requests"))),
            (6, _timeseries("TTFT and TPOT", [(_q("ttft_seconds"), "{{server}} TTFT"),
                                             (_q("tpot_seconds"), "{{server}} TPOT")],
                            unit="s", min_=0, description=_help("ttft_seconds", "tpot_seconds"))),
        ]),
        (8, [
            (12, _timeseries("Expected speedup (spec-off / spec-on TPOT)", [
                (_q("expected_speedup_ratio", ', bound="point"'), "{{server}}"),
                (_q("expected_speedup_ratio", ', bound="low"'), "{{server}} low"),
                (_q("expected_speedup_ratio", ', bound="high"'), "{{server}} high")],
                threshold=1, description=_help("expected_speedup_ratio")
                + " Below the line at 1 speculation costs time.")),
            (6, _stat("Costing time", _q("costing_time"), description=_help("costing_time"),
                      mappings={"0": "saves time", "1": "COSTS TIME"})),
            (6, _stat("Draft length the model would pick", _q("model_best_k"),
                      steps=NEUTRAL, description=_help("model_best_k"))),
        ]),
        (8, [
            (12, _timeseries("Acceptance drift: statistic vs threshold", [
                (_q("acceptance_drift_statistic"), "{{server}} CUSUM"),
                (_q("acceptance_drift_threshold"), "{{server}} threshold"),
                (_q("acceptance_baseline_ratio"), "{{server}} baseline acceptance")],
                description=_help("acceptance_drift_statistic", "acceptance_drift_threshold",
                                  "acceptance_baseline_ratio"))),
            (6, _stat("Drift alarm", _q("acceptance_drift"), description=_help("acceptance_drift"),
                      mappings={"0": "ok", "1": "DRIFT"})),
            (6, _stat("Canary suspect", _q("canary_suspect"), description=_help("canary_suspect"),
                      mappings={"0": "ok", "1": "SUSPECT"})),
        ]),
        (8, [
            (8, _timeseries("Canary rounds by verdict", [(rounds, "{{server}} {{verdict}}")],
                            draw="bars", min_=0, description=_help("canary_rounds_total"))),
            (4, _stat("Server up", _q("server_up"), steps=HEALTH, description=_help("server_up"),
                      mappings={"0": "DOWN", "1": "up"})),
            (4, _stat("Speculation counters exposed", _q("speculation_counters"), steps=HEALTH,
                      description=_help("speculation_counters"),
                      mappings={"0": "MISSING", "1": "yes"})),
            (4, _timeseries("Server restarts", [(
                f"increase({_q('server_restarts_total')}[$__rate_interval])", srv)],
                draw="bars", min_=0, description=_help("server_restarts_total"))),
            (4, _timeseries("Scrape errors per second", [(
                f"rate({_q('server_scrape_errors_total')}[$__rate_interval])", srv)],
                unit="ops", min_=0, description=_help("server_scrape_errors_total"))),
        ]),
    ]


def grafana_dashboard(*, title: str = "specadapt: speculative decoding",
                      uid: str = DASHBOARD_UID, refresh: str = "30s",
                      time_from: str = "now-6h") -> dict[str, Any]:
    """A Grafana dashboard JSON model reading a Prometheus data source chosen at import."""
    panels = []
    y = 0
    for height, row in _panel_rows():
        x = 0
        for width, panel in row:
            panels.append({"id": len(panels) + 1, **panel,
                           "gridPos": {"h": height, "w": width, "x": x, "y": y}})
            x += width
        y += height
    server_query = f"label_values({_n('server_up')}, server)"
    variables = [
        {"type": "datasource", "name": "datasource", "label": "Data source",
         "query": "prometheus", "refresh": 1, "hide": 0},
        {"type": "query", "name": "server", "label": "Server", "datasource": DS,
         "query": server_query, "definition": server_query, "refresh": 2, "sort": 1,
         "multi": True, "includeAll": True, "hide": 0},
    ]
    return {
        "id": None, "uid": uid, "title": title,
        "description": "Speculative decoding as seen by specadapt watch.",
        "tags": ["specadapt", "speculative-decoding"], "timezone": "browser",
        "editable": True, "graphTooltip": 1, "schemaVersion": SCHEMA_VERSION, "version": 1,
        "refresh": refresh, "time": {"from": time_from, "to": "now"},
        "fiscalYearStartMonth": 0, "liveNow": False, "links": [],
        "annotations": {"list": [{
            "builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"},
            "enable": True, "hide": True, "iconColor": "rgba(0, 211, 255, 1)",
            "name": "Annotations & Alerts", "type": "dashboard"}]},
        "templating": {"list": variables},
        "panels": panels,
    }


def panel_exprs(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, expr) of every query of a dashboard, and of its query variables."""
    out = [(p["title"], t["expr"]) for p in dashboard["panels"] for t in p.get("targets", [])]
    out += [(f"variable {v['name']}", v["query"]) for v in dashboard["templating"]["list"]
            if v["type"] == "query"]
    return out


# ------------------------------------------------------------------ Kubernetes

def _check_urls(urls: list[str]) -> list[str]:
    if not urls:
        raise UsageError("Give the servers to watch: one --url per server (NAME=URL or URL).")
    for u in urls:
        name, sep, url = u.partition("=")
        if not sep or "://" in name:  # a bare URL (an '=' in its query is not a name)
            name, url = "", u
        if not url.startswith(("http://", "https://")):
            raise UsageError(f"--url {u!r} is not an http(s) URL: give e.g. "
                             "vllm-0=http://vllm-0.default.svc:8000.")
        if name == FLEET:
            raise UsageError(f"--url {u!r}: the name {FLEET!r} is kept for the fleet aggregate;"
                             " choose another.")
    return list(urls)


def _check_port(port: int, flag: str = "watch port") -> int:
    if not 1 <= port <= 65535:
        raise UsageError(f"{flag} {port} is not a TCP port (1-65535).")
    return port


def _watch_argv(urls: list[str], port: int) -> list[str]:
    argv = ["specadapt", "watch"]
    for u in urls:
        argv += ["--url", u]
    return argv + ["--listen", f"0.0.0.0:{port}", "--no-console"]


def _container(name: str, image: str, argv: list[str], port: int,
               env: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    probe = {"httpGet": {"path": METRICS_PATH, "port": "metrics"}}
    return {
        "name": name, "image": image, "command": argv,
        "ports": [{"name": "metrics", "containerPort": port, "protocol": "TCP"}],
        "env": [*(env or []), {"name": "SPECADAPT_CACHE_DIR", "value": "/tmp/specadapt"}],
        "readinessProbe": {**probe, "periodSeconds": 10, "failureThreshold": 3},
        "livenessProbe": {**probe, "initialDelaySeconds": 30, "periodSeconds": 30,
                          "failureThreshold": 3},
        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"},
                      "limits": {"cpu": "500m", "memory": "512Mi"}},
        "securityContext": {"runAsNonRoot": True, "runAsUser": 65532, "runAsGroup": 65532,
                            "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                            "capabilities": {"drop": ["ALL"]}},
        "volumeMounts": [{"name": "watch-tmp", "mountPath": "/tmp"}],
    }


_TMP_VOLUME = {"name": "watch-tmp", "emptyDir": {"sizeLimit": "256Mi"}}


def _scrape(port: int) -> dict[str, str]:
    return {SCRAPE: "true", SCRAPE_PORT: str(port), SCRAPE_PATH: METRICS_PATH}


def watch_deployment(urls: list[str], image: str = DEFAULT_IMAGE, namespace: str = "default",
                     port: int = WATCH_PORT, *, name: str = WATCH_NAME) -> list[dict[str, Any]]:
    """A one-replica Deployment watching every URL from one pod, and the Service Prometheus
    scrapes (prometheus.io annotations)."""
    urls = _check_urls(urls)
    _check_port(port)
    for flag, value in (("--namespace", namespace), ("name", name)):
        if not _DNS_LABEL.match(value):
            raise UsageError(f"{flag} {value!r} is not a Kubernetes name: lower-case letters, "
                             "digits and '-', at most 63.")
    labels = {"app.kubernetes.io/name": name, "app.kubernetes.io/component": "monitoring",
              "app.kubernetes.io/part-of": "specadapt"}
    meta = {"name": name, "namespace": namespace, "labels": labels}
    pod = {"securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
           "containers": [_container("watch", image, _watch_argv(urls, port), port)],
           "volumes": [_TMP_VOLUME]}
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta,
                  "spec": {"replicas": 1,
                           "selector": {"matchLabels": {"app.kubernetes.io/name": name}},
                           "template": {"metadata": {"labels": labels}, "spec": pod}}}
    service = {"apiVersion": "v1", "kind": "Service",
               "metadata": {**meta, "annotations": _scrape(port)},
               "spec": {"type": "ClusterIP", "selector": {"app.kubernetes.io/name": name},
                        "ports": [{"name": "metrics", "port": port, "targetPort": "metrics",
                                   "protocol": "TCP"}]}}
    return [deployment, service]


def watch_sidecar(server_port: int, image: str = DEFAULT_IMAGE, *,
                  port: int = WATCH_PORT) -> dict[str, Any]:
    """A container watching the server of its own pod; the pod's name is the server label."""
    _check_port(server_port, "--port")
    _check_port(port)
    if server_port == port:
        raise UsageError(f"--port {server_port} is the watcher's port: serve on another port.")
    pod_name = [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]
    argv = _watch_argv([f"$(POD_NAME)=http://127.0.0.1:{server_port}"], port)
    return _container("specadapt-watch", image, argv, port, env=pod_name)


def _served_templates(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The pod templates that serve the API: a Deployment's or StatefulSet's, an LWS leader's."""
    spec = doc.get("spec") or {}
    if doc.get("kind") in ("Deployment", "StatefulSet"):
        return [spec["template"]]
    if doc.get("kind") == "LeaderWorkerSet":
        return [spec["leaderWorkerTemplate"]["leaderTemplate"]]
    return []


def add_watch_sidecar(text: str, server_port: int, image: str = DEFAULT_IMAGE, *,
                      port: int = WATCH_PORT) -> str:
    """The manifests of ``deploy.render_k8s`` or ``multinode.render_lws`` with the watcher
    beside each server (the leader only, for a LeaderWorkerSet: it serves the API), its port on
    every Service, and the pod's Prometheus scrape annotations naming the watcher's port."""
    sidecar = watch_sidecar(server_port, image, port=port)
    docs = list(yaml.safe_load_all(text))
    found = False
    for doc in docs:
        for tmpl in _served_templates(doc):
            found = True
            pod = tmpl["spec"]
            pod["containers"].append(json.loads(json.dumps(sidecar)))
            pod.setdefault("volumes", []).append(dict(_TMP_VOLUME))
            meta = tmpl.setdefault("metadata", {})
            meta["annotations"] = {**(meta.get("annotations") or {}), **_scrape(port)}
        if doc.get("kind") == "Service":
            doc["spec"]["ports"].append({"name": "metrics", "port": port,
                                         "targetPort": "metrics", "protocol": "TCP"})
    if not found:
        raise UsageError("--watch adds a container to the server's pods, and these manifests "
                         "have none: use --format k8s.")
    return yamlio.dump_all(docs)


# ------------------------------------------------------------------ files

def write_watch_artifacts(out_dir: Path, urls: list[str], image: str = DEFAULT_IMAGE,
                          namespace: str = "default", port: int = WATCH_PORT,
                          **rule_options: Any) -> list[Path]:
    """Write the rule file, the dashboard and the watcher's Deployment + Service into
    ``out_dir``, each atomically; everything is built (and checked) before the first write."""
    texts = {
        ALERTS_FILE: yamlio.dump(alert_rules(**rule_options)),
        DASHBOARD_FILE: json.dumps(grafana_dashboard(), indent=2) + "\n",
        DEPLOY_FILE: yamlio.dump_all(watch_deployment(urls, image, namespace, port)),
    }
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise UsageError(f"{out_dir} is a file: give a directory to write the watch files into.")
    written = []
    for name, text in texts.items():
        atomic_write_text(out_dir / name, text)
        written.append(out_dir / name)
    return written


# ------------------------------------------------------------------ dashboard schema

GRAFANA_SCHEMAS = {"dashboard": "grafana-dashboard.schema.json",
                   "timeseries": "grafana-timeseries.schema.json",
                   "stat": "grafana-stat.schema.json"}


@cache
def grafana_schema(kind: str) -> dict[str, Any]:
    """A vendored Grafana JSON schema (schemas/README.md says where each comes from)."""
    text = resources.files("specadapt.configs").joinpath("schemas", GRAFANA_SCHEMAS[kind])
    return json.loads(text.read_text())


def _errors(schema: dict[str, Any], ref: str | None, doc: Any, where: str) -> list[str]:
    if ref is not None:
        schema = {**schema, "$ref": f"#/definitions/{ref}"}
    out = []
    for err in jsonschema.Draft7Validator(schema).iter_errors(doc):
        while err.context:  # oneOf (a panel or a row): the error that went deepest
            err = max(err.context, key=lambda e: len(e.absolute_path))
        path = "".join(f".{p}" if isinstance(p, str) else f"[{p}]" for p in err.absolute_path)
        out.append(f"{where}{path}: {err.message[:200]}")
    return sorted(out)


def dashboard_problems(dashboard: dict[str, Any]) -> list[str]:
    """The dashboard against Grafana's dashboard schema, and each time series and stat panel's
    options and custom field config against that panel's schema; one line per wrong field."""
    out = _errors(grafana_schema("dashboard"), None, dashboard, "dashboard")
    for i, panel in enumerate(dashboard.get("panels") or []):
        kind = panel.get("type")
        if kind not in ("timeseries", "stat"):
            continue
        schema = grafana_schema(kind)
        out += _errors(schema, "Options", panel.get("options", {}), f"panels[{i}].options")
        if kind == "timeseries":
            custom = ((panel.get("fieldConfig") or {}).get("defaults") or {}).get("custom", {})
            out += _errors(schema, "FieldConfig", custom,
                           f"panels[{i}].fieldConfig.defaults.custom")
    return out

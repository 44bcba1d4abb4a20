"""What `specadapt watch --emit` and `specadapt config --watch` write, checked by the tools that
read them: promtool (rule syntax, and the alert expressions on series), Grafana's dashboard JSON
schema (vendored, schemas/README.md), and the Kubernetes / LWS schemas (check_manifests)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from specadapt.cli import cli
from specadapt.commands.watch_emit import emit, emit_lines
from specadapt.configs import deploy, manifest, multinode
from specadapt.configs import watch as W
from specadapt.configs.multinode import Topology
from specadapt.configs.spec import SpecConfig
from specadapt.errors import UsageError
from specadapt.records.watch import FLEET, METRICS

PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool is not installed (make test installs it with apt-get)")
CATALOGUE = {m.name for m in METRICS.values()}
NAME = re.compile(r"\bspecadapt_[a-z0-9_]+")
SPEC = SpecConfig(target="meta-llama/Llama-3.1-8B-Instruct", method="eagle3", k=3,
                  draft="yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", tp=2)
URLS = ["vllm-0=http://vllm-0.default.svc.cluster.local:8000",
        "http://vllm-1.default.svc.cluster.local:8000"]
ALERTS = ["SpeculationWatchTargetDown", "SpeculationCountersMissing", "SpeculationCostingTime",
          "SpeculationAcceptanceDrift", "SpeculationCanaryDivergence", "SpeculationAcceptanceLow",
          "SpeculationAcceptanceHigh", "SpeculationServerRestarts", "SpeculationWatcherAbsent"]


def _promtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=60)


def _rules() -> list[dict]:
    return W.alert_rules()["groups"][0]["rules"]


def unknown_names(text: str) -> set[str]:
    """specadapt_* names in ``text`` that the metric catalogue does not export."""
    return set(NAME.findall(text)) - CATALOGUE


# ------------------------------------------------------------------ names from the catalogue

def test_rules_and_dashboard_name_only_catalogue_metrics():
    rules_text = json.dumps(W.alert_rules())
    dash_text = json.dumps(W.grafana_dashboard())
    assert NAME.findall(rules_text) and NAME.findall(dash_text)
    assert unknown_names(rules_text) == set()
    assert unknown_names(dash_text) == set()
    # the check itself catches a name the exporter does not write
    assert unknown_names('rate(specadapt_drafts_total[5m]) / specadapt_draft_total') == \
        {"specadapt_draft_total"}


def test_dashboard_shows_every_exported_series_but_totals_and_timestamps():
    used = set(NAME.findall(json.dumps(W.grafana_dashboard())))
    not_shown = {METRICS[k].name for k in (
        "watch_info", "server_last_success_timestamp_seconds", "drafts_total",
        "draft_tokens_total", "accepted_tokens_total", "canary_last_round_timestamp_seconds")}
    assert used == CATALOGUE - not_shown


def test_an_unknown_catalogue_key_is_an_error_not_a_silent_name():
    with pytest.raises(KeyError):
        W._n("acceptance_rate")


# ------------------------------------------------------------------ alert rules

def test_alert_rules_shape_severity_and_fleet_exclusion():
    rules = _rules()
    assert [r["alert"] for r in rules] == ALERTS
    for r in rules:
        assert set(r) == {"alert", "expr", "for", "labels", "annotations"}
        assert r["labels"]["severity"] in ("page", "ticket")
        assert set(r["annotations"]) == {"summary", "description"}
        if r["alert"] != "SpeculationWatcherAbsent":
            assert f'server!="{FLEET}"' in r["expr"], r["alert"]
            assert "{{ $labels.server }}" in r["annotations"]["description"]
        assert "{{ $value" in r["annotations"]["description"] or r["alert"] == \
            "SpeculationWatcherAbsent"
    by = {r["alert"]: r for r in rules}
    assert by["SpeculationCanaryDivergence"]["labels"]["severity"] == "page"
    assert by["SpeculationWatchTargetDown"]["for"] == "5m"
    assert by["SpeculationCountersMissing"]["for"] == "15m"
    assert by["SpeculationCostingTime"]["for"] == "10m"
    assert "specadapt_model_best_k" in by["SpeculationCostingTime"]["annotations"]["description"]
    assert "specadapt_acceptance_baseline_ratio" in \
        by["SpeculationAcceptanceDrift"]["annotations"]["description"]
    assert by["SpeculationAcceptanceLow"]["expr"].endswith("< 0.05")
    assert by["SpeculationAcceptanceHigh"]["expr"].endswith("> 0.98")
    assert by["SpeculationServerRestarts"]["expr"] == \
        'increase(specadapt_server_restarts_total{server!="fleet"}[1h]) > 3'
    assert by["SpeculationWatcherAbsent"]["expr"] == "absent(specadapt_watch_info)"


def test_alert_thresholds_and_durations_are_parameters():
    rules = {r["alert"]: r for r in W.alert_rules(
        low_acceptance=0.1, high_acceptance=0.9, acceptance_for="30m", max_restarts=5,
        restarts_window="2h")["groups"][0]["rules"]}
    assert rules["SpeculationAcceptanceLow"]["expr"].endswith("< 0.1")
    assert rules["SpeculationAcceptanceHigh"]["expr"].endswith("> 0.9")
    assert rules["SpeculationAcceptanceHigh"]["for"] == "30m"
    assert rules["SpeculationServerRestarts"]["expr"].endswith("[2h]) > 5")


@pytest.mark.parametrize("kw, words", [
    ({"low_acceptance": 0.9, "high_acceptance": 0.5}, "0 <= low < high <= 1"),
    ({"high_acceptance": 1.5}, "0 <= low < high <= 1"),
    ({"acceptance_for": "15 minutes"}, "not a Prometheus duration"),
    ({"max_restarts": -1}, "0 or more"),
])
def test_bad_rule_parameters_are_one_line_usage_errors(kw, words):
    with pytest.raises(UsageError) as exc:
        W.alert_rules(**kw)
    assert words in str(exc.value) and "\n" not in str(exc.value)


@needs_promtool
def test_promtool_checks_the_emitted_rule_file(tmp_path):
    paths = emit(tmp_path, URLS)
    proc = _promtool("check", "rules", str(tmp_path / W.ALERTS_FILE))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(ALERTS)} rules found" in proc.stdout
    assert [p.name for p in paths] == [W.ALERTS_FILE, W.DASHBOARD_FILE, W.DEPLOY_FILE]


@needs_promtool
def test_promtool_rejects_a_broken_expression(tmp_path):
    doc = W.alert_rules()
    doc["groups"][0]["rules"][0]["expr"] += " =="  # what a typo in a rule does
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(doc))
    proc = _promtool("check", "rules", str(tmp_path / "bad.yaml"))
    assert proc.returncode != 0 and "parse error" in proc.stdout + proc.stderr


def _expected(rule: dict, server: str, value: str, queried: str | None = None) -> dict:
    """The annotations promtool must render: labels, value (as Prometheus formats it, ``value``
    given already formatted) and a `query` template filled in."""
    out = {}
    for key, text in rule["annotations"].items():
        text = text.replace("{{ $labels.server }}", server)
        text = re.sub(r"\{\{ \$value( \| \w+)? \}\}", value, text)
        if queried is not None:
            text = re.sub(r"\{\{ with printf .*?\{\{ end \}\}", queried, text)
        out[key] = text
    return out


@needs_promtool
def test_promtool_unit_tests_fire_on_bad_series_and_not_on_healthy_ones(tmp_path):
    """CostingTime and CanaryDivergence, evaluated by Prometheus's engine on series: they fire
    for the server whose gauge is 1 for long enough, never for a healthy server, never for the
    fleet aggregate, and not before their `for:`."""
    rules = {r["alert"]: r for r in _rules()}
    (tmp_path / W.ALERTS_FILE).write_text(yaml.safe_dump(W.alert_rules()))
    costing = rules["SpeculationCostingTime"]
    canary = rules["SpeculationCanaryDivergence"]
    tests = {"rule_files": [W.ALERTS_FILE], "evaluation_interval": "1m", "tests": [{
        "interval": "1m",
        "input_series": [
            {"series": 'specadapt_costing_time{server="slow"}', "values": "0 0 1x30"},
            {"series": 'specadapt_costing_time{server="fine"}', "values": "0x32"},
            {"series": f'specadapt_costing_time{{server="{FLEET}"}}', "values": "1x32"},
            {"series": 'specadapt_model_best_k{server="slow"}', "values": "0x32"},
            {"series": 'specadapt_canary_suspect{server="bad"}', "values": "0 0 0 1x10"},
            {"series": 'specadapt_canary_suspect{server="fine"}', "values": "0x13"},
            {"series": f'specadapt_canary_suspect{{server="{FLEET}"}}', "values": "1x13"},
        ],
        "alert_rule_test": [
            # 1 since minute 2: not yet 10m at minute 8, firing at minute 20
            {"eval_time": "8m", "alertname": "SpeculationCostingTime", "exp_alerts": []},
            {"eval_time": "20m", "alertname": "SpeculationCostingTime", "exp_alerts": [{
                "exp_labels": {"severity": "ticket", "server": "slow"},
                "exp_annotations": _expected(costing, "slow", "1", "0")}]},
            {"eval_time": "2m", "alertname": "SpeculationCanaryDivergence", "exp_alerts": []},
            {"eval_time": "4m", "alertname": "SpeculationCanaryDivergence", "exp_alerts": [{
                "exp_labels": {"severity": "page", "server": "bad"},
                "exp_annotations": _expected(canary, "bad", "1")}]},
        ]}]}
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump(tests))
    proc = _promtool("test", "rules", str(tmp_path / "tests.yaml"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout + proc.stderr
    # and the same file fails when the expected alert is wrong (the check can fail)
    tests["tests"][0]["alert_rule_test"][1]["exp_alerts"][0]["exp_labels"]["server"] = "fine"
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump(tests))
    assert _promtool("test", "rules", str(tmp_path / "tests.yaml")).returncode != 0


@needs_promtool
def test_promtool_unit_tests_the_other_seven_alerts_on_series(tmp_path):
    """The remaining rules, evaluated by Prometheus's engine (promtool 2.42, whose ranges include
    their left end): each fires for the server whose series is bad for longer than its `for:`,
    with the value and queried baseline written into its text, and never for a healthy server or
    the fleet aggregate. The restart window holds the four resets at minute 90 and none at 150."""
    rules = {r["alert"]: r for r in _rules()}
    (tmp_path / W.ALERTS_FILE).write_text(yaml.safe_dump(W.alert_rules()))
    n = {k: METRICS[k].name for k in ("server_up", "speculation_counters", "acceptance_drift",
                                     "acceptance_baseline_ratio", "acceptance_ratio",
                                     "server_restarts_total", "watch_info")}

    def s(key: str, server: str, values: str) -> dict:
        return {"series": f'{n[key]}{{server="{server}"}}', "values": values}

    def fires(alert: str, at: str, server: str | None, value: str, queried: str | None = None,
              severity: str = "ticket") -> dict:
        rule = rules[alert]
        labels = {"severity": severity} | ({"server": server} if server else {})
        annotations = _expected(rule, server or "", value, queried)
        return {"eval_time": at, "alertname": alert,
                "exp_alerts": [{"exp_labels": labels, "exp_annotations": annotations}]}

    def quiet(alert: str, at: str) -> dict:
        return {"eval_time": at, "alertname": alert, "exp_alerts": []}

    tests = {"rule_files": [W.ALERTS_FILE], "evaluation_interval": "1m", "tests": [{
        "interval": "1m",
        "input_series": [
            s("server_up", "gone", "1 1 0x30"), s("server_up", "fine", "1x32"),
            s("server_up", FLEET, "0x32"),
            s("speculation_counters", "off", "0x30"), s("speculation_counters", "fine", "1x30"),
            s("speculation_counters", FLEET, "0x30"),
            s("acceptance_drift", "decayed", "0x3 1x20"), s("acceptance_drift", "fine", "0x23"),
            s("acceptance_drift", FLEET, "1x23"),
            s("acceptance_baseline_ratio", "decayed", "0.6x23"),
            s("acceptance_ratio", "garbage", "0.02x30"), s("acceptance_ratio", "loop", "0.99x30"),
            s("acceptance_ratio", "fine", "0.6x30"), s("acceptance_ratio", FLEET, "0.01x30"),
            # four resets between minutes 41 and 44, then steady: inside [30m, 90m], outside [90m, 150m]
            s("server_restarts_total", "crashing", "0x40 1 2 3 4x120"),
            s("server_restarts_total", "once", "0x40 1x123"),
            s("server_restarts_total", FLEET, "0x40 10 20 30 40x120"),
            # scraped for 5 minutes, then gone (stale after the 5-minute lookback)
            {"series": n["watch_info"] + '{version="test"}', "values": "1x5"},
        ],
        "alert_rule_test": [
            quiet("SpeculationWatchTargetDown", "5m"),
            fires("SpeculationWatchTargetDown", "10m", "gone", "0", severity="page"),
            quiet("SpeculationCountersMissing", "10m"),
            fires("SpeculationCountersMissing", "20m", "off", "0"),
            quiet("SpeculationAcceptanceDrift", "6m"),
            fires("SpeculationAcceptanceDrift", "12m", "decayed", "1", queried="60%"),
            quiet("SpeculationAcceptanceLow", "10m"),
            fires("SpeculationAcceptanceLow", "20m", "garbage", "2%"),
            quiet("SpeculationAcceptanceHigh", "10m"),
            fires("SpeculationAcceptanceHigh", "20m", "loop", "99%"),
            quiet("SpeculationServerRestarts", "40m"),
            fires("SpeculationServerRestarts", "90m", "crashing", "4"),
            quiet("SpeculationServerRestarts", "150m"),
            quiet("SpeculationWatcherAbsent", "5m"),
            quiet("SpeculationWatcherAbsent", "15m"),
            fires("SpeculationWatcherAbsent", "25m", None, "1", severity="page"),
        ]}]}
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump(tests))
    proc = _promtool("test", "rules", str(tmp_path / "tests.yaml"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout + proc.stderr
    # the check can fail: a lower restart threshold fires where the expected list is empty
    (tmp_path / W.ALERTS_FILE).write_text(yaml.safe_dump(W.alert_rules(max_restarts=0)))
    proc = _promtool("test", "rules", str(tmp_path / "tests.yaml"))
    assert proc.returncode != 0 and "SpeculationServerRestarts" in proc.stdout + proc.stderr


# ------------------------------------------------------------------ dashboard

GRAFANA_VARS = {"$server": ".*", "$__rate_interval": "5m", "$__range": "1h", "$__interval": "1m"}


def _as_promql(expr: str) -> str:
    for var, value in GRAFANA_VARS.items():
        expr = expr.replace(var, value)
    assert "$" not in expr, f"a Grafana variable the test does not expand: {expr}"
    return expr


@needs_promtool
def test_every_dashboard_query_parses_as_promql(tmp_path):
    """promtool has no expression-only check: each query goes into a throwaway recording rule."""
    exprs = W.panel_exprs(W.grafana_dashboard())
    assert len(exprs) > 15
    rules = [{"record": f"specadapt:check_{i}", "expr": _as_promql(e)}
             for i, (_, e) in enumerate(exprs) if not e.startswith("label_values(")]
    (tmp_path / "exprs.yaml").write_text(yaml.safe_dump({"groups": [
        {"name": "dashboard", "rules": rules}]}))
    proc = _promtool("check", "rules", str(tmp_path / "exprs.yaml"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(rules)} rules found" in proc.stdout


def test_server_variable_query_uses_the_server_up_metric():
    variables = {v["name"]: v for v in W.grafana_dashboard()["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    srv = variables["server"]
    assert srv["type"] == "query" and srv["multi"] and srv["includeAll"]
    assert srv["query"] == f"label_values({METRICS['server_up'].name}, server)"
    for panel in W.grafana_dashboard()["panels"]:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        for t in panel["targets"]:
            assert 'server=~"$server"' in t["expr"], (panel["title"], t["expr"])


def test_dashboard_passes_grafanas_dashboard_and_panel_schemas():
    dash = W.grafana_dashboard()
    assert W.dashboard_problems(dash) == []
    assert dash["schemaVersion"] == \
        W.grafana_schema("dashboard")["definitions"]["Dashboard"]["properties"]["schemaVersion"]["default"]


@pytest.mark.parametrize("edit, where", [
    (lambda d: d.update(style="dark"), "dashboard: Additional properties"),
    (lambda d: d["panels"][0]["gridPos"].update(w=25), "dashboard.panels[0].gridPos.w"),
    (lambda d: d["templating"]["list"][1].update(type="query-ish"),
     "dashboard.templating.list[1].type"),
    (lambda d: d["panels"][0]["options"]["legend"].pop("showLegend"), "panels[0].options.legend"),
    (lambda d: d["panels"][0]["fieldConfig"]["defaults"]["custom"].update(drawStyle="dots"),
     "panels[0].fieldConfig.defaults.custom.drawStyle"),
    (lambda d: next(p for p in d["panels"] if p["type"] == "stat")["options"].pop("reduceOptions"),
     "options: 'reduceOptions' is a required property"),
])
def test_schema_check_names_the_wrong_field(edit, where):
    dash = W.grafana_dashboard()
    edit(dash)
    problems = W.dashboard_problems(dash)
    assert any(where in p for p in problems), problems


def test_panels_tile_the_grid_without_overlap():
    cells: dict[tuple[int, int], str] = {}
    panels = W.grafana_dashboard()["panels"]
    for p in panels:
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24, p["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{p['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = p["title"]
    assert len({p["id"] for p in panels}) == len(panels)


def test_dashboard_panels_the_brief_asks_for():
    titles = {p["title"]: p for p in W.grafana_dashboard()["panels"]}
    speed = titles["Expected speedup (spec-off / spec-on TPOT)"]
    assert {t["legendFormat"] for t in speed["targets"]} == \
        {"{{server}}", "{{server}} low", "{{server}} high"}
    defaults = speed["fieldConfig"]["defaults"]
    assert defaults["custom"]["thresholdsStyle"]["mode"] == "line"
    assert {"value": 1, "color": "red"} in defaults["thresholds"]["steps"]
    drift = titles["Acceptance drift: statistic vs threshold"]
    assert [t["expr"].split("{")[0] for t in drift["targets"][:2]] == \
        [METRICS["acceptance_drift_statistic"].name, METRICS["acceptance_drift_threshold"].name]
    assert "by (server, verdict)" in titles["Canary rounds by verdict"]["targets"][0]["expr"]


# ------------------------------------------------------------------ Kubernetes

def test_fleet_deployment_and_service_pass_the_kubernetes_schemas():
    docs = W.watch_deployment(URLS, "registry.example/specadapt:1", "monitoring")
    assert manifest.check_manifests(docs) == []
    dep, svc = docs
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    assert c["command"] == ["specadapt", "watch", "--url", URLS[0], "--url", URLS[1],
                            "--listen", "0.0.0.0:9400", "--no-console"]
    assert dep["spec"]["replicas"] == 1
    assert c["readinessProbe"]["httpGet"] == c["livenessProbe"]["httpGet"] == \
        {"path": "/metrics", "port": "metrics"}
    assert c["securityContext"]["runAsNonRoot"] is True
    assert svc["metadata"]["annotations"] == {"prometheus.io/scrape": "true",
                                              "prometheus.io/port": "9400",
                                              "prometheus.io/path": "/metrics"}
    assert dep["metadata"]["namespace"] == svc["metadata"]["namespace"] == "monitoring"


@pytest.mark.parametrize("args, words", [
    (([],), "Give the servers to watch"),
    ((["vllm:8000"],), "is not an http(s) URL"),
    (([f"{FLEET}=http://a:8000"],), "kept for the fleet aggregate"),
    ((URLS, W.DEFAULT_IMAGE, "Monitoring"), "is not a Kubernetes name"),
    ((URLS, W.DEFAULT_IMAGE, "default", 70000), "is not a TCP port"),
])
def test_bad_watch_deployment_input_is_one_line(args, words):
    with pytest.raises(UsageError) as exc:
        W.watch_deployment(*args)
    assert words in str(exc.value) and "\n" not in str(exc.value)


@pytest.mark.parametrize("backend, replicas", [("vllm", 1), ("trtllm", 1), ("vllm", 2)])
def test_k8s_with_the_sidecar_passes_the_schemas_and_the_cross_object_rules(backend, replicas):
    text = W.add_watch_sidecar(deploy.render_k8s(SPEC, backend, replicas=replicas), 8000)
    docs = list(yaml.safe_load_all(text))
    assert manifest.check_manifests(docs) == []
    work = next(d for d in docs if d["kind"] in ("Deployment", "StatefulSet"))
    tmpl = work["spec"]["template"]
    server, side = tmpl["spec"]["containers"]
    assert server["name"] == backend and side["name"] == "specadapt-watch"
    assert side["command"][-5:] == ["--url", "$(POD_NAME)=http://127.0.0.1:8000", "--listen",
                                    "0.0.0.0:9400", "--no-console"][-5:]
    assert tmpl["metadata"]["annotations"]["prometheus.io/port"] == "9400"
    services = [d for d in docs if d["kind"] == "Service"]
    assert len(services) == (1 if replicas == 1 else 3)
    for svc in services:
        assert {"name": "metrics", "port": 9400, "targetPort": "metrics", "protocol": "TCP"} \
            in svc["spec"]["ports"]


def test_lws_sidecar_goes_on_the_leader_only_and_passes_the_lws_schema():
    topo = Topology(nodes=2, gpus_per_node=4, pp=2, replicas=2)
    spec = SpecConfig(target="meta-llama/Llama-3.3-70B-Instruct", method="eagle3", k=3,
                      draft="yuhuili/EAGLE3-LLaMA3.3-Instruct-70B", tp=4)
    docs = list(yaml.safe_load_all(W.add_watch_sidecar(multinode.render_lws(spec, topo), 8000)))
    assert manifest.check_manifests(docs) == []
    lwt = docs[0]["spec"]["leaderWorkerTemplate"]
    assert [c["name"] for c in lwt["leaderTemplate"]["spec"]["containers"]] == \
        ["vllm-leader", "specadapt-watch"]
    assert [c["name"] for c in lwt["workerTemplate"]["spec"]["containers"]] == ["vllm-worker"]
    assert lwt["leaderTemplate"]["metadata"]["annotations"]["prometheus.io/port"] == "9400"


def test_a_sidecar_that_breaks_the_pod_is_caught_by_the_checks():
    docs = list(yaml.safe_load_all(W.add_watch_sidecar(deploy.render_k8s(SPEC, "vllm"), 8000)))
    pod = docs[0]["spec"]["template"]["spec"]
    pod["containers"][1]["ports"][0]["containerPort"] = 9500  # annotation still says 9400
    pod["containers"][1]["securityContext"]["runAsNonRoot"] = "yes"
    problems = " ".join(p.message for p in manifest.check_manifests(docs))
    assert "prometheus.io/port is 9400" in problems and "runAsNonRoot" in problems


def test_sidecar_refuses_the_watchers_own_port_and_pods_that_are_not_there():
    with pytest.raises(UsageError, match="is the watcher's port"):
        W.watch_sidecar(9400)
    with pytest.raises(UsageError, match="have none"):
        W.add_watch_sidecar(deploy.render_compose(SPEC, "vllm"), 8000)


# ------------------------------------------------------------------ the CLI and the files

VLLM = ["config", "--backend", "vllm", "--target", "meta-llama/Llama-3.1-8B-Instruct",
        "--method", "ngram", "--k", "3"]


def test_config_watch_k8s_and_lws_from_the_cli(tmp_path):
    res = CliRunner().invoke(cli, [*VLLM, "--format", "k8s", "--watch", "--watch-image",
                                   "registry.example/specadapt:1"])
    assert res.exit_code == 0, res.output
    docs = list(yaml.safe_load_all(res.output))
    side = docs[0]["spec"]["template"]["spec"]["containers"][1]
    assert side["image"] == "registry.example/specadapt:1"
    res = CliRunner().invoke(cli, [*VLLM, "--tp", "4", "--nodes", "2", "--watch", "--out",
                                   str(tmp_path)])
    assert res.exit_code == 0, res.output
    lws = list(yaml.safe_load_all((tmp_path / "lws.yaml").read_text()))
    assert manifest.check_manifests(lws) == []
    leader = lws[0]["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"]
    assert leader[1]["image"] == W.DEFAULT_IMAGE


@pytest.mark.parametrize("extra, words", [
    (["--watch"], "--format yaml has none: add --format k8s"),
    (["--format", "compose", "--watch"], "--format compose has none"),
    (["--format", "k8s", "--watch-image", "x"], "--watch-image sets the image"),
    (["--format", "k8s", "--watch", "--port", "9400"], "--port 9400 is the watcher's port"),
])
def test_config_watch_misuse_is_one_line_exit_2(extra, words):
    res = CliRunner().invoke(cli, [*VLLM, *extra])
    assert res.exit_code == 2, res.output
    (line,) = [ln for ln in res.output.splitlines() if ln.strip()]
    assert line.startswith("error: ") and words in line


def test_trtllm_across_nodes_refuses_watch_with_a_way_out():
    res = CliRunner().invoke(cli, ["config", "--backend", "trtllm", "--target", "/models/m",
                                   "--method", "mtp", "--k", "3", "--tp", "16", "--nodes", "2",
                                   "--watch"])
    assert res.exit_code == 2
    assert "specadapt watch --url" in res.output and "Traceback" not in res.output


def test_config_watch_with_several_formats_puts_the_sidecar_in_k8s_only(tmp_path):
    res = CliRunner().invoke(cli, [*VLLM, "--format", "all", "--watch", "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    assert "specadapt-watch" in (tmp_path / "k8s.yaml").read_text()
    assert "specadapt-watch" not in (tmp_path / "compose.yaml").read_text()


def test_emit_writes_three_files_atomically_and_prints_how_to_load_them(tmp_path):
    out = tmp_path / "watch"
    paths = emit(out, URLS, "registry.example/specadapt:1", "monitoring")
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [W.ALERTS_FILE, W.DASHBOARD_FILE, W.DEPLOY_FILE])  # no temporary files left
    assert W.dashboard_problems(json.loads((out / W.DASHBOARD_FILE).read_text())) == []
    assert manifest.check_manifests(list(yaml.safe_load_all((out / W.DEPLOY_FILE).read_text()))) \
        == []
    assert yaml.safe_load((out / W.ALERTS_FILE).read_text()) == W.alert_rules()
    lines = emit_lines(paths, "monitoring")
    assert lines[:3] == [str(p) for p in paths]
    assert any(f"promtool check rules {out / W.ALERTS_FILE}" in ln for ln in lines)
    assert any(f"kubectl apply -n monitoring -f {out / W.DEPLOY_FILE}" in ln for ln in lines)


def test_emit_takes_name_url_pairs_and_no_image(tmp_path):
    """How `specadapt watch --emit` calls it: parsed (name, url) targets, --image maybe unset."""
    emit(tmp_path, [("a", "http://a:8000"), ("http://b:8000/?x=1", "http://b:8000/?x=1")],
         None)
    (dep, _) = yaml.safe_load_all((tmp_path / W.DEPLOY_FILE).read_text())
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    assert c["image"] == W.DEFAULT_IMAGE
    assert c["command"][2:6] == ["--url", "a=http://a:8000", "--url", "http://b:8000/?x=1"]


def test_emit_with_bad_input_writes_nothing(tmp_path):
    with pytest.raises(UsageError):
        emit(tmp_path / "w", ["not-a-url"])
    with pytest.raises(UsageError):
        emit(tmp_path / "w", URLS, low_acceptance=2)
    assert not (tmp_path / "w").exists()
    (tmp_path / "file").write_text("x")
    with pytest.raises(UsageError, match="is a file"):
        emit(tmp_path / "file", URLS)


def test_emitted_yaml_has_no_aliases(tmp_path):
    emit(tmp_path, URLS)
    for name in (W.ALERTS_FILE, W.DEPLOY_FILE):
        text = (tmp_path / name).read_text()
        assert "&id" not in text and "*id" not in text


def test_vendored_schemas_are_the_files_the_readme_names():
    readme = (Path(W.__file__).parent / "schemas" / "README.md").read_text()
    for file in W.GRAFANA_SCHEMAS.values():
        assert file in readme
        assert (Path(W.__file__).parent / "schemas" / file).is_file()


def test_checked_in_watch_examples_pass_their_checks(repo_root):
    """configs/ (regenerated by `specadapt config examples`; test_examples keeps it current)."""
    k8s = list(yaml.safe_load_all((repo_root / "configs/watch-vllm-eagle3/k8s.yaml").read_text()))
    assert manifest.check_manifests(k8s) == []
    assert len(k8s[0]["spec"]["template"]["spec"]["containers"]) == 2
    fleet = repo_root / "configs" / "watch-fleet"
    assert W.dashboard_problems(json.loads((fleet / W.DASHBOARD_FILE).read_text())) == []
    watcher = list(yaml.safe_load_all((fleet / W.DEPLOY_FILE).read_text()))
    assert manifest.check_manifests(watcher) == []
    urls = [a for a in watcher[0]["spec"]["template"]["spec"]["containers"][0]["command"]
            if "=http" in a]
    assert urls == ["multinode-vllm-eagle3-0=http://vllm-eagle3-leader-0.default.svc.cluster."
                    "local:8000", "multinode-vllm-eagle3-1=http://vllm-eagle3-leader-1.default."
                    "svc.cluster.local:8000"]

"""Deployments across nodes: the LeaderWorkerSet (vLLM), the Slurm script (TensorRT-LLM),
schema validation (Kubernetes 1.33, LWS v0.10.0 CRD) and the cross-field rules, each with
bad input that names the wrong field."""

from __future__ import annotations

import copy
import json
import sys

import pytest
import yaml
from cfg_helpers import make_model_dir
from click.testing import CliRunner

from specadapt.cli import cli
from specadapt.configs import manifest, multinode
from specadapt.configs.files import validate_file
from specadapt.configs.multinode import Topology
from specadapt.configs.spec import SpecConfig
from specadapt.errors import UsageError

SPEC = SpecConfig(target="meta-llama/Llama-3.3-70B-Instruct", method="eagle3", k=3,
                  draft="yuhuili/EAGLE3-LLaMA3.3-Instruct-70B", tp=4)
TOPO = Topology(nodes=2, gpus_per_node=4, pp=2, replicas=3)
VLLM_ARGS = ["config", "--backend", "vllm", "--target", "meta-llama/Llama-3.3-70B-Instruct",
             "--method", "eagle3", "--draft", "yuhuili/EAGLE3-LLaMA3.3-Instruct-70B", "--k", "3"]
TRT_ARGS = ["config", "--backend", "trtllm", "--target", "/models/DeepSeek-R1", "--method",
            "mtp", "--k", "3", "--tp", "16", "--nodes", "2"]


def _docs(text: str = None) -> list[dict]:
    return list(yaml.safe_load_all(text or multinode.render_lws(SPEC, TOPO)))


def _lws(docs):
    return next(d for d in docs if d["kind"] == "LeaderWorkerSet")


def _leader(docs):
    return _lws(docs)["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"][0]


def _worker(docs):
    return _lws(docs)["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0]


def _cli(args):
    return CliRunner().invoke(cli, args)


# ------------------------------------------------------------------ rendering

def test_lws_leader_starts_ray_head_then_the_server_with_speculation_once():
    docs = _docs()
    lws = _lws(docs)
    assert lws["spec"]["replicas"] == 3
    assert lws["spec"]["leaderWorkerTemplate"]["size"] == 2
    cmd = _leader(docs)["command"]
    assert cmd[:2] == ["bash", "-c"] and "leader --ray_cluster_size=$(LWS_GROUP_SIZE)" in cmd[2]
    server = manifest.server_argv(_leader(docs))
    assert server[:3] == ["python3", "-m", "vllm.entrypoints.openai.api_server"]
    assert server[server.index("--tensor-parallel-size") + 1] == "4"
    assert server[server.index("--pipeline-parallel-size") + 1] == "2"
    assert server[server.index("--distributed-executor-backend") + 1] == "ray"
    sc = json.loads(server[server.index("--speculative-config") + 1])
    assert sc == {"method": "eagle3", "model": "yuhuili/EAGLE3-LLaMA3.3-Instruct-70B",
                  "num_speculative_tokens": 3}
    text = yaml.safe_dump_all(docs)
    assert text.count("--speculative-config") == 1  # only the leader's server gets it
    worker = _worker(docs)
    assert "--ray_address=$(LWS_LEADER_ADDRESS)" in worker["command"][2]
    assert "ports" not in worker and "readinessProbe" not in worker


def test_lws_gpus_scrape_and_rdma():
    topo = Topology(nodes=2, gpus_per_node=4, pp=2, rdma=("rdma/ib", 1))
    docs = _docs(multinode.render_lws(SPEC, topo, port=9000))
    for c in (_leader(docs), _worker(docs)):
        assert c["resources"]["limits"] == {"nvidia.com/gpu": 4, "rdma/ib": 1}
        assert c["securityContext"]["capabilities"]["add"] == ["IPC_LOCK"]
    meta = _lws(docs)["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["metadata"]
    assert meta["annotations"]["prometheus.io/port"] == "9000"
    assert meta["annotations"]["prometheus.io/path"] == "/metrics"
    assert _leader(docs)["ports"] == [{"name": "http", "containerPort": 9000}]
    assert "--port" in _leader(docs)["command"]
    assert [d["kind"] for d in docs] == ["LeaderWorkerSet", "Service"]  # one replica


def test_one_service_per_replica_and_the_probe_urls_name_them():
    docs = _docs()
    services = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Service"}
    assert set(services) == {"vllm-eagle3-leader", "vllm-eagle3-leader-0",
                             "vllm-eagle3-leader-1", "vllm-eagle3-leader-2"}
    for i in range(3):
        sel = services[f"vllm-eagle3-leader-{i}"]["spec"]["selector"]
        assert sel[multinode.LWS_GROUP_INDEX_LABEL] == str(i)
    urls = multinode.replica_urls(SPEC, TOPO, namespace="llm", port=8000)
    assert urls == [f"http://vllm-eagle3-leader-{i}.llm.svc.cluster.local:8000"
                    for i in range(3)]
    hint = multinode.probe_hint(SPEC, TOPO, "vllm", namespace="llm")
    probe_lines = [ln for ln in hint.splitlines() if ln.startswith("specadapt probe")]
    assert probe_lines[0].split()[2:] == [x for u in urls for x in ("--url", u)]
    assert probe_lines[1].count("--url") == 3
    single = multinode.replica_urls(SPEC, Topology(2, 4, 2, 1))
    assert single == ["http://vllm-eagle3-leader.default.svc.cluster.local:8000"]


def test_vllm_config_file_carries_pp_and_ray(tmp_path):
    from specadapt.configs import render
    doc = yaml.safe_load(render.render_multinode(SPEC, "vllm", "yaml", TOPO))
    assert doc["tensor-parallel-size"] == 4 and doc["pipeline-parallel-size"] == 2
    assert doc["distributed-executor-backend"] == "ray"
    assert doc["speculative-config"]["method"] == "eagle3"
    one_stage = yaml.safe_load(render.render_multinode(SPEC, "vllm", "yaml", Topology(4, 1)))
    assert "pipeline-parallel-size" not in one_stage


def test_trtllm_slurm_script_and_config():
    spec = SpecConfig(target="/models/DeepSeek-R1", method="mtp", k=3, tp=8,
                      draft_len_schedule={1: 3, 16: 1})
    text = multinode.render_slurm(spec, Topology(nodes=4, gpus_per_node=4, pp=2))
    assert "#SBATCH --nodes=4" in text and "#SBATCH --ntasks-per-node=4" in text
    (srun,) = [ln for ln in text.splitlines() if ln.startswith("srun")]
    assert "--mpi=pmix" in srun
    serve = text.split("    trtllm-llmapi-launch ", 1)[1].split()
    assert serve[:2] == ["trtllm-serve", "/models/DeepSeek-R1"]
    assert serve[serve.index("--tp_size") + 1] == "8"
    assert serve[serve.index("--pp_size") + 1] == "2"
    assert serve[serve.index("--gpus_per_node") + 1] == "4"
    assert serve[-2:] == ["--config", "$SLURM_SUBMIT_DIR/trtllm-config.yaml"]
    assert "/models/DeepSeek-R1:/models/DeepSeek-R1" in text


def test_cli_trtllm_writes_script_config_and_probe_hint(tmp_path):
    res = _cli([*TRT_ARGS, "--draft-len-schedule", '{"1": 3, "16": 2}', "--replicas", "2",
                "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    cfg = yaml.safe_load((tmp_path / "trtllm-config.yaml").read_text())
    assert cfg["speculative_config"] == {"decoding_type": "MTP", "max_draft_len": 3,
                                         "draft_len_schedule": {1: 3, 16: 2}}
    assert (tmp_path / "probe-replicas.sh").read_text().count("--url") == 2
    assert validate_file(tmp_path / "sbatch.sh").ok


def test_cli_trtllm_hf_id_target_warns():
    res = _cli([*TRT_ARGS[:4], "deepseek-ai/DeepSeek-R1", *TRT_ARGS[5:], "--format", "slurm"])
    assert res.exit_code == 0
    assert "warning: --target deepseek-ai/DeepSeek-R1 is not a local path" in res.output


# ------------------------------------------------------------------ topology rules (exit 2)

@pytest.mark.parametrize("extra, field", [
    (["--tp", "4", "--pp", "2", "--nodes", "2", "--gpus-per-node", "8"], "--gpus-per-node 8"),
    (["--tp", "8", "--nodes", "3"], "--gpus-per-node 2 x --nodes 3"),
    (["--tp", "4", "--nodes", "1"], "--nodes 1"),
    (["--tp", "4", "--nodes", "2", "--draft-tp", "2"], "--draft-tp 2"),
    (["--tp", "4", "--replicas", "0"], "--replicas 0"),
    (["--tp", "4", "--pp", "2"], "--pp"),
    (["--tp", "4", "--nodes", "2", "--rdma-resource", "rdma/ib"], "--rdma-resource"),
    (["--tp", "4", "--nodes", "2", "--replicas", "0"], "--replicas 0"),
])
def test_cli_topology_errors_exit_2_naming_the_option(extra, field):
    res = _cli([*VLLM_ARGS, *extra, "--format", "k8s"])
    assert res.exit_code == 2, res.output
    (line,) = [ln for ln in res.output.splitlines() if ln.strip()]
    assert line.startswith("error: " + field)
    assert "Traceback" not in res.output


def test_topology_rule_holds_exactly_when_gpus_equal_ranks():
    ok = Topology(nodes=2, gpus_per_node=4, pp=2)
    assert multinode.check_topology(SPEC, ok) == []
    for bad in (Topology(2, 3, 2), Topology(2, 5, 2), Topology(3, 4, 2)):
        (p,) = multinode.check_topology(SPEC, bad)
        assert "gpus_per_node x nodes equal tp x pp" in p.message
    (p,) = multinode.check_topology(SPEC, Topology(4, 3, 2))
    assert p.message == ("--gpus-per-node 3 x --nodes 4 = 12 GPUs but --tp 4 x --pp 2 = 8 "
                         "ranks: every GPU must hold one rank, so make gpus_per_node x nodes "
                         "equal tp x pp.")
    assert Topology.build(SPEC, nodes=2, pp=2).gpus_per_node == 4
    assert Topology.build(SPEC, nodes=4).gpus_per_node == 1
    with pytest.raises(UsageError, match="--draft-tp 3 must be 1 or the target's --tp"):
        Topology.build(SPEC.model_copy(update={"draft_tp": 3}), nodes=2, pp=2)
    assert multinode.check_topology(SPEC.model_copy(update={"draft_tp": 4}), ok) == []
    assert multinode.check_topology(SPEC.model_copy(update={"draft_tp": 1}), ok) == []


def test_trtllm_has_no_kubernetes_multinode_form():
    res = _cli([*TRT_ARGS, "--format", "k8s"])
    assert res.exit_code == 2 and "use --format slurm" in res.output


def test_draft_with_another_vocabulary_is_refused(tmp_path):
    t = make_model_dir(tmp_path, "target", {"vocab_size": 128256, "hidden_size": 64})
    d = make_model_dir(tmp_path, "draft", {"vocab_size": 32000, "hidden_size": 32})
    args = ["config", "--backend", "vllm", "--target", str(t), "--method", "draft_model",
            "--draft", str(d), "--k", "4", "--tp", "4", "--draft-tp", "1", "--nodes", "2",
            "--format", "k8s"]
    res = _cli(args)
    assert res.exit_code == 2 and "Draft vocab size 32000 differs from the target's 128256" \
        in res.output
    # the same deployment written by hand is refused by config validate
    same = make_model_dir(tmp_path, "draft2", {"vocab_size": 128256, "hidden_size": 32})
    spec = SpecConfig(target=str(t), method="draft_model", draft=str(same), k=4, tp=4,
                      draft_tp=1)
    path = tmp_path / "lws.yaml"
    path.write_text(multinode.render_lws(spec, Topology(2, 2)).replace(str(same), str(d)))
    report = validate_file(path)
    assert not report.ok
    assert any("Draft vocab size 32000" in p.message for p in report.problems)


# ------------------------------------------------------------------ schemas

def test_generated_objects_pass_both_schemas():
    assert manifest.check_manifests(_docs()) == []


@pytest.mark.parametrize("edit, field", [
    (lambda d: d[0]["spec"]["leaderWorkerTemplate"].update(sizee=2),
     "spec.leaderWorkerTemplate: Additional properties are not allowed ('sizee'"),
    (lambda d: d[0]["spec"]["leaderWorkerTemplate"].update(size="two"),
     "spec.leaderWorkerTemplate.size: 'two' is not of type 'integer'"),
    (lambda d: d[0]["spec"]["leaderWorkerTemplate"].update(restartPolicy="Always"),
     "spec.leaderWorkerTemplate.restartPolicy: 'Always' is not one of"),
    (lambda d: d[0]["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0]
     .update(imagePullPolice="Always"),
     "spec.leaderWorkerTemplate.workerTemplate.spec.containers[0]: Additional properties"),
    (lambda d: d[1]["spec"]["ports"][0].update(port="http"),
     "Service vllm-eagle3-leader: spec.ports[0].port: 'http' is not of type 'integer'"),
    (lambda d: d[1]["spec"]["ports"][0].update(protocl="TCP"),
     "Service vllm-eagle3-leader: spec.ports[0]: Additional properties are not allowed ('protocl'"),
])
def test_schema_errors_name_the_field(edit, field):
    docs = _docs(multinode.render_lws(SPEC, Topology(2, 4, 2)))
    edit(docs)
    messages = [p.message for p in manifest.schema_problems(docs)]
    assert any(field in m for m in messages), messages


def test_lws_schema_is_the_packaged_crd_schema():
    schema = manifest.lws_schema()
    lwt = schema["properties"]["spec"]["properties"]["leaderWorkerTemplate"]
    assert lwt["additionalProperties"] is False  # made strict at load
    assert {"size", "leaderTemplate", "workerTemplate", "restartPolicy"} <= set(
        lwt["properties"])


def test_without_kubernetes_validate_services_get_an_install_hint(monkeypatch):
    monkeypatch.setitem(sys.modules, "kubernetes_validate", None)
    docs = _docs()
    docs[0]["spec"]["leaderWorkerTemplate"]["size"] = "two"
    problems = manifest.schema_problems(docs)
    assert any(p.severity == "error" and "leaderWorkerTemplate.size" in p.message
               for p in problems)  # the LWS schema needs no extra
    hints = [p for p in problems if p.severity == "warning"]
    assert len(hints) == 4 and all("pip install 'specadapt[k8s]'" in p.message for p in hints)


# ------------------------------------------------------------------ cross-object rules

def _edited(edit) -> list[str]:
    docs = _docs(multinode.render_lws(SPEC, Topology(2, 4, 2, replicas=2)))
    edit(docs)
    return [p.message for p in manifest.consistency_problems(docs)]


def _set_gpus(docs, which, n):
    c = _leader(docs) if which == "leader" else _worker(docs)
    c["resources"]["limits"]["nvidia.com/gpu"] = n


def _server_flag(docs, flag, value):
    cmd = _leader(docs)["command"]
    cmd[cmd.index(flag) + 1] = value


@pytest.mark.parametrize("edit, field", [
    (lambda d: (_set_gpus(d, "leader", 8), _set_gpus(d, "worker", 8)),
     "resources.limits.nvidia.com/gpu = 8 x spec.leaderWorkerTemplate.size 2 = 16 GPUs but "
     "the server runs tp 4 x pp 2 = 8 ranks"),
    (lambda d: _set_gpus(d, "worker", 2), "leader and workers ask for different GPU counts"),
    (lambda d: _server_flag(d, "--pipeline-parallel-size", "4"), "tp 4 x pp 4 = 16 ranks"),
    (lambda d: _lws(d)["spec"]["leaderWorkerTemplate"].update(size=3),
     "spec.leaderWorkerTemplate.size 3 = 12 GPUs"),
    (lambda d: _server_flag(d, "--port", "8080"),
     "spec.leaderWorkerTemplate.leaderTemplate.spec.containers[0].ports[0].containerPort is "
     "[8000] but the server command listens on --port 8080"),
    (lambda d: _leader(d)["readinessProbe"]["httpGet"].update(port="api"),
     "containers[0].readinessProbe.httpGet.port names port 'api'"),
    (lambda d: _leader(d)["livenessProbe"]["httpGet"].update(port=9999),
     "containers[0].livenessProbe.httpGet.port 9999 is not a containerPort"),
    (lambda d: d[1]["spec"]["ports"][0].update(targetPort="metrics"),
     "Service vllm-eagle3-leader: spec.ports[0].targetPort 'metrics' is not a port"),
    (lambda d: d[2]["spec"]["ports"][0].update(targetPort=8001),
     "Service vllm-eagle3-leader-0: spec.ports[0].targetPort 8001 is not a port"),
    (lambda d: d[1]["spec"]["selector"].update({"specadapt/role": "head"}),
     "Service vllm-eagle3-leader: spec.selector"),
    (lambda d: d[1]["metadata"].update(name="vllm-eagle3"),
     "Service vllm-eagle3: metadata.name 'vllm-eagle3' is the LeaderWorkerSet's name"),
    (lambda d: _lws(d)["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["metadata"]
     ["annotations"].update({"prometheus.io/port": "9090"}),
     "leaderTemplate.metadata.annotations.prometheus.io/port is 9090"),
])
def test_cross_object_rules_name_the_field(edit, field):
    messages = _edited(edit)
    assert any(field in m for m in messages), messages


def test_cross_object_rules_pass_for_generated_and_numeric_ports():
    assert _edited(lambda d: None) == []
    # a numeric targetPort / probe port equal to the containerPort is consistent
    assert _edited(lambda d: (d[1]["spec"]["ports"][0].update(targetPort=8000),
                              _leader(d)["readinessProbe"]["httpGet"].update(port=8000))) == []


def test_selector_matches_workers_is_not_enough_for_targetport():
    # a Service that selects the workers (no ports there) is told so
    messages = _edited(lambda d: d[1]["spec"]["selector"].update({"specadapt/role": "worker"}))
    assert any("targetPort 'http' is not a port of the pods it selects" in m for m in messages)


def test_deployment_gpu_rule(tmp_path):
    from specadapt.configs import deploy
    docs = list(yaml.safe_load_all(deploy.render_k8s(SPEC, "vllm")))
    assert manifest.check_manifests(docs) == []
    bad = copy.deepcopy(docs)
    bad[0]["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"][
        "nvidia.com/gpu"] = 2
    (p,) = manifest.consistency_problems(bad)
    assert "spec.template.spec.containers[0].resources.limits.nvidia.com/gpu = 2" in p.message


def test_config_validate_cli_names_the_field_and_fails(tmp_path):
    docs = _docs()
    _set_gpus(docs, "leader", 8)
    _set_gpus(docs, "worker", 8)
    path = tmp_path / "lws.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    res = _cli(["config", "validate", str(path)])
    assert res.exit_code == 1
    assert "resources.limits.nvidia.com/gpu = 8" in res.output
    assert f"{path}: invalid" in res.output
    path.write_text(multinode.render_lws(SPEC, TOPO))
    res = _cli(["config", "validate", str(path)])
    assert res.exit_code == 0 and res.output.strip() == f"{path}: ok (vllm-argv)"


# ------------------------------------------------------------------ the Slurm script

@pytest.mark.parametrize("old, new, field", [
    ("--ntasks-per-node=8", "--ntasks-per-node=4",
     "#SBATCH --ntasks-per-node=4 x --nodes=2 = 8 MPI ranks but trtllm-serve runs --tp_size 16"),
    ("--nodes=2", "--nodes=3", "x --nodes=3 = 24 MPI ranks"),
    ("--tp_size 16", "--tp_size 8 --pp_size 4", "--tp_size 8 x --pp_size 4 = 32"),
    ("--gpus-per-node=8", "--gpus-per-node=4", "#SBATCH --gpus-per-node=4 differs"),
    ("--gpus_per_node 8", "--gpus_per_node 4", "trtllm-serve --gpus_per_node 4 differs"),
])
def test_slurm_script_rules_name_the_field(tmp_path, old, new, field):
    spec = SpecConfig(target="/models/DeepSeek-R1", method="mtp", k=3, tp=16)
    text = multinode.render_slurm(spec, Topology(nodes=2, gpus_per_node=8))
    assert multinode.slurm_problems(text) == []
    assert old in text
    path = tmp_path / "sbatch.sh"
    path.write_text(text.replace(old, new))
    res = _cli(["config", "validate", str(path)])
    assert res.exit_code == 1 and field in res.output, res.output


_SLURM = SpecConfig(target="/models/DeepSeek-R1", method="mtp", k=3, tp=8)


@pytest.mark.parametrize("header, ok", [
    ("#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=8", True),
    ("#SBATCH -N 2  # two nodes\n#SBATCH --ntasks-per-node 8", True),
    ("#SBATCH --nodes 4 # was --nodes=2\n#SBATCH --ntasks-per-node=8", False),
    ("#SBATCH -N 4 --ntasks-per-node 8", False),  # several options on one line
    ("#SBATCH --nodes 4 --exclusive\n#SBATCH --ntasks-per-node=8", False),
    ("#SBATCH -N 4\n#SBATCH --ntasks-per-node=8", False),
    ("#SBATCH --ntasks-per-node=8", True),   # nodes unknown: nothing to compare
    ("#SBATCH --nodes=4", True),             # tasks unknown
])
def test_slurm_header_forms(header, ok):
    body = "srun --mpi=pmix trtllm-llmapi-launch trtllm-serve /m --tp_size 8 --pp_size 2\n"
    assert (multinode.slurm_problems(header + "\n" + body) == []) is ok


def test_slurm_rule_messages_exact():
    text = "#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=4\nsrun trtllm-serve /m --tp_size 4 --pp_size 4\n"
    (p,) = multinode.slurm_problems(text)
    assert p.message == ("#SBATCH --ntasks-per-node=4 x --nodes=2 = 8 MPI ranks but trtllm-serve "
                         "runs --tp_size 4 x --pp_size 4 = 16: TensorRT-LLM needs one rank per GPU "
                         "of the model, so make them equal.")
    assert multinode.slurm_problems(text.replace("--tp_size 4 ", "--tp_size x ")) == []
    assert multinode.slurm_problems("#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=4\n") == []
    four = multinode.render_slurm(_SLURM, Topology(nodes=4, gpus_per_node=4, pp=2))
    assert multinode.slurm_problems(four) == []


@pytest.mark.parametrize("topo, flag", [
    (Topology(0, 4, 2), "--nodes 0 must be at least 1."),
    (Topology(2, 4, 0), "--pp 0 must be at least 1."),
    (Topology(2, 0, 2), "--gpus-per-node 0 must be at least 1."),
    (Topology(2, 4, 2, replicas=0), "--replicas 0 must be at least 1."),
])
def test_topology_values_below_one(topo, flag):
    assert [p.message for p in multinode.check_topology(SPEC, topo)] == [flag]


def test_single_node_message_exact():
    (p,) = multinode.check_topology(SPEC.model_copy(update={"tp": 8}), Topology(1, 8))
    assert p.message == ("--nodes 1 is a single-node deployment: leave out --nodes (and "
                         "--pp/--gpus-per-node) to get a Deployment, or use --nodes 2 or more.")


def _drop_port_flag(docs):
    cmd = _leader(docs)["command"]
    i = cmd.index("--port")
    del cmd[i:i + 2]


def test_server_port_defaults_to_8000():
    assert _edited(_drop_port_flag) == []  # vLLM's default port is the container port
    messages = _edited(lambda d: (_drop_port_flag(d), _leader(d)["ports"][0].update(
        containerPort=9000), _leader(d)["startupProbe"]["httpGet"].update(port="http")))
    assert any("listens on --port 8000" in m for m in messages), messages


def test_service_selector_edge_cases():
    assert _edited(lambda d: d[1]["spec"].pop("selector")) == []  # no selector: nothing to match
    other = _edited(lambda d: d[1]["spec"]["selector"].update(
        {multinode.LWS_NAME_LABEL: "other-lws"}))
    assert any("Service vllm-eagle3-leader: spec.selector" in m for m in other), other
    same = _edited(lambda d: d[1]["spec"]["selector"].update(
        {multinode.LWS_NAME_LABEL: "vllm-eagle3"}))
    assert same == []


def test_deployment_without_gpu_limit_is_not_a_gpu_error():
    from specadapt.configs import deploy
    docs = list(yaml.safe_load_all(deploy.render_k8s(SPEC, "vllm")))
    c = docs[0]["spec"]["template"]["spec"]["containers"][0]
    c["resources"] = {}
    assert manifest.consistency_problems(docs) == []


# ------------------------------------------------------------------ replicas on one node

def test_single_node_replicas_statefulset_and_one_service_each():
    from specadapt.configs import deploy
    for backend in ("vllm", "trtllm"):
        docs = list(yaml.safe_load_all(deploy.render_k8s(SPEC, backend, replicas=3)))
        assert manifest.check_manifests(docs) == []
        (sts,) = [d for d in docs if d["kind"] == "StatefulSet"]
        assert sts["spec"]["replicas"] == 3
        name = sts["metadata"]["name"]
        services = {d["metadata"]["name"]: d["spec"]["selector"] for d in docs
                    if d["kind"] == "Service"}
        assert set(services) == {name, *(f"{name}-replica-{i}" for i in range(3))}
        for i in range(3):
            assert services[f"{name}-replica-{i}"][deploy.POD_NAME_LABEL] == f"{name}-{i}"
    one = list(yaml.safe_load_all(deploy.render_k8s(SPEC, "vllm")))
    assert [d["kind"] for d in one] == ["Deployment", "Service"]


def test_cli_single_node_replicas_print_the_probe_urls(tmp_path):
    res = _cli([*VLLM_ARGS, "--tp", "4", "--replicas", "2", "--format", "k8s",
                "--namespace", "llm", "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    hint = (tmp_path / "probe-replicas.sh").read_text()
    assert ("specadapt probe --url http://vllm-eagle3-replica-0.llm.svc.cluster.local:8000 "
            "--url http://vllm-eagle3-replica-1.llm.svc.cluster.local:8000") in hint
    assert validate_file(tmp_path / "k8s.yaml").ok
    res = _cli([*VLLM_ARGS, "--tp", "4", "--replicas", "2", "--format", "yaml"])
    assert res.exit_code == 2 and "--replicas applies to the Kubernetes manifest" in res.output


def test_a_kubernetes_version_the_package_lacks_is_a_warning():
    problems = manifest.schema_problems(_docs()[1:2], k8s_version="9.99")
    assert [p.severity for p in problems] == ["warning"]
    assert "no Kubernetes 9.99 schema" in problems[0].message


# ------------------------------------------------------------------ exact messages, edges

LEADER = "spec.leaderWorkerTemplate.leaderTemplate.spec.containers[0]"


def test_cross_object_messages_exact():
    assert _edited(lambda d: _set_gpus(d, "worker", 2)) == [
        "LeaderWorkerSet vllm-eagle3: leader and workers ask for different GPU counts "
        "(spec.leaderWorkerTemplate.leaderTemplate: 4, spec.leaderWorkerTemplate.workerTemplate:"
        " 2): give every pod of the group the same nvidia.com/gpu limit."]
    assert _edited(lambda d: d[1]["metadata"].update(name="vllm-eagle3")) == [
        "Service vllm-eagle3: metadata.name 'vllm-eagle3' is the LeaderWorkerSet's name, which "
        "LWS gives the headless Service behind the pods' DNS names (LWS_LEADER_ADDRESS): rename "
        "it, e.g. 'vllm-eagle3-leader'."]
    assert _edited(lambda d: _leader(d)["startupProbe"]["httpGet"].update(port="api")) == [
        f"LeaderWorkerSet vllm-eagle3: {LEADER}.startupProbe.httpGet.port names port 'api' but "
        "the container declares ['http']: use a declared port name."]
    meta = "spec.leaderWorkerTemplate.leaderTemplate.metadata"
    assert _edited(lambda d: _lws(d)["spec"]["leaderWorkerTemplate"]["leaderTemplate"][
        "metadata"]["annotations"].update({"prometheus.io/port": "9090"})) == [
        f"LeaderWorkerSet vllm-eagle3: {meta}.annotations.prometheus.io/port is 9090 but the "
        "pod's container ports are [8000]: scrape the server's port."]


def test_lws_without_size_counts_one_pod():
    messages = _edited(lambda d: _lws(d)["spec"]["leaderWorkerTemplate"].pop("size"))
    assert any("spec.leaderWorkerTemplate.size 1 = 4 GPUs" in m for m in messages), messages


def test_sidecar_and_portless_containers():
    sidecar = {"name": "log", "image": "busybox"}
    assert _edited(lambda d: _lws(d)["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"][
        "containers"].append(dict(sidecar))) == []

    def portless(d):
        leader = _leader(d)
        del leader["ports"]
        leader["readinessProbe"]["httpGet"]["port"] = "http"
    messages = _edited(portless)
    assert not any("listens on" in m for m in messages), messages
    assert any("names port 'http' but the container declares none" in m for m in messages)


def test_service_rules_exact_and_defaults():
    assert _edited(lambda d: d[1]["spec"]["selector"].update({"specadapt/role": "head"})) == [
        'Service vllm-eagle3-leader: spec.selector {"app.kubernetes.io/name": "vllm-eagle3", '
        '"specadapt/role": "head"} matches no pod template in this file: use the labels of the '
        "pods that serve the API (the leader's, for a LeaderWorkerSet)."]
    assert _edited(lambda d: d[1]["spec"]["ports"][0].update(targetPort="metrics")) == [
        "Service vllm-eagle3-leader: spec.ports[0].targetPort 'metrics' is not a port of the "
        "pods it selects (LeaderWorkerSet vllm-eagle3 spec.leaderWorkerTemplate.leaderTemplate):"
        " use one of ['http']."]
    # no targetPort: Kubernetes targets the Service's own port number
    assert _edited(lambda d: d[1]["spec"]["ports"][0].pop("targetPort")) == []
    messages = _edited(lambda d: (d[1]["spec"]["ports"][0].pop("targetPort"),
                                  d[1]["spec"]["ports"][0].update(port=80)))
    assert any("targetPort 80 is not a port" in m for m in messages), messages


def test_service_finds_the_second_leaderworkerset():
    a = _docs(multinode.render_lws(SPEC, Topology(2, 4, 2), name="a"))
    b = _docs(multinode.render_lws(SPEC, Topology(2, 4, 2), name="b"))
    docs = [a[0], b[0], b[1]]
    b[1]["spec"]["selector"] = {multinode.LWS_NAME_LABEL: "b", multinode.ROLE_LABEL: "leader"}
    assert manifest.consistency_problems(docs) == []


def test_gpu_messages_exact_and_deployment_with_pp():
    assert _edited(lambda d: (_set_gpus(d, "leader", 8), _set_gpus(d, "worker", 8))) == [
        "LeaderWorkerSet vllm-eagle3: spec.leaderWorkerTemplate.workerTemplate.spec.containers[0]"
        ".resources.limits.nvidia.com/gpu = 8 x spec.leaderWorkerTemplate.size 2 = 16 GPUs but "
        "the server runs tp 4 x pp 2 = 8 ranks: make GPUs per pod x size equal tp x pp."]
    from specadapt.configs import deploy
    docs = list(yaml.safe_load_all(deploy.render_k8s(SPEC, "vllm")))
    c = docs[0]["spec"]["template"]["spec"]["containers"][0]
    c["command"] += ["--pipeline-parallel-size", "2"]
    c["resources"]["limits"]["nvidia.com/gpu"] = 8
    assert manifest.consistency_problems(docs) == []
    c["resources"]["limits"]["nvidia.com/gpu"] = 4
    assert [p.message for p in manifest.consistency_problems(docs)] == [
        "Deployment vllm-eagle3: spec.template.spec.containers[0].resources.limits."
        "nvidia.com/gpu = 4 but the server runs tp 4 x pp 2 = 8 ranks: make them equal."]


def test_lws_without_leader_template():
    def worker_only(d):
        lwt = _lws(d)["spec"]["leaderWorkerTemplate"]
        lwt["workerTemplate"] = lwt.pop("leaderTemplate")  # every pod runs the same template
        _leader_spec = lwt["workerTemplate"]["spec"]["containers"][0]
        _leader_spec["resources"]["limits"]["nvidia.com/gpu"] = 8
    messages = _edited(worker_only)
    assert any(m.startswith("LeaderWorkerSet vllm-eagle3: spec.leaderWorkerTemplate."
                            "workerTemplate.spec.containers[0].resources.limits.nvidia.com/gpu"
                            " = 8 x") for m in messages), messages

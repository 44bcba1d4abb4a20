"""Deployments past one node: a LeaderWorkerSet for vLLM, a Slurm batch script for TensorRT-LLM.

vLLM (its docs, deployment/frameworks/lws.md, and examples/online_serving/multi-node-serving.sh,
which the vllm/vllm-openai image ships under /vllm-workspace): one LeaderWorkerSet group per
replica, ``size`` = nodes; the leader starts the Ray head, waits until every worker has
joined, then runs the API server with ``--distributed-executor-backend ray``; the workers
join the head at ``$(LWS_LEADER_ADDRESS)``. The speculative config is passed once, to the
leader's server; the workers only run Ray.

TensorRT-LLM (examples/llm-api/llm_mgmn_trtllm_serve.sh): ``srun --mpi=pmix`` starts one MPI
rank per GPU, ``trtllm-llmapi-launch`` wraps ``trtllm-serve``; rank 0 (the first node of the
allocation) serves the API. TensorRT-LLM documents no Kubernetes form of its own.

Labels LWS puts on the pods it creates (lws v0.10.0,
site/content/en/docs/reference/labels-annotations-and-environment-variables.md):
``leaderworkerset.sigs.k8s.io/name`` and, on leader pods, ``.../group-index``; the env vars
``LWS_LEADER_ADDRESS`` and ``LWS_GROUP_SIZE``.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Any

from specadapt.configs import deploy, manifest, trtllm, vllm, yamlio
from specadapt.configs.checks import Problem
from specadapt.configs.spec import SpecConfig
from specadapt.errors import UsageError

LWS_API = "leaderworkerset.x-k8s.io/v1"
LWS_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"
LWS_GROUP_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/group-index"
ROLE_LABEL = "specadapt/role"
RAY_SCRIPT = "/vllm-workspace/examples/online_serving/multi-node-serving.sh"
# `bash -c SCRIPT ARG0 ARGS...`: after the Ray head is up, exec the server argv that follows,
# so the argv stays a YAML list (one element per flag; the JSON needs no shell quoting)
LEADER_SHELL = (f"bash {RAY_SCRIPT} leader --ray_cluster_size=$(LWS_GROUP_SIZE) "
                '&& exec "$0" "$@"')
WORKER_SHELL = f"bash {RAY_SCRIPT} worker --ray_address=$(LWS_LEADER_ADDRESS)"
METRICS_PATH = "/metrics"
GPU = "nvidia.com/gpu"


@dataclass(frozen=True)
class Topology:
    """How one replica is spread over nodes, and how many replicas."""

    nodes: int
    gpus_per_node: int
    pp: int = 1
    replicas: int = 1
    rdma: tuple[str, int] | None = None  # (resource name, count per pod)

    @classmethod
    def build(cls, spec: SpecConfig, nodes: int, pp: int | None = None,
              gpus_per_node: int | None = None, replicas: int = 1,
              rdma: str | None = None) -> Topology:
        """Fill in what is implied (pp 1; gpus per node = tp x pp / nodes) and check it."""
        pp = 1 if pp is None else pp
        if gpus_per_node is None:
            gpus_per_node = max(1, (spec.tp * pp) // max(nodes, 1))
        topo = cls(nodes, gpus_per_node, pp, replicas, parse_rdma(rdma))
        problems = check_topology(spec, topo)
        if problems:
            raise UsageError(" ".join(p.message for p in problems))
        return topo


def parse_rdma(text: str | None) -> tuple[str, int] | None:
    if text is None:
        return None
    name, sep, count = text.partition("=")
    if not sep or not name or not count.isdigit() or int(count) < 1:
        raise UsageError(f"--rdma-resource '{text}' is not NAME=COUNT: write it like "
                         "rdma/ib=1 (the resource your RDMA device plugin advertises).")
    return name, int(count)


def check_topology(spec: SpecConfig, topo: Topology) -> list[Problem]:
    """Rules a schema cannot express: each names the option to change."""
    out: list[Problem] = []
    for flag, value in (("--nodes", topo.nodes), ("--pp", topo.pp),
                        ("--gpus-per-node", topo.gpus_per_node), ("--replicas", topo.replicas)):
        if value < 1:
            out.append(Problem(f"{flag} {value} must be at least 1."))
    if out:
        return out
    if topo.nodes < 2:
        out.append(Problem("--nodes 1 is a single-node deployment: leave out --nodes (and "
                           "--pp/--gpus-per-node) to get a Deployment, or use --nodes 2 or more."))
    if topo.gpus_per_node * topo.nodes != spec.tp * topo.pp:
        out.append(Problem(
            f"--gpus-per-node {topo.gpus_per_node} x --nodes {topo.nodes} = "
            f"{topo.gpus_per_node * topo.nodes} GPUs but --tp {spec.tp} x --pp {topo.pp} = "
            f"{spec.tp * topo.pp} ranks: every GPU must hold one rank, so make "
            "gpus_per_node x nodes equal tp x pp."))
    if spec.draft_tp is not None and spec.draft_tp not in (1, spec.tp):
        out.append(Problem(f"--draft-tp {spec.draft_tp} must be 1 or the target's --tp "
                           f"({spec.tp}): set --draft-tp 1 or --draft-tp {spec.tp}."))
    return out


def name_of(spec: SpecConfig, backend: str, name: str | None = None) -> str:
    return name or f"{backend}-{spec.method}".replace("_", "-").lower()


# ------------------------------------------------------------------ vLLM: LeaderWorkerSet

def vllm_server_argv(spec: SpecConfig, topo: Topology, version: str | None = None,
                     port: int = 8000) -> list[str]:
    """The leader's API-server argv: the single-node one plus PP and the Ray executor."""
    argv = vllm.render_vllm_argv(spec, version, python="python3", port=port)
    if topo.pp != 1:
        argv += ["--pipeline-parallel-size", str(topo.pp)]
    return argv + ["--distributed-executor-backend", "ray"]


def _resources(topo: Topology) -> dict[str, Any]:
    amounts: dict[str, Any] = {GPU: topo.gpus_per_node}
    if topo.rdma:
        amounts[topo.rdma[0]] = topo.rdma[1]
    return {"limits": dict(amounts), "requests": dict(amounts)}


def _pod(container: dict[str, Any], topo: Topology, model_claim: str) -> dict[str, Any]:
    container["env"] = [{"name": "HF_HOME", "value": f"{deploy.MODEL_MOUNT}/hf-cache"}]
    container["resources"] = _resources(topo)
    if topo.rdma:  # registering memory for RDMA needs to lock pages
        container["securityContext"] = {"capabilities": {"add": ["IPC_LOCK"]}}
    container["volumeMounts"] = [{"name": "models", "mountPath": deploy.MODEL_MOUNT},
                                 {"name": "shm", "mountPath": "/dev/shm"}]
    return {"containers": [container], "volumes": [
        {"name": "models", "persistentVolumeClaim": {"claimName": model_claim}},
        {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}}]}


def render_lws(spec: SpecConfig, topo: Topology, version: str | None = None, *,
               name: str | None = None, image: str | None = None, port: int = 8000,
               model_claim: str = "models") -> str:
    """LeaderWorkerSet + the API Service (+ one Service per replica when replicas > 1)."""
    name = name_of(spec, "vllm", name)
    image = image or deploy.default_image("vllm", version)
    common = {"app.kubernetes.io/name": name, "app.kubernetes.io/component": "inference",
              "specadapt/method": spec.method}
    probe = {"httpGet": {"path": vllm.HEALTH_ROUTE, "port": "http"}}
    leader = {
        "name": "vllm-leader", "image": image,
        "command": ["bash", "-c", LEADER_SHELL, *vllm_server_argv(spec, topo, version, port)],
        "ports": [{"name": "http", "containerPort": port}],
        # Ray start, weight loading over the network and graph capture: allow 60 minutes
        "startupProbe": {**probe, "periodSeconds": 10, "failureThreshold": 360},
        "readinessProbe": {**probe, "periodSeconds": 10, "failureThreshold": 3},
        "livenessProbe": {**probe, "periodSeconds": 30, "failureThreshold": 3},
    }
    worker = {"name": "vllm-worker", "image": image, "command": ["bash", "-c", WORKER_SHELL]}
    scrape = {"prometheus.io/scrape": "true", "prometheus.io/port": str(port),
              "prometheus.io/path": METRICS_PATH}
    lws = {
        "apiVersion": LWS_API, "kind": "LeaderWorkerSet",
        "metadata": {"name": name, "labels": common},
        "spec": {
            "replicas": topo.replicas,
            "leaderWorkerTemplate": {
                "size": topo.nodes,
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": {
                    "metadata": {"labels": {**common, ROLE_LABEL: "leader"},
                                 "annotations": scrape},
                    "spec": _pod(leader, topo, model_claim)},
                "workerTemplate": {
                    "metadata": {"labels": {**common, ROLE_LABEL: "worker"}},
                    "spec": _pod(worker, topo, model_claim)},
            }}}
    # not NAME itself: LWS creates a headless Service NAME for the pods' DNS names
    # (LWS_LEADER_ADDRESS), and does not when one of that name exists
    docs = [lws, _service(api_service(name), common, port, {"app.kubernetes.io/name": name,
                                                            ROLE_LABEL: "leader"})]
    if topo.replicas > 1:
        for i in range(topo.replicas):
            docs.append(_service(api_service(name, i), common, port, {
                "app.kubernetes.io/name": name, ROLE_LABEL: "leader",
                LWS_GROUP_INDEX_LABEL: str(i)}))
    return yamlio.dump_all(docs)


def api_service(name: str, replica: int | None = None) -> str:
    """The API Service of all leaders, or of one replica's leader."""
    return f"{name}-leader" if replica is None else f"{name}-leader-{replica}"


def _service(name: str, labels: dict, port: int, selector: dict) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "labels": labels},
            "spec": {"type": "ClusterIP", "selector": selector,
                     "ports": [{"name": "http", "port": port, "targetPort": "http",
                                "protocol": "TCP"}]}}


def replica_urls(spec: SpecConfig, topo: Topology, backend: str = "vllm", *,
                 name: str | None = None, namespace: str = "default",
                 port: int = 8000) -> list[str]:
    """In-cluster URLs, one per replica (the per-group Services), or the API Service."""
    name = name_of(spec, backend, name)
    services = ([api_service(name, i) for i in range(topo.replicas)] if topo.replicas > 1
                else [api_service(name)])
    return deploy.service_urls(services, namespace, port)


def probe_hint(spec: SpecConfig, topo: Topology, backend: str, *, name: str | None = None,
               namespace: str = "default", port: int = 8000) -> str:
    """What to run to measure every replica (printed beside the manifests)."""
    if backend == "trtllm":
        return (f"# Submit the script once per replica ({topo.replicas}); each job prints\n"
                "# 'API: http://HOST:PORT' from its first node. Measure every replica with:\n"
                "specadapt probe " + " ".join(f"--url http://HOST{i}:{port}"
                                             for i in range(topo.replicas)) + "\n")
    name = name_of(spec, backend, name)
    services = ([api_service(name, i) for i in range(topo.replicas)] if topo.replicas > 1
                else [api_service(name)])
    return deploy.probe_hint_for(services, namespace, port)


# ------------------------------------------------------------------ TensorRT-LLM: Slurm

def trtllm_serve_argv(spec: SpecConfig, topo: Topology, config_path: str,
                      version: str | None = None, engine: str = "pytorch",
                      port: int = 8000) -> list[str]:
    argv = trtllm.render_trtllm_argv(spec, config_path, version, engine, port=port)
    extra = ["--gpus_per_node", str(topo.gpus_per_node)]
    if topo.pp != 1:
        extra = ["--pp_size", str(topo.pp), *extra]
    cut = len(argv) - 2  # before "--config FILE"
    return argv[:cut] + extra + argv[cut:]


def render_slurm(spec: SpecConfig, topo: Topology, version: str | None = None,
                 engine: str = "pytorch", *, name: str | None = None,
                 image: str | None = None, port: int = 8000) -> str:
    """An sbatch script: srun --mpi=pmix, one rank per GPU, trtllm-llmapi-launch trtllm-serve.

    The config file (trtllm-config.yaml, written beside it) is read from the submit
    directory, which must be on a file system every node mounts."""
    name = name_of(spec, "trtllm", name)
    image = image or deploy.default_image("trtllm", version)
    serve = trtllm_serve_argv(spec, topo, f"$SLURM_SUBMIT_DIR/{deploy.TRTLLM_CONFIG_NAME}",
                              version, engine, port)
    serve_text = " ".join(a if a.startswith("$SLURM") else shlex.quote(a) for a in serve)
    mounts = "$SLURM_SUBMIT_DIR:$SLURM_SUBMIT_DIR"
    if spec.target and spec.target.startswith("/"):
        mounts += f",{spec.target}:{spec.target}"
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name={name}",
        f"#SBATCH --nodes={topo.nodes}",
        f"#SBATCH --ntasks-per-node={topo.gpus_per_node}",
        f"#SBATCH --gpus-per-node={topo.gpus_per_node}",
        "#SBATCH --exclusive",
        "# Generated by specadapt config. One MPI rank per GPU "
        f"({topo.nodes} nodes x {topo.gpus_per_node} = tp {spec.tp} x pp {topo.pp});",
        "# rank 0, on the first node, serves the API. The model must be a local directory",
        "# every node can read (trtllm-llmapi-launch does not download from Hugging Face).",
        "set -euo pipefail",
        f': "${{CONTAINER_IMAGE:={image}}}"',
        f': "${{CONTAINER_MOUNTS:={mounts}}}"',
        'HEAD=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        f'echo "API: http://$HEAD:{port}"',
        'srun --mpi=pmix --container-image="$CONTAINER_IMAGE" '
        '--container-mounts="$CONTAINER_MOUNTS" \\',
        f"    trtllm-llmapi-launch {serve_text}",
    ]
    return "\n".join(lines) + "\n"


def trtllm_multinode_problems(spec: SpecConfig) -> list[Problem]:
    if spec.target and not spec.target.startswith("/"):
        return [Problem(f"--target {spec.target} is not a local path: trtllm-llmapi-launch "
                        "under Slurm does not download from Hugging Face, so download it to a "
                        "directory every node mounts and pass that path.", "warning")]
    return []


def slurm_problems(text: str) -> list[Problem]:
    """An sbatch script: MPI ranks (nodes x tasks per node) = tp x pp of its trtllm-serve,
    and one GPU per rank."""
    sbatch: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("#SBATCH"):
            args = shlex.split(line[len("#SBATCH"):], comments=True)
            for i, arg in enumerate(args):  # --key=value, --key value, -N value
                if not arg.startswith("-"):
                    continue
                key, eq, value = arg.partition("=")
                if not eq and i + 1 < len(args) and not args[i + 1].startswith("-"):
                    value = args[i + 1]
                sbatch[key] = value
    serve: list[str] = []
    for line in text.splitlines():
        words = line.split()
        if "trtllm-serve" in words:
            serve = words[words.index("trtllm-serve"):]
    par = manifest.parallel(serve)
    nodes = _to_int(sbatch.get("--nodes") or sbatch.get("-N"))
    tasks = _to_int(sbatch.get("--ntasks-per-node"))
    out: list[Problem] = []
    if par is None or None in par or nodes is None or tasks is None:
        return out
    tp, pp = par
    if nodes * tasks != tp * pp:
        out.append(Problem(f"#SBATCH --ntasks-per-node={tasks} x --nodes={nodes} = "
                           f"{nodes * tasks} MPI ranks but trtllm-serve runs --tp_size {tp} x "
                           f"--pp_size {pp} = {tp * pp}: TensorRT-LLM needs one rank per GPU of "
                           "the model, so make them equal."))
    gpus = _to_int(sbatch.get("--gpus-per-node"))
    if gpus is not None and gpus != tasks:
        out.append(Problem(f"#SBATCH --gpus-per-node={gpus} differs from --ntasks-per-node="
                           f"{tasks}: give each rank one GPU."))
    flag = _to_int(manifest.option(serve, "--gpus_per_node"))
    if flag is not None and flag != tasks:
        out.append(Problem(f"trtllm-serve --gpus_per_node {flag} differs from #SBATCH "
                           f"--ntasks-per-node={tasks}: make them equal."))
    return out


def _to_int(value: str | None) -> int | None:
    return int(value) if value is not None and value.isdigit() else None

"""Deployment artifacts: a Kubernetes Deployment + Service and a docker compose service.

Both start the server with the same argv the renderers produce, ask for one GPU per
tensor-parallel rank, probe the server's health route, and keep the model (and the
Hugging Face cache) on a volume mounted at /models.
"""

from __future__ import annotations

from typing import Any

from specadapt.configs import trtllm, vllm, yamlio
from specadapt.configs import versions as V
from specadapt.configs.spec import SpecConfig
from specadapt.errors import UsageError

MODEL_MOUNT = "/models"
CONFIG_MOUNT = "/config"
TRTLLM_CONFIG_NAME = "trtllm-config.yaml"



# each server's published container image, by version
IMAGES = {"vllm": "vllm/vllm-openai:v{}", "trtllm": "nvcr.io/nvidia/tensorrt-llm/release:{}"}


def default_image(backend: str, version: str | None) -> str:
    return IMAGES[backend].format(V.fmt(V.resolve_version(backend, version)))


def _vllm_launch(spec: SpecConfig, version: str | None, engine: str, port: int) -> dict[str, Any]:
    argv = vllm.render_vllm_argv(spec, version, python="python3", port=port)
    return {"command": argv, "health": vllm.HEALTH_ROUTE, "config": None}


def _trtllm_launch(spec: SpecConfig, version: str | None, engine: str, port: int) -> dict[str, Any]:
    path = f"{CONFIG_MOUNT}/{TRTLLM_CONFIG_NAME}"
    argv = trtllm.render_trtllm_argv(spec, path, version, engine, port=port)
    return {"command": argv, "health": trtllm.HEALTH_ROUTE, "config": trtllm.render_trtllm_yaml(spec, version, engine)}


LAUNCHES = {"vllm": _vllm_launch, "trtllm": _trtllm_launch}


def launch(spec: SpecConfig, backend: str, version: str | None = None,
           engine: str = "pytorch", port: int = 8000) -> dict[str, Any]:
    """Container command, health route and (TRT-LLM) config file text for one server."""
    if backend not in LAUNCHES:
        raise UsageError(f"Unknown backend '{backend}': use vllm or trtllm.")
    return LAUNCHES[backend](spec, version, engine, port)


def _name(spec: SpecConfig, backend: str, name: str | None) -> str:
    if name:
        return name
    return f"{backend}-{spec.method}".replace("_", "-").lower()


def render_k8s(spec: SpecConfig, backend: str, version: str | None = None,
               engine: str = "pytorch", *, name: str | None = None, image: str | None = None,
               port: int = 8000, model_claim: str = "models", replicas: int = 1) -> str:
    """Multi-document YAML: [ConfigMap (TRT-LLM)], Deployment, Service. With replicas > 1
    a StatefulSet instead, and one Service per replica (selecting its pod by the
    ``statefulset.kubernetes.io/pod-name`` label Kubernetes sets) so each can be measured."""
    name = _name(spec, backend, name)
    run = launch(spec, backend, version, engine, port)
    labels = {"app.kubernetes.io/name": name, "app.kubernetes.io/component": "inference",
              "specadapt/method": spec.method}
    mounts = [{"name": "models", "mountPath": MODEL_MOUNT},
              {"name": "shm", "mountPath": "/dev/shm"}]
    volumes: list[dict[str, Any]] = [
        {"name": "models", "persistentVolumeClaim": {"claimName": model_claim}},
        {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "8Gi"}}]
    docs: list[dict[str, Any]] = []
    if run["config"] is not None:
        docs.append({"apiVersion": "v1", "kind": "ConfigMap",
                     "metadata": {"name": f"{name}-config", "labels": labels},
                     "data": {TRTLLM_CONFIG_NAME: run["config"]}})
        mounts.append({"name": "config", "mountPath": CONFIG_MOUNT, "readOnly": True})
        volumes.append({"name": "config", "configMap": {"name": f"{name}-config"}})
    probe = {"httpGet": {"path": run["health"], "port": "http"}}
    container = {
        "name": backend, "image": image or default_image(backend, version),
        "command": run["command"],
        "ports": [{"name": "http", "containerPort": port}],
        "env": [{"name": "HF_HOME", "value": f"{MODEL_MOUNT}/hf-cache"}],
        "resources": {"limits": {"nvidia.com/gpu": spec.tp},
                      "requests": {"nvidia.com/gpu": spec.tp}},
        # loading weights and compiling can take many minutes: startup allows 30 min
        "startupProbe": {**probe, "periodSeconds": 10, "failureThreshold": 180},
        "readinessProbe": {**probe, "periodSeconds": 10, "failureThreshold": 3},
        "livenessProbe": {**probe, "periodSeconds": 30, "failureThreshold": 3},
        "volumeMounts": mounts,
    }
    workload: dict[str, Any] = {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "labels": labels},
        "spec": {"replicas": replicas,
                 "selector": {"matchLabels": {"app.kubernetes.io/name": name}},
                 "template": {"metadata": {"labels": labels},
                              "spec": {"containers": [container], "volumes": volumes}}}}
    if replicas > 1:
        workload["kind"] = "StatefulSet"
        workload["spec"] = {"serviceName": name, "podManagementPolicy": "Parallel",
                            **workload["spec"]}
    docs.append(workload)
    docs.append(_service(name, labels, port, {"app.kubernetes.io/name": name}))
    if replicas > 1:
        for i in range(replicas):
            docs.append(_service(replica_service(name, i), labels, port, {
                "app.kubernetes.io/name": name, POD_NAME_LABEL: f"{name}-{i}"}))
    return yamlio.dump_all(docs)


POD_NAME_LABEL = "statefulset.kubernetes.io/pod-name"


def replica_service(name: str, i: int) -> str:
    return f"{name}-replica-{i}"


def _service(name: str, labels: dict, port: int, selector: dict) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "labels": labels},
            "spec": {"selector": selector,
                     "ports": [{"name": "http", "port": port, "targetPort": "http"}]}}


def service_urls(services: list[str], namespace: str = "default", port: int = 8000) -> list[str]:
    return [f"http://{s}.{namespace}.svc.cluster.local:{port}" for s in services]


def probe_hint_for(services: list[str], namespace: str = "default", port: int = 8000) -> str:
    """The `specadapt probe` command for every replica: in-cluster, or through port-forwards."""
    urls = service_urls(services, namespace, port)
    local = [f"http://localhost:{port + 10000 + i}" for i in range(len(urls))]
    forwards = " & ".join(f"kubectl -n {namespace} port-forward svc/{s} {port + 10000 + i}:{port}"
                          for i, s in enumerate(services))
    return ("# Measure every replica; from a pod inside the cluster:\n"
            f"specadapt probe {' '.join('--url ' + u for u in urls)}\n"
            "# or from your machine, through port-forwards:\n"
            f"{forwards} &\n"
            f"specadapt probe {' '.join('--url ' + u for u in local)}\n")


def render_compose(spec: SpecConfig, backend: str, version: str | None = None,
                   engine: str = "pytorch", *, name: str | None = None,
                   image: str | None = None, port: int = 8000,
                   model_dir: str = "./models") -> str:
    """A docker compose file with one GPU service (and the TRT-LLM config inline)."""
    name = _name(spec, backend, name)
    run = launch(spec, backend, version, engine, port)
    url = f"http://localhost:{port}{run['health']}"
    service: dict[str, Any] = {
        "image": image or default_image(backend, version),
        "command": run["command"],
        "ports": [f"{port}:{port}"],
        "ipc": "host",
        "environment": {"HF_HOME": f"{MODEL_MOUNT}/hf-cache"},
        "volumes": [f"{model_dir}:{MODEL_MOUNT}"],
        "deploy": {"resources": {"reservations": {"devices": [
            {"driver": "nvidia", "count": spec.tp, "capabilities": ["gpu"]}]}}},
        "healthcheck": {
            "test": ["CMD", "python3", "-c",
                     f"import urllib.request; urllib.request.urlopen('{url}')"],
            "interval": "10s", "timeout": "5s", "retries": 3, "start_period": "30m"},
    }
    doc: dict[str, Any] = {"services": {name: service}}
    if run["config"] is not None:
        service["configs"] = [{"source": f"{name}-config",
                               "target": f"{CONFIG_MOUNT}/{TRTLLM_CONFIG_NAME}"}]
        doc["configs"] = {f"{name}-config": {"content": run["config"]}}
    return yamlio.dump(doc)

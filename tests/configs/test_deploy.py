"""Kubernetes and compose artifacts."""

from __future__ import annotations

import yaml

from specadapt.configs import deploy
from specadapt.configs.spec import SpecConfig

SPEC = SpecConfig(target="meta-llama/Llama-3.1-8B-Instruct", method="eagle3", k=3,
                  draft="yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", tp=2)


def _docs(text):
    return {d["kind"]: d for d in yaml.safe_load_all(text)}


def test_vllm_k8s_deployment_and_service():
    docs = _docs(deploy.render_k8s(SPEC, "vllm"))
    assert set(docs) == {"Deployment", "Service"}
    pod = docs["Deployment"]["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["command"][:3] == ["python3", "-m", "vllm.entrypoints.openai.api_server"]
    assert "--speculative-config" in c["command"]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 2
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert c[probe]["httpGet"] == {"path": "/health", "port": "http"}
    assert {"name": "models", "mountPath": "/models"} in c["volumeMounts"]
    assert any(v["name"] == "models" and "persistentVolumeClaim" in v for v in pod["volumes"])
    assert docs["Service"]["spec"]["selector"] == \
        docs["Deployment"]["spec"]["selector"]["matchLabels"]


def test_trtllm_k8s_mounts_its_config_file():
    docs = _docs(deploy.render_k8s(SPEC, "trtllm"))
    assert set(docs) == {"ConfigMap", "Deployment", "Service"}
    cfg = yaml.safe_load(docs["ConfigMap"]["data"][deploy.TRTLLM_CONFIG_NAME])
    assert cfg["speculative_config"]["decoding_type"] == "Eagle3"
    (c,) = docs["Deployment"]["spec"]["template"]["spec"]["containers"]
    assert c["command"][-2:] == ["--config", "/config/trtllm-config.yaml"]
    assert c["image"] == "nvcr.io/nvidia/tensorrt-llm/release:1.2.1"


def test_compose_service():
    doc = yaml.safe_load(deploy.render_compose(SPEC, "trtllm", image="my/image:1"))
    svc = doc["services"]["trtllm-eagle3"]
    assert svc["image"] == "my/image:1"
    assert svc["deploy"]["resources"]["reservations"]["devices"][0]["count"] == 2
    assert "http://localhost:8000/health" in svc["healthcheck"]["test"][-1]
    assert "decoding_type: Eagle3" in doc["configs"]["trtllm-eagle3-config"]["content"]


def test_no_yaml_aliases():
    for backend in ("vllm", "trtllm"):
        for text in (deploy.render_k8s(SPEC, backend), deploy.render_compose(SPEC, backend)):
            assert "&id" not in text and "*id" not in text

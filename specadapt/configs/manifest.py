"""Kubernetes manifests: schema validation and the rules a schema cannot express.

Schemas: built-in kinds against the Kubernetes OpenAPI schema of ``K8S_VERSION`` (the
``kubernetes-validate`` package, extra ``k8s``, strict: unknown fields are errors); a
LeaderWorkerSet against the CRD schema of LWS ``LWS_VERSION`` (package data, see
schemas/README.md), made strict the same way.

Cross-object rules (specadapt's own): GPUs per pod x group size = tp x pp of the server
command; a Service selects the pods of a template in the file and targets a port those
pods declare; probes name a declared port; the server's --port is the container port;
the Prometheus scrape annotation names that port.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from functools import lru_cache
from importlib import resources
from typing import Any

import jsonschema

from specadapt.configs.checks import Problem

K8S_VERSION = "1.33"
LWS_VERSION = "v0.10.0"
LWS_SCHEMA = "leaderworkerset-v1.schema.json"
GPU = "nvidia.com/gpu"
# labels the LWS controller adds to the pods it creates (a Service may select on them)
LWS_INJECTED = ("leaderworkerset.sigs.k8s.io/name", "leaderworkerset.sigs.k8s.io/group-index",
                "leaderworkerset.sigs.k8s.io/worker-index")
# the label the StatefulSet controller puts on each of its pods
STS_INJECTED = ("statefulset.kubernetes.io/pod-name",)
SHELLS = ("sh", "bash", "/bin/sh", "/bin/bash")
INSTALL_HINT = "pip install 'specadapt[k8s]'"


def is_k8s_object(doc: Any) -> bool:
    return isinstance(doc, dict) and isinstance(doc.get("apiVersion"), str) \
        and isinstance(doc.get("kind"), str)


def _label(doc: dict) -> str:
    return f"{doc.get('kind')} {(doc.get('metadata') or {}).get('name', '?')}"


def _path(parts) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "(top level)"


# ------------------------------------------------------------------ schemas

@lru_cache(maxsize=1)
def lws_schema() -> dict[str, Any]:
    text = resources.files("specadapt.configs").joinpath("schemas", LWS_SCHEMA).read_text()
    return _strict(json.loads(text))


def _strict(schema: Any) -> Any:
    """additionalProperties: false on every object schema that lists its properties and does
    not preserve unknown fields (what kubectl's strict field validation enforces)."""
    if isinstance(schema, dict):
        out = {k: _strict(v) for k, v in schema.items()}
        if "properties" in out and "additionalProperties" not in out \
                and not out.get("x-kubernetes-preserve-unknown-fields"):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


def _lws_errors(doc: dict) -> Iterator[str]:
    validator = jsonschema.Draft202012Validator(lws_schema())
    for err in sorted(validator.iter_errors(doc), key=lambda e: list(map(str, e.path))):
        yield f"{_path(err.absolute_path)}: {err.message}"


def schema_problems(docs: list[dict], k8s_version: str = K8S_VERSION) -> list[Problem]:
    """Every object against its schema; one Problem per wrong field."""
    out: list[Problem] = []
    kv = None
    for doc in docs:
        if doc.get("kind") == "LeaderWorkerSet":
            if doc.get("apiVersion") != "leaderworkerset.x-k8s.io/v1":
                out.append(Problem(f"{_label(doc)}: apiVersion {doc.get('apiVersion')!r} is "
                                   "not served by LWS: use leaderworkerset.x-k8s.io/v1."))
                continue
            out += [Problem(f"{_label(doc)}: {m} (LWS {LWS_VERSION} CRD schema).")
                    for m in _lws_errors(doc)]
            continue
        if kv is None:
            try:
                import kubernetes_validate as kv  # noqa: PLC0415 (optional extra)
            except ImportError:
                out.append(Problem(f"{_label(doc)} was not checked against the Kubernetes "
                                   f"schema: {INSTALL_HINT} to check it.", "warning"))
                continue
        try:
            kv.validate(doc, k8s_version, strict=True)
        except kv.utils.VersionNotSupportedError:
            out.append(Problem(f"{_label(doc)} was not checked: this kubernetes-validate has no "
                               f"Kubernetes {k8s_version} schema: pip install -U "
                               "kubernetes-validate.", "warning"))
        except kv.SchemaNotFoundError:
            out.append(Problem(f"{_label(doc)}: Kubernetes {k8s_version} has no kind "
                               f"{doc.get('kind')} in {doc.get('apiVersion')}: check both.",))
        except kv.ValidationError as exc:
            err = exc
            out.append(Problem(f"{_label(doc)}: {_path(err.absolute_path)}: {err.message} "
                               f"(Kubernetes {k8s_version} schema)."))
    return out


# ------------------------------------------------------------------ cross-object rules

def _templates(doc: dict) -> list[tuple[str, dict]]:
    """(path, pod template) pairs of a workload."""
    spec = doc.get("spec") or {}
    if doc.get("kind") == "LeaderWorkerSet":
        lwt = spec.get("leaderWorkerTemplate") or {}
        base = "spec.leaderWorkerTemplate"
        out = [(f"{base}.workerTemplate", lwt.get("workerTemplate") or {})]
        if lwt.get("leaderTemplate"):
            out.insert(0, (f"{base}.leaderTemplate", lwt["leaderTemplate"]))
        return out
    if isinstance(spec.get("template"), dict):
        return [("spec.template", spec["template"])]
    return []


def server_argv(container: dict) -> list[str]:
    """The server command of a container: command + args, past a `bash -c SCRIPT` wrapper."""
    argv = [str(a) for a in (container.get("command") or []) + (container.get("args") or [])]
    if len(argv) >= 3 and argv[0] in SHELLS and argv[1] == "-c":
        return argv[3:]
    return argv


def option(argv: list[str], *names: str) -> str | None:
    for i, arg in enumerate(argv):
        for n in names:
            if arg == n and i + 1 < len(argv):
                return argv[i + 1]
            if arg.startswith(n + "="):
                return arg.split("=", 1)[1]
    return None


def _int(value: Any, default: int) -> int | None:
    if value is None:
        return default
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def parallel(argv: list[str]) -> tuple[int | None, int | None] | None:
    """(tp, pp) of a vLLM or trtllm-serve command, None when it is neither."""
    if not argv:
        return None
    if argv[0].endswith("trtllm-serve") or "trtllm-serve" in argv[:2]:
        return _int(option(argv, "--tp_size"), 1), _int(option(argv, "--pp_size"), 1)
    if any(a.startswith("vllm.") for a in argv[:3]) or argv[:2] == ["vllm", "serve"]:
        return (_int(option(argv, "--tensor-parallel-size", "--tensor_parallel_size", "-tp"), 1),
                _int(option(argv, "--pipeline-parallel-size", "--pipeline_parallel_size",
                          "-pp"), 1))
    return None


def consistency_problems(docs: list[dict]) -> list[Problem]:
    out: list[Problem] = []
    pods: list[tuple[dict, str, dict]] = []  # (workload, path, template)
    for doc in docs:
        for path, tmpl in _templates(doc):
            pods.append((doc, path, tmpl))
            out += _pod_rules(doc, path, tmpl)
        out += _gpu_rules(doc)
    lws_names = {(d.get("metadata") or {}).get("name") for d in docs
                 if d.get("kind") == "LeaderWorkerSet"}
    for doc in docs:
        if doc.get("kind") == "Service":
            out += _service_rules(doc, pods)
            name = (doc.get("metadata") or {}).get("name")
            if name in lws_names:
                out.append(Problem(
                    f"{_label(doc)}: metadata.name '{name}' is the LeaderWorkerSet's name, "
                    "which LWS gives the headless Service behind the pods' DNS names "
                    f"(LWS_LEADER_ADDRESS): rename it, e.g. '{name}-leader'."))
    return out


def _containers(tmpl: dict) -> list[dict]:
    return [c for c in ((tmpl.get("spec") or {}).get("containers") or []) if isinstance(c, dict)]


def _pod_rules(doc: dict, path: str, tmpl: dict) -> Iterator[Problem]:
    label = _label(doc)
    ports_all: list[int] = []
    for ci, c in enumerate(_containers(tmpl)):
        cpath = f"{path}.spec.containers[{ci}]"
        ports = {p.get("name"): p.get("containerPort") for p in c.get("ports") or []
                 if isinstance(p, dict)}
        ports_all += [v for v in ports.values() if isinstance(v, int)]
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            target = ((c.get(probe) or {}).get("httpGet") or {}).get("port")
            if isinstance(target, str) and target not in ports:
                yield Problem(f"{label}: {cpath}.{probe}.httpGet.port names port '{target}' "
                              f"but the container declares {sorted(map(str, ports)) or 'none'}:"
                              " use a declared port name.")
            elif isinstance(target, int) and target not in ports.values():
                yield Problem(f"{label}: {cpath}.{probe}.httpGet.port {target} is not a "
                              "containerPort of this container: probe the server's port.")
        argv = server_argv(c)
        if parallel(argv) is not None and ports:
            served = _int(option(argv, "--port"), 8000)
            if served not in ports.values():
                where = next((f"{cpath}.ports[{i}].containerPort"
                              for i, p in enumerate(c.get("ports") or [])), cpath)
                yield Problem(f"{label}: {where} is {sorted(ports.values())} but the server "
                              f"command listens on --port {served}: make them equal.")
    anno = ((tmpl.get("metadata") or {}).get("annotations") or {}).get("prometheus.io/port")
    if anno is not None and _int(anno, -1) not in ports_all:
        yield Problem(f"{label}: {path}.metadata.annotations.prometheus.io/port is {anno} but "
                      f"the pod's container ports are {sorted(ports_all)}: scrape the "
                      "server's port.")


def _gpus(tmpl: dict) -> int:
    total = 0
    for c in _containers(tmpl):
        limits = ((c.get("resources") or {}).get("limits") or {})
        total += _int(limits.get(GPU), 0) or 0
    return total


def _gpu_rules(doc: dict) -> Iterator[Problem]:
    templates = _templates(doc)
    servers = [(p, server_argv(c)) for p, t in templates for c in _containers(t)]
    par = next((parallel(a) for _, a in servers if parallel(a) is not None), None)
    if par is None or None in par:
        return
    tp, pp = par
    label = _label(doc)
    if doc.get("kind") == "LeaderWorkerSet":
        size = _int(((doc.get("spec") or {}).get("leaderWorkerTemplate") or {}).get("size"), 1)
        per_pod = {p: _gpus(t) for p, t in templates}
        if len(set(per_pod.values())) > 1:
            shown = ", ".join(f"{p}: {g}" for p, g in per_pod.items())
            yield Problem(f"{label}: leader and workers ask for different GPU counts ({shown}"
                          f"): give every pod of the group the same {GPU} limit.")
            return
        gpus = next(iter(per_pod.values()))
        if size is not None and gpus * size != tp * pp:
            yield Problem(f"{label}: {templates[-1][0]}.spec.containers[0].resources.limits."
                          f"{GPU} = {gpus} x spec.leaderWorkerTemplate.size {size} = "
                          f"{gpus * size} GPUs but the server runs tp {tp} x pp {pp} = "
                          f"{tp * pp} ranks: make GPUs per pod x size equal tp x pp.")
        return
    if templates:
        gpus = _gpus(templates[0][1])
        if gpus and gpus != tp * pp:
            yield Problem(f"{label}: {templates[0][0]}.spec.containers[0].resources.limits."
                          f"{GPU} = {gpus} but the server runs tp {tp} x pp {pp} = {tp * pp} "
                          "ranks: make them equal.")


def _service_rules(svc: dict, pods: list[tuple[dict, str, dict]]) -> Iterator[Problem]:
    label = _label(svc)
    spec = svc.get("spec") or {}
    selector = spec.get("selector") or {}
    if not selector:
        return
    matched = []
    for doc, path, tmpl in pods:
        labels = (tmpl.get("metadata") or {}).get("labels") or {}
        if doc.get("kind") == "LeaderWorkerSet":
            keys = {k: v for k, v in selector.items() if k not in LWS_INJECTED}
            name = (doc.get("metadata") or {}).get("name")
            if selector.get(LWS_INJECTED[0], name) != name:
                continue
        elif doc.get("kind") == "StatefulSet":
            keys = {k: v for k, v in selector.items() if k not in STS_INJECTED}
        else:
            keys = selector
        if all(labels.get(k) == v for k, v in keys.items()):
            matched.append((doc, path, tmpl))
    if not matched:
        yield Problem(f"{label}: spec.selector {json.dumps(selector, sort_keys=True)} matches "
                      "no pod template in this file: use the labels of the pods that serve "
                      "the API (the leader's, for a LeaderWorkerSet).")
        return
    for pi, port in enumerate(spec.get("ports") or []):
        target = port.get("targetPort", port.get("port"))
        for doc, path, tmpl in matched:
            declared = [p for c in _containers(tmpl) for p in c.get("ports") or []]
            ok = any(p.get("name") == target if isinstance(target, str)
                     else p.get("containerPort") == target for p in declared)
            if not ok:
                yield Problem(f"{label}: spec.ports[{pi}].targetPort {target!r} is not a port "
                              f"of the pods it selects ({_label(doc)} {path}): use one of "
                              f"{[p.get('name') or p.get('containerPort') for p in declared]}.")


def check_manifests(docs: list[Any], k8s_version: str = K8S_VERSION) -> list[Problem]:
    objs = [d for d in docs if is_k8s_object(d)]
    return schema_problems(objs, k8s_version) + consistency_problems(objs)

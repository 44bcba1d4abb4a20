"""One entry point for rendering: a SpecConfig + backend + format -> named text outputs."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import yaml

from specadapt.configs import deploy, multinode, trtllm, vllm, yamlio
from specadapt.configs import versions as V
from specadapt.configs.checks import Problem, check_model_dirs, check_spec, raise_on_errors
from specadapt.configs.spec import SpecConfig
from specadapt.errors import UsageError

FORMATS = ("argv", "json", "yaml", "k8s", "compose")
# output file name per (backend, format) when writing to a directory
FILE_NAMES = {
    ("vllm", "argv"): "serve.sh", ("vllm", "json"): "speculative-config.json",
    ("vllm", "yaml"): "vllm-config.yaml", ("trtllm", "argv"): "serve.sh",
    ("trtllm", "json"): "llm-api.json", ("trtllm", "yaml"): deploy.TRTLLM_CONFIG_NAME,
    ("vllm", "k8s"): "k8s.yaml", ("trtllm", "k8s"): "k8s.yaml",
    ("vllm", "compose"): "compose.yaml", ("trtllm", "compose"): "compose.yaml",
}


def available_formats(spec: SpecConfig, backend: str, version: str | None = None) -> list[str]:
    """Every format that exists for this spec: no speculative-config JSON for 'off' or for
    vLLM <= 0.7 (flags only)."""
    legacy = backend == "vllm" and V.resolve_version("vllm", version) < V.VLLM_JSON_SINCE
    no_json = backend == "vllm" and (legacy or not spec.enabled)
    return [f for f in FORMATS if not (f == "json" and no_json)]


def validate(spec: SpecConfig, backend: str, version: str | None = None,
             engine: str = "pytorch") -> list[Problem]:
    """Spec rules plus local model-dir checks; raises UsageError on errors, returns warnings."""
    return raise_on_errors(check_spec(spec, backend, version, engine)
                           + check_model_dirs(spec))


def render(spec: SpecConfig, backend: str, fmt: str, version: str | None = None,
           engine: str = "pytorch", *, entry: str = "module", host: str = "0.0.0.0",
           port: int = 8000, image: str | None = None, name: str | None = None,
           replicas: int = 1) -> str:
    """The text of one output format (``replicas`` applies to k8s only)."""
    if fmt not in FORMATS:
        raise UsageError(f"Unknown format '{fmt}': use one of {', '.join(FORMATS)}.")
    if fmt == "k8s":
        return deploy.render_k8s(spec, backend, version, engine, name=name, image=image,
                                 port=port, replicas=replicas)
    if fmt == "compose":
        return deploy.render_compose(spec, backend, version, engine, name=name, image=image,
                                     port=port)
    if backend == "vllm":
        if fmt == "argv":
            argv = vllm.render_vllm_argv(spec, version, host=host, port=port, entry=entry)
            return shlex.join(argv) + "\n"
        if fmt == "json":
            return _json(vllm.vllm_spec_dict(spec, version))
        return vllm.render_vllm_yaml(spec, version, host=host, port=port)
    if backend == "trtllm":
        if fmt == "argv":
            argv = trtllm.render_trtllm_argv(spec, deploy.TRTLLM_CONFIG_NAME, version, engine,
                                             host=host, port=port)
            return shlex.join(argv) + "\n"
        if fmt == "json":
            return _json(trtllm.trtllm_llm_kwargs(spec, version, engine))
        return trtllm.render_trtllm_yaml(spec, version, engine)
    raise UsageError(f"Unknown backend '{backend}': use vllm or trtllm.")


def _json(data) -> str:
    """Indented JSON, but lists of numbers on one line ([1, 16, 4])."""
    text = json.dumps(data, indent=2)
    return re.sub(r"\[\s+([-\d.,\s]+?)\s+\]",
                  lambda m: "[" + ", ".join(m.group(1).replace(",", " ").split()) + "]",
                  text) + "\n"


def write_outputs(spec: SpecConfig, backend: str, formats: list[str], out_dir: Path,
                  version: str | None = None, engine: str = "pytorch", **kw) -> list[Path]:
    """Write each format to ``out_dir`` under its FILE_NAMES name; a trtllm-serve command
    is written with the config file it names."""
    if backend == "trtllm" and "argv" in formats and "yaml" not in formats:
        formats = [*formats, "yaml"]
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for fmt in formats:
        path = out_dir / FILE_NAMES[(backend, fmt)]
        path.write_text(render(spec, backend, fmt, version, engine,
                               **{k: v for k, v in kw.items() if k != "namespace"}))
        written.append(path)
    if kw.get("replicas", 1) > 1 and "k8s" in formats:
        written.append(write_probe_hint(out_dir, single_node_probe_hint(
            spec, backend, kw["replicas"], port=kw.get("port", 8000),
            name=kw.get("name"), namespace=kw.get("namespace", "default"))))
    return written


def single_node_probe_hint(spec: SpecConfig, backend: str, replicas: int, *,
                           port: int = 8000, name: str | None = None,
                           namespace: str = "default") -> str:
    name = multinode.name_of(spec, backend, name)
    return deploy.probe_hint_for([deploy.replica_service(name, i) for i in range(replicas)],
                                 namespace, port)


def write_probe_hint(out_dir: Path, text: str) -> Path:
    path = out_dir / PROBE_FILE
    path.write_text(text)
    return path


# ------------------------------------------------------------------ past one node

# formats per backend when the deployment spans nodes (multinode.py)
MULTINODE_FORMATS = {"vllm": ("json", "yaml", "k8s"), "trtllm": ("json", "yaml", "slurm")}
MULTINODE_FILE_NAMES = {**FILE_NAMES, ("vllm", "k8s"): "lws.yaml",
                        ("trtllm", "slurm"): "sbatch.sh"}
PROBE_FILE = "probe-replicas.sh"


def validate_multinode(spec: SpecConfig, backend: str, topo: multinode.Topology,
                       version: str | None = None, engine: str = "pytorch") -> list[Problem]:
    """validate() plus the topology rules; raises on errors, returns warnings."""
    warnings = validate(spec, backend, version, engine)
    extra = multinode.check_topology(spec, topo)
    if backend == "trtllm":
        extra += multinode.trtllm_multinode_problems(spec)
    return warnings + raise_on_errors(extra)


def render_multinode(spec: SpecConfig, backend: str, fmt: str, topo: multinode.Topology,
                     version: str | None = None, engine: str = "pytorch", *,
                     port: int = 8000, image: str | None = None, name: str | None = None) -> str:
    allowed = MULTINODE_FORMATS.get(backend, ())
    if fmt not in allowed:
        why = (" TensorRT-LLM documents multi-node serving through MPI under Slurm "
               "(srun + trtllm-llmapi-launch), not a Kubernetes form: use --format slurm."
               if backend == "trtllm" and fmt == "k8s" else "")
        raise UsageError(f"Format '{fmt}' is not written for a {backend} deployment across "
                         f"nodes: use {', '.join(allowed)}.{why}")
    if fmt == "k8s":
        return multinode.render_lws(spec, topo, version, name=name, image=image, port=port)
    if fmt == "slurm":
        return multinode.render_slurm(spec, topo, version, engine, name=name, image=image,
                                      port=port)
    text = render(spec, backend, fmt, version, engine, port=port)
    if backend == "vllm" and fmt == "yaml":  # the leader's `vllm serve --config` file
        doc = yaml.safe_load(text)
        if topo.pp != 1:
            doc["pipeline-parallel-size"] = topo.pp
        doc["distributed-executor-backend"] = "ray"
        text = yamlio.dump(doc)
    return text


def write_multinode(spec: SpecConfig, backend: str, formats: list[str], out_dir: Path,
                    topo: multinode.Topology, version: str | None = None,
                    engine: str = "pytorch", *, namespace: str = "default",
                    **kw) -> list[Path]:
    """Each format under its name, the batch script with its config file, and the probe
    command for every replica."""
    if backend == "trtllm" and "slurm" in formats and "yaml" not in formats:
        formats = [*formats, "yaml"]
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for fmt in formats:
        path = out_dir / MULTINODE_FILE_NAMES[(backend, fmt)]
        path.write_text(render_multinode(spec, backend, fmt, topo, version, engine, **kw))
        written.append(path)
    written.append(write_probe_hint(out_dir, multinode.probe_hint(
        spec, topo, backend, name=kw.get("name"), namespace=namespace,
        port=kw.get("port", 8000))))
    return written

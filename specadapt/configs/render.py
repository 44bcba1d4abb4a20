"""One entry point for rendering: a SpecConfig + backend + format -> named text outputs.

What `specadapt config` writes for each server it knows (vLLM, TensorRT-LLM) is one
``Outputs`` declaration in ``OUTPUTS``: its renderers, file names, the files another reads,
and what changes past one node. The functions here read those declarations.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from specadapt.configs import deploy, multinode, trtllm, vllm, watch, yamlio
from specadapt.configs import versions as V
from specadapt.configs.checks import Problem, check_model_dirs, check_spec, raise_on_errors
from specadapt.configs.spec import SpecConfig
from specadapt.errors import UsageError

FORMATS = ("argv", "json", "yaml", "k8s", "compose")
PROBE_FILE = "probe-replicas.sh"


@dataclass(frozen=True)
class Reads:
    """One output file names another, which must be written beside it."""

    format: str  # the format of the file it reads
    note: str  # what reads it, said when that file is not written ("the command reads x.yaml")


@dataclass(frozen=True)
class Outputs:
    """What `specadapt config` writes for one server, on one node and past it."""

    argv: Callable[..., list[str]]  # (spec, version, engine, *, host, port, entry) -> the server command
    json: Callable[[SpecConfig, str | None, str], Any]  # (spec, version, engine) -> the JSON document
    yaml: Callable[..., str]  # (spec, version, engine, *, host, port) -> the YAML file
    file_names: dict[str, str]  # format -> file name under --out
    no_json: Callable[[SpecConfig, str | None], bool] = lambda spec, version: False  # no JSON form for it
    reads: dict[str, Reads] = field(default_factory=dict)  # format -> the file it reads
    multinode_formats: tuple[str, ...] = ()  # past one node, the last is the default
    multinode_file_names: dict[str, str] = field(default_factory=dict)  # the file names that differ there
    multinode_refused: dict[str, str] = field(default_factory=dict)  # format -> why it is not written there
    multinode_problems: Callable[[SpecConfig], list[Problem]] = lambda spec: []
    leader_yaml: Callable[[dict[str, Any], multinode.Topology], dict[str, Any]] | None = None  # YAML past one node


def _vllm_no_json(spec: SpecConfig, version: str | None) -> bool:
    """vLLM <= 0.7 takes flags only; 'off' has no speculative-config JSON."""
    return V.resolve_version("vllm", version) < V.VLLM_JSON_SINCE or not spec.enabled


def _vllm_leader(doc: dict[str, Any], topo: multinode.Topology) -> dict[str, Any]:
    """The leader's `vllm serve --config` file: pipeline stages and Ray across the nodes."""
    if topo.pp != 1:
        doc["pipeline-parallel-size"] = topo.pp
    doc["distributed-executor-backend"] = "ray"
    return doc


_TRTLLM_CONFIG = "the {} reads " + deploy.TRTLLM_CONFIG_NAME

OUTPUTS: dict[str, Outputs] = {
    "vllm": Outputs(
        argv=lambda spec, version, engine, *, host, port, entry: vllm.render_vllm_argv(
            spec, version, host=host, port=port, entry=entry),
        json=lambda spec, version, engine: vllm.vllm_spec_dict(spec, version),
        yaml=lambda spec, version, engine, *, host, port: vllm.render_vllm_yaml(spec, version, host=host,
                                                                                port=port),
        file_names={"argv": "serve.sh", "json": "speculative-config.json", "yaml": "vllm-config.yaml",
                    "k8s": "k8s.yaml", "compose": "compose.yaml"},
        no_json=_vllm_no_json,
        multinode_formats=("json", "yaml", "k8s"), multinode_file_names={"k8s": "lws.yaml"},
        leader_yaml=_vllm_leader),
    "trtllm": Outputs(
        argv=lambda spec, version, engine, *, host, port, entry: trtllm.render_trtllm_argv(
            spec, deploy.TRTLLM_CONFIG_NAME, version, engine, host=host, port=port),
        json=trtllm.trtllm_llm_kwargs,
        yaml=lambda spec, version, engine, *, host, port: trtllm.render_trtllm_yaml(spec, version, engine),
        file_names={"argv": "serve.sh", "json": "llm-api.json", "yaml": deploy.TRTLLM_CONFIG_NAME,
                    "k8s": "k8s.yaml", "compose": "compose.yaml"},
        reads={"argv": Reads("yaml", _TRTLLM_CONFIG.format("command")),
               "slurm": Reads("yaml", _TRTLLM_CONFIG.format("script") + " from the submit directory")},
        multinode_formats=("json", "yaml", "slurm"), multinode_file_names={"slurm": "sbatch.sh"},
        multinode_refused={"k8s": " TensorRT-LLM documents multi-node serving through MPI under Slurm "
                                  "(srun + trtllm-llmapi-launch), not a Kubernetes form: use --format slurm."},
        multinode_problems=multinode.trtllm_multinode_problems),
}
# output file name per (backend, format) when writing to a directory
FILE_NAMES = {(b, f): n for b, out in OUTPUTS.items() for f, n in out.file_names.items()}
# formats per backend when the deployment spans nodes (multinode.py)
MULTINODE_FORMATS = {b: out.multinode_formats for b, out in OUTPUTS.items()}
MULTINODE_FILE_NAMES = {**FILE_NAMES, **{(b, f): n for b, out in OUTPUTS.items()
                                         for f, n in out.multinode_file_names.items()}}


def outputs_for(backend: str) -> Outputs:
    """What `specadapt config` writes for ``backend``; UsageError naming the choices."""
    if backend not in OUTPUTS:
        raise UsageError(f"Unknown backend '{backend}': use vllm or trtllm.")
    return OUTPUTS[backend]


def with_read_files(backend: str, formats: list[str]) -> list[str]:
    """``formats`` and the formats of the files they read (a trtllm-serve command: its YAML)."""
    reads = outputs_for(backend).reads
    return list(dict.fromkeys(formats + [r.format for f in formats if (r := reads.get(f))]))


def unread_notes(backend: str, formats: list[str]) -> list[str]:
    """A note for each file ``formats`` read that they leave unwritten (printed, not written)."""
    reads = outputs_for(backend).reads
    return list(dict.fromkeys(f"note: {r.note}: write it with --format {r.format} (or --out DIR)"
                              for f in formats if (r := reads.get(f)) and r.format not in formats))


def available_formats(spec: SpecConfig, backend: str, version: str | None = None) -> list[str]:
    """Every format that exists for this spec: no speculative-config JSON for 'off' or for
    vLLM <= 0.7 (flags only)."""
    no_json = outputs_for(backend).no_json(spec, version)
    return [f for f in FORMATS if not (f == "json" and no_json)]


def validate(spec: SpecConfig, backend: str, version: str | None = None,
             engine: str = "pytorch") -> list[Problem]:
    """Spec rules plus local model-dir checks; raises UsageError on errors, returns warnings."""
    return raise_on_errors(check_spec(spec, backend, version, engine)
                           + check_model_dirs(spec))


def render(spec: SpecConfig, backend: str, fmt: str, version: str | None = None,
           engine: str = "pytorch", *, entry: str = "module", host: str = "0.0.0.0",
           port: int = 8000, image: str | None = None, name: str | None = None,
           replicas: int = 1, watch_image: str | None = None) -> str:
    """The text of one output format (``replicas`` applies to k8s only; ``watch_image``: the
    k8s pods carry a `specadapt watch` sidecar of that image)."""
    if fmt not in FORMATS:
        raise UsageError(f"Unknown format '{fmt}': use one of {', '.join(FORMATS)}.")
    _refuse_watch(fmt, watch_image)
    if fmt == "k8s":
        text = deploy.render_k8s(spec, backend, version, engine, name=name, image=image,
                                 port=port, replicas=replicas)
        return text if watch_image is None else watch.add_watch_sidecar(text, port, watch_image)
    if fmt == "compose":
        return deploy.render_compose(spec, backend, version, engine, name=name, image=image,
                                     port=port)
    out = outputs_for(backend)
    if fmt == "argv":
        return shlex.join(out.argv(spec, version, engine, host=host, port=port, entry=entry)) + "\n"
    if fmt == "json":
        return _json(out.json(spec, version, engine))
    return out.yaml(spec, version, engine, host=host, port=port)


def _refuse_watch(fmt: str, watch_image: str | None) -> None:
    if watch_image is not None and fmt != "k8s":
        raise UsageError(f"--watch adds a container to the server's pods and --format {fmt} "
                         "has none: use --format k8s.")


def _for_format(fmt: str, kw: dict[str, Any]) -> dict[str, Any]:
    """The render options that apply to ``fmt`` (the watcher sidecar goes into k8s only)."""
    return kw if fmt == "k8s" else {k: v for k, v in kw.items() if k != "watch_image"}


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
    formats = with_read_files(backend, formats)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for fmt in formats:
        path = out_dir / FILE_NAMES[(backend, fmt)]
        path.write_text(render(spec, backend, fmt, version, engine,
                               **_for_format(fmt, {k: v for k, v in kw.items()
                                                   if k != "namespace"})))
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

def validate_multinode(spec: SpecConfig, backend: str, topo: multinode.Topology,
                       version: str | None = None, engine: str = "pytorch") -> list[Problem]:
    """validate() plus the topology rules; raises on errors, returns warnings."""
    warnings = validate(spec, backend, version, engine)
    extra = multinode.check_topology(spec, topo) + outputs_for(backend).multinode_problems(spec)
    return warnings + raise_on_errors(extra)


def render_multinode(spec: SpecConfig, backend: str, fmt: str, topo: multinode.Topology,
                     version: str | None = None, engine: str = "pytorch", *,
                     port: int = 8000, image: str | None = None, name: str | None = None,
                     watch_image: str | None = None) -> str:
    out = outputs_for(backend)
    allowed = out.multinode_formats
    if fmt not in allowed:
        raise UsageError(f"Format '{fmt}' is not written for a {backend} deployment across "
                         f"nodes: use {', '.join(allowed)}.{out.multinode_refused.get(fmt, '')}")
    _refuse_watch(fmt, watch_image)
    if fmt == "k8s":
        text = multinode.render_lws(spec, topo, version, name=name, image=image, port=port)
        return text if watch_image is None else watch.add_watch_sidecar(text, port, watch_image)
    if fmt == "slurm":
        return multinode.render_slurm(spec, topo, version, engine, name=name, image=image,
                                      port=port)
    text = render(spec, backend, fmt, version, engine, port=port)
    if fmt == "yaml" and out.leader_yaml is not None:
        text = yamlio.dump(out.leader_yaml(yaml.safe_load(text), topo))
    return text


def write_multinode(spec: SpecConfig, backend: str, formats: list[str], out_dir: Path,
                    topo: multinode.Topology, version: str | None = None,
                    engine: str = "pytorch", *, namespace: str = "default",
                    **kw) -> list[Path]:
    """Each format under its name, the batch script with its config file, and the probe
    command for every replica."""
    formats = with_read_files(backend, formats)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for fmt in formats:
        path = out_dir / MULTINODE_FILE_NAMES[(backend, fmt)]
        path.write_text(render_multinode(spec, backend, fmt, topo, version, engine,
                                         **_for_format(fmt, kw)))
        written.append(path)
    written.append(write_probe_hint(out_dir, multinode.probe_hint(
        spec, topo, backend, name=kw.get("name"), namespace=namespace,
        port=kw.get("port", 8000))))
    return written

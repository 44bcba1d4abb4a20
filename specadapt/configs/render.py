"""One entry point for rendering: a SpecConfig + backend + format -> named text outputs."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

from specadapt.configs import deploy, trtllm, vllm
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
           port: int = 8000, image: str | None = None, name: str | None = None) -> str:
    """The text of one output format."""
    if fmt not in FORMATS:
        raise UsageError(f"Unknown format '{fmt}': use one of {', '.join(FORMATS)}.")
    if fmt == "k8s":
        return deploy.render_k8s(spec, backend, version, engine, name=name, image=image,
                                 port=port)
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
        path.write_text(render(spec, backend, fmt, version, engine, **kw))
        written.append(path)
    return written

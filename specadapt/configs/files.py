"""Reading config files back: find the speculative settings in any file specadapt writes
(or a user brings), validate them, and explain them key by key.

Understood inputs: a vLLM speculative-config JSON object, a ``vllm serve --config`` YAML,
a trtllm-serve YAML, a shell command line (vLLM or trtllm-serve), a Kubernetes manifest
and a docker compose file (their commands and TRT-LLM config files).
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from specadapt.configs import manifest, multinode, trtllm, vllm
from specadapt.configs import versions as V
from specadapt.configs.checks import Problem, check_model_dirs, errors
from specadapt.errors import UsageError

# vLLM <= 0.7 flag names (without dashes) and the 0.8 replacement
VLLM_LEGACY_KEYS = {
    "speculative-model": "model", "num-speculative-tokens": "num_speculative_tokens",
    "ngram-prompt-lookup-max": "prompt_lookup_max",
    "ngram-prompt-lookup-min": "prompt_lookup_min",
    "speculative-draft-tensor-parallel-size": "draft_tensor_parallel_size",
    "speculative-max-model-len": "max_model_len",
    "speculative-disable-by-batch-size": "num_speculative_tokens_per_batch_size",
    "spec-decoding-acceptance-method": "rejection_sample_method",
}
TRTLLM_TOP_HINTS = ("enable_iter_perf_stats", "disable_overlap_scheduler", "kv_cache_config",
                    "cuda_graph_config", "return_perf_metrics", "max_batch_size")


@dataclass
class Unit:
    """One thing to check inside a file: ``kind`` and the parsed object."""

    label: str
    kind: str  # vllm-json | vllm-yaml | trtllm-yaml | vllm-argv | trtllm-argv
    obj: Any


@dataclass
class FileReport:
    path: str
    units: list[Unit] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not any(p.severity == "error" for p in self.problems)


def _norm(key: str) -> str:
    return key.replace("_", "-")


# ---------------------------------------------------------------- loading / detection

def load(path: str | Path) -> tuple[str, list[Any]]:
    """Raw text and the YAML/JSON documents in it ([] when it is not YAML)."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise UsageError(f"Cannot read {p} ({exc.strerror}): check the path.") from exc
    except UnicodeDecodeError as exc:
        raise UsageError(f"{p} is not a text file: pass a JSON, YAML or shell file.") from exc
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError:
        docs = []
    return text, docs


def units_of(path: str | Path, backend: str | None = None) -> list[Unit]:
    text, docs = load(path)
    if docs and all(isinstance(d, dict) for d in docs):
        out: list[Unit] = []
        for d in docs:
            out += _units_of_mapping(d, backend)
        if out:
            return out
    line = " ".join(ln.rstrip("\\").strip() for ln in text.splitlines()
                    if ln.strip() and not ln.lstrip().startswith("#"))
    if line:
        try:
            argv = shlex.split(line)
        except ValueError:
            argv = []
        # a launcher script (sbatch): the server command may follow a wrapper
        start = next((i for i, a in enumerate(argv) if a.endswith("trtllm-serve")), 0)
        unit = _argv_unit("command", argv) or _argv_unit("command", argv[start:])
        if unit:
            return [unit]
    raise UsageError(f"{path} holds no speculative-decoding config specadapt recognizes: "
                     "pass a vLLM speculative-config JSON, a vLLM or trtllm-serve YAML, a "
                     "server command line, a Kubernetes manifest or a compose file.")


def _units_of_mapping(d: dict, backend: str | None) -> list[Unit]:
    if d.get("kind") in ("Deployment", "StatefulSet", "ConfigMap", "Service",
                         "LeaderWorkerSet"):
        return _k8s_units(d)
    if isinstance(d.get("services"), dict):
        return _compose_units(d)
    return [Unit("file", _detect_mapping(d, backend), d)]


def _detect_mapping(d: dict, backend: str | None) -> str:
    sc = d.get("speculative_config")
    if backend == "trtllm" or (isinstance(sc, dict) and "decoding_type" in sc) \
            or any(k in d for k in TRTLLM_TOP_HINTS):
        return "trtllm-yaml"
    if "speculative-config" in d or any("-" in k for k in d) or ("model" in d and "port" in d):
        return "vllm-yaml"
    if "speculative_config" in d:
        return "trtllm-yaml" if backend != "vllm" else "vllm-yaml"
    return "vllm-json"


def _argv_unit(label: str, argv: list[str]) -> Unit | None:
    if not argv:
        return None
    if argv[0].endswith("trtllm-serve"):
        return Unit(label, "trtllm-argv", argv)
    if (len(argv) > 2 and argv[1] == "-m" and argv[2].startswith("vllm.")) or \
            argv[:2] == ["vllm", "serve"]:
        return Unit(label, "vllm-argv", argv)
    return None


def _safe_yaml(text: Any) -> Any:
    try:
        return yaml.safe_load(text) if isinstance(text, str) else None
    except yaml.YAMLError:
        return None


def _k8s_units(d: dict) -> list[Unit]:
    out: list[Unit] = []
    if d.get("kind") == "ConfigMap":
        for key, text in (d.get("data") or {}).items():
            parsed = _safe_yaml(text)
            if isinstance(parsed, dict):
                out.append(Unit(f"ConfigMap {key}", _detect_mapping(parsed, None), parsed))
        return out
    for _, tmpl in manifest._templates(d):
        for c in (tmpl.get("spec") or {}).get("containers") or []:
            unit = _argv_unit(f"container {c.get('name')}", manifest.server_argv(c))
            if unit:
                out.append(unit)
    return out


def _compose_units(d: dict) -> list[Unit]:
    out: list[Unit] = []
    for name, svc in d["services"].items():
        cmd = svc.get("command")
        argv = shlex.split(cmd) if isinstance(cmd, str) else list(cmd or [])
        ep = svc.get("entrypoint")
        argv = (shlex.split(ep) if isinstance(ep, str) else list(ep or [])) + argv
        unit = _argv_unit(f"service {name}", argv)
        if unit:
            out.append(unit)
    for name, cfg in (d.get("configs") or {}).items():
        parsed = _safe_yaml(cfg.get("content", "")) if isinstance(cfg, dict) else None
        if isinstance(parsed, dict):
            out.append(Unit(f"config {name}", _detect_mapping(parsed, None), parsed))
    return out


# ---------------------------------------------------------------- validation

def validate_file(path: str | Path, backend: str | None = None, version: str | None = None,
                  engine: str | None = None, schema: str | Path | None = None) -> FileReport:
    report = FileReport(str(path), units_of(path, backend))
    text, docs = load(path)
    if any(manifest.is_k8s_object(d) for d in docs):
        report.problems += manifest.check_manifests(docs)
    if "#SBATCH" in text:
        report.problems += multinode.slurm_problems(text)
    schema_doc = trtllm.load_schema(schema) if schema else None
    # a trtllm-serve command's --backend decides the engine its config file is checked for
    engines = [_argv_flag(u.obj, "--backend") for u in report.units if u.kind == "trtllm-argv"]
    engine = engine or next((e for e in engines if e), None) or "pytorch"
    for unit in report.units:
        found = _check_unit(unit, version, engine, schema_doc)
        if len(report.units) > 1:
            found = [Problem(f"{unit.label}: {p.message}", p.severity) for p in found]
        report.problems += found
    return report


def _ver(backend: str, version: str | None) -> V.Version:
    return V.resolve_version(backend, version)


def _check_unit(unit: Unit, version: str | None, engine: str,
                schema_doc: dict | None) -> list[Problem]:
    if unit.kind == "vllm-json":
        return vllm.check_vllm_json(unit.obj, version)
    if unit.kind == "vllm-yaml":
        return _check_vllm_options({_norm(k): v for k, v in unit.obj.items()}, version)
    if unit.kind == "vllm-argv":
        opts = _argv_options(unit.obj)
        if unit.obj[:2] == ["vllm", "serve"] and len(unit.obj) > 2:
            opts.setdefault("model", unit.obj[2])
        return _check_vllm_options(opts, version)
    if unit.kind == "trtllm-yaml":
        found = trtllm.check_trtllm_config(unit.obj, engine)
        if schema_doc is not None:
            found += trtllm.schema_problems(unit.obj, schema_doc)
        return found
    return _check_trtllm_argv(unit.obj, version)


def _argv_options(argv: list[str]) -> dict[str, Any]:
    """--key value / --key=value / --flag pairs of a command line (dashes normalized)."""
    opts: dict[str, Any] = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg.startswith("--"):
            key, _, val = arg[2:].partition("=")
            if not val and i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                val, i = argv[i + 1], i + 1
            opts[_norm(key)] = val if val else True
        elif arg in ("-tp", "-sc") and i + 1 < len(argv):
            opts["tensor-parallel-size" if arg == "-tp" else "speculative-config"] = argv[i + 1]
            i += 1
        i += 1
    return opts


def _argv_flag(argv: list[str], flag: str) -> str | None:
    return _argv_options(argv).get(_norm(flag.lstrip("-")))


def _check_vllm_options(opts: dict[str, Any], version: str | None) -> list[Problem]:
    ver = _ver("vllm", version)
    out: list[Problem] = []
    legacy = [k for k in opts if k in VLLM_LEGACY_KEYS]
    if ver >= V.VLLM_JSON_SINCE:
        for k in legacy:
            out.append(Problem(f"'--{k}' was removed in vLLM 0.8: move it into "
                               f"--speculative-config as '{VLLM_LEGACY_KEYS[k]}'."))
    sc = opts.get("speculative-config")
    if sc is None:
        return out
    if ver < V.VLLM_JSON_SINCE:
        return out + [Problem(f"vLLM {V.fmt(ver)} has no --speculative-config (it arrived in "
                              "0.8): use --speculative-model and --num-speculative-tokens, "
                              "or target vLLM >= 0.8.")]
    if isinstance(sc, str):
        try:
            sc = json.loads(sc)
        except ValueError as exc:
            return out + [Problem(f"--speculative-config is not valid JSON ({exc.msg} at "
                                  f"character {exc.pos}): quote it as one JSON object.")]
    out += vllm.check_vllm_json(sc, version)
    tp, dtp = opts.get("tensor-parallel-size"), isinstance(sc, dict) and sc.get(
        "draft_tensor_parallel_size")
    if tp and isinstance(dtp, int) and dtp not in (1, int(tp)):
        out.append(Problem(f"draft_tensor_parallel_size={dtp} must be 1 or the target's "
                           f"tensor-parallel-size ({tp}): change it to 1 or {tp}."))
    if not errors(out):
        out += _model_dir_problems(opts, sc)
    return out


def _model_dir_problems(opts: dict[str, Any], sc: Any) -> list[Problem]:
    """Vocab/tokenizer/length/head checks when the files name local model directories."""
    if not isinstance(sc, dict) or not opts.get("model"):
        return []
    try:
        spec = vllm.spec_from_vllm_json({k: v for k, v in sc.items() if k in vllm.MAPPED_KEYS},
                                        target=str(opts["model"]))
        max_len = opts.get("max-model-len")
        spec = spec.model_copy(update={"max_model_len": int(max_len) if max_len else None})
    except (UsageError, ValueError):
        return []
    return check_model_dirs(spec)


def _check_trtllm_argv(argv: list[str], version: str | None) -> list[Problem]:
    ver = _ver("trtllm", version)
    opts = _argv_options(argv)
    if "config" in opts and ver < V.TRTLLM_CONFIG_FLAG_SINCE:
        return [Problem(f"TensorRT-LLM {V.fmt(ver)} has no --config flag (an alias since "
                        "1.2): use --extra_llm_api_options.")]
    if "config" not in opts and "extra-llm-api-options" not in opts:
        return [Problem("The trtllm-serve command passes no config file, so speculative "
                        "decoding stays off: add --config FILE.", "warning")]
    return []


# ---------------------------------------------------------------- explain

def explain_file(path: str | Path, backend: str | None = None, version: str | None = None,
                 engine: str | None = None) -> list[str]:
    """Lines: what each key does, then what is missing, deprecated or wrong."""
    report = validate_file(path, backend, version, engine)
    lines: list[str] = []
    for unit in report.units:
        lines.append(f"{unit.label} ({unit.kind}):")
        lines += ["  " + ln for ln in _describe(unit)]
    if report.problems:
        lines.append("findings:")
        lines += [f"  - {p}" for p in report.problems]
    else:
        lines.append("findings: none; the config is valid for the chosen version.")
    return lines


def _describe(unit: Unit) -> list[str]:
    if unit.kind == "vllm-json":
        return _describe_keys(unit.obj, vllm.SPEC_KEYS, vllm.GONE_KEYS)
    if unit.kind in ("vllm-yaml", "vllm-argv"):
        opts = unit.obj if unit.kind == "vllm-yaml" else _argv_options(unit.obj)
        lines = []
        for key, val in opts.items():
            if _norm(key) == "speculative-config":
                try:
                    sc = json.loads(val) if isinstance(val, str) else val
                except ValueError:
                    sc = val  # reported as invalid JSON among the findings
                lines.append("speculative-config: the speculative decoding settings")
                lines += ["  " + ln for ln in _describe_keys(sc, vllm.SPEC_KEYS, vllm.GONE_KEYS)]
            elif _norm(key) in VLLM_LEGACY_KEYS:
                lines.append(f"{key} = {val}: vLLM <= 0.7 flag (now speculative-config "
                             f"'{VLLM_LEGACY_KEYS[_norm(key)]}')")
            else:
                lines.append(f"{key} = {val}: server option")
        return lines
    if unit.kind == "trtllm-yaml":
        lines = []
        for key, val in unit.obj.items():
            if key == "speculative_config" and isinstance(val, dict):
                lines.append(f"speculative_config: {trtllm.TOP_KEYS[key]}")
                known = {**trtllm.BASE_KEYS, **trtllm.TYPE_KEYS.get(val.get("decoding_type"), {})}
                lines += ["  " + ln for ln in _describe_keys(val, known, trtllm.OLD_KEYS)]
            else:
                what = trtllm.TOP_KEYS.get(key, "not checked by specadapt")
                lines.append(f"{key} = {val}: {what}")
        return lines
    return [f"{' '.join(unit.obj)}"]


def _describe_keys(d: Any, known: dict[str, str], old: dict[str, str]) -> list[str]:
    if not isinstance(d, dict):
        return ["(not a mapping)"]
    return [f"{k} = {json.dumps(v)}: "
            f"{known.get(k) or (('DEPRECATED/RENAMED: ' + old[k]) if k in old else 'UNKNOWN key')}"
            for k, v in d.items()]

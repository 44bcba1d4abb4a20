"""TensorRT-LLM renderers and readers: trtllm-serve YAML and argv, LLM-API kwargs.

Targets TensorRT-LLM 1.x, PyTorch backend by default (``engine="tensorrt"`` for the
TensorRT engine path). Key names: tensorrt_llm/llmapi/llm_args.py and the published
trtllm-serve JSON schema (tensorrt_llm/schemas/trtllm-serve-config.schema.json).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr

from specadapt.configs import versions as V
from specadapt.configs import yamlio
from specadapt.configs.checks import (
    FieldError,
    Problem,
    UnknownField,
    check_draft_len_schedule,
    check_spec,
    raise_on_errors,
    validate_fields,
)
from specadapt.configs.spec import SpecConfig
from specadapt.errors import UsageError

HEALTH_ROUTE = "/health"
CLI = "trtllm-serve"
F_CONFIG_NEW, F_CONFIG_OLD = "--config", "--extra_llm_api_options"
F_HOST, F_PORT, F_BACKEND, F_TP, F_MAX_SEQ = "--host", "--port", "--backend", "--tp_size", \
    "--max_seq_len"

# decoding types whose docs examples set disable_overlap_scheduler: true
# (docs/source/features/speculative-decoding.md: Draft/Target and NGram quick starts)
NO_OVERLAP_TYPES = ("NGram", "Draft_Target")
# decoding types that reject max_draft_len 0/None (EagleDecodingConfig.validate_eagle_config,
# NGram and Draft_Target validators in llm_args.py)
NEEDS_DRAFT_LEN = ("Eagle", "Eagle3", "NGram", "Draft_Target", "MTP")
NEEDS_MODEL = ("Eagle", "Eagle3", "Draft_Target", "Medusa")

BASE_KEYS: dict[str, str] = {
    "decoding_type": "which speculation algorithm (Eagle3, MTP, NGram, Draft_Target, ...)",
    "max_draft_len": "draft tokens per step (k)",
    "max_total_draft_tokens": "tree budget of draft tokens (>= max_draft_len)",
    "speculative_model": "draft model / EAGLE-3 head (path or HF id)",
    "speculative_model_dir": "alias of speculative_model",
    "max_concurrency": "speculation is off above this batch size (PyTorch backend)",
    "draft_len_schedule": "{batch_size: draft_len}; exclusive with max_concurrency",
    "acceptance_rate_threshold": "turn speculation off when acceptance drops below this",
    "acceptance_rate_window_size": "window (iterations) of that acceptance average",
    "load_format": "how the draft weights are loaded",
    "use_rejection_sampling": "rejection sampling for non-greedy batches",
    "enable_penalty": "apply penalties in the speculative sampler",
    "moe_backend": "MoE backend of the draft",
    "advanced_sampling_mode": "full | no_topk | no_topp | no_topk_no_topp",
}
TYPE_KEYS: dict[str, dict[str, str]] = {
    "NGram": {"max_matching_ngram_size": "longest suffix matched against the pool",
              "is_keep_all": "keep every candidate per pattern",
              "is_use_oldest": "propose the oldest candidate",
              "is_public_pool": "one pool shared by all requests"},
    "MTP": {"num_nextn_predict_layers": "MTP layers in the checkpoint (auto-populated)",
            "use_relaxed_acceptance_for_thinking": "LOSSY: accept any top-k token while "
                                                   "thinking",
            "relaxed_topk": "candidate set size of relaxed acceptance",
            "relaxed_delta": "log-prob margin of relaxed acceptance",
            "begin_thinking_phase_token": "token id that opens the thinking phase",
            "end_thinking_phase_token": "token id that closes the thinking phase",
            "use_mtp_vanilla": "vanilla (non-Eagle-style) MTP",
            "use_dynamic_tree": "tree drafting", "dynamic_tree_max_topK": "tree fan-out",
            "sa_config": "suffix-automaton enhancer"},
    "Eagle3": {"eagle3_layers_to_capture": "target layers whose hidden states feed the head",
               "eagle3_model_arch": "llama3 | mistral_large3",
               "eagle3_one_model": "one-model (draft as submodule) implementation",
               "use_dynamic_tree": "dynamic tree drafting",
               "dynamic_tree_max_topK": "tree fan-out per layer",
               "max_non_leaves_per_layer": "tree width", "num_eagle_layers": "TRT engine only",
               "sa_config": "suffix-automaton enhancer"},
    "Medusa": {"medusa_choices": "tree of head choices", "num_medusa_heads": "heads used"},
    "Draft_Target": {},
}
TYPE_KEYS["Eagle"] = {**TYPE_KEYS["Eagle3"], "eagle_choices": "static tree (deprecated)",
                      "greedy_sampling": "top-1 acceptance", "posterior_threshold": "typical "
                      "acceptance epsilon"}
# renamed or retired keys: key -> the sentence's tail (with the fix)
OLD_KEYS: dict[str, str] = {
    "acceptance_length_threshold": "the older name of acceptance_rate_threshold: rename it",
    "acceptance_window": "the older name of acceptance_rate_window_size: rename it",
    "prompt_lookup_num_tokens": "an old NGram field the current schema rejects: use "
                                "max_draft_len",
    "eagle_choices": "deprecated (static trees are removed in 1.4): use use_dynamic_tree",
}
# top-level trtllm-serve keys specadapt writes or explains
TOP_KEYS: dict[str, str] = {
    "speculative_config": "the speculative decoding settings",
    "enable_iter_perf_stats": "per-iteration stats on /metrics (specadapt reads acceptance "
                              "from them)",
    "disable_overlap_scheduler": "no overlap scheduler (docs set it for NGram, Draft_Target)",
    "return_perf_metrics": "per-request perf metrics and /prometheus/metrics",
    "dtype": "model dtype", "tensor_parallel_size": "GPUs for tensor parallelism",
    "max_seq_len": "max sequence length", "max_batch_size": "max requests per batch",
    "max_num_tokens": "max batched tokens", "kv_cache_config": "KV cache settings",
    "cuda_graph_config": "CUDA graph settings", "backend": "pytorch | tensorrt | _autodeploy",
}


def _validated(spec: SpecConfig, version: str | None, engine: str) -> V.Version:
    raise_on_errors(check_spec(spec, "trtllm", version, engine))
    return V.resolve_version("trtllm", version)


def trtllm_speculative_config(spec: SpecConfig, version: str | None = None,
                              engine: str = "pytorch") -> dict[str, Any] | None:
    """The ``speculative_config`` mapping, or None for method 'off'."""
    _validated(spec, version, engine)
    if not spec.enabled:
        return None
    out: dict[str, Any] = {"decoding_type": V.TRTLLM_DECODING_TYPE[spec.method],
                           "max_draft_len": spec.k}
    if spec.draft:
        out["speculative_model"] = spec.draft
    if spec.method == "ngram" and spec.ngram_max is not None:
        out["max_matching_ngram_size"] = spec.ngram_max
    if spec.max_concurrency is not None:
        out["max_concurrency"] = spec.max_concurrency
    if spec.draft_len_schedule is not None:
        out["draft_len_schedule"] = dict(sorted(spec.draft_len_schedule.items()))
    return {**out, **spec.native_extras.get("trtllm", {})}


def render_trtllm_config(spec: SpecConfig, version: str | None = None,
                         engine: str = "pytorch") -> dict[str, Any]:
    """The trtllm-serve config mapping (flat LlmArgs) for ``--config FILE``."""
    sc = trtllm_speculative_config(spec, version, engine)
    doc: dict[str, Any] = {}
    if sc is not None:
        doc["speculative_config"] = sc
        if sc["decoding_type"] in NO_OVERLAP_TYPES:
            doc["disable_overlap_scheduler"] = True
    if spec.dtype:
        doc["dtype"] = spec.dtype
    doc["enable_iter_perf_stats"] = True
    return doc


def render_trtllm_yaml(spec: SpecConfig, version: str | None = None,
                       engine: str = "pytorch") -> str:
    return yamlio.dump(render_trtllm_config(spec, version, engine))


def config_flag(version: str | None = None) -> str:
    """``--config`` from 1.2 (PR #9104), ``--extra_llm_api_options`` before."""
    ver = V.resolve_version("trtllm", version)
    return F_CONFIG_NEW if ver >= V.TRTLLM_CONFIG_FLAG_SINCE else F_CONFIG_OLD


def render_trtllm_argv(spec: SpecConfig, config_path: str, version: str | None = None,
                       engine: str = "pytorch", *, host: str = "0.0.0.0",
                       port: int = 8000) -> list[str]:
    """``trtllm-serve TARGET ... --config FILE`` (FILE holds render_trtllm_yaml)."""
    _validated(spec, version, engine)
    if not spec.target:
        raise UsageError("A target model is needed to render a server command: add --target.")
    argv = [CLI, spec.target, F_HOST, host, F_PORT, str(port), F_BACKEND, engine]
    if spec.tp != 1:
        argv += [F_TP, str(spec.tp)]
    if spec.max_model_len is not None:
        argv += [F_MAX_SEQ, str(spec.max_model_len)]
    return argv + [config_flag(version), config_path]


def trtllm_llm_kwargs(spec: SpecConfig, version: str | None = None,
                      engine: str = "pytorch") -> dict[str, Any]:
    """Keyword arguments for ``tensorrt_llm.LLM(**kwargs)`` (speculative_config as mapping)."""
    if not spec.target:
        raise UsageError("A target model is needed for the LLM API: add --target.")
    kwargs: dict[str, Any] = {"model": spec.target, "backend": engine,
                              "tensor_parallel_size": spec.tp}
    if spec.max_model_len is not None:
        kwargs["max_seq_len"] = spec.max_model_len
    kwargs.update(render_trtllm_config(spec, version, engine))
    return kwargs


# ---------------------------------------------------------------- reading and checking

_METHOD_OF = {v: k for k, v in V.TRTLLM_DECODING_TYPE.items()}
# SpecConfig field -> the speculative_config key that carries it
NEUTRAL_KEYS: dict[str, str] = {
    "method": "decoding_type", "k": "max_draft_len", "draft": "speculative_model",
    "ngram_max": "max_matching_ngram_size", "max_concurrency": "max_concurrency",
    "draft_len_schedule": "draft_len_schedule",
}
# the keys read into SpecConfig fields (the rest of a user's mapping is kept verbatim)
MAPPED_KEYS = frozenset({*NEUTRAL_KEYS.values(), "speculative_model_dir", "num_nextn_predict_layers"})


class TRTLLMSpecFields(BaseModel):
    """Types and ranges of the speculative_config keys that SpecConfig carries."""

    model_config = ConfigDict(extra="ignore")

    decoding_type: StrictStr
    max_draft_len: StrictInt | None = Field(None, ge=1)
    num_nextn_predict_layers: StrictInt | None = Field(None, ge=1)
    speculative_model: StrictStr | None = None
    speculative_model_dir: StrictStr | None = None
    max_matching_ngram_size: StrictInt | None = Field(None, ge=1)
    max_concurrency: StrictInt | None = Field(None, ge=1)
    draft_len_schedule: dict[int, StrictInt] | None = None


def read_trtllm_form(sc: dict[str, Any]) -> SpecConfig:
    """A ``speculative_config`` mapping -> SpecConfig. Keys TensorRT-LLM knows for the
    decoding type that SpecConfig has no field for (eagle3_one_model, is_keep_all, ...) are
    kept in ``native_extras["trtllm"]``. FieldError naming the key when one is unknown,
    renamed or out of range; UsageError for a draft_len_schedule TensorRT-LLM would refuse."""
    dt = sc.get("decoding_type")
    if dt is None:
        raise FieldError("decoding_type", f"is required (one of {', '.join(sorted(_METHOD_OF))})")
    if dt == "DraftTarget":
        raise FieldError("decoding_type", "'DraftTarget' (a spelling some docs use) is rejected by "
                                          "TensorRT-LLM's config classes: write 'Draft_Target'")
    if dt not in _METHOD_OF:
        raise FieldError("decoding_type", f"must be one of {', '.join(sorted(_METHOD_OF))}, not {dt!r}")
    known = {**BASE_KEYS, **TYPE_KEYS[dt]}
    for key in sc:
        if key in OLD_KEYS and key not in known:
            raise FieldError(key, OLD_KEYS[key])
        if key not in known:
            raise UnknownField(key)
    f = validate_fields(TRTLLMSpecFields, sc)
    if f.speculative_model and f.speculative_model_dir and f.speculative_model != f.speculative_model_dir:
        raise FieldError("speculative_model_dir", "is an alias of speculative_model: give one of them")
    if f.max_concurrency is not None and f.draft_len_schedule is not None:
        raise FieldError("draft_len_schedule", "excludes max_concurrency in TensorRT-LLM: keep one of them")
    k = f.max_draft_len or f.num_nextn_predict_layers
    if f.draft_len_schedule is not None:
        raise_on_errors(list(check_draft_len_schedule(f.draft_len_schedule, k)))
    extras = {key: value for key, value in sc.items() if key not in MAPPED_KEYS}
    return SpecConfig(method=_METHOD_OF[dt], k=k, draft=f.speculative_model or f.speculative_model_dir,
                      ngram_max=f.max_matching_ngram_size, max_concurrency=f.max_concurrency,
                      draft_len_schedule=f.draft_len_schedule,
                      native_extras={"trtllm": extras} if extras else {})


def check_trtllm_config(doc: Any, engine: str = "pytorch") -> list[Problem]:
    """Rules for a trtllm-serve config mapping (not the JSON schema; see schema_problems)."""
    if not isinstance(doc, dict):
        return [Problem("A trtllm-serve config must be a YAML mapping of LlmArgs keys.")]
    out: list[Problem] = []
    if not doc.get("enable_iter_perf_stats"):
        out.append(Problem("enable_iter_perf_stats is not true, so /metrics carries no "
                           "speculative-decoding stats: add 'enable_iter_perf_stats: true'.",
                           "warning"))
    sc = doc.get("speculative_config")
    if sc is None:
        return out
    if not isinstance(sc, dict):
        return out + [Problem("speculative_config must be a mapping with a decoding_type.")]
    return out + list(_speculative_rules(sc, engine))


def _speculative_rules(sc: dict[str, Any], engine: str):
    dt = sc.get("decoding_type")
    if dt == "DraftTarget":
        yield Problem("decoding_type 'DraftTarget' (a spelling some docs use) is rejected by "
                      "the config classes and schema: write 'Draft_Target'.")
        dt = "Draft_Target"
    if dt not in TYPE_KEYS:
        yield Problem(f"decoding_type {dt!r} is not one specadapt checks: use one of "
                      f"{', '.join(sorted(TYPE_KEYS))}.")
        return
    method = _METHOD_OF.get(dt)
    if dt == "Eagle" and engine == "pytorch":
        # docs/source/features/speculative-decoding.md: "decoding_type: Eagle is accepted as
        # a backward-compatible alias for Eagle3, but EAGLE (v1/v2) draft checkpoints are
        # incompatible"
        yield Problem("decoding_type Eagle is read as Eagle3 on the PyTorch backend: the head "
                      "must be an EAGLE-3 checkpoint (EAGLE-1/2 heads do not load); write "
                      "'Eagle3' to say so.", "warning")
    elif method not in V.TRTLLM_ENGINE_METHODS[engine]:
        hint = " (Eagle3 runs only on the PyTorch backend)" if dt == "Eagle3" else ""
        ok = ", ".join(V.TRTLLM_DECODING_TYPE[m] for m in V.TRTLLM_ENGINE_METHODS[engine])
        yield Problem(f"decoding_type {dt} is not supported on the {engine} backend{hint}: "
                      f"use one of {ok}.")
    k = sc.get("max_draft_len")
    nextn = sc.get("num_nextn_predict_layers")
    if dt == "MTP" and k is None and isinstance(nextn, int) and nextn > 0:
        # docs/source/deployment-guide (1.0-1.1 era) set MTP depth this way; the current
        # schema says "auto-populated ... do not set manually"
        yield Problem("num_nextn_predict_layers is the older way to set the MTP depth: "
                      f"write 'max_draft_len: {nextn}' instead.", "warning")
    elif dt in NEEDS_DRAFT_LEN and (not isinstance(k, int) or isinstance(k, bool) or k <= 0):
        yield Problem(f"max_draft_len must be an integer > 0 for {dt}: set it (3 is typical).")
    if dt in NEEDS_MODEL and not (sc.get("speculative_model") or sc.get("speculative_model_dir")):
        yield Problem(f"{dt} needs speculative_model (the draft or head path): add it.")
    if "max_concurrency" in sc and "draft_len_schedule" in sc:
        yield Problem("max_concurrency and draft_len_schedule are mutually exclusive: keep "
                      "one.")
    if sc.get("draft_len_schedule") is not None:
        yield from check_draft_len_schedule(sc["draft_len_schedule"],
                                            k if isinstance(k, int) else None)
    if sc.get("use_relaxed_acceptance_for_thinking"):
        yield Problem("use_relaxed_acceptance_for_thinking makes MTP lossy (outputs differ "
                      "from the target's); turn it off for identical outputs.", "warning")
    known = {**BASE_KEYS, **TYPE_KEYS[dt]}
    for key in sc:
        if key in OLD_KEYS:
            yield Problem(f"Key '{key}' is {OLD_KEYS[key]}.",
                          "error" if key == "prompt_lookup_num_tokens" else "warning")
        elif key not in known:
            yield Problem(f"Key '{key}' is not a known {dt} setting and TensorRT-LLM rejects "
                          "unknown keys: check the spelling, or validate with --schema.",
                          "warning")


def load_schema(path: str | Path) -> dict[str, Any]:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise UsageError(f"Cannot read the JSON schema {path} ({exc}): pass the "
                         "trtllm-serve config schema file.") from exc


def schema_problems(doc: dict[str, Any], schema: dict[str, Any]) -> list[Problem]:
    """Validate ``doc['speculative_config']`` (or the whole doc, when the schema is the full
    trtllm-serve schema) against TensorRT-LLM's published JSON schema."""
    full = "speculative_config" in schema.get("properties", {})
    instance = doc if full else doc.get("speculative_config")
    instance = _json_keys(instance)
    if not full:
        schema = _narrow_to_decoding_type(schema, instance)
    validator = jsonschema.Draft202012Validator(schema)
    out = []
    for err in sorted(validator.iter_errors(instance), key=lambda e: list(e.path)):
        where = ".".join(str(p) for p in err.path) or "speculative_config"
        out.append(Problem(f"Schema: {where}: {err.message.splitlines()[0]}; fix that value."))
    return out


def _narrow_to_decoding_type(schema: dict[str, Any], instance: Any) -> dict[str, Any]:
    """Validate against the one config class the discriminator picks (clearer messages)."""
    if not isinstance(instance, dict):
        return schema
    for branch in schema.get("anyOf", []):
        mapping = branch.get("discriminator", {}).get("mapping", {})
        ref = mapping.get(instance.get("decoding_type"))
        if ref:
            return {"$ref": ref, "$defs": schema.get("$defs", {})}
        if mapping:
            return {"$defs": schema.get("$defs", {}), "type": "object", "required":
                    ["decoding_type"], "properties": {"decoding_type": {"enum": sorted(mapping)}}}
    return schema


def _json_keys(value: Any) -> Any:
    """YAML int keys (draft_len_schedule) -> strings, as in JSON."""
    if isinstance(value, dict):
        return {str(k): _json_keys(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_keys(v) for v in value]
    return value

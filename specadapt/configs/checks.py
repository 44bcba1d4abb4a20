"""Validation rules for speculative-decoding configs, per backend and version.

Each rule yields one ``Problem``: a sentence that says what is wrong and how to fix it.
Sources of the rules (checked against upstream, not copied):
  vLLM 0.32.0  vllm/config/speculative.py (SpeculativeConfig.__post_init__, _verify_args,
               _verify_and_get_draft_tp), vllm/v1/spec_decode/dynamic/utils.py
  TRT-LLM      tensorrt_llm/llmapi/llm_args.py (DecodingBaseConfig validators,
               EagleDecodingConfig.validate_eagle_config; main, 2026) and
               docs/source/features/speculative-decoding.md
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ValidationError

from specadapt.configs import versions as V
from specadapt.configs.spec import NEEDS_DRAFT, SpecConfig
from specadapt.errors import UsageError
from specadapt.records.schedule import schedule_problems

Severity = Literal["error", "warning"]


@dataclass(frozen=True)
class Problem:
    """One finding: ``message`` is a full sentence including the fix."""

    message: str
    severity: Severity = "error"

    def __str__(self) -> str:
        return self.message if self.severity == "error" else f"warning: {self.message}"


def errors(problems: list[Problem]) -> list[Problem]:
    return [p for p in problems if p.severity == "error"]


def raise_on_errors(problems: list[Problem]) -> list[Problem]:
    """Raise UsageError naming every error (one line); return the warnings."""
    errs = errors(problems)
    if errs:
        raise UsageError(" ".join(p.message for p in errs))
    return [p for p in problems if p.severity == "warning"]


# --------------------------------------------------------------------------- one field

class FieldError(ValueError):
    """One field of a config the user wrote is wrong: ``field`` as the user spelled it and
    ``problem`` as a phrase (``num_speculative_tokens``, ``must be >= 1``)."""

    def __init__(self, field: str, problem: str):
        super().__init__(f"{field}: {problem}")
        self.field, self.problem = field, problem


class UnknownField(FieldError):
    """A key no field of the form has (the caller lists the fields there are)."""

    def __init__(self, field: str):
        super().__init__(field, "unknown field")


Model = TypeVar("Model", bound=BaseModel)


def validate_fields(model: type[Model], data: dict[str, Any]) -> Model:
    """``model(**data)``, its first validation error as a FieldError naming the key."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        path = [str(p) for p in err["loc"]]
        field = path[0] + "".join(f"[{p}]" for p in path[1:])
        if err["type"] == "extra_forbidden":
            raise UnknownField(path[0]) from None
        raise FieldError(field, _phrase(err)) from None


def _phrase(err: Any) -> str:
    kind, ctx = err["type"], err.get("ctx") or {}
    if kind == "greater_than_equal":
        return f"must be >= {ctx['ge']}"
    if kind == "greater_than":
        return f"must be > {ctx['gt']}"
    if kind in ("int_type", "int_parsing", "int_from_float"):
        return "must be an integer"
    if kind == "missing":
        return "is required"
    if kind == "literal_error":
        return f"must be one of {ctx['expected']}"
    msg = str(err["msg"])
    if msg.startswith("Input should be "):
        return "must be " + msg.removeprefix("Input should be ")
    return msg[:1].lower() + msg[1:]


# --------------------------------------------------------------------------- SpecConfig

@dataclass(frozen=True)
class Rules:
    """What one server of `specadapt config` checks: the methods a version (and TensorRT-LLM
    engine) runs, how to say so, and the rules for an enabled spec."""

    where: Callable[[V.Version, str], str]  # (version, engine) -> "vLLM 0.32.0"
    methods: Callable[[V.Version, str], tuple[str, ...]]  # UsageError for an engine it does not have
    hint: Callable[[SpecConfig, V.Version, str], str]  # why an unsupported method is not run there ("" or " ...")
    rules: Callable[[SpecConfig, V.Version, str], Iterator[Problem]]


def check_spec(spec: SpecConfig, backend: str, version: str | None = None,
               engine: str = "pytorch") -> list[Problem]:
    """All rules for ``spec`` on ``backend`` at ``version`` (default: newest)."""
    rules = RULES.get(backend)
    if rules is None:
        raise UsageError(f"Unknown backend '{backend}': use one of {', '.join(V.BACKENDS)}.")
    ver = V.resolve_version(backend, version)
    problems = list(_method_supported(spec, rules, ver, engine))
    if spec.method == "off":
        return problems + list(_off_rules(spec))
    problems += list(_common_rules(spec))
    return problems + list(rules.rules(spec, ver, engine))


def _method_supported(spec: SpecConfig, rules: Rules, ver: V.Version, engine: str) -> Iterator[Problem]:
    supported = rules.methods(ver, engine)
    if spec.method in supported:
        return
    yield Problem(f"{rules.where(ver, engine)} does not support method '{spec.method}'; it supports: "
                  f"{', '.join(supported)}.{rules.hint(spec, ver, engine)}")


def _vllm_hint(spec: SpecConfig, ver: V.Version, engine: str) -> str:
    return " Newer methods need vLLM >= 0.8 (--backend-version)." if ver < V.VLLM_JSON_SINCE else ""


def _trtllm_methods(ver: V.Version, engine: str) -> tuple[str, ...]:
    if engine not in V.TRTLLM_ENGINE_METHODS:
        raise UsageError(f"Unknown TensorRT-LLM engine backend '{engine}': use pytorch or tensorrt.")
    return V.trtllm_methods(engine)


def _trtllm_hint(spec: SpecConfig, ver: V.Version, engine: str) -> str:
    if spec.method == "eagle3":
        return " Eagle3 runs only on the PyTorch backend: use --trtllm-backend pytorch."
    if spec.method == "eagle" and engine == "pytorch":
        return (" The PyTorch backend reads only EAGLE-3 heads: use method eagle3 with an "
                "EAGLE-3 checkpoint.")
    return ""


def _off_rules(spec: SpecConfig) -> Iterator[Problem]:
    values = spec.model_dump()
    for name in ("k", "draft", "ngram_min", "ngram_max", "draft_tp", "k_per_batch_size",
                 "max_concurrency", "draft_len_schedule"):
        if values[name] is not None:
            yield Problem(f"Method 'off' deploys without speculation, so '{name}' has no "
                          f"effect: remove it or choose a speculation method.")


def _common_rules(spec: SpecConfig) -> Iterator[Problem]:
    m = spec.method
    # vLLM 0.32 _verify_args: num_speculative_tokens required (suffix defaults it to the
    # tree depth); TRT-LLM: max_draft_len > 0 for Eagle/NGram/Draft_Target
    if spec.k is None and m != "suffix":
        yield Problem(f"Method '{m}' needs k, the number of draft tokens per step: "
                      "add --k N (N > 0, 2 to 5 is typical).")
    # vLLM 0.32 __post_init__: "num_speculative_tokens was provided but without speculative
    # model" for every method but ngram/suffix/mtp; TRT-LLM: speculative_model for Eagle3,
    # Draft_Target
    if m in NEEDS_DRAFT and not spec.draft:
        yield Problem(f"Method '{m}' needs a draft (a draft model, EAGLE head or Medusa "
                      "heads): add --draft PATH_OR_HF_ID.")
    if m in ("ngram", "suffix") and spec.draft:
        yield Problem(f"Method '{m}' drafts from the context and takes no draft model: "
                      "remove --draft, or use method draft_model.")
    if m != "ngram" and (spec.ngram_min is not None or spec.ngram_max is not None):
        yield Problem(f"The n-gram window only applies to method ngram, not '{m}': "
                      "remove --ngram-min/--ngram-max.")
    # vLLM 0.32 __post_init__: prompt_lookup_min <= prompt_lookup_max
    if spec.ngram_min is not None and spec.ngram_max is not None \
            and spec.ngram_min > spec.ngram_max:
        yield Problem(f"ngram_min={spec.ngram_min} is larger than ngram_max="
                      f"{spec.ngram_max}: make ngram_min <= ngram_max.")
    # vLLM 0.32 _verify_and_get_draft_tp: 1 or the target's tensor_parallel_size
    if spec.draft_tp is not None and spec.draft_tp not in (1, spec.tp):
        yield Problem(f"Draft tensor parallel size {spec.draft_tp} must be 1 or the "
                      f"target's tp ({spec.tp}): set --draft-tp 1 or --draft-tp {spec.tp}.")
    if spec.draft_tp is not None and m in ("ngram", "suffix"):
        yield Problem(f"Method '{m}' has no draft model to parallelize: remove --draft-tp.")


def _vllm_rules(spec: SpecConfig, ver: V.Version, engine: str = "pytorch") -> Iterator[Problem]:
    if spec.max_concurrency is not None or spec.draft_len_schedule is not None:
        yield Problem("max_concurrency and draft_len_schedule are TensorRT-LLM settings: on "
                      "vLLM use k_per_batch_size ([[1, END, K], ...]) to turn speculation "
                      "down at high load.")
    if spec.k_per_batch_size is not None:
        if ver < V.VLLM_JSON_SINCE:
            yield Problem("vLLM <= 0.7 cannot vary k by batch size with these flags: drop "
                          "k_per_batch_size or target vLLM >= 0.32.")
        elif ver < V.VLLM_BATCH_SCHEDULE_SINCE:
            yield Problem(f"num_speculative_tokens_per_batch_size was checked in vLLM "
                          f"{V.fmt(V.VLLM_BATCH_SCHEDULE_SINCE)}, not in {V.fmt(ver)}: "
                          "confirm your version accepts it.", "warning")
        yield from check_batch_schedule(spec.k_per_batch_size, spec.k)
    # vLLM 0.32 _validate_suffix_decoding: ImportError without arctic-inference
    if spec.method == "suffix":
        yield Problem("Suffix decoding needs the arctic-inference package in the server's "
                      "environment (pip install arctic-inference); vLLM refuses to start "
                      "without it.", "warning")
    if ver < V.VLLM_JSON_SINCE and spec.method == "ngram" and spec.ngram_max is None:
        yield Problem("vLLM <= 0.7 needs the n-gram window for [ngram]: add --ngram-max N "
                      "(and optionally --ngram-min).")


def check_batch_schedule(schedule: list, k: int | None) -> Iterator[Problem]:
    """vLLM num_speculative_tokens_per_batch_size: [[start, end, k], ...] (0.32.0)."""
    for message in schedule_problems(schedule, k):
        yield Problem(message)


def _trtllm_rules(spec: SpecConfig, ver: V.Version, engine: str) -> Iterator[Problem]:
    if spec.k_per_batch_size is not None:
        yield Problem("k_per_batch_size is a vLLM setting: on TensorRT-LLM use "
                      "max_concurrency or draft_len_schedule.")
    # TRT-LLM DecodingBaseConfig.validate_max_concurrency_and_draft_len_schedule_...
    if spec.max_concurrency is not None and spec.draft_len_schedule is not None:
        yield Problem("max_concurrency and draft_len_schedule are mutually exclusive in "
                      "TensorRT-LLM: keep max_concurrency for a simple cut-off, or "
                      "draft_len_schedule for per-batch-size draft lengths.")
    if spec.draft_len_schedule is not None:
        yield from check_draft_len_schedule(spec.draft_len_schedule, spec.k)
    # TRT-LLM 1.x DecodingBaseConfig has no draft TP field (schema at 20e20312)
    if spec.draft_tp is not None and spec.draft_tp != spec.tp:
        yield Problem(f"TensorRT-LLM runs the draft with the target's tensor parallel size "
                      f"({spec.tp}) and has no separate draft TP: remove --draft-tp.")
    # TRT-LLM NGramDecodingConfig: only max_matching_ngram_size
    if spec.method == "ngram" and spec.ngram_min is not None:
        yield Problem("TensorRT-LLM NGram has no minimum match length; ngram_min is ignored "
                      "(ngram_max becomes max_matching_ngram_size).", "warning")


def check_draft_len_schedule(schedule: dict, k: int | None) -> Iterator[Problem]:
    """TRT-LLM DecodingBaseConfig.validate_draft_len_schedule_and_sort (main, 2026)."""
    try:
        items = {int(b): int(d) for b, d in schedule.items()}
    except (TypeError, ValueError, AttributeError):
        yield Problem("draft_len_schedule must map batch sizes to draft lengths, "
                      "e.g. {4: 3, 8: 2, 32: 1}.")
        return
    if not items:
        return
    for b, d in items.items():
        if b < 1 or d < 0:
            yield Problem(f"draft_len_schedule entry {b}: {d} needs batch size >= 1 and "
                          "draft length >= 0: fix that entry.")
        elif k is not None and d > k:
            yield Problem(f"draft_len_schedule gives batch size {b} draft length {d}, more "
                          f"than k={k}: lower it or raise k.")
    smallest = min(items)
    if k is not None and items[smallest] != k:
        yield Problem(f"draft_len_schedule[{smallest}] (the smallest batch size) must equal "
                      f"k={k}: set it to {k}.")


# the servers whose configs `specadapt config` writes, and the rules it checks them by
RULES: dict[str, Rules] = {
    "vllm": Rules(where=lambda ver, engine: f"vLLM {V.fmt(ver)}", methods=lambda ver, engine: V.vllm_methods(ver),
                  hint=_vllm_hint, rules=_vllm_rules),
    "trtllm": Rules(where=lambda ver, engine: f"TensorRT-LLM ({engine} backend)", methods=_trtllm_methods,
                    hint=_trtllm_hint, rules=_trtllm_rules),
}


# ------------------------------------------------------------------------ model dirs

def load_model_config(path: str | Path) -> dict[str, Any] | None:
    """config.json of a local model dir, or None when ``path`` is not a local dir."""
    cfg = Path(path) / "config.json"
    if not cfg.is_file():
        return None
    try:
        return json.loads(cfg.read_text())
    except (OSError, ValueError) as exc:
        raise UsageError(f"{cfg} is not readable JSON ({exc}): fix or re-download it.") from exc


def _text_cfg(cfg: dict[str, Any]) -> dict[str, Any]:
    return cfg.get("text_config") or cfg


def _max_len(cfg: dict[str, Any]) -> int | None:
    t = _text_cfg(cfg)
    for key in ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length"):
        if isinstance(t.get(key), int):
            return t[key]
    return None


def check_model_dirs(spec: SpecConfig, target_dir: str | Path | None = None,
                     draft_dir: str | Path | None = None) -> list[Problem]:
    """Checks that need the models' config/tokenizer files (local directories only)."""
    target_dir = target_dir or spec.target
    draft_dir = draft_dir or spec.draft
    tcfg = load_model_config(target_dir) if target_dir else None
    dcfg = load_model_config(draft_dir) if draft_dir else None
    problems: list[Problem] = []
    if tcfg is not None:
        problems += list(_length_rules(spec, tcfg, dcfg))
        problems += list(_mtp_rules(spec, tcfg, dcfg))
    if tcfg is not None and dcfg is not None:
        if spec.method == "draft_model":
            problems += list(_vocab_rules(tcfg, dcfg))
            problems += list(compare_tokenizers(Path(target_dir), Path(draft_dir)))
        if spec.method in ("eagle", "eagle3", "medusa", "mtp"):
            problems += list(_hidden_rules(spec.method, tcfg, dcfg))
    return problems


def _length_rules(spec: SpecConfig, tcfg: dict, dcfg: dict | None) -> Iterator[Problem]:
    if spec.max_model_len is None:
        return
    tmax = _max_len(tcfg)
    if tmax is not None and spec.max_model_len > tmax:
        yield Problem(f"max_model_len={spec.max_model_len} exceeds the target's "
                      f"{tmax} positions: lower --max-model-len to {tmax} or less.")
    dmax = _max_len(dcfg) if dcfg and spec.method == "draft_model" else None
    if dmax is not None and spec.max_model_len > dmax:
        yield Problem(f"max_model_len={spec.max_model_len} exceeds the draft's {dmax} "
                      f"positions: lower --max-model-len to {dmax} or use a draft with a "
                      "longer context (past it, nothing is speculated).")


def _vocab_rules(tcfg: dict, dcfg: dict) -> Iterator[Problem]:
    tv, dv = _text_cfg(tcfg).get("vocab_size"), _text_cfg(dcfg).get("vocab_size")
    if tv is not None and dv is not None and tv != dv:
        yield Problem(f"Draft vocab size {dv} differs from the target's {tv}: use a draft "
                      "trained with the target's tokenizer (same model family).")


def _hidden_rules(method: str, tcfg: dict, dcfg: dict) -> Iterator[Problem]:
    th, dh = _text_cfg(tcfg).get("hidden_size"), _text_cfg(dcfg).get("hidden_size")
    # an EAGLE-3 head may declare the target's width separately (target_hidden_size)
    expected = _text_cfg(dcfg).get("target_hidden_size", dh)
    if th is not None and expected is not None and th != expected:
        yield Problem(f"The {method} head expects hidden size {expected} but the target has "
                      f"{th}: use the head trained for this target model.")


def _mtp_rules(spec: SpecConfig, tcfg: dict, dcfg: dict | None) -> Iterator[Problem]:
    if spec.method != "mtp":
        return
    src = dcfg if dcfg is not None else tcfg
    n = _text_cfg(src).get("num_nextn_predict_layers")
    if not n:
        if dcfg is None:
            yield Problem("Method mtp needs a target with built-in MTP layers "
                          "(num_nextn_predict_layers in config.json) and this target has "
                          "none: add --draft with MTP heads or choose another method.")
        return
    # vLLM 0.32 SpeculativeConfig.__post_init__: k > n_predict must divide evenly
    if spec.k is not None and spec.k > n and spec.k % n:
        yield Problem(f"k={spec.k} is larger than the {n} MTP layers and not a multiple "
                      f"of {n}: use k <= {n} or a multiple of {n}.")


def _token_map(model_dir: Path) -> dict[str, int] | None:
    """token -> id from tokenizer.json (model vocab + added tokens) or vocab.json."""
    tj = model_dir / "tokenizer.json"
    if tj.is_file():
        data = json.loads(tj.read_text())
        vocab = dict(data.get("model", {}).get("vocab") or {})
        if isinstance(data.get("model", {}).get("vocab"), list):  # unigram: [[tok, score]]
            vocab = {tok: i for i, (tok, _) in enumerate(data["model"]["vocab"])}
        for added in data.get("added_tokens", []):
            vocab[added["content"]] = added["id"]
        return vocab
    vj = model_dir / "vocab.json"
    if vj.is_file():
        return json.loads(vj.read_text())
    return None


def compare_tokenizers(target_dir: Path, draft_dir: Path, show: int = 3) -> Iterator[Problem]:
    """Equal token->id maps, or a sentence naming the first ids that differ."""
    tmap, dmap = _token_map(target_dir), _token_map(draft_dir)
    if tmap is None or dmap is None:
        return
    if tmap == dmap:
        return
    t_by_id = {i: t for t, i in tmap.items()}
    d_by_id = {i: t for t, i in dmap.items()}
    diffs = [i for i in sorted(set(t_by_id) | set(d_by_id)) if t_by_id.get(i) != d_by_id.get(i)]
    shown = ", ".join(f"id {i}: target {t_by_id.get(i)!r} vs draft {d_by_id.get(i)!r}"
                      for i in diffs[:show])
    yield Problem(f"Draft and target tokenizers differ at {len(diffs)} ids (first: {shown}): "
                  "use a draft trained with the target's tokenizer.")

"""Reading ``--spec-config``: the neutral form or the backend's own, inline or from a file.

The value is inline JSON (``{...}``), inline server flags (``--speculative-algorithm EAGLE
...``) or a .json/.yaml file holding either a mapping (a whole vLLM or trtllm-serve config
file is unwrapped to its ``speculative_config``) or the flags as text. The form is told by
its keys; every backend takes the neutral form, and its own:

    neutral   the fields `specadapt config` takes: method, k, draft, ngram_min, ngram_max,
              draft_tp, k_per_batch_size, max_concurrency, draft_len_schedule ("ngram-max"
              works too)
    vllm      vLLM's speculative-config JSON (method, num_speculative_tokens, model, ...)
              for --backend vllm and reference
    trtllm    TensorRT-LLM's speculative_config (decoding_type, max_draft_len, ...)
    sglang    SGLang's --speculative-* flags, as a string or a mapping
    llamacpp  llama-cpp-python's --draft_model / --draft_model_num_pred_tokens flags

Which forms a backend takes, and which neutral fields it honours, it declares itself: a
``SpecSupport`` on its Backend class (adapters/base.py); ``read_spec_config`` reads a value
for one backend's declaration. The result is one SpecConfig, which each adapter renders
into its own form. Anything wrong is one UsageError line naming the field:
``--spec-config: num_speculative_tokens: must be >= 1``.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_serializer, field_validator, model_validator

from specadapt.configs import llamacpp, sglang, trtllm, vllm
from specadapt.configs import versions as V
from specadapt.configs.checks import FieldError, UnknownField, check_batch_schedule, raise_on_errors, validate_fields
from specadapt.configs.spec import METHODS, NEEDS_DRAFT, NO_DRAFT, SpecConfig
from specadapt.errors import UsageError

FLAG = "--spec-config"
# the SpecConfig fields that say how to speculate (the rest are server settings)
NEUTRAL_FIELDS = ("method", "k", "draft", "ngram_min", "ngram_max", "draft_tp", "k_per_batch_size",
                  "max_concurrency", "draft_len_schedule")
SERVER_FIELDS = {"target": "--model", "tp": "the backend's own option", "dtype": "--dtype",
                 "max_model_len": "--max-model-len"}


@dataclass(frozen=True)
class Form:
    """One way of writing a speculative config."""

    name: str
    fields: tuple[str, ...]  # the keys it has, as the user writes them (listed in errors)
    read: Callable[[dict[str, Any]], SpecConfig]
    names: dict[str, str] = field(default_factory=dict)  # SpecConfig field -> this form's key
    canonical: Callable[[str], str] = str  # a user's spelling of a key -> the form's spelling
    fields_in: Callable[[dict[str, Any]], tuple[str, ...] | None] = lambda data: None  # the keys ``data`` may
    # have, where they depend on what it says (TensorRT-LLM's decoding_type); None: ``fields``


def _read_neutral(d: dict[str, Any]) -> SpecConfig:
    for key, value in d.items():
        if key in SERVER_FIELDS:
            raise FieldError(key, f"is a server setting, not a speculative one: use {SERVER_FIELDS[key]}")
        if key == "native_extras":
            raise FieldError(key, "is filled from a backend's own form: write that form to set its other keys")
        if key not in NEUTRAL_FIELDS:
            raise UnknownField(key)
        if isinstance(value, bool):
            raise FieldError(key, f"must not be {json.dumps(value)}")
    if "method" not in d:
        raise FieldError("method", f"is required (one of {', '.join(METHODS)})")
    return validate_fields(SpecConfig, d)


def _trtllm_fields(data: dict[str, Any]) -> tuple[str, ...] | None:
    """The keys of TensorRT-LLM's speculative_config for the decoding_type ``data`` names."""
    kind = data.get("decoding_type")
    return (*trtllm.BASE_KEYS, *trtllm.TYPE_KEYS[kind]) if kind in trtllm.TYPE_KEYS else None


FORMS: dict[str, Form] = {f.name: f for f in (
    Form("neutral", NEUTRAL_FIELDS, _read_neutral, canonical=lambda k: k.replace("-", "_")),
    Form("vllm", tuple(vllm.SPEC_KEYS), vllm.read_vllm_form, vllm.NEUTRAL_KEYS),
    Form("trtllm", tuple(dict.fromkeys([*trtllm.BASE_KEYS, *(k for t in trtllm.TYPE_KEYS.values() for k in t)])),
         trtllm.read_trtllm_form, trtllm.NEUTRAL_KEYS, fields_in=_trtllm_fields),
    Form("sglang", sglang.SPEC_FLAGS, sglang.read_sglang_flags, sglang.NEUTRAL_KEYS,
         canonical=lambda k: "--" + k.lstrip("-").replace("_", "-")),
    Form("llamacpp", llamacpp.SPEC_FLAGS, llamacpp.read_llamacpp_flags, llamacpp.NEUTRAL_KEYS,
         canonical=lambda k: "--" + k.lstrip("-").replace("-", "_")),
)}
# keys recognised by their form though the form does not list them (retired or alias names)
_ALSO = {"vllm": tuple(vllm.GONE_KEYS), "trtllm": tuple(trtllm.OLD_KEYS)}


class SpecSupport(BaseModel):
    """What a backend takes in ``--spec-config`` and honours when it starts a server, as its
    Backend class declares it (``spec_support``). The defaults: the neutral form only, every
    neutral field, no per-batch-size schedule, no configs-package rules."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    form: str | None = Field(None, description="Its server's own form, taken beside the neutral one (one of "
                                               "vllm, trtllm, sglang, llamacpp); None: the neutral form only.")
    fields: frozenset[str] | None = Field(None, description="The neutral fields it honours (method among them); a "
                                                            "setting outside them is refused rather than dropped. "
                                                            "None: every neutral field.")
    native_extras: bool = Field(False, description="Keys of its own form that no neutral field holds reach its "
                                                   "server (SpecConfig.native_extras); False: they are refused.")
    batch_schedule: bool = Field(False, description="A server it starts applies k_per_batch_size, a draft length "
                                                    "per batch-size range (tune verifies a schedule on one).")
    rules: str | None = Field(None, description="The `specadapt config` target whose rules check a spec config "
                                                "before a server starts (vllm, trtllm); None: no such rules.")

    @field_validator("form")
    @classmethod
    def _known_form(cls, form: str | None) -> str | None:
        own = [name for name in FORMS if name != "neutral"]
        if form is not None and form not in own:
            raise ValueError(f"{form!r} is not a --spec-config form: use one of {', '.join(own)}, or None for the "
                             "neutral form only")
        return form

    @field_validator("fields")
    @classmethod
    def _neutral_fields(cls, fields: frozenset[str] | None) -> frozenset[str] | None:
        if fields is None:
            return None
        unknown = sorted(fields - set(NEUTRAL_FIELDS))
        if unknown:
            raise ValueError(f"{', '.join(unknown)}: not a neutral field (choose from {', '.join(NEUTRAL_FIELDS)})")
        if "method" not in fields:
            raise ValueError("must hold method (every spec config has one)")
        return fields

    @field_validator("rules")
    @classmethod
    def _known_rules(cls, rules: str | None) -> str | None:
        if rules is not None and rules not in V.BACKENDS:
            raise ValueError(f"{rules!r} has no rules in specadapt: use one of {', '.join(V.BACKENDS)}, or None")
        return rules

    @model_validator(mode="after")
    def _consistent(self) -> SpecSupport:
        if self.batch_schedule and not self.honours("k_per_batch_size"):
            raise ValueError("batch_schedule is declared but fields leave out k_per_batch_size, the schedule's field")
        if self.native_extras and self.form is None:
            raise ValueError("native_extras is declared without a form whose keys they would be")
        return self

    @field_serializer("fields")
    def _listed(self, fields: frozenset[str] | None) -> list[str] | None:
        return None if fields is None else [f for f in NEUTRAL_FIELDS if f in fields]

    @property
    def forms(self) -> list[str]:
        """The forms it takes: the neutral one, then its own."""
        return ["neutral", self.form] if self.form else ["neutral"]

    def honours(self, field: str) -> bool:
        """Whether a server it starts applies the neutral ``field``."""
        return self.fields is None or field in self.fields


# ---------------------------------------------------------------------------- reading the value

def read_spec_config(value: str, backend: str, support: SpecSupport) -> SpecConfig:
    """``--spec-config`` VALUE for ``--backend backend``, which declares ``support`` -> SpecConfig,
    or one UsageError line."""
    data = read_value(value)
    try:
        return parse_spec_config(data, backend, support)
    except FieldError as exc:
        raise UsageError(f"{FLAG}: {_field_message(exc, data, backend, support)}") from None
    except UsageError as exc:
        raise UsageError(f"{FLAG}: {str(exc).rstrip('.')}") from None


def read_value(value: str) -> dict[str, Any]:
    """Inline JSON, inline flags or a file -> a mapping (flags become {flag: value})."""
    text = value.strip()
    if text.startswith("{"):
        try:
            data: Any = json.loads(text)
        except json.JSONDecodeError as exc:
            raise UsageError(
                f"{FLAG} is not valid JSON ({exc.msg} at column {exc.colno}): "
                'give a JSON object such as \'{"method": "ngram", "k": 4}\' or a file path') from exc
        return data
    if text.startswith("-"):
        return flags_to_mapping(text)
    path = Path(text).expanduser()
    if not path.is_file():
        raise UsageError(f"{FLAG} {text!r} is neither a JSON object nor an existing file")
    try:
        data = yaml.safe_load(path.read_text())  # YAML is a superset of JSON
    except yaml.YAMLError as exc:
        raise UsageError(f"{path} is not valid JSON or YAML: {str(exc).splitlines()[0]}") from exc
    if isinstance(data, str) and data.strip().startswith("-"):
        return flags_to_mapping(data)
    if isinstance(data, dict):
        data = _unwrap(data)
    if not isinstance(data, dict):
        raise UsageError(f"{path} must hold a JSON object (a mapping) or server flags, not {type(data).__name__}")
    return data


def _unwrap(data: dict[str, Any]) -> Any:
    """A whole vLLM or trtllm-serve config file -> its speculative config."""
    for key in ("speculative_config", "speculative-config"):
        if key in data:
            inner = data[key]
            if isinstance(inner, str):  # older vLLM YAML files hold the JSON as a string
                try:
                    inner = json.loads(inner)
                except ValueError as exc:
                    raise UsageError(f"{key} in the file is not valid JSON ({exc})") from exc
            return inner
    return data


def flags_to_mapping(text: str) -> dict[str, str]:
    """``--a 1 --b=2`` -> ``{"--a": "1", "--b": "2"}``."""
    try:
        argv = shlex.split(text)
    except ValueError as exc:
        raise UsageError(f"{FLAG} flags cannot be split ({exc}): check the quotes") from exc
    out: dict[str, str] = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if not arg.startswith("--"):
            raise UsageError(f"{FLAG}: {arg!r} is not a --flag: write --flag VALUE pairs")
        name, eq, val = arg.partition("=")
        if not eq:
            if i + 1 >= len(argv) or argv[i + 1].startswith("--"):
                raise UsageError(f"{FLAG}: {name}: needs a value")
            val, i = argv[i + 1], i + 1
        out[name] = val
        i += 1
    return out


# ---------------------------------------------------------------------------- forms

def detect_form(data: dict[str, Any]) -> str:
    """The form whose own keys ``data`` uses (keys several forms share, like "method", do not
    count); "neutral" when none does. UsageError when two forms are mixed."""
    hits = {name: {k for k in data if _knows(form, k)} for name, form in FORMS.items()}
    own = {name: sorted(keys - set().union(*(v for n, v in hits.items() if n != name)))
           for name, keys in hits.items()}
    found = [name for name, keys in own.items() if keys]
    if len(found) > 1:
        mixed = " and ".join(f"{name} form fields ({', '.join(own[name])})" for name in found)
        raise UsageError(f"mixes {mixed}: write one form")
    return found[0] if found else "neutral"


def _knows(form: Form, key: str) -> bool:
    k = form.canonical(key)
    return k in form.fields or k in _ALSO.get(form.name, ())


def parse_spec_config(data: dict[str, Any], backend: str, support: SpecSupport) -> SpecConfig:
    """A mapping in any form -> SpecConfig for ``backend`` (which declares ``support``); FieldError
    or UsageError (unprefixed)."""
    if not isinstance(data, dict):
        raise UsageError(f"must be a JSON object (a mapping) or server flags, not {type(data).__name__}")
    name = detect_form(data)
    form = FORMS[name]
    if name not in support.forms:
        raise _foreign(form, data, backend, support)
    spec = form.read({form.canonical(k): v for k, v in data.items()})
    check_fields(spec, form.names)
    check_backend(spec, backend, support, form.names)
    return spec


def check_fields(spec: SpecConfig, names: dict[str, str]) -> None:
    """The rules between SpecConfig fields, as FieldErrors in the form's own key names."""
    def n(f: str) -> str:
        return names.get(f, f)

    m, given = spec.method, _given(spec)
    if m == "off":
        for f in NEUTRAL_FIELDS[1:]:
            if f in given:
                raise FieldError(n(f), "has no effect with method off: remove it")
        return
    if spec.k is None and m != "suffix":
        raise FieldError(n("k"), f"is required for method {m} (draft tokens per step; 2 to 5 is typical)")
    if m in NEEDS_DRAFT and not spec.draft:
        raise FieldError(n("draft"), f"is required for method {m} (the draft model or head: a path or HF id)")
    if m in NO_DRAFT and spec.draft:
        raise FieldError(n("draft"), f"method {m} drafts from the context and takes no draft model: remove it")
    for f in ("ngram_min", "ngram_max"):
        if m != "ngram" and f in given:
            raise FieldError(n(f), f"applies to method ngram only, not {m}: remove it")
    lo, hi = spec.ngram_min, spec.ngram_max
    if lo is not None and hi is not None and lo > hi:
        raise FieldError(n("ngram_min"), f"{lo} is larger than {n('ngram_max')} {hi}: make it <= {hi}")
    if spec.k_per_batch_size is not None:
        raise_on_errors(list(check_batch_schedule([list(e) for e in spec.k_per_batch_size], spec.k)))


def check_backend(spec: SpecConfig, backend: str, support: SpecSupport, names: dict[str, str]) -> None:
    """FieldError for a setting ``backend`` cannot honour (it would be dropped silently)."""
    for f in _given(spec):
        if not support.honours(f):
            raise FieldError(names.get(f, f), f"--backend {backend} has no such setting: remove it")
    for owner, extras in spec.native_extras.items():
        if extras and not (support.native_extras and owner == support.form):
            raise FieldError(next(iter(extras)), f"--backend {backend} has no such setting: remove it")


def _given(spec: SpecConfig) -> list[str]:
    """The neutral fields ``spec`` sets, in NEUTRAL_FIELDS order."""
    values = spec.model_dump(include=set(NEUTRAL_FIELDS))
    return [f for f in NEUTRAL_FIELDS if values[f] is not None]


def _foreign(form: Form, data: dict[str, Any], backend: str, support: SpecSupport) -> UsageError:
    """The error for a form this backend does not take, with the neutral equivalent when there is one."""
    key = next(k for k in data if _knows(form, k) and not _knows(FORMS["neutral"], k))
    takes = " or ".join(f"the {f} form" for f in support.forms)
    hint = ""
    try:
        spec = form.read({form.canonical(k): v for k, v in data.items()})
        check_fields(spec, form.names)
        if not spec.native_extras:
            hint = f": write {json.dumps(neutral_form(spec))}"
    except (FieldError, UsageError):
        pass
    return UsageError(f"{key}: a {form.name} form field; --backend {backend} takes {takes}{hint}")


def _field_message(exc: FieldError, data: Any, backend: str, support: SpecSupport) -> str:
    if not isinstance(exc, UnknownField):
        return f"{exc.field}: {exc.problem}"
    listed = "; ".join(f"{name} form fields: {', '.join(_fields_of(name, data))}" for name in support.forms)
    return f"unknown field {exc.field!r} ({listed})"


def _fields_of(name: str, data: Any) -> tuple[str, ...]:
    form = FORMS[name]
    return (form.fields_in(data) if isinstance(data, dict) else None) or form.fields



def neutral_form(spec: SpecConfig) -> dict[str, Any]:
    """The neutral form of ``spec`` (what --spec-config takes for every backend)."""
    out = spec.model_dump(include=set(NEUTRAL_FIELDS), exclude_none=True)
    if "k_per_batch_size" in out:
        out["k_per_batch_size"] = [list(e) for e in out["k_per_batch_size"]]
    return out

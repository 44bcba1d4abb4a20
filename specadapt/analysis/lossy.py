"""Speculative-decoding settings that are lossy by design, and the line that says why a server died.

A setting is *lossy by design* when, with it on, the server no longer promises the target model's own
output: it accepts draft tokens the target's verification would reject (a threshold, a top-k candidate
set, a forced acceptance rate). An identity check that fails on such a server is the configuration
doing what it was asked, not a fault, and one that passes certifies nothing; the staging gate says
"lossy by configuration" instead. Settings that only change speed (k, the draft, trees, block
verification, batch-size schedules) are not lossy, nor are those that switch speculation off.

Where each key comes from (upstream file and what it does):

vLLM (``vllm/config/speculative.py`` in vLLM 0.32.0, installed here):
  * ``rejection_sample_method: synthetic`` with ``synthetic_acceptance_rates`` or
    ``synthetic_acceptance_length``: each draft token is accepted with a fixed per-position probability
    whatever the target says (``vllm/v1/sample/rejection_sampler.py``, greedy kernel, SYNTHETIC_MODE).
    ``standard`` and ``block`` (Sun et al., joint verification of the draft as a block) keep the
    target's distribution and are not reported.
  * ``rejection_sample_method: fly``: FLy verification keeps a rejected draft token at an uncertain
    position when the next ones match. Not in 0.32.0: vLLM PRs #50808 (closed) and #53987 (open) call
    it "lossy by design"; vllm-ascend PR #16363 (open) spells it ``enable_fly_verify`` under
    ``rejection_sampler_config``. Constructed from those PR descriptions.
  * ``acceptance_method: typical_acceptance_sampler`` (speculative_config, vLLM 0.8-0.9, with
    ``posterior_threshold`` / ``posterior_alpha``) and ``--spec-decoding-acceptance-method
    typical_acceptance_sampler`` (vLLM <= 0.7, with ``--typical-acceptance-sampler-posterior-*``):
    accepts a draft token whose target probability clears an entropy-scaled threshold.
SGLang (``python/sglang/srt/server_args.py``, ``python/sglang/srt/environ.py``):
  * ``speculative_accept_threshold_single`` / ``speculative_accept_threshold_acc`` below 1.0 (default
    1.0): "Accept a draft token if its probability in the target model is greater than this threshold"
    and "The accept probability of a draft token is raised from its target probability p to min(1, p /
    threshold_acc)". Only the sampling path reads them (``tree_speculative_sampling_target_only`` in
    ``speculative/eagle_info.py``); greedy verification does not.
  * ``SGLANG_SIMULATE_ACC_LEN`` above 0 (an environment variable, default -1): the accepted length is
    simulated, not verified.
TensorRT-LLM (``tensorrt_llm/llmapi/llm_args.py``):
  * MTPDecodingConfig ``use_relaxed_acceptance_for_thinking: true`` with ``relaxed_topk`` and
    ``relaxed_delta``: "Accepts draft tokens matching any top-K candidate instead of exact top-1"
    during the thinking phase.
  * EagleDecodingConfig ``greedy_sampling: false`` (with ``posterior_threshold``): "typical acceptance
    with multinomial sampling" instead of "Top-1 with token equality acceptance".
  * ``acceptance_rate_threshold`` (older ``acceptance_length_threshold``) is not lossy: it turns
    speculation off for good once the rolling acceptance drops below it.
llama.cpp: no lossy verification setting is known; nothing is reported for it.

The settings are read from the speculative config (a mapping, nested or flat), the command line (a list:
``--flag value``, ``--flag=value``, JSON objects such as vLLM's ``--speculative-config '{...}'``, and
trtllm-serve's ``--set PATH=VALUE``), what a running server says about itself, and the environment.
Odd input (wrong types, unparsable values, absent parts) finds nothing; nothing here raises.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # annotation only: the module imports nothing outside the standard library
    from specadapt.records.server import ServerInfo

# The settings found, by key (lower case, dashes as underscores): every value seen for it.
Pool = dict[str, list[Any]]

# yes/no spellings; any other ("none", "", "maybe") is unset, so the default holds
_BOOL = {**dict.fromkeys(("true", "1", "yes", "on", "y", "t"), True),
         **dict.fromkeys(("false", "0", "no", "off", "n", "f"), False)}
_MAX_DEPTH = 12  # containers deep (real configs nest 3 or 4); also ends a walk round a cycle

_NOT_TARGET = "so the output is not the target's"
_FLY = ("fly_entropy_threshold", "fly_window_size")
_FLY_KEEPS = "FLy verification keeps a draft token the target rejected at an uncertain position"
# vLLM's lossy rejection_sample_method values: (companion settings shown, why)
_VLLM_METHODS = {
    # vllm/config/speculative.py:84, 529-549 (0.32.0)
    "synthetic": (("synthetic_acceptance_rates", "synthetic_acceptance_length"),
                  "vLLM accepts each draft token with a forced per-position probability instead of checking it "
                  f"against the target, {_NOT_TARGET}"),
    # vLLM PR #53987 (open), not in 0.32.0: constructed from the PR description
    "fly": (_FLY, f"{_FLY_KEEPS} when the next ones match (lossy by design, as its vLLM PR says), {_NOT_TARGET}"),
}
# vLLM 0.8-0.9 (speculative_config) / <= 0.7 (command line)
_TYPICAL_KEYS = ("acceptance_method", "spec_decoding_acceptance_method")
_TYPICAL = (("posterior_threshold", "posterior_alpha", "typical_acceptance_sampler_posterior_threshold",
             "typical_acceptance_sampler_posterior_alpha"),
            "vLLM accepts a draft token whose target probability clears a threshold instead of sampling the target, "
            + _NOT_TARGET)
# python/sglang/srt/server_args.py (default 1.0)
_SGLANG_THRESHOLDS = {
    "speculative_accept_threshold_single": "SGLang accepts a draft token once its target probability exceeds {v}",
    "speculative_accept_threshold_acc": "SGLang raises a draft token's acceptance probability from p to "
                                        "min(1, p / {v})",
}
_SGLANG_SAMPLED = ("so sampled (temperature > 0) outputs do not follow the target's distribution (greedy "
                   "verification ignores it)")
_SIMULATE = "env:SGLANG_SIMULATE_ACC_LEN"  # python/sglang/srt/environ.py (default -1)
# TensorRT-LLM yes/no settings (tensorrt_llm/llmapi/llm_args.py): (the lossy value, companions, why)
_TRTLLM_FLAGS = {
    "use_relaxed_acceptance_for_thinking": (  # MTPDecodingConfig
        True, ("relaxed_topk", "relaxed_delta"),
        "TensorRT-LLM's MTP accepts, in the thinking phase, a draft token that is any of the target's top-k "
        f"candidates within relaxed_delta of the top-1 instead of the top-1 only, {_NOT_TARGET}"),
    "greedy_sampling": (  # EagleDecodingConfig
        False, ("posterior_threshold",),
        "TensorRT-LLM's Eagle then uses typical acceptance, accepting a draft token whose target probability "
        f"clears a threshold instead of the target's own choice, {_NOT_TARGET}"),
}


# --- reading the settings ---------------------------------------------------------------------------

def _norm(key: Any) -> str:
    return str(key).strip().lstrip("-").replace("-", "_").lower()


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def _walk(value: Any, pool: Pool, depth: int = 0) -> None:
    """Every key of every mapping in ``value`` (nested mappings, lists, JSON strings) into ``pool``, down
    to ``_MAX_DEPTH`` containers deep."""
    if isinstance(value, str):
        value = _json(value)
    if depth > _MAX_DEPTH:
        return
    if isinstance(value, Mapping):
        for key, item in value.items():
            pool.setdefault(_norm(key), []).append(item)
            _walk(item, pool, depth + 1)
    elif isinstance(value, list):
        for item in value:
            _walk(item, pool, depth + 1)


def _argv_pool(argv: Sequence[str], pool: Pool) -> None:
    """``--flag value`` and ``--flag=value`` into ``pool`` (JSON values walked); trtllm-serve's
    ``--set a.b.key=value`` sets ``key``."""
    for arg, following in zip(argv, [*argv[1:], None]):
        flag, eq, value = arg.partition("=")
        if not eq:
            value = following
        if flag == "--set":  # constructed from docs: facts-trtllm.md, "`--set PATH=VALUE` overrides one field"
            path, _, value = value.partition("=")
            flag = path.split(".")[-1]
        elif not flag.startswith("--"):
            continue
        pool.setdefault(_norm(flag), []).append(value)
        _walk(value, pool)


def _pool(spec: Any, argv: Sequence[str], flags: Any, env: Mapping[str, str] | None) -> Pool:
    pool: Pool = {}
    _walk(spec, pool)
    _walk(flags, pool)
    _argv_pool(argv, pool)
    for key, value in (env or {}).items():
        pool[f"env:{key}"] = [value]
    return pool


# --- reading values ---------------------------------------------------------------------------------

def _text(value: Any) -> str:
    return str(value).strip().lower()


def _number(value: Any) -> float:
    """``value`` as a number; NaN (which no comparison passes) when it is not one."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def _reason(pool: Pool, key: str, shown: Any, companions: Sequence[str], why: str) -> str:
    """"key value (companion value, ...): why", with the companion settings that are set."""
    found = []
    for companion in companions:
        values = [v for v in pool.get(companion, []) if v is not None]  # vLLM's config dump has unused ones None
        if values:
            found.append(f"{companion} {values[0]}")
    listed = f" ({', '.join(found)})" if found else ""
    return f"{key} {shown}{listed}: {why}"


# --- the lossy settings, by backend -----------------------------------------------------------------

def _vllm(pool: Pool) -> list[str]:
    out = []
    for value in pool.get("rejection_sample_method", []):
        word = _text(value)
        if word in _VLLM_METHODS:
            out.append(_reason(pool, "rejection_sample_method", f"'{word}'", *_VLLM_METHODS[word]))
    # vllm-ascend PR #16363 (open), under rejection_sampler_config: constructed from it
    if any(_BOOL.get(_text(v)) for v in pool.get("enable_fly_verify", [])):
        out.append(_reason(pool, "enable_fly_verify", "true", _FLY, f"{_FLY_KEEPS}, {_NOT_TARGET}"))
    for key in _TYPICAL_KEYS:
        if any(_text(v) == "typical_acceptance_sampler" for v in pool.get(key, [])):
            out.append(_reason(pool, key, "'typical_acceptance_sampler'", *_TYPICAL))
    return out


def _sglang(pool: Pool) -> list[str]:
    out = []
    for key, why in _SGLANG_THRESHOLDS.items():
        for value in pool.get(key, []):
            if _number(value) < 1:
                out.append(f"{key} {value}: {why.format(v=value)}, {_SGLANG_SAMPLED}")
    for value in pool.get(_SIMULATE, []):
        if _number(value) > 0:
            out.append(f"SGLANG_SIMULATE_ACC_LEN {value}: SGLang simulates the accepted length instead of "
                       f"verifying the draft, {_NOT_TARGET}")
    return out


def _trtllm(pool: Pool) -> list[str]:
    out = []
    for key, (lossy, companions, why) in _TRTLLM_FLAGS.items():
        if any(_BOOL.get(_text(v)) is lossy for v in pool.get(key, [])):
            out.append(_reason(pool, key, str(lossy).lower(), companions, why))
    return out


_CHECKS: dict[str, tuple[Callable[[Pool], list[str]], ...]] = {
    "vllm": (_vllm,), "reference": (_vllm,), "sglang": (_sglang,), "trtllm": (_trtllm,), "llamacpp": (),
}
_ALL_CHECKS = (_vllm, _sglang, _trtllm)  # a backend specadapt does not know (a plugin): every check


def lossy_reasons(backend: str, spec: Mapping[str, Any] | None, argv: Sequence[str] = (),
                  flags: Mapping[str, Any] | None = None, env: Mapping[str, str] | None = None) -> list[str]:
    """One sentence per lossy-by-design setting found (naming the setting, its value and why); [] when
    none is found. ``spec``: the speculative config (nested or flat); ``argv``: the server command line;
    ``flags``: what the running server says about itself; ``env``: its environment."""
    try:
        pool = _pool(spec, argv, flags, env)
        found = [reason for check in _CHECKS.get(backend, _ALL_CHECKS) for reason in check(pool)]
    except Exception:  # odd input finds nothing; a lossy check must never stop a run
        return []
    return list(dict.fromkeys(found))


def lossy_reasons_of(info: ServerInfo) -> list[str]:
    """``lossy_reasons`` for a server as specadapt records it: the speculative config it exposes
    (``spec_settings``), its launch's speculative settings, command line and environment, and the
    settings it exposes."""
    launch = info.launch
    spec = {**(launch.spec_settings if launch else {}), **info.spec_settings}
    if launch is None:
        return lossy_reasons(info.backend, spec, flags=info.server_flags)
    return lossy_reasons(info.backend, spec, launch.argv, info.server_flags, launch.effective_env())


# --- why a server died ------------------------------------------------------------------------------

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# "(EngineCore_DP0 pid=123) ", "[rank0]: ", "(APIServer pid=9) " at the start of a line
_PREFIX = re.compile(r"^\s*(?:\([\w.:-]+(?:\s+pid=\d+)?\) ?|\[rank\d+\]: ?)+")
# vLLM's record head "ERROR 12-03 10:11:12 [core.py:1512] " (after any process prefix)
_HEAD = re.compile(r"^(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)\s+\d\d-\d\d\s+\d\d:\d\d:\d\d(?:\.\d+)?\s+\[[^\]]*\] ?")
_EXCEPTION = re.compile(r"^(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt|Fault)(?::\s*\S.*)?:?$")
_WHAT = re.compile(r"^\s*what\(\):\s+(?P<msg>\S.*)$")
_THROWN = re.compile(r"instance of '(?P<cls>[^']+)'")
_USAGE = re.compile(r"^\S[^:]{0,79}: error: \S.*$")  # argparse: "api_server.py: error: unrecognized arguments"
# exceptions that only point at a root cause printed elsewhere
_WRAPPER = re.compile(r"root cause|EngineDeadError|^(?:\w+\.)*(?:SystemExit|KeyboardInterrupt|CancelledError)\b",
                      re.I)
# lines that end an exception's indented details: a traceback's, pydantic's link to its docs
_NOT_DETAIL = ("File ", "For further")
_LIMIT = 200


def _clean(line: str) -> str:
    line = _PREFIX.sub("", _ANSI.sub("", line))
    return _HEAD.sub("", line).rstrip()


def _with_details(line: str, after: list[str]) -> str:
    """``line`` and the indented lines right after it (a pydantic ValidationError's details)."""
    for more in after:
        if not more[:1].isspace() or more.lstrip().startswith(_NOT_DETAIL):
            break
        line += " " + more.strip()
    return line


def _trim(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _LIMIT else text[:_LIMIT - 1].rstrip() + "…"


def describe_death(log_tail: str) -> str | None:
    """The line of a dead server's last log lines that says why it died, trimmed to about 200 characters:
    the last exception line (``SomethingError: message``, a C++ ``what():``, an argparse ``error:``) that is
    not a wrapper pointing at a root cause above (EngineDeadError, "See root cause above"), else the last
    wrapper; None when no line looks like one. Indented lines right after the exception (a pydantic
    ValidationError's details) are joined to it."""
    lines = [_clean(line) for line in log_tail.splitlines()]
    found: list[tuple[Any, str]] = []  # (a wrapper's match or None, the sentence)
    for i, line in enumerate(lines):
        what = _WHAT.match(line)
        if what:
            thrown = _THROWN.search(lines[i - 1]) if i else None
            found.append((None, f"{thrown['cls']}: {what['msg']}" if thrown else what["msg"]))
        elif _USAGE.match(line):
            found.append((None, line))
        elif _EXCEPTION.match(line):
            found.append((_WRAPPER.search(line), _with_details(line, lines[i + 1:])))
    if not found:
        return None
    causes = [text for wrapper, text in found if not wrapper]
    return _trim(causes[-1] if causes else found[-1][1])

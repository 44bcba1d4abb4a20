"""Speculative-decoding settings that are lossy by design, and the line that says why a server died.

A setting is *lossy by design* when, with it on, the server no longer promises the target model's own
output: it accepts draft tokens the target's verification would reject (a threshold, a top-k candidate
set, a forced acceptance rate). An identity check that fails on such a server is the configuration
doing what it was asked, not a fault, and one that passes certifies nothing; the staging gate says
"lossy by configuration" instead. Settings that only change speed (k, the draft, trees, block
verification, batch-size schedules) are not lossy, nor are those that switch speculation off
(``switch_off_reasons`` names the latter apart).

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
    speculation off for good once the rolling acceptance drops below it (``switch_off_reasons``).
llama.cpp: no lossy verification setting is known; nothing is reported for it.

The settings are read from the speculative config (a mapping, nested or flat), the command line (flags
with values, ``--flag=value``, JSON objects such as vLLM's ``--speculative-config '{...}'``, and
trtllm-serve's ``--set PATH=VALUE``), what a running server says about itself, and the environment.
Odd input (wrong types, unparsable values, absent parts) finds nothing; nothing here raises.
"""

from __future__ import annotations

import json
import math
import re
import shlex
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # annotation only: the module imports nothing outside the standard library
    from specadapt.records.server import ServerInfo

# The settings found, by key (lower case, dashes as underscores): every value seen for it.
Pool = dict[str, list[Any]]

_TRUE = frozenset({"true", "1", "yes", "on", "y", "t"})
_FALSE = frozenset({"false", "0", "no", "off", "n", "f"})  # "none", "": unset, so the default holds
_MAX_DEPTH = 12


# --- reading the settings ---------------------------------------------------------------------------

def _norm(key: Any) -> str:
    return str(key).strip().lstrip("-").replace("-", "_").lower()


def _json_object(text: str) -> Any:
    text = text.strip()
    if not text.startswith("{"):
        return None
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


def _walk(value: Any, pool: Pool, depth: int = 0, seen: dict[int, Any] | None = None) -> None:
    """Every key of every mapping in ``value`` (nested mappings, lists, JSON-object strings) into ``pool``.
    ``seen`` keeps each container it visited (alive, so that no later object reuses its id)."""
    seen = {} if seen is None else seen
    if depth > _MAX_DEPTH or id(value) in seen:
        return
    if isinstance(value, Mapping):
        seen[id(value)] = value
        for key, item in value.items():
            pool.setdefault(_norm(key), []).append(item)
            _walk(item, pool, depth + 1, seen)
    elif isinstance(value, (list, tuple)):
        seen[id(value)] = value
        for item in value:
            _walk(item, pool, depth + 1, seen)
    elif isinstance(value, str):
        parsed = _json_object(value)
        if parsed is not None:
            _walk(parsed, pool, depth + 1, seen)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _argv_items(argv: Any) -> list[str]:
    if isinstance(argv, str):
        try:
            return shlex.split(argv)
        except ValueError:
            return argv.split()
    if not isinstance(argv, Iterable) or isinstance(argv, (bytes, Mapping)):
        return []
    return [str(a) for a in argv]


def _argv_pool(argv: Any, pool: Pool) -> None:
    """``--flag value``, ``--flag=value`` and bare ``--flag`` (true) into ``pool``; JSON-object values
    are walked; trtllm-serve's ``--set a.b.key=value`` sets ``key``."""
    items = _argv_items(argv)
    for i, arg in enumerate(items):
        if not arg.startswith("-") or _is_number(arg):
            continue
        flag, eq, value = arg.partition("=")
        if not eq:
            following = items[i + 1] if i + 1 < len(items) else None
            if following is None or (following.startswith("-") and not _is_number(following)):
                value = "true"
            else:
                value = following
        key = _norm(flag)
        if key == "set":  # constructed from docs: facts-trtllm.md, "`--set PATH=VALUE` overrides one field"
            path, eq2, setting = value.partition("=")
            if eq2:
                pool.setdefault(_norm(path.rsplit(".", 1)[-1]), []).append(setting)
            continue
        pool.setdefault(key, []).append(value)
        _walk(value, pool)


def _pool(spec: Any, argv: Any, flags: Any, env: Any) -> Pool:
    pool: Pool = {}
    for part in (spec, flags):
        _walk(part, pool)
    _argv_pool(argv, pool)
    if isinstance(env, Mapping):
        for key, value in env.items():
            pool.setdefault(f"env:{str(key).strip().upper()}", []).append(value)
    return pool


# --- reading values ---------------------------------------------------------------------------------

def _flag(value: Any) -> bool | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return None if isinstance(value, float) and math.isnan(value) else value != 0
    if isinstance(value, str):
        text = value.strip().lower()
        if text in _TRUE:
            return True
        if text in _FALSE:
            return False
    return None


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        number = float(value.strip() if isinstance(value, str) else value)
    except (TypeError, ValueError, OverflowError):
        return None
    return None if math.isnan(number) else number


def _word(value: Any) -> str | None:
    return value.strip().lower() if isinstance(value, str) else None


def _show(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    number = _number(value)
    if number is not None and not isinstance(value, str):
        return f"{number:g}"
    if isinstance(value, str):
        return value.strip() if number is not None else f"'{value.strip()}'"
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return str(value)


def _first(pool: Pool, *keys: str) -> tuple[str, Any] | None:
    for key in keys:
        for value in pool.get(key, []):
            if value is not None and not isinstance(value, Mapping):
                return key, value
    return None


def _with(pool: Pool, *keys: str) -> str:
    """" (key value, key value)" for the companion settings present, or ""."""
    shown = []
    for key in keys:
        found = _first(pool, key)
        if found is not None:
            shown.append(f"{key} {_show(found[1])}")
    return f" ({', '.join(shown)})" if shown else ""


def _values(pool: Pool, key: str) -> list[Any]:
    return [v for v in pool.get(key, []) if not isinstance(v, (Mapping, list, tuple))]


# --- the lossy settings, by backend -----------------------------------------------------------------

def _vllm(pool: Pool) -> list[str]:
    out: list[str] = []
    for value in _values(pool, "rejection_sample_method"):
        word = _word(value)
        if word == "synthetic":  # vllm/config/speculative.py:84, 529-549 (0.32.0)
            out.append(f"rejection_sample_method 'synthetic'"
                       f"{_with(pool, 'synthetic_acceptance_rates', 'synthetic_acceptance_length')}: vLLM accepts "
                       "each draft token with a forced per-position probability instead of checking it against "
                       "the target, so the output is not the target's")
        elif word == "fly":  # vLLM PR #53987 (open), not in 0.32.0: constructed from the PR description
            out.append(f"rejection_sample_method 'fly'{_with(pool, 'fly_entropy_threshold', 'fly_window_size')}: "
                       "FLy verification keeps a draft token the target rejected at an uncertain position when the "
                       "next ones match (lossy by design, as its vLLM PR says), so the output is not the target's")
    for value in _values(pool, "enable_fly_verify"):  # vllm-ascend PR #16363 (open): constructed from it
        if _flag(value):
            out.append(f"enable_fly_verify true{_with(pool, 'fly_entropy_threshold', 'fly_window_size')}: FLy "
                       "verification keeps a draft token the target rejected at an uncertain position, so the "
                       "output is not the target's")
    for key in ("acceptance_method", "spec_decoding_acceptance_method"):  # vLLM 0.8-0.9 / <= 0.7
        for value in _values(pool, key):
            if _word(value) == "typical_acceptance_sampler":
                companions = ("posterior_threshold", "posterior_alpha",
                              "typical_acceptance_sampler_posterior_threshold",
                              "typical_acceptance_sampler_posterior_alpha")
                out.append(f"{key} 'typical_acceptance_sampler'{_with(pool, *companions)}: vLLM accepts a draft "
                           "token whose target probability clears a threshold instead of sampling the target, so "
                           "the output is not the target's")
    return out


def _sglang(pool: Pool) -> list[str]:
    out: list[str] = []
    why = {
        "speculative_accept_threshold_single": "SGLang accepts a draft token once its target probability exceeds "
                                               "{v}",
        "speculative_accept_threshold_acc": "SGLang raises a draft token's acceptance probability from p to "
                                            "min(1, p / {v})",
    }
    for key, text in why.items():  # python/sglang/srt/server_args.py (default 1.0)
        for value in _values(pool, key):
            number = _number(value)
            if number is not None and number < 1.0:
                out.append(f"{key} {_show(value)}: {text.format(v=_show(value))}, so sampled (temperature > 0) "
                           "outputs do not follow the target's distribution (greedy verification ignores it)")
    for value in _values(pool, "env:SGLANG_SIMULATE_ACC_LEN"):  # python/sglang/srt/environ.py (default -1)
        number = _number(value)
        if number is not None and number > 0:
            out.append(f"SGLANG_SIMULATE_ACC_LEN {_show(value)}: SGLang simulates the accepted length instead of "
                       "verifying the draft, so the output is not the target's")
    return out


def _trtllm(pool: Pool) -> list[str]:
    out: list[str] = []
    for value in _values(pool, "use_relaxed_acceptance_for_thinking"):  # llm_args.py, MTPDecodingConfig
        if _flag(value):
            out.append(f"use_relaxed_acceptance_for_thinking true{_with(pool, 'relaxed_topk', 'relaxed_delta')}: "
                       "TensorRT-LLM's MTP accepts, in the thinking phase, a draft token that is any of the target's "
                       "top-k candidates within relaxed_delta of the top-1 instead of the top-1 only, so the output "
                       "is not the target's")
    for value in _values(pool, "greedy_sampling"):  # llm_args.py, EagleDecodingConfig
        if _flag(value) is False:
            out.append(f"greedy_sampling false{_with(pool, 'posterior_threshold')}: TensorRT-LLM's Eagle then uses "
                       "typical acceptance, accepting a draft token whose target probability clears a threshold "
                       "instead of the target's own choice, so the output is not the target's")
    return out


_FAMILY = {"vllm": "vllm", "reference": "vllm", "sglang": "sglang", "trtllm": "trtllm", "tensorrtllm": "trtllm",
           "trtllmserve": "trtllm", "llamacpp": "llamacpp", "llamacpppython": "llamacpp"}
_CHECKS: dict[str, tuple[Callable[[Pool], list[str]], ...]] = {
    "vllm": (_vllm,), "sglang": (_sglang,), "trtllm": (_trtllm,), "llamacpp": (),
}


def _checks(backend: Any) -> tuple[Callable[[Pool], list[str]], ...]:
    """The checks of ``backend``'s family; every check when the backend is not one specadapt knows."""
    family = _FAMILY.get(re.sub(r"[^a-z0-9]", "", str(backend).lower()))
    return _CHECKS[family] if family else (_vllm, _sglang, _trtllm)


def lossy_reasons(backend: str, spec: Mapping[str, Any] | None, argv: Sequence[str] = (),
                  flags: Mapping[str, Any] | None = None, env: Mapping[str, str] | None = None) -> list[str]:
    """One sentence per lossy-by-design setting found (naming the setting, its value and why); [] when
    none is found. ``spec``: the speculative config (nested or flat); ``argv``: the server command line;
    ``flags``: what the running server says about itself; ``env``: its environment."""
    try:
        pool = _pool(spec, argv, flags, env)
        found = [reason for check in _checks(backend) for reason in check(pool)]
    except Exception:  # odd input finds nothing; a lossy check must never stop a run
        return []
    return list(dict.fromkeys(found))


def switch_off_reasons(backend: str, spec: Mapping[str, Any] | None, argv: Sequence[str] = (),
                       flags: Mapping[str, Any] | None = None) -> list[str]:
    """Settings that may switch speculation off while the server runs (not lossy: the output stays the
    target's, but later requests may run without speculation): TensorRT-LLM's acceptance_rate_threshold
    and its older name acceptance_length_threshold, with their window (0 disables the feature)."""
    if _trtllm not in _checks(backend):
        return []
    try:
        pool = _pool(spec, argv, flags, None)
        out = []
        for key, window in (("acceptance_rate_threshold", "acceptance_rate_window_size"),
                            ("acceptance_length_threshold", "acceptance_window")):
            windows = [_number(v) for v in _values(pool, window)]
            if any(w is not None and w <= 0 for w in windows):
                continue
            for value in _values(pool, key):
                number = _number(value)
                if number is not None and number > 0:
                    out.append(f"{key} {_show(value)}{_with(pool, window)}: TensorRT-LLM turns speculation off for "
                               "good once the rolling acceptance drops below it; the output stays the target's")
    except Exception:
        return []
    return list(dict.fromkeys(out))


def lossy_reasons_of(info: ServerInfo) -> list[str]:
    """``lossy_reasons`` for a server as specadapt records it: its launch's speculative settings, command
    line and environment, and the settings it exposes."""
    launch = info.launch
    if launch is None:
        return lossy_reasons(info.backend, None, (), info.server_flags)
    return lossy_reasons(info.backend, launch.spec_settings, launch.argv, info.server_flags, launch.effective_env())


# --- why a server died ------------------------------------------------------------------------------

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# "(EngineCore_DP0 pid=123) ", "[rank0]: ", "(APIServer pid=9) " at the start of a line
_PREFIX = re.compile(r"^\s*(?:\([\w.:-]+(?:\s+pid=\d+)?\) ?|\[rank\d+\]: ?)+")
# vLLM's record head "ERROR 12-03 10:11:12 [core.py:1512] " (after any process prefix)
_HEAD = re.compile(r"^(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)\s+\d\d-\d\d\s+\d\d:\d\d:\d\d(?:\.\d+)?\s+\[[^\]]*\] ?")
_EXCEPTION = re.compile(r"^(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt|Fault)(?::\s*\S.*)?:?$")
_WHAT = re.compile(r"^\s*what\(\):\s+(?P<msg>\S.*)$")
_THROWN = re.compile(r"instance of '(?P<cls>[^']+)'")
_USAGE = re.compile(r"^[^:]{1,80}: error: \S.*$")  # argparse: "api_server.py: error: unrecognized arguments"
# exceptions that only point at a root cause printed elsewhere
_WRAPPER = re.compile(r"root cause|EngineDeadError|^(?:\w+\.)*(?:SystemExit|KeyboardInterrupt|CancelledError)\b",
                      re.I)
_LIMIT = 200


def _clean(line: str) -> str:
    line = _PREFIX.sub("", _ANSI.sub("", line))
    return _HEAD.sub("", line).rstrip()


def _trim(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _LIMIT else text[:_LIMIT - 1].rstrip() + "…"


def describe_death(log_tail: str) -> str | None:
    """The line of a dead server's last log lines that says why it died, trimmed to about 200 characters:
    the last exception line (``SomethingError: message``, a C++ ``what():``, an argparse ``error:``) that is
    not a wrapper pointing at a root cause above (EngineDeadError, "See root cause above"), else the last
    wrapper; None when no line looks like one. Indented lines right after the exception (a pydantic
    ValidationError's details) are joined to it."""
    if not isinstance(log_tail, str) or not log_tail:
        return None
    lines = [_clean(line) for line in log_tail.splitlines()]
    found: list[tuple[bool, str]] = []  # (is a wrapper, the sentence)
    for i, line in enumerate(lines):
        if line[:1].isspace():
            what = _WHAT.match(line)
            if what:
                thrown = _THROWN.search(lines[i - 1]) if i else None
                found.append((False, f"{thrown['cls']}: {what['msg']}" if thrown else what["msg"]))
            continue
        if _USAGE.match(line):
            found.append((False, line))
        elif _EXCEPTION.match(line):
            text = line
            for more in lines[i + 1:i + 6]:
                if not more[:1].isspace() or not more.strip() or more.lstrip().startswith(("File ", "For further")):
                    break
                text += " " + more.strip()
            found.append((bool(_WRAPPER.search(line)), text))
    if not found:
        return None
    causes = [text for wrapper, text in found if not wrapper]
    return _trim(causes[-1] if causes else found[-1][1])

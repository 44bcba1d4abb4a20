"""One loaded reference: target, proposer, tokenizer and engine, built from CLI-style options."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from specadapt.errors import UsageError
from specadapt.native_reference.engine import SpecEngine
from specadapt.native_reference.faults import build_engine
from specadapt.native_reference.models import (
    check_draft_compatible,
    load_causal_lm,
    load_tokenizer,
    pick_device,
    pick_dtype,
)
from specadapt.native_reference.proposers import DraftModelProposer, NgramProposer
from specadapt.native_reference.sampling import SamplingParams


def generation_eos_ids(model_dir: Path) -> list[int]:
    """The ``eos_token_id`` (one id or a list) of ``model_dir/generation_config.json``, or,
    without that file, of the model's ``config.json`` (vLLM's fallback too: it builds the
    generation config from the model config); none without that key."""
    from transformers import AutoConfig, GenerationConfig

    try:
        if (Path(model_dir) / "generation_config.json").is_file():
            config = GenerationConfig.from_pretrained(str(model_dir), local_files_only=True)
        else:
            config = AutoConfig.from_pretrained(str(model_dir), local_files_only=True)
    except (OSError, ValueError) as exc:
        name = "generation_config.json" if (Path(model_dir) / "generation_config.json").is_file() else "config.json"
        raise UsageError(f"could not read {Path(model_dir) / name}: {exc}") from exc
    eos = getattr(config, "eos_token_id", None)
    if eos is None:
        return []
    return [int(eos)] if isinstance(eos, int) else [int(e) for e in eos]


@dataclass
class Reference:
    engine: SpecEngine
    tokenizer: object
    target_dir: Path
    draft_dir: Path | None
    method: str  # "none", "draft_model" or "ngram"
    dtype: torch.dtype
    device: torch.device
    # The tokenizer's eos, then the eos ids of the target's generation config (instruct
    # models often list more there, e.g. Llama-3's 128001, 128008, 128009): what vLLM stops on.
    stop_ids: tuple[int, ...] = field(init=False)

    def __post_init__(self) -> None:
        eos = self.tokenizer.eos_token_id
        ids = ([] if eos is None else [int(eos)]) + generation_eos_ids(self.target_dir)
        self.stop_ids = tuple(dict.fromkeys(ids))

    @property
    def model_name(self) -> str:
        return self.target_dir.name

    def encode(self, text: str, chat: bool = False) -> list[int]:
        if chat:
            return self.encode_messages([{"role": "user", "content": text}])
        return list(self.tokenizer(text, add_special_tokens=True)["input_ids"])

    def encode_messages(self, messages: list[dict], add_generation_prompt: bool = True,
                        continue_final_message: bool = False, add_special_tokens: bool = False) -> list[int]:
        """The chat template's text, tokenized (special tokens added on top of the
        template's only with ``add_special_tokens``, as vLLM does)."""
        if not getattr(self.tokenizer, "chat_template", None):
            raise UsageError(f"the tokenizer of {self.target_dir} has no chat template: use plain completions")
        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt,
                                                  continue_final_message=continue_final_message, tokenize=False)
        return [int(t) for t in self.tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"]]

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)


def open_reference(target: Path, draft: Path | None = None, ngram: bool = False, k: int = 4,
                   dtype: str = "auto", device: str = "auto", ngram_min: int = 1,
                   ngram_max: int = 4, fault: str | None = None, seed: int = 0,
                   min_confidence: float = 0.0, schedule: list | None = None,
                   max_model_len: int | None = None) -> Reference:
    """Load the target (and draft) and build the engine."""
    if draft is not None and ngram:
        raise UsageError("choose one proposer: --draft DIR or --ngram, not both")
    dev = pick_device(device)
    dt = pick_dtype(dtype, dev)
    target_model = load_causal_lm(target, dt, dev)
    proposer = None
    method = "none"
    if draft is not None:
        draft_model = load_causal_lm(draft, dt, dev)
        check_draft_compatible(target_model, draft_model, str(target), str(draft))
        proposer, method = DraftModelProposer(draft_model, min_confidence), "draft_model"
    elif ngram:
        proposer, method = NgramProposer(ngram_min, ngram_max), "ngram"
    if schedule and proposer is None:
        raise UsageError("a draft-length schedule needs a proposer: add --ngram or --draft DIR")
    engine = build_engine(target_model, proposer, k, fault or None, seed, schedule=schedule,
                          max_model_len=max_model_len)
    return Reference(engine, load_tokenizer(target), Path(target), Path(draft) if draft else None,
                     method, dt, dev)


def generate(ref: Reference, prompt: str, chat: bool, max_tokens: int, params: SamplingParams,
             check: bool = False, seed: int = 0) -> dict:
    """One generation with speculative decoding: its text, tokens, method, k, precision, device and
    statistics; with ``check``, the target alone (seeded with ``seed``) on the same prompt, compared
    token by token (``"check"``, see ``identity_check``)."""
    ids = ref.encode(prompt, chat)
    gen = ref.engine.generate(ids, max_tokens, params, ref.stop_ids)
    result = {"text": ref.decode(gen.tokens), "tokens": gen.tokens, "method": ref.method,
              "k": ref.engine.k, "dtype": str(ref.dtype).removeprefix("torch."),
              "device": str(ref.device), "stats": gen.stats.as_dict()}
    if check:
        alone = SpecEngine(ref.engine.target.model, seed=seed)
        base = alone.generate(ids, max_tokens, params, ref.stop_ids)
        result["check"] = identity_check(gen.tokens, base.tokens, params.greedy)
    return result


def identity_check(spec: list[int], base: list[int], greedy: bool) -> dict:
    """Speculative tokens against the target alone's: identical or not, the first token that
    differs, and a one-line summary (identity is only expected with greedy decoding)."""
    first = next((i for i, (a, b) in enumerate(zip(spec, base, strict=False)) if a != b), None)
    if first is None and len(spec) != len(base):
        first = min(len(spec), len(base))
    identical = first is None
    summary = (f"check: IDENTICAL to the target alone ({len(base)} tokens)" if identical else
               f"check: DIFFERENT from the target alone at token {first} "
               f"(speculative {spec[first:first + 1]}, target alone {base[first:first + 1]})")
    if not greedy:
        summary += " [sampling: identity is only expected with greedy decoding]"
    return {"identical": identical, "first_difference": first, "summary": summary}

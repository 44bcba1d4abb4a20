"""Loading local Hugging Face causal LMs, and a KV-cached view of one for the engine.

Models are loaded through transformers' model classes (LLaMA family, which covers the
embedded SmolLM2; Qwen2 and Mistral load the same way). Nothing here touches a model hub:
only local directories are accepted (``local_files_only``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

from specadapt.errors import UsageError, require

DTYPES = {
    "float64": torch.float64,
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


def pick_device(name: str = "auto") -> torch.device:
    """``auto``: CUDA when present, else CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise UsageError(f"device {name} asked for, but torch sees no CUDA device: use --device cpu")
    return torch.device(name)


def pick_dtype(name: str, device: torch.device) -> torch.dtype:
    """``auto``: bfloat16 on CUDA, float32 on CPU. float64 is the CPU ground truth."""
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if name not in DTYPES:
        raise UsageError(f"unknown dtype {name!r}: use one of auto, {', '.join(DTYPES)}")
    return DTYPES[name]


def load_causal_lm(path: str | Path, dtype: torch.dtype = torch.float32,
                   device: torch.device | str = "cpu"):
    """A local HF causal LM, in eval mode, on ``device`` in ``dtype``."""
    transformers = require("transformers", "reference", "the native reference engine")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    transformers.utils.logging.disable_progress_bar()
    path = Path(path)
    if not (path / "config.json").is_file():
        raise UsageError(f"{path} is not a Hugging Face model directory (no config.json in it)")
    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(
            str(path), dtype=dtype, local_files_only=True)
    except (OSError, ValueError, KeyError) as exc:
        raise UsageError(f"could not load a causal LM from {path}: {exc}") from exc
    return model.to(device).eval()


def load_tokenizer(path: str | Path):
    transformers = require("transformers", "reference", "the native reference engine")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        return transformers.AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except (OSError, ValueError) as exc:
        raise UsageError(f"could not load a tokenizer from {path}: {exc}") from exc


def vocab_size(model) -> int:
    """Rows of the output projection: the size of the distribution the model predicts."""
    weight = model.get_output_embeddings().weight
    weight = weight() if callable(weight) else weight  # dynamically quantized heads expose a method
    return int(weight.shape[0])


def check_draft_compatible(target, draft, target_name: str = "target", draft_name: str = "draft") -> None:
    """Refuse a draft whose vocabulary differs from the target's (UsageError with the fix)."""
    vt, vd = vocab_size(target), vocab_size(draft)
    if vt != vd:
        raise UsageError(
            f"draft {draft_name} has vocab size {vd} but target {target_name} has {vt}: "
            "speculative decoding needs a draft with the same tokenizer and vocabulary; "
            "pick a draft from the same model family, or use --ngram")


def truncate_layers(model, keep: int):
    """Keep the first ``keep`` decoder layers (a cheap, badly matched draft)."""
    layers = model.model.layers
    if not 0 < keep <= len(layers):
        raise UsageError(f"cannot keep {keep} of {len(layers)} layers")
    model.model.layers = layers[:keep]
    model.config.num_hidden_layers = keep
    if getattr(model.config, "layer_types", None):
        model.config.layer_types = model.config.layer_types[:keep]
    return model


@dataclass
class CachedLM:
    """A model plus its KV cache; entry i of the cache holds position i of the sequence.

    ``forward(tokens)`` writes the tokens at positions ``length .. length+n-1`` and
    returns their logits; ``rewind(n)`` forgets every position >= n, so rejected draft
    entries are simply dropped and the accepted prefix is never recomputed.
    """

    model: object
    forwards: int = 0

    def __post_init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        from transformers import DynamicCache

        self.cache = DynamicCache(config=self.model.config)
        self.tokens: list[int] = []

    @property
    def length(self) -> int:
        return len(self.tokens)

    @property
    def device(self) -> torch.device:
        return self.model.get_input_embeddings().weight.device

    @torch.inference_mode()
    def forward(self, tokens: list[int], keep: int = 0) -> torch.Tensor:
        """Logits ``[n, V]`` for ``tokens`` appended at the current position, or for the
        last ``keep`` of them only (saves the head on prefills)."""
        start = self.length
        ids = torch.tensor([tokens], device=self.device)  # [1, n]
        pos = torch.arange(start, start + len(tokens), device=self.device)
        out = self.model(input_ids=ids, past_key_values=self.cache, use_cache=True,
                         position_ids=pos[None], cache_position=pos, logits_to_keep=keep)
        self.forwards += 1
        self.tokens.extend(tokens)
        return out.logits[0]  # [n, V]

    def rewind(self, n: int) -> None:
        """Keep positions ``0 .. n-1`` only."""
        drop = self.length - n
        if drop > 0:
            self.cache.crop(-drop)
            del self.tokens[n:]

    def sync(self, tokens: list[int]) -> list[int]:
        """Rewind to the longest cached prefix of ``tokens``; return the tokens still to feed."""
        n = 0
        limit = min(self.length, len(tokens))
        while n < limit and self.tokens[n] == tokens[n]:
            n += 1
        self.rewind(n)
        return tokens[n:]

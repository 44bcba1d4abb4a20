"""Loading local Hugging Face causal LMs, and a KV-cached view of one for the engine.

Models are loaded through transformers' model classes (LLaMA family, which covers the
embedded SmolLM2; Qwen2 and Mistral load the same way). Nothing here touches a model hub:
only local directories are accepted (``local_files_only``).
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

from specadapt.errors import UsageError, require
from specadapt.models import COMPLETE_MARKER, is_complete

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


# Files of a model directory that are not weights or config: the cut keeps them as they are.
TOKENIZER_FILES = ("chat_template.jinja", "special_tokens_map.json", "generation_config.json")


def truncated_copy(src: str | Path, layers: int, dest: str | Path, force: bool = False) -> Path:
    """``dest``: the HF model ``src`` cut to its first ``layers`` decoder layers (float32), with
    ``src``'s tokenizer, embeddings and head: the same vocabulary, a fraction of the depth.

    Reused when ``dest`` is complete (unless ``force``); otherwise written into ``<dest>.part``
    and renamed into place, so an interrupted write never leaves a directory that looks done."""
    src, dest = Path(src), Path(dest)
    if is_complete(dest) and not force:
        return dest
    model = truncate_layers(load_causal_lm(src, torch.float32), layers)
    tmp = dest.with_name(dest.name + ".part")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.parent.mkdir(parents=True, exist_ok=True)
    try:
        model.save_pretrained(str(tmp), safe_serialization=True)
        for f in src.iterdir():
            if f.is_file() and (f.name.startswith("tokenizer") or f.name in TOKENIZER_FILES):
                shutil.copy(f, tmp / f.name)
        (tmp / COMPLETE_MARKER).write_text(f"first {layers} decoder layers of {src}\n")
        shutil.rmtree(dest, ignore_errors=True)
        os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest


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


def attention_windows(config) -> dict[str, int | None]:
    """Attention kind -> window (None: full attention), as the model's layers use them.

    Hybrid models (``layer_types`` with both kinds) take one mask per kind; a model whose
    every layer slides takes the windowed mask alone."""
    types = set(getattr(config, "layer_types", None) or [])
    window = getattr(config, "sliding_window", None)
    if types:
        out = {t: (window if t == "sliding_attention" else None) for t in types}
        unknown = types - {"full_attention", "sliding_attention"}
        if unknown:
            raise UsageError(f"attention layer types {sorted(unknown)} are not supported by the reference engine")
        return out
    if window and getattr(config, "use_sliding_window", True):
        return {"sliding_attention": int(window)}
    return {"full_attention": None}


class SlotCache:
    """The KV cache of a batch of sequences of different lengths, with holes.

    Every forward pass appends the same number of slots to every row (the longest feed;
    shorter feeds are padded). Slot ``s`` of row ``b`` holds the sequence position
    ``pos[b, s]``, or is a hole (``-1``): padding, or a draft token that was rejected.
    Attention runs over positions, not slots: each forward gets an explicit 4D mask in
    which query position ``p`` sees the row's valid slots of position <= ``p`` (and
    ``> p - window`` for sliding-window layers). So rows accept different numbers of
    draft tokens without moving any cached entry; holes at the end of every row are
    cropped, and the cache is compacted when holes make up most of it.

    Invariant: the valid slots of row ``b`` hold positions ``0 .. lengths[b]-1``, once each.
    """

    def __init__(self, model):
        from transformers import DynamicCache

        self.model = model
        self._new_cache = DynamicCache  # full-size layers only: windows are applied by the mask
        self.cache = DynamicCache()
        self.device = model.get_input_embeddings().weight.device
        self.dtype = next(model.parameters()).dtype
        self.windows = attention_windows(model.config)
        self.pos = torch.empty(0, 0, dtype=torch.long, device=self.device)  # [B, S]
        self.lengths: list[int] = []
        self.forwards = 0

    @property
    def batch(self) -> int:
        return len(self.lengths)

    @property
    def slots(self) -> int:
        return self.pos.shape[1]

    def _tensors(self):
        for layer in self.cache.layers:
            if getattr(layer, "is_initialized", False) and layer.keys.numel():
                yield layer

    @torch.inference_mode()
    def add(self, tokens: list[int], keep: int = 1) -> torch.Tensor:
        """A new row at the end of the batch: prefill ``tokens`` alone (a plain causal pass
        of that sequence, as if it were the only one), then join its entries to the batch.
        Returns the logits ``[keep, V]`` of its last ``keep`` tokens."""
        one = self._new_cache()
        ids = torch.tensor([tokens], device=self.device)
        out = self.model(input_ids=ids, past_key_values=one, use_cache=True, logits_to_keep=keep)
        self.forwards += 1
        n = len(tokens)
        row_pos = torch.arange(n, device=self.device)[None]  # [1, n]
        if self.batch == 0:
            self.cache, self.pos = one, row_pos
        else:
            width = max(self.slots, n)
            self._pad_slots(width)
            for mine, theirs in zip(self.cache.layers, one.layers):
                mine.keys = torch.cat([mine.keys, _pad(theirs.keys, width)], dim=0)
                mine.values = torch.cat([mine.values, _pad(theirs.values, width)], dim=0)
            self.pos = torch.cat([self.pos, _pad_pos(row_pos, width)], dim=0)
        self.lengths.append(n)
        return out.logits[0]

    @torch.inference_mode()
    def _pad_slots(self, width: int) -> None:
        extra = width - self.slots
        if extra <= 0:
            return
        for layer in self._tensors():
            layer.keys, layer.values = _pad(layer.keys, width), _pad(layer.values, width)
        self.pos = _pad_pos(self.pos, width)

    @torch.inference_mode()
    def keep_rows(self, rows: list[int]) -> None:
        """Keep only ``rows`` (indices into the batch, in the new order)."""
        index = torch.tensor(rows, dtype=torch.long, device=self.device)
        for layer in self._tensors():
            layer.keys, layer.values = layer.keys[index], layer.values[index]
        self.pos = self.pos[index]
        self.lengths = [self.lengths[i] for i in rows]
        if not rows:
            self.cache, self.pos = self._new_cache(), self.pos[:, :0]
            return
        self.trim()

    @torch.inference_mode()
    def truncate(self, row: int, length: int) -> None:
        """Forget every position >= ``length`` of ``row`` (they become holes)."""
        if length < self.lengths[row]:
            self.pos[row].masked_fill_(self.pos[row] >= length, -1)
            self.lengths[row] = length

    @torch.inference_mode()
    def trim(self) -> None:
        """Crop the slots at the end that are holes in every row; compact when holes dominate."""
        if not self.batch:
            return
        used = (self.pos >= 0).any(dim=0).nonzero()
        width = int(used[-1]) + 1 if used.numel() else 0
        if width < self.slots:
            for layer in self._tensors():
                layer.keys, layer.values = layer.keys[:, :, :width], layer.values[:, :, :width]
            self.pos = self.pos[:, :width]
        longest = max(self.lengths)
        if self.slots > 2 * longest + 32:
            self.compact()

    @torch.inference_mode()
    def compact(self) -> None:
        """Move every row's valid entries to the first slots, in position order."""
        width = max(self.lengths)
        # valid slots first, ordered by position; holes after them
        key = torch.where(self.pos >= 0, self.pos, self.pos.new_tensor(2 ** 62))
        order = torch.argsort(key, dim=1, stable=True)[:, :width]  # [B, width]
        for layer in self._tensors():
            idx = order[:, None, :, None].expand(-1, layer.keys.shape[1], -1, layer.keys.shape[3])
            layer.keys, layer.values = layer.keys.gather(2, idx), layer.values.gather(2, idx)
        self.pos = self.pos.gather(1, order)
        self.pos.masked_fill_(torch.arange(width, device=self.device)[None] >= torch.tensor(
            self.lengths, device=self.device)[:, None], -1)

    @torch.inference_mode()
    def forward(self, feeds: list[list[int]]) -> torch.Tensor:
        """Append ``feeds[b]`` to row ``b`` (at its next positions) in one pass; feeds may
        differ in length, even be empty. Returns logits ``[B, N, V]``, N the longest feed;
        row ``b``'s entry ``j < len(feeds[b])`` is the prediction after its token ``j``."""
        B, width = self.batch, max(len(f) for f in feeds)
        n = torch.tensor([len(f) for f in feeds], device=self.device)  # [B]
        ids = torch.tensor([f + [0] * (width - len(f)) for f in feeds], device=self.device)  # [B, N]
        start = torch.tensor(self.lengths, device=self.device)[:, None]  # [B, 1]
        j = torch.arange(width, device=self.device)[None]  # [1, N]
        qpos = start + j  # [B, N]
        new_pos = torch.where(j < n[:, None], qpos, -1)  # [B, N]
        key_pos = torch.cat([self.pos, new_pos], dim=1)  # [B, S+N]
        mask = {kind: self._mask(key_pos, qpos, window) for kind, window in self.windows.items()}
        out = self.model(input_ids=ids, past_key_values=self.cache, use_cache=True, position_ids=qpos,
                         attention_mask=mask if len(mask) > 1 else next(iter(mask.values())))
        self.forwards += 1
        self.pos = key_pos
        self.lengths = [a + len(f) for a, f in zip(self.lengths, feeds)]
        return out.logits  # [B, N, V]

    def _mask(self, key_pos: torch.Tensor, qpos: torch.Tensor, window: int | None) -> torch.Tensor:
        """Additive mask ``[B, 1, N, S+N]``: 0 where query j of row b may attend slot s."""
        k, q = key_pos[:, None, :], qpos[:, :, None]  # [B, 1, S+N], [B, N, 1]
        allowed = (k >= 0) & (k <= q)
        if window is not None:
            allowed &= k > q - window
        # a padding query sees its own slot, so that no row of the mask is empty
        S = self.slots
        width = qpos.shape[1]
        allowed[:, torch.arange(width), S + torch.arange(width)] = True
        zero = torch.zeros((), dtype=self.dtype, device=self.device)
        low = torch.tensor(torch.finfo(self.dtype).min, dtype=self.dtype, device=self.device)
        return torch.where(allowed, zero, low)[:, None]


def _pad(t: torch.Tensor, width: int) -> torch.Tensor:
    """Zero slots appended along dim 2 up to ``width``."""
    extra = width - t.shape[2]
    if extra <= 0:
        return t
    return torch.cat([t, t.new_zeros(t.shape[0], t.shape[1], extra, t.shape[3])], dim=2)


def _pad_pos(pos: torch.Tensor, width: int) -> torch.Tensor:
    extra = width - pos.shape[1]
    if extra <= 0:
        return pos
    return torch.cat([pos, pos.new_full((pos.shape[0], extra), -1)], dim=1)

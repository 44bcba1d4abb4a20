"""Fixtures for the reference engine tests: seeded tiny random LLaMAs and the embedded model."""

from __future__ import annotations

import copy
import os
import shutil

import pytest

torch = pytest.importorskip("torch", reason="the reference engine needs torch (pip install 'specadapt[reference]')")
transformers = pytest.importorskip("transformers")

os.environ["HF_HUB_OFFLINE"] = "1"
torch.set_num_threads(1)  # 2 shared cores: one thread avoids OpenMP spin contention


def tiny_llama(seed: int, vocab: int = 64, layers: int = 2, hidden: int = 32, init: float = 0.02,
               dtype=torch.float64):
    """A seeded random LLaMA; ``init`` scales the weights (larger: peakier distributions)."""
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        initializer_range=init, tie_word_embeddings=False, bos_token_id=None, eos_token_id=None,
        pad_token_id=None)
    return transformers.LlamaForCausalLM(cfg).to(dtype).eval()


def noisy_copy(model, scale: float, seed: int):
    """A draft that agrees with ``model`` often but not always: weights plus relative noise."""
    gen = torch.Generator().manual_seed(seed)
    draft = copy.deepcopy(model)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(scale * p.std() * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    return draft


@pytest.fixture(scope="session")
def tiny_target():
    return tiny_llama(seed=0)


@pytest.fixture(scope="session")
def tiny_draft(tiny_target):
    return noisy_copy(tiny_target, 0.5, seed=1)


@pytest.fixture(scope="session")
def embedded_dir():
    from specadapt.models import resolve_model_dir

    return resolve_model_dir(None)


def save_with_tokenizer(model, dest, tokenizer_dir):
    model.save_pretrained(str(dest))
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
                 "special_tokens_map.json"):
        if (tokenizer_dir / name).is_file():
            shutil.copy(tokenizer_dir / name, dest / name)
    return dest


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory, embedded_dir):
    """(target dir, draft dir, small-vocab dir): tiny random LLaMAs with SmolLM2's tokenizer."""
    return make_tiny_dirs(tmp_path_factory.mktemp("tiny"), embedded_dir)


def make_tiny_dirs(root, embedded_dir):
    """tiny_dirs' models, saved under ``root`` (tests/commands uses them too)."""
    from transformers import AutoConfig

    vocab = AutoConfig.from_pretrained(str(embedded_dir)).vocab_size
    target = tiny_llama(seed=2, vocab=vocab, hidden=32, init=0.05, dtype=torch.float32)
    target.config.eos_token_id = 2
    draft = noisy_copy(target, 0.3, seed=3)
    other = tiny_llama(seed=4, vocab=vocab - 1, dtype=torch.float32)
    return (save_with_tokenizer(target, root / "target", embedded_dir),
            save_with_tokenizer(draft, root / "draft", embedded_dir),
            save_with_tokenizer(other, root / "other-vocab", embedded_dir))

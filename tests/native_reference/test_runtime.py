"""Reference.stop_ids: the tokenizer's eos plus the eos ids of generation_config.json, as vLLM."""

from __future__ import annotations

import json
import shutil

import pytest

from specadapt.errors import UsageError
from specadapt.native_reference.runtime import open_reference

from .conftest import save_with_tokenizer, tiny_llama

TOKENIZER_EOS = 2  # <|im_end|> in the embedded tokenizer
PROMPT = [5, 17, 33, 8]


@pytest.fixture(scope="module")
def saved(tmp_path_factory, embedded_dir):
    """A tiny LLaMA (64 ids) with the embedded tokenizer, saved once; copied per test."""
    return save_with_tokenizer(tiny_llama(seed=6, vocab=64, init=0.3), tmp_path_factory.mktemp("rt") / "m",
                               embedded_dir)


def model_dir(saved, tmp_path, generation_config: dict | str | None):
    """A copy of ``saved`` with this generation_config.json (None: no such file)."""
    dest = tmp_path / "target"
    shutil.copytree(saved, dest)
    path = dest / "generation_config.json"
    path.unlink(missing_ok=True)
    if generation_config is not None:
        text = generation_config if isinstance(generation_config, str) else json.dumps(generation_config)
        path.write_text(text)
    return dest


def stop_ids(saved, tmp_path, generation_config):
    return open_reference(model_dir(saved, tmp_path, generation_config), dtype="float64").stop_ids


def test_two_eos_ids_in_generation_config(saved, tmp_path):
    assert stop_ids(saved, tmp_path, {"eos_token_id": [7, 11]}) == (TOKENIZER_EOS, 7, 11)


def test_a_single_int_eos_id(saved, tmp_path):
    assert stop_ids(saved, tmp_path, {"eos_token_id": 9, "bos_token_id": 1}) == (TOKENIZER_EOS, 9)


def test_the_tokenizers_eos_listed_again_counts_once(saved, tmp_path):
    assert stop_ids(saved, tmp_path, {"eos_token_id": [11, TOKENIZER_EOS, 11]}) == (TOKENIZER_EOS, 11)


def test_no_generation_config_file(saved, tmp_path):
    assert stop_ids(saved, tmp_path, None) == (TOKENIZER_EOS,)


def test_without_generation_config_the_model_configs_eos_counts(saved, tmp_path):
    """vLLM builds the generation config from config.json when there is none."""
    dest = model_dir(saved, tmp_path, None)
    config = json.loads((dest / "config.json").read_text())
    (dest / "config.json").write_text(json.dumps({**config, "eos_token_id": [13, 14]}))
    assert open_reference(dest, dtype="float64").stop_ids == (TOKENIZER_EOS, 13, 14)


@pytest.mark.parametrize("config", [{}, {"eos_token_id": None}, {"bos_token_id": 1, "pad_token_id": 7}])
def test_generation_config_without_eos(saved, tmp_path, config):
    assert stop_ids(saved, tmp_path, config) == (TOKENIZER_EOS,)


def test_unreadable_generation_config_refused(saved, tmp_path):
    with pytest.raises(UsageError, match="generation_config.json"):
        stop_ids(saved, tmp_path, "{not json")


def test_generation_stops_on_an_eos_id_from_generation_config(saved, tmp_path):
    free = open_reference(model_dir(saved, tmp_path / "a", None), dtype="float64")
    tokens = free.engine.generate(PROMPT, 12, stop_ids=free.stop_ids).tokens
    # the first generated token after the first that is new, and not the tokenizer's eos
    at = next(i for i in range(1, len(tokens)) if tokens[i] not in tokens[:i] + [TOKENIZER_EOS])
    ref = open_reference(model_dir(saved, tmp_path / "b", {"eos_token_id": [tokens[at]]}), dtype="float64")
    assert ref.stop_ids == (TOKENIZER_EOS, tokens[at])
    gen = ref.engine.generate(PROMPT, 12, stop_ids=ref.stop_ids)
    assert gen.tokens == tokens[:at + 1] and gen.finish_reason == "stop"

"""truncated_copy: the layer-cut draft the demo serves, written atomically and reused."""

from __future__ import annotations

import json

import pytest

from specadapt.errors import UsageError
from specadapt.models import COMPLETE_MARKER, is_complete, truncated_model_dir
from specadapt.native_reference import models as nr_models

from .conftest import tiny_llama, torch


@pytest.fixture
def src(tmp_path):
    path = tmp_path / "tiny-target"
    tiny_llama(seed=5, layers=4, dtype=torch.float32).save_pretrained(str(path))
    (path / "tokenizer.json").write_text('{"stand-in": true}')
    (path / "chat_template.jinja").write_text("{{ messages }}")
    (path / "notes.txt").write_text("not part of a model")
    return path


def test_the_cut_keeps_the_first_layers_and_the_tokenizer(src, tmp_path):
    dest = nr_models.truncated_copy(src, 2, tmp_path / "cut")
    assert is_complete(dest) and not (tmp_path / "cut.part").exists()
    assert json.loads((dest / "config.json").read_text())["num_hidden_layers"] == 2
    assert (dest / "tokenizer.json").read_text() == '{"stand-in": true}'
    assert (dest / "chat_template.jinja").is_file() and not (dest / "notes.txt").exists()
    full = nr_models.load_causal_lm(src)
    cut = nr_models.load_causal_lm(dest)
    assert len(cut.model.layers) == 2
    for name, p in cut.state_dict().items():
        assert torch.equal(p, full.state_dict()[name]), name  # the same weights, the later layers dropped


def test_a_complete_cut_is_reused_and_force_writes_it_again(src, tmp_path, monkeypatch):
    dest = nr_models.truncated_copy(src, 1, tmp_path / "cut")
    (dest / "mine").write_text("kept")

    def no_load(*a, **k):
        raise AssertionError("a complete cut must not be loaded again")

    monkeypatch.setattr(nr_models, "load_causal_lm", no_load)
    assert nr_models.truncated_copy(src, 1, dest) == dest and (dest / "mine").is_file()
    monkeypatch.undo()
    nr_models.truncated_copy(src, 1, dest, force=True)
    assert not (dest / "mine").exists() and is_complete(dest)


def test_an_interrupted_write_leaves_no_directory_that_looks_done(src, tmp_path, monkeypatch):
    dest = tmp_path / "cut"
    dest.mkdir()
    (dest / "config.json").write_text("{}")  # a half-written earlier attempt, without the marker

    def crash(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(nr_models.shutil, "copy", crash)
    with pytest.raises(KeyboardInterrupt):
        nr_models.truncated_copy(src, 2, dest)
    assert not (tmp_path / "cut.part").exists()
    assert not is_complete(dest) and not (dest / COMPLETE_MARKER).exists()


def test_layers_the_model_does_not_have_are_refused(src, tmp_path):
    with pytest.raises(UsageError, match="cannot keep 5 of 4 layers"):
        nr_models.truncated_copy(src, 5, tmp_path / "cut")
    assert not (tmp_path / "cut").exists() and not (tmp_path / "cut.part").exists()


def test_the_cache_place_is_under_the_cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECADAPT_CACHE_DIR", str(tmp_path / "c"))
    assert truncated_model_dir(tmp_path / "SmolLM2-135M-Instruct", 8) == \
        tmp_path / "c" / "models" / "SmolLM2-135M-Instruct-first8"

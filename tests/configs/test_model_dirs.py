"""Checks from local model directories: vocab, tokenizer, lengths, head widths, MTP depth."""

from __future__ import annotations

from cfg_helpers import make_model_dir

from specadapt.configs.checks import check_model_dirs, errors
from specadapt.configs.spec import SpecConfig

LLAMA = {"model_type": "llama", "vocab_size": 5, "hidden_size": 64,
         "max_position_embeddings": 2048}
VOCAB = {"a": 0, "b": 1, "c": 2, "d": 3, "e": 4}


def _msgs(problems):
    return [p.message for p in errors(problems)]


def test_matching_draft_passes(tmp_path):
    t = make_model_dir(tmp_path, "t", LLAMA, VOCAB)
    d = make_model_dir(tmp_path, "d", {**LLAMA, "hidden_size": 32}, dict(VOCAB))
    spec = SpecConfig(target=str(t), method="draft_model", draft=str(d), k=3, max_model_len=2048)
    assert check_model_dirs(spec) == []


def test_vocab_size_mismatch(tmp_path):
    t = make_model_dir(tmp_path, "t", LLAMA)
    d = make_model_dir(tmp_path, "d", {**LLAMA, "vocab_size": 6})
    spec = SpecConfig(target=str(t), method="draft_model", draft=str(d), k=3)
    assert _msgs(check_model_dirs(spec)) == [
        "Draft vocab size 6 differs from the target's 5: use a draft trained with the "
        "target's tokenizer (same model family)."]


def test_tokenizer_mismatch_names_first_differing_ids(tmp_path):
    t = make_model_dir(tmp_path, "t", LLAMA, VOCAB)
    d = make_model_dir(tmp_path, "d", LLAMA, {"a": 0, "b": 1, "x": 2, "d": 3, "y": 4})
    spec = SpecConfig(target=str(t), method="draft_model", draft=str(d), k=3)
    (msg,) = _msgs(check_model_dirs(spec))
    assert msg.startswith("Draft and target tokenizers differ at 2 ids (first: "
                          "id 2: target 'c' vs draft 'x', id 4: target 'e' vs draft 'y')")


def test_max_model_len_beyond_target(tmp_path):
    t = make_model_dir(tmp_path, "t", LLAMA)
    spec = SpecConfig(target=str(t), method="ngram", k=3, max_model_len=4096)
    assert "lower --max-model-len to 2048" in _msgs(check_model_dirs(spec))[0]


def test_max_model_len_beyond_draft(tmp_path):
    t = make_model_dir(tmp_path, "t", {**LLAMA, "max_position_embeddings": 8192})
    d = make_model_dir(tmp_path, "d", LLAMA)
    spec = SpecConfig(target=str(t), method="draft_model", draft=str(d), k=3,
                      max_model_len=4096)
    assert "exceeds the draft's 2048" in _msgs(check_model_dirs(spec))[0]


def test_eagle_head_hidden_size(tmp_path):
    t = make_model_dir(tmp_path, "t", LLAMA)
    head = make_model_dir(tmp_path, "h", {"model_type": "llama", "hidden_size": 128})
    spec = SpecConfig(target=str(t), method="eagle3", draft=str(head), k=3)
    assert _msgs(check_model_dirs(spec)) == [
        "The eagle3 head expects hidden size 128 but the target has 64: use the head "
        "trained for this target model."]
    ok = make_model_dir(tmp_path, "h2", {"hidden_size": 32, "target_hidden_size": 64})
    assert check_model_dirs(spec.model_copy(update={"draft": str(ok)})) == []


def test_mtp_needs_mtp_layers_and_divisible_k(tmp_path):
    plain = make_model_dir(tmp_path, "plain", LLAMA)
    assert "no" in _msgs(check_model_dirs(SpecConfig(target=str(plain), method="mtp", k=1)))[0]
    mtp = make_model_dir(tmp_path, "mtp", {**LLAMA, "num_nextn_predict_layers": 2})
    assert check_model_dirs(SpecConfig(target=str(mtp), method="mtp", k=4)) == []
    assert "multiple of 2" in _msgs(check_model_dirs(SpecConfig(target=str(mtp), method="mtp",
                                                                k=3)))[0]


def test_hub_ids_are_not_checked():
    spec = SpecConfig(target="org/model", method="draft_model", draft="org/draft", k=3)
    assert check_model_dirs(spec) == []


def test_embedded_model_against_itself(smol_dir):
    spec = SpecConfig(target=str(smol_dir), method="draft_model", draft=str(smol_dir), k=3,
                      max_model_len=2048)
    assert check_model_dirs(spec) == []

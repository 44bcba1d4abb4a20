"""--spec-config: the neutral form or the backend's own, told apart by their keys, each read
into the same SpecConfig, and one line naming the field when something is wrong.

Round trips: a neutral SpecConfig -> the backend's renderer (the text an adapter writes)
-> load_spec_config -> the same SpecConfig; the neutral form itself reads back equal too.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import yaml

from specadapt.adapters.spec_config import forms_for, load_spec_config
from specadapt.configs import llamacpp, sglang, trtllm, vllm
from specadapt.configs.spec import SpecConfig
from specadapt.configs.spec_input import (
    FORMS,
    NEUTRAL_FIELDS,
    SpecSupport,
    detect_form,
    flags_to_mapping,
    neutral_form,
    read_spec_config,
)
from specadapt.errors import UsageError

FIX = Path(__file__).parent / "fixtures" / "trtllm"


def _vllm(spec: SpecConfig) -> str:
    return json.dumps(vllm.vllm_spec_dict(spec))


def _trtllm(spec: SpecConfig) -> str:
    return json.dumps(trtllm.trtllm_speculative_config(spec))


def _sglang(spec: SpecConfig) -> str:
    return shlex.join(sglang.sglang_spec_flags(spec))


def _llamacpp(spec: SpecConfig) -> str:
    return shlex.join(llamacpp.llamacpp_spec_flags(spec))


# backend -> (its own renderer, the specs it can carry)
ROUND_TRIPS = {
    "vllm": (_vllm, [
        SpecConfig(method="ngram", k=4, ngram_min=2, ngram_max=4),
        SpecConfig(method="draft_model", k=3, draft="/d", draft_tp=1, k_per_batch_size=[(1, 4, 3), (5, 16, 1)]),
        SpecConfig(method="eagle3", k=3, draft="/h"),
        SpecConfig(method="eagle", k=2, draft="/h"),
        SpecConfig(method="medusa", k=2, draft="/heads"),
        SpecConfig(method="mtp", k=2),
        SpecConfig(method="suffix"),
    ]),
    "trtllm": (_trtllm, [
        SpecConfig(method="ngram", k=4, ngram_max=3),
        SpecConfig(method="draft_model", k=4, draft="/d", max_concurrency=8),
        SpecConfig(method="eagle3", k=3, draft="/h", draft_len_schedule={1: 3, 8: 2, 32: 1}),
        SpecConfig(method="mtp", k=2),
    ]),
    "sglang": (_sglang, [
        SpecConfig(method="eagle3", k=3, draft="/h"),
        SpecConfig(method="eagle", k=2, draft="/h"),
        SpecConfig(method="draft_model", k=5, draft="/small"),
        SpecConfig(method="mtp", k=2),
        SpecConfig(method="ngram", k=4),
    ]),
    "llamacpp": (_llamacpp, [SpecConfig(method="ngram", k=4)]),
    "reference": (_vllm, [
        SpecConfig(method="ngram", k=4, ngram_min=1, ngram_max=4),
        SpecConfig(method="draft_model", k=3, draft="/d"),
    ]),
}
CASES = [(backend, spec) for backend, (_, specs) in ROUND_TRIPS.items() for spec in specs]
IDS = [f"{b}-{s.method}" for b, s in CASES]


@pytest.mark.parametrize("backend, spec", CASES, ids=IDS)
def test_native_form_reads_back_to_the_same_spec(backend, spec):
    render, _ = ROUND_TRIPS[backend]
    native = render(spec)
    mapping = _mapping(native)
    assert detect_form(mapping) == forms_for(backend)[1] or set(mapping) == {"method"}  # suffix: as neutral
    assert load_spec_config(native, backend) == spec


@pytest.mark.parametrize("backend, spec", CASES, ids=IDS)
def test_neutral_form_reads_back_to_the_same_spec(backend, spec):
    neutral = json.dumps(neutral_form(spec))
    assert detect_form(json.loads(neutral)) == "neutral"
    assert load_spec_config(neutral, backend) == spec


def _mapping(value: str) -> dict:
    return json.loads(value) if value.startswith("{") else flags_to_mapping(value)


def test_neutral_form_takes_the_config_command_s_spellings():
    spec = load_spec_config('{"method": "ngram", "k": 4, "ngram-min": 2, "ngram-max": 3}', "vllm")
    assert spec == SpecConfig(method="ngram", k=4, ngram_min=2, ngram_max=3)
    assert load_spec_config('{"method": "off"}', "trtllm") == SpecConfig(method="off")


@pytest.mark.parametrize("data, form", [
    ({"method": "ngram", "k": 4}, "neutral"),
    ({"method": "ngram"}, "neutral"),  # only a shared key: read as neutral (the same SpecConfig either way)
    ({"max_concurrency": 4}, "neutral"),
    ({"method": "ngram", "num_speculative_tokens": 4}, "vllm"),
    ({"model": "/d", "num_speculative_tokens": 4}, "vllm"),
    ({"method": "eagle", "disable_by_batch_size": 4}, "vllm"),  # a retired key still tells the form
    ({"decoding_type": "Eagle3", "max_draft_len": 3}, "trtllm"),
    ({"decoding_type": "NGram", "prompt_lookup_num_tokens": 3}, "trtllm"),
    ({"--speculative-algorithm": "EAGLE3", "--speculative-num-steps": "3"}, "sglang"),
    ({"speculative_algorithm": "NGRAM", "speculative_num_draft_tokens": 5}, "sglang"),
    ({"--draft_model": "prompt-lookup-decoding", "--draft_model_num_pred_tokens": "4"}, "llamacpp"),
    ({"draft-model": "prompt-lookup-decoding"}, "llamacpp"),
])
def test_the_form_is_told_by_its_own_keys(data, form):
    assert detect_form(data) == form


def test_forms_per_backend():
    assert {b: forms_for(b) for b in ("vllm", "reference", "trtllm", "sglang", "llamacpp", "someplugin")} == {
        "vllm": ["neutral", "vllm"], "reference": ["neutral", "vllm"], "trtllm": ["neutral", "trtllm"],
        "sglang": ["neutral", "sglang"], "llamacpp": ["neutral", "llamacpp"], "someplugin": ["neutral"]}


# ------------------------------------------------------------------ what the native forms keep

def test_vllm_keys_without_a_neutral_field_are_kept_for_vllm():
    spec = load_spec_config('{"method": "eagle3", "model": "/h", "num_speculative_tokens": 3, '
                            '"enforce_eager": true, "quantization": "fp8"}', "vllm")
    assert spec.native_extras == {"vllm": {"enforce_eager": True, "quantization": "fp8"}}
    assert vllm.vllm_spec_dict(spec) == {"method": "eagle3", "model": "/h", "num_speculative_tokens": 3,
                                         "enforce_eager": True, "quantization": "fp8"}


def test_trtllm_keys_without_a_neutral_field_are_kept_for_trtllm():
    sc = {"decoding_type": "Eagle3", "max_draft_len": 3, "speculative_model": "/h", "eagle3_one_model": True}
    spec = load_spec_config(json.dumps(sc), "trtllm")
    assert spec.native_extras == {"trtllm": {"eagle3_one_model": True}}
    assert trtllm.trtllm_speculative_config(spec) == sc


def test_an_sglang_tree_draft_is_kept_for_sglang():
    flags = ("--speculative-algorithm EAGLE3 --speculative-draft-model-path /h --speculative-num-steps 3 "
             "--speculative-eagle-topk 4 --speculative-num-draft-tokens 8")
    spec = load_spec_config(flags, "sglang")
    assert (spec.method, spec.k, spec.draft) == ("eagle3", 3, "/h")
    assert shlex.join(sglang.sglang_spec_flags(spec)) == flags


def test_mtp_depth_in_the_older_trtllm_key_is_k():
    spec = load_spec_config('{"decoding_type": "MTP", "num_nextn_predict_layers": 3}', "trtllm")
    assert spec == SpecConfig(method="mtp", k=3)


# ------------------------------------------------------------------ files

def test_whole_config_files_are_unwrapped(tmp_path):
    spec = SpecConfig(target="/m", method="ngram", k=4, ngram_min=2, ngram_max=4)
    (tmp_path / "vllm.yaml").write_text(vllm.render_vllm_yaml(spec))
    (tmp_path / "old-vllm.yaml").write_text(vllm.render_vllm_yaml(spec, "0.10.0"))  # JSON as a string
    (tmp_path / "trtllm.yaml").write_text(trtllm.render_trtllm_yaml(spec.model_copy(update={"ngram_min": None})))
    (tmp_path / "vllm-engine.yaml").write_text(yaml.safe_dump({"model": "/m", "speculative_config": {
        "method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4}}))
    bare = spec.model_copy(update={"target": None})
    assert load_spec_config(str(tmp_path / "vllm.yaml"), "vllm") == bare
    assert load_spec_config(str(tmp_path / "old-vllm.yaml"), "vllm") == bare
    assert load_spec_config(str(tmp_path / "vllm-engine.yaml"), "vllm") == bare
    assert load_spec_config(str(tmp_path / "trtllm.yaml"), "trtllm") == bare.model_copy(update={"ngram_min": None})


def test_flags_in_a_file(tmp_path):
    path = tmp_path / "sglang.txt"
    path.write_text("--speculative-algorithm NGRAM\n--speculative-num-draft-tokens=5\n")
    assert load_spec_config(str(path), "sglang") == SpecConfig(method="ngram", k=4)


@pytest.mark.parametrize("name, read", [
    ("eagle3-hub.yaml", SpecConfig(method="eagle3", k=4, draft="yuhuili/EAGLE3-LLaMA3.1-Instruct-8B")),
    ("eagle3-model-dir-alias.yaml", SpecConfig(method="eagle3", k=4, draft="/path/to/draft/model")),
    ("mtp-quickstart.yaml", SpecConfig(method="mtp", k=3)),
    ("ngram-quickstart.yaml", SpecConfig(method="ngram", k=3, ngram_max=4,
                                         native_extras={"trtllm": {"is_public_pool": True}})),
    # what TensorRT-LLM's published schema refuses, the parser refuses, naming the key
    ("eagle3-sa.yaml", "unknown field 'use_sa_spec'"),
    ("eagle3-dynamic-tree.yaml", "unknown field 'max_batch_size'"),
    ("draft-target-docs-spelling.yaml", "decoding_type: 'DraftTarget'"),
])
def test_tensorrt_llm_s_own_docs_examples(name, read):
    if isinstance(read, SpecConfig):
        assert load_spec_config(str(FIX / name), "trtllm") == read
    else:
        with pytest.raises(UsageError, match=f"^--spec-config: {read}"):
            load_spec_config(str(FIX / name), "trtllm")


# ------------------------------------------------------------------ one line naming the field

def _fields(*forms: str) -> str:
    return "; ".join(f"{f} form fields: {', '.join(FORMS[f].fields)}" for f in forms)


ERRORS = [
    # neutral
    ("vllm", '{"method": "ngram", "k": 0}', "k: must be > 0"),
    ("trtllm", '{"method": "ngram", "k": "four"}', "k: must be an integer"),
    ("sglang", '{"method": "lookahead", "k": 3}',
     "method: must be one of 'ngram', 'draft_model', 'eagle', 'eagle3', 'mtp', 'medusa', 'suffix' or 'off'"),
    ("vllm", '{"k": 4}', "method: is required (one of ngram, draft_model, eagle, eagle3, mtp, medusa, suffix, off)"),
    ("vllm", '{"method": "ngram", "k": true}', "k: must not be true"),
    ("llamacpp", '{"method": "ngram", "k": 4, "dtype": "float32"}',
     "dtype: is a server setting, not a speculative one: use --dtype"),
    ("vllm", '{"method": "ngram", "k": 4, "ngram_min": 5, "ngram_max": 2}',
     "ngram_min: 5 is larger than ngram_max 2: make it <= 2"),
    ("vllm", '{"method": "eagle3", "k": 3}', "draft: is required for method eagle3 (the draft model or head: "
                                             "a path or HF id)"),
    ("vllm", '{"method": "ngram", "k": 3, "draft": "/d"}',
     "draft: method ngram drafts from the context and takes no draft model: remove it"),
    ("vllm", '{"method": "ngram"}', "k: is required for method ngram (draft tokens per step; 2 to 5 is typical)"),
    ("vllm", '{"method": "off", "k": 3}', "k: has no effect with method off: remove it"),
    ("sglang", '{"method": "eagle3", "k": 3, "draft": "/h", "max_concurrency": 4}',
     "max_concurrency: --backend sglang has no such setting: remove it"),
    ("vllm", '{"method": "ngram", "k": 4, "foo": 1}', f"unknown field 'foo' ({_fields('neutral', 'vllm')})"),
    ("someplugin", '{"method": "ngram", "k": 4, "foo": 1}', f"unknown field 'foo' ({_fields('neutral')})"),
    # vLLM
    ("vllm", '{"method": "ngram", "num_speculative_tokens": 0}', "num_speculative_tokens: must be >= 1"),
    ("vllm", '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": "4"}',
     "prompt_lookup_max: must be an integer"),
    ("vllm", '{"method": "eagle3", "num_speculative_tokens": 3}',
     "model: is required for method eagle3 (the draft model or head: a path or HF id)"),
    ("vllm", '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 5, "prompt_lookup_max": 2}',
     "prompt_lookup_min: 5 is larger than prompt_lookup_max 2: make it <= 2"),
    ("vllm", '{"method": "eagle", "model": "/h", "num_speculative_tokens": 2, "disable_by_batch_size": 4}',
     "disable_by_batch_size: removed (a no-op since 0.10): use num_speculative_tokens_per_batch_size"),
    ("vllm", '{"method": "mlp_speculator", "model": "/h", "num_speculative_tokens": 2}',
     "method: 'mlp_speculator' is valid in vLLM but specadapt does not model it: use one of ngram, draft_model, "
     "eagle, eagle3, mtp, medusa, suffix"),
    ("vllm", '{"method": "ngram", "num_speculative_tokens": 4, "bogus": 1}',
     f"unknown field 'bogus' ({_fields('neutral', 'vllm')})"),
    ("reference", '{"method": "ngram", "num_speculative_tokens": 4, "enforce_eager": true}',
     "enforce_eager: --backend reference has no such setting: remove it"),
    # TensorRT-LLM
    ("trtllm", '{"decoding_type": "NGram", "max_draft_len": 0}', "max_draft_len: must be >= 1"),
    ("trtllm", '{"decoding_type": "Eagle3", "max_draft_len": 3}',
     "speculative_model: is required for method eagle3 (the draft model or head: a path or HF id)"),
    ("trtllm", '{"decoding_type": "Lookahead", "max_draft_len": 3}',
     "decoding_type: must be one of Draft_Target, Eagle, Eagle3, MTP, Medusa, NGram, not 'Lookahead'"),
    ("trtllm", '{"decoding_type": "NGram", "max_draft_len": 3, "prompt_lookup_num_tokens": 3}',
     "prompt_lookup_num_tokens: an old NGram field the current schema rejects: use max_draft_len"),
    ("trtllm", '{"decoding_type": "NGram", "max_draft_len": 3, "max_concurrency": 4, "draft_len_schedule": {"1": 3}}',
     "draft_len_schedule: excludes max_concurrency in TensorRT-LLM: keep one of them"),
    ("trtllm", '{"decoding_type": "NGram", "max_draft_len": 3, "eagle3_one_model": true}',
     "unknown field 'eagle3_one_model' (" + _fields("neutral") + "; trtllm form fields: "
     + ", ".join([*trtllm.BASE_KEYS, *trtllm.TYPE_KEYS["NGram"]]) + ")"),
    # SGLang
    ("sglang", "--speculative-algorithm EAGLE3 --speculative-draft-model-path /h --speculative-num-steps x",
     "--speculative-num-steps: must be an integer"),
    ("sglang", "--speculative-algorithm EAGLE --speculative-num-steps 3",
     "--speculative-draft-model-path: is required for method eagle (the draft model or head: a path or HF id)"),
    ("sglang", "--speculative-algorithm MEDUSA --speculative-num-steps 3",
     "--speculative-algorithm: must be one of EAGLE, EAGLE3, NEXTN, NGRAM, STANDALONE, not 'MEDUSA'"),
    ("sglang", "--speculative-algorithm NGRAM --speculative-num-steps 3 --speculative-num-draft-tokens 4",
     "--speculative-num-steps: does not apply to NGRAM (it drafts from the context): remove it"),
    ("sglang", "--speculative-algorithm EAGLE3 --speculative-draft-model-path /h --speculative-num-steps 2 "
               "--speculative-num-draft-tokens 9",
     "--speculative-num-draft-tokens: 9 exceeds --speculative-num-steps x --speculative-eagle-topk + 1 = 3: lower it"),
    ("sglang", "--speculative-algorithm EAGLE3 --speculative-num-steps",
     "--speculative-num-steps: needs a value"),
    # llama.cpp
    ("llamacpp", "--draft_model other --draft_model_num_pred_tokens 4",
     "--draft_model: must be prompt-lookup-decoding (the only drafter the server starts from its command line), "
     "not 'other'"),
    ("llamacpp", "--draft_model prompt-lookup-decoding --draft_model_num_pred_tokens 0",
     "--draft_model_num_pred_tokens: must be >= 1"),
    # a form the backend does not take, and mixed forms
    ("trtllm", '{"method": "ngram", "num_speculative_tokens": 4}',
     'num_speculative_tokens: a vllm form field; --backend trtllm takes the neutral form or the trtllm form: '
     'write {"method": "ngram", "k": 4}'),
    ("vllm", '{"decoding_type": "Eagle3", "max_draft_len": 3, "speculative_model": "/h"}',
     'decoding_type: a trtllm form field; --backend vllm takes the neutral form or the vllm form: '
     'write {"method": "eagle3", "k": 3, "draft": "/h"}'),
    ("llamacpp", "--speculative-algorithm NGRAM --speculative-num-draft-tokens 5",
     '--speculative-algorithm: a sglang form field; --backend llamacpp takes the neutral form or the llamacpp '
     'form: write {"method": "ngram", "k": 4}'),
    ("vllm", '{"method": "ngram", "k": 4, "num_speculative_tokens": 4}',
     "mixes neutral form fields (k) and vllm form fields (num_speculative_tokens): write one form"),
]


@pytest.mark.parametrize("backend, value, message", ERRORS, ids=[f"{b}:{m[:40]}" for b, _, m in ERRORS])
def test_a_wrong_field_is_one_line_naming_it(backend, value, message):
    with pytest.raises(UsageError) as err:
        load_spec_config(value, backend)
    assert str(err.value) == f"--spec-config: {message}"
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("value, message", [
    ('{"method": "ngram",', "--spec-config is not valid JSON (Expecting property name enclosed in double quotes at "
                            "column 20): give a JSON object such as '{\"method\": \"ngram\", \"k\": 4}' or a file path"),
    ("[1, 2]", "--spec-config '[1, 2]' is neither a JSON object nor an existing file"),
    ("--speculative-algorithm 'EAGLE", "--spec-config flags cannot be split (No closing quotation): check the quotes"),
    ("--speculative-algorithm EAGLE stray", "--spec-config: 'stray' is not a --flag: write --flag VALUE pairs"),
])
def test_unreadable_values(value, message):
    with pytest.raises(UsageError) as err:
        load_spec_config(value, "sglang")
    assert str(err.value) == message


def test_a_file_that_holds_no_mapping(tmp_path):
    path = tmp_path / "spec.json"
    path.write_text("[1, 2]")
    with pytest.raises(UsageError, match="must hold a JSON object \\(a mapping\\) or server flags, not list"):
        load_spec_config(str(path), "vllm")


def test_neutral_fields_are_the_spec_config_fields_the_config_command_takes():
    assert set(NEUTRAL_FIELDS) == set(SpecConfig.model_fields) - {"target", "tp", "dtype", "max_model_len",
                                                                  "native_extras"}


# ------------------------------------------------------------------ what a backend declares

@pytest.mark.parametrize("declared, message", [
    ({"form": "neutral"}, "form: 'neutral' is not a --spec-config form: use one of vllm, trtllm, sglang, llamacpp, "
                          "or None for the neutral form only"),
    ({"fields": {"k", "draft"}}, "fields: must hold method (every spec config has one)"),
    ({"fields": {"method", "k", "temperature"}},
     f"fields: temperature: not a neutral field (choose from {', '.join(NEUTRAL_FIELDS)})"),
    ({"rules": "sglang"}, "rules: 'sglang' has no rules in specadapt: use one of vllm, trtllm, or None"),
    ({"batch_schedule": True, "fields": {"method", "k"}},
     "batch_schedule is declared but fields leave out k_per_batch_size, the schedule's field"),
    ({"native_extras": True}, "native_extras is declared without a form whose keys they would be"),
])
def test_a_malformed_declaration_is_refused_naming_what_is_wrong(declared, message):
    with pytest.raises(ValueError) as err:
        SpecSupport(**declared)
    e = err.value.errors()[0]
    got = str(e["msg"]).removeprefix("Value error, ")
    assert (f"{e['loc'][0]}: {got}" if e["loc"] else got) == message


def test_a_declaration_decides_the_forms_and_fields_a_backend_takes():
    support = SpecSupport(form="sglang", fields=frozenset({"method", "k"}))
    assert support.forms == ["neutral", "sglang"] and SpecSupport().forms == ["neutral"]
    spec = read_spec_config("--speculative-algorithm NGRAM --speculative-num-draft-tokens 5", "x", support)
    assert (spec.method, spec.k) == ("ngram", 4)
    with pytest.raises(UsageError) as err:
        read_spec_config('{"method": "eagle3", "k": 3, "draft": "/h"}', "x", support)
    assert str(err.value) == "--spec-config: draft: --backend x has no such setting: remove it"
    # every field, and the form's own keys kept, when so declared
    wide = SpecSupport(form="sglang", native_extras=True)
    tree = read_spec_config("--speculative-algorithm EAGLE --speculative-draft-model-path /h "
                            "--speculative-num-steps 3 --speculative-eagle-topk 4", "x", wide)
    assert tree.native_extras == {"sglang": {"--speculative-eagle-topk": 4}} and tree.draft == "/h"
    with pytest.raises(UsageError, match="--backend x has no such setting"):
        read_spec_config("--speculative-algorithm EAGLE --speculative-draft-model-path /h "
                         "--speculative-num-steps 3 --speculative-eagle-topk 4", "x", support)

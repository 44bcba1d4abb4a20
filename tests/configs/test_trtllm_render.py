"""TensorRT-LLM renderers: serve YAML, argv, LLM-API kwargs, schema validation."""

from __future__ import annotations

import pytest
import yaml

from specadapt.configs import trtllm
from specadapt.configs.spec import SpecConfig

CASES = {
    "eagle3": SpecConfig(target="M", method="eagle3", k=3, draft="H", max_concurrency=8),
    "mtp": SpecConfig(target="M", method="mtp", k=3, tp=8),
    "ngram": SpecConfig(target="M", method="ngram", k=3, ngram_max=4,
                        draft_len_schedule={1: 3, 16: 1}),
    "draft": SpecConfig(target="M", method="draft_model", k=4, draft="D"),
}


def test_eagle3_yaml_exact():
    assert trtllm.render_trtllm_yaml(CASES["eagle3"]) == (
        "speculative_config:\n  decoding_type: Eagle3\n  max_draft_len: 3\n"
        "  speculative_model: H\n  max_concurrency: 8\nenable_iter_perf_stats: true\n")


@pytest.mark.parametrize("name,decoding_type,no_overlap", [
    ("eagle3", "Eagle3", False), ("mtp", "MTP", False), ("ngram", "NGram", True),
    ("draft", "Draft_Target", True)])
def test_decoding_types_and_required_keys(name, decoding_type, no_overlap):
    doc = trtllm.render_trtllm_config(CASES[name])
    assert doc["speculative_config"]["decoding_type"] == decoding_type
    assert doc["enable_iter_perf_stats"] is True
    assert doc.get("disable_overlap_scheduler", False) is no_overlap


def test_ngram_window_maps_to_max_matching_ngram_size():
    sc = trtllm.trtllm_speculative_config(CASES["ngram"])
    assert sc["max_matching_ngram_size"] == 4 and sc["draft_len_schedule"] == {1: 3, 16: 1}


def test_argv_config_flag_by_version():
    new = trtllm.render_trtllm_argv(CASES["mtp"], "c.yaml")
    old = trtllm.render_trtllm_argv(CASES["mtp"], "c.yaml", "1.1.0")
    assert new == ["trtllm-serve", "M", "--host", "0.0.0.0", "--port", "8000", "--backend",
                   "pytorch", "--tp_size", "8", "--config", "c.yaml"]
    assert old[-2:] == ["--extra_llm_api_options", "c.yaml"]


def test_llm_kwargs():
    kw = trtllm.trtllm_llm_kwargs(CASES["eagle3"])
    assert kw["model"] == "M" and kw["backend"] == "pytorch"
    assert kw["speculative_config"]["decoding_type"] == "Eagle3"


def test_off_has_no_speculative_config():
    doc = trtllm.render_trtllm_config(SpecConfig(target="M", method="off"))
    assert "speculative_config" not in doc and doc["enable_iter_perf_stats"] is True


@pytest.mark.parametrize("name", sorted(CASES))
def test_generated_speculative_config_matches_published_schema(name, schema):
    doc = trtllm.render_trtllm_config(CASES[name])
    assert trtllm.schema_problems(doc, schema) == []


@pytest.mark.parametrize("name", sorted(CASES))
def test_round_trip_through_the_speculative_config_reader(name):
    spec = CASES[name]
    doc = yaml.safe_load(trtllm.render_trtllm_yaml(spec))
    back = trtllm.read_trtllm_form(doc["speculative_config"])
    assert (back.method, back.k, back.draft, back.max_concurrency, back.draft_len_schedule) == \
        (spec.method, spec.k, spec.draft, spec.max_concurrency, spec.draft_len_schedule)


@pytest.mark.parametrize("sc,phrase", [
    ({"decoding_type": "DraftTarget", "max_draft_len": 3, "speculative_model": "D"},
     "write 'Draft_Target'"),
    ({"decoding_type": "Eagle3", "max_draft_len": 0, "speculative_model": "H"}, "> 0"),
    ({"decoding_type": "Eagle3", "max_draft_len": 3}, "needs speculative_model"),
    ({"decoding_type": "NGram", "max_draft_len": 3, "max_concurrency": 4,
      "draft_len_schedule": {1: 3}}, "mutually exclusive"),
    ({"decoding_type": "NGram", "max_draft_len": 3, "prompt_lookup_num_tokens": 3},
     "old NGram field"),
    ({"decoding_type": "Medusa", "max_draft_len": 3, "speculative_model": "H"},
     "not supported on the pytorch backend"),
])
def test_check_trtllm_config_rejects(sc, phrase):
    found = [p.message for p in trtllm.check_trtllm_config({"speculative_config": sc,
                                                             "enable_iter_perf_stats": True})
             if p.severity == "error"]
    assert any(phrase in m for m in found), found


@pytest.mark.parametrize("sc", [
    {"decoding_type": "DraftTarget", "max_draft_len": 3},
    {"decoding_type": "NGram", "max_draft_len": 3, "prompt_lookup_num_tokens": 3},
    {"decoding_type": "Eagle3", "max_draft_len": 3, "unknown_key": 1},
    {"decoding_type": "Eagle3", "max_draft_len": -1},
    {"decoding_type": "NGram", "max_draft_len": 3, "max_concurrency": 0},
])
def test_schema_rejects(sc, schema):
    assert trtllm.schema_problems({"speculative_config": sc}, schema)


def test_eagle_decoding_type_is_an_eagle3_alias_on_pytorch():
    doc = {"speculative_config": {"decoding_type": "Eagle", "max_draft_len": 3,
                                  "speculative_model": "H"}, "enable_iter_perf_stats": True}
    found = trtllm.check_trtllm_config(doc)
    assert [p.severity for p in found] == ["warning"] and "EAGLE-3" in found[0].message
    assert trtllm.check_trtllm_config(doc, engine="tensorrt") == []

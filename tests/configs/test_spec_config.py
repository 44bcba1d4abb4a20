"""SpecConfig: field ranges, extra keys, and the spec-level rules of checks.check_spec."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from specadapt.configs.checks import check_spec, errors
from specadapt.configs.spec import SpecConfig


def test_extra_keys_are_forbidden():
    with pytest.raises(ValidationError):
        SpecConfig(target="M", method="ngram", k=3, num_speculative_tokens=3)


@pytest.mark.parametrize("field,value", [("k", 0), ("tp", 0), ("draft_tp", 0),
                                         ("ngram_min", 0), ("max_concurrency", 0)])
def test_field_ranges(field, value):
    with pytest.raises(ValidationError):
        SpecConfig(target="M", method="ngram", **{field: value})


def test_every_field_is_described():
    for name, field in SpecConfig.model_fields.items():
        assert field.description, name


GOOD = [
    ("vllm", SpecConfig(target="M", method="ngram", k=4, ngram_min=2, ngram_max=4)),
    ("vllm", SpecConfig(target="M", method="eagle3", k=3, draft="H", tp=2, draft_tp=2)),
    ("vllm", SpecConfig(target="M", method="draft_model", k=3, draft="D", tp=4, draft_tp=1,
                        k_per_batch_size=[(1, 8, 3), (9, 32, 1)])),
    ("vllm", SpecConfig(target="M", method="mtp", k=2)),
    ("vllm", SpecConfig(target="M", method="off")),
    ("trtllm", SpecConfig(target="M", method="eagle3", k=3, draft="H", max_concurrency=16)),
    ("trtllm", SpecConfig(target="M", method="ngram", k=3, ngram_max=4,
                          draft_len_schedule={1: 3, 8: 1})),
    ("trtllm", SpecConfig(target="M", method="mtp", k=3, tp=8)),
]


@pytest.mark.parametrize("backend,spec", GOOD)
def test_good_specs_have_no_errors(backend, spec):
    assert errors(check_spec(spec, backend)) == []


# the bad-config table: (backend, version, spec kwargs, a phrase of the one-sentence fix)
BAD = [
    ("vllm", None, dict(method="ngram"), "needs k"),
    ("vllm", None, dict(method="eagle3", k=3), "add --draft"),
    ("vllm", None, dict(method="draft_model", k=3), "add --draft"),
    ("vllm", None, dict(method="ngram", k=3, draft="D"), "remove --draft"),
    ("vllm", None, dict(method="ngram", k=3, ngram_min=5, ngram_max=2), "ngram_min <= ngram_max"),
    ("vllm", None, dict(method="eagle", k=3, draft="D", ngram_max=3),
     "only applies to method ngram"),
    ("vllm", None, dict(method="draft_model", k=3, draft="D", tp=4, draft_tp=2), "must be 1 or"),
    ("vllm", None, dict(method="off", k=3), "has no effect"),
    ("vllm", None, dict(method="ngram", k=3, max_concurrency=4), "TensorRT-LLM settings"),
    ("vllm", None, dict(method="ngram", k=3, k_per_batch_size=[(2, 8, 3)]), "start at 1"),
    ("vllm", None, dict(method="ngram", k=3, k_per_batch_size=[(1, 8, 5)]), "between 0 and k=3"),
    ("vllm", None, dict(method="ngram", k=3, k_per_batch_size=[(1, 8, 3), (4, 9, 1)]), "overlaps"),
    ("vllm", "0.7.3", dict(method="eagle3", k=3, draft="H"), "supports: draft_model, eagle"),
    ("vllm", "0.11.0", dict(method="draft_model", k=3, draft="D"), "does not support method"),
    ("vllm", "0.10.0", dict(method="suffix"), "does not support method 'suffix'"),
    ("vllm", "0.7.3", dict(method="ngram", k=3), "--ngram-max"),
    ("trtllm", None, dict(method="suffix"), "supports: draft_model, eagle3, mtp, ngram, off"),
    ("trtllm", None, dict(method="eagle", k=3, draft="H"), "use method eagle3"),
    ("trtllm", None, dict(method="medusa", k=3, draft="H"), "does not support method 'medusa'"),
    ("trtllm", None, dict(method="ngram", k=3, k_per_batch_size=[(1, 8, 3)]), "vLLM setting"),
    ("trtllm", None, dict(method="ngram", k=3, max_concurrency=4, draft_len_schedule={1: 3}),
     "mutually exclusive"),
    ("trtllm", None, dict(method="ngram", k=3, draft_len_schedule={1: 2, 8: 1}), "must equal k=3"),
    ("trtllm", None, dict(method="ngram", k=3, draft_len_schedule={1: 3, 8: 4}), "more than k=3"),
    ("trtllm", None, dict(method="draft_model", k=3, draft="D", tp=2, draft_tp=1),
     "no separate draft TP"),
]


@pytest.mark.parametrize("backend,version,kw,phrase", BAD,
                         ids=[f"{b}-{kw['method']}-{i}" for i, (b, _, kw, _) in enumerate(BAD)])
def test_bad_specs_are_refused_with_the_fix(backend, version, kw, phrase):
    found = errors(check_spec(SpecConfig(target="M", **kw), backend, version))
    assert found, "expected a refusal"
    assert any(phrase in p.message for p in found), [p.message for p in found]
    for p in found:  # one sentence each, ending with the fix
        assert p.message.endswith("."), p.message
        assert "\n" not in p.message


def test_trtllm_eagle3_on_tensorrt_engine_names_pytorch():
    found = errors(check_spec(SpecConfig(target="M", method="eagle3", k=3, draft="H"),
                              "trtllm", engine="tensorrt"))
    assert "only on the PyTorch backend" in found[0].message


def test_suffix_on_vllm_warns_about_arctic_inference():
    found = check_spec(SpecConfig(target="M", method="suffix"), "vllm")
    assert [p.severity for p in found] == ["warning"]
    assert "arctic-inference" in found[0].message

"""vLLM renderers and the raw-JSON reader/validator (no vLLM import here)."""

from __future__ import annotations

import json

import pytest
import yaml

from specadapt.configs import vllm
from specadapt.configs.spec import SpecConfig
from specadapt.errors import UsageError

EAGLE3 = SpecConfig(target="M", method="eagle3", draft="H", k=3, tp=2, dtype="bfloat16",
                    max_model_len=4096)


def test_spec_dict_has_vllm_key_names():
    spec = SpecConfig(target="M", method="ngram", k=4, ngram_min=2, ngram_max=4)
    assert vllm.vllm_spec_dict(spec) == {"method": "ngram", "num_speculative_tokens": 4,
                                         "prompt_lookup_min": 2, "prompt_lookup_max": 4}


def test_off_renders_no_speculative_config():
    spec = SpecConfig(target="M", method="off")
    assert vllm.vllm_spec_dict(spec) is None
    assert vllm.F_SPEC not in vllm.render_vllm_argv(spec)


def test_module_argv_exact():
    assert vllm.render_vllm_argv(EAGLE3, python="py") == [
        "py", "-m", "vllm.entrypoints.openai.api_server", "--model", "M",
        "--host", "0.0.0.0", "--port", "8000", "--tensor-parallel-size", "2",
        "--dtype", "bfloat16", "--max-model-len", "4096", "--speculative-config",
        '{"method":"eagle3","model":"H","num_speculative_tokens":3}']


def test_vllm_serve_argv_puts_model_positional():
    argv = vllm.render_vllm_argv(EAGLE3, entry="serve")
    assert argv[:3] == ["vllm", "serve", "M"] and "--model" not in argv


def test_yaml_nests_the_speculative_config():
    doc = yaml.safe_load(vllm.render_vllm_yaml(EAGLE3))
    assert doc["speculative-config"] == {"method": "eagle3", "model": "H",
                                         "num_speculative_tokens": 3}
    assert doc["tensor-parallel-size"] == 2 and doc["model"] == "M"


def test_yaml_for_older_versions_uses_a_json_string():
    doc = yaml.safe_load(vllm.render_vllm_yaml(EAGLE3, "0.9.2"))
    assert json.loads(doc["speculative-config"])["method"] == "eagle3"


def test_legacy_flags_for_0_7():
    spec = SpecConfig(target="M", method="ngram", k=4, ngram_min=1, ngram_max=3)
    assert vllm.render_vllm_argv(spec, "0.7.3")[-8:] == [
        "--speculative-model", "[ngram]", "--num-speculative-tokens", "4",
        "--ngram-prompt-lookup-max", "3", "--ngram-prompt-lookup-min", "1"]


def test_json_form_refused_for_0_7():
    with pytest.raises(UsageError, match="no --speculative-config"):
        vllm.vllm_spec_dict(SpecConfig(target="M", method="ngram", k=4, ngram_max=3), "0.7.3")


def test_old_mtp_name():
    spec = SpecConfig(target="M", method="mtp", k=1)
    assert vllm.vllm_spec_dict(spec, "0.9.0")["method"] == "deepseek_mtp"
    assert vllm.vllm_spec_dict(spec)["method"] == "mtp"


def test_server_argv_for_the_adapter():
    argv = vllm.vllm_server_argv("py", "M", "127.0.0.1", 8001,
                                 {"method": "ngram", "num_speculative_tokens": 3},
                                 "float32", 2048, 0, ["--enforce-eager"])
    assert argv == ["py", "-m", "vllm.entrypoints.openai.api_server", "--model=M",
                    "--host=127.0.0.1", "--port=8001", "--dtype=float32",
                    "--max-model-len=2048", "--seed=0",
                    '--speculative-config={"method":"ngram","num_speculative_tokens":3}', "--enforce-eager"]
    assert "--speculative-config" not in vllm.vllm_server_argv("py", "M", "h", 1, None, None,
                                                               None, None, [])


def test_render_refuses_invalid_spec_with_one_line():
    with pytest.raises(UsageError) as info:
        vllm.render_vllm_argv(SpecConfig(target="M", method="eagle3", k=3))
    assert "\n" not in str(info.value) and "--draft" in str(info.value)


@pytest.mark.parametrize("raw,method,k,draft", [
    ({"model": "[ngram]", "num_speculative_tokens": 3, "prompt_lookup_max": 3}, "ngram", 3, None),
    ({"model": "D", "num_speculative_tokens": 5}, "draft_model", 5, "D"),
    ({"method": "deepseek_mtp", "num_speculative_tokens": 1}, "mtp", 1, None),
    ({"method": "eagle3", "model": "H", "num_speculative_tokens": 2}, "eagle3", 2, "H"),
])
def test_spec_from_vllm_json(raw, method, k, draft):
    spec = vllm.spec_from_vllm_json(raw)
    assert (spec.method, spec.k, spec.draft) == (method, k, draft)


def test_spec_from_vllm_json_round_trip():
    spec = SpecConfig(target="M", method="draft_model", k=3, draft="D", draft_tp=1,
                      k_per_batch_size=[(1, 4, 3), (5, 16, 1)])
    back = vllm.spec_from_vllm_json(vllm.vllm_spec_dict(spec), target="M")
    assert back == spec


def test_spec_from_vllm_json_refuses_what_it_cannot_carry():
    with pytest.raises(UsageError, match="quantization"):
        vllm.spec_from_vllm_json({"method": "eagle", "model": "H", "num_speculative_tokens": 2,
                                  "quantization": "fp8"})
    with pytest.raises(UsageError, match="does not model"):
        vllm.spec_from_vllm_json({"method": "mlp_speculator", "model": "H"})


BAD_JSON = [
    ({"method": "ngram"}, "num_speculative_tokens is missing"),
    ({"method": "ngram", "num_speculative_tokens": 0}, "must be an integer > 0"),
    ({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 4,
      "prompt_lookup_max": 2}, "make min <= max"),
    ({"method": "eagle3", "num_speculative_tokens": 3}, "needs 'model'"),
    ({"method": "eagle4", "num_speculative_tokens": 3}, "Unknown method"),
    ({"method": "eagle", "model": "H", "num_speculative_tokens": 3, "tensor_parallel_size": 2},
     "use draft_tensor_parallel_size"),
    ({"method": "ngram", "num_speculative_tokens": 3, "disable_by_batch_size": 8},
     "num_speculative_tokens_per_batch_size"),
    ({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_num": 3}, "Unknown key"),
    ({"method": "ngram", "num_speculative_tokens": 3,
      "num_speculative_tokens_per_batch_size": [[2, 4, 1]]}, "start at 1"),
]


@pytest.mark.parametrize("raw,phrase", BAD_JSON)
def test_validate_vllm_spec_json_rejects(raw, phrase):
    found = vllm.validate_vllm_spec_json(raw)
    assert any(phrase in m for m in found), found


def test_validate_vllm_spec_json_accepts_extra_known_keys():
    assert vllm.validate_vllm_spec_json({"method": "eagle", "model": "H",
                                         "num_speculative_tokens": 2, "quantization": "fp8",
                                         "enforce_eager": True}) == []


def test_validate_vllm_spec_json_knows_versions():
    raw = {"method": "suffix", "num_speculative_tokens": 8}
    assert vllm.validate_vllm_spec_json(raw) == []
    assert "does not support method 'suffix'" in vllm.validate_vllm_spec_json(raw, "0.10.0")[0]

"""configs.tuned.vllm_engine_check with a stand-in for vLLM's modules.

The real check (vLLM's own EngineArgs on the embedded model) runs in the slow tests of
tests/configs/test_tuned.py; these fast ones put a recording stand-in for the four vLLM names
it imports into sys.modules, to see what the check hands to vLLM (the spec's tensor-parallel
size, max_model_len and dtype, the model config built from those arguments) and how it words a
refusal: vLLM's own message on one line, or the exception's type where it has none.
"""

from __future__ import annotations

import sys
import types

import pytest

from specadapt.configs import tuned as T
from specadapt.configs.spec import SpecConfig
from specadapt.errors import UsageError

MODEL_CONFIG = object()


class Refusal(Exception):
    pass


@pytest.fixture
def fake_vllm(monkeypatch):
    """Install the stand-in; returns what it saw (``seen``) and lets a test make vLLM refuse."""
    seen: dict = {}
    behaviour: dict = {"raise": None, "k": None, "schedule": None}

    class SpeculativeConfig:
        def __init__(self, k, schedule):
            self.num_speculative_tokens = k
            self.num_speculative_tokens_per_batch_size = schedule

    class EngineArgs:
        def __init__(self, **kwargs):
            seen["engine_args"] = kwargs

        def create_model_config(self):
            return MODEL_CONFIG

        def create_speculative_config(self, model_config, parallel_config):
            seen["model_config"], seen["parallel_tp"] = model_config, parallel_config.tensor_parallel_size
            if behaviour["raise"] is not None:
                raise behaviour["raise"]
            sd = seen["engine_args"]["speculative_config"]
            return SpeculativeConfig(behaviour["k"] or sd["num_speculative_tokens"],
                                     sd.get("num_speculative_tokens_per_batch_size"))

    class ParallelConfig:
        def __init__(self, tensor_parallel_size):
            self.tensor_parallel_size = tensor_parallel_size

    def validate(schedule):
        seen["validated"] = schedule
        return schedule

    modules = {"vllm": types.ModuleType("vllm"), "vllm.config": types.ModuleType("vllm.config"),
               "vllm.engine": types.ModuleType("vllm.engine"),
               "vllm.engine.arg_utils": types.ModuleType("vllm.engine.arg_utils"),
               "vllm.v1": types.ModuleType("vllm.v1"), "vllm.v1.spec_decode": types.ModuleType("vllm.v1.spec_decode"),
               "vllm.v1.spec_decode.dynamic": types.ModuleType("vllm.v1.spec_decode.dynamic"),
               "vllm.v1.spec_decode.dynamic.utils": types.ModuleType("vllm.v1.spec_decode.dynamic.utils")}
    modules["vllm"].__version__ = "9.9.9"
    modules["vllm.config"].ParallelConfig = ParallelConfig
    modules["vllm.engine.arg_utils"].EngineArgs = EngineArgs
    modules["vllm.v1.spec_decode.dynamic.utils"].validate_and_normalize_dynamic_sd_schedule = validate
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    return seen, behaviour


SPEC = SpecConfig(method="ngram", k=3, ngram_max=3, target="/models/t", tp=2, max_model_len=4096, dtype="float32")


def test_the_spec_s_parallelism_length_and_dtype_reach_vllm(fake_vllm):
    seen, _ = fake_vllm
    assert T.vllm_engine_check(SPEC) == "vLLM 9.9.9 create_speculative_config"
    args = seen["engine_args"]
    assert (args["model"], args["tensor_parallel_size"], args["max_model_len"], args["dtype"]) == (
        "/models/t", 2, 4096, "float32")
    assert args["speculative_config"]["num_speculative_tokens"] == 3
    assert seen["model_config"] is MODEL_CONFIG and seen["parallel_tp"] == 2
    assert "validated" not in seen  # no schedule, nothing to validate


def test_without_a_dtype_vllm_chooses(fake_vllm):
    seen, _ = fake_vllm
    T.vllm_engine_check(SPEC.model_copy(update={"dtype": None}))
    assert seen["engine_args"]["dtype"] == "auto"


def test_a_schedule_is_validated_by_vllm_too(fake_vllm):
    seen, _ = fake_vllm
    spec = SPEC.model_copy(update={"k": 4, "k_per_batch_size": [(1, 4, 4), (5, 16, 2)]})
    assert T.vllm_engine_check(spec) == ("vLLM 9.9.9 create_speculative_config and "
                                         "validate_and_normalize_dynamic_sd_schedule")
    assert [tuple(e) for e in seen["validated"]] == [(1, 4, 4), (5, 16, 2)]


def test_vllm_s_refusal_is_its_message_on_one_line(fake_vllm):
    _, behaviour = fake_vllm
    behaviour["raise"] = Refusal("bad value\n  for   num_speculative_tokens")
    with pytest.raises(UsageError) as err:
        T.vllm_engine_check(SPEC)
    assert str(err.value).endswith(": bad value for num_speculative_tokens")
    assert str(err.value).startswith('vLLM 9.9.9 refuses the speculative config {"method":"ngram",')


def test_a_refusal_without_a_message_is_named_by_its_type(fake_vllm):
    _, behaviour = fake_vllm
    behaviour["raise"] = Refusal()
    with pytest.raises(UsageError) as err:
        T.vllm_engine_check(SPEC)
    assert str(err.value).endswith("}: Refusal")


def test_a_config_vllm_reads_otherwise_is_refused(fake_vllm):
    _, behaviour = fake_vllm
    behaviour["k"] = 5
    with pytest.raises(UsageError, match="reads the speculative config .* as num_speculative_tokens=5, schedule None: "
                                         "the config was not written"):
        T.vllm_engine_check(SPEC)

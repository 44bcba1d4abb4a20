import json
import sys

from specadapt.adapters.vllm import VLLMLaunch, launch_plan
from specadapt.configs.spec import SpecConfig


def test_spec_off_plan_has_no_speculative_config():
    plan = launch_plan(VLLMLaunch(model="/m", port=8000))
    assert plan.argv[:3] == [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
    assert "--model=/m" in plan.argv and "--port=8000" in plan.argv
    assert not any(a.startswith("--speculative-config") for a in plan.argv)
    assert not plan.spec_enabled and "LD_PRELOAD" not in plan.env


def test_spec_on_plan_renders_the_spec_as_vllm_json():
    spec = SpecConfig(method="ngram", k=4, ngram_min=2, ngram_max=4, native_extras={"vllm": {"enforce_eager": True}})
    plan = launch_plan(VLLMLaunch(model="/m", port=8000, spec_config=spec, dtype="bfloat16",
                                  extra_args=["--enforce-eager"]))
    flag = [a for a in plan.argv if a.startswith("--speculative-config=")]
    assert len(flag) == 1 and json.loads(flag[0].split("=", 1)[1]) == {
        "method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4,
        "enforce_eager": True}
    assert "--dtype=bfloat16" in plan.argv
    assert plan.argv[-1] == "--enforce-eager"  # extra args come last, verbatim
    assert plan.spec_enabled


def test_free_port_is_chosen_when_none_given():
    plan = launch_plan(VLLMLaunch(model="/m"))
    assert 0 < plan.port < 65536 and plan.base_url == f"http://127.0.0.1:{plan.port}"


def test_hostile_model_path_stays_one_value():
    plan = launch_plan(VLLMLaunch(model="--trust-remote-code", port=8000))
    assert "--model=--trust-remote-code" in plan.argv
    assert "--trust-remote-code" not in plan.argv


def test_interpreter_is_configurable():
    plan = launch_plan(VLLMLaunch(model="/m", port=8000, python="/opt/gpu-venv/bin/python"))
    assert plan.argv[0] == "/opt/gpu-venv/bin/python"


def test_a_spec_vllm_refuses_is_one_line_naming_the_problem():
    import pytest

    from specadapt.adapters.vllm import VLLMBackend
    from specadapt.errors import UsageError

    opts = VLLMLaunch(model="/m", spec_config=SpecConfig(method="ngram", k=4, max_concurrency=4))
    with pytest.raises(UsageError, match="^--spec-config: max_concurrency and draft_len_schedule are TensorRT-LLM "
                                         "settings"):
        with VLLMBackend().launched(opts):
            pass

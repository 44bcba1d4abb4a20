"""Lossy-by-design speculative settings (analysis/lossy.py): each one from each input form, the lossless
configs that must find nothing, odd input, and the line that says why a server died."""

from __future__ import annotations

import json

import pytest

from specadapt.analysis.lossy import describe_death, lossy_reasons, lossy_reasons_of, switch_off_reasons
from specadapt.records import ServerInfo
from specadapt.records.server import LaunchRecord

SYNTHETIC = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3,
             "rejection_sample_method": "synthetic", "synthetic_acceptance_rates": [0.9, 0.6, 0.3]}


def only(reasons: list[str]) -> str:
    assert len(reasons) == 1, reasons
    return reasons[0]


# --- vLLM -------------------------------------------------------------------------------------------

def test_vllm_synthetic_from_the_spec_dict_names_setting_value_rates_and_why():
    reason = only(lossy_reasons("vllm", SYNTHETIC))
    assert reason.startswith("rejection_sample_method 'synthetic' (synthetic_acceptance_rates [0.9, 0.6, 0.3]): ")
    assert "forced per-position probability" in reason
    assert reason.endswith("so the output is not the target's")


def test_vllm_synthetic_from_argv_json_and_equals_form():
    spec = {"method": "ngram", "num_speculative_tokens": 2, "rejection_sample_method": "synthetic",
            "synthetic_acceptance_length": 2.5}
    for argv in (["vllm", "serve", "m", "--speculative-config", json.dumps(spec), "--port", "8000"],
                 ["vllm", "serve", "m", f"--speculative-config={json.dumps(spec)}"],
                 f"vllm serve m --speculative-config '{json.dumps(spec)}'"):
        reason = only(lossy_reasons("vllm", None, argv))
        assert reason.startswith("rejection_sample_method 'synthetic' (synthetic_acceptance_length 2.5): "), argv


def test_vllm_synthetic_from_server_flags_nested_and_as_json_string():
    assert only(lossy_reasons("vllm", None, (), {"vllm_config": {"speculative_config": SYNTHETIC}}))
    assert only(lossy_reasons("vllm", None, (), {"speculative_config": json.dumps(SYNTHETIC)}))
    odd_case = {**SYNTHETIC, "rejection_sample_method": "Synthetic "}
    assert only(lossy_reasons("reference", {"speculative_config": odd_case}))


def test_vllm_fly_and_typical_acceptance_in_all_their_spellings():
    fly = only(lossy_reasons("vllm", {"rejection_sample_method": "fly", "fly_window_size": 4}))
    assert fly.startswith("rejection_sample_method 'fly' (fly_window_size 4): FLy verification")
    ascend = only(lossy_reasons("vllm", None, ["--additional-config", '{"rejection_sampler_config": '
                                                                     '{"enable_fly_verify": true}}']))
    assert ascend.startswith("enable_fly_verify true: ")
    typical = only(lossy_reasons("vllm", {"acceptance_method": "typical_acceptance_sampler",
                                          "posterior_threshold": 0.09, "posterior_alpha": 0.3}))
    assert typical.startswith("acceptance_method 'typical_acceptance_sampler' (posterior_threshold 0.09, "
                              "posterior_alpha 0.3): ")
    old = only(lossy_reasons("vllm", None, "vllm serve m --spec-decoding-acceptance-method typical_acceptance_sampler"))
    assert old.startswith("spec_decoding_acceptance_method 'typical_acceptance_sampler': ")


@pytest.mark.parametrize("spec", [
    {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4},
    {"method": "eagle3", "model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", "num_speculative_tokens": 3},
    {"method": "draft_model", "model": "m-small", "num_speculative_tokens": 4, "draft_sample_method": "probabilistic"},
    {"method": "ngram", "num_speculative_tokens": 4, "rejection_sample_method": "standard"},
    {"method": "ngram", "num_speculative_tokens": 4, "rejection_sample_method": "block"},
    {"method": "dspark", "num_speculative_tokens": 7, "enable_adaptive_verification": True},
    {"acceptance_method": "rejection_sampler"},
    {"rejection_sampler_config": {"enable_fly_verify": False}},
])
def test_lossless_vllm_configs_find_nothing(spec):
    assert lossy_reasons("vllm", spec) == []
    assert lossy_reasons("vllm", None, ["vllm", "serve", "m", "--speculative-config", json.dumps(spec)]) == []


# --- SGLang -----------------------------------------------------------------------------------------

def test_sglang_thresholds_below_one_from_argv_both_forms():
    reasons = lossy_reasons("sglang", None, ["python", "-m", "sglang.launch_server", "--model-path", "m",
                                             "--speculative-algorithm", "EAGLE3",
                                             "--speculative-accept-threshold-single", "0.8",
                                             "--speculative-accept-threshold-acc=0.5"])
    assert len(reasons) == 2
    assert reasons[0].startswith("speculative_accept_threshold_single 0.8: SGLang accepts a draft token once its "
                                 "target probability exceeds 0.8")
    assert reasons[1].startswith("speculative_accept_threshold_acc 0.5: SGLang raises a draft token's acceptance "
                                 "probability from p to min(1, p / 0.5)")
    assert all("greedy verification ignores it" in r for r in reasons)


def test_sglang_thresholds_from_the_options_dict_flag_spelling_and_server_info():
    assert only(lossy_reasons("sglang", {"speculative_accept_threshold_single": 0.7}))
    assert only(lossy_reasons("sglang", {"--speculative-accept-threshold-acc": "0.9"}))
    assert only(lossy_reasons("sglang", None, (), {"speculative_accept_threshold_single": 1.0,
                                                   "speculative_accept_threshold_acc": 0.25}))
    assert "0.25" in only(lossy_reasons("sglang", None, (), {"internal_states": [{"speculative_accept_threshold_acc":
                                                                                    0.25}]}))


def test_sglang_simulated_acceptance_from_the_environment():
    reason = only(lossy_reasons("sglang", None, env={"SGLANG_SIMULATE_ACC_LEN": "3.2"}))
    assert reason.startswith("SGLANG_SIMULATE_ACC_LEN 3.2: SGLang simulates the accepted length")
    assert lossy_reasons("sglang", None, env={"SGLANG_SIMULATE_ACC_LEN": "-1"}) == []


@pytest.mark.parametrize("argv", [
    ["--speculative-accept-threshold-single", "1.0", "--speculative-accept-threshold-acc", "1"],
    ["--speculative-accept-threshold-single=1.5"],
    ["--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", "4"],
    ["--speculative-accept-threshold-single", "high"],
    ["--speculative-accept-threshold-single"],  # no value: true, not a number
])
def test_sglang_thresholds_at_or_above_one_or_unreadable_find_nothing(argv):
    assert lossy_reasons("sglang", None, argv) == []


# --- TensorRT-LLM -----------------------------------------------------------------------------------

MTP_RELAXED = {"decoding_type": "MTP", "max_draft_len": 3, "use_relaxed_acceptance_for_thinking": True,
               "relaxed_topk": 10, "relaxed_delta": 0.6}


def test_trtllm_relaxed_mtp_from_the_yaml_section_names_topk_and_delta():
    reason = only(lossy_reasons("trtllm", {"speculative_config": MTP_RELAXED}))
    assert reason.startswith("use_relaxed_acceptance_for_thinking true (relaxed_topk 10, relaxed_delta 0.6): "
                             "TensorRT-LLM's MTP accepts, in the thinking phase,")
    assert only(lossy_reasons("trtllm", {**MTP_RELAXED, "use_relaxed_acceptance_for_thinking": "true"}))


def test_trtllm_relaxed_mtp_from_argv_set_and_from_flags():
    argv = ["trtllm-serve", "m", "--config", "c.yaml", "--set",
            "speculative_config.use_relaxed_acceptance_for_thinking=true"]
    assert only(lossy_reasons("trtllm", None, argv)).startswith("use_relaxed_acceptance_for_thinking true: ")
    assert only(lossy_reasons("tensorrt-llm", None, (), {"speculative_config": json.dumps(MTP_RELAXED)}))


def test_trtllm_eagle_typical_acceptance():
    reason = only(lossy_reasons("trtllm", {"decoding_type": "Eagle", "max_draft_len": 3, "speculative_model": "e",
                                           "greedy_sampling": "False", "posterior_threshold": 0.09}))
    assert reason.startswith("greedy_sampling false (posterior_threshold 0.09): TensorRT-LLM's Eagle then uses "
                             "typical acceptance")


@pytest.mark.parametrize("spec", [
    {**MTP_RELAXED, "use_relaxed_acceptance_for_thinking": False},
    {**MTP_RELAXED, "use_relaxed_acceptance_for_thinking": "false"},
    {"decoding_type": "NGram", "max_draft_len": 4, "max_matching_ngram_size": 2},
    {"decoding_type": "Eagle3", "max_draft_len": 3, "speculative_model": "e", "greedy_sampling": True},
    {"decoding_type": "Eagle3", "max_draft_len": 3, "speculative_model": "e", "acceptance_rate_threshold": 0.5,
     "acceptance_rate_window_size": 16},
    {"decoding_type": "Draft_Target", "max_draft_len": 4, "speculative_model": "d", "acceptance_length_threshold": 1.2},
])
def test_lossless_trtllm_configs_find_nothing(spec):
    assert lossy_reasons("trtllm", {"speculative_config": spec}) == []


def test_acceptance_rate_threshold_is_a_switch_off_not_a_loss():
    spec = {"decoding_type": "Eagle3", "acceptance_rate_threshold": "0.3", "acceptance_rate_window_size": 8}
    assert lossy_reasons("trtllm", spec) == []
    assert only(switch_off_reasons("trtllm", spec)).startswith(
        "acceptance_rate_threshold 0.3 (acceptance_rate_window_size 8): TensorRT-LLM turns speculation off")
    assert only(switch_off_reasons("trtllm", {"acceptance_length_threshold": 1.5}))
    assert switch_off_reasons("trtllm", {**spec, "acceptance_rate_window_size": 0}) == []
    assert switch_off_reasons("trtllm", {"acceptance_rate_threshold": 0}) == []
    assert switch_off_reasons("vllm", spec) == []


# --- backends, odd input ----------------------------------------------------------------------------

def test_a_setting_counts_only_for_its_backend_unless_the_backend_is_unknown():
    sglang = {"speculative_accept_threshold_single": 0.5}
    assert lossy_reasons("vllm", sglang) == []
    assert lossy_reasons("trtllm", SYNTHETIC) == []
    assert lossy_reasons("llamacpp", {**SYNTHETIC, **sglang, **MTP_RELAXED}) == []
    assert len(lossy_reasons("some-new-server", {**SYNTHETIC, **sglang, **MTP_RELAXED})) == 3


def test_several_json_strings_are_each_read():
    flags = {f"part{i}": json.dumps({"x": i}) for i in range(50)}
    flags["spec"] = json.dumps({"rejection_sample_method": "fly"})
    flags["other"] = json.dumps(SYNTHETIC)
    assert len(lossy_reasons("vllm", None, (), flags)) == 2


def test_unset_greedy_sampling_keeps_the_greedy_default():
    for value in (None, "none", "", "null", True, "1"):
        assert lossy_reasons("trtllm", {"decoding_type": "Eagle", "greedy_sampling": value}) == [], value
    assert only(lossy_reasons("trtllm", {"decoding_type": "Eagle", "greedy_sampling": 0}))


def test_one_setting_seen_in_several_places_is_one_sentence():
    argv = ["--speculative-config", json.dumps(SYNTHETIC)]
    assert len(lossy_reasons("vllm", SYNTHETIC, argv, {"speculative_config": SYNTHETIC})) == 1


@pytest.mark.parametrize("spec, argv, flags", [
    (None, (), None),
    ({}, [], {}),
    ("not a mapping", "--x", 42),
    ({"rejection_sample_method": None}, [None, 3, b"--x"], {"speculative_config": "{not json"}),
    ({"rejection_sample_method": ["synthetic"]}, ["--speculative-config", "{"], {"speculative_config": [1, {"a": {}}]}),
    ({"speculative_accept_threshold_single": float("nan")}, ["--speculative-accept-threshold-single", "nan"], None),
    ({"use_relaxed_acceptance_for_thinking": "maybe", "greedy_sampling": None}, object(), object()),
    (12, 3.5, "flags"),
])
def test_odd_input_finds_nothing_and_never_raises(spec, argv, flags):
    for backend in ("vllm", "sglang", "trtllm", "", None):
        assert lossy_reasons(backend, spec, argv, flags, env="x") == []
        assert switch_off_reasons(backend, spec, argv, flags) == []


def test_a_cycle_or_deep_nesting_does_not_raise():
    cyclic: dict = {"rejection_sample_method": "synthetic"}
    cyclic["self"] = cyclic
    assert only(lossy_reasons("vllm", cyclic))
    deep: dict = {"rejection_sample_method": "standard"}
    for _ in range(500):
        deep = {"x": deep}
    assert lossy_reasons("vllm", deep) == []


def test_lossy_reasons_of_a_server_reads_its_launch_and_flags():
    launch = LaunchRecord(backend="sglang", argv=["python", "-m", "sglang.launch_server",
                                                  "--speculative-accept-threshold-acc", "0.5"],
                          env={"SGLANG_SIMULATE_ACC_LEN": "2"})
    info = ServerInfo(backend="sglang", base_url="http://x", launch=launch)
    assert len(lossy_reasons_of(info)) == 2
    flags_only = ServerInfo(backend="trtllm", base_url="http://x", server_flags={"speculative_config": MTP_RELAXED})
    assert only(lossy_reasons_of(flags_only))
    assert lossy_reasons_of(ServerInfo(backend="vllm", base_url="http://x")) == []


# --- why a server died ------------------------------------------------------------------------------

# Constructed, modelled on vLLM 0.32.0's CPU build dying on the first request of a synthetic config: the
# engine core logs the fatal error with its traceback (NewLineFormatter repeats the record head on each
# line), the assertion in vllm/utils/cpu_triton_utils.py is the root cause, and the API server then
# reports EngineDeadError, which only points back at it.
H = "(EngineCore pid=4242) ERROR 12-03 10:15:02 [core.py:1512] "
A = "(APIServer pid=4200) ERROR 12-03 10:15:02 [async_llm.py:702] "
VLLM_SYNTHETIC_DEATH = "\r\n".join([
    "(APIServer pid=4200) INFO 12-03 10:15:01 [loggers.py:257] Engine 000: Avg prompt throughput: 3.1 tokens/s",
    f"{H}EngineCore encountered a fatal error.",
    f"{H}Traceback (most recent call last):",
    f'{H}  File "/venv/lib/python3.11/site-packages/vllm/v1/engine/core.py", line 1495, in run_engine_core',
    f"{H}    engine_core.run_busy_loop()",
    f'{H}  File "/venv/lib/python3.11/site-packages/vllm/v1/sample/rejection_sampler.py", line 470, in '
    "rejection_sample",
    f"{H}    rejection_greedy_sample_kernel(",
    f'{H}  File "/venv/lib/python3.11/site-packages/vllm/utils/cpu_triton_utils.py", line 330, in '
    "rejection_greedy_sample_kernel",
    f'{H}    assert not SYNTHETIC_MODE, "Synthetic acceptance not supported with CPU sampling"',
    f"{H}           ^^^^^^^^^^^^^^^^^^",
    f"{H}AssertionError: Synthetic acceptance not supported with CPU sampling",
    f"{A}AsyncLLM output_handler failed.",
    f"{A}Traceback (most recent call last):",
    f'{A}  File "/venv/lib/python3.11/site-packages/vllm/v1/engine/async_llm.py", line 690, in output_handler',
    f"{A}    outputs = await engine_core.get_output_async()",
    f"{A}vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above) for "
    "the root cause.",
    "(APIServer pid=4200) INFO:     Shutting down",
    "(APIServer pid=4200) INFO:     Finished server process [4200]",
])


def test_describe_death_picks_the_root_cause_not_the_engine_dead_wrapper():
    expected = "AssertionError: Synthetic acceptance not supported with CPU sampling"
    assert describe_death(VLLM_SYNTHETIC_DEATH) == expected


def test_describe_death_at_start_up_skips_the_initialization_failed_wrapper():
    # Constructed: an engine that fails to start, then the front end's RuntimeError pointing at it.
    tail = "\n".join([
        "(EngineCore_DP0 pid=77) ERROR 12-03 09:00:00 [core.py:1510] EngineCore failed to start.",
        "(EngineCore_DP0 pid=77) ERROR 12-03 09:00:00 [core.py:1510] Traceback (most recent call last):",
        "(EngineCore_DP0 pid=77) ERROR 12-03 09:00:00 [core.py:1510] NotImplementedError: Synthetic acceptance "
        "is not supported on this platform",
        "Traceback (most recent call last):",
        '  File "/venv/bin/vllm", line 10, in <module>',
        "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): "
        "{'EngineCore_DP0': 1}",
    ])
    assert describe_death(tail) == "NotImplementedError: Synthetic acceptance is not supported on this platform"


def test_describe_death_joins_a_validation_errors_detail_and_trims_to_200():
    tail = "\n".join([
        "Traceback (most recent call last):",
        '  File "/venv/bin/vllm", line 10, in <module>',
        "pydantic_core._pydantic_core.ValidationError: 1 validation error for SpeculativeConfig",
        "  Value error, rejection_sample_method='synthetic' requires exactly one of synthetic_acceptance_rates "
        "or synthetic_acceptance_length. [type=value_error, input_value=ArgsKwargs((), {'method': 'ngram'}), "
        "input_type=ArgsKwargs]",
        "    For further information visit https://errors.pydantic.dev/2.11/v/value_error",
    ])
    line = describe_death(tail)
    assert line is not None and len(line) == 200 and line.endswith("…")
    assert line.startswith("pydantic_core._pydantic_core.ValidationError: 1 validation error for SpeculativeConfig "
                           "Value error, rejection_sample_method='synthetic' requires exactly one of")


def test_describe_death_other_shapes():
    assert describe_death("usage: launch_server.py [-h]\nlaunch_server.py: error: unrecognized arguments: --x") == (
        "launch_server.py: error: unrecognized arguments: --x")
    assert describe_death("terminate called after throwing an instance of 'std::runtime_error'\n"
                          "  what():  CUDA error: out of memory\nAborted (core dumped)") == (
        "std::runtime_error: CUDA error: out of memory")
    assert describe_death("[rank0]: Traceback (most recent call last):\n"
                          "[rank0]: torch.OutOfMemoryError: CUDA out of memory.\n") == (
        "torch.OutOfMemoryError: CUDA out of memory.")
    assert describe_death("\x1b[1;31mValueError: bad k\x1b[0m") == "ValueError: bad k"
    assert describe_death("KeyboardInterrupt\n") == "KeyboardInterrupt"  # only a wrapper: still the line
    assert describe_death("RuntimeError: first\nValueError: second\nINFO: bye") == "ValueError: second"
    assert describe_death("x" * 300 + "Error: " + "y" * 300) == "x" * 199 + "…"


@pytest.mark.parametrize("tail", ["", "INFO 12-03 10:00:00 [api_server.py:1] Started server process",
                                  "Traceback (most recent call last):\n    raise ValueError(x)", None, 42,
                                  "the Error: is not at the start\nError: too generic"])
def test_describe_death_finds_nothing_without_an_exception_line(tail):
    assert describe_death(tail) is None

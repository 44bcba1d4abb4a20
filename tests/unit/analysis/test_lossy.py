"""Lossy-by-design speculative settings (analysis/lossy.py): each one from each input form, the lossless
configs that must find nothing, odd input, and the line that says why a server died."""

from __future__ import annotations

import json

import pytest

from specadapt.analysis.lossy import describe_death, lossy_reasons, lossy_reasons_of
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
                 ["vllm", "serve", "m", f"--speculative-config={json.dumps({**spec, 'model': 'org/m?rev=a=b'})}"]):
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
    old = only(lossy_reasons("vllm", None, ["vllm", "serve", "m", "--spec-decoding-acceptance-method",
                                            "typical_acceptance_sampler"]))
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
    assert only(lossy_reasons("trtllm", None, (), {"speculative_config": json.dumps(MTP_RELAXED)}))


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
                                  "Traceback (most recent call last):\n    raise ValueError(x)",
                                  "the Error: is not at the start\nError: too generic"])
def test_describe_death_finds_nothing_without_an_exception_line(tail):
    assert describe_death(tail) is None


# --- each sentence word for word, each input form, each boundary -------------------------------------

NOT_TARGET = "so the output is not the target's"
SYNTHETIC_WHY = ("vLLM accepts each draft token with a forced per-position probability instead of checking it "
                 f"against the target, {NOT_TARGET}")
FLY_WHY = ("FLy verification keeps a draft token the target rejected at an uncertain position when the next ones "
           f"match (lossy by design, as its vLLM PR says), {NOT_TARGET}")
FLY_VERIFY_WHY = f"FLy verification keeps a draft token the target rejected at an uncertain position, {NOT_TARGET}"
TYPICAL_WHY = ("vLLM accepts a draft token whose target probability clears a threshold instead of sampling the "
               f"target, {NOT_TARGET}")
SAMPLED = ("so sampled (temperature > 0) outputs do not follow the target's distribution (greedy verification "
           "ignores it)")
RELAXED_WHY = ("TensorRT-LLM's MTP accepts, in the thinking phase, a draft token that is any of the target's top-k "
               f"candidates within relaxed_delta of the top-1 instead of the top-1 only, {NOT_TARGET}")
EAGLE_WHY = ("TensorRT-LLM's Eagle then uses typical acceptance, accepting a draft token whose target probability "
             f"clears a threshold instead of the target's own choice, {NOT_TARGET}")


def test_every_vllm_sentence_word_for_word_with_every_companion():
    assert lossy_reasons("vllm", SYNTHETIC) == [
        f"rejection_sample_method 'synthetic' (synthetic_acceptance_rates [0.9, 0.6, 0.3]): {SYNTHETIC_WHY}"]
    fly = {"rejection_sample_method": "fly", "fly_entropy_threshold": 0.4, "fly_window_size": 4}
    assert lossy_reasons("vllm", fly) == [
        f"rejection_sample_method 'fly' (fly_entropy_threshold 0.4, fly_window_size 4): {FLY_WHY}"]
    ascend = {"rejection_sampler_config": {"enable_fly_verify": "True", "fly_entropy_threshold": 0.5,
                                           "fly_window_size": 2}}
    assert lossy_reasons("vllm", ascend) == [
        f"enable_fly_verify true (fly_entropy_threshold 0.5, fly_window_size 2): {FLY_VERIFY_WHY}"]
    old = ["vllm", "serve", "m", "--spec-decoding-acceptance-method", "typical_acceptance_sampler",
           "--typical-acceptance-sampler-posterior-threshold", "0.2", "--typical-acceptance-sampler-posterior-alpha",
           "0.1"]
    assert lossy_reasons("vllm", None, old) == [
        "spec_decoding_acceptance_method 'typical_acceptance_sampler' (typical_acceptance_sampler_posterior_threshold "
        f"0.2, typical_acceptance_sampler_posterior_alpha 0.1): {TYPICAL_WHY}"]
    assert lossy_reasons("vllm", {"acceptance_method": " Typical_Acceptance_Sampler"}) == [
        f"acceptance_method 'typical_acceptance_sampler': {TYPICAL_WHY}"]


def test_a_companion_that_is_unset_is_left_out_and_one_seen_twice_is_shown_once():
    # vLLM's own config dump carries both synthetic settings, the unused one as None
    dump = {**SYNTHETIC, "synthetic_acceptance_rates": None, "synthetic_acceptance_length": 2.5}
    expected = [f"rejection_sample_method 'synthetic' (synthetic_acceptance_length 2.5): {SYNTHETIC_WHY}"]
    assert lossy_reasons("vllm", None, (), {"speculative_config": dump}) == expected
    argv = ["--speculative-config", json.dumps(dump)]
    assert lossy_reasons("vllm", dump, argv, {"speculative_config": dump}) == expected
    assert lossy_reasons("vllm", {"rejection_sample_method": "synthetic"}) == [
        f"rejection_sample_method 'synthetic': {SYNTHETIC_WHY}"]


def test_both_rejection_methods_seen_are_both_reported():
    reasons = lossy_reasons("vllm", {"rejection_sample_method": "fly"}, (), {"rejection_sample_method": "synthetic"})
    assert reasons == [f"rejection_sample_method 'fly': {FLY_WHY}", f"rejection_sample_method 'synthetic': "
                                                                   f"{SYNTHETIC_WHY}"]


def test_a_key_is_matched_whole_after_its_leading_dashes():
    assert only(lossy_reasons("vllm", {"--Rejection-Sample-Method": "synthetic"}))
    assert lossy_reasons("vllm", {"X-Rejection-Sample-Method": "synthetic"}) == []
    assert lossy_reasons("vllm", {"rejection_sample_method_x": "synthetic"}) == []


def nest(inner, depth, wrap):
    for _ in range(depth):
        inner = wrap(inner)
    return inner


@pytest.mark.parametrize("wrap", [lambda x: {"x": x}, lambda x: [x], lambda x: json.dumps({"x": x}),
                                  lambda x: [json.dumps(x)]])
def test_settings_are_read_twelve_containers_deep_and_no_deeper(wrap):
    setting = {"rejection_sample_method": "synthetic"}
    assert only(lossy_reasons("vllm", nest(setting, 12, wrap)))
    assert lossy_reasons("vllm", nest(setting, 13, wrap)) == []
    assert only(lossy_reasons("vllm", None, (), nest(setting, 12, wrap)))
    for depth, found in ((11, 1), (12, 0)):  # the flag's value is the first container
        argv = ["--speculative-config", json.dumps({"x": nest(setting, depth, wrap)})]
        assert len(lossy_reasons("vllm", None, argv)) == found


def test_argv_values_flags_and_positionals():
    single = "speculative_accept_threshold_single"
    negative = lossy_reasons("sglang", None, ["--speculative-accept-threshold-single", "-0.5", "--port", "1"])
    assert negative == [f"{single} -0.5: SGLang accepts a draft token once its target probability exceeds -0.5, "
                        f"{SAMPLED}"]
    assert lossy_reasons("sglang", None, ["launch", single, "0.5", "-speculative-accept-threshold-single", "0.5",
                                          "--speculative-accept-threshold-single"]) == []
    assert lossy_reasons("sglang", None, ["--speculative-accept-threshold-single", "--port", "0.5"]) == []


def test_trtllm_set_takes_the_last_part_of_the_path_and_everything_after_the_first_equals():
    argv = ["trtllm-serve", "m", "--set", "speculative_config.use_relaxed_acceptance_for_thinking=true", "--set",
            "speculative_config.relaxed_delta=a=b", "--set=relaxed_topk=5"]
    assert lossy_reasons("trtllm", None, argv) == [
        f"use_relaxed_acceptance_for_thinking true (relaxed_topk 5, relaxed_delta a=b): {RELAXED_WHY}"]
    assert lossy_reasons("trtllm", None, ["--set", "greedy_sampling=off"]) == [f"greedy_sampling false: {EAGLE_WHY}"]
    assert lossy_reasons("trtllm", None, ["--set", "speculative_config.greedy_sampling"]) == []


def test_every_sglang_sentence_word_for_word_and_the_boundaries():
    argv = ["--speculative-accept-threshold-single", "high", "--speculative-accept-threshold-acc", "0.5"]
    assert lossy_reasons("sglang", None, argv) == [
        "speculative_accept_threshold_acc 0.5: SGLang raises a draft token's acceptance probability from p to "
        f"min(1, p / 0.5), {SAMPLED}"]
    assert lossy_reasons("sglang", {"speculative_accept_threshold_single": 0.99}) == [
        "speculative_accept_threshold_single 0.99: SGLang accepts a draft token once its target probability exceeds "
        f"0.99, {SAMPLED}"]
    assert lossy_reasons("sglang", {"speculative_accept_threshold_acc": 1}) == []
    assert lossy_reasons("sglang", None, env={"SGLANG_SIMULATE_ACC_LEN": "1"}) == [
        "SGLANG_SIMULATE_ACC_LEN 1: SGLang simulates the accepted length instead of verifying the draft, "
        f"{NOT_TARGET}"]
    for value in ("0", "-1", "", "x"):
        assert lossy_reasons("sglang", None, env={"SGLANG_SIMULATE_ACC_LEN": value, "OTHER": "3"}) == [], value
    assert lossy_reasons("sglang", None, env={"sglang_simulate_acc_len": "3"}) == []


def test_every_trtllm_sentence_word_for_word():
    assert lossy_reasons("trtllm", {"speculative_config": MTP_RELAXED}) == [
        f"use_relaxed_acceptance_for_thinking true (relaxed_topk 10, relaxed_delta 0.6): {RELAXED_WHY}"]
    eagle = {"decoding_type": "Eagle", "greedy_sampling": " no ", "posterior_threshold": 0.09}
    assert lossy_reasons("trtllm", eagle) == [f"greedy_sampling false (posterior_threshold 0.09): {EAGLE_WHY}"]
    for value in ("yes", 1, "ON", None, "maybe"):
        assert lossy_reasons("trtllm", {"greedy_sampling": value}) == [], value
    for value in ("no", 0, "Off", None, "maybe"):
        assert lossy_reasons("trtllm", {"use_relaxed_acceptance_for_thinking": value}) == [], value


def test_each_known_backend_runs_only_its_own_checks():
    everything = {**SYNTHETIC, "speculative_accept_threshold_single": 0.5, **MTP_RELAXED}
    first_words = {name: [r.split(" ", 1)[0] for r in lossy_reasons(name, everything)]
                   for name in ("vllm", "reference", "sglang", "trtllm", "llamacpp", "a-plugin")}
    assert first_words == {"vllm": ["rejection_sample_method"], "reference": ["rejection_sample_method"],
                           "sglang": ["speculative_accept_threshold_single"],
                           "trtllm": ["use_relaxed_acceptance_for_thinking"], "llamacpp": [],
                           "a-plugin": ["rejection_sample_method", "speculative_accept_threshold_single",
                                        "use_relaxed_acceptance_for_thinking"]}


def test_lossy_reasons_of_reads_each_part_under_the_servers_own_backend():
    launch = LaunchRecord(backend="sglang", argv=["--speculative-accept-threshold-acc", "0.5"],
                          spec_settings={"speculative_accept_threshold_single": 0.7},
                          inherited_env={"SGLANG_SIMULATE_ACC_LEN": "2"})
    info = ServerInfo(backend="sglang", base_url="http://x", launch=launch,
                      server_flags={"speculative_accept_threshold_single": 0.6, **SYNTHETIC})
    assert [r.split(":", 1)[0] for r in lossy_reasons_of(info)] == [
        "speculative_accept_threshold_single 0.7", "speculative_accept_threshold_single 0.6",
        "speculative_accept_threshold_acc 0.5", "SGLANG_SIMULATE_ACC_LEN 2"]
    no_launch = ServerInfo(backend="sglang", base_url="http://x", server_flags={"speculative_accept_threshold_acc": 0.2,
                                                                               **SYNTHETIC})
    assert [r.split(":", 1)[0] for r in lossy_reasons_of(no_launch)] == ["speculative_accept_threshold_acc 0.2"]


def test_describe_death_c_plus_plus_what_lines():
    assert describe_death("  what():  boom") == "boom"
    assert describe_death("what(): boom\nterminate called after throwing an instance of 'std::bad_alloc'") == "boom"
    assert describe_death("terminate called after throwing an instance of 'c10::Error'\n  what():  CUDA error\n"
                          "RuntimeError: Worker died. See root cause above.") == "c10::Error: CUDA error"


def test_describe_death_a_usage_error_beats_a_later_wrapper():
    assert describe_death("launch.py: error: argument --port: invalid int value\nSystemExit: 2") == (
        "launch.py: error: argument --port: invalid int value")
    assert describe_death("  launch.py: error: indented, so not argparse's\nSystemExit: 2") == "SystemExit: 2"


def test_describe_death_joins_only_the_indented_details():
    tail = "\n".join([
        "pydantic_core._pydantic_core.ValidationError: 1 validation error for SpeculativeConfig",
        " num_speculative_tokens",
        "    Input should be greater than 0 [type=greater_than, input_value=0, input_type=int]",
        "    For further information visit https://errors.pydantic.dev/2.11/v/greater_than",
        "    more after the link",
    ])
    assert describe_death(tail) == (
        "pydantic_core._pydantic_core.ValidationError: 1 validation error for SpeculativeConfig "
        "num_speculative_tokens Input should be greater than 0 [type=greater_than, input_value=0, input_type=int]")
    assert describe_death('ValueError: bad\n  File "x.py", line 1, in f\n    detail') == "ValueError: bad"
    assert describe_death("ValueError: bad\n\n  not joined across a blank line") == "ValueError: bad"
    assert describe_death("ValueError: bad\nnot indented\n  not joined") == "ValueError: bad"


def test_describe_death_trims_above_200_characters_at_a_word():
    exact = "ValueError: " + "y" * 188
    assert describe_death(exact) == exact
    assert describe_death(exact + "z") == "ValueError: " + "y" * 187 + "…"
    spaced = "ValueError: " + "y" * 186 + " " + "z" * 20
    assert describe_death(spaced) == "ValueError: " + "y" * 186 + "…"

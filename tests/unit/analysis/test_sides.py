"""Both sides of a comparison differ in speculation only: every launching backend plans the pair
with the same argv and environment apart from its speculative flags; what each side ran with is
recorded (secrets as ***); side_differences names every other difference, one line each."""
from __future__ import annotations
import contextlib
import json
import sys
from pathlib import Path
import pytest
from click.testing import CliRunner
from pydantic import BaseModel
from specadapt.adapters import llamacpp, reference, sglang, trtllm
from specadapt.adapters.base import Backend, Capabilities, LaunchOptions
from specadapt.adapters.http import OpenAIServer
from specadapt.adapters.plan import LaunchPlan, launch_record, record_argv, record_env, record_settings
from specadapt.adapters.process import free_port
from specadapt.analysis.sides import launch_differences, side_differences
from specadapt.cli import cli
from specadapt.configs.spec import SpecConfig
from specadapt.errors import UsageError
from specadapt.orchestration import servers
from specadapt.orchestration.servers import plan_differences
from specadapt.records import CounterSnapshot, ServerInfo
from specadapt.records.server import PER_SERVER, LaunchRecord
from specadapt.testing import scripted_plan
from specadapt.analysis.sides import hardware_differences, side_differences
from specadapt.records import GpuInfo, HardwareInfo, ServerInfo
from specadapt.analysis.sides import side_notes
from builders import server

KEY = "sk-planted-5f3a9c"
NGRAM = SpecConfig(method="ngram", k=4, ngram_min=2, ngram_max=4)


# --- every launching backend plans the pair alike ------------------------------------------------------

def _pair(make, opts_cls, spec=NGRAM, **kw):
    off = make(opts_cls(port=8001, **kw))
    on = make(opts_cls(port=8002, spec_config=spec, **kw))
    return off, on


def _cut(argv: list[str], block: list[str]) -> list[str]:
    """argv without the contiguous ``block`` (by hand, independent of comparable_argv)."""
    for i in range(len(argv)):
        if argv[i:i + len(block)] == block:
            return argv[:i] + argv[i + len(block):]
    raise AssertionError(f"{block} is not a run of {argv}")


def _ports_out(argv: list[str], port: int) -> list[str]:
    return [a for a in argv if a not in (str(port), f"--port={port}")]


PAIRS = {
    "reference": lambda tmp: _pair(reference.launch_plan, reference.ReferenceLaunch, model="/m", dtype="float32",
                                   extra_args=["--max-num-seqs=4"]),
    "sglang": lambda tmp: _pair(sglang.launch_plan, sglang.SGLangLaunch, model="/m", dtype="bfloat16",
                                max_model_len=512, extra_args=["--mem-fraction-static", "0.5"]),
    "llamacpp": lambda tmp: _pair(llamacpp.launch_plan, llamacpp.LlamaCppLaunch, model="/m.gguf", n_threads=2,
                                  extra_args=["--n_batch", "64"]),
    "trtllm": lambda tmp: _pair(trtllm.launch_plan, trtllm.TRTLLMLaunch, model="/m", dtype="bfloat16",
                                max_model_len=512, config_dir=str(tmp), extra_args=["--log_level", "info"]),
}


@pytest.mark.parametrize("name", sorted(PAIRS))
def test_each_backend_plans_the_pair_with_equal_env_and_argv_apart_from_speculation(name, tmp_path):
    off, on = PAIRS[name](tmp_path)
    assert off.env == on.env
    assert off.spec_args == [] and off.spec_enabled is False and on.spec_enabled is True
    if name == "trtllm":  # speculation lives in the YAML; argv differs in the file's name only
        assert on.spec_args == [] and on.config == off.config and "speculative_config" not in on.config
        assert set(on.spec_settings) == {"speculative_config", "disable_overlap_scheduler"}  # NGram wants both
        assert off.spec_settings == {} and "enable_iter_perf_stats" in off.config
        flag = off.per_server_flags[-1]
        assert flag in ("--config", "--extra_llm_api_options")
        paths = off.argv[off.argv.index(flag) + 1], on.argv[on.argv.index(flag) + 1]
        assert paths[0] != paths[1]
        assert _ports_out([a for a in off.argv if a != paths[0]], 8001) == \
            _ports_out([a for a in on.argv if a != paths[1]], 8002)
    else:
        assert on.spec_args and _ports_out(off.argv, 8001) == _ports_out(_cut(on.argv, on.spec_args), 8002)
    records = launch_record(off, environ={}), launch_record(on, environ={})
    assert (records[0].spec_settings, records[1].spec_settings) == (off.spec_settings, on.spec_settings)
    assert records[0].comparable_argv() == records[1].comparable_argv()
    assert launch_differences(*records) == []


@pytest.mark.parametrize("name", sorted(PAIRS))
def test_an_extra_argument_on_one_side_is_flagged(name, tmp_path):
    off, on = PAIRS[name](tmp_path)
    on = on.model_copy(update={"argv": on.argv + ["--enforce-eager"]})
    assert launch_differences(launch_record(off, environ={}), launch_record(on, environ={})) == [
        "launch argv differs apart from speculation: only the spec-off side has nothing more, "
        "only the spec-on side has --enforce-eager"]


def test_trtllm_config_differences_outside_speculation_are_flagged(tmp_path):
    off, on = PAIRS["trtllm"](tmp_path)
    on = on.model_copy(update={"config": {**on.config, "kv_cache_config": {"free_gpu_memory_fraction": 0.5}}})
    assert launch_differences(launch_record(off, environ={}), launch_record(on, environ={})) == [
        "server config kv_cache_config.free_gpu_memory_fraction: unset on the spec-off side, 0.5 on the spec-on side"]


def test_a_decoding_type_without_the_overlap_rule_keeps_the_scheduler_setting_out_of_speculation():
    doc = {"speculative_config": {"decoding_type": "Eagle3"}, "disable_overlap_scheduler": True}
    assert trtllm.spec_settings_keys(doc) == {"speculative_config"}
    assert trtllm.spec_settings_keys({**doc, "speculative_config": {"decoding_type": "NGram"}}) == {
        "speculative_config", "disable_overlap_scheduler"}
    assert trtllm.spec_settings_keys({"speculative_config": {"decoding_type": "NGram"},
                                      "disable_overlap_scheduler": False}) == {"speculative_config"}
    assert trtllm.spec_settings_keys({"disable_overlap_scheduler": True}) == set()


# --- comparable argv -------------------------------------------------------------------------------------

def record(argv, spec_args=(), flags=("--host", "--port"), **kw) -> LaunchRecord:
    return LaunchRecord(backend="x", argv=list(argv), spec_args=list(spec_args), per_server_flags=list(flags), **kw)


def test_comparable_argv_takes_out_the_first_run_of_the_spec_block_and_hides_per_server_values():
    r = record(["py", "--port=1", "--k=4", "--ngram", "--k=4", "--ngram", "--host", "h", "--hostile", "v",
                "--host=a=b", "--ngram"], spec_args=["--k=4", "--ngram"])
    assert r.comparable_argv() == ["py", f"--port={PER_SERVER}", "--k=4", "--ngram", "--host", PER_SERVER,
                                   "--hostile", "v", f"--host={PER_SERVER}", "--ngram"]
    assert record(["--ngram", "--k=4", "x"], spec_args=["--ngram", "--k=4"]).comparable_argv() == ["x"]
    assert record(["x", "--ngram", "--k=4"], spec_args=["--ngram", "--k=4"]).comparable_argv() == ["x"]


def test_a_spec_block_that_is_not_a_run_of_argv_removes_nothing():
    r = record(["py", "--ngram", "--x", "--k=4"], spec_args=["--ngram", "--k=4"])
    assert r.comparable_argv() == ["py", "--ngram", "--x", "--k=4"]
    assert record(["py", "--a"], spec_args=["--a", "--b"]).comparable_argv() == ["py", "--a"]


def test_an_argument_missing_on_the_spec_on_side_is_said_from_that_side():
    assert launch_differences(record(["py", "--a", "--b"]), record(["py", "--b"])) == [
        "launch argv differs apart from speculation: only the spec-off side has --a, "
        "only the spec-on side has nothing more"]


def test_a_secret_in_a_record_made_by_hand_is_still_masked_in_the_lines():
    off = record(["py"], env={"HF_TOKEN": KEY, "OMP_NUM_THREADS": "1"})
    on = record(["py"], env={"OMP_NUM_THREADS": "2"})
    assert launch_differences(off, on) == [
        "environment HF_TOKEN: '***' on the spec-off side, unset on the spec-on side",
        "environment OMP_NUM_THREADS: 1 on the spec-off side, 2 on the spec-on side"]


def test_the_same_arguments_in_another_order_is_its_own_line():
    assert launch_differences(record(["py", "--a", "--b"]), record(["py", "--b", "--a"])) == [
        "launch argv: the same arguments apart from speculation, in a different order"]


# --- what each side ran with is recorded, secrets as *** -------------------------------------------------

def test_the_record_keeps_what_was_set_and_the_speed_variables_inherited():
    plan = LaunchPlan(backend="vllm", argv=["py", "--port=1"], env={"VLLM_CPU_KVCACHE_SPACE": "1"}, port=1,
                      spec_enabled=False, model="m")
    environ = {"OMP_NUM_THREADS": "2", "KMP_AFFINITY": "x", "CUDA_VISIBLE_DEVICES": "0", "VLLM_LOGGING_LEVEL": "INFO",
               "LD_PRELOAD": "/a.so", "VLLM_CPU_KVCACHE_SPACE": "9", "HOME": "/root", "PATH": "/bin",
               "MY_OMP_NUM_THREADS": "3", "HF_TOKEN": KEY}
    r = launch_record(plan, python="/venv/bin/python", package_version="0.32.0", environ=environ)
    assert r.env == {"VLLM_CPU_KVCACHE_SPACE": "1"}  # what specadapt set; the inherited one it overrides is not kept
    assert r.inherited_env == {"CUDA_VISIBLE_DEVICES": "0", "KMP_AFFINITY": "x", "LD_PRELOAD": "/a.so",
                               "OMP_NUM_THREADS": "2", "VLLM_LOGGING_LEVEL": "INFO"}
    assert r.effective_env()["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert (r.python, r.package_version, r.argv) == ("/venv/bin/python", "0.32.0", ["py", "--port=1"])


def test_secret_flags_and_variables_become_stars_and_nothing_else_does():
    argv = ["py", "--api-key", KEY, f"--api-key={KEY}=x", f"--hf-token={KEY}", "--token", KEY, "--ssl-keyfile-password",
            KEY, "--max-num-batched-tokens", "4096", "--ssl-keyfile", "/k.pem", KEY]
    assert record_argv(argv) == ["py", "--api-key", "***", "--api-key=***", "--hf-token=***", "--token", "***",
                                 "--ssl-keyfile-password", "***", "--max-num-batched-tokens", "4096",
                                 "--ssl-keyfile", "/k.pem", KEY]  # a bare value is no flag's: kept as given
    env = {"VLLM_API_KEY": KEY, "HF_TOKEN": KEY, "DB_PASSWORD": KEY, "AWS_SECRET_ACCESS_KEY": KEY, "APIKEY": KEY,
           "TOKENIZERS_PARALLELISM": "false", "VLLM_MAX_TOKENS_PER_BATCH": "8", "KEYBOARD": "us"}
    assert record_env(env) == {"APIKEY": "***", "AWS_SECRET_ACCESS_KEY": "***", "DB_PASSWORD": "***",
                               "HF_TOKEN": "***", "KEYBOARD": "us", "TOKENIZERS_PARALLELISM": "false",
                               "VLLM_API_KEY": "***", "VLLM_MAX_TOKENS_PER_BATCH": "8"}
    assert record_settings({"a": {"hf_token": KEY, "max_num_tokens": 8, "api_key": None, "token": ""},
                            "l": [{"secret": KEY}]}) == \
        {"a": {"hf_token": "***", "max_num_tokens": 8, "api_key": None, "token": ""}, "l": [{"secret": "***"}]}


def _keyed_plan(key: str, extra: str) -> LaunchPlan:
    return LaunchPlan(backend="vllm", argv=["py", "--api-key", key, f"--api-key={key}", extra, "--port=1"],
                      env={"VLLM_API_KEY": key}, port=1, spec_enabled=False, model="m")


def test_an_api_key_never_reaches_the_server_info_json_or_the_differences():
    environ = {"VLLM_API_KEY": KEY, "OPENAI_API_KEY": KEY, "VLLM_HF_TOKEN": KEY, "CUDA_HOME": "/usr/local/cuda"}
    off = launch_record(_keyed_plan(KEY, "--x=1"), environ=environ)
    on = launch_record(_keyed_plan(KEY + "2", "--x=2"), environ=environ)
    infos = [ServerInfo(backend="vllm", base_url="http://h:1", launch=r,
                        server_flags={"api_key": k, "env.VLLM_X": "1"}) for r, k in ((off, KEY), (on, KEY + "2"))]
    text = "\n".join(side_differences(*infos))
    assert KEY not in text and KEY not in infos[0].model_dump_json() + infos[1].model_dump_json()
    assert "--x=1" in text and "--x=2" in text  # the real difference is still said
    assert infos[0].server_flags == {"api_key": "***", "env.VLLM_X": "1"}  # ServerInfo keeps no secret setting
    assert infos[0].launch.inherited_env == {"CUDA_HOME": "/usr/local/cuda", "VLLM_HF_TOKEN": "***"}
    assert infos[0].launch.env == {"VLLM_API_KEY": "***"}


# --- side_differences ------------------------------------------------------------------------------------

def _launched(**kw) -> LaunchRecord:
    base = dict(backend="vllm", argv=["py", "-m", "vllm", "--model=/m", "--port=1"], per_server_flags=["--port"],
                env={"LD_PRELOAD": "/lib/libiomp5.so"}, inherited_env={"OMP_NUM_THREADS": "2"},
                config={"a": {"b": 1}}, python="py", package_version="0.32.0")
    return LaunchRecord(**{**base, **kw})


def _info(**kw) -> ServerInfo:
    base = dict(version="0.32.0", model_root="/m", max_model_len=2048, dtype="bfloat16",
                server_flags={"model_config.seed": 0}, launch=_launched())
    return server(**{**base, **kw})


def _spec_on() -> ServerInfo:
    """The spec-on twin of _info(): it differs in everything about speculation, nothing else."""
    spec = '--speculative-config={"method":"ngram"}'
    return _info(base_url="http://127.0.0.1:2", spec_enabled=True, spec_method="ngram", num_speculative_tokens=4,
                 spec_counters=["vllm:spec_decode_num_drafts_total"], spec_signal="counters", metrics_available=True,
                 notes=["something"], launch=_launched(argv=["py", "-m", "vllm", "--model=/m", "--port=2", spec],
                                                       spec_args=[spec],
                                                       spec_settings={"speculative_config": {"k": 4}}))


def test_sides_that_differ_in_speculation_only_give_no_line():
    assert side_differences(_info(spec_enabled=False), _spec_on()) == []
    assert side_differences(_info(launch=None), _spec_on().model_copy(update={"launch": None})) == []


CHANGES = {  # what changes on the spec-on side -> the one line it must give
    "backend": (dict(backend="reference"), "backend: vllm on the spec-off side, reference on the spec-on side"),
    "version": (dict(version="0.31.0"), "server version: 0.32.0 on the spec-off side, 0.31.0 on the spec-on side"),
    "model_root": (dict(model_root="/other"), "model root: /m on the spec-off side, /other on the spec-on side"),
    "max_model_len": (dict(max_model_len=4096), "max_model_len: 2048 on the spec-off side, 4096 on the spec-on side"),
    "dtype": (dict(dtype="float32"), "dtype: bfloat16 on the spec-off side, float32 on the spec-on side"),
    "flag": (dict(server_flags={"model_config.seed": 1}),
             "server setting model_config.seed: 0 on the spec-off side, 1 on the spec-on side"),
    "flag missing": (dict(server_flags={"model_config.seed": 0, "env.VLLM_X": "1"}),
                     "server setting env.VLLM_X: unset on the spec-off side, 1 on the spec-on side"),
    "flags one side": (dict(server_flags={}), "only the spec-off server exposes its settings (vLLM: /server_info "
                                              "with VLLM_SERVER_DEV_MODE=1): they were started differently, and the "
                                              "settings cannot be compared"),
    "launch one side": (dict(launch=None), "only the spec-off server was started by specadapt: the two launches "
                                           "cannot be compared"),
    "argv": (dict(launch=_launched(argv=["py", "-m", "vllm", "--model=/m2", "--port=2"])),
             "launch argv differs apart from speculation: only the spec-off side has --model=/m, only the spec-on "
             "side has --model=/m2"),
    "env set": (dict(launch=_launched(env={})),
                "environment LD_PRELOAD: /lib/libiomp5.so on the spec-off side, unset on the spec-on side"),
    "env inherited": (dict(launch=_launched(inherited_env={"OMP_NUM_THREADS": "1"})),
                      "environment OMP_NUM_THREADS: 2 on the spec-off side, 1 on the spec-on side"),
    "python": (dict(launch=_launched(python="/other/python")),
               "interpreter: py on the spec-off side, /other/python on the spec-on side"),
    "package": (dict(launch=_launched(package_version="0.31.0")),
                "backend package version: 0.32.0 on the spec-off side, 0.31.0 on the spec-on side"),
    "launch backend": (dict(launch=_launched(backend="reference")),
                       "launch backend: vllm on the spec-off side, reference on the spec-on side"),
    "config": (dict(launch=_launched(config={"a": {"b": 2}})),
               "server config a.b: 1 on the spec-off side, 2 on the spec-on side"),
}


@pytest.mark.parametrize("name", sorted(CHANGES))
def test_each_kind_of_difference_is_one_line(name):
    change, line = CHANGES[name]
    assert side_differences(_info(), _info(**change)) == [line]


def test_the_spec_off_side_seen_alone_is_said_from_its_side():
    assert side_differences(_info(launch=None, server_flags={}), _info()) == [
        "only the spec-on server was started by specadapt: the two launches cannot be compared",
        "only the spec-on server exposes its settings (vLLM: /server_info with VLLM_SERVER_DEV_MODE=1): they "
        "were started differently, and the settings cannot be compared"]


def test_what_one_side_does_not_expose_is_not_compared():
    unknown = dict(version=None, model_root=None, max_model_len=None, dtype=None,
                   launch=_launched(package_version=None))
    assert side_differences(_info(), _info(**unknown)) == []
    assert side_differences(_info(**unknown), _info()) == []


# --- the launch is recorded on each started server --------------------------------------------------------

class _Server(OpenAIServer):
    backend = "scripted"

    def describe(self) -> ServerInfo:
        return self._server_info(model_id=self.model_id)

    def read_counters(self) -> CounterSnapshot:
        return CounterSnapshot(source="none")


class _Launch(LaunchOptions):
    key: str | None = None


class _Backend(Backend):
    name = "scripted"
    capabilities = Capabilities(launch=True)
    launch_options = _Launch

    def connect(self, url, api_key=None, verify=True):
        return _Server(url, api_key=api_key, verify=verify)

    def launch_plan(self, opts):
        plan = scripted_plan(free_port(), api_key=opts.key)
        return plan.model_copy(update={"env": {"SCRIPTED_API_KEY": opts.key or "", "OMP_NUM_THREADS": "1"}})

    def connect_launched(self, opts, url):
        return _Server(url, api_key=opts.key, launched=True)

    def version(self):
        return "9.9"


def test_launched_servers_describe_what_they_ran_with_and_never_the_key():
    opts = [_Launch(model="m", key=KEY), _Launch(model="m", key=KEY, python="/elsewhere/python")]
    backend = _Backend()
    with backend.launched_many(opts[:1], startup_timeout_s=60) as (server,):
        info = server.describe()
    launch = info.launch
    assert launch is not None and launch.python == sys.executable and launch.package_version == "9.9"
    assert launch.argv[:3] == [sys.executable, "-m", "specadapt.testing.scripted_server"]
    assert "--api-key=***" in launch.argv and launch.env == {"OMP_NUM_THREADS": "1", "SCRIPTED_API_KEY": "***"}
    assert KEY not in info.model_dump_json()
    assert backend.launched_version(opts[1]) is None  # another interpreter: not this one's version
    assert backend.connect("http://127.0.0.1:9").launch is None


def test_llamacpp_records_the_version_its_interpreter_reported():
    backend = llamacpp.LlamaCppBackend()
    backend._versions["/venv/bin/python"] = "0.3.36"
    assert backend.launched_version(llamacpp.LlamaCppLaunch(model="/m.gguf", python="/venv/bin/python")) == "0.3.36"
    assert backend.launched_version(llamacpp.LlamaCppLaunch(model="/m.gguf", python="/other")) is None


# --- compare says so when the two plans differ beyond speculation ----------------------------------------

def _plan(argv, env=None, spec_args=()):
    return LaunchPlan(backend="x", argv=argv, env=env or {}, port=1, spec_enabled=bool(spec_args), model="m",
                      spec_args=list(spec_args))


def test_plan_differences_wait_for_both_sides():
    off = _plan(["py", "--port=1"], {"A": "1"})
    on = _plan(["py", "--port=2", "--spec"], {"A": "2"}, spec_args=["--spec"])
    assert plan_differences({"spec-on": on}) == plan_differences({"spec-off": off}) == []
    assert plan_differences({"spec-off": off, "spec-on": on}) == [
        "environment A: 1 on the spec-off side, 2 on the spec-on side"]
    assert plan_differences({"spec-off": off, "spec-on": on.model_copy(update={"env": {"A": "1"}})}) == []


class _StubLaunch(BaseModel):
    model: str
    spec_config: SpecConfig | None = None
    python: str
    host: str = "127.0.0.1"
    port: int | None = None
    dtype: str | None = None
    max_model_len: int | None = None
    extra_args: list[str] = []


class _StubBackend:
    """Reports a plan per side (the spec-on one with an extra variable), then refuses to start."""

    name = "stub"
    capabilities = Capabilities(launch=True)
    launch_options = _StubLaunch

    def resolve_model(self, model):
        return "m"

    @contextlib.contextmanager
    def launched_many(self, opts_list, startup_timeout_s=None, on_wait=None, on_plan=None):
        for i, opts in enumerate(opts_list):
            spec = ["--spec"] if opts.spec_config else []
            env = {"OMP_NUM_THREADS": "1"} if opts.spec_config else {}
            on_plan(_plan(["serve", *spec], env, spec), Path(f"/logs/{i}.log"))
        raise UsageError("the stub starts nothing")
        yield  # pragma: no cover


@pytest.mark.parametrize("launch", ["parallel", "sequential"])
def test_compare_warns_when_the_two_plans_differ_beyond_speculation(monkeypatch, launch):
    monkeypatch.setattr(servers, "get_backend", lambda name: _StubBackend())
    result = CliRunner().invoke(cli, ["compare", "--model", "m", "--launch", launch,
                                      "--spec-config", json.dumps({"method": "ngram", "num_speculative_tokens": 4})])
    lines = result.stderr.splitlines()
    warning = ("warning: the two servers differ in more than speculation: environment OMP_NUM_THREADS: unset on the "
               "spec-off side, 1 on the spec-on side")
    if launch == "parallel":  # both plans are known before either server runs
        assert lines.count(warning) == 1 and lines.index(warning) == len(lines) - 2
    else:  # the spec-on server starts first, alone, and refuses: the spec-off plan is never made
        assert warning not in lines
    assert lines[-1] == "error: the stub starts nothing"


def test_the_compare_report_notes_every_difference_beyond_speculation():
    from specadapt.analysis.speed import compare_notes as _compare_notes
    from specadapt.records import CompareReport, CompareSettings

    def notes(off, on):
        return [n for n in _compare_notes(CompareReport(settings=CompareSettings(), off_server=off, on_server=on))
                if n.startswith("the sides differ")]

    assert notes(_info(spec_enabled=False), _spec_on()) == []
    found = notes(_info(spec_enabled=False, max_model_len=4096), _spec_on())
    assert len(found) == 1 and "max_model_len" in found[0] and "4096" in found[0]


# side_differences on hardware: every kind of machine difference is its own exact line, next to the
# other differences of the two sides (these lines decide the "sides differ in more than speculation"
# warning).
H200 = GpuInfo(name="NVIDIA H200", memory_mib=143771, driver="550.54.15", compute_capability="9.0")
A100 = GpuInfo(name="NVIDIA A100-SXM4-80GB", memory_mib=81920, driver="550.54.15", compute_capability="8.0")


def machine(**kw) -> HardwareInfo:
    base = dict(source="constructed", cpu_model="AMD EPYC", cores=2, cpu_flags=["avx2", "fma"], gpus=[H200])
    return HardwareInfo(**{**base, **kw})


def info(**kw) -> ServerInfo:
    return server(**{"version": "0.32.0", "hardware": machine(), "model_id": None, **kw})


def test_cpu_flags_that_differ_are_one_line_with_the_flags_of_each_side():
    assert hardware_differences(machine(), machine(cpu_flags=["avx2", "avx512_bf16", "fma"])) == [
        "hardware CPU flags: 'avx2 fma' on the spec-off side, 'avx2 avx512_bf16 fma' on the spec-on side"]


def test_several_gpus_are_listed_one_after_another_and_no_gpu_is_none():
    assert hardware_differences(machine(gpus=[H200, A100]), machine(gpus=[])) == [
        "hardware GPUs: 'NVIDIA H200 (143771 MiB, cc 9.0); NVIDIA A100-SXM4-80GB (81920 MiB, cc 8.0)' on the "
        "spec-off side, none on the spec-on side"]
    assert hardware_differences(machine(gpus=[]), machine(gpus=[])) == []


def test_every_hardware_difference_in_order():
    on = machine(cpu_model="Intel Xeon", cores=8, cpu_flags=[], gpus=[A100])
    assert hardware_differences(machine(), on) == [
        "hardware CPU: 'AMD EPYC' on the spec-off side, 'Intel Xeon' on the spec-on side",
        "hardware logical CPUs: 2 on the spec-off side, 8 on the spec-on side",
        "hardware CPU flags: 'avx2 fma' on the spec-off side, '' on the spec-on side",
        "hardware GPUs: 'NVIDIA H200 (143771 MiB, cc 9.0)' on the spec-off side, "
        "'NVIDIA A100-SXM4-80GB (81920 MiB, cc 8.0)' on the spec-on side"]


def test_hardware_lines_come_after_the_other_differences_and_keep_them():
    off = info()
    on = info(version="0.31.0", dtype=None, hardware=machine(gpus=[]))
    assert side_differences(off, on) == [
        "server version: 0.32.0 on the spec-off side, 0.31.0 on the spec-on side",
        "hardware GPUs: 'NVIDIA H200 (143771 MiB, cc 9.0)' on the spec-off side, none on the spec-on side"]


# The one function that says what looks wrong about two sides (analysis/sides.py ``side_notes``),
# as `equiv` (compare), `equiv --sampling` and `equiv --features` call it.
ON = ServerInfo(backend="vllm", base_url="http://on", model_id="a", spec_enabled=False, dtype="float16")
OFF = ServerInfo(backend="vllm", base_url="http://off", model_id="b", spec_enabled=True, dtype="bfloat16")


def test_sampling_wording_with_every_difference():
    assert side_notes(OFF, ON) == [
        "the spec-off server has spec-decode counters: speculation looks ON there",
        "the spec-on server has no spec-decode counters: speculation looks OFF there",
        "the servers serve different model ids (b vs a)",
        "the sides differ in more than speculation: dtype: bfloat16 on the spec-off side, float16 on the spec-on side"]


def test_compare_wording_names_the_sides_off_and_on():
    notes = side_notes(OFF, ON, off_name="the 'off' server", on_name="the 'on' server")
    assert notes[:2] == ["the 'off' server has spec-decode counters: speculation looks ON there",
                         "the 'on' server has no spec-decode counters: speculation looks OFF there"]
    assert len(notes) == 4


def test_features_wording_without_the_other_differences():
    assert side_notes(OFF, ON, no_counters="every cell's activity is unknown", differences=False) == [
        "the spec-off server has spec-decode counters: speculation looks ON there",
        "the spec-on server has no spec-decode counters: every cell's activity is unknown",
        "the servers serve different model ids (b vs a)"]


def test_healthy_sides_and_no_spec_off_server():
    healthy_on = ON.model_copy(update={"spec_enabled": True, "model_id": "b", "dtype": "bfloat16"})
    healthy_off = OFF.model_copy(update={"spec_enabled": False})
    assert side_notes(healthy_off, healthy_on) == []
    assert side_notes(None, ON) == ["the spec-on server has no spec-decode counters: speculation looks OFF there"]
    assert side_notes(None, healthy_on) == []

"""The one server-option set and open_servers(): probe, compare and equiv take the same options
and open servers the same way (exact lines through click's CliRunner, with a stub backend)."""

from __future__ import annotations

import contextlib
import json
from dataclasses import fields
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from pydantic import BaseModel

from specadapt.adapters.base import LaunchPlan
from specadapt.cli import cli
from specadapt.commands._workload import WORKLOAD_PARAMS
from specadapt.commands.compare import compare, equiv
from specadapt.commands.probe import probe
from specadapt.configs.spec import SpecConfig
from specadapt.errors import UsageError
from specadapt.orchestration import servers
from specadapt.orchestration.servers import ServerOptions

NGRAM = json.dumps({"method": "ngram", "num_speculative_tokens": 4})  # vLLM's own form
NGRAM_SPEC = SpecConfig(method="ngram", k=4)  # what the parser makes of it
SHARED = [f.name for f in fields(ServerOptions)]
LOAD = {*WORKLOAD_PARAMS, "request_rate", "burstiness", "duration", "slo", "concurrency", "repeat", "warmup", "max_tokens", "seed", "request_timeout", "json_out",
        "workers", "ray_address", "show"}


def params(command: click.Command) -> dict[str, dict]:
    return {p.name: p.to_info_dict() for p in command.params}


def invoke(*args: str) -> tuple[int, list[str]]:
    result = CliRunner().invoke(cli, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.stderr.splitlines()


# --- one option set ---------------------------------------------------------------------------
@pytest.mark.parametrize("other", [compare, equiv], ids=["compare", "equiv"])
def test_every_shared_server_option_is_the_same_in_probe_and_the_ab_commands(other):
    ours, theirs = params(probe), params(other)
    for name in SHARED:  # name, flags, type, default, help, flag-ness, multiple, ...
        assert ours[name] == theirs[name], name


@pytest.mark.parametrize("other", [compare, equiv], ids=["compare", "equiv"])
def test_no_server_option_is_declared_twice(other):
    """What probe and compare both take is the shared set plus the load options, nothing else."""
    common = set(params(probe)) & set(params(other))
    # --top-logprobs means "top K log-probabilities per position" in both (probe's tokens, equiv
    # --sampling's source distribution): the same meaning, not a server option
    also = {"top_logprobs"} if other is equiv else set()
    assert common - LOAD - also == set(SHARED)


def test_how_the_servers_are_reached_differs_by_command():
    assert {"url", "port"} <= set(params(probe)) and not {"off_url", "on_url", "launch"} & set(params(probe))
    assert {"off_url", "on_url", "launch"} <= set(params(compare)) and not {"url", "port"} & set(params(compare))


# --- a stub backend: what open_servers asks of a backend, and what it prints -------------------
class StubLaunch(BaseModel):
    model: str
    spec_config: SpecConfig | None = None
    python: str
    host: str = "127.0.0.1"
    port: int | None = None
    dtype: str | None = None
    max_model_len: int | None = None
    extra_args: list[str] = []


class StubServer:
    def __init__(self, url: str):
        self.base_url, self.closed = url, False

    def close(self) -> None:
        self.closed = True


class StubCapabilities:
    """Answers both ways of asking: ``"launch" in caps`` and ``caps.launch``."""

    def __init__(self, launch: bool):
        self.launch, self.connect = launch, True

    def __contains__(self, name: str) -> bool:
        return bool(getattr(self, name, False))


class StubBackend:
    """Launches nothing: records the launch options, reports a plan, then refuses to go on."""

    name = "stub"
    capabilities = StubCapabilities(launch=True)
    launch_options = StubLaunch

    def __init__(self):
        self.launched: list[StubLaunch] = []
        self.connected: list[StubServer] = []

    def resolve_model(self, model: str | None) -> str:
        return f"resolved:{model}"

    def connect(self, url: str, api_key=None, verify=True) -> StubServer:
        self.connected.append(StubServer(url))
        return self.connected[-1]

    @contextlib.contextmanager
    def launched_many(self, opts_list, startup_timeout_s=None, on_wait=None, on_plan=None):
        for i, opts in enumerate(opts_list):
            self.launched.append(opts)
            plan = LaunchPlan(backend="stub", argv=["stub-serve", f"--spec={bool(opts.spec_config)}"], port=9000 + i,
                              spec_enabled=bool(opts.spec_config), model=opts.model, notes=[f"note {i}"],
                              spec_args=[f"--spec={bool(opts.spec_config)}"])
            on_plan(plan, Path(f"/logs/{i}.log"))
        raise UsageError("the stub starts nothing")
        yield  # pragma: no cover


@pytest.fixture
def stub(monkeypatch) -> StubBackend:
    backend = StubBackend()
    monkeypatch.setattr(servers, "get_backend", lambda name: backend)
    return backend


def test_probe_prints_the_plan_the_log_and_every_note(stub):
    code, lines = invoke("probe", "--model", "m", "--spec-config", NGRAM, "--port", "8123")
    assert code == 2
    assert lines == ["starting vllm: stub-serve --spec=True", "server log: /logs/0.log", "note: note 0",
                     "error: the stub starts nothing"]
    (opts,) = stub.launched
    assert opts.model == "resolved:m" and opts.port == 8123 and opts.spec_config == NGRAM_SPEC


@pytest.fixture
def two_cpus(monkeypatch):
    monkeypatch.setattr(servers, "usable_cpus", lambda: [0, 1])


def test_compare_starts_both_sides_with_probe_s_options_and_messages(stub, two_cpus):
    code, lines = invoke("compare", "--model", "m", "--spec-config", NGRAM, "--host", "127.0.0.2", "--dtype", "float32",
                         "--max-model-len", "512", "--server-arg", "--x=1")
    assert code == 2
    assert lines == ["each side on its own share of the machine: spec-off on CPU 0; spec-on on CPU 1",
                     "starting spec-off server: stub-serve --spec=False", "server log: /logs/0.log", "note: note 0",
                     "starting spec-on server: stub-serve --spec=True", "server log: /logs/1.log", "note: note 1",
                     "error: the stub starts nothing"]
    off, on = stub.launched
    assert off.spec_config is None and on.spec_config == NGRAM_SPEC
    assert (off.cpus, on.cpus) == ([0], [1])
    common = dict(model="resolved:m", host="127.0.0.2", port=None, dtype="float32", max_model_len=512,
                  extra_args=["--x=1"])
    assert off.model_dump(exclude={"spec_config", "cpus", "gpus"}) == on.model_dump(exclude={"spec_config", "cpus", "gpus"}) == {
        **common, "python": off.python}


def test_compare_side_by_side_on_one_cpu_says_what_to_do_and_starts_nothing(stub, monkeypatch):
    monkeypatch.setattr(servers, "usable_cpus", lambda: [0])
    code, lines = invoke("compare", "--model", "m", "--spec-config", NGRAM)
    assert code == 2 and stub.launched == []
    assert lines == ["error: this machine gives specadapt 1 CPU: 2 servers side by side would share it and stall "
                     "each other; use --launch sequential (one server at a time) or --launch shared (side by side "
                     "anyway, flagged in the report)"]


def test_compare_launch_shared_binds_nothing_and_warns(stub, two_cpus):
    code, lines = invoke("compare", "--model", "m", "--spec-config", NGRAM, "--launch", "shared")
    assert code == 2 and [o.cpus for o in stub.launched] == [None, None]
    assert " ".join(" ".join(lines[:2]).split()) == ("warning: the spec-off and spec-on servers share this machine's 2 CPUs (--launch "
                                   "shared): each may stall the other's first token")


def test_sequential_compare_starts_the_spec_on_side_first_and_alone(stub):
    code, lines = invoke("compare", "--model", "m", "--spec-config", NGRAM, "--launch", "sequential")
    assert code == 2 and lines[0] == "starting spec-on server: stub-serve --spec=True"
    assert [o.spec_config is not None for o in stub.launched] == [True]


@pytest.mark.parametrize("argv, line", [
    (["compare", "--off", "http://127.0.0.1:1"],
     "error: give both --off URL and --on URL, or neither (then both servers are started)"),
    (["compare", "--off", "http://127.0.0.1:1", "--on", "http://127.0.0.1:2", "--model", "m"],
     "error: --off and --on connect to running servers; --model and --spec-config are for starting them: "
     "give one or the other"),
    (["compare", "--model", "m"],
     "error: to start the servers, give the spec-on side's --spec-config (or --off and --on URLs)"),
    (["probe", "--url", "http://127.0.0.1:1", "--spec-config", NGRAM],
     "error: --url connects to a running server; --model and --spec-config are for starting one: "
     "give one or the other"),
])
def test_connect_or_start_is_one_or_the_other(stub, argv, line):
    assert invoke(*argv) == (2, [line])


def test_a_backend_that_cannot_launch_names_the_urls_to_give(stub):
    stub.capabilities = StubCapabilities(launch=False)
    assert invoke("probe") == (2, ["error: backend vllm cannot start servers: pass --url of a running one"])
    assert invoke("equiv", "--spec-config", NGRAM) == (
        2, ["error: backend vllm cannot start servers: pass --off and --on URLs of running ones"])


def test_given_urls_are_connected_and_closed(stub):
    plan = servers.plan_servers(ServerOptions(
        backend="stub", api_key=None, insecure=False, ca_bundle=None, model=None, spec_config=None, python="py",
        host="127.0.0.1", dtype=None, max_model_len=2048, server_args=(), startup_timeout=1.0),
        [servers.Side(url="http://a", spec=False, label="spec-off"), servers.Side(url="http://b", label="spec-on")])
    assert plan.launch == (None, None)
    with servers.open_servers(plan) as opened:
        assert [s.base_url for s in opened] == ["http://a", "http://b"]
        assert not any(s.closed for s in opened)
    assert all(s.closed for s in stub.connected) and not stub.launched


def test_dtype_auto_is_resolved_for_the_started_servers_and_the_report(stub, monkeypatch, two_cpus):
    from specadapt.commands import compare as compare_module
    from specadapt.records import HardwareInfo

    monkeypatch.setattr(servers, "local_hardware", lambda source: HardwareInfo(
        source=source, cpu_model="AMD EPYC", cpu_flags=["avx2", "avx512_bf16"], native_dtypes=["float32", "bfloat16"]))
    recorded = []

    def compare_servers(plan, prompts, settings, bars, messages):
        recorded.append(settings.dtype)
        raise UsageError("stop before any request")

    monkeypatch.setattr(compare_module, "compare_servers", compare_servers)
    code, lines = invoke("compare", "--model", "m", "--spec-config", NGRAM, "--dtype", "auto")
    assert code == 2
    assert lines == ["dtype auto: bfloat16 (this CPU (AMD EPYC) has AVX512-BF16: bfloat16 runs natively)",
                     "each side on its own share of the machine: spec-off on CPU 0; spec-on on CPU 1",
                     "error: stop before any request"]
    assert recorded == ["bfloat16"]
    assert "auto: specadapt picks what this machine runs natively" in params(compare)["dtype"]["help"]

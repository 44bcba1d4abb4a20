"""The typed backend contract (adapters/base.py): the built-ins keep it and declare what
they do as data, the registry refuses what does not keep it (saying what is missing), the
base class starts servers side by side for every launching backend, and the example plugin
in examples/minimal_backend loads through the entry-point machinery and measures a server."""

from __future__ import annotations

import inspect
import json
import re
import sys
import warnings
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from specadapt.adapters import registry
from specadapt.adapters.base import (
    CAPABILITIES,
    Backend,
    Capabilities,
    LaunchOptions,
    LaunchPlan,
    Server,
    ServerBase,
    TokenRequests,
)
from specadapt.adapters.http import OpenAIServer
from specadapt.adapters.spec_config import forms_for, load_spec_config
from specadapt.cli import cli
from specadapt.configs.spec_input import NEUTRAL_FIELDS, SpecSupport
from specadapt.errors import ServerStartError, UsageError
from specadapt.orchestration.probe import run_probe
from specadapt.records import CounterSnapshot, Prompt, RequestSettings, ServerInfo
from specadapt.testing import script, scripted_plan, scripted_server

REPO = Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "examples" / "minimal_backend"
BUILTINS = sorted(registry.BUILTIN)
MEMBERS = [m for m in dir(Server) if not m.startswith("_")] + list(Server.__annotations__)


_ABSENT = object()


def keeps_server_protocol(obj) -> bool:
    """isinstance(obj, Server) without touching properties (Python < 3.12 would call model_id)."""
    return all(inspect.getattr_static(obj, m, _ABSENT) is not _ABSENT for m in MEMBERS)


# ------------------------------------------------------------------ the built-ins

@pytest.mark.parametrize("name", BUILTINS)
def test_builtin_keeps_the_contract(name):
    backend = registry.get_backend(name)
    assert isinstance(backend, Backend) and backend.name == name
    assert issubclass(backend.launch_options, LaunchOptions)
    server = backend.connect("http://127.0.0.1:9", api_key="k", verify=False)
    try:
        assert keeps_server_protocol(server) and server.process is None and server.verify is False
        caps = backend.capabilities
        # the data says what the code does
        assert caps.token_ids == bool(server.identity_extras)
        assert caps.draining_counters == (type(server).start_run is not ServerBase.start_run)
        assert caps.launch == (type(backend).launch_plan is not Backend.launch_plan)
    finally:
        server.close()


@pytest.mark.parametrize("name", BUILTINS)
def test_builtin_declarations_say_what_its_servers_take_and_answer(name):
    backend = registry.get_backend(name)
    support, requests = backend.spec_support, backend.token_requests
    server = backend.connect("http://127.0.0.1:9")
    try:
        # identity runs and the sampling probe ask for token ids with the same keys, or neither can
        assert (requests.sampled_ids or {}) == server.identity_extras
        assert backend.capabilities.token_ids == (requests.sampled_ids is not None)
    finally:
        server.close()
    # a per-batch-size schedule only where servers start, and only through the field that carries it
    assert not support.batch_schedule or (backend.capabilities.launch and support.honours("k_per_batch_size"))
    # a setting outside the declared fields is refused, in the backend's name
    refused = sorted(set(NEUTRAL_FIELDS) - set(support.fields))
    assert refused  # every built-in leaves some out
    for field in refused:
        spec = {"method": "draft_model", "k": 2, "draft": "/d"} if field == "draft" else \
            {"method": "ngram", "k": 2, field: _VALUES[field]}
        with pytest.raises(UsageError) as err:
            load_spec_config(json.dumps(spec), name)
        assert str(err.value) == f"--spec-config: {field}: --backend {name} has no such setting: remove it"


# a value each neutral field takes beside method ngram and k 2
_VALUES = {"ngram_min": 1, "ngram_max": 3, "draft_tp": 1, "k_per_batch_size": [[1, 4, 2]], "max_concurrency": 4,
           "draft_len_schedule": {"1": 2}}


@pytest.mark.parametrize("name", BUILTINS)
def test_every_launch_options_model_takes_the_common_fields(name):
    opts_cls = registry.get_backend(name).launch_options
    opts = opts_cls(model="/m", spec_config=None, python="py", host="127.0.0.2", port=8123, dtype="bfloat16",
                    max_model_len=1024, extra_args=["--x"])
    assert (opts.model, opts.host, opts.port, opts.max_model_len, opts.extra_args) == \
        ("/m", "127.0.0.2", 8123, 1024, ["--x"])
    with pytest.raises(ValueError, match="not_a_field"):
        opts_cls(model="/m", not_a_field=1)


def test_capability_names_come_from_the_model():
    assert CAPABILITIES == ("launch", "connect", "counters", "logprobs", "token_ids", "draining_counters")
    caps = Capabilities(launch=True, counters=True)
    assert caps.names() == ["launch", "connect", "counters"] and "launch" in caps and "logprobs" not in caps
    with pytest.raises(ValueError):
        Capabilities(lauch=True)
    with pytest.raises(ValueError):
        caps.launch = False  # frozen: declared once, on the class


# ------------------------------------------------------------------ what the registry refuses

class _Srv(ServerBase):
    backend = "x"


class Good(Backend):
    name = "good"
    capabilities = Capabilities()

    def connect(self, url, api_key=None, verify=True):
        return _Srv()


class Liar(Good):
    name = "liar"
    capabilities = Capabilities(launch=True)  # ... but no launch_plan


class Duck:
    name = "duck"
    capabilities = Capabilities()

    def connect(self, url, api_key=None, verify=True):
        return _Srv()


class BadCaps(Good):
    name = "badcaps"
    capabilities = ("connect",)


@pytest.mark.parametrize("name, obj, message", [
    ("duck", Duck, "it is not a specadapt Backend and lacks launch_options, resolve_model, launched, "
                   "launched_many, version (subclass specadapt.adapters.base.Backend, which has them all)"),
    ("liar", Liar, "it declares the launch capability but defines no launch_plan()"),
    ("badcaps", BadCaps, "capabilities must be a specadapt.adapters.base.Capabilities, not tuple"),
    ("other", Good, "the entry point is named 'other' but the backend calls itself 'good': make them equal"),
])
def test_registry_refuses_what_breaks_the_contract(monkeypatch, name, obj, message):
    monkeypatch.setitem(registry.BUILTIN, name, f"{__name__}:{obj.__name__}")
    with pytest.raises(UsageError) as err:
        registry.get_backend(name)
    assert str(err.value) == (f"backend {name!r} ({__name__}:{obj.__name__}) could not be loaded: TypeError: "
                              f"{message}; reinstall or remove the package that registers it")


class DictSupport(Good):
    name = "dictsupport"
    spec_support = {"form": "vllm"}


class TupleRequests(Good):
    name = "tuplerequests"
    token_requests = ("return_tokens_as_token_ids",)


class Unvalidated(Good):
    name = "unvalidated"
    spec_support = SpecSupport.model_construct(form="vlm")  # built around the validators


class ScheduleWithoutLaunch(Good):
    name = "schedulewithoutlaunch"
    spec_support = SpecSupport(batch_schedule=True)


class FullDuck(Duck):  # every member of the contract, but none of the declarations
    name = "fullduck"
    launch_options = LaunchOptions
    resolve_model = version = launched = launched_many = Backend.version


@pytest.mark.parametrize("name, obj, message", [
    ("dictsupport", DictSupport, "spec_support must be a specadapt.adapters.base.SpecSupport, not dict"),
    ("tuplerequests", TupleRequests, "token_requests must be a specadapt.adapters.base.TokenRequests, not tuple"),
    ("unvalidated", Unvalidated, "spec_support: form: 'vlm' is not a --spec-config form: use one of vllm, trtllm, "
                                 "sglang, llamacpp, or None for the neutral form only"),
    ("schedulewithoutlaunch", ScheduleWithoutLaunch,
     "spec_support declares batch_schedule (servers it starts apply a per-batch-size draft length) but the backend "
     "starts no servers: drop it, or declare the launch capability"),
    ("fullduck", FullDuck, "it is not a specadapt Backend and lacks spec_support, token_requests (declare them, or "
                           "subclass specadapt.adapters.base.Backend, which has their defaults)"),
])
def test_registry_refuses_malformed_declarations(monkeypatch, name, obj, message):
    monkeypatch.setitem(registry.BUILTIN, name, f"{__name__}:{obj.__name__}")
    with pytest.raises(UsageError) as err:
        registry.get_backend(name)
    assert str(err.value) == (f"backend {name!r} ({__name__}:{obj.__name__}) could not be loaded: TypeError: "
                              f"{message}; reinstall or remove the package that registers it")
    entry = {e.name: e for e in registry.installed(warn=False)}[name]
    assert entry.error == f"TypeError: {message}" and entry.spec_support is None


def test_a_declaration_refused_as_the_plugin_builds_it_is_one_line_naming_the_field(tmp_path, monkeypatch):
    (tmp_path / "bad_declaration.py").write_text(
        "from specadapt.adapters.base import Backend, Capabilities, SpecSupport\n"
        "class Bad(Backend):\n"
        "    name = 'bad'\n"
        "    capabilities = Capabilities()\n"
        "    spec_support = SpecSupport(fields=frozenset({'method', 'k', 'speculate_harder'}))\n"
        "    def connect(self, url, api_key=None, verify=True):\n"
        "        raise NotImplementedError\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(registry.BUILTIN, "bad", "bad_declaration:Bad")
    with pytest.raises(UsageError) as err:
        registry.get_backend("bad")
    assert str(err.value) == (
        "backend 'bad' (bad_declaration:Bad) could not be loaded: ValidationError: SpecSupport: fields: "
        f"speculate_harder: not a neutral field (choose from {', '.join(NEUTRAL_FIELDS)}); reinstall or remove the "
        "package that registers it")
    sys.modules.pop("bad_declaration", None)


def test_registry_gives_instances_of_classes_and_takes_ready_instances(monkeypatch):
    monkeypatch.setitem(registry.BUILTIN, "good", f"{__name__}:Good")
    assert isinstance(registry.get_backend("good"), Good)
    monkeypatch.setitem(registry.BUILTIN, "good", f"{__name__}:GOOD")
    assert registry.get_backend("good") is GOOD


GOOD = Good()


def test_a_connect_only_backend_refuses_to_launch():
    backend = Good()
    with pytest.raises(UsageError, match="^backend good cannot start servers: pass --url of a running one$"):
        with backend.launched(LaunchOptions(model="m")):
            pass
    with pytest.raises(UsageError, match="cannot start servers"):
        with backend.launched_many([LaunchOptions(model="m")] * 2):
            pass


# ------------------------------------------------------------------ the base class launches

class ScriptedServer(OpenAIServer):
    backend = "scripted"

    def __init__(self, url, opts=None, **kw):
        super().__init__(url, **kw)
        self.opts = opts

    def describe(self):
        return ServerInfo(backend=self.backend, base_url=self.base_url, model_id=self.model_id)

    def read_counters(self):
        return CounterSnapshot(source="none")


class ScriptedLaunch(LaunchOptions):
    refuse: bool = False


class ScriptedBackend(Backend):
    """The scripted test server as a launching backend: only launch_plan is written."""

    name = "scripted"
    capabilities = Capabilities(launch=True)
    launch_options = ScriptedLaunch
    checked: list[str] = []

    def connect(self, url, api_key=None, verify=True):
        return ScriptedServer(url, api_key=api_key, verify=verify)

    def check_launch(self, opts):
        self.checked.append(opts.model)
        if opts.refuse:
            raise UsageError(f"refused {opts.model}")

    def launch_plan(self, opts):
        from specadapt.adapters.process import free_port

        return scripted_plan(opts.port or free_port())

    def connect_launched(self, opts, url):
        return ScriptedServer(url, opts=opts, launched=True)


def test_launched_many_starts_side_by_side_and_stops_all():
    backend = ScriptedBackend()
    plans = []
    with backend.launched_many([ScriptedLaunch(model="a"), ScriptedLaunch(model="b")], startup_timeout_s=60,
                               on_plan=lambda plan, log: plans.append(plan)) as servers:
        assert [s.opts.model for s in servers] == ["a", "b"] and len({s.base_url for s in servers}) == 2
        assert all(keeps_server_protocol(s) and s.process.alive() for s in servers)
        assert all(httpx.get(s.base_url + "/health").status_code == 200 for s in servers)
        procs = [s.process for s in servers]
    assert len(plans) == 2 and all(isinstance(p, LaunchPlan) for p in plans)
    assert not any(p.alive() for p in procs)


def test_launched_many_checks_every_option_before_starting_any(monkeypatch):
    backend = ScriptedBackend()
    backend.checked = []
    started = []
    monkeypatch.setattr(backend, "launch_plan", lambda opts: started.append(opts) or None)
    with pytest.raises(UsageError, match="refused b"):
        with backend.launched_many([ScriptedLaunch(model="a"), ScriptedLaunch(model="b", refuse=True)]):
            pass
    assert backend.checked == ["a", "b"] and started == []
    with pytest.raises(TypeError, match="launches from ScriptedLaunch, not LaunchOptions"):
        with backend.launched(LaunchOptions(model="a")):
            pass


def test_a_server_that_dies_at_start_is_an_error(monkeypatch):
    backend = ScriptedBackend()
    plan = scripted_plan(1)
    plan = plan.model_copy(update={"argv": [sys.executable, "-c", "import sys; sys.exit(3)"]})
    monkeypatch.setattr(backend, "launch_plan", lambda opts: plan.model_copy(update={"port": _free()}))
    with pytest.raises(ServerStartError, match="exited with code 3"):
        with backend.launched(ScriptedLaunch(model="a"), startup_timeout_s=30):
            pass


def _free() -> int:
    from specadapt.adapters.process import free_port

    return free_port()


# ------------------------------------------------------------------ the example plugin

def _install_as_distribution(site: Path) -> None:
    """What pip would write for examples/minimal_backend: a dist-info with its entry points."""
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((EXAMPLE / "pyproject.toml").read_text())["project"]
    dist = site / f"{project['name'].replace('-', '_')}-{project['version']}.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n")
    points = project["entry-points"]["specadapt.backends"]
    (dist / "entry_points.txt").write_text("[specadapt.backends]\n" + "".join(f"{k} = {v}\n" for k, v in points.items()))


@pytest.fixture
def minimal_installed(tmp_path, monkeypatch):
    site = tmp_path / "site"
    _install_as_distribution(site)
    monkeypatch.syspath_prepend(str(EXAMPLE))
    monkeypatch.syspath_prepend(str(site))
    yield
    sys.modules.pop("specadapt_minimal", None)


def test_the_example_backend_loads_through_its_entry_point(minimal_installed):
    assert "minimal" not in registry.BUILTIN
    assert registry.available()["minimal"] == "specadapt_minimal:MinimalBackend"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the example loads cleanly
        entry = {e.name: e for e in registry.installed()}["minimal"]
    assert (entry.distribution, entry.error, entry.version) == ("specadapt-minimal", None, None)
    assert entry.capabilities == ["connect", "logprobs"]
    backend = registry.get_backend("minimal")
    assert isinstance(backend, Backend) and type(backend).__module__ == "specadapt_minimal"
    with pytest.raises(UsageError, match="backend minimal cannot start servers"):
        with backend.launched(backend.launch_options(model="m")):
            pass


def test_the_example_backend_describes_and_probes_the_scripted_server(minimal_installed, tmp_path):
    backend = registry.get_backend("minimal")
    with scripted_server(tmp_path / "scripted.log") as mp:
        server = backend.connect(mp.plan.base_url)
        try:
            info = server.describe()
            assert (info.backend, info.model_id, info.base_url) == ("minimal", "scripted", mp.plan.base_url)
            prompts = [Prompt(id="a", prompt=script(id="a", tokens=8, ttft_ms=5, itl_ms=2))]
            report = run_probe(server, prompts, RequestSettings(max_tokens=8), warmup=0)
        finally:
            server.close()
    assert report.server.backend == "minimal" and report.latency.output_tokens == 8
    assert report.acceptance.known is False  # no counters, as declared


def test_the_example_backend_s_spec_support_decides_what_its_spec_config_takes(minimal_installed, monkeypatch,
                                                                               tmp_path):
    assert forms_for("minimal") == ["neutral"]
    assert load_spec_config('{"method": "ngram", "k": 4}', "minimal").k == 4
    tune = ["tune", "--backend", "minimal", "--off", "http://127.0.0.1:9", "--on", "4=http://127.0.0.1:9",
            "--no-verify", "--out", str(tmp_path / "tune")]
    result = CliRunner().invoke(cli, [*tune, "--spec-config", '{"method": "ngram", "k": 4, "ngram_max": 3}'])
    assert result.exit_code == 2 and result.output.strip().splitlines() == [
        "error: --spec-config: ngram_max: --backend minimal has no such setting: remove it"]
    result = CliRunner().invoke(cli, [*tune, "--spec-config", '{"method": "ngram", "num_speculative_tokens": 4}'])
    assert result.exit_code == 2 and result.output.strip().splitlines() == [
        'error: --spec-config: num_speculative_tokens: a vllm form field; --backend minimal takes the neutral form: '
        'write {"method": "ngram", "k": 4}']
    # declared otherwise, the same values pass: the declaration decides, not the backend's name
    plugin = type(registry.get_backend("minimal"))
    monkeypatch.setattr(plugin, "spec_support", SpecSupport(form="vllm"))
    assert load_spec_config('{"method": "ngram", "k": 4, "ngram_max": 3}', "minimal").ngram_max == 3
    assert load_spec_config('{"method": "ngram", "num_speculative_tokens": 4}', "minimal").k == 4


def test_the_example_backend_s_token_requests_keep_it_from_sampling(minimal_installed, monkeypatch, tmp_path):
    sampling = ["equiv", "--sampling", "--backend", "minimal", "--off", "http://127.0.0.1:9", "--on",
                "http://127.0.0.1:9"]
    result = CliRunner().invoke(cli, sampling)
    assert result.exit_code == 2 and result.output.strip().splitlines() == [
        "error: --sampling needs the sampled token ids, which backend minimal cannot return: run it on a backend "
        "that can (specadapt backends --json lists token_requests)"]
    plugin = type(registry.get_backend("minimal"))
    monkeypatch.setattr(plugin, "token_requests", TokenRequests(prompt_logprobs=None))
    result = CliRunner().invoke(cli, sampling)
    assert result.exit_code == 2 and result.output.strip().splitlines() == [
        "error: --sampling scores the samples with the spec-off server's prompt logprobs, which backend minimal "
        "cannot return: give --reference DIR to recompute them from the target"]
    entry = {e.name: e for e in registry.installed(warn=False)}["minimal"]
    assert entry.token_requests == TokenRequests(prompt_logprobs=None)
    assert entry.spec_support.fields == frozenset({"method", "k", "draft"})


def test_the_how_to_shows_the_example_as_it_is():
    """docs/backends.md "Adding a backend" quotes the example module whole, and its entry point."""
    module = (EXAMPLE / "specadapt_minimal.py").read_text()
    section = (REPO / "docs" / "backends.md").read_text().split("## Adding a backend", 1)[1]
    blocks = re.findall(r"```(\w+)\n(.*?)```", section, flags=re.S)
    assert ("python", module) in blocks
    toml = next(body for lang, body in blocks if lang == "toml")
    assert toml.strip() in (EXAMPLE / "pyproject.toml").read_text()
    assert len([line for line in module.splitlines() if line.strip()]) < 60  # "a few dozen lines"

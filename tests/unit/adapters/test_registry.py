"""The plugin layer end to end: a tiny external backend package, pip-installed into a
temporary target dir, shows up in 'specadapt backends' and drives 'specadapt probe';
a broken plugin (one that does not import, or does not keep the Backend contract) is a
warning naming it and what is wrong, never a crash. The example plugin in
examples/minimal_backend is loaded through the entry-point machinery too."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
from click.testing import CliRunner
from fake_openai import (
    FakeOpenAIServer,  # tests/unit is on sys.path (rootdir-less test dirs)
)

from specadapt.adapters import registry
from specadapt.cli import cli

REPO = Path(__file__).resolve().parents[3]

PLUGIN = '''
"""specadapt-toy: a third-party backend, as a plugin author would write it."""
import httpx
from specadapt.adapters.base import Backend, Capabilities, CounterSnapshot, ServerBase, ServerInfo


class ToyServer(ServerBase):
    backend = "toy"

    def __init__(self, url, api_key=None, verify=True):
        self.base_url = url.rstrip("/")
        self._client = httpx.Client(base_url=self.base_url, timeout=10)

    @property
    def model_id(self):
        return self._client.get("/v1/models").json()["data"][0]["id"]

    def headers(self):
        return {}

    def describe(self):
        return ServerInfo(backend="toy", base_url=self.base_url, version="9.9.9", model_id=self.model_id,
                          spec_enabled=True, notes=["toy plugin speaking"])

    def read_counters(self):
        c = self._client.get("/toy/counters").json()
        return CounterSnapshot(drafts=c["drafts"], draft_tokens=c["draft_tokens"],
                               accepted_tokens=c["accepted_tokens"], source="GET /toy/counters")

    def close(self):
        self._client.close()


class ToyBackend(Backend):
    name = "toy"
    capabilities = Capabilities(connect=True, counters=True)

    def connect(self, url, api_key=None, verify=True):
        return ToyServer(url, api_key, verify)

    def version(self):
        return "9.9.9"


class Incomplete:  # duck-typed, and short of the contract
    name = "incomplete"
    capabilities = Capabilities(connect=True)

    def connect(self, url, api_key=None, verify=True):
        return ToyServer(url)
'''

PYPROJECT = '''
[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "specadapt-toy"
version = "0.0.1"

[project.entry-points."specadapt.backends"]
toy = "specadapt_toy:ToyBackend"
broken = "specadapt_toy_missing:Backend"
incomplete = "specadapt_toy:Incomplete"
'''


@pytest.fixture(scope="module")
def plugin_site(tmp_path_factory) -> Path:
    """pip install --no-deps --no-build-isolation of a local package into a target dir."""
    root = tmp_path_factory.mktemp("plugin")
    pkg, site = root / "specadapt-toy", root / "site"
    pkg.mkdir()
    (pkg / "pyproject.toml").write_text(PYPROJECT)
    (pkg / "specadapt_toy.py").write_text(textwrap.dedent(PLUGIN))
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                           "--no-index", "--target", str(site), str(pkg)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (site / "specadapt_toy.py").is_file()
    return site


def run_cli(site: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(site)])}
    return subprocess.run([sys.executable, "-m", "specadapt", *args], capture_output=True, text=True,
                          env=env, timeout=120)


def test_installed_plugin_is_listed_and_the_broken_one_is_a_warning(plugin_site):
    done = run_cli(plugin_site, "backends")
    assert done.returncode == 0, done.stderr
    rows = {line.split()[0]: line.split() for line in done.stdout.splitlines()[1:] if line and line[0] != "V"}
    assert rows["toy"] == ["toy", "9.9.9", "-", "yes", "yes", "-", "-", "-", "specadapt-toy"]
    assert rows["broken"][2:8] == ["BROKEN"] * 6 and rows["incomplete"][2:8] == ["BROKEN"] * 6
    assert {"vllm", "trtllm", "sglang", "llamacpp"} <= set(rows)
    assert "warning: backend plugin 'broken' (specadapt_toy_missing:Backend, from specadapt-toy) could not be " \
           "loaded: ModuleNotFoundError" in done.stderr
    assert "warning: backend plugin 'incomplete' (specadapt_toy:Incomplete, from specadapt-toy) could not be " \
           "loaded: TypeError: it is not a specadapt Backend and lacks launch_options, resolve_model, launched, " \
           "launched_many, version (subclass specadapt.adapters.base.Backend, which has them all)" in done.stderr
    assert "Traceback" not in done.stderr


def test_backends_json(plugin_site):
    done = run_cli(plugin_site, "backends", "--json")
    entries = {e["name"]: e for e in json.loads(done.stdout)}
    assert entries["toy"]["capabilities"] == ["connect", "counters"] and entries["toy"]["error"] is None
    assert entries["broken"]["error"].startswith("ModuleNotFoundError")
    assert entries["trtllm"]["capabilities"] == ["launch", "connect", "counters", "logprobs", "draining_counters"]
    assert entries["vllm"]["capabilities"] == ["launch", "connect", "counters", "logprobs", "token_ids"]


def test_plugin_drives_probe_against_a_loopback_server(plugin_site, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "prompt": "hi"}\n{"id": "b", "messages": [{"role": "user", "content": "hi"}]}\n')
    out = tmp_path / "report.json"
    with FakeOpenAIServer() as fake:
        done = run_cli(plugin_site, "probe", "--backend", "toy", "--url", fake.url, "--prompts", str(prompts),
                       "--warmup", "1", "--json", str(out))
        served = fake.httpd.counters["requests"]
    assert done.returncode == 0, done.stderr[-2000:]
    assert served == 3  # 1 warm-up + 2 prompts
    report = json.loads(out.read_text())
    assert report["server"]["backend"] == "toy" and report["server"]["version"] == "9.9.9"
    assert report["latency"]["output_tokens"] == 12 and report["latency"]["failed"] == 0
    acc = report["acceptance"]
    assert acc["known"] and acc["drafts"] == 8 and acc["acceptance_rate"] == pytest.approx(0.5)
    assert "toy plugin speaking" in report["notes"]


def test_launch_is_refused_for_a_connect_only_plugin(plugin_site):
    done = run_cli(plugin_site, "probe", "--backend", "toy")
    assert done.returncode == 2 and "backend toy cannot start servers: pass --url" in done.stderr


def test_broken_plugin_named_when_chosen(plugin_site):
    done = run_cli(plugin_site, "probe", "--backend", "broken", "--url", "http://127.0.0.1:9")
    assert done.returncode == 2
    assert "backend 'broken' (specadapt_toy_missing:Backend) could not be loaded" in done.stderr
    assert "Traceback" not in done.stderr


def test_in_process_registry_warns_and_keeps_going(monkeypatch):
    monkeypatch.setitem(registry.BUILTIN, "kaput", "specadapt.adapters.no_such_module:X")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        entries = {e.name: e for e in registry.installed()}
    assert entries["kaput"].error.startswith("ModuleNotFoundError")
    assert any("'kaput'" in str(w.message) and w.category is registry.BackendPluginWarning for w in caught)
    assert entries["vllm"].error is None
    result = CliRunner().invoke(cli, ["backends"])
    assert result.exit_code == 0 and "kaput" in result.output and "BROKEN" in result.output


def test_unknown_backend_lists_the_choices():
    result = CliRunner().invoke(cli, ["probe", "--backend", "nope", "--url", "http://127.0.0.1:9"])
    assert result.exit_code == 2
    assert "unknown backend 'nope': choose one of llamacpp, reference, sglang, trtllm, vllm" in result.output

"""A server specadapt started dies mid-run: the run stops with the exit code and log tail,
finished requests are kept in a report marked partial, and the report is still written."""

from __future__ import annotations

import contextlib
import json

import pytest
from click.testing import CliRunner

from specadapt.adapters.vllm import VLLMServer
from specadapt.cli import cli
from specadapt.orchestration.probe import run_probe
from specadapt.records import Prompt, RequestSettings
from specadapt.testing import script, scripted_server

FAST = dict(ttft_ms=2.0, itl_ms=1.0, tokens=4)


def prompts() -> list[Prompt]:
    out = [Prompt(id=f"ok{i}", prompt=script(id=f"ok{i}", **FAST)) for i in range(3)]
    out.append(Prompt(id="dies", prompt=script(id="dies", **FAST, fault="exit", exit_code=7, fault_after=2)))
    out += [Prompt(id=f"never{i}", prompt=script(id=f"never{i}", **FAST)) for i in range(4)]
    return out


@contextlib.contextmanager
def managed_scripted(tmp_path):
    with scripted_server(tmp_path / "server.log") as mp:
        (tmp_path / "server.log").open("a").write("scripted server: about to crash on purpose\n")
        server = VLLMServer(mp.plan.base_url, launched=True)
        server.process = mp
        yield server
        server.close()


def test_run_stops_keeps_finished_requests_and_says_partial(tmp_path):
    with managed_scripted(tmp_path) as server:
        report = run_probe(server, prompts(), RequestSettings(max_tokens=4), concurrency=1, warmup=0)
    assert report.partial
    assert report.partial_reason.startswith("the vllm server exited with code 7 during the run; 3 of 8 requests")
    assert [r.prompt_id for r in report.requests] == ["ok0", "ok1", "ok2"] and all(r.ok for r in report.requests)
    assert report.latency.succeeded == 3 and report.latency.output_tokens == 12
    assert not report.acceptance.known and "exited during the run" in report.acceptance.reason
    assert "about to crash on purpose" in report.notes[-1]


def test_cli_writes_the_partial_report_and_exits_with_the_reason(tmp_path, monkeypatch):
    @contextlib.contextmanager
    def fake_open_servers(plan, messages=None):
        with managed_scripted(tmp_path) as server:
            yield [server]

    monkeypatch.setattr("specadapt.orchestration.probe.open_servers", fake_open_servers)
    prompt_file = tmp_path / "p.jsonl"
    prompt_file.write_text("".join(json.dumps({"id": p.id, "prompt": p.prompt}) + "\n" for p in prompts()))
    out = tmp_path / "r.json"
    result = CliRunner().invoke(cli, ["probe", "--url", "http://unused", "--prompts", str(prompt_file), "--warmup", "0",
                                      "--json", str(out)])
    assert result.exit_code == 2, result.output
    lines = result.stderr.splitlines() if hasattr(result, "stderr") else result.output.splitlines()
    errors = [ln for ln in lines if ln.startswith("error: ")]
    assert len(errors) == 1 and errors[0].startswith("error: the vllm server exited with code 7 during the run")
    assert "about to crash on purpose" in result.output and "Traceback" not in result.output
    data = json.loads(out.read_text())
    assert data["partial"] is True and len(data["requests"]) == 3


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECADAPT_CACHE_DIR", str(tmp_path / "cache"))

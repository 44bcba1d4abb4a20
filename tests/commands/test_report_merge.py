"""`specadapt report merge` and probe's repeated --url, through click (exact lines, exit codes)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from specadapt.analysis.probe_report import build_probe_report as build_report
from specadapt.cli import cli
from specadapt.errors import UsageError
from specadapt.orchestration.servers import Side, replica_sides
from specadapt.records import (
    CounterSnapshot,
    ProbeSettings,
    RequestRecord,
    RequestSettings,
    ServerInfo,
    read_report,
    write_report,
)


def saved(path, url: str, concurrency: int = 2, accepted: float = 6.0) -> None:
    rec = RequestRecord(prompt_id="p0", category="a", api="completions", ok=True, chunk_ns=[10, 20, 30],
                        chunk_tokens=[1, 1, 1], e2e_ns=35, output_tokens=3, token_source="usage")
    before = CounterSnapshot(drafts=0, draft_tokens=0, accepted_tokens=0, generation_tokens=0, source="m")
    after = CounterSnapshot(drafts=4, draft_tokens=16, accepted_tokens=accepted, generation_tokens=3, source="m")
    settings = ProbeSettings(concurrency=concurrency, repeat=1, warmup=0, prompts_source="built-in",
                             request=RequestSettings())
    write_report(build_report(ServerInfo(backend="vllm", base_url=url, model_id="m"), settings, [rec], before,
                              after, scale=None), path)


def run(*args: str):
    result = CliRunner().invoke(cli, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result


def test_merge_writes_one_report_with_both_servers(tmp_path):
    saved(tmp_path / "a.json", "http://a:8000", accepted=6)
    saved(tmp_path / "b.json", "http://b:8000", accepted=2)
    result = run("report", "merge", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "-o",
                 str(tmp_path / "m.json"))
    assert result.exit_code == 0, result.stderr
    merged = read_report(tmp_path / "m.json")
    assert [r.target for r in merged.requests] == ["http://a:8000", "http://b:8000"]
    assert merged.acceptance.accepted_tokens == 8 and merged.acceptance.draft_tokens == 32
    assert [s.path for s in merged.scale.sources] == [str(tmp_path / "a.json"), str(tmp_path / "b.json")]
    assert "per replica" in result.stdout and "merged from 2 reports" in result.stdout
    assert result.stderr.strip() == f"merged report written to {tmp_path / 'm.json'}"


def test_merge_refuses_other_settings_in_one_line(tmp_path):
    saved(tmp_path / "a.json", "http://a:8000")
    saved(tmp_path / "b.json", "http://a:8000", concurrency=8)
    result = run("report", "merge", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "-o",
                 str(tmp_path / "m.json"))
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [
        f"error: {tmp_path / 'b.json'} has concurrency 8, {tmp_path / 'a.json'} 2: "
        "merge only runs of the same settings"]
    assert not (tmp_path / "m.json").exists()


def test_merge_refuses_a_compare_report(tmp_path):
    saved(tmp_path / "a.json", "http://a:8000")
    (tmp_path / "c.json").write_text(json.dumps({"kind": "compare"}))
    result = run("report", "merge", str(tmp_path / "a.json"), str(tmp_path / "c.json"), "-o",
                 str(tmp_path / "m.json"))
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [
        f"error: {tmp_path / 'c.json'} is a compare report; merge takes probe reports"]


def test_replica_sides():
    assert replica_sides((), 8123) == [Side(port=8123)]
    assert replica_sides(("http://a",), None) == [Side(url="http://a")]
    assert replica_sides(("http://a", "http://b"), None) == [Side(url="http://a", label="replica 0"),
                                                             Side(url="http://b", label="replica 1")]
    with pytest.raises(UsageError, match="^--url http://a is given twice: give each replica once$"):
        replica_sides(("http://a", "http://b", "http://a"), None)


def test_probe_refuses_an_empty_ray_address():
    result = run("probe", "--url", "http://127.0.0.1:9", "--ray", " ")
    assert result.exit_code == 2
    assert result.stderr.splitlines() == ["error: --ray needs an address: 'local', 'auto' or ray://host:port"]

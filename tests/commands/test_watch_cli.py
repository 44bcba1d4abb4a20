"""`specadapt watch` refusals: each is one line and exit 2, before any server is read; and a watch of
an unreachable server that ends with the alert it raised (exit 1), never a crash."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from specadapt.cli import cli
from specadapt.commands.watch import parse_targets
from specadapt.errors import UsageError


@pytest.mark.parametrize("argv, message", [
    ([], "give the servers to watch"),
    (["--url", "fleet=http://127.0.0.1:9"], "the name 'fleet' is the aggregate"),
    (["--url", "a=http://127.0.0.1:9", "--url", "a=http://127.0.0.1:10"], "the server name 'a' is given twice"),
    (["--url", "a="], "give URL or NAME=URL"),
    (["--url", "http://127.0.0.1:9", "--listen", "nowhere"], "--listen 'nowhere': give HOST:PORT"),
    (["--url", "http://127.0.0.1:9", "--listen", ":70000"], "give HOST:PORT"),
    (["--url", "http://127.0.0.1:9", "--interval", "10", "--window", "5"], "--window 5 is shorter than --interval 10"),
    (["--url", "http://127.0.0.1:9", "--baseline", "missing.json"], "--baseline missing.json does not exist"),
    (["--url", "not a url"], "is not an http(s) URL"),
    (["--url", "http://127.0.0.1:9", "--golden", "none.json"], "--golden none.json does not exist: record it with"),
])
def test_bad_input_is_one_line_and_exit_2(argv, message):
    result = CliRunner().invoke(cli, ["watch", *argv])
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output


def test_a_baseline_that_is_not_a_compare_or_tune_report_is_refused(tmp_path):
    probe = tmp_path / "probe.json"
    probe.write_text(json.dumps({"kind": "probe"}))
    result = CliRunner().invoke(cli, ["watch", "--url", "http://127.0.0.1:9", "--baseline", str(probe)])
    assert result.exit_code == 2 and "is not a compare or tune report (kind: probe)" in result.output


def test_targets_take_names_or_use_the_url():
    assert parse_targets(("http://a:1", "b=http://b:2", " c = http://c:3 ")) == [
        ("http://a:1", "http://a:1"), ("b", "http://b:2"), ("c", "http://c:3")]
    with pytest.raises(UsageError):
        parse_targets(("=http://x:1",))


def test_an_unreachable_server_is_an_alert_not_a_crash(tmp_path):
    out = tmp_path / "w.json"
    result = CliRunner().invoke(cli, ["watch", "--url", "a=http://127.0.0.1:9", "--interval", "0.1",
                                      "--max-backoff", "0.2", "--duration", "1", "--no-console", "--out", str(out)])
    assert result.exit_code == 1, result.output
    report = json.loads(out.read_text())
    s = report["servers"][0]
    assert s["reads"] == 0 and s["errors"] >= 2 and "cannot connect" in s["last_error"]
    assert [e["alert"] for e in report["events"]] == ["down"] and report["alerts_raised"] == 1
    assert "1 alert was raised during the watch" in result.output

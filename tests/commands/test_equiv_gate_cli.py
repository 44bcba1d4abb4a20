"""`specadapt equiv`'s gate options: refusals in one line (exit 2, before any server is reached) and the
default levels of the greedy gate."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from specadapt.cli import cli

URLS = ["--off", "http://127.0.0.1:9", "--on", "http://127.0.0.1:9"]


@pytest.mark.parametrize("argv, message", [
    (["--max-suspect-rate", "0"], "--max-suspect-rate 0: give a rate between 0 and 1, exclusive (e.g. 0.05 for 5%)"),
    (["--max-suspect-rate", "1"], "--max-suspect-rate 1: give a rate between 0 and 1, exclusive"),
    (["--max-suspect-rate", "-0.2"], "--max-suspect-rate -0.2: give a rate between 0 and 1, exclusive"),
    (["--allow-inactive", "--require-active"], "--allow-inactive and --require-active ask for opposite things"),
    (["--features", "all", "--allow-inactive", "--require-active"], "--allow-inactive and --require-active ask"),
    (["--features", "all", "--max-suspect-rate", "0.1"], "--max-suspect-rate does not apply to --features"),
    (["--features", "all", "--allow-lossy"], "--allow-lossy does not apply to --features"),
    (["--sampling", "--allow-inactive"], "--allow-inactive does not apply to --sampling"),
    (["--sampling", "--max-suspect-rate", "0.1"], "--max-suspect-rate does not apply to --sampling"),
])
def test_the_gate_options_refuse_bad_input_in_one_line(argv, message):
    result = CliRunner().invoke(cli, ["equiv", *URLS, *argv])
    assert result.exit_code == 2, result.output
    errors = [ln for ln in result.output.splitlines() if ln.startswith(("error: ", "Error: "))]
    assert len(errors) == 1 and message in errors[0] and "Traceback" not in result.output


def test_equiv_defaults_to_each_prompt_alone_and_in_batches_of_4_and_compare_to_1(monkeypatch):
    """The greedy gate's default levels; a given --concurrency stands; compare keeps its own default."""
    from specadapt.commands import compare as compare_cmd

    seen = []

    def fake_run(server_opts, off_url, on_url, launch, kw, gate):
        seen.append((kw["concurrency"], gate))
        return 0

    monkeypatch.setattr(compare_cmd, "_run", fake_run)
    assert CliRunner().invoke(cli, ["equiv", *URLS]).exit_code == 0
    assert CliRunner().invoke(cli, ["equiv", *URLS, "--concurrency", "1", "--allow-inactive", "--allow-lossy",
                                    "--max-suspect-rate", "0.05"]).exit_code == 0
    assert CliRunner().invoke(cli, ["compare", *URLS]).exit_code == 0
    assert [c for c, _ in seen] == ["1,4", "1", "1"]
    assert seen[0][1] == dict(max_suspect=0, max_near_tie=None, min_speedup=None, max_suspect_rate=None,
                              allow_inactive=False, allow_lossy=False)
    assert seen[1][1]["allow_inactive"] and seen[1][1]["allow_lossy"] and seen[1][1]["max_suspect_rate"] == 0.05
    assert seen[2][1] is None

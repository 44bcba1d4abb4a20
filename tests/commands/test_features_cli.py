"""`specadapt equiv --features` refusals: each is one line and exit 2, before any server is reached."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from specadapt.analysis.features import FEATURES
from specadapt.cli import cli

URLS = ["--off", "http://127.0.0.1:9", "--on", "http://127.0.0.1:9"]


@pytest.mark.parametrize("argv, message", [
    (["--features", "bogus"], "unknown feature 'bogus'"),
    (["--features", "all", "--sampling"], "--features and --sampling are two checks"),
    (["--require-active"], "--require-active belongs to --features"),
    (["--features", "all", "--repeat", "2"], "--repeat does not apply to --features"),
    (["--features", "all", "--prompts", "x.jsonl"], "--prompts does not apply to --features"),
])
def test_bad_input_is_one_line_and_exit_2(argv, message):
    result = CliRunner().invoke(cli, ["equiv", *URLS, *argv])
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output


def test_one_url_is_refused():
    result = CliRunner().invoke(cli, ["equiv", "--features", "all", "--on", "http://127.0.0.1:9"])
    assert result.exit_code == 2 and "needs both servers" in result.output


def test_list_features_names_every_cell():
    result = CliRunner().invoke(cli, ["equiv", "--list-features"], terminal_width=200)
    assert result.exit_code == 0
    for f in FEATURES:
        assert f.name in result.output
    assert "groups: all (25), deterministic (18), distribution (6), structured (3)" in result.output

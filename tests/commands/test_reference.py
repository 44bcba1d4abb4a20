"""`specadapt reference ...` through click's CliRunner."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from specadapt.cli import cli
from specadapt.models import resolve_model_dir

pytest.importorskip("torch", reason="the reference engine needs torch (pip install 'specadapt[reference]')")
# the engine tests' tiny random models (tests/ is on sys.path: both test directories are packages)
from native_reference.conftest import make_tiny_dirs  # noqa: E402


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory):
    """(target dir, draft dir, small-vocab dir), as in tests/native_reference."""
    return make_tiny_dirs(tmp_path_factory.mktemp("tiny"), resolve_model_dir(None))


def run(*args):
    return CliRunner().invoke(cli, ["reference", *args], catch_exceptions=False)


def test_generate_check_reports_identity(tiny_dirs):
    target, draft, _ = tiny_dirs
    res = run("generate", "--target", str(target), "--draft", str(draft), "--k", "3", "--dtype", "float64",
              "--prompt", "hello hello hello", "--max-tokens", "12", "--check", "--json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["check"]["identical"] is True
    assert out["stats"]["generated_tokens"] == len(out["tokens"]) == 12
    assert out["method"] == "draft_model" and out["dtype"] == "float64"


def test_generate_prints_text_and_stats(tiny_dirs):
    target, _, _ = tiny_dirs
    res = run("generate", "--target", str(target), "--ngram", "--k", "2", "--prompt", "a b a b a b",
              "--max-tokens", "6", "--check")
    assert res.exit_code == 0, res.output
    assert "method ngram  k 2  float32 on cpu" in res.output
    assert "check: IDENTICAL to the target alone (6 tokens)" in res.output


def test_draft_with_other_vocab_refused(tiny_dirs):
    target, _, other = tiny_dirs
    res = run("generate", "--target", str(target), "--draft", str(other), "--prompt", "x")
    assert res.exit_code == 2
    assert "error: draft" in res.output and "speculative decoding needs a draft with the same tokenizer" in res.output


def test_unknown_fault_refused(tiny_dirs):
    target, _, _ = tiny_dirs
    res = run("serve", "--target", str(target), "--ngram", "--inject-fault", "flip-coins")
    assert res.exit_code == 2 and "unknown fault 'flip-coins'" in res.output


def test_both_proposers_refused(tiny_dirs):
    target, draft, _ = tiny_dirs
    res = run("generate", "--target", str(target), "--draft", str(draft), "--ngram", "--prompt", "x")
    assert res.exit_code == 2 and "choose one proposer" in res.output


def test_help_lists_reference():
    res = CliRunner().invoke(cli, ["--help"])
    assert res.exit_code == 0 and "reference" in res.output


def test_cli_works_without_torch():
    """With torch made unimportable, help works and generate names the extra to install."""
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['torch'] = None; sys.modules['transformers'] = None\n"
        "from click.testing import CliRunner\nfrom specadapt.cli import cli\n"
        "r = CliRunner()\n"
        "for args in (['--help'], ['reference', '--help'], ['reference', 'generate', '--help']):\n"
        "    res = r.invoke(cli, args); assert res.exit_code == 0, res.output\n"
        "res = r.invoke(cli, ['reference', 'generate', '--prompt', 'x'])\n"
        "assert res.exit_code == 2, res.output\n"
        "assert \"pip install 'specadapt[reference]'\" in res.output, res.output\n")
    subprocess.run([sys.executable, "-c", code], check=True)

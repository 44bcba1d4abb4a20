"""compare and equiv with the real backends: where they share options with probe, they behave
exactly like probe (these were drift bugs when compare had its own copy of the options)."""

from __future__ import annotations

import contextlib
import json

import pytest
from click.testing import CliRunner

from specadapt.adapters.llamacpp import LlamaCppBackend
from specadapt.cli import cli
from specadapt.commands.compare import parse_levels
from specadapt.errors import UsageError

NGRAM = json.dumps({"method": "ngram", "k": 4})  # the neutral form: every backend takes it


@pytest.fixture(autouse=True)
def _no_embedded_model(tmp_path, monkeypatch):
    """An empty cache: the embedded model is not fetched here, whatever this machine has."""
    monkeypatch.setenv("SPECADAPT_CACHE_DIR", str(tmp_path / "cache"))


def error_lines(*args: str) -> list[str]:
    result = CliRunner().invoke(cli, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert result.exit_code == 2, result.output
    return [ln for ln in result.output.splitlines() if ln.startswith(("error: ", "Error: "))]


@pytest.mark.parametrize("command", ["compare", "equiv"])
def test_a_missing_gguf_is_the_same_error_as_probe_s(tmp_path, command):
    """llamacpp serves a .gguf file: no 'not a Hugging Face model directory' from compare."""
    gguf = tmp_path / "m.gguf"
    line = f"error: GGUF model {gguf} not found: pass an existing .gguf file"
    assert error_lines("probe", "--backend", "llamacpp", "--model", str(gguf)) == [line]
    assert error_lines(command, "--backend", "llamacpp", "--model", str(gguf), "--spec-config", NGRAM) == [line]


def test_compare_starts_llamacpp_from_the_gguf_probe_would_start(tmp_path, monkeypatch):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    started = []

    @contextlib.contextmanager
    def launched_many(opts_list, **kw):
        started.append(list(opts_list))
        raise UsageError("stopped by the test")
        yield  # pragma: no cover

    monkeypatch.setattr(LlamaCppBackend, "launched_many", staticmethod(launched_many), raising=False)
    assert error_lines("probe", "--backend", "llamacpp", "--model", str(gguf)) == ["error: stopped by the test"]
    assert error_lines("compare", "--backend", "llamacpp", "--model", str(gguf), "--spec-config", NGRAM) == [
        "error: stopped by the test"]
    (probed,), (off, on) = started
    assert probed.model == off.model == on.model == str(gguf.resolve())
    assert off.spec_config is None and on.spec_config is not None


@pytest.mark.parametrize("command", ["compare", "equiv"])
def test_trtllm_without_model_says_it_needs_one_like_probe(command):
    line = ("error: --backend trtllm needs --model (an HF model directory or id): the embedded GGUF model cannot "
            "be served by TensorRT-LLM")
    assert error_lines("probe", "--backend", "trtllm") == [line]
    assert error_lines(command, "--backend", "trtllm", "--spec-config", NGRAM) == [line]


@pytest.mark.parametrize("command", ["compare", "equiv"])
def test_a_launch_option_the_backend_refuses_is_one_line_like_probe(command):
    line = "error: --backend trtllm: dtype: Input should be 'auto', 'float16', 'bfloat16' or 'float32'"
    assert error_lines("probe", "--backend", "trtllm", "--model", "/m", "--dtype", "fp7") == [line]
    assert error_lines(command, "--backend", "trtllm", "--model", "/m", "--dtype", "fp7", "--spec-config", NGRAM) == [
        line]


@pytest.mark.parametrize("command", ["compare", "equiv"])
def test_a_bad_spec_config_is_the_same_error_as_probe_s(tmp_path, command):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    bad = '{"method": "ngram",'
    line = ("error: --spec-config is not valid JSON (Expecting property name enclosed in double quotes at column 20): "
            "give a JSON object such as '{\"method\": \"ngram\", \"k\": 4}' or a file path")
    assert error_lines("probe", "--model", str(model), "--spec-config", bad) == [line]
    assert error_lines(command, "--model", str(model), "--spec-config", bad) == [line]


def test_concurrency_levels():
    assert parse_levels("4, 1,2,2") == [1, 2, 4]
    with pytest.raises(UsageError, match="give comma-separated integers"):
        parse_levels("1,x")
    with pytest.raises(UsageError, match="every level must be an integer >= 1"):
        parse_levels("0,1")


@pytest.mark.parametrize(("command", "args", "shown"), [("compare", [], 1), ("compare", ["--show", "3"], 3),
                                                         ("equiv", ["--show", "0"], 0)])
def test_show_reaches_the_settings_the_reports_draw_from(monkeypatch, command, args, shown):
    """--show N (default 1) is CompareSettings.show, for compare and for equiv's greedy gate."""
    from specadapt.commands import compare as compare_command

    seen = []

    def stop(plan, prompts, settings, *rest):
        seen.append(settings)
        raise UsageError("stopped by the test")

    monkeypatch.setattr(compare_command, "compare_servers", stop)
    assert error_lines(command, "--off", "http://off:8000", "--on", "http://on:8000", *args) == [
        "error: stopped by the test"]
    assert [s.show for s in seen] == [shown]
    assert error_lines(command, "--off", "http://off:8000", "--on", "http://on:8000", "--show", "-1")

"""Bad input, as a table: each row is what a user typed, the exact error line specadapt
prints and its exit code. No row may print a traceback. Most rows go through click's
CliRunner (the real command object, in-process, fast); a few through `python -m specadapt`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from specadapt.cli import cli

HUGE = '{"prompt": "ok"}\n{"prompt": "' + "x" * 1_000_100 + '"}\n'
U = ["--url", "http://127.0.0.1:1"]
M = ["--model", "{tmp}/model"]
SPEC_JSON_HINT = ("give a JSON object such as '{\"method\": \"ngram\", \"k\": 4}' "
                  "or a file path")

# (row id, argv ({tmp} is the row's directory), files to write {name: text|bytes}, exact error line, exit code)
ROWS = [
    # CLI arguments
    ("concurrency-zero", ["probe", "--concurrency", "0"], {},
     "Error: Invalid value for '--concurrency': 0 is not in the range 1<=x<=4096.", 2),
    ("concurrency-text", ["probe", "--concurrency", "abc"], {},
     "Error: Invalid value for '--concurrency': 'abc' is not a valid integer range.", 2),
    ("repeat-zero", ["probe", "--repeat", "0"], {}, "Error: Invalid value for '--repeat': 0 is not in the range x>=1.", 2),
    ("max-tokens-zero", ["probe", "--max-tokens", "0"], {},
     "Error: Invalid value for '--max-tokens': 0 is not in the range x>=1.", 2),
    ("temperature-negative", ["probe", "--temperature", "-1"], {},
     "Error: Invalid value for '--temperature': -1.0 is not in the range x>=0.", 2),
    ("top-logprobs-too-many", ["probe", "--top-logprobs", "21"], {},
     "Error: Invalid value for '--top-logprobs': 21 is not in the range 0<=x<=20.", 2),
    ("timeout-zero", ["probe", "--request-timeout", "0"], {},
     "Error: Invalid value for '--request-timeout': 0.0 is not in the range x>=0.1.", 2),
    ("retries-too-many", ["probe", "--retries", "11"], {},
     "Error: Invalid value for '--retries': 11 is not in the range 0<=x<=10.", 2),
    ("port-too-big", ["probe", "--port", "70000"], {},
     "Error: Invalid value for '--port': 70000 is not in the range 1<=x<=65535.", 2),
    ("unknown-option", ["probe", "--frobnicate"], {}, "Error: No such option '--frobnicate'.", 2),
    ("warmup-negative", ["probe", "--warmup", "-1"], {},
     "Error: Invalid value for '--warmup': -1 is not in the range x>=0.", 2),
    ("max-model-len-tiny", ["probe", "--max-model-len", "8"], {},
     "Error: Invalid value for '--max-model-len': 8 is not in the range x>=16.", 2),
    ("unknown-command", ["probbe"], {}, "Error: No such command 'probbe'. Did you mean 'probe'?", 2),
    ("ca-bundle-missing", ["probe", "--ca-bundle", "{tmp}/nope.pem"], {},
     "Error: Invalid value for '--ca-bundle': File '{tmp}/nope.pem' does not exist.", 2),
    # URLs
    ("url-no-scheme", ["probe", "--url", "localhost:8000"], {},
     "error: --url 'localhost:8000' is not an http(s) URL: give e.g. http://127.0.0.1:8000", 2),
    ("url-ftp", ["probe", "--url", "ftp://example.com/"], {},
     "error: --url 'ftp://example.com' is not an http(s) URL: give e.g. http://127.0.0.1:8000", 2),
    ("url-no-host", ["probe", "--url", "http://"], {},
     "error: --url 'http:' is not an http(s) URL: give e.g. http://127.0.0.1:8000", 2),
    ("url-and-model", ["probe", *U, *M], {},
     "error: --url connects to a running server; --model and --spec-config are for starting one: "
     "give one or the other", 2),
    # Configs
    ("spec-config-bad-json", ["probe", *M, "--spec-config", '{"method": "ngram",'], {},
     "error: --spec-config is not valid JSON (Expecting property name enclosed in double quotes at column 20): "
     + SPEC_JSON_HINT, 2),
    ("spec-config-array", ["probe", *M, "--spec-config", "[1, 2]"], {},
     "error: --spec-config '[1, 2]' is neither a JSON object nor an existing file", 2),
    ("spec-config-k-zero", ["probe", *M, "--spec-config", '{"method": "ngram", "num_speculative_tokens": 0}'], {},
     "error: --spec-config: num_speculative_tokens: must be >= 1", 2),
    ("spec-config-eagle3-no-model", ["probe", *M, "--spec-config", '{"method": "eagle3", "num_speculative_tokens": 3}'],
     {}, "error: --spec-config: model: is required for method eagle3 (the draft model or head: a path or HF id)", 2),
    ("spec-config-missing-file", ["probe", *M, "--spec-config", "{tmp}/missing.json"], {},
     "error: --spec-config '{tmp}/missing.json' is neither a JSON object nor an existing file", 2),
    # Prompt files
    ("prompts-empty", ["probe", *U, "--prompts", "{tmp}/p.jsonl"], {"p.jsonl": ""},
     "error: {tmp}/p.jsonl has no prompts: give one JSON object per line", 2),
    ("prompts-blank-lines", ["probe", *U, "--prompts", "{tmp}/p.jsonl"], {"p.jsonl": "\n  \n\n"},
     "error: {tmp}/p.jsonl has no prompts: give one JSON object per line", 2),
    ("prompts-invalid-json", ["probe", *U, "--prompts", "{tmp}/p.jsonl"], {"p.jsonl": '{"prompt": "ok"}\n{"prompt": \n'},
     "error: {tmp}/p.jsonl:2: not valid JSON (Expecting value); each line must be one JSON object", 2),
    ("prompts-array-line", ["probe", *U, "--prompts", "{tmp}/p.jsonl"], {"p.jsonl": '["a", "b"]\n'},
     "error: {tmp}/p.jsonl:1: expected a JSON object, got list", 2),
    ("prompts-wrong-type", ["probe", *U, "--prompts", "{tmp}/p.jsonl"], {"p.jsonl": '{"prompt": "ok"}\n{"prompt": 3}\n'},
     "error: {tmp}/p.jsonl:2: prompt: Input should be a valid string", 2),
    ("prompts-unknown-field", ["probe", *U, "--prompts", "{tmp}/p.jsonl"],
     {"p.jsonl": '{"prompt": "ok", "temperture": 0}\n'},
     "error: {tmp}/p.jsonl:1: temperture: Extra inputs are not permitted", 2),
    ("prompts-both-kinds", ["probe", *U, "--prompts", "{tmp}/p.jsonl"],
     {"p.jsonl": '{"prompt": "a", "messages": [{"role": "user", "content": "b"}]}\n'},
     "error: {tmp}/p.jsonl:1: give exactly one of 'prompt' (completions) or 'messages' (chat)", 2),
    ("prompts-neither-kind", ["probe", *U, "--prompts", "{tmp}/p.jsonl"], {"p.jsonl": '{"id": "x"}\n'},
     "error: {tmp}/p.jsonl:1: give exactly one of 'prompt' (completions) or 'messages' (chat)", 2),
    ("prompts-huge-line", ["probe", *U, "--prompts", "{tmp}/p.jsonl"], {"p.jsonl": HUGE},
     "error: {tmp}/p.jsonl:2: line is longer than 1000000 bytes", 2),
    ("prompts-not-utf8", ["probe", *U, "--prompts", "{tmp}/p.jsonl"], {"p.jsonl": b'{"prompt": "caf\xe9"}\n'},
     "error: {tmp}/p.jsonl is not UTF-8 text", 2),
    ("prompts-missing-file", ["probe", *U, "--prompts", "{tmp}/nope.jsonl"], {},
     "error: prompt file {tmp}/nope.jsonl does not exist", 2),
    ("prompts-duplicate-ids", ["probe", *U, "--prompts", "{tmp}/p.jsonl"],
     {"p.jsonl": '{"id": "a", "prompt": "x"}\n{"id": "a", "prompt": "y"}\n'},
     "error: {tmp}/p.jsonl: prompt ids must be unique; repeated: a", 2),
    ("prompts-empty-text", ["probe", *U, "--prompts", "{tmp}/p.jsonl"], {"p.jsonl": '{"prompt": "  "}\n'},
     "error: {tmp}/p.jsonl:1: 'prompt' is empty", 2),
    ("prompts-bad-role", ["probe", *U, "--prompts", "{tmp}/p.jsonl"],
     {"p.jsonl": '{"messages": [{"role": "robot", "content": "hi"}]}\n'},
     "error: {tmp}/p.jsonl:1: messages.0.role: Input should be 'system', 'user' or 'assistant'", 2),
    ("prompts-max-tokens-zero", ["probe", *U, "--prompts", "{tmp}/p.jsonl"], {"p.jsonl": '{"prompt": "a", "max_tokens": 0}\n'},
     "error: {tmp}/p.jsonl:1: max_tokens: Input should be greater than 0", 2),
    # Model directories
    ("model-missing", ["probe", "--model", "{tmp}/nomodel"], {},
     "error: model directory {tmp}/nomodel does not exist: pass an existing local HF model directory", 2),
    ("model-not-hf", ["probe", "--model", "{tmp}/empty_dir"], {"empty_dir/": ""},
     "error: {tmp}/empty_dir is not a Hugging Face model directory (no config.json in it)", 2),
    ("model-is-a-file", ["probe", "--model", "{tmp}/file.bin"], {"file.bin": "x"},
     "error: {tmp}/file.bin is not a Hugging Face model directory (no config.json in it)", 2),
    # Saved reports
    ("report-missing", ["report", "show", "{tmp}/none.json"], {}, "error: report {tmp}/none.json does not exist", 2),
    ("report-not-a-report", ["report", "show", "{tmp}/r.json"], {"r.json": '{"hello": 1}'},
     "error: {tmp}/r.json is not a specadapt probe report (6 problems; first: Field required)", 2),
]
SUBPROCESS_ROWS = {"concurrency-zero", "url-no-scheme", "prompts-invalid-json", "model-missing", "report-missing"}


def prepare(tmp: Path, argv: list[str], files: dict, line: str) -> tuple[list[str], str]:
    (tmp / "model").mkdir()
    (tmp / "model" / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    for name, content in files.items():
        if name.endswith("/"):
            (tmp / name).mkdir()
        elif isinstance(content, bytes):
            (tmp / name).write_bytes(content)
        else:
            (tmp / name).write_text(content)
    return [a.replace("{tmp}", str(tmp)) for a in argv], line.replace("{tmp}", str(tmp))


def error_lines(output: str) -> list[str]:
    return [ln for ln in output.splitlines() if ln.startswith(("error: ", "Error: "))]


def test_the_table_is_big_enough():
    assert len(ROWS) >= 30 and len({r[0] for r in ROWS}) == len(ROWS)


@pytest.mark.parametrize("row_id, argv, files, line, code", ROWS, ids=[r[0] for r in ROWS])
def test_row(tmp_path, row_id, argv, files, line, code):
    argv, line = prepare(tmp_path, argv, files, line)
    result = CliRunner().invoke(cli, argv)
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert result.exit_code == code, result.output
    assert error_lines(result.output) == [line]


@pytest.mark.parametrize("row", [r for r in ROWS if r[0] in SUBPROCESS_ROWS], ids=[r[0] for r in ROWS if r[0] in SUBPROCESS_ROWS])
def test_row_through_the_real_command(tmp_path, row):
    _row_id, argv, files, line, code = row
    argv, line = prepare(tmp_path, argv, files, line)
    proc = subprocess.run([sys.executable, "-m", "specadapt", *argv], capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "SPECADAPT_CACHE_DIR": str(tmp_path / "cache"),
                               "PYTHONPATH": ":".join(sys.path)})
    assert "Traceback" not in proc.stderr + proc.stdout
    assert proc.returncode == code and error_lines(proc.stderr) == [line], proc.stderr

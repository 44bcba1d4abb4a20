"""`specadapt config`: render, validate (round trip), explain, examples; exact outputs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from specadapt.cli import cli

REPO_ROOT = Path(__file__).resolve().parents[2]
# TensorRT-LLM's speculative_config JSON schema (origin: tests/fixtures/trtllm/README.md)
SCHEMA = REPO_ROOT / "tests" / "fixtures" / "trtllm" / "trtllm-speculative.schema.json"

EAGLE3 = ["config", "--backend", "vllm", "--target", "M", "--method", "eagle3", "--draft", "D",
          "--k", "3"]


def run(*args):
    return CliRunner().invoke(cli, list(args))


def test_render_argv_exact():
    r = run(*EAGLE3, "--format", "argv")
    assert r.exit_code == 0, r.output
    assert r.output == ("python -m vllm.entrypoints.openai.api_server --model M --host 0.0.0.0 "
                        "--port 8000 --speculative-config "
                        "'{\"method\":\"eagle3\",\"model\":\"D\",\"num_speculative_tokens\":3}'\n")


def test_render_json():
    r = run(*EAGLE3, "--format", "json")
    assert json.loads(r.output) == {"method": "eagle3", "model": "D", "num_speculative_tokens": 3}


def test_error_is_one_line_exit_2():
    r = run("config", "--backend", "vllm", "--target", "M", "--method", "eagle3", "--k", "3")
    assert r.exit_code == 2
    assert r.output == ("error: Method 'eagle3' needs a draft (a draft model, EAGLE head or "
                        "Medusa heads): add --draft PATH_OR_HF_ID.\n")


def test_unsupported_method_lists_supported():
    r = run(*EAGLE3, "--backend-version", "0.7.3")
    assert r.exit_code == 2 and "it supports: draft_model, eagle, medusa, ngram, off" in r.output


def test_missing_backend_and_bad_json_are_usage_errors():
    assert "add --backend" in run("config", "--method", "ngram").output
    r = run("config", "--backend", "trtllm", "--target", "M", "--method", "ngram", "--k", "3",
            "--draft-len-schedule", "{4:3}")
    assert r.exit_code == 2 and "not valid JSON" in r.output and "Traceback" not in r.output


@pytest.mark.parametrize("backend,method,extra", [
    ("vllm", "ngram", ["--k", "4", "--ngram-max", "4"]),
    ("vllm", "eagle3", ["--k", "3", "--draft", "D", "--tp", "2"]),
    ("vllm", "draft_model", ["--k", "3", "--draft", "D", "--k-per-batch-size", "[[1, 8, 3]]"]),
    ("vllm", "ngram", ["--k", "4", "--ngram-max", "4", "--backend-version", "0.7.3"]),
    ("trtllm", "eagle3", ["--k", "3", "--draft", "D", "--max-concurrency", "16"]),
    ("trtllm", "mtp", ["--k", "3", "--tp", "8"]),
    ("trtllm", "ngram", ["--k", "3", "--draft-len-schedule", '{"1": 3, "8": 1}']),
    ("trtllm", "draft_model", ["--k", "3", "--draft", "D", "--backend-version", "1.1.0"]),
])
def test_round_trip_every_format_validates(tmp_path, backend, method, extra):
    version = extra[extra.index("--backend-version") + 1] if "--backend-version" in extra else None
    r = run("config", "--backend", backend, "--target", "M", "--method", method, *extra,
            "--format", "all", "--out", str(tmp_path))
    assert r.exit_code == 0, r.output
    files = sorted(tmp_path.iterdir())
    assert len(files) >= 4
    for f in files:
        args = ["config"] + (["--backend-version", version] if version else [])
        args += ["validate", str(f)]
        if backend == "trtllm":
            args += ["--schema", str(SCHEMA)]
        v = run(*args)
        assert v.exit_code == 0, (f.name, v.output)
        assert v.output.strip().endswith(")") and ": ok (" in v.output


def test_validate_reports_errors_exit_1(tmp_path):
    f = tmp_path / "spec.json"
    f.write_text(json.dumps({"method": "ngram", "num_speculative_tokens": 3,
                             "prompt_lookup_min": 4, "prompt_lookup_max": 2}))
    r = run("config", "validate", str(f))
    assert r.exit_code == 1
    assert "prompt_lookup_min=4 > prompt_lookup_max=2: make min <= max." in r.output


def test_validate_legacy_flags_on_new_version(tmp_path):
    f = tmp_path / "cfg.yaml"
    f.write_text("model: M\nspeculative-model: '[ngram]'\nnum-speculative-tokens: 3\n")
    r = run("config", "validate", str(f))
    assert r.exit_code == 1
    assert "'--speculative-model' was removed in vLLM 0.8: move it into --speculative-config " \
           "as 'model'." in r.output
    assert run("config", "--backend-version", "0.7.3", "validate", str(f)).exit_code == 0


def test_validate_trtllm_config_flag_on_old_version(tmp_path):
    f = tmp_path / "serve.sh"
    f.write_text("trtllm-serve M --config c.yaml\n")
    assert run("config", "validate", str(f)).exit_code == 0
    r = run("config", "--backend-version", "1.1.0", "validate", str(f))
    assert r.exit_code == 1 and "use --extra_llm_api_options" in r.output


def test_validate_unreadable_file_is_usage_error(tmp_path):
    r = run("config", "validate", str(tmp_path / "missing.yaml"))
    assert r.exit_code == 2 and r.output.startswith("error: Cannot read")


def test_explain(tmp_path):
    f = tmp_path / "trt.yaml"
    f.write_text("speculative_config:\n  decoding_type: NGram\n  max_draft_len: 3\n"
                 "  acceptance_length_threshold: 0.5\n")
    r = run("config", "explain", str(f))
    assert r.exit_code == 0
    assert "  max_draft_len = 3: draft tokens per step (k)" in r.output
    assert "acceptance_length_threshold = 0.5: DEPRECATED/RENAMED" in r.output
    assert "add 'enable_iter_perf_stats: true'" in r.output  # what is missing


def test_explain_vllm_json(tmp_path):
    f = tmp_path / "s.json"
    f.write_text(json.dumps({"method": "ngram", "num_speculative_tokens": 3,
                             "disable_by_batch_size": 4}))
    out = run("config", "explain", str(f)).output
    assert 'num_speculative_tokens = 3: draft tokens per step (k), > 0' in out
    assert "disable_by_batch_size = 4: DEPRECATED/RENAMED: removed" in out


def test_examples_check():
    r = run("config", "examples", "--check", "--out", str(REPO_ROOT / "configs"))
    assert r.exit_code == 0, r.output


def make_model_dir(root: Path, name: str, config: dict) -> Path:
    d = root / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps(config))
    return d


def test_validate_checks_local_model_dirs(tmp_path):
    cfg = {"model_type": "llama", "vocab_size": 5, "hidden_size": 8,
           "max_position_embeddings": 1024}
    t = make_model_dir(tmp_path, "t", cfg)
    d = make_model_dir(tmp_path, "d", {**cfg, "vocab_size": 7})
    f = tmp_path / "cfg.yaml"
    f.write_text(f"model: {t}\nmax-model-len: 4096\nspeculative-config:\n"
                 f"  method: draft_model\n  model: {d}\n  num_speculative_tokens: 3\n")
    r = run("config", "validate", str(f))
    assert r.exit_code == 1
    assert "Draft vocab size 7 differs from the target's 5" in r.output
    assert "lower --max-model-len to 1024" in r.output


def test_bare_config_prints_help():
    r = run("config")
    assert r.exit_code == 0 and r.output.startswith("Usage: ")


def test_multiple_formats_are_labelled():
    r = run(*EAGLE3, "--format", "json", "--format", "yaml")
    assert r.output.startswith("# --- json ---\n{") and "# --- yaml ---\nmodel: M\n" in r.output


@pytest.mark.parametrize("text,code", [
    ("speculative_config: 5\nenable_iter_perf_stats: true\n", 1),
    ("speculative-config: [1, 2]\nmodel: M\n", 1),
    ('{"method": 5, "num_speculative_tokens": 3}', 1),
    ('{"method": "ngram", "num_speculative_tokens": "3"}', 1),
    ("speculative_config:\n  decoding_type: NGram\n  max_draft_len: x\n"
     "  draft_len_schedule: abc\n", 1),
    ("speculative_config:\n  decoding_type: 7\n", 1),
    ("python -m vllm.entrypoints.openai.api_server --model M --speculative-config {bad\n", 1),
    ("- a\n- b\n", 2),
    ("apiVersion: apps/v1\nkind: Deployment\nspec: {template: {spec: {containers: [{}]}}}\n", 2),
])
def test_malformed_files_never_trace_back(tmp_path, text, code):
    f = tmp_path / "f.yaml"
    f.write_text(text)
    for sub in ("validate", "explain"):
        r = run("config", sub, str(f))
        assert r.exception is None or isinstance(r.exception, SystemExit), r.output
        assert "Traceback" not in r.output
    assert run("config", "validate", str(f)).exit_code == code


@pytest.mark.parametrize("backend, args, note", [
    ("trtllm", ["--format", "argv"], "note: the command reads trtllm-config.yaml: write it with --format yaml "
                                     "(or --out DIR)"),
    ("trtllm", ["--nodes", "2", "--tp", "2", "--format", "slurm"], "note: the script reads trtllm-config.yaml from the submit "
                                                      "directory: write it with --format yaml (or --out DIR)"),
    ("trtllm", ["--format", "argv", "--format", "yaml"], None),
    ("vllm", ["--format", "argv"], None),
])
def test_a_printed_file_that_reads_another_says_which(backend, args, note):
    r = run("config", "--backend", backend, "--target", "M", "--method", "ngram", "--k", "3", "--ngram-max", "4",
            *args)
    assert r.exit_code == 0, r.output
    notes = [line for line in r.stderr.splitlines() if line.startswith("note: ")]
    assert notes == ([note] if note else [])


@pytest.mark.parametrize("backend, fmt, written", [
    ("trtllm", "argv", ["serve.sh", "trtllm-config.yaml"]),
    ("vllm", "argv", ["serve.sh"]),
])
def test_a_written_file_that_reads_another_is_written_with_it(tmp_path, backend, fmt, written):
    r = run("config", "--backend", backend, "--target", "M", "--method", "ngram", "--k", "3", "--ngram-max", "4",
            "--format", fmt, "--out", str(tmp_path))
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in tmp_path.iterdir()) == written

"""`specadapt tune`'s bad input: one line on stderr, exit 2, before any server starts."""

from __future__ import annotations

import contextlib
import json

import pytest
from click.testing import CliRunner

from specadapt.adapters.vllm import VLLMBackend
from specadapt.cli import cli

NGRAM = json.dumps({"method": "ngram", "k": 4})


@pytest.fixture(autouse=True)
def _no_server_starts(tmp_path, monkeypatch):
    """Nothing may start: a launch fails the test."""
    monkeypatch.setenv("SPECADAPT_CACHE_DIR", str(tmp_path / "cache"))

    @contextlib.contextmanager
    def launched_many(self, opts_list, **kw):
        raise AssertionError("a server was started")
        yield  # pragma: no cover

    monkeypatch.setattr(VLLMBackend, "launched_many", launched_many)


def error_lines(tmp_path, *args: str) -> list[str]:
    result = CliRunner().invoke(cli, ["tune", "--out", str(tmp_path / "out"), *args])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert result.exit_code == 2, result.output
    assert not (tmp_path / "out").exists()
    return [ln for ln in result.output.splitlines() if ln.startswith(("error: ", "Error: "))]


def prompts(tmp_path, n: int) -> str:
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"say {i}"}) + "\n" for i in range(n)))
    return str(path)


def test_needs_the_base_config(tmp_path):
    (line,) = error_lines(tmp_path)
    assert line.startswith("error: tune needs --spec-config: the base speculative config")


@pytest.mark.parametrize("ks, why", [
    ("a,2", "give draft lengths as comma-separated integers or ranges, e.g. 0,2,4 or 0-4"),
    ("-1,2", "give draft lengths as comma-separated integers or ranges, e.g. 0,2,4 or 0-4"),
    ("4-2", "the range 4-2 is empty: write it low-high, e.g. 0-4"),
    ("0", "give at least one draft length above 0 to measure")])
def test_bad_k(tmp_path, ks, why):
    (line,) = error_lines(tmp_path, "--spec-config", NGRAM, "--k", ks)
    assert line == f"error: --k {ks!r}: {why}"


def test_a_workload_too_small_for_intervals_says_how_many_are_needed(tmp_path):
    (line,) = error_lines(tmp_path, "--spec-config", NGRAM, "--prompts", prompts(tmp_path, 2),
                          "--concurrency", "1,4", "--repeat", "3")
    assert line.startswith("error: ") and "--concurrency 4 gives 3 units" in line and "need 5" in line
    assert "--repeat 5" in line
    (line,) = error_lines(tmp_path, "--spec-config", NGRAM, "--prompts", prompts(tmp_path, 2),
                          "--concurrency", "1", "--repeat", "2")
    assert "4 units" in line and "need 5" in line


def test_ngram_windows_need_ngram(tmp_path, embedded_dir):
    spec = json.dumps({"method": "draft_model", "k": 4, "draft": embedded_dir})
    (line,) = error_lines(tmp_path, "--spec-config", spec, "--ngram-max", "2,4")
    assert line == "error: --ngram-max is for n-gram speculation; the base config's method is draft_model"


def test_a_k_the_backend_refuses_is_caught_before_anything_starts(tmp_path, mtp_target):
    """An MTP target with 2 prediction layers: vLLM refuses k=3 (not <= 2 nor a multiple of 2)."""
    spec = json.dumps({"method": "mtp", "k": 2})
    (line,) = error_lines(tmp_path, "--model", mtp_target, "--spec-config", spec, "--k", "0,2,3,4",
                          "--prompts", prompts(tmp_path, 5), "--concurrency", "1", "--repeat", "1")
    assert line.startswith("error: ") and "k=3" in line and "2 MTP layers" in line


@pytest.mark.parametrize("schedule, why", [
    ("[[2, 4, 4]]", "The first batch-size range must start at 1"),
    ("[[1, 4, 4], [3, 8, 2]]", "overlaps the previous range"),
    ("[[1, 4, 8]]", "drafts up to k=8, which --k does not measure: add 8 to --k"),
    ("{not json", "is not JSON"),
])
def test_bad_schedule(tmp_path, schedule, why):
    (line,) = error_lines(tmp_path, "--spec-config", NGRAM, "--k", "0,2,4", "--schedule", schedule)
    assert line.startswith("error: --schedule") and why in line


def test_a_backend_whose_launch_takes_no_schedule_needs_a_verify_url(tmp_path):
    (line,) = error_lines(tmp_path, "--backend", "trtllm", "--model", "m", "--spec-config", NGRAM,
                          "--prompts", prompts(tmp_path, 5), "--concurrency", "1", "--repeat", "1")
    assert line == ("error: tune starts the verification server with a per-batch-size schedule, which backend "
                    "trtllm does not take: give --verify-url of a running server with the emitted config, or "
                    "--no-verify")


@pytest.fixture
def embedded_dir(tmp_path) -> str:
    d = tmp_path / "draft"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"vocab_size": 10, "hidden_size": 8}))
    return str(d)


@pytest.fixture
def mtp_target(tmp_path) -> str:
    d = tmp_path / "mtp-target"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"num_nextn_predict_layers": 2, "max_position_embeddings": 4096,
                                               "vocab_size": 10, "hidden_size": 8}))
    return str(d)


def test_dtype_auto_is_resolved_before_the_servers_start(tmp_path, monkeypatch, embedded_dir):
    from specadapt.errors import UsageError
    from specadapt.orchestration import servers
    from specadapt.records import HardwareInfo

    monkeypatch.setattr(servers, "local_hardware", lambda source: HardwareInfo(source=source, cpu_model="AMD EPYC",
                                                                               cpu_flags=["avx2"]))
    started = []

    @contextlib.contextmanager
    def launched_many(self, opts_list, **kw):
        started.extend(o.dtype for o in opts_list)
        raise UsageError("stop before any request")
        yield  # pragma: no cover

    monkeypatch.setattr(VLLMBackend, "launched_many", launched_many)
    result = CliRunner().invoke(cli, ["tune", "--out", str(tmp_path / "out"), "--model", embedded_dir,
                                      "--spec-config", NGRAM, "--k", "2",
                                      "--prompts", prompts(tmp_path, 5), "--concurrency", "1", "--repeat", "1",
                                      "--dtype", "auto"])
    assert result.exit_code == 2, result.output
    assert ("dtype auto: float32 (this CPU (AMD EPYC) has no AVX512-BF16 or AMX: bfloat16 would be emulated, so "
            "float32)") in result.stderr.splitlines()
    assert started == ["float32"], result.output


# --- --until-decided: refused in one line as compare refuses it ----------------------------------------------

@pytest.mark.parametrize("args, line", [
    (["--until-decided", "--max-units", "3"],
     "error: --max-units 3 cannot decide: the rule needs at least 6 units (at --alpha 0.05)"),
    (["--max-units", "12"], "error: --max-units belongs to --until-decided: add --until-decided, or leave them out"),
    (["--alpha", "0.1", "--equivalence-margin", "0.05"],
     "error: --equivalence-margin, --alpha belong to --until-decided: add --until-decided, or leave them out"),
    (["--until-decided", "--equivalence-margin", "1.5"],
     "error: --equivalence-margin 1.5: give a margin between 0 and 1, exclusive (0.05 for +-5%)"),
])
def test_the_rule_options_are_refused_in_one_line(tmp_path, args, line):
    assert error_lines(tmp_path, "--spec-config", NGRAM, *args) == [line]


def test_the_rule_decides_on_the_objective_with_the_options_given():
    from specadapt.commands.tune import sequential_design

    kw = dict(until_decided=True, max_units=12, equivalence_margin=0.05, alpha=0.02, objective="e2e")
    design = sequential_design(kw)
    assert (design.primary, design.max_units, design.margin, design.alpha) == ("e2e", 12, 0.05, 0.02)
    plain = sequential_design(dict(until_decided=True, max_units=None, equivalence_margin=None, alpha=None,
                                   objective="tpot"))
    assert (plain.primary, plain.max_units, plain.margin, plain.alpha) == ("tpot", 40, None, 0.05)
    assert sequential_design(dict(until_decided=False, objective="tpot")) is None

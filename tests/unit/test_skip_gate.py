"""The CI skip gate (tests/skip_gate.py, wired in tests/conftest.py), run for real: an inner
pytest session in a temporary folder holding the suite's own conftest.py and skip_gate.py and a
test file that skips."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import skip_gate

TESTS = Path(__file__).resolve().parents[1]

SKIPS = '''
import pytest

def test_checks_something():
    assert 1 + 1 == 2

def test_model_missing():
    pytest.skip("embedded model not fetched at /somewhere")
'''

GPU_SKIP = '''
import pytest

def test_checks_something():
    assert 1 + 1 == 2

@pytest.mark.skipif(True, reason="needs CUDA")
def test_on_cuda():
    pass
'''

MODULE_SKIP = '''
import pytest
pytest.importorskip("no_such_module_anywhere")

def test_never_collected():
    pass
'''


def inner_session(tmp_path: Path, body: str, ci: str | None) -> subprocess.CompletedProcess:
    for name in ("conftest.py", "skip_gate.py"):
        shutil.copy(TESTS / name, tmp_path / name)
    (tmp_path / "test_inner.py").write_text(body)
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    if ci is not None:
        env["CI"] = ci
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
                           str(tmp_path)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("ci", ["true", "1", "TRUE", "yes"])
def test_an_unexpected_skip_fails_a_ci_run(tmp_path, ci):
    proc = inner_session(tmp_path, SKIPS, ci)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "1 passed, 1 skipped" in proc.stdout
    assert "error: 1 test(s) skipped that CI does not expect to skip" in proc.stdout
    assert "test_inner.py::test_model_missing: embedded model not fetched at /somewhere" in proc.stdout


@pytest.mark.parametrize("ci", [None, "", "false", "0"])
def test_outside_ci_a_skip_is_only_reported(tmp_path, ci):
    proc = inner_session(tmp_path, SKIPS, ci)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 passed, 1 skipped" in proc.stdout and "does not expect" not in proc.stdout


def test_an_expected_skip_passes_a_ci_run(tmp_path):
    proc = inner_session(tmp_path, GPU_SKIP, "true")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 passed, 1 skipped" in proc.stdout and "does not expect" not in proc.stdout


def test_a_module_skipped_at_collection_fails_a_ci_run(tmp_path):
    proc = inner_session(tmp_path, MODULE_SKIP, "true")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "could not import 'no_such_module_anywhere'" in proc.stdout and "does not expect" in proc.stdout


def test_a_failing_run_keeps_its_own_exit_code(tmp_path):
    body = SKIPS + "\ndef test_fails():\n    assert False\n"
    proc = inner_session(tmp_path, body, "true")
    assert proc.returncode == 1 and "1 failed" in proc.stdout and "does not expect" in proc.stdout


def test_skip_reasons_and_the_allow_list():
    assert skip_gate.skip_reason(("f.py", 3, "Skipped: needs CUDA")) == "needs CUDA"
    assert skip_gate.skip_reason("odd") == "odd"
    skips = [skip_gate.Skip("a", "needs CUDA"), skip_gate.Skip("b", "chromium is not installed")]
    assert skip_gate.unexpected(skips) == [skips[1]]
    assert skip_gate.unexpected(skips, []) == skips
    assert skip_gate.ci_enabled({"CI": " True "}) and not skip_gate.ci_enabled({})

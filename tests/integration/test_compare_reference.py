"""equiv against the reference server with injected faults: each must be judged as it is."""

from __future__ import annotations

import pytest

from test_compare_vllm import CAPITAL, COPY, REVERSE, equiv, prompts_file

pytestmark = pytest.mark.integration


def test_accept_always_fault_is_suspect_and_fails_the_gate(tmp_path, reference_servers):
    s = reference_servers
    proc, report, _ = equiv(tmp_path, s["off"], s["accept_always"], prompts_file(tmp_path, COPY, REVERSE, CAPITAL),
                            "--dtype", "float32", max_tokens=32)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert report["on_server"]["spec_enabled"] is True and report["off_server"]["spec_enabled"] is False
    diverged = [p for p in report["identity"] if p["divergence"]]
    assert diverged, "accept-always changed no output: the fault or the check is broken"
    for p in diverged:  # where the fault changes the text, the margin is far above any noise
        assert p["verdict"] == "suspect", p
        assert p["divergence"]["triage"]["margin"] >= p["divergence"]["triage"]["threshold"]


def test_tiny_logit_noise_gives_only_near_ties(tmp_path, reference_servers):
    s = reference_servers
    # noise of sd 0.1 per logit on the verify pass: flips only where the margin is a few tenths
    proc, report, _ = equiv(tmp_path, s["off"], s["perturb"], prompts_file(tmp_path, COPY, REVERSE, CAPITAL),
                            "--near-tie-threshold", "0.6", max_tokens=48)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert report["counts"]["suspect"] == 0 and report["counts"]["unknown"] == 0
    assert report["counts"]["near-tie"] >= 1, report["counts"]  # the noise did flip something
    for p in report["identity"]:
        if p["divergence"]:
            assert abs(p["divergence"]["triage"]["margin"]) < 0.6


def test_a_different_model_is_suspect(tmp_path, reference_servers):
    s = reference_servers
    proc, report, _ = equiv(tmp_path, s["off"], s["other_model"], prompts_file(tmp_path, REVERSE, CAPITAL),
                            "--dtype", "float32", max_tokens=24)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert report["counts"]["suspect"] >= 1
    assert any("different model ids" in n for n in report["notes"])

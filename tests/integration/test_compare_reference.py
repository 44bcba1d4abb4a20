"""equiv against the reference server with injected faults: each must be judged as it is."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time

import psutil
import pytest
from test_compare_vllm import CAPITAL, COPY, REVERSE, equiv, prompts_file

pytestmark = pytest.mark.integration

NGRAM_K4 = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 4}


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


def _servers_alive(root: psutil.Process) -> list[psutil.Process]:
    """`specadapt reference serve` processes under the compare process."""
    found = []
    try:
        for child in root.children(recursive=True):
            try:
                cmd = child.cmdline()
            except (psutil.NoSuchProcess, psutil.ZombieProcess):
                continue
            if "reference" in cmd and "serve" in cmd:
                found.append(child)
    except psutil.NoSuchProcess:
        pass
    return found


def test_sequential_launch_runs_one_server_at_a_time_and_stops_both(tmp_path, truncated_model):
    """compare --launch sequential: spec-on server alone, then spec-off alone (kept up for triage)."""
    out = tmp_path / "report.json"
    argv = [sys.executable, "-m", "specadapt", "compare", "--backend", "reference", "--model", truncated_model,
            "--spec-config", json.dumps(NGRAM_K4), "--launch", "sequential", "--dtype", "float32",
            "--prompts", str(prompts_file(tmp_path, COPY, CAPITAL)), "--repeat", "1", "--warmup", "0",
            "--max-tokens", "16", "--startup-timeout", "300", "--json", str(out)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    root = psutil.Process(proc.pid)
    seen: dict[int, tuple[float, bool]] = {}  # pid -> (create time, spec on)
    most_at_once = 0
    while proc.poll() is None:
        alive = _servers_alive(root)
        most_at_once = max(most_at_once, len(alive))
        for p in alive:
            with contextlib.suppress(psutil.Error):
                seen.setdefault(p.pid, (p.create_time(), "--ngram" in p.cmdline()))
        time.sleep(0.05)
    stdout, stderr = proc.communicate()
    assert proc.returncode == 0, stdout + stderr
    assert most_at_once == 1, f"{most_at_once} reference servers ran at once"
    order = [on for _, on in sorted(seen.values())]
    assert order == [True, False], f"servers started in this order (spec on?): {order}"
    assert stderr.index("starting spec-on server") < stderr.index("starting spec-off server")
    gone = psutil.wait_procs([psutil.Process(pid) for pid in seen if psutil.pid_exists(pid)], timeout=10)[1]
    assert not gone, f"servers left running: {[p.pid for p in gone]}"
    report = json.loads(out.read_text())
    assert report["settings"]["interleaved"] is False
    assert report["on_server"]["spec_enabled"] is True and report["off_server"]["spec_enabled"] is False
    sides = sorted(r["side"] for r in report["requests"])
    assert sides == ["off", "off", "on", "on"], sides
    assert report["counts"]["suspect"] == 0, [p["verdict"] for p in report["identity"]]

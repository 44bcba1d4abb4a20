"""tune interrupted mid-sweep (a real subprocess against the scripted server, whose requests take a
known time): exit 130 with one line, and the partial report is written, saying why."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import httpx

from specadapt.records.tune import TuneReport
from specadapt.testing import script


def test_ctrl_c_mid_sweep_keeps_the_partial_report(tmp_path, scripted_url):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "prompt": script(id=f"tune-int-{i}", ttft_ms=20, itl_ms=40,
                                                                           tokens=25)}) + "\n" for i in range(5)))
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [sys.executable, "-m", "specadapt", "tune", "--off", scripted_url, "--on", f"3={scripted_url}",
         "--verify-url", scripted_url, "--spec-config", '{"method": "ngram", "k": 3}', "--k", "0,3",
         "--concurrency", "1", "--repeat", "1", "--prompts", str(prompts), "--no-triage", "--out", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not any(k.startswith("tune-int-") for k in httpx.get(
                scripted_url + "/_script/log").json()):
            time.sleep(0.2)  # interrupt once the sweep's first request has reached the server
        proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert err.strip().splitlines()[-1] == "error: interrupted; every server this run started has been stopped"
    report = TuneReport.model_validate_json((out / "report.json").read_text())
    assert report.partial and report.partial_reason.startswith("interrupted")
    assert report.verification.status == "not run"
    assert (out / "report.html").exists() and (out / "summary.md").exists()

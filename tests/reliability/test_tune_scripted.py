"""tune against the scripted server (real subprocesses and HTTP; requests take a known time and the
counters follow the script): interrupted mid-sweep, and verified against a server that ignores the
schedule."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import httpx
import yaml

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


def test_a_server_without_the_schedule_is_caught_and_the_fixed_k_recommended(tmp_path, scripted_url):
    """The verification server drafts k=3 at every batch size (the scripted server: every chunk is
    one draft of 3, all accepted), although the schedule turns speculation off at batch size 2:
    its counters at batch size 2 are as high as the fixed k=3 run's, so the schedule was not
    applied, and the fixed k is recommended (exit 0). A deployment that lost the schedule looks so.
    The sweep and the verification send their blocks through two worker processes (--workers 2)."""
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"id": "p", "prompt": script(id="tune-honour", ttft_ms=5, itl_ms=5, tokens=8,
                                                               tokens_per_chunk=4)}) + "\n")
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "specadapt", "tune", "--off", scripted_url, "--on", f"3={scripted_url}",
         "--verify-url", scripted_url, "--spec-config", '{"method": "ngram", "k": 3}', "--k", "0,3",
         "--concurrency", "1,2", "--repeat", "5", "--warmup", "0", "--max-tokens", "8", "--prompts", str(prompts),
         "--no-triage", "--schedule", "[[1, 1, 3], [2, 2, 0]]", "--workers", "2", "--out", str(out)],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    report = TuneReport.model_validate_json((out / "report.json").read_text())
    assert report.settings.workers == 2
    compares = [c.compare for c in report.candidates if c.compare is not None]
    assert compares and all(cmp.settings.workers == 2 for cmp in compares)
    ver = report.verification
    assert [lv.scheduled_k for lv in ver.levels] == [3, 0]
    assert ver.levels[0].honour.verdict == "not applicable"
    honour = ver.levels[1].honour
    assert honour.verdict == "not honoured" and honour.ratio > 0.8, honour.reason
    assert ver.honoured == "not honoured"
    rec = report.recommendation
    assert rec.form == "schedule" and not rec.verified and "did not honour" in rec.summary
    assert (out / "vllm-fixed-k.json").exists() == bool(rec.fixed_fallback_k)
    vllm_cfg = json.loads((out / "vllm-speculative-config.json").read_text())
    assert vllm_cfg["num_speculative_tokens_per_batch_size"] == [[1, 1, 3], [2, 2, 0]]
    trt = yaml.safe_load((out / "trtllm-config.yaml").read_text())["speculative_config"]
    assert trt["max_draft_len"] == 3 and trt["max_concurrency"] == 1  # on/off only: TensorRT-LLM's cut-off
    assert "draft_len_schedule" not in trt

"""`specadapt tune` against the vLLM CPU build, whose scheduler applies the per-batch-size
schedule (a server that does not is caught in tests/reliability/test_tune_scripted.py).

The run is the small sweep k in {0, 4} at concurrency 1 and 2 (1 prompt x 5 repeats, 8 tokens)
on the session's servers. ``--schedule [[1, 1, 4], [2, 2, 2]]`` makes the verified configuration
a schedule whatever the sweep chooses on a loaded machine, so that the honour check has a batch
size (2) where fewer drafts are due; the verification server is the session's one started with
that schedule (``--verify-url``: a server started the way tune starts its own, through the same
launch options, and the suite starts one vLLM server fewer)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from test_compare_vllm import COPY, prompts_file

from specadapt.records.tune import TuneReport

pytestmark = pytest.mark.integration

SCHEDULE = [[1, 1, 4], [2, 2, 2]]


def tune(tmp_path: Path, *args: str, ks: str = "0,2,4", schedule=SCHEDULE
         ) -> tuple[subprocess.CompletedProcess, TuneReport | None, Path]:
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "specadapt", "tune", "--k", ks, "--concurrency", "1,2",
                           "--repeat", "5", "--warmup", "0", "--max-tokens", "8",
                           "--prompts", str(prompts_file(tmp_path, COPY)), "--schedule", json.dumps(schedule),
                           "--out", str(out), *args], capture_output=True, text=True, timeout=900)
    path = out / "report.json"
    return proc, (TuneReport.model_validate_json(path.read_text()) if path.exists() else None), out


def check_sweep(report: TuneReport, out: Path, ks=(0, 2, 4), schedule=SCHEDULE) -> dict:
    """What every finished tune run must hold, whatever the machine's speed; the TensorRT-LLM
    speculative_config."""
    by_k = {c.k: c for c in report.candidates}
    assert sorted(by_k) == list(ks) and by_k[0].status == "baseline"
    for k in ks[1:]:
        c = by_k[k]
        assert c.status == "measured", c.error
        assert [lv.concurrency for lv in c.compare.levels] == [1, 2]
        # 1 prompt x 5 repeats at 1; at 2 each block holds >= 2N = 4 requests: 4 copies x 5 repeats
        assert [lv.pairs for lv in c.compare.levels] == [5, 20]
        for lv in c.compare.levels:
            assert lv.acceptance.known and len(lv.acceptance.per_position_rate) == k
            assert lv.speed.tpot.low is not None  # 5 units at each level: an interval
    assert [f.concurrency for f in report.fits] == [1, 2] and all(len(f.points) == len(ks) - 1 for f in report.fits)
    assert [ch.concurrency for ch in report.choices] == [1, 2]
    rec = report.recommendation
    assert rec.form == "schedule" and [list(r) for r in rec.schedule] == schedule and rec.k == 4
    vllm_cfg = json.loads((out / "vllm-speculative-config.json").read_text())
    assert vllm_cfg["num_speculative_tokens"] == 4
    assert vllm_cfg["num_speculative_tokens_per_batch_size"] == schedule
    trt = yaml.safe_load((out / "trtllm-config.yaml").read_text())["speculative_config"]
    assert trt["max_draft_len"] == 4
    html = (out / "report.html").read_text()
    assert html.count("<img") == 3 and 'src="http' not in html and 'href="http' not in html
    ver = report.verification
    assert ver.status in ("passed", "failed") and ver.compare is not None
    assert [lv.concurrency for lv in ver.levels] == [1, 2]
    assert [lv.scheduled_k for lv in ver.levels] == [schedule[0][2], schedule[1][2]]
    assert ver.levels[0].honour.verdict == "not applicable"  # batch size 1 drafts the engine's k
    assert ver.suspect == 0
    return trt


def test_vllm_cpu_build_applies_the_schedule_and_tune_verifies_it(tmp_path, vllm_off, vllm_ngram,
                                                                   vllm_ngram_schedule):
    """The vLLM 0.32 scheduler (shared by the CPU and GPU builds) reads
    num_speculative_tokens_per_batch_size: at batch size 2 the server drafts 2 tokens, not 4."""
    proc, report, out = tune(tmp_path, "--off", vllm_off.base_url, "--on", f"4={vllm_ngram.base_url}",
                             "--verify-url", vllm_ngram_schedule.base_url,
                             "--spec-config", json.dumps({"method": "ngram", "k": 4, "ngram_min": 2, "ngram_max": 4}),
                             ks="0,4")
    assert report is not None, proc.stderr
    trt = check_sweep(report, out, ks=(0, 4))
    assert trt["draft_len_schedule"][1] == 4 and sorted(trt["draft_len_schedule"].values()) == [2, 4]
    honour = report.verification.levels[1].honour
    assert honour.verdict == "honoured", honour.reason
    assert honour.schedule_rate < 0.5 * honour.fixed_rate
    assert report.verification.honoured == "honoured"
    # the verified server took the schedule on its command line, as tune writes it for a server it starts
    assert any("num_speculative_tokens_per_batch_size" in a for a in vllm_ngram_schedule.launch.spec_args)
    # exit 0 when verified, 1 when a level was slower than the best fixed k: both say so
    assert proc.returncode == (0 if report.verification.status == "passed" else 1), proc.stderr
    assert report.recommendation.verified == (report.verification.status == "passed")

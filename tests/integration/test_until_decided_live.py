"""Run until decided, live on the suite's vLLM servers (float32, the spec-off and the n-gram server on
halves of the CPUs of their own).

n-gram on input-grounded prompts (answers that copy the prompt) is faster by far: the rule decides
"faster" before its cap. One spec-on server given as both sides (an A/A: speculation present, so a
speed verdict is computed, and nothing differs) must reach no verdict: the anytime-valid interval
keeps its false-alarm rate (at most alpha, looked at after every pair); a run with a false verdict
is run again, as the fixed-design A/A does (tests/aa_verdict.py): three in a row at alpha 0.05
would come about once in 10^4 runs of correct intervals.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from test_compare_vllm import COPY, prompts_file

pytestmark = pytest.mark.integration

GROUNDED = [
    COPY,
    {"id": "repeat-list", "category": "grounded", "messages": [{"role": "user", "content":
     "Repeat this list exactly, one item per line:\nalpha beta gamma delta\nepsilon zeta eta theta\n"
     "iota kappa lambda mu"}]},
]
CAP = 30
ATTEMPTS = 3


def until_decided(tmp_path, off, on, name: str, *extra: str) -> tuple[dict, str]:
    out = tmp_path / f"{name}.json"
    proc = subprocess.run([sys.executable, "-m", "specadapt", "compare", "--off", off.base_url, "--on", on.base_url,
                           "--prompts", str(prompts_file(tmp_path, *GROUNDED)), "--max-tokens", "32",
                           "--until-decided", "--max-units", str(CAP), "--no-triage", "--no-interference-check",
                           "--json", str(out), *extra], capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(out.read_text()), proc.stdout


@pytest.mark.timed
def test_ngram_on_grounded_prompts_is_decided_faster_before_the_cap(tmp_path, vllm_off, vllm_ngram):
    report, printed = until_decided(tmp_path, vllm_off, vllm_ngram, "ngram")
    (level,) = report["levels"]
    outcome = level["sequential"]
    assert outcome["verdict"] == "faster" and outcome["stopped"] == "decided", outcome
    assert outcome["units"] < CAP and outcome["requests"] == 2 * outcome["units"]
    tpot = level["speed"]["tpot"]
    assert tpot["method"] == "cs" and tpot["low"] > 1.0 and tpot["n"] == outcome["units"]
    assert outcome["interval"]["low"] == tpot["low"]
    assert "faster" in printed


@pytest.mark.timed
def test_one_server_against_itself_reaches_no_verdict(tmp_path, vllm_ngram_fp32):
    outcomes = []
    for attempt in range(ATTEMPTS):
        report, _ = until_decided(tmp_path, vllm_ngram_fp32, vllm_ngram_fp32, f"aa-{attempt}", "--max-units", "12")
        (level,) = report["levels"]
        outcome = level["sequential"]
        outcomes.append(outcome)
        assert report["on_server"]["spec_enabled"] is True  # a verdict is computed, not withheld
        if outcome["verdict"] == "no clear difference":
            break
    assert outcome["verdict"] == "no clear difference" and outcome["stopped"] == "cap", outcomes
    assert outcome["units"] == 12
    assert level["speed"]["tpot"]["low"] <= 1.0 <= level["speed"]["tpot"]["high"]

"""compare / equiv end to end against real vLLM CPU servers (shared per session)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from junitparser import JUnitXml

pytestmark = pytest.mark.integration

# Prompts whose greedy text differed between a bfloat16 and a float32 server on the vLLM CPU
# build (eager and compiled alike), e.g. "calculus that is based on function" against "calculus
# that deals with functions".
PRECISION = [
    {"id": "completion-open", "category": "qa", "prompt": "The three most important ideas in computer science are"},
    {"id": "lighthouse", "category": "open", "messages": [{"role": "user", "content":
     "Write a short story about a lighthouse keeper who finds a message in a bottle."}]},
    {"id": "water-cycle", "category": "open", "messages": [{"role": "user", "content": "Describe the water cycle in detail."}]},
]
REVERSE = {"id": "reverse-string", "category": "open",
           "messages": [{"role": "user", "content": "Write a Python function that reverses a string, then explain it."}]}
CAPITAL = {"id": "capital", "category": "open",
           "messages": [{"role": "user", "content": "What is the capital of France?"}]}
COPY = {"id": "copy-code", "category": "grounded", "messages": [{"role": "user", "content":
        "Copy the following code exactly, adding a docstring to each function:\n\n"
        "def add(x, y):\n    return x + y\n\ndef sub(x, y):\n    return x - y"}]}


def prompts_file(tmp_path: Path, *rows) -> Path:
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def equiv(tmp_path, off, on, prompts: Path, *extra, max_tokens=40, concurrency: str | None = "1"):
    """``concurrency`` None: equiv's own default levels (each prompt alone and in batches of 4)."""
    out = tmp_path / "out"
    levels = ["--concurrency", concurrency] if concurrency else []
    proc = subprocess.run([sys.executable, "-m", "specadapt", "equiv", "--off", off.base_url, "--on", on.base_url,
                           "--prompts", str(prompts), "--repeat", "1", "--max-tokens", str(max_tokens), *levels,
                           "--no-interference-check", "--out", str(out), *extra], capture_output=True, text=True, timeout=900)
    report = json.loads((out / "report.json").read_text()) if (out / "report.json").exists() else None
    return proc, report, out


def test_precision_divergence_is_found_and_triaged_as_a_near_tie(tmp_path, vllm_off_bf16, vllm_ngram_fp32,
                                                                  embedded_model):
    """A bfloat16 spec-off server against a float32 spec-on one: the texts part where the top two
    tokens are nearly tied, which triage must call a near-tie (not a fault). (A bfloat16 pair that
    differs in speculation only gave identical text on this build: 13 prompts x 128 tokens; with
    --enforce-eager so did this pair on two of the prompts that part when compiled.)"""
    proc, report, out = equiv(tmp_path, vllm_off_bf16, vllm_ngram_fp32, prompts_file(tmp_path, *PRECISION),
                              "--dtype", "bfloat16", "--reference", embedded_model, max_tokens=64)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    verdicts = {i["prompt_id"]: i["verdict"] for i in report["identity"]}
    diverged = [i for i in report["identity"] if i["verdict"] != "identical"]
    assert diverged, verdicts
    assert {i["verdict"] for i in diverged} == {"near-tie"}, verdicts
    assert report["counts"]["near-tie"] == len(diverged) and report["counts"]["suspect"] == 0
    for ident in diverged:
        d = ident["divergence"]
        assert d["off_context"] != d["on_context"]
        t = d["triage"]
        assert t["source"] == "reference-float64"
        assert abs(t["reference_margin"]) < t["threshold"]
        assert t["server_margin"] is not None and abs(t["server_margin"]) < t["threshold"]
    assert "NEAR-TIE at token" in proc.stdout and "margin" in proc.stdout
    # every output format was written and says the same
    assert "**near-tie**" in (out / "summary.md").read_text()
    xml = JUnitXml.fromfile(str(out / "junit.xml"))
    cases = [c for suite in (xml if xml._tag == "testsuites" else [xml]) for c in suite]
    prompts = [c for c in cases if c.classname.startswith("specadapt.identity.")]
    assert sorted(c.name for c in prompts) == sorted(p["id"] for p in PRECISION)
    # beside the prompts, what the gate certifies: speculation ran, the configuration is lossless, the bound
    certify = [c.name for c in cases if not c.classname.startswith("specadapt.identity.")]
    assert sorted(certify) == ["lossless-config", "speculation-ran", "suspect-rate"]
    assert not any(c.result for c in cases)
    html = (out / "report.html").read_text()
    assert "near-tie" in html and html.count("<svg") >= 3


def test_sampling_on_the_spec_side_is_suspect_and_fails_the_gate(tmp_path, vllm_off, vllm_ngram):
    proc, report, out = equiv(tmp_path, vllm_off, vllm_ngram, prompts_file(tmp_path, REVERSE, CAPITAL, COPY),
                              "--dtype", "float32", "--on-temperature", "1.5", max_tokens=32)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert report["counts"]["suspect"] >= 1
    assert not report["gate"]["passed"]
    assert "gate: FAIL" in proc.stdout
    xml = JUnitXml.fromfile(str(out / "junit.xml"))
    cases = [c for suite in (xml if xml._tag == "testsuites" else [xml]) for c in suite]
    assert sum(1 for c in cases if c.result) == report["counts"]["suspect"] + report["counts"]["unknown"]


def test_concurrency_sweep_reports_acceptance_per_level(tmp_path, vllm_off, vllm_ngram):
    out = tmp_path / "r.json"
    proc = subprocess.run([sys.executable, "-m", "specadapt", "compare", "--off", vllm_off.base_url,
                           "--on", vllm_ngram.base_url, "--prompts", str(prompts_file(tmp_path, COPY, CAPITAL)),
                           "--concurrency", "1,4", "--repeat", "2", "--max-tokens", "24", "--no-triage",
                           "--no-interference-check", "--json", str(out)], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(out.read_text())
    levels = {lv["concurrency"]: lv for lv in report["levels"]}
    assert sorted(levels) == [1, 4]
    # level 1: 2 repeats x 2 prompts; level 4: each block holds >= 2N = 8 requests, so 4 copies
    assert levels[1]["pairs"] == 4 and levels[4]["pairs"] == 2 * 2 * 4
    for lv in levels.values():
        assert lv["acceptance"]["known"] and 0 <= lv["acceptance"]["acceptance_rate"] <= 1
        thr = lv["speed"]["throughput"]  # 4 pairs at 1, 2 blocks at 4: fewer than the 5 units an interval needs
        assert thr["too_few"] and thr["low"] is None and thr["point"] > 0
    assert report["crossover"]["status"] == "no-clear-difference"
    assert "load:" in proc.stdout

"""equiv --sampling against real servers: healthy samplers pass, broken ones are caught.

Reference servers (`specadapt reference serve`, float32, CPU): healthy n-gram k=4 against the
spec-off server passes (also with --reference, p in float64 and the local tokenizer); the
sampler faults residual-p, bonus-previous and draft-temperature=0.5 fail (exit 1).

vLLM 0.32.0 CPU build, float32: its spec-off server sampled and scored by itself passes. Its
n-gram k=4 server does not sample the target distribution at temperature 1, and the check
says so (test_vllm_ngram_cpu_build_is_caught below): the fix on vLLM's side turns that test
into the healthy-pair test.

The prompts make n-gram drafts frequent (repeating text), so the sampler runs at most
positions. Budgets: the tokens below; how often each fault is caught at its budget, and how
often a healthy run fails, is measured by benchmarks/sampling_false_alarm.py (docs/sampling.md).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ABC = {"id": "abc", "category": "repetitive", "prompt": "a b c d e f g a b c d e f g a b c d e f g a b c d e f g a b"}
COUNT = {"id": "count", "category": "repetitive",
         "prompt": "1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2,"}
REPEAT_LINE = {"id": "repeat-line", "category": "grounded", "messages": [
    {"role": "user", "content": "Repeat this line five times: The quick brown fox jumps over the lazy dog."}]}
COPY_CODE = {"id": "copy-code", "category": "grounded", "messages": [{"role": "user", "content":
             "Copy the following code exactly, adding a docstring to each function:\n\n"
             "def add(x, y):\n    return x + y\n\ndef sub(x, y):\n    return x - y"}]}


def sampling_equiv(tmp_path: Path, on, rows, samples: int, *extra: str, off=None, max_tokens: int = 32):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "report.json"
    argv = [sys.executable, "-m", "specadapt", "equiv", "--sampling", "--on", on.base_url,
            *(["--off", off.base_url] if off is not None else []), "--prompts", str(prompts),
            "--samples", str(samples), "--max-tokens", str(max_tokens), "--concurrency", "16", "--json", str(out),
            *extra]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=900)
    report = json.loads(out.read_text()) if out.exists() else None
    return proc, report


def test_healthy_ngram_passes_and_exercised_speculation(tmp_path, reference_servers, sampling_reference_servers):
    proc, report = sampling_equiv(tmp_path, sampling_reference_servers["ngram"], (ABC, COUNT), 8,
                                  off=reference_servers["off"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert report["stats"]["status"] == "consistent" and report["gate"]["passed"]
    assert report["stats"]["n_tokens"] == 2 * 8 * 32
    acc = report["acceptance"]
    assert acc["known"] and acc["accepted_tokens"] > 0 and acc["drafts"] > 0, acc
    assert report["on_server"]["spec_enabled"] is True and report["source_server"]["spec_enabled"] is False
    assert "gate: PASS" in proc.stdout


@pytest.mark.parametrize("fault, rows, samples", [
    ("residual_p", (ABC,), 16),
    ("bonus_previous", (ABC, COUNT), 6),
    ("draft_temperature", (ABC, COUNT), 4),
])
def test_sampler_faults_are_caught(tmp_path, reference_servers, sampling_reference_servers, fault, rows, samples):
    proc, report = sampling_equiv(tmp_path, sampling_reference_servers[fault], rows, samples,
                                  off=reference_servers["off"])
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert report["stats"]["status"] == "inconsistent", report["stats"]["summary"]
    assert any(t["rejected"] for t in report["stats"]["tests"])
    assert report["acceptance"]["known"] and report["acceptance"]["drafts"] > 0
    assert "gate: FAIL: the samples are not from the target distribution" in proc.stdout


def test_float64_reference_without_a_spec_off_server(tmp_path, sampling_reference_servers, embedded_model):
    """--reference: prompt ids from the local tokenizer and chat template, p recomputed in float64."""
    # float64 on the CPU is slow: one chat prompt, just over the 100 tokens the tests need
    proc, report = sampling_equiv(tmp_path, sampling_reference_servers["ngram"], (COPY_CODE,), 4,
                                  "--reference", embedded_model, max_tokens=26)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert report["stats"]["status"] == "consistent" and report["source_server"] is None
    assert report["settings"]["source"] == "reference"
    assert report["settings"]["tokenizer"] == f"the local tokenizer of {embedded_model}"
    assert report["stats"]["n_tokens"] == 4 * 26


def test_vllm_spec_off_sampled_and_scored_by_itself_passes(tmp_path, vllm_off_fp32):
    proc, report = sampling_equiv(tmp_path, vllm_off_fp32, (REPEAT_LINE, COPY_CODE), 8, off=vllm_off_fp32)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert report["stats"]["status"] == "consistent"
    assert report["stats"]["n_tokens"] == 2 * 8 * 32


def test_vllm_ngram_cpu_build_is_caught(tmp_path, vllm_off_fp32, vllm_ngram_fp32):
    """vLLM 0.32.0's CPU build does not sample the target at temperature 1 with n-gram drafts:
    its CPU replacement of the Triton `expand` kernel writes the per-token temperatures into an
    int64 copy of the float tensor (vllm/utils/cpu_triton_utils.py, _expand_kernel_impl), so the
    draft positions' target probabilities come from uninitialised temperatures, and the token
    drawn after a rejected draft is far from p. Greedy output is unaffected. When this test
    starts to fail, vLLM has fixed it: assert that the pair passes instead."""
    # the temperatures are uninitialised memory, so the damage varies from run to run: 1024 tokens
    proc, report = sampling_equiv(tmp_path, vllm_ngram_fp32, (REPEAT_LINE, COPY_CODE), 16, off=vllm_off_fp32)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert report["stats"]["status"] == "inconsistent"
    assert report["acceptance"]["known"] and report["acceptance"]["drafts"] > 0
    outside = next(c for c in report["stats"]["rank_categories"] if c["name"] == "outside top-K")
    assert outside["observed"] > outside["expected"], outside

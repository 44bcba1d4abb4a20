"""The diagnosis on real vLLM CPU servers: a float32 n-gram run and a poorly matched draft model.

Causes that rest on counts (acceptance, the draft's size) are asserted outright: greedy decoding
makes them the same on every machine. Causes that rest on time are asserted through the run's
own intervals (if the interval says slower, a cause other than "it pays" must be named), never
against a fixed speed. The pass cost is recomputed here from the saved report's raw records and
counters, independently of analysis/diagnosis.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from specadapt.orchestration.compare import draft_cost_of
from specadapt.records import CompareReport, CompareSettings

pytestmark = pytest.mark.integration

GROUNDED = [
    {"id": "copy-code", "category": "code", "messages": [{"role": "user", "content":
     "Copy the following code exactly, adding a docstring to each function:\n\n"
     "def add(x, y):\n    return x + y\n\ndef sub(x, y):\n    return x - y\n\ndef mul(x, y):\n    return x * y"}]},
    {"id": "repeat", "category": "rag", "messages": [{"role": "user", "content":
     "Repeat the following paragraph word for word: The river Elbe rises in the Krkonose mountains, flows "
     "through Dresden and Magdeburg, and reaches the North Sea at Cuxhaven after passing Hamburg."}]},
    {"id": "json-sort", "category": "code", "messages": [{"role": "user", "content":
     'Rewrite this JSON with the keys sorted alphabetically: {"zeta": 1, "alpha": 2, "mid": [1, 2, 3], '
     '"beta": {"y": 1, "x": 2}}'}]},
]


def run_compare(tmp_path: Path, off, on, *extra) -> dict:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(p) + "\n" for p in GROUNDED))
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "specadapt", "compare", "--off", off.base_url, "--on", on.base_url,
                           "--prompts", str(prompts), "--repeat", "2", "--max-tokens", "32", "--dtype", "float32",
                           "--no-triage", "--no-interference-check", "--out", str(out), *extra], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((out / "report.json").read_text())
    assert "why: " in proc.stdout and "### Why" in (out / "summary.md").read_text()
    assert "<h2>Why</h2>" in (out / "report.html").read_text()
    return report


def independent_pass_cost(report: dict, s: float) -> float:
    """(N / S - P) / D from the saved records and counters, written out again here."""
    on = [r for r in report["requests"] if r["side"] == "on" and not r["warmup"] and r["ok"]
          and r["output_tokens"] >= 2]
    n = sum(r["output_tokens"] - 1 for r in on)
    pair = report["counters_on"]["1"]
    d = pair["after"]["drafts"] - pair["before"]["drafts"]
    a = pair["after"]["accepted_tokens"] - pair["before"]["accepted_tokens"]
    p = max(0.0, n - a - d)
    return (n / s - p) / d


def causes(report: dict) -> set[str]:
    return {c["code"] for c in report["diagnosis"]["causes"]}


def check_time_causes(report: dict) -> None:
    """What the run's own TPOT interval allows to be said."""
    fig = report["diagnosis"]["levels"][0]
    tpot = fig["tpot_ratio"]
    assert fig["pass_cost"] == pytest.approx(independent_pass_cost(report, tpot["point"]), rel=1e-6)
    assert fig["pass_cost_low"] == pytest.approx(independent_pass_cost(report, tpot["high"]), rel=1e-6)
    headline = report["diagnosis"]["headline"]
    if tpot["low"] > 1:
        assert "pays" in causes(report) and headline.startswith("Spec on is faster")
    elif tpot["high"] < 1:
        assert causes(report) - {"pays"} and headline.startswith("Spec on is slower")
        assert "no single cause" not in headline
    # a pass cost whose interval lies above the threshold is called compute-bound, and only then
    threshold = report["diagnosis"]["thresholds"]["compute_bound_pass_cost"]
    draft = fig["draft_cost_per_pass"] or 0.0
    assert ("verify-compute-bound" in causes(report)) == (fig["pass_cost_low"] - draft > threshold)


def test_float32_ngram_on_grounded_prompts_is_explained(tmp_path, vllm_off_fp32, vllm_ngram_fp32):
    report = run_compare(tmp_path, vllm_off_fp32, vllm_ngram_fp32)
    fig = report["diagnosis"]["levels"][0]
    assert fig["k"] == 4 and fig["draft_cost_per_pass"] == 0.0  # n-gram: no model, no draft cost
    assert fig["acceptance_rate"] >= 0.3, fig  # prompts whose answers copy the input
    assert "low-acceptance" not in causes(report) and "draft-expensive" not in causes(report)
    check_time_causes(report)
    hw = report["on_server"]["hardware"]
    assert hw["source"].startswith("this machine") and "float32" in hw["native_dtypes"]


def test_a_poorly_matched_draft_model_is_explained(tmp_path, vllm_off_fp32, vllm_draft, truncated_model,
                                                   embedded_model):
    # the draft's own cost: its parameters over the target's, read from the started server's
    # speculative config and the two config.json (by URL, vLLM tells the draft only with
    # VLLM_SERVER_DEV_MODE=1, so the run below is given that cost as --draft-cost)
    info = vllm_draft.describe()
    assert info.spec_draft == truncated_model and info.spec_method == "draft_model"
    cost = draft_cost_of(CompareReport(settings=CompareSettings(), off_server=info, on_server=info))
    cfg = {name: json.loads((Path(d) / "config.json").read_text())
           for name, d in (("draft", truncated_model), ("target", embedded_model))}
    layers = {name: c["num_hidden_layers"] for name, c in cfg.items()}
    assert (layers["draft"], layers["target"]) == (4, 30)
    assert layers["draft"] / layers["target"] < cost.per_token < 1  # the shared embeddings count in full
    report = run_compare(tmp_path, vllm_off_fp32, vllm_draft, "--draft-cost", f"{cost.per_token:.6f}")
    fig = report["diagnosis"]["levels"][0]
    assert fig["k"] == 3 and fig["acceptance_rate"] < 0.3, fig
    assert "low-acceptance" in causes(report)
    assert fig["draft_cost_per_pass"] == pytest.approx(3 * cost.per_token, rel=1e-5)
    check_time_causes(report)
    if "draft-expensive" in causes(report):
        assert fig["draft_cost_per_pass"] >= report["diagnosis"]["thresholds"]["draft_share"] * fig["pass_cost"]

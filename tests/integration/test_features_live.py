"""equiv --features against real servers: the healthy reference passes every cell it supports,
each planted fault is caught by its own cell, and the whole matrix runs on vLLM's CPU build.

Reference servers (`specadapt reference serve`, float32, CPU, max_model_len 1024): spec off, a
healthy n-gram k=4, and one n-gram k=4 server per planted fault (feature_reference_servers).
The float64 recompute of the embedded model (--reference) is the distribution cells' source.

vLLM 0.32.0 CPU build, float32, n-gram k=4 against spec off: what it does is asserted cell by
cell where it is known (docs/features.md shows the measured matrix); the cells that fail there
are vLLM's behaviour, not the tool's (min_p and logit_bias are not applied under speculation; the
sampler's temperatures at draft positions are uninitialised memory on the CPU build).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from specadapt.analysis import features as F

pytestmark = pytest.mark.integration

# planted fault -> the cells that must catch it (and every cell run against it)
CAUGHT_BY = {
    "stop-in-chunk": ["stop-string", "stop-string-kept"],
    "overrun-max-tokens": ["max-tokens"],
    "draft-penalties-skipped": ["frequency-penalty", "logit-bias"],
    "draft-filters-skipped": ["top-k-20"],  # combined and, with --reference, top-p/min-p too (docs/benchmarks.md)
    "seed-ignored": ["seed"],
    "logprobs-shifted": ["logprobs"],
}
STRUCTURED = {"json-schema", "regex", "choice"}


def test_every_planted_feature_fault_has_its_cells():
    from specadapt.native_reference.faults import FEATURE_FAULTS

    assert set(CAUGHT_BY) == set(FEATURE_FAULTS)
    assert all(name in F.BY_NAME for names in CAUGHT_BY.values() for name in names)


def features_equiv(tmp_path: Path, off, on, features: str, *extra: str, reference: str | None = None,
                   max_tokens: int = 32, samples: int = 4):
    out = tmp_path / "report.json"
    junit = tmp_path / "junit.xml"
    argv = [sys.executable, "-m", "specadapt", "equiv", "--features", features, "--off", off.base_url,
            "--on", on.base_url, "--max-tokens", str(max_tokens), "--samples", str(samples), "--json", str(out),
            "--junit", str(junit), *(["--reference", reference] if reference else []), *extra]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=900)
    report = json.loads(out.read_text()) if out.exists() else None
    return proc, report, junit


def cells(report) -> dict[str, dict]:
    return {c["name"]: c for c in report["cells"]}


def test_healthy_reference_passes_every_cell_it_supports(tmp_path, feature_reference_servers, embedded_model):
    servers = feature_reference_servers
    proc, report, junit = features_equiv(tmp_path, servers["off"], servers["ngram"], "all", "--concurrency", "16",
                                         reference=embedded_model, max_tokens=12, samples=2)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    by = cells(report)
    assert set(by) == {c for c in by} and len(by) == 25
    for name, cell in by.items():
        if name in STRUCTURED:  # the reference engine has no grammar: a 400, said as such
            assert cell["verdict"] == "unsupported", cell
            assert "structured output is not supported" in cell["reason"]
            continue
        assert cell["verdict"] == "pass", cell
        # speculation ran in every cell: drafts were proposed while it ran
        assert cell["activity"]["state"] == "active", cell
    # the stop and length cells were placed inside an accepted chunk of the spec-on answer
    assert "inside a streamed chunk" in " ".join(by["stop-string"]["notes"])
    assert "inside a streamed chunk" in " ".join(by["max-tokens"]["notes"])
    assert by["top-k-20"]["stats"]["n_tokens"] == 3 * 2 * 12
    text = junit.read_text()
    assert text.count("<testcase") == 25 and "<failure" not in text and text.count("<skipped") == 3
    assert "gate: PASS" in proc.stdout


@pytest.mark.parametrize("fault", list(CAUGHT_BY))
def test_each_planted_fault_is_caught_by_its_cell(tmp_path, feature_reference_servers, fault):
    servers = feature_reference_servers
    names = CAUGHT_BY[fault]
    # top_k <= K: the spec-off server's top 20 scores the filter cells exactly (no float64 recompute needed)
    proc, report, junit = features_equiv(tmp_path, servers["off"], servers[fault], ",".join(names))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    by = cells(report)
    for name in names:
        assert by[name]["verdict"] == "fail", by[name]
        assert by[name]["activity"]["state"] == "active"
    assert junit.read_text().count("<failure") == len(names)
    assert "gate: FAIL" in proc.stdout


def test_fault_is_invisible_to_the_other_cells(tmp_path, feature_reference_servers):
    """The stop-in-chunk server passes the cells that send no stop string: a cell fails for its own
    feature, not for any difference between the servers."""
    servers = feature_reference_servers
    proc, report, _ = features_equiv(tmp_path, servers["off"], servers["stop-in-chunk"],
                                     "max-tokens,stop-token-ids,multi-turn", max_tokens=24)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert {c["verdict"] for c in report["cells"]} == {"pass"}


# top_k under speculation crashes vLLM 0.32.0's CPU engine (below): those cells run last, on their own
CRASHING = ("top-k-20", "combined")


def test_vllm_matrix(tmp_path, vllm_off_fp32, vllm_ngram_fp32, embedded_model):
    names = ",".join(n for n in F.GROUPS["all"] if n not in CRASHING)
    proc, report, junit = features_equiv(tmp_path, vllm_off_fp32, vllm_ngram_fp32, names, "--concurrency", "16",
                                         "--near-tie-threshold", "0.01", reference=embedded_model, max_tokens=16,
                                         samples=2)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    by = cells(report)
    assert len(by) == 23 and junit.read_text().count("<testcase") == 23 and not report["partial"]
    verdicts = {name: c["verdict"] for name, c in by.items()}
    # greedy stays identical where nothing but the draft and the verify pass decides the text
    for name in ("stop-string", "stop-string-kept", "stop-token-ids", "max-tokens", "ignore-eos", "prefix-cache",
                 "multi-turn", "model-length", "chunked-prefill", "repetition-penalty", "frequency-penalty",
                 "presence-penalty", "logprobs", "min-tokens"):
        assert verdicts[name] == "pass", by[name]
        assert by[name]["activity"]["state"] == "active", by[name]
    # refused under speculation, in one line each: "not yet supported with speculative decoding"
    for name in ("logit-bias", "min-p-0.05"):
        assert verdicts[name] == "unsupported" and "not yet supported with speculative decoding" in by[name]["reason"]
    # the CPU build's sampler at draft positions (uninitialised temperatures): sampled tokens outside the nucleus
    assert verdicts["top-p-0.9"] == "fail", by["top-p-0.9"]
    assert by["top-p-0.9"]["stats"]["zero_probability_tokens"] > 0


@pytest.mark.ends_servers
def test_vllm_top_k_under_speculation_kills_the_engine(tmp_path, vllm_off_fp32, vllm_ngram_fp32, embedded_model):
    """vLLM 0.32.0 CPU: a sampled request with top_k on the n-gram server ends its engine (apply_top_k_only on an
    empty k tensor in the rejection sampler): the cell says so, and the run stops with a partial report."""
    proc, report, _ = features_equiv(tmp_path, vllm_off_fp32, vllm_ngram_fp32, ",".join(CRASHING),
                                     "--concurrency", "16", max_tokens=16, samples=2)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    by = cells(report)
    assert by["top-k-20"]["verdict"] == "error" and "HTTP 500" in by["top-k-20"]["reason"], by["top-k-20"]
    assert by["combined"]["verdict"] == "error"  # the server was gone (or still failing) by then
    if report["partial"]:  # gone: the run stopped there
        assert "did not run" in report["stopped"] and "cannot be reached" in by["combined"]["reason"]

"""The probe against real vLLM CPU servers, checked against the servers' own counters."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from specadapt.orchestration.probe import run_probe
from specadapt.records import RequestSettings
from specadapt.workloads.prompts import load_prompts

pytestmark = pytest.mark.integration
GEN = "vllm:generation_tokens_total"
SETTINGS = RequestSettings(max_tokens=24)


def probe_with_raw_deltas(settled_counter, server, names, concurrency=1):
    before = {n: settled_counter(server.base_url, n) for n in names}
    report = run_probe(server, load_prompts(None), SETTINGS, concurrency=concurrency, warmup=0)
    after = {n: settled_counter(server.base_url, n) for n in names}
    return report, {n: after[n] - before[n] for n in names}


def test_spec_off_server(vllm_off, settled_counter):
    report, delta = probe_with_raw_deltas(settled_counter, vllm_off, [GEN])
    assert report.server.version == "0.32.0"
    assert report.server.spec_enabled is False
    assert any("speculative decoding is off" in n for n in report.notes)
    assert not report.acceptance.known and report.acceptance.acceptance_rate is None
    assert report.latency.failed == 0
    assert all(r.text.strip() for r in report.requests)
    assert report.latency.output_tokens == delta[GEN]
    assert report.token_sources == {"usage": len(report.requests)}
    # vLLM may merge queued outputs into one chunk when the client lags, even without
    # speculation: what must hold is that the per-chunk counts add up to the request's.
    for r in report.requests:
        assert sum(r.chunk_tokens) == r.output_tokens == len(r.tokens)


def test_ngram_server_counts_match_the_server(vllm_ngram, settled_counter):
    names = [GEN, "vllm:spec_decode_num_draft_tokens_total", "vllm:spec_decode_num_accepted_tokens_total",
             "vllm:spec_decode_num_drafts_total"]
    report, delta = probe_with_raw_deltas(settled_counter, vllm_ngram, names, concurrency=2)
    acc = report.acceptance
    assert report.server.spec_enabled is True and report.server.num_speculative_tokens == 4
    assert report.latency.failed == 0 and all(r.text.strip() for r in report.requests)
    assert report.latency.output_tokens == delta[GEN]
    assert acc.known
    assert acc.draft_tokens == delta["vllm:spec_decode_num_draft_tokens_total"]
    assert acc.acceptance_rate == pytest.approx(delta["vllm:spec_decode_num_accepted_tokens_total"]
                                                / delta["vllm:spec_decode_num_draft_tokens_total"])
    assert acc.mean_acceptance_length == pytest.approx(1 + delta["vllm:spec_decode_num_accepted_tokens_total"]
                                                       / delta["vllm:spec_decode_num_drafts_total"])
    assert len(acc.per_position_rate) == 4
    # Chunks carry several tokens under speculation, and per-token ITL accounts for it.
    assert max(n for r in report.requests for n in r.chunk_tokens) > 1
    for r in report.requests:
        assert sum(r.chunk_tokens) == r.output_tokens == len(r.tokens)


def test_cli_probe_writes_a_report_that_rerenders(vllm_ngram, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"id": "copy", "category": "grounded", "messages": [
        {"role": "user", "content": "Repeat exactly: the quick brown fox jumps over the lazy dog. "
                                    "the quick brown fox jumps over the lazy dog."}]}) + "\n"
                       + json.dumps({"id": "open", "prompt": "Once upon a time"}) + "\n")
    out = tmp_path / "r.json"
    proc = subprocess.run([sys.executable, "-m", "specadapt", "probe", "--url", vllm_ngram.base_url,
                           "--prompts", str(prompts), "--max-tokens", "24", "--repeat", "2", "--json", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "speculative decoding: ON" in proc.stdout and "acceptance rate" in proc.stdout
    data = json.loads(out.read_text())
    assert data["schema_version"] == 1 and data["kind"] == "probe"
    assert len(data["requests"]) == 4 and {r["prompt_id"] for r in data["requests"]} == {"copy", "open"}
    shown = subprocess.run([sys.executable, "-m", "specadapt", "report", "show", str(out)],
                           capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0 and "acceptance rate" in shown.stdout

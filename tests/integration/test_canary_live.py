"""Canaries against real servers: golden answers recorded from a spec-off server, rounds against
healthy spec-on servers (identical, or near-ties at worst) and against a planted fault (suspect).

Cheap on purpose: the session's shared servers, the built-in canary set (4 prompts), 16 tokens.
The reference engine's perturb-logits=0.1 fault leaves these greedy answers unchanged at 16 and
32 tokens (a 0.1 logit noise flips no choice here), so the fault used is accept-always, which
does change them."""

from __future__ import annotations

import pytest

from specadapt.errors import UsageError
from specadapt.orchestration.canary import check_golden, record_golden, run_canary_round
from specadapt.workloads.prompts import canary_prompts

pytestmark = pytest.mark.integration

MAX_TOKENS = 16


@pytest.fixture(scope="module")
def ref_golden(reference_servers):
    """Golden answers from the float32 reference engine, spec off."""
    return record_golden(reference_servers["off"], canary_prompts(), MAX_TOKENS, dtype="float32")


def accepted(server) -> float:
    return server.read_counters().accepted_tokens or 0.0


def test_golden_from_the_spec_off_reference(ref_golden):
    assert len(ref_golden.answers) == 4 and ref_golden.server.spec_enabled is False
    assert ref_golden.near_tie_threshold == 0.01  # float32
    for a in ref_golden.answers:
        assert len(a.tokens) == MAX_TOKENS and a.tokens[0].startswith("token_id:")
        assert len(a.top_logprobs) == MAX_TOKENS and all(a.top_logprobs)


def test_healthy_spec_on_reference_is_identical(ref_golden, reference_servers, sampling_reference_servers):
    on = sampling_reference_servers["ngram"]
    before = accepted(on)
    r = run_canary_round(on, ref_golden, min_gap_s=0)
    assert r.verdict == "identical", [x.model_dump() for x in r.results]
    assert r.counts["identical"] == 4
    assert accepted(on) > before  # the canaries drafted and accepted: the verify path was exercised


def test_accept_always_fault_is_suspect(ref_golden, reference_servers):
    r = run_canary_round(reference_servers["accept_always"], ref_golden, min_gap_s=0)
    assert r.verdict == "suspect" and r.counts["suspect"] >= 1, [x.model_dump() for x in r.results]
    bad = next(x for x in r.results if x.verdict == "suspect")
    t = bad.divergence.triage
    assert t.source == "golden-logprobs" and t.margin >= t.threshold == 0.01


def test_spec_on_and_other_model_are_refused(ref_golden, reference_servers):
    with pytest.raises(UsageError, match="runs speculative decoding"):
        record_golden(reference_servers["accept_always"], canary_prompts()[:1], 2)
    other = reference_servers["other_model"]
    with pytest.raises(UsageError, match="the golden answers are of model"):
        check_golden(other, ref_golden)
    r = run_canary_round(other, ref_golden, min_gap_s=0)
    assert r.verdict == "error" and "the golden answers are of model" in r.results[0].error


def test_vllm_ngram_round_is_never_suspect(vllm_off, vllm_ngram):
    golden = record_golden(vllm_off, canary_prompts()[:2], MAX_TOKENS)  # two prompts: the suite's time is short
    assert golden.server.spec_enabled is False and golden.answers[0].tokens[0].startswith("token_id:")
    before = accepted(vllm_ngram)
    r = run_canary_round(vllm_ngram, golden, min_gap_s=0)
    assert r.verdict in ("identical", "near-tie"), [x.model_dump() for x in r.results]
    assert r.counts["error"] == 0 and r.counts["suspect"] == 0
    assert accepted(vllm_ngram) > before


def test_watch_raises_the_canary_alert_on_the_planted_fault(ref_golden, reference_servers, tmp_path):
    """End to end through `specadapt watch --golden`: the spec-on server with the accept-always
    fault is watched with canary rounds of one prompt; the round is suspect, the alert is raised
    (exit 1) and the end report counts the round."""
    import json
    import subprocess
    import sys

    from specadapt.records import write_golden

    golden, out = tmp_path / "golden.json", tmp_path / "watch.json"
    write_golden(ref_golden, golden)
    bad = reference_servers["accept_always"]
    proc = subprocess.run([sys.executable, "-m", "specadapt", "watch", "--url", f"bad={bad.base_url}", "--golden",
                           str(golden), "--canary-every", "60", "--canary-prompts", "1", "--interval", "0.5",
                           "--duration", "6", "--no-console", "--out", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr
    report = json.loads(out.read_text())
    assert report["servers"][0]["canary_counts"] == {"suspect": 1}
    assert "canary" in report["servers"][0]["alerts"] and "ALERT canary on bad" in proc.stdout

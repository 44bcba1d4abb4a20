"""equiv's gate with its default settings against real servers: what it certifies (speculation ran,
identity alone and in batches, the bound on the suspect rate) on the session's vLLM CPU servers and
reference servers (one with a planted fault that fires only when two requests share a verify pass)."""

from __future__ import annotations

import pytest
from junitparser import JUnitXml
from test_compare_vllm import CAPITAL, COPY, REVERSE, equiv, prompts_file

pytestmark = pytest.mark.integration


def junit_cases(out) -> dict:
    xml = JUnitXml.fromfile(str(out / "junit.xml"))
    return {c.name: c for suite in (xml if xml._tag == "testsuites" else [xml]) for c in suite}


def test_the_spec_off_server_given_as_the_spec_on_side_fails(tmp_path, vllm_off):
    proc, report, out = equiv(tmp_path, vllm_off, vllm_off, prompts_file(tmp_path, COPY, CAPITAL), max_tokens=8,
                              concurrency=None)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert report["counts"]["identical"] == 2  # the text is the same: identity alone would have passed
    assert report["activity"]["ran"] is False and report["activity"]["exercised_prompts"] == 0
    assert [r for r in report["gate"]["reasons"] if r.startswith("speculation did not run: an identity pass would "
                                                                "prove nothing")], report["gate"]["reasons"]
    assert "speculation DID NOT RUN" in proc.stdout and "gate: FAIL" in proc.stdout
    assert junit_cases(out)["speculation-ran"].result[0].message.startswith("speculation did not run")


def test_a_healthy_ngram_pair_passes_alone_and_in_batches_with_the_bound_stated(tmp_path, vllm_off, vllm_ngram):
    """float32 servers that differ in speculation only: identical text alone and in batches of 4."""
    proc, report, out = equiv(tmp_path, vllm_off, vllm_ngram, prompts_file(tmp_path, COPY, REVERSE, CAPITAL),
                              "--dtype", "float32", max_tokens=32, concurrency=None)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert report["counts"]["identical"] == 3, [i["verdict"] for i in report["identity"]]
    assert report["gate"]["passed"] and all(lv["acceptance"]["known"] for lv in report["levels"])
    assert sorted(lv["concurrency"] for lv in report["levels"]) == [1, 4]
    assert {r["concurrency"] for r in report["requests"] if not r["warmup"]} == {1, 4}
    activity = report["activity"]
    assert activity["ran"] is True and activity["drafted"] > 0
    # specadapt starts the spec-on vLLM with --per-request-spec-decode-metrics: each answer states its own
    # drafted and accepted tokens; its streamed chunks, one engine step each, line up with them
    assert activity["source"] == "response", activity["source_note"]
    passes = report["sections"]["speculation"]
    assert passes["available"] and passes["checks"] and all(c["agree"] for c in passes["checks"]), passes["checks"]
    assert activity["exercised_prompts"] >= 1 and activity["accepted_output_tokens"] > 0
    bound = report["gate"]["bound"]
    assert bound["exercised_prompts"] == activity["exercised_prompts"] and bound["suspect_prompts"] == 0
    assert 0 < bound["upper"] < 1 and bound["prompts_for"] == {"0.01": 299, "0.05": 59}
    assert "proof: 0 suspect in" in proc.stdout and "gate: PASS" in proc.stdout
    assert not junit_cases(out)["suspect-rate"].result


def test_a_fault_only_under_concurrency_fails_the_default_gate_and_passes_alone(tmp_path, reference_servers):
    s = reference_servers
    prompts = prompts_file(tmp_path, COPY, REVERSE, CAPITAL)
    proc, report, _ = equiv(tmp_path, s["off"], s["batch_drop"], prompts, max_tokens=32, concurrency=None)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    bad = [p for p in report["identity"] if p["verdict"] in ("suspect", "unknown")]
    assert bad, [p["verdict"] for p in report["identity"]]
    for p in bad:  # every pair answered alone was identical: the divergence is the batch's
        assert p["concurrency_only"] and p["diverged_levels"] == [4], p
    assert "ONLY UNDER CONCURRENCY" in proc.stdout
    # the reference server states each answer's drafted and accepted tokens
    assert report["activity"]["source"] == "response" and report["activity"]["ran"] is True
    alone, report1, _ = equiv(tmp_path / "alone", s["off"], s["batch_drop"], prompts, max_tokens=32, concurrency="1")
    assert alone.returncode == 0, alone.stdout + alone.stderr
    assert report1["counts"]["identical"] == 3 and report1["gate"]["bound"]["suspect_prompts"] == 0

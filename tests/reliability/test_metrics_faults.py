"""/metrics that is missing, malformed, or reset between snapshots: acceptance is unknown
with the reason, never negative or wrong, and the run itself is unharmed."""

from __future__ import annotations

import pytest

from specadapt.orchestration.probe import run_probe
from specadapt.records import Prompt, RequestSettings
from specadapt.testing import script

PROMPTS = [Prompt(id=f"m{i}", prompt=script(id=f"m{i}", ttft_ms=2, itl_ms=1, tokens=6, tokens_per_chunk=3))
           for i in range(2)]


@pytest.mark.parametrize("mode, reason", [
    ("missing", "counters could not be read (unavailable: GET /metrics did not answer 200)"),
    ("malformed", "counters could not be read (unavailable: /metrics is not Prometheus text"),
    ("reset", "spec-decode counters went down or vanished during the run (server restarted?)"),
    ("off", "the server exposes no spec-decode counters (speculation off, or stats disabled)"),
])
def test_unusable_counters_make_acceptance_unknown(server, set_metrics, mode, reason):
    set_metrics(mode)
    report = run_probe(server, PROMPTS, RequestSettings(max_tokens=6), concurrency=2, warmup=0)
    acc = report.acceptance
    assert report.latency.succeeded == 2 and report.latency.output_tokens == 12
    assert not acc.known and acc.reason.startswith(reason), acc.reason
    assert acc.acceptance_rate is None and acc.mean_acceptance_length is None and acc.per_position_rate == []
    assert acc.generation_tokens is None or acc.generation_tokens >= 0
    for value in (acc.drafts, acc.draft_tokens, acc.accepted_tokens):
        assert value is None or value >= 0


def test_malformed_metrics_do_not_break_describe(server, set_metrics):
    set_metrics("malformed")
    info = server.describe()
    assert info.spec_enabled is None and not info.metrics_available
    assert "GET /metrics answered, but not with Prometheus text" in info.notes

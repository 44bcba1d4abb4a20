"""Faults on the wire, from the scripted server over real loopback HTTP: each request fails
(or not) with the right reason, and the run carries on."""

from __future__ import annotations

import asyncio

import pytest

from specadapt.adapters.process import free_port
from specadapt.analysis.probe_report import failed_count
from specadapt.load.client import stream_request
from specadapt.orchestration.probe import run_probe
from specadapt.records import Prompt, RequestSettings
from specadapt.testing import script
from specadapt.wire.stream import connect

FAST = dict(ttft_ms=5.0, itl_ms=2.0, tokens=8)


def one(url: str, settings: RequestSettings | None = None, **fields):
    settings = settings or RequestSettings(max_tokens=8, request_timeout_s=5)
    prompt = Prompt(id=fields.get("id", "r"), prompt=script(**{**FAST, **fields}))

    async def go():
        async with connect(url) as client:
            return await stream_request(client, prompt, "scripted", settings, run_t0_ns=0)

    return asyncio.run(go())


@pytest.mark.parametrize("fields, kind, message", [
    (dict(fault="disconnect"), "disconnect", "ClientPayloadError: Response payload is not completed"),
    (dict(fault="malformed"), "malformed", "malformed SSE data: '{this is not json'"),
    (dict(fault="no_done"), "no_done", "stream ended without [DONE]"),
    (dict(fault="status", status=429), "http_status", "HTTP 429: "),
    (dict(fault="status", status=500), "http_status", "HTTP 500: "),
    (dict(fault="status", status=503), "http_status", "HTTP 503: "),
])
def test_each_fault_fails_the_request_with_its_reason(scripted_url, fields, kind, message):
    rec = one(scripted_url, id=f"fault-{kind}-{fields.get('status', '')}", **fields)
    assert not rec.ok and rec.error_kind == kind and rec.error.startswith(message), rec.error
    assert rec.attempts == 1


def test_partial_streams_keep_what_arrived(scripted_url):
    rec = one(scripted_url, id="partial", fault="no_done", fault_after=3)
    assert rec.chunk_tokens == [1, 1, 1] and rec.output_tokens == 3 and not rec.ok


def test_stalled_stream_hits_the_request_timeout(scripted_url):
    settings = RequestSettings(max_tokens=8, request_timeout_s=0.5)
    rec = one(scripted_url, settings, id="stall", fault="stall", fault_after=2)
    assert not rec.ok and rec.error_kind == "timeout" and rec.error == "timed out after 0.5 s"
    assert len(rec.chunk_ns) == 2  # the tokens before the stall were seen


def test_slow_trickle_of_bytes_is_parsed_whole(scripted_url):
    rec = one(scripted_url, id="trickle", fault="trickle", trickle_bytes=7, trickle_ms=0.5)
    assert rec.ok, rec.error
    assert rec.output_tokens == 8 and sum(rec.chunk_tokens) == 8 and rec.token_source == "usage"


def test_trickle_slower_than_the_timeout_fails_as_timeout(scripted_url):
    settings = RequestSettings(max_tokens=8, request_timeout_s=0.4)
    rec = one(scripted_url, settings, id="trickle-slow", fault="trickle", trickle_bytes=2, trickle_ms=2)
    assert not rec.ok and rec.error_kind == "timeout"


def test_connection_refused_is_a_failed_request():
    rec = one(f"http://127.0.0.1:{free_port()}", id="refused")
    assert not rec.ok and rec.error_kind == "connect" and rec.error.startswith("ClientConnectorError")


def test_retries_off_by_default_and_on_when_asked(scripted_url):
    off = one(scripted_url, id="retry-off", fault="status", status=503, fail_times=1)
    assert not off.ok and off.attempts == 1
    settings = RequestSettings(max_tokens=8, request_timeout_s=5, retries=2, retry_backoff_s=0.01)
    on = one(scripted_url, settings, id="retry-on", fault="status", status=429, fail_times=1)
    assert on.ok and on.attempts == 2 and on.retried_errors[0].startswith("HTTP 429")
    never = one(scripted_url, settings, id="retry-never", fault="status", status=500)
    assert not never.ok and never.attempts == 3 and len(never.retried_errors) == 2
    # A fault after tokens arrived is never retried (a resend would double-count output).
    late = one(scripted_url, settings, id="retry-late", fault="disconnect")
    assert not late.ok and late.attempts == 1


def prompts_for(tag: str, faults: list[dict]) -> list[Prompt]:
    return [Prompt(id=f"{tag}{i}", category="faults" if f else "clean", prompt=script(id=f"{tag}{i}", **FAST, **f))
            for i, f in enumerate(faults)]


def test_a_run_with_faults_continues_counts_and_reports_them(server):
    faults = [{}, dict(fault="stall"), dict(fault="status", status=429), dict(fault="status", status=500),
              dict(fault="status", status=503), dict(fault="disconnect"), dict(fault="malformed"),
              dict(fault="no_done"), {}, {}]
    settings = RequestSettings(max_tokens=8, request_timeout_s=1.0)
    report = run_probe(server, prompts_for("run", faults), settings, concurrency=4, warmup=0)
    assert report.latency.requests == 10 and report.latency.succeeded == 3 and failed_count(report) == 7
    assert report.failures == {"disconnect": 1, "http_429": 1, "http_500": 1, "http_503": 1, "malformed": 1,
                               "no_done": 1, "timeout": 1}
    assert report.latency_retried is None and not report.partial
    assert any("7 request(s) failed" in n for n in report.notes)
    assert report.latency.ttft_ms.count == 3  # figures come from the successful requests only


def test_retried_requests_are_reported_apart(server):
    faults = [{}, {}, dict(fault="status", status=503, fail_times=1), dict(fault="status", status=429, fail_times=2)]
    settings = RequestSettings(max_tokens=8, request_timeout_s=5, retries=3, retry_backoff_s=0.01)
    report = run_probe(server, prompts_for("rr", faults), settings, concurrency=2, warmup=0)
    assert failed_count(report) == 0 and report.failures == {}
    assert report.latency.requests == 2 and report.latency_retried.requests == 2
    assert sorted(r.attempts for r in report.requests) == [1, 1, 2, 3]
    assert any("reported apart" in n for n in report.notes)


def test_acceptance_is_exact_on_a_scripted_spec_server(server):
    # 4 tokens per chunk: each chunk is 1 draft of k=3 with 3 accepted; 10 tokens -> chunks 4,4,2.
    prompts = [Prompt(id=f"acc{i}", prompt=script(id=f"acc{i}", ttft_ms=2, itl_ms=1, tokens=10, tokens_per_chunk=4))
               for i in range(3)]
    report = run_probe(server, prompts, RequestSettings(max_tokens=10), concurrency=3, warmup=0)
    acc = report.acceptance
    assert acc.known and acc.drafts == 9 and acc.draft_tokens == 27 and acc.accepted_tokens == 21
    assert acc.acceptance_rate == pytest.approx(21 / 27) and acc.mean_acceptance_length == pytest.approx(1 + 21 / 9)
    assert acc.per_position_rate == pytest.approx([9 / 9, 6 / 9, 6 / 9])


"""`specadapt watch` as a real process against a real vLLM CPU server: the windowed acceptance equals
the server's counter deltas (read independently, by regex), the exporter is scraped by a real HTTP
client during the watch, and nothing is left running after it."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from specadapt.adapters.process import free_port

pytestmark = pytest.mark.integration

ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
DRAFTS = "vllm:spec_decode_num_drafts_total"
PROMPT = "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n\n" * 2


def scrape(url: str) -> dict[tuple, float]:
    out = {}
    for fam in text_string_to_metric_families(httpx.get(url, timeout=5).text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def wait_for(url: str, seconds: float = 60) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"{url} did not answer")


def test_watch_against_vllm_equals_the_counter_deltas(vllm_ngram, settled_counter, tmp_path):
    url = vllm_ngram.base_url
    before = {n: settled_counter(url, n) for n in (ACCEPTED, DRAFT_TOKENS, DRAFTS)}
    port = free_port()
    out = tmp_path / "watch.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "specadapt", "watch", "--url", f"on={url}", "--interval", "0.25", "--window", "600",
         "--listen", f"127.0.0.1:{port}", "--no-console", "--out", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        metrics = f"http://127.0.0.1:{port}/metrics"
        wait_for(metrics)
        end = time.monotonic() + 60  # a deadline, not a speed: the watch runs until this test stops it
        while scrape(metrics).get(("specadapt_server_up", (("server", "on"),))) != 1.0:
            assert time.monotonic() < end, "the watcher never read the server"
            time.sleep(0.1)
        for _ in range(3):
            r = httpx.post(url + "/v1/completions", timeout=120,
                           json={"model": vllm_ngram.model_id, "prompt": PROMPT, "max_tokens": 24, "temperature": 0})
            assert r.status_code == 200
        after = {n: settled_counter(url, n) for n in (ACCEPTED, DRAFT_TOKENS, DRAFTS)}
        time.sleep(1.0)  # a few more reads of the settled counters
        live = scrape(metrics)
        on = (("server", "on"),)
        assert live[("specadapt_accepted_tokens_total", on)] == after[ACCEPTED] - before[ACCEPTED] > 0
        assert live[("specadapt_draft_tokens_total", on)] == after[DRAFT_TOKENS] - before[DRAFT_TOKENS]
        assert live[("specadapt_acceptance_ratio", on)] == pytest.approx(
            (after[ACCEPTED] - before[ACCEPTED]) / (after[DRAFT_TOKENS] - before[DRAFT_TOKENS]))
        assert live[("specadapt_acceptance_ratio", (("server", "fleet"),))] == live[("specadapt_acceptance_ratio", on)]
        assert live[("specadapt_speculation_counters", on)] == 1.0
        assert live[("specadapt_ttft_seconds", on)] > 0  # vLLM's own histogram
        assert ("specadapt_running_requests", on) in live
        proc.terminate()  # as a pod is stopped: the report is written first
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 143, stderr
    report = json.loads(out.read_text())
    assert report["end_reason"] == "stopped by a signal (exit 143)"
    fig = report["servers"][0]["figures"]
    assert fig["accepted"] == after[ACCEPTED] - before[ACCEPTED]
    assert fig["drafts"] == after[DRAFTS] - before[DRAFTS]
    assert fig["mean_acceptance_length"] == pytest.approx(
        1 + (after[ACCEPTED] - before[ACCEPTED]) / (after[DRAFTS] - before[DRAFTS]))
    assert report["servers"][0]["restarts"] == 0 and report["alerts_raised"] == 0
    assert report["servers"][0]["info"]["model_id"] == vllm_ngram.model_id
    with socket.socket() as s:  # nobody listens on the exporter's port any more: nothing left running
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # its closed connections may be in TIME_WAIT
        s.bind(("127.0.0.1", port))
        s.listen()

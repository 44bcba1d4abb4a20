"""Worker processes for real: spawned workers against the scripted server (a real process on
loopback), a worker killed mid-run, and Ctrl-C on the CLI (a real subprocess). Every check is
load-proof: counts, identities, causality on the shared monotonic clock, process states."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time

import httpx
import psutil
import pytest

from specadapt.adapters.vllm import VLLMServer
from specadapt.probes.distributed import run_spread_probe
from specadapt.records import Prompt, RequestSettings, read_report
from specadapt.testing import script, scripted_server

pytestmark = pytest.mark.slow

INTERRUPTED = "error: interrupted; every server this run started has been stopped"


@pytest.fixture(scope="module")
def scripted(tmp_path_factory):
    with scripted_server(tmp_path_factory.mktemp("scripted") / "server.log") as mp:
        yield mp.plan.base_url
    # The "spawn" context starts one resource-tracker process per parent, for the parent's life;
    # the CLI exits and it goes, but this pytest process lives on: stop it here.
    from multiprocessing import resource_tracker
    resource_tracker._resource_tracker._stop()


def prompts(tag: str, n: int, **fields) -> list[Prompt]:
    return [Prompt(id=f"{tag}{i}", prompt=script(id=f"{tag}{i}", **fields)) for i in range(n)]


def settings(tokens: int) -> RequestSettings:
    return RequestSettings(max_tokens=tokens, request_timeout_s=30)


def test_two_workers_every_request_once_on_the_parents_clock(scripted):
    server = VLLMServer(scripted)
    try:
        report = run_spread_probe([server], prompts("w", 8, ttft_ms=20, itl_ms=10, tokens=6), settings(6),
                                  concurrency=4, warmup=0, workers=2)
    finally:
        server.close()
    log = httpx.get(scripted + "/_script/log").json()
    assert sorted(r.prompt_id for r in report.requests) == sorted(f"w{i}" for i in range(8))
    assert all(r.ok and r.output_tokens == 6 and r.target == scripted for r in report.requests)
    assert [r.sent_at_ns for r in report.requests] == sorted(r.sent_at_ns for r in report.requests)
    workers = report.scale.workers
    assert report.scale.executor == "workers" and [w.worker for w in workers] == [0, 1]
    assert [(w.jobs, w.concurrency, w.finished) for w in workers] == [(4, 2, 4), (4, 2, 4)]
    assert len({w.pid for w in workers} | {os.getpid()}) == 3  # two processes besides this one
    t0 = workers[0].t0_mono_ns
    assert t0 == workers[1].t0_mono_ns
    for r in report.requests:  # causality on the one monotonic clock: sent before received, read after written
        srv = log[r.prompt_id]
        assert t0 + r.sent_at_ns < srv["recv_ns"] < srv["chunk_ns"][0] < t0 + r.sent_at_ns + r.ttft_ns
        assert srv["done_ns"] < t0 + r.sent_at_ns + r.e2e_ns
    assert report.latency.output_tokens == 48 and report.acceptance.generation_tokens == 48
    assert multiprocessing.active_children() == []


def test_a_worker_killed_mid_run_gives_a_partial_report_and_no_orphan(scripted):
    server = VLLMServer(scripted)
    killed: list[int] = []

    def kill_one(rec) -> None:  # the first finished request: kill worker 1 while its others stream
        if not killed:
            victim = next(p for p in multiprocessing.active_children() if p.name == "specadapt-worker-1")
            killed.append(victim.pid)
            os.kill(victim.pid, signal.SIGKILL)

    fast = prompts("k", 2, ttft_ms=10, itl_ms=10, tokens=2)
    slow = prompts("s", 6, ttft_ms=10, itl_ms=200, tokens=10)
    try:
        report = run_spread_probe([server], fast[:1] + slow[:3] + fast[1:] + slow[3:], settings(10),
                                  concurrency=8, warmup=0, workers=2, progress=kill_one)
    finally:
        server.close()
    assert report.partial
    assert report.partial_reason.startswith(f"worker 1 (pid {killed[0]}) exited with code -9 after ")
    assert report.partial_reason.endswith("every worker was stopped")
    ids = [r.prompt_id for r in report.requests]
    assert len(ids) == len(set(ids)) and 1 <= len(ids) < 8
    assert all(r.ok for r in report.requests)
    w1 = report.scale.workers[1]
    assert w1.error == "exited with code -9" and w1.finished < w1.jobs
    assert report.latency.succeeded == len(ids)
    assert multiprocessing.active_children() == [] and not psutil.pid_exists(killed[0])


def test_ctrl_c_stops_every_worker_and_keeps_the_finished_requests(scripted, tmp_path):
    lines = [json.dumps({"id": p.id, "prompt": p.prompt}) for p in
             prompts("c", 4, ttft_ms=10, itl_ms=10, tokens=3) + prompts("d", 4, ttft_ms=10, itl_ms=500, tokens=30)]
    (tmp_path / "p.jsonl").write_text("\n".join(lines) + "\n")
    out = tmp_path / "r.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "specadapt", "probe", "--url", scripted, "--prompts", str(tmp_path / "p.jsonl"),
         "--workers", "2", "--concurrency", "8", "--warmup", "0", "--max-tokens", "30", "--json", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # until the 4 short requests are done
            log = httpx.get(scripted + "/_script/log").json()
            if sum(1 for k, v in log.items() if k.startswith("c") and v["done_ns"]) == 4:
                break
            time.sleep(0.1)
        time.sleep(0.3)
        workers = psutil.Process(proc.pid).children(recursive=True)
        assert len(workers) >= 2
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole foreground group
        _out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert err.strip().splitlines()[-1] == INTERRUPTED
    saved = read_report(out)
    assert saved.partial and saved.partial_reason == "interrupted (Ctrl-C); every worker was stopped"
    done = sorted(r.prompt_id for r in saved.requests)
    assert done[:4] == ["c0", "c1", "c2", "c3"] and len(done) < 8
    # the workers, and the resource tracker that "spawn" starts, go with the command (the tracker
    # notices its parent's exit a moment later)
    _gone, alive = psutil.wait_procs(workers, timeout=30)
    assert not [p for p in alive if p.status() != psutil.STATUS_ZOMBIE], [p.cmdline() for p in alive]

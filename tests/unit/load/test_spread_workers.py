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
from specadapt.orchestration.probe import run_probe
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
        report = run_probe([server], fast[:1] + slow[:3] + fast[1:] + slow[3:], settings(10),
                           concurrency=8, warmup=0, workers=2, progress=kill_one)
    finally:
        server.close()
    assert report.partial
    assert report.partial_reason.startswith(f"worker 1 (pid {killed[0]}) exited with code -9 after ")
    assert report.partial_reason.endswith("every worker was stopped")
    ids = [r.prompt_id for r in report.requests]
    assert len(ids) == len(set(ids)) and 1 <= len(ids) < 8
    assert all(r.ok for r in report.requests)
    w0, w1 = report.scale.workers
    assert w1.error == "exited with code -9" and w1.finished < w1.jobs and w1.pid == killed[0]
    assert (w0.jobs, w0.concurrency, w0.error) == (4, 4, None)  # stopped by the parent, not crashed
    assert set(ids) <= {"k0", "k1"}  # the slow ones were still streaming when every worker was stopped
    assert report.latency.succeeded == len(ids) == w0.finished + w1.finished
    assert len({w0.pid, w1.pid, os.getpid()}) == 3 and w0.t0_mono_ns == w1.t0_mono_ns
    log = httpx.get(scripted + "/_script/log").json()
    for r in report.requests:  # causality on the one monotonic clock: sent before received, read after written
        srv, sent = log[r.prompt_id], w0.t0_mono_ns + r.sent_at_ns
        assert sent < srv["recv_ns"] < srv["chunk_ns"][0] < sent + r.ttft_ns and srv["done_ns"] < sent + r.e2e_ns
    assert multiprocessing.active_children() == [] and not psutil.pid_exists(killed[0])


@pytest.mark.parametrize("workers", [1, 2], ids=["one-process", "workers"])
def test_ctrl_c_stops_every_worker_and_keeps_the_finished_requests(scripted, tmp_path, workers):
    """The same on one process and with workers: the requests that finished are written, marked partial."""
    lines = [json.dumps({"id": p.id, "prompt": p.prompt}) for p in
             prompts("c", 4, ttft_ms=10, itl_ms=10, tokens=3) + prompts("d", 4, ttft_ms=10, itl_ms=500, tokens=30)]
    (tmp_path / "p.jsonl").write_text("\n".join(lines) + "\n")
    out = tmp_path / "r.json"
    httpx.get(scripted + "/_script/log?pop=1")  # the server's log from here on is this run's
    start_ns = time.perf_counter_ns()  # the server logs on the same monotonic clock
    # 4 slots, jobs in order (a worker's share too): a slot takes its "d" only once its "c" is recorded
    proc = subprocess.Popen(
        [sys.executable, "-m", "specadapt", "probe", "--url", scripted, "--prompts", str(tmp_path / "p.jsonl"),
         "--workers", str(workers), "--concurrency", "4", "--warmup", "0", "--max-tokens", "30", "--json", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        # a terminal's Ctrl-C reaches a foreground command with SIGINT at its default; a suite started
        # as a background job (`make test &`) hands its children SIGINT ignored, which Python keeps
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 60
        while True:  # until the 4 long requests reached the server: the client has recorded the 4 short ones
            log = httpx.get(scripted + "/_script/log").json()
            if sum(1 for k, v in log.items() if k.startswith("d") and v["recv_ns"] > start_ns) == 4:
                break
            assert time.monotonic() < deadline, f"the 4 long requests did not reach the server in 60 s: {log}"
            time.sleep(0.1)
        children = psutil.Process(proc.pid).children(recursive=True)
        assert len(children) >= (2 if workers > 1 else 0)
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole foreground group
        _out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert err.strip().splitlines()[-1] == INTERRUPTED
    saved = read_report(out)
    assert saved.partial and saved.partial_reason == ("interrupted (Ctrl-C); every worker was stopped" if workers > 1
                                                      else "interrupted (Ctrl-C)")
    done = sorted(r.prompt_id for r in saved.requests)
    assert done[:4] == ["c0", "c1", "c2", "c3"] and len(done) < 8
    # the workers, and the resource tracker that "spawn" starts, go with the command (the tracker
    # notices its parent's exit a moment later)
    _gone, alive = psutil.wait_procs(children, timeout=30)
    assert not [p for p in alive if p.status() != psutil.STATUS_ZOMBIE], [p.cmdline() for p in alive]

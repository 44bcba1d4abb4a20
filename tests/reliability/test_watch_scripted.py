"""`specadapt watch` as a real process against the scripted server in timeline mode, where the
counters' truth is known: a planted decay raises the drift alarm (and the steady part none), a
collapse of acceptance at a high batch raises "costing time", and restarts, a slow server and a
server that disappears and comes back are alerts and events, never a crash or a negative rate.

The scripted server is a test tool (specadapt/testing/scripted_server.py): its counters follow
testing/counter_series.py's seeded simulation from the moment the timeline is posted."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from specadapt.records import (
    AcceptanceSummary,
    CompareReport,
    CompareSettings,
    Distribution,
    LatencySummary,
    LevelResult,
    RatioCI,
    ServerInfo,
    SpeedRatios,
)
from specadapt.testing import scripted_plan, scripted_server

FAST = ["--interval", "0.1", "--no-console"]


def post_timeline(url: str, **timeline) -> float:
    r = httpx.post(url + "/_script/metrics", json={"mode": "timeline", "timeline": timeline})
    assert r.status_code == 200
    return time.time()


def watch(args: list[str], out: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "specadapt", "watch", *FAST, *args, "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen, out: Path) -> tuple[int, dict, str]:
    try:
        stdout, stderr = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "Traceback" not in stderr, stderr
    return proc.returncode, json.loads(out.read_text()), stdout


def raised(report: dict, alert: str) -> list[dict]:
    return [e for e in report["events"] if e["alert"] == alert and e["raised"]]


@pytest.fixture
def timeline_url(scripted_url):
    yield scripted_url
    httpx.post(scripted_url + "/_script/metrics", json={"mode": "vllm"})


def level(concurrency: int, point: float, low: float, high: float, length: float) -> LevelResult:
    lat = LatencySummary(requests=5, succeeded=5, failed=0, output_tokens=100, duration_s=1.0, output_tokens_per_s=1,
                         ttft_ms=Distribution(), itl_ms=Distribution(), tpot_ms=Distribution(),
                         e2e_ms=Distribution(), tokens_per_chunk_mean=None)
    r = RatioCI(point=point, low=low, high=high, n=8)
    return LevelResult(concurrency=concurrency, pairs=8, off=lat, on=lat,
                       acceptance=AcceptanceSummary(known=True, mean_acceptance_length=length),
                       speed=SpeedRatios(tpot=r, e2e=r, throughput=r))


def baseline(path: Path, model: str = "scripted") -> Path:
    """A compare report of the deployment (constructed): 1.8x at batch 1, 1.05x at batch 32, k = 3."""
    on = ServerInfo(backend="vllm", base_url="http://on", model_id=model, num_speculative_tokens=3)
    rep = CompareReport(settings=CompareSettings(concurrency=[1, 32]), on_server=on,
                        off_server=ServerInfo(backend="vllm", base_url="http://off"),
                        levels=[level(1, 1.8, 1.6, 2.0, 2.6), level(32, 1.05, 0.95, 1.15, 2.6)])
    path.write_text(rep.model_dump_json())
    return path


def started_on(port: int) -> subprocess.Popen:
    """A scripted server on a given port, started directly: the port's old connections may still be
    in TIME_WAIT, which uvicorn's SO_REUSEADDR allows and ManagedProcess's free-port check does not."""
    proc = subprocess.Popen(scripted_plan(port).argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    end = time.monotonic() + 30
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            assert time.monotonic() < end, "the scripted server did not start"
            time.sleep(0.1)


@pytest.fixture(scope="module")
def scenarios(scripted, tmp_path_factory):
    """Three watches side by side (so the module costs the longest of them, not their sum), each on
    its own scripted server: a planted decay; an acceptance collapse at a high batch with a
    baseline; and a server whose counters restart, that answers slowly, disappears and returns.
    Yields {name: (exit code, end report, stdout, extra)}."""
    tmp = tmp_path_factory.mktemp("watch-scenarios")
    out = {name: tmp / f"{name}.json" for name in ("decay", "costing", "restart")}
    results = {}
    with scripted_server(tmp / "costing.log") as costing_server, scripted_server(tmp / "restart.log") as first:
        decay_url, costing_url, url = scripted.plan.base_url, costing_server.plan.base_url, first.plan.base_url
        t_decay = post_timeline(decay_url, step_s=0.05, drafts_per_s=2000, k=3, block_noise=0.01, noise_block_s=0.25,
                                acceptance=[(0.0, 0.7), (4.0, 0.7), (6.0, 0.35)], seed=1)
        decay = watch(["--url", f"a={decay_url}", "--window", "2", "--duration", "9", "--drift-block", "0.25",
                       "--drift-learn", "8", "--drift-min-tokens", "50"], out["decay"])
        t_costing = post_timeline(costing_url, step_s=0.05, drafts_per_s=2000, k=3,
                                  acceptance=[(0.0, 0.75), (3.0, 0.75), (3.3, 0.02)],
                                  running=[(0.0, 2.0), (3.0, 48.0)])
        costing = watch(["--url", f"a={costing_url}", "--window", "1", "--duration", "6.5", "--baseline",
                         str(baseline(tmp / "base.json"))], out["costing"])
        post_timeline(url, step_s=0.05, drafts_per_s=1000, restarts=[1.5], base=5000)
        restart = watch(["--url", f"a={url}", "--window", "1", "--duration", "9", "--timeout", "0.4",
                         "--max-backoff", "0.5"], out["restart"])
        time.sleep(3.0)
        httpx.post(url + "/_script/metrics", json={"mode": "timeline", "delay_s": 1.0,
                                                   "timeline": {"step_s": 0.05, "base": 9000}})
        time.sleep(1.5)
        first.stop()  # gone
        time.sleep(1.0)
        second = started_on(int(url.rsplit(":", 1)[1]))  # and back, on the same port
        try:
            post_timeline(url, step_s=0.05, drafts_per_s=1000)
            results["restart"] = (*finish(restart, out["restart"]), None)
        finally:
            second.terminate()
            second.wait(10)
        results["decay"] = (*finish(decay, out["decay"]), t_decay)
        results["costing"] = (*finish(costing, out["costing"]), t_costing)
    httpx.post(decay_url + "/_script/metrics", json={"mode": "vllm"})
    return results


def test_planted_decay_raises_the_drift_alarm_and_the_steady_part_none(scenarios):
    rc, report, stdout, t0 = scenarios["decay"]
    drift = raised(report, "drift")
    assert rc == 1 and len(drift) == 1, report["events"]
    assert drift[0]["wall"] > t0 + 4.0  # not while acceptance was steady
    assert "acceptance fell" in drift[0]["text"] and "ALERT drift on a" in stdout
    d = report["servers"][0]["drift"]
    assert d["alarm"] is True and d["statistic"] > d["h"] and d["reference"] == pytest.approx(0.51, abs=0.05)


def test_acceptance_collapse_at_high_batch_is_costing_time(scenarios):
    rc, report, stdout, t0 = scenarios["costing"]
    costing = raised(report, "costing-time")
    assert rc == 1 and len(costing) == 1, report["events"]
    assert costing[0]["wall"] > t0 + 3.0
    assert "speculation is costing time at this load; the model would pick" in costing[0]["text"]
    exp = report["servers"][0]["expectation"]
    assert exp["costing_time"] is True and exp["high"] < 1 and exp["batch"] == pytest.approx(48) and exp["best_k"] == 0
    assert "above the largest measured level (32)" in exp["note"]


def test_restart_slow_answers_and_a_server_that_disappears_and_returns(scenarios):
    rc, report, stdout, _ = scenarios["restart"]
    events = [(e["alert"], e["raised"]) for e in report["events"]]
    down = [e["text"] for e in raised(report, "down")]
    assert rc == 1
    assert any("no answer within 0.4 s" in t for t in down), down  # slow
    assert any("cannot connect" in t for t in down), down  # gone
    assert [e for e in events if e[0] == "down"][-1] == ("down", False)  # it came back: cleared
    s = report["servers"][0]
    assert s["restarts"] >= 2 and s["errors"] >= 2  # the timeline's restart, and the new process
    f = s["figures"]
    assert f["drafts"] >= 0 and f["accepted"] >= 0 and f["acceptance_rate"] is not None
    assert "the server restarted" in stdout


def test_a_baseline_of_another_model_is_refused(timeline_url, tmp_path):
    post_timeline(timeline_url)
    r = subprocess.run([sys.executable, "-m", "specadapt", "watch", "--url", timeline_url, "--duration", "1",
                        "--baseline", str(baseline(tmp_path / "b.json", model="llama-70b"))],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1].startswith("error: --baseline")
    assert "measured on model 'llama-70b', the server serves 'scripted'" in r.stderr and "Traceback" not in r.stderr


def test_sigterm_ends_the_watch_with_its_report_written(tmp_path):
    """A pod being stopped: SIGTERM ends the watch with exit 143, and the end report is written first."""
    import signal

    out = tmp_path / "w.json"
    proc = watch(["--url", "a=http://127.0.0.1:9", "--max-backoff", "0.2"], out)
    assert proc.stderr.readline().startswith("watching 1 server")  # started, signal handlers in place
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=30)
    assert proc.returncode == 143
    report = json.loads(out.read_text())
    assert report["end_reason"] == "stopped by a signal (exit 143)" and report["servers"][0]["errors"] >= 1

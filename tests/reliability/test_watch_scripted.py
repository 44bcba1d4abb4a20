"""`specadapt watch` as a real process against the scripted server in timeline mode, where the
counters' truth is known: a planted decay raises the drift alarm (and the steady part none), a
collapse of acceptance at a high batch raises "costing time", and restarts, a slow server and a
server that disappears and comes back are alerts and events, never a crash or a negative rate.

The scripted server is a test tool (specadapt/testing/scripted_server.py): its counters follow
testing/counter_series.py's seeded simulation from the watcher's first read of /metrics (so a CLI
that is slow to start sees the same timeline). The restart scenario goes phase by phase on events
(the reads the server answered, the lines the watcher printed), never on sleeps, and every wait has
a deadline."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
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
WAIT_S = 60.0  # the deadline of every wait for a phase: generous, never a measure of speed


def post_timeline(url: str, first_read: bool = False, **timeline) -> None:
    """Counters from the simulation; its clock starts at the POST, or at the next /metrics read."""
    body = {"mode": "timeline", "timeline": timeline, **({"start": "first-read"} if first_read else {})}
    assert httpx.post(url + "/_script/metrics", json=body).status_code == 200


def script_state(url: str) -> dict:
    """{"metrics": reads answered, "timeline_started": wall time of the timeline's start}."""
    return httpx.get(url + "/_script/reads").json()


def wait_reads(url: str, n: int, what: str) -> None:
    """Until the server has answered n /metrics reads in all."""
    end = time.monotonic() + WAIT_S
    while (seen := script_state(url)["metrics"]) < n:
        assert time.monotonic() < end, f"{what}: the server answered {seen} /metrics reads in {WAIT_S:g} s, not {n}"
        time.sleep(0.02)


def more_reads(url: str, n: int, what: str) -> None:
    """Until the server has answered n more /metrics reads than now."""
    wait_reads(url, script_state(url)["metrics"] + n, what)


class Watch:
    """`specadapt watch` as a process whose printed lines are read as they come (phases wait on them)."""

    def __init__(self, args: list[str], out: Path):
        self.out = out
        self.proc = subprocess.Popen([sys.executable, "-m", "specadapt", "watch", *FAST, *args, "--out", str(out)],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self.lines: list[str] = []
        self.stderr: list[str] = []
        self.ended = False
        self._cond = threading.Condition()
        self._readers = [threading.Thread(target=self._read, args=(self.proc.stdout, self.lines), daemon=True),
                         threading.Thread(target=self._read, args=(self.proc.stderr, self.stderr), daemon=True)]
        for t in self._readers:
            t.start()

    def _read(self, pipe, into: list[str]) -> None:
        for line in pipe:
            with self._cond:
                into.append(line.rstrip("\n"))
                self._cond.notify_all()
        with self._cond:
            self.ended = self.ended or pipe is self.proc.stdout
            self._cond.notify_all()

    def mark(self) -> int:
        with self._cond:
            return len(self.lines)

    def wait_for(self, text: str, since: int, what: str) -> int:
        """The index after the first line from ``since`` on that holds ``text`` (the next wait's start)."""
        end = time.monotonic() + WAIT_S
        with self._cond:
            while True:
                for i in range(since, len(self.lines)):
                    if text in self.lines[i]:
                        return i + 1
                left = end - time.monotonic()
                assert left > 0 and not self.ended, (
                    f"{what}: the watcher printed no line with {text!r} "
                    f"{'before it ended' if self.ended else f'in {WAIT_S:g} s'}; since then it printed "
                    f"{self.lines[since:]}; stderr {self.stderr}")
                self._cond.wait(left)

    def finish(self, sig: int | None = None) -> tuple[int, dict, str]:
        """Stop it with ``sig`` (or let its --duration end it); (exit code, end report, stdout)."""
        try:
            if sig is not None:
                self.proc.send_signal(sig)
            self.proc.wait(timeout=90)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
        for t in self._readers:
            t.join(10)
        stderr = "\n".join(self.stderr)
        assert "Traceback" not in stderr, stderr
        return self.proc.returncode, json.loads(self.out.read_text()), "\n".join(self.lines)


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
    baseline (both timelines start at the watcher's first read and the watch ends by --duration);
    and a server that disappears and comes back as a new process, whose counters restart, and that
    answers slowly, driven phase by phase. Yields {name: (exit code, end report, stdout, t0)}: t0 is
    the wall time at which the timeline started."""
    tmp = tmp_path_factory.mktemp("watch-scenarios")
    out = {name: tmp / f"{name}.json" for name in ("decay", "costing", "restart")}
    results = {}
    with scripted_server(tmp / "costing.log") as costing_server, scripted_server(tmp / "restart.log") as first:
        decay_url, costing_url, url = scripted.plan.base_url, costing_server.plan.base_url, first.plan.base_url
        post_timeline(decay_url, first_read=True, step_s=0.05, drafts_per_s=2000, k=3, block_noise=0.01,
                      noise_block_s=0.25, acceptance=[(0.0, 0.7), (4.0, 0.7), (6.0, 0.35)], seed=1)
        decay = Watch(["--url", f"a={decay_url}", "--window", "2", "--duration", "9", "--drift-block", "0.25",
                       "--drift-learn", "8", "--drift-min-tokens", "50"], out["decay"])
        post_timeline(costing_url, first_read=True, step_s=0.05, drafts_per_s=2000, k=3,
                      acceptance=[(0.0, 0.75), (3.0, 0.75), (3.3, 0.02)], running=[(0.0, 2.0), (3.0, 48.0)])
        costing = Watch(["--url", f"a={costing_url}", "--window", "1", "--duration", "6.5", "--baseline",
                         str(baseline(tmp / "base.json"))], out["costing"])
        # counters of a server up a while (1e6 drafts: above anything a new process or a restart shows)
        post_timeline(url, step_s=0.05, drafts_per_s=1000, base=1e6)
        restart = Watch(["--url", f"a={url}", "--window", "1", "--timeout", "1", "--max-backoff", "0.5"],
                        out["restart"])  # no --duration: SIGTERM ends it once every phase was seen
        second = None
        try:
            wait_reads(url, 2, "the watcher's first reads")  # the first is folded: the watcher holds its counters
            # gone: the server exits right after answering a read, so the next one cannot connect
            assert httpx.post(url + "/_script/exit", json={"after_reads": 1}).status_code == 200
            m = restart.wait_for("ALERT down on a: cannot connect", restart.mark(), "the server gone")
            # back on the same port, a new process: its counters start low (1000), a restart
            second = started_on(int(url.rsplit(":", 1)[1]))
            m = restart.wait_for("the server restarted", m, "the new process")
            post_timeline(url, step_s=0.05, drafts_per_s=1000, base=5000)  # counters go up from there
            more_reads(url, 2, "reads of the new process's timeline")
            # the planted restart: the timeline's counters fall to zero at once
            m = restart.mark()
            assert httpx.post(url + "/_script/restart").status_code == 200
            m = restart.wait_for("the server restarted", m, "the planted restart")
            # slow: each read held 5 s (the watcher gives up after 1 s), until the next POST answers it
            assert httpx.post(url + "/_script/metrics", json={"delay_s": 5}).status_code == 200
            m = restart.wait_for("ALERT down on a: no answer within 1 s", m, "the slow server")
            assert httpx.post(url + "/_script/metrics", json={"delay_s": 0}).status_code == 200
            restart.wait_for("resolved down on a", m, "the server answering again")
            more_reads(url, 3, "reads after the slow phase")  # the last window holds counters
            results["restart"] = (*restart.finish(signal.SIGTERM), None)
        finally:
            if restart.proc.poll() is None:
                restart.proc.kill()
            if second is not None:
                second.terminate()
                second.wait(10)
        results["decay"] = (*decay.finish(), script_state(decay_url)["timeline_started"])
        results["costing"] = (*costing.finish(), script_state(costing_url)["timeline_started"])
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
    assert rc == 143 and report["end_reason"] == "stopped by a signal (exit 143)"
    assert any("cannot connect" in t for t in down), down  # gone
    assert any("no answer within 1 s" in t for t in down), down  # slow
    assert [e for e in events if e[0] == "down"][-1] == ("down", False)  # it came back: cleared
    s = report["servers"][0]
    assert s["restarts"] == 2 and s["errors"] >= 2  # the new process, and the planted restart
    assert [e for e in events if e[0] == "restart"] == [("restart", True)] * 2
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
    out = tmp_path / "w.json"
    w = Watch(["--url", "a=http://127.0.0.1:9", "--max-backoff", "0.2"], out)
    w.wait_for("ALERT down on a", 0, "the first read")  # the loop runs (signal handlers in place), a read failed
    rc, report, _ = w.finish(signal.SIGTERM)
    assert rc == 143
    assert report["end_reason"] == "stopped by a signal (exit 143)" and report["servers"][0]["errors"] >= 1

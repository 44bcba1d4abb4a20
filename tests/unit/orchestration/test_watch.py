"""The watch loop (orchestration/watch.py) with an injected clock and in-process servers whose reads
are scripted, and its exporter scraped over real HTTP."""

from __future__ import annotations

import threading

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from specadapt.analysis.watch import CostModel, DriftSettings, LevelCost
from specadapt.errors import ServerUnreachable
from specadapt.orchestration.watch import CanaryStatus, Watcher, WatchSettings
from specadapt.records import CounterSnapshot, ServerInfo
from specadapt.records.watch import FLEET, METRICS, LiveSnapshot
from specadapt.report.watch_export import Exporter
from specadapt.report.watch_render import event_line, status_lines, status_table, watch_report


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class FakeServer:
    """Reads come from ``script``: a LiveSnapshot, an exception to raise, or "slow" (blocks until released)."""

    def __init__(self, url: str, model: str = "m", method: str | None = "ngram", k: int = 3):
        self.base_url = url
        self.script: list = []
        self.release = threading.Event()
        self.info = ServerInfo(backend="vllm", base_url=url, model_id=model, spec_method=method,
                               num_speculative_tokens=k)
        self.describes = 0

    def describe(self) -> ServerInfo:
        self.describes += 1
        return self.info

    def read_live(self) -> LiveSnapshot:
        item = self.script.pop(0)
        if item == "slow":
            self.release.wait(5)
            raise ServerUnreachable("slow read ended")
        if isinstance(item, Exception):
            raise item
        return item


def live(drafts, acc, pos=(), running=None, spec=True) -> LiveSnapshot:
    c = CounterSnapshot(drafts=drafts if spec else None, draft_tokens=3 * drafts if spec else None,
                        accepted_tokens=acc if spec else None, accepted_per_position=dict(enumerate(pos)),
                        generation_tokens=drafts + acc)
    return LiveSnapshot(at=0.0, counters=c, running=running)


SETTINGS = WatchSettings(interval_s=10, window_s=60, timeout_s=0.5, max_backoff_s=40,
                         drift=DriftSettings(block_s=10, learn_blocks=2, min_draft_tokens=1))


def watcher(*servers, **kw) -> tuple[Watcher, Clock]:
    clock = Clock()
    w = Watcher([(f"s{i}", s) for i, s in enumerate(servers)], kw.pop("settings", SETTINGS), clock=clock,
                wall=lambda: 1.7e9, **kw)
    return w, clock


def test_reads_fold_into_windows_and_restarts_are_counted_not_negative():
    s = FakeServer("http://a")
    s.script = [live(100, 150, (60, 50, 40)), live(200, 300, (120, 100, 80)), live(5, 2, (1, 1, 0)),
                live(105, 152, (61, 51, 40))]
    w, clock = watcher(s)
    events = []
    for _ in range(4):
        events += w.step()
        clock.t += 10
    sw = w.servers[0]
    assert (sw.reads, sw.restarts, sw.errors) == (4, 1, 0)
    f = sw.figures(clock.t)
    assert f.drafts == 200 and f.accepted == 300  # the two clean intervals; the restart's is dropped
    assert f.acceptance_rate == pytest.approx(300 / 600)
    assert sw.totals == {"drafts": 200, "draft_tokens": 600, "accepted": 300}
    assert [e.alert for e in events] == ["restart"]
    assert "restarted" in events[0].text and s.describes == 1


def test_a_server_that_fails_is_down_with_back_off_and_recovers():
    s = FakeServer("http://a")
    s.script = [live(1, 1), ServerUnreachable("cannot connect to http://a: refused"), ServerUnreachable("again"),
                ServerUnreachable("again"), ServerUnreachable("again"), live(2, 2)]
    w, clock = watcher(s)
    w.step()
    sw = w.servers[0]
    waits = []
    events = []
    for _ in range(4):
        clock.t = sw.next_read
        before = clock.t
        events += w.step()
        waits.append(sw.next_read - before)
    assert waits == [10, 20, 40, 40]  # doubled from the interval, capped at --max-backoff
    assert not sw.up and sw.errors == 4 and "again" in sw.last_error
    assert [(e.alert, e.raised) for e in events] == [("down", True)]  # raised once, not per failure
    assert "refused" in events[0].text and "next try in 10 s" in events[0].text
    clock.t = sw.next_read
    events = w.step()
    assert sw.up and sw.backoff == 0 and [(e.alert, e.raised) for e in events] == [("down", False)]
    assert w.raised_ever == 1


def test_a_slow_read_counts_as_down_and_blocks_no_other_server():
    slow, fast = FakeServer("http://slow"), FakeServer("http://fast")
    slow.script = ["slow"]
    fast.script = [live(1, 1), live(2, 2)]
    w, clock = watcher(slow, fast)
    events = w.step()
    assert [(e.server, e.alert) for e in events] == [("s0", "down")]
    assert "no answer within 0.5 s" in events[0].text
    assert w.servers[1].up and w.servers[1].reads == 1
    clock.t += 10
    w.step()  # the slow read is still under way: no second read is started for it
    assert w.servers[1].reads == 2 and slow.script == []
    slow.release.set()
    w.close()


def test_a_server_without_counters_is_named_as_such():
    s = FakeServer("http://a")
    s.script = [live(0, 0, spec=False), live(0, 0, spec=False), live(1, 1)]
    w, clock = watcher(s)
    ev = w.step()
    assert [(e.alert, e.raised) for e in ev] == [("no-counters", True)] and "no spec-decode counters" in ev[0].text
    clock.t += 10
    assert w.step() == []
    clock.t += 10
    ev = w.step()  # counters appeared: cleared, and the pair is a restart, not an interval
    assert ("no-counters", False) in [(e.alert, e.raised) for e in ev] and w.servers[0].restarts == 1


MODEL = CostModel(levels=(LevelCost(1, 1.0, 0.1, 0.0, 0.0), LevelCost(32, 1.0, 0.6, 0.0, 0.0)), k=3,
                  model_id="m", spec_method="ngram", source="test")


def test_costing_time_is_raised_when_acceptance_collapses_at_high_batch():
    s = FakeServer("http://a")
    s.script = [live(0, 0, (0, 0, 0), running=32), live(1000, 2400, (900, 800, 700), running=32)]
    s.script += [live(1000 + 1000 * i, 2400 + 30 * i, (900 + 20 * i, 800 + 10 * i, 700), running=32)
                 for i in range(1, 8)]
    w, clock = watcher(s, baseline=MODEL)
    events = []
    for _ in range(len(s.script)):
        events += w.step()
        clock.t += 10
    raised = [e for e in events if e.alert == "costing-time" and e.raised]
    assert len(raised) == 1
    assert "speculation is costing time" in raised[0].text and "speculation off" in raised[0].text
    exp = w.servers[0].expectation
    assert exp.costing_time and exp.high < 1 and exp.best_k == 0 and exp.batch == 32


def test_a_baseline_of_another_model_is_refused_for_that_server():
    s = FakeServer("http://a", model="other")
    s.script = [live(1, 1, (1,), running=1), live(2, 2, (2,), running=1)]
    w, clock = watcher(s, baseline=MODEL)
    w.step()
    clock.t += 10
    w.step()
    sw = w.servers[0]
    assert "model 'm'" in sw.baseline_refused and sw.expectation is None


def test_drift_alarm_is_raised_and_cleared():
    s = FakeServer("http://a")
    reads, d, a = [], 0.0, 0.0
    for rate in [0.6, 0.62, 0.58] + [0.2] * 6 + [0.9] * 20:
        d += 100
        a += rate * 300
        reads.append(live(d, a))
    s.script = [live(0, 0)] + reads
    w, clock = watcher(s)
    events = []
    for _ in range(len(s.script)):
        events += w.step()
        clock.t += 10
    drift = [(e.raised, e.text) for e in events if e.alert == "drift"]
    assert [r for r, _ in drift] == [True, False]
    assert "acceptance fell" in drift[0][1] and "0.200" in drift[0][1]


def test_canaries_run_on_their_schedule_and_a_suspect_round_is_an_alert():
    s = FakeServer("http://a")
    s.script = [live(i, i) for i in range(7)]
    verdicts = iter(["identical", "suspect", "identical"])
    calls = []

    def canary(server) -> CanaryStatus:
        calls.append(server.base_url)
        v = next(verdicts)
        return CanaryStatus(verdict=v, summary=f"canary {v}", wall=1.7e9)

    settings = WatchSettings(interval_s=10, window_s=60, timeout_s=0.5, canary_every_s=20)
    w, clock = watcher(s, canary=canary, settings=settings)
    events = []
    for _ in range(6):
        events += w.step()
        clock.t += 10
        w.servers[0].canary_future and w.servers[0].canary_future.result(5)  # rounds run in the pool
    events += w.step()
    assert len(calls) == 3  # at 0, 20 and 40 s
    assert [(e.alert, e.raised) for e in events if e.alert == "canary"] == [("canary", True), ("canary", False)]
    assert w.servers[0].canary_counts == {"identical": 2, "suspect": 1}


def test_a_canary_round_that_raises_is_an_error_verdict_not_a_crash():
    s = FakeServer("http://a")
    s.script = [live(i, i) for i in range(3)]

    def canary(server) -> CanaryStatus:
        raise RuntimeError("boom")

    w, clock = watcher(s, canary=canary, settings=WatchSettings(interval_s=10, window_s=60, canary_every_s=100))
    w.step()
    w.servers[0].canary_future.exception(5)
    clock.t += 10
    w.step()
    assert w.servers[0].canary.verdict == "error" and "boom" in w.servers[0].canary.summary
    assert w.servers[0].canary_counts == {"error": 1} and "canary" not in w.servers[0].alerts


def test_names_must_be_distinct_and_events_are_bounded():
    with pytest.raises(ValueError):
        Watcher([("a", FakeServer("http://a")), ("a", FakeServer("http://b"))], SETTINGS)
    s = FakeServer("http://a")
    w, clock = watcher(s)
    for i in range(700):
        w._set(w.servers[0], "down", "x" if i % 2 == 0 else None)
    assert len(w.events) == 500 and w.raised_ever == 350


def test_run_stops_at_until_and_on_stop():
    s = FakeServer("http://a")
    s.script = [live(i, i) for i in range(100)]
    w = Watcher([("a", s)], WatchSettings(interval_s=0.05, window_s=1, timeout_s=0.5))
    stop = threading.Event()
    w.run(stop, until=w.clock() + 0.3)
    assert 2 <= w.servers[0].reads <= 8
    stop.set()
    n = w.servers[0].reads
    w.run(stop)
    assert w.servers[0].reads == n


def test_exporter_serves_the_catalogue_over_http():
    a, b = FakeServer("http://a"), FakeServer("http://b", model="other")
    a.script = [live(0, 0, (0, 0, 0), running=2), live(100, 180, (80, 60, 40), running=4)]
    b.script = [live(0, 0, (0, 0, 0), running=1), live(100, 30, (20, 10, 0), running=1)]
    w, clock = watcher(a, b, baseline=MODEL)
    w.step()
    clock.t += 10
    w.step()
    exp = Exporter(w, "127.0.0.1", 0)
    try:
        text = httpx.get(exp.url, timeout=5).text
    finally:
        exp.close()
    samples = {}
    for fam in text_string_to_metric_families(text):
        assert fam.name in {m.name.removesuffix("_total") for m in METRICS.values()}
        for smp in fam.samples:
            samples[(smp.name, tuple(sorted(smp.labels.items())))] = smp.value

    def get(name, **labels):
        return samples[(name, tuple(sorted(labels.items())))]

    assert get("specadapt_acceptance_ratio", server="s0") == pytest.approx(180 / 300)
    assert get("specadapt_acceptance_ratio", server="s1") == pytest.approx(30 / 300)
    assert get("specadapt_acceptance_ratio", server=FLEET) == pytest.approx(210 / 600)
    assert get("specadapt_acceptance_length_tokens", server="s0") == pytest.approx(2.8)
    assert get("specadapt_position_acceptance_ratio", server="s0", position="1") == pytest.approx(0.6)
    assert get("specadapt_running_requests", server="s0") == pytest.approx(3.0)
    assert get("specadapt_running_requests", server=FLEET) == pytest.approx(4.0)
    assert get("specadapt_draft_tokens_per_second", server="s0") == pytest.approx(30.0)
    assert get("specadapt_accepted_tokens_total", server="s0") == 180
    assert get("specadapt_server_up", server="s1") == 1
    assert get("specadapt_speculation_counters", server="s0") == 1
    assert get("specadapt_server_restarts_total", server="s0") == 0
    e = w.servers[0].expectation
    assert get("specadapt_expected_speedup_ratio", server="s0", bound="low") == pytest.approx(e.low)
    assert get("specadapt_costing_time", server="s0") == 0
    assert get("specadapt_model_best_k", server="s0") == e.best_k
    assert ("specadapt_expected_speedup_ratio", (("bound", "point"), ("server", "s1"))) not in samples  # refused
    assert get("specadapt_acceptance_drift_threshold", server="s0") == pytest.approx(SETTINGS.drift.h)
    info = [k for k in samples if k[0] == "specadapt_watch_info"]
    assert info and dict(info[0][1])["interval_seconds"] == "10"


def test_console_lines_and_end_report():
    s = FakeServer("http://a")
    s.script = [live(0, 0, (0,), running=1), live(10, 15, (5,), running=1), ServerUnreachable("gone")]
    w, clock = watcher(s)
    events = []
    for _ in range(3):
        events += w.step()
        clock.t += 10
    assert event_line(events[-1]).endswith("ALERT down on s0: gone; next try in 10 s")
    assert "s0: down; acceptance 0.500" in status_lines(w)[0]
    assert status_table(w).row_count == 2
    rep = watch_report(w, 1.7e9, "interrupted", None)
    assert rep.servers[0].reads == 2 and rep.servers[0].errors == 1 and rep.servers[0].alerts == {"down": events[-1].text}
    assert rep.events[-1].alert == "down" and rep.alerts_raised == 1 and rep.end_reason == "interrupted"
    assert rep.drift_h == pytest.approx(SETTINGS.drift.h)

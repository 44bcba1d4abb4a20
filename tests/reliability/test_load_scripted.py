"""Arrival rates, multi-turn replay and goodput against the scripted server (real HTTP on
loopback): the figures are checked against the records and the server's own log, never
against timings."""

from __future__ import annotations

import json
import math

import httpx
from click.testing import CliRunner

from specadapt.analysis.slo import is_good
from specadapt.cli import cli
from specadapt.load.arrivals import schedule_ns
from specadapt.orchestration.probe import run_probe
from specadapt.records import ChatMessage, Prompt, RequestSettings, read_compare_report
from specadapt.records.load import LoadSettings
from specadapt.testing import script


def conversation(tag: str, fail_turn: int | None = None) -> Prompt:
    """Two turns; each message is the script of its answer (the scripted server reads the last one)."""
    def msg(turn):
        extra = dict(fault="status", status=500) if turn == fail_turn else {}
        return script(id=f"{tag}-t{turn}", ttft_ms=5, itl_ms=2, tokens=4, **extra)
    return Prompt(id=tag, category="chat", messages=[ChatMessage(role="user", content=msg(0))],
                  turns=[msg(1), msg(2)])


def test_probe_at_rates_replays_conversations_and_reports_lag_and_goodput(server, scripted_url):
    prompts = [conversation("c1"), conversation("c2", fail_turn=1),
               Prompt(id="plain", category="plain", prompt=script(id="plain", ttft_ms=5, itl_ms=2, tokens=6))]
    load = LoadSettings(request_rates=[40.0, math.inf], seed=3, slo_ms={"ttft": 10_000.0, "e2e": 0.001})
    report = run_probe(server, prompts, RequestSettings(max_tokens=8), warmup=0, load=load)
    recs = report.requests
    # one record per turn, in order; the failed turn ends its conversation
    c2 = [(r.turn, r.ok, r.error_kind) for r in recs if r.prompt_id == "c2" and r.request_rate == 40.0]
    assert c2 == [(0, True, None), (1, False, "http_status"), (2, False, "not_sent")]
    assert [r.turn for r in recs if r.prompt_id == "c1" and r.request_rate == 40.0] == [0, 1, 2]
    # the schedule: first turns carry it, later turns none
    at40 = [r for r in recs if r.request_rate == 40.0]
    sched = [r.scheduled_at_ns for r in at40 if r.turn == 0]  # the seeded schedule, from the level's start
    assert [x - sched[0] for x in sched] == schedule_ns(40.0, 3, 1.0, 3)
    at_inf = [r for r in recs if r.request_rate == math.inf and r.turn == 0]
    assert len({r.scheduled_at_ns for r in at_inf}) == 1  # all at once, after the previous rate had finished
    assert at_inf[0].scheduled_at_ns >= max(r.sent_at_ns + (r.e2e_ns or 0) for r in at40)
    assert all(r.scheduled_at_ns is None for r in at40 if r.turn > 0)
    # the server saw turn 2 with the whole history: its own answers as the assistant messages
    log = httpx.get(scripted_url + "/_script/log").json()
    history = log["c1-t2"]["messages"]
    assert [role for role, _ in history] == ["user", "assistant", "user", "assistant", "user"]
    assert history[1][1] == next(r.text for r in at40 if r.prompt_id == "c1" and r.turn == 0)
    assert "c2-t2" not in log or log["c2-t2"]["attempt"] == 0  # never sent
    # per-rate figures agree with the records
    lv40, lvinf = report.rates
    assert (lv40.request_rate, lvinf.request_rate) == (40.0, math.inf)
    lags = sorted(r.sent_at_ns - r.scheduled_at_ns for r in at40 if r.turn == 0)
    assert lv40.send_lag.requests == 3 and lv40.send_lag.max_ms == lags[-1] / 1e6
    assert lv40.send_lag.client_limited == any("request rate 40" in n for n in report.notes)
    assert lvinf.send_lag.scheduled_rate is None  # all at once: no rate to keep
    good = [r for r in at40 if is_good(r, load.slo_ms)]
    assert lv40.goodput.good == len(good) == 0  # e2e <= 1 us: nothing is good
    assert lv40.goodput.share_per_slo["ttft"] == sum(1 for r in at40 if r.ok) / len(at40)
    assert report.goodput.requests == len(recs) and report.settings.load == load


def test_compare_cli_at_rates_with_an_slo_writes_consistent_figures(scripted_url, tmp_path):
    prompts = tmp_path / "p.jsonl"
    lines = [json.dumps({"id": f"p{i}", "category": cat, "prompt": script(id=f"cmp-{i}", ttft_ms=3, itl_ms=1,
                                                                              tokens=4)})
             for i, cat in enumerate(["a", "b"])]
    prompts.write_text("\n".join(lines) + "\n")
    out = tmp_path / "r.json"
    res = CliRunner().invoke(cli, ["compare", "--off", scripted_url, "--on", scripted_url, "--prompts", str(prompts),
                                    "--concurrency", "1", "--repeat", "2", "--warmup", "0", "--max-tokens", "4",
                                    "--request-rate", "100,inf", "--duration", "0.04", "--slo", "ttft=5s,tpot=1s",
                                    "--no-triage", "--json", str(out)])
    assert res.exit_code == 0, res.output
    report = read_compare_report(out)
    assert [lv.request_rate for lv in report.rate_levels] == [100.0, math.inf]
    lv = report.rate_levels[0]
    recs = [r for r in report.requests if r.request_rate == 100.0]
    assert len(recs) == 2 * 2 * 4  # sides x repeats x ceil(100 * 0.04)
    assert lv.goodput.off.good == sum(1 for r in recs if r.side == "off" and is_good(r, report.settings.load.slo_ms))
    assert lv.send_lag_on.requests == sum(1 for r in recs if r.side == "on")
    assert set(lv.by_category) == {"a", "b"}
    assert "req/s" in res.output and "goodput" in res.output
    bad = CliRunner().invoke(cli, ["compare", "--off", scripted_url, "--on", scripted_url, "--slo", "ttfb=1ms"])
    assert bad.exit_code == 2 and "--slo: unknown metric 'ttfb'; use ttft, tpot, itl, e2e" in bad.output


def test_probe_reports_the_clients_own_load_and_flags_a_client_limited_run(server):
    """The report carries the client's CPU and event-loop lag; a lag over the limit puts the
    'client was the bottleneck' line in the notes (the figures are swapped in, never timed)."""
    from specadapt.analysis import probe_report as runner
    from specadapt.analysis.client_load import LAG_P99_LIMIT_MS

    prompts = [Prompt(id=f"p{i}", prompt=script(id=f"cl{i}", ttft_ms=5, itl_ms=2, tokens=6)) for i in range(3)]
    report = run_probe(server, prompts, RequestSettings(max_tokens=8), concurrency=3, warmup=0)
    c = report.client
    assert c is not None and c.wall_s > 0 and c.lag_samples > 0
    assert c.chunks >= sum(len(r.chunk_ns) for r in report.requests) > 0
    quiet = c.model_copy(update={"loop_lag_ms_p99": LAG_P99_LIMIT_MS, "cpu_fraction": 0.1})
    busy = quiet.model_copy(update={"loop_lag_ms_p99": LAG_P99_LIMIT_MS + 0.5})
    flagged = []
    for load in (quiet, busy):
        report.client = load
        flagged.append(any(n.startswith("the probe client was the bottleneck") for n in runner._notes(report)))
    assert flagged == [False, True]


def test_a_share_replays_conversations_like_one_process(scripted_url):
    """What a worker runs (execute_share): each conversation's turns in order with the server's
    own answers as history, one record per turn, a failed turn's later turns recorded as not sent,
    every record handed to on_record with its job, and each record marked with its target."""
    from specadapt.load.client import run as run_loop
    from specadapt.load.plan import Share, closed_jobs
    from specadapt.load.spread import Target, execute_share

    prompts = [conversation("w1"), conversation("w2", fail_turn=1)]
    share = Share(worker=0, jobs=tuple(closed_jobs(prompts)), settings=RequestSettings(max_tokens=8), concurrency=2)
    handed: list[tuple[int, int, str | None]] = []
    pairs = run_loop(execute_share(share, [Target(base_url=scripted_url, model="scripted")], 0,
                                   on_record=lambda job, rec: handed.append((job.index, rec.turn, rec.error_kind))))
    got = sorted((j.index, r.prompt_id, r.turn, r.ok, r.error_kind) for j, r in pairs)
    assert got == [(0, "w1", 0, True, None), (0, "w1", 1, True, None), (0, "w1", 2, True, None),
                   (1, "w2", 0, True, None), (1, "w2", 1, False, "http_status"), (1, "w2", 2, False, "not_sent")]
    assert sorted(handed) == sorted((j.index, r.turn, r.error_kind) for j, r in pairs)
    assert {r.target for _, r in pairs} == {scripted_url}
    w1 = sorted((r for j, r in pairs if j.index == 0), key=lambda r: r.turn)
    log = httpx.get(scripted_url + "/_script/log").json()
    history = log["w1-t2"]["messages"]
    assert [role for role, _ in history] == ["user", "assistant", "user", "assistant", "user"]
    assert [text for role, text in history if role == "assistant"] == [r.text for r in w1[:2]]
    assert all(r.text for r in w1[:2])
    assert "w2-t2" not in log or log["w2-t2"]["attempt"] == 0  # never sent

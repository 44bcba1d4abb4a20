"""Spread load at arrival rates, for a duration and with SLOs: worker processes and several replicas
against the scripted server (real HTTP on loopback, real spawned processes), the same figures and
the same partial-report behaviour as one process. The counts and figures are checked against the
records and the server's own log, never against timings."""

from __future__ import annotations

import json
import math

import httpx
import psutil
import pytest
from click.testing import CliRunner
from reliability.test_server_death import managed_scripted

from specadapt.adapters.vllm import VLLMServer
from specadapt.analysis.slo import is_good
from specadapt.cli import cli
from specadapt.load.arrivals import schedule_ns
from specadapt.orchestration.probe import run_probe
from specadapt.records import Prompt, RequestSettings, read_compare_report, read_report
from specadapt.records.load import LoadSettings
from specadapt.testing import script

FAST = dict(ttft_ms=3, itl_ms=1, tokens=4)


def prompts(tag: str, n: int = 4) -> list[Prompt]:
    return [Prompt(id=f"{tag}{i}", category="ab"[i % 2], prompt=script(id=f"{tag}{i}", **FAST)) for i in range(n)]


def children() -> set[int]:
    """This process's children, without multiprocessing's resource tracker (one per parent, for its life)."""
    return {p.pid for p in psutil.Process().children(recursive=True)
            if "resource_tracker" not in " ".join(p.cmdline())}


@pytest.fixture(scope="module", autouse=True)
def stop_the_resource_tracker():
    yield
    from multiprocessing import resource_tracker
    resource_tracker._resource_tracker._stop()


def test_rates_and_slos_with_worker_processes_match_the_one_process_figures(server):
    """Two workers at 200 req/s and at inf: every arrival of the seeded schedule is sent once, each
    first send carries its scheduled offset, the workers share the arrivals, and each rate level's
    goodput and send lag are computed from its records exactly as in one process."""
    load = LoadSettings(request_rates=[200.0, math.inf], duration_s=0.03, seed=4,
                        slo_ms={"ttft": 10_000.0, "e2e": 0.001})
    before = children()
    report = run_probe(server, prompts("wr"), RequestSettings(max_tokens=4), warmup=0, load=load, workers=2)
    assert children() == before  # every worker stopped
    assert not report.partial and report.scale.executor == "workers"
    at200 = [r for r in report.requests if r.request_rate == 200.0]
    sched = schedule_ns(200.0, 6, 1.0, 4)  # ceil(200 * 0.03) arrivals
    first = min(r.scheduled_at_ns for r in at200)
    assert sorted(r.scheduled_at_ns - first for r in at200) == sched
    assert [r.prompt_id for r in sorted(at200, key=lambda r: r.scheduled_at_ns)] == ["wr0", "wr1", "wr2", "wr3",
                                                                                      "wr0", "wr1"]
    at_inf = [r for r in report.requests if r.request_rate == math.inf]
    assert len(at_inf) == 4 and len({r.scheduled_at_ns for r in at_inf}) == 1
    assert {r.concurrency for r in report.requests} == {0} and all(r.ok for r in report.requests)
    assert [w.finished for w in report.scale.workers] == [5, 5]  # arrivals dealt round robin
    lv200, lvinf = report.rates
    assert lv200.send_lag.requests == 6 and lvinf.send_lag.requests == 4
    slo = load.slo_ms
    assert lv200.goodput.good == sum(1 for r in at200 if is_good(r, slo)) == 0  # e2e 1 us: nothing is good
    assert report.goodput.requests == 10


def test_a_duration_over_two_replicas_and_two_workers_keeps_every_stream_busy_until_time_is_up(tmp_path, server):
    """--duration at concurrency 4 over two replicas (two URLs of one scripted server) and two
    workers: each worker cycles its own jobs, none is sent after the duration, the requests go
    round robin over the replicas, and each replica has its own row."""
    other = server.base_url.replace("127.0.0.1", "localhost")
    replica = VLLMServer(other)
    try:
        report = run_probe([server, replica], prompts("dr"), RequestSettings(max_tokens=4), concurrency=4, warmup=0,
                           load=LoadSettings(duration_s=2.0, slo_ms={"e2e": 60_000.0}), workers=2)
    finally:
        replica.close()
    recs = report.requests
    assert len(recs) > 8  # more than the prompt set: the jobs were cycled
    assert max(r.sent_at_ns for r in recs) < 2.0e9  # the workers count from the parent's t0
    assert {r.target for r in recs} == {server.base_url, other}
    assert [rep.target for rep in report.scale.replicas] == [server.base_url, other]
    assert sum(rep.latency.requests for rep in report.scale.replicas) == len(recs)
    assert report.goodput.good == report.goodput.requests == len(recs)  # a 60 s e2e objective
    repeats = {r.repeat for r in recs}
    assert repeats == set(range(max(repeats) + 1))  # passes counted without gaps


def test_probe_cli_spreads_rates_with_an_slo_over_workers_and_replicas(tmp_path, scripted_url):
    prompt_file = tmp_path / "p.jsonl"
    prompt_file.write_text("".join(json.dumps({"id": p.id, "prompt": p.prompt}) + "\n" for p in prompts("cli")))
    out = tmp_path / "r.json"
    other = scripted_url.replace("127.0.0.1", "localhost")
    res = CliRunner().invoke(cli, ["probe", "--url", scripted_url, "--url", other, "--workers", "2",
                                   "--prompts", str(prompt_file), "--warmup", "0", "--max-tokens", "4",
                                   "--request-rate", "100", "--repeat", "2", "--slo", "ttft=10s", "--json", str(out)])
    assert res.exit_code == 0, res.output
    report = read_report(out)
    assert [lv.request_rate for lv in report.rates] == [100.0] and report.rates[0].goodput.requests == 8
    assert report.scale.executor == "workers" and len(report.scale.replicas) == 2
    assert "goodput" in res.output


def test_compare_spreads_each_block_over_workers(tmp_path, scripted_url):
    """compare --workers 2: both sides' blocks at concurrency 2 and at a rate are sent by the
    workers; every request is there once, paired, and the report says how the load was sent."""
    prompt_file = tmp_path / "p.jsonl"
    prompt_file.write_text("".join(json.dumps({"id": p.id, "prompt": p.prompt}) + "\n" for p in prompts("cw")))
    out = tmp_path / "r.json"
    before = children()
    res = CliRunner().invoke(cli, ["compare", "--off", scripted_url, "--on", scripted_url, "--workers", "2",
                                   "--prompts", str(prompt_file), "--concurrency", "1,2", "--repeat", "2",
                                   "--warmup", "1", "--max-tokens", "4", "--request-rate", "50", "--no-triage",
                                   "--json", str(out)])
    assert res.exit_code == 0, res.output
    assert children() == before
    report = read_compare_report(out)
    assert report.settings.workers == 2
    assert [lv.pairs for lv in report.levels] == [8, 8] and report.rate_levels[0].pairs == 8
    assert all(r.ok for r in report.requests) and len(report.requests) == 2 * (8 + 8 + 8)
    assert any("worker processes" in n for n in report.notes)
    assert report.counts["identical"] == 4


@pytest.mark.parametrize("workers", [1, 2], ids=["one-process", "workers"])
def test_a_server_that_dies_at_a_rate_gives_the_same_partial_report_on_every_path(tmp_path, workers):
    """A managed server exits mid-run at an arrival rate: on one process and with workers the run
    stops, keeps the requests that finished before, names the exit code and keeps the log tail."""
    ps = prompts("ok", 3) + [Prompt(id="dies", prompt=script(id="dies", **FAST, fault="exit", exit_code=7,
                                                            fault_after=2))]
    # the later prompts wait a minute for their first token, so none can finish before the server exits, however
    # the machine's load orders the sends of two workers
    ps += [Prompt(id=f"never{i}", prompt=script(id=f"never{i}", **{**FAST, "ttft_ms": 60_000})) for i in range(4)]
    with managed_scripted(tmp_path) as server:
        log = server.base_url
        report = run_probe(server, ps, RequestSettings(max_tokens=4), warmup=0, workers=workers,
                           load=LoadSettings(request_rates=[20.0]))
    assert report.partial and report.partial_reason.startswith("the vllm server exited with code 7 during the run")
    assert "about to crash on purpose" in report.notes[-1]
    assert all(r.ok for r in report.requests) and {r.prompt_id for r in report.requests} <= {"ok0", "ok1", "ok2"}
    assert not report.acceptance.known
    with pytest.raises(httpx.HTTPError):
        httpx.get(log + "/health", timeout=2)

"""Spreading a run: the plan (``closed_jobs``, ``rate_jobs``), the split over workers, the
one-process order of a run's records (``RunResult``), counters summed per distinct server, and
merged reports (no server; records made by hand)."""

from __future__ import annotations

import dataclasses
import math
import pickle

import pytest

from specadapt.analysis.acceptance import acceptance_summary
from specadapt.analysis.latency import latency_summary
from specadapt.analysis.merge import merge_reports, setting_difference
from specadapt.analysis.probe_report import build_probe_report as build_report
from specadapt.analysis.scale_report import replica_results, server_window, summed_counters
from specadapt.errors import UsageError
from specadapt.load.arrivals import schedule_ns
from specadapt.load.engine import Job
from specadapt.load.plan import RunResult, Stamp, closed_jobs, rate_jobs, split
from specadapt.load.spread import Target, portable
from specadapt.records import (
    CounterSnapshot,
    ProbeReport,
    ProbeSettings,
    Prompt,
    RequestRecord,
    RequestSettings,
    ScaleLayout,
    ServerInfo,
)
from specadapt.records.load import LoadSettings

PROMPTS = [Prompt(id=f"p{i}", prompt=f"text {i}", category="a" if i % 2 else "b") for i in range(5)]
REQ = RequestSettings(max_tokens=7, request_timeout_s=9)


# --- the plan: closed loop --------------------------------------------------------------------------
def test_closed_jobs_are_the_one_process_order_round_robin_over_replicas():
    jobs = closed_jobs(PROMPTS, repeat=2, replicas=3)
    assert [(j.index, j.prompt.id, j.repeat, j.copy_index, j.offset_ns) for j in jobs] == [
        (i, f"p{i % 5}", i // 5, 0, None) for i in range(10)]
    assert [j.target for j in jobs] == [0, 1, 2, 0, 1, 2, 0, 1, 2, 0]
    assert {j.target for j in closed_jobs(PROMPTS, repeat=2)} == {0}  # one server by default
    with pytest.raises(ValueError, match="^at least one replica$"):
        closed_jobs(PROMPTS, 1, replicas=0)


def test_closed_jobs_go_repeat_by_repeat_then_copy_by_copy_then_prompt_by_prompt():
    jobs = closed_jobs(PROMPTS[:2], repeat=2, copies=3, replicas=2, first_repeat=4)
    assert [(j.index, j.repeat, j.copy_index, j.prompt.id, j.target) for j in jobs] == [
        (0, 4, 0, "p0", 0), (1, 4, 0, "p1", 1), (2, 4, 1, "p0", 0), (3, 4, 1, "p1", 1),
        (4, 4, 2, "p0", 0), (5, 4, 2, "p1", 1), (6, 5, 0, "p0", 0), (7, 5, 0, "p1", 1),
        (8, 5, 1, "p0", 0), (9, 5, 1, "p1", 1), (10, 5, 2, "p0", 0), (11, 5, 2, "p1", 1)]
    assert closed_jobs([], repeat=3) == [] and closed_jobs(PROMPTS, repeat=0) == []


# --- the plan: arrival rates ------------------------------------------------------------------------
def test_rate_jobs_of_a_probe_count_passes_as_repeats_on_the_seeded_schedule():
    load = LoadSettings(request_rates=[5.0], seed=11, burstiness=0.5)
    jobs = rate_jobs(PROMPTS[:3], 5.0, load, passes=2, replicas=2)
    assert [j.offset_ns for j in jobs] == schedule_ns(5.0, 6, 0.5, 11)
    assert [(j.index, j.prompt.id, j.repeat, j.copy_index, j.target) for j in jobs] == [
        (0, "p0", 0, 0, 0), (1, "p1", 0, 0, 1), (2, "p2", 0, 0, 0),
        (3, "p0", 1, 0, 1), (4, "p1", 1, 0, 0), (5, "p2", 1, 0, 1)]
    assert len({j.offset_ns for j in jobs}) == 6  # a real schedule, not all at once
    assert [j.offset_ns for j in rate_jobs(PROMPTS[:3], 5.0, load.model_copy(update={"seed": 12}))] != \
        [j.offset_ns for j in jobs[:3]]  # another seed, another schedule


def test_rate_jobs_of_an_ab_block_are_one_repeat_seeded_per_block_with_the_pass_as_copy():
    load = LoadSettings(request_rates=[5.0], seed=11)
    jobs = rate_jobs(PROMPTS[:2], 5.0, load, block=3, passes=2)
    assert [j.offset_ns for j in jobs] == schedule_ns(5.0, 4, 1.0, 11 + 3)
    assert [(j.index, j.prompt.id, j.repeat, j.copy_index, j.target) for j in jobs] == [
        (0, "p0", 3, 0, 0), (1, "p1", 3, 0, 0), (2, "p0", 3, 1, 0), (3, "p1", 3, 1, 0)]
    first = rate_jobs(PROMPTS[:2], 5.0, load, block=0)  # block 0: the seed itself, repeat 0
    assert [j.offset_ns for j in first] == schedule_ns(5.0, 2, 1.0, 11)
    assert [(j.repeat, j.copy_index) for j in first] == [(0, 0), (0, 0)]


@pytest.mark.parametrize("block", [None, 2])
def test_rate_jobs_with_a_duration_send_ceil_rate_times_duration_prompts_cycled(block):
    load = LoadSettings(request_rates=[3.0], duration_s=2.1, seed=5)
    jobs = rate_jobs(PROMPTS[:3], 3.0, load, passes=9, block=block)  # ceil(6.3) = 7 arrivals, not 3 * 9
    assert len(jobs) == 7 and [j.prompt.id for j in jobs] == ["p0", "p1", "p2", "p0", "p1", "p2", "p0"]
    assert [j.offset_ns for j in jobs] == schedule_ns(3.0, 7, 1.0, 5 + (block or 0))
    passes = [0, 0, 0, 1, 1, 1, 2]
    if block is None:
        assert [(j.repeat, j.copy_index) for j in jobs] == [(p, 0) for p in passes]
    else:
        assert [(j.repeat, j.copy_index) for j in jobs] == [(2, p) for p in passes]
    assert len(rate_jobs(PROMPTS[:3], 0.1, load)) == 1  # ceil(0.21): at least one arrival


def test_rate_jobs_at_inf_send_every_pass_at_once_whatever_the_duration():
    for load in (LoadSettings(request_rates=[math.inf]), LoadSettings(request_rates=[math.inf], duration_s=60)):
        jobs = rate_jobs(PROMPTS[:2], math.inf, load, passes=3)
        assert [j.offset_ns for j in jobs] == [0] * 6
        assert [(j.prompt.id, j.repeat) for j in jobs] == [("p0", 0), ("p1", 0), ("p0", 1), ("p1", 1),
                                                           ("p0", 2), ("p1", 2)]


# --- the split --------------------------------------------------------------------------------------
@pytest.mark.parametrize("n_jobs, concurrency, workers", [
    (10, 4, 2), (10, 5, 2), (10, 7, 3), (3, 8, 5), (10, 2, 4), (1, 1, 1), (7, 64, 7), (64, 9, 4)])
def test_every_job_once_and_the_concurrency_shares_sum_to_the_total(n_jobs, concurrency, workers):
    jobs = closed_jobs([Prompt(id=f"q{i}", prompt="x") for i in range(n_jobs)], 1)
    shares = split(jobs, REQ, concurrency, workers)
    used = min(workers, n_jobs, concurrency)
    assert [s.worker for s in shares] == list(range(used))
    indices = sorted(j.index for s in shares for j in s.jobs)
    assert indices == list(range(n_jobs))  # every job exactly once
    assert sum(s.concurrency for s in shares) == concurrency
    assert all(s.jobs and s.concurrency >= 1 for s in shares)
    # the formula: C // W streams each, one more for the first C mod W workers; job i to worker i mod W
    assert [s.concurrency for s in shares] == [concurrency // used + (w < concurrency % used) for w in range(used)]
    assert [[j.index for j in s.jobs] for s in shares] == [list(range(w, n_jobs, used)) for w in range(used)]
    assert all(s.settings is REQ for s in shares)


def test_more_workers_than_jobs_or_streams_use_fewer_workers():
    jobs = closed_jobs(PROMPTS, 1)
    assert len(split(jobs, REQ, concurrency=16, workers=8)) == 5  # 5 jobs
    assert len(split(jobs, REQ, concurrency=2, workers=8)) == 2  # 2 streams
    assert split([], REQ, concurrency=4, workers=2) == []
    assert [j.index for j in split(jobs, REQ, 3, 2)[1].jobs] == [1, 3]  # job i to worker i mod W
    for bad in ((0, 2), (2, 0), (None, 0)):
        with pytest.raises(ValueError, match="^workers and concurrency must be at least 1$"):
            split(jobs, REQ, *bad)


def test_a_closed_split_carries_duration_cycle_and_stamp_to_every_share():
    stamp = Stamp(side="on", concurrency=4, warmup=False)
    shares = split(closed_jobs(PROMPTS, 1), REQ, 4, 3, duration_s=2.5, cycle="copy_index", stamp=stamp)
    assert [(s.concurrency, s.duration_s, s.cycle, s.stamp) for s in shares] == [
        (2, 2.5, "copy_index", stamp), (1, 2.5, "copy_index", stamp), (1, 2.5, "copy_index", stamp)]
    plain = split(closed_jobs(PROMPTS, 1), REQ, 2, 2)
    assert [(s.duration_s, s.cycle, s.stamp) for s in plain] == [(None, "repeat", Stamp())] * 2


@pytest.mark.parametrize("n_jobs, workers", [(7, 3), (2, 5), (1, 1), (8, 8)])
def test_an_open_loop_split_deals_the_arrivals_round_robin_with_their_offsets(n_jobs, workers):
    load = LoadSettings(request_rates=[10.0], seed=1)
    jobs = rate_jobs([Prompt(id=f"q{i}", prompt="x") for i in range(n_jobs)], 10.0, load)
    stamp = Stamp(concurrency=0, request_rate=10.0)
    shares = split(jobs, REQ, None, workers, duration_s=9.0, stamp=stamp)
    used = min(workers, n_jobs)  # no stream count to cut by: arrivals do not wait for one
    assert [s.worker for s in shares] == list(range(used))
    assert [[(j.index, j.offset_ns) for j in s.jobs] for s in shares] == [
        [(j.index, j.offset_ns) for j in jobs[w::used]] for w in range(used)]
    assert all(s.concurrency is None and s.duration_s is None and s.stamp == stamp for s in shares)
    assert sorted(j.index for s in shares for j in s.jobs) == list(range(n_jobs))


def test_jobs_shares_and_portable_targets_pickle_for_other_processes():
    jobs = rate_jobs([Prompt(id="c", messages=[{"role": "user", "content": "hi"}], turns=["more"])] + PROMPTS[:2],
                     4.0, LoadSettings(request_rates=[4.0], seed=2), passes=2, replicas=2)
    (share,) = split(jobs, REQ, None, 1, stamp=Stamp(side="off", request_rate=4.0, warmup=True))
    back = pickle.loads(pickle.dumps(share))
    assert back == share and back.jobs[0].prompt.turns == ["more"] and back.settings == REQ
    target = portable(Target("https://h:1", "m", {"Authorization": "Bearer k"}, verify="/ca.pem"))
    assert pickle.loads(pickle.dumps(target)) == target
    with pytest.raises(dataclasses.FrozenInstanceError):
        share.worker = 2  # type: ignore[misc]


# --- a run's records in the one-process order ----------------------------------------------------
def rec(pid: str, sent: int, tokens: int = 3, ok: bool = True, target: str = "", **kw) -> RequestRecord:
    chunks = [sent % 7 + 10 + 5 * i for i in range(tokens)]
    return RequestRecord(prompt_id=pid, category=kw.pop("category", "a"), api="completions", ok=ok,
                         sent_at_ns=sent, chunk_ns=chunks if ok else [], chunk_tokens=[1] * tokens if ok else [],
                         e2e_ns=chunks[-1] + 2 if ok else None, output_tokens=tokens if ok else 0, target=target,
                         token_source="usage" if ok else None, error=None if ok else "HTTP 503: x",
                         error_kind=None if ok else "http_status", status_code=200 if ok else 503, **kw)


def job(index: int, repeat: int = 0, copy: int = 0) -> Job:
    return Job(index=index, prompt=PROMPTS[index % 5], repeat=repeat, copy_index=copy)


def test_records_come_in_repeat_copy_job_turn_order_whatever_order_they_came_back_in():
    pairs = [(job(1, repeat=1), rec("r1j1", 1)), (job(0, copy=1), rec("c1j0", 2)),
             (job(2), rec("j2t1", 3, turn=1)), (job(2), rec("j2t0", 90, turn=0)),
             (job(5), rec("j5", 0)), (job(0, repeat=1, copy=0), rec("r1j0", 4)), (job(0), rec("j0", 99))]
    result = RunResult(pairs=pairs)
    assert [r.prompt_id for r in result.records] == ["j0", "j2t0", "j2t1", "j5", "c1j0", "r1j0", "r1j1"]
    assert all(any(r is p for _, p in pairs) for r in result.records)  # the same objects, not copies
    assert result.partial_reason is None and result.planned == 0 and RunResult().records == []


def test_a_request_that_came_back_twice_is_an_error():
    twice = RunResult(pairs=[(job(0), rec("a", 1)), (job(1), rec("b", 2)), (job(0), rec("a", 3))])
    with pytest.raises(AssertionError, match="^a request came back twice$"):
        _ = twice.records
    turns = RunResult(pairs=[(job(0), rec("c", 1, turn=0)), (job(0), rec("c", 2, turn=1))])
    assert [r.turn for r in turns.records] == [0, 1]  # a conversation's turns are not duplicates
    with pytest.raises(AssertionError, match="^a request came back twice$"):
        _ = RunResult(pairs=[*turns.pairs, (job(0), rec("c", 3, turn=1))]).records
    copies = RunResult(pairs=[(job(0), rec("x", 1)), (job(0, copy=1), rec("x", 1)), (job(0, repeat=1), rec("x", 1))])
    assert len(copies.records) == 3  # the same job in another copy or repeat is another request


# --- counters over several servers ---------------------------------------------------------------------
def snap(drafts, tokens, accepted, gen, pos=(), source="GET /metrics") -> CounterSnapshot:
    return CounterSnapshot(drafts=drafts, draft_tokens=tokens, accepted_tokens=accepted, generation_tokens=gen,
                           accepted_per_position=dict(enumerate(pos)), source=source)


def test_distinct_servers_sum_their_deltas():
    w1 = (snap(10, 40, 20, 100, (8, 7)), snap(30, 120, 50, 200, (20, 18)))
    w2 = (snap(5, 20, 1, 7, (1,)), snap(9, 36, 9, 30, (4, 2)))
    before, after = summed_counters([w1, w2])
    acc = acceptance_summary(before, after)
    assert (acc.drafts, acc.draft_tokens, acc.accepted_tokens, acc.generation_tokens) == (24, 96, 38, 123)
    assert acc.acceptance_rate == 38 / 96
    assert acc.per_position_rate == [(12 + 3) / 24, (11 + 2) / 24]  # a position not read yet counts 0
    assert before.accepted_per_position == {0: 9, 1: 7} and after.accepted_per_position == {0: 24, 1: 20}
    assert summed_counters([w1]) == w1


def test_one_server_measured_twice_counts_once():
    run_a = (snap(10, 40, 20, 100, (8,)), snap(30, 120, 50, 200, (20,)))
    run_b = (snap(20, 80, 35, 150, (14,)), snap(40, 160, 70, 260, (26,)))  # overlaps run_a
    before, after = server_window([run_a, run_b])
    assert (before.drafts, before.accepted_tokens, before.generation_tokens, before.accepted_per_position) == \
        (10, 20, 100, {0: 8})
    assert (after.drafts, after.accepted_tokens, after.generation_tokens, after.accepted_per_position) == \
        (40, 70, 260, {0: 26})


def test_an_unreadable_or_missing_counter_stays_unknown():
    bad = CounterSnapshot(source="unavailable: HTTP 500")
    w1 = (snap(1, 4, 2, 10), snap(2, 8, 3, 20))
    before, after = summed_counters([w1, (snap(1, 4, 2, 10), bad)])
    assert after.source.startswith("unavailable") and not acceptance_summary(before, after).known
    no_spec = (CounterSnapshot(generation_tokens=5, source="m"), CounterSnapshot(generation_tokens=9, source="m"))
    before, after = summed_counters([w1, no_spec])
    assert before.drafts is None and after.generation_tokens == 29
    assert not acceptance_summary(before, after).known


# --- merged reports --------------------------------------------------------------------------------
SETTINGS = ProbeSettings(concurrency=2, repeat=1, warmup=0, prompts_source="p.jsonl", request=RequestSettings())


def report(url: str, records: list[RequestRecord], window, settings=SETTINGS, model="m", **kw) -> ProbeReport:
    info = ServerInfo(backend="vllm", base_url=url, model_id=model)
    return build_report(info, settings, records, *window, scale=None, **kw)


def test_merge_recomputes_every_figure_from_the_merged_records():
    ra = [rec("p0", 0, 4, category="a"), rec("p1", 3, 2, category="b"), rec("p2", 9, ok=False)]
    rb = [rec("p0", 1, 5, category="a"), rec("p1", 2, 3, category="b", attempts=2)]
    wa = (snap(10, 40, 20, 100), snap(14, 56, 30, 106))
    wb = (snap(0, 0, 0, 0), snap(3, 12, 3, 8))
    merged = merge_reports([("a.json", report("http://a", ra, wa)), ("b.json", report("http://b", rb, wb))])
    everything = [r.model_copy(update={"target": "http://a"}) for r in ra] + \
                 [r.model_copy(update={"target": "http://b"}) for r in rb]
    first_sends = [r for r in everything if r.attempts == 1]
    assert merged.latency == latency_summary(first_sends)
    assert merged.latency_retried == latency_summary([everything[4]])
    assert merged.by_category == {"a": latency_summary([everything[0], everything[2], everything[3]]),
                                  "b": latency_summary([everything[1], everything[4]])}
    assert merged.failures == {"http_503": 1}
    assert sorted(r.sent_at_ns for r in merged.requests) == [r.sent_at_ns for r in merged.requests]
    assert sorted((r.prompt_id, r.target, r.sent_at_ns) for r in merged.requests) == \
        sorted((r.prompt_id, r.target, r.sent_at_ns) for r in everything)
    acc = merged.acceptance
    assert (acc.drafts, acc.draft_tokens, acc.accepted_tokens, acc.generation_tokens) == (7, 28, 13, 14)
    assert [r.target for r in merged.scale.replicas] == ["http://a", "http://b"]
    assert merged.scale.replicas[1].acceptance.accepted_tokens == 3
    assert merged.scale.replicas[0].latency == latency_summary([r for r in everything if r.target == "http://a"])
    assert [(s.path, s.server.base_url, s.requests) for s in merged.scale.sources] == [
        ("a.json", "http://a", 3), ("b.json", "http://b", 2)]
    assert merged.scale.executor == "merged" and not merged.partial


def test_merge_of_two_runs_on_one_server_counts_its_counters_once_and_keeps_partial():
    ra, rb = [rec("p0", 0, 4)], [rec("p1", 1, 4)]
    wa = (snap(10, 40, 20, 100), snap(12, 48, 24, 108))
    wb = (snap(11, 44, 22, 104), snap(13, 52, 26, 112))
    part = report("http://a", rb, wb, partial_reason="worker 1 exited with code -9")
    merged = merge_reports([("a.json", report("http://a", ra, wa)), ("b.json", part)])
    assert merged.acceptance.drafts == 3 and merged.acceptance.generation_tokens == 12
    assert merged.scale.replicas == []  # one server
    assert merged.partial and merged.partial_reason == "b.json: worker 1 exited with code -9"
    both = merge_reports([("a.json", report("http://a", ra, wa, partial_reason="x")), ("b.json", part)])
    assert both.partial_reason == "a.json: x; b.json: worker 1 exited with code -9"


@pytest.mark.parametrize("change, expected", [
    (dict(settings=SETTINGS.model_copy(update={"concurrency": 4})), "b.json has concurrency 4, a.json 2"),
    (dict(settings=SETTINGS.model_copy(update={"request": RequestSettings(max_tokens=64)})),
     "b.json has request.max_tokens 64, a.json 128"),
    (dict(settings=SETTINGS.model_copy(update={"prompts_source": "other.jsonl"})),
     "b.json has prompts_source 'other.jsonl', a.json 'p.jsonl'"),
    (dict(model="other"), "b.json has server model_id 'other', a.json 'm'"),
])
def test_merge_refuses_different_settings_naming_the_setting(change, expected):
    w = (snap(0, 0, 0, 0), snap(1, 4, 2, 4))
    a, b = report("http://a", [rec("p0", 0)], w), report("http://b", [rec("p0", 0)], w, **change)
    with pytest.raises(UsageError) as err:
        merge_reports([("a.json", a), ("b.json", b)])
    assert str(err.value) == f"{expected}: merge only runs of the same settings"
    assert setting_difference(a, a) is None


def test_merge_needs_two_reports():
    w = (snap(0, 0, 0, 0), snap(1, 4, 2, 4))
    with pytest.raises(UsageError, match="^give at least two probe reports to merge$"):
        merge_reports([("a.json", report("http://a", [rec("p0", 0)], w))])


def test_a_request_setting_only_one_report_has_is_a_difference():
    w = (snap(0, 0, 0, 0), snap(1, 4, 2, 4))
    other = SETTINGS.model_copy(update={"request": RequestSettings(extra_body={"top_k": 5})})
    a, b = report("http://a", [rec("p0", 0)], w), report("http://b", [rec("p0", 0)], w, settings=other)
    assert setting_difference(a, b) == ("request.extra_body.top_k", None, 5)


def test_build_report_notes_token_sources_and_log_tail():
    info = ServerInfo(backend="vllm", base_url="http://a", model_id="m", notes=["server note"])
    recs = [rec("p0", 0), rec("p1", 1).model_copy(update={"token_source": "chunks"}), rec("p2", 2, ok=False)]
    w = (snap(0, 0, 0, 0), snap(1, 4, 2, 9))
    out = build_report(info, SETTINGS, recs, *w, scale=None, extra_notes=["extra"], log_tail="last line")
    assert out.token_sources == {"usage": 1, "chunks": 1}
    assert out.latency_retried is None and out.failures == {"http_503": 1}
    assert out.notes[0] == "server note" and out.notes[-2:] == ["extra", "last lines of the server log:\nlast line"]
    assert len(out.notes) == 6  # server note, chunks, token mismatch (9 vs 6), failures, extra, log
    plain = build_report(info, SETTINGS, recs[:1], *w, scale=None)
    assert plain.notes[-1] != "extra" and not any(n.startswith("last lines") for n in plain.notes)


def test_merge_keeps_targets_sources_and_replicas_of_each_run():
    w = (snap(0, 0, 0, 0), snap(1, 4, 2, 3))
    spread = report("http://r0", [rec("p0", 0, target="http://r0"), rec("p1", 1, target="http://r1")], w)
    spread.scale = ScaleLayout(executor="workers", replicas=replica_results(
        spread.requests, {"http://r0": spread.server, "http://r1": spread.server.model_copy(
            update={"base_url": "http://r1"})}, {"http://r0": w, "http://r1": w}))
    part = report("http://r0", [rec("p0", 5)], w)
    part.partial = True
    merged = merge_reports([("s.json", spread), ("p.json", part)])
    assert sorted(r.target for r in merged.requests) == ["http://r0", "http://r0", "http://r1"]
    assert [(s.replicas, s.partial) for s in merged.scale.sources] == [(["http://r0", "http://r1"], False),
                                                                       ([], True)]
    assert merged.partial_reason == "p.json: partial" and merged.scale.workers_requested == 2
    assert merged.notes[-1] == ("merged from 2 reports over 2 server(s); each run's send times count from its own "
                                "start, so duration and tokens/s assume the runs started together")


def test_a_replica_without_requests_has_empty_figures():
    w = (snap(0, 0, 0, 0), snap(1, 4, 2, 3))
    info = ServerInfo(backend="vllm", base_url="http://r1", model_id="m")
    (only,) = replica_results([], {"http://r1": info}, {"http://r1": w})
    assert only.latency.requests == 0 and only.acceptance.accepted_tokens == 2

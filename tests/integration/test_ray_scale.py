"""probe over Ray actors (a local Ray instance, 2 actors) against the scripted server's truth and a
live vLLM CPU server: the Ray-backed run gives the figures the one-process run gives.

Timing is checked the way tests/reliability/test_timing_truth.py checks it (the same margin, the
same load-proof causality); the Ray workers' records count from each actor's own monotonic t0,
recorded in the report, and on one machine that clock is the scripted server's clock.
"""

from __future__ import annotations

import os

import httpx
import pytest

from specadapt.adapters.vllm import VLLMServer
from specadapt.analysis.latency import percentile
from specadapt.analysis.slo import is_good
from specadapt.load.plan import closed_jobs, split
from specadapt.orchestration.probe import run_probe
from specadapt.records import Prompt, RequestSettings
from specadapt.records.load import LoadSettings
from specadapt.testing import script, scripted_server
from specadapt.testing.timing import METRICS, brief, summary, timing_errors
from specadapt.workloads.prompts import load_prompts

ray = pytest.importorskip("ray")

MEDIAN_MARGIN_MS = 25.0  # tests/reliability/test_timing_truth.py: its reasons hold here
SCRIPT = dict(ttft_ms=150.0, itl_ms=100.0, tokens=12)
N, CONCURRENCY, WORKERS = 8, 4, 2


@pytest.fixture(scope="session")
def local_ray():
    """One local Ray instance for the session (2 CPUs, no dashboard), shut down after it."""
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def scripted(tmp_path_factory):
    with scripted_server(tmp_path_factory.mktemp("scripted") / "server.log") as mp:
        yield mp.plan.base_url


def staggered_prompts() -> list[Prompt]:
    """As testing.timing.drive staggers them: chunks of different streams do not land at once."""
    return [Prompt(id=f"ray{i}", prompt=script(id=f"ray{i}", **{
        **SCRIPT, "ttft_ms": SCRIPT["ttft_ms"] + (i % CONCURRENCY) * SCRIPT["itl_ms"] / CONCURRENCY}))
        for i in range(N)]


def check_medians(errors: dict[str, list[float]], metrics: tuple[str, ...], where: str) -> None:
    print(f"\ntiming error {where} (load {os.getloadavg()[0]:.1f}): {brief({m: errors[m] for m in metrics})}")
    for metric in metrics:
        values = sorted(abs(v) for v in errors[metric])
        assert values and percentile(values, 50) < MEDIAN_MARGIN_MS, (metric, summary(errors)[metric])


def test_ray_run_matches_the_one_process_run_and_the_servers_truth(local_ray, scripted):
    prompts, settings = staggered_prompts(), RequestSettings(max_tokens=12, request_timeout_s=60)
    server = VLLMServer(scripted)
    try:
        one = run_probe(server, prompts, settings, concurrency=CONCURRENCY, warmup=0)
        log_one = httpx.get(scripted + "/_script/log?pop=1").json()
        spread = run_probe([server], prompts, settings, concurrency=CONCURRENCY, warmup=0,
                           workers=WORKERS, ray_address="local")
        log_ray = httpx.get(scripted + "/_script/log?pop=1").json()
    finally:
        server.close()
    layout = spread.scale
    assert layout.executor == "ray" and len(layout.workers) == WORKERS
    assert all(w.kind == "ray" and w.finished == N // WORKERS and w.clock_offset_ms is not None
               and w.node and w.t0_mono_ns for w in layout.workers)
    # the same figures: per prompt, the same tokens and text
    by_id = {r.prompt_id: r for r in one.requests}
    assert sorted(by_id) == sorted(r.prompt_id for r in spread.requests)
    for r in spread.requests:
        assert r.ok and (r.output_tokens, r.chunk_tokens, r.text) == (
            by_id[r.prompt_id].output_tokens, by_id[r.prompt_id].chunk_tokens, by_id[r.prompt_id].text)
    assert spread.latency.output_tokens == one.latency.output_tokens == N * SCRIPT["tokens"]
    assert spread.acceptance.generation_tokens == one.acceptance.generation_tokens
    # times against the truth: each Ray record on its actor's clock (one machine: the server's clock)
    worker_of = {j.prompt.id: s.worker for s in split(closed_jobs(prompts), settings, CONCURRENCY, WORKERS)
                 for j in s.jobs}
    t0 = {w.worker: w.t0_mono_ns for w in layout.workers}
    absolute = [r.model_copy(update={"sent_at_ns": t0[worker_of[r.prompt_id]] + r.sent_at_ns})
                for r in spread.requests]
    errors = timing_errors(absolute, log_ray)
    assert [len(errors[m]) for m in METRICS] == [N, N * 11, N, N]
    assert min(errors["ttft"]) > 0 and min(errors["e2e"]) > 0  # causality, load-proof
    check_medians(errors, (*METRICS, "itl_vs_schedule"), "Ray, 2 actors")
    # the one-process run's send times are not in its report: ITL and TPOT need none
    errors_one = timing_errors(one.requests, log_one)
    check_medians(errors_one, ("itl", "tpot"), "one process")


@pytest.mark.integration
def test_ray_run_on_vllm_gives_the_same_tokens_and_text(vllm_off, local_ray):  # the server first: Ray idles meanwhile
    prompts = load_prompts(None)[:6]
    settings = RequestSettings(max_tokens=16, request_timeout_s=120)
    one = run_probe(vllm_off, prompts, settings, concurrency=2, warmup=0)
    spread = run_probe([vllm_off], prompts, settings, concurrency=2, warmup=0, workers=WORKERS, ray_address="local")
    assert spread.scale.executor == "ray" and [w.finished for w in spread.scale.workers] == [3, 3]
    want = {r.prompt_id: (r.output_tokens, r.text) for r in one.requests}
    got = {r.prompt_id: (r.output_tokens, r.text) for r in spread.requests}
    assert all(r.ok for r in one.requests + spread.requests)
    assert got == want
    assert spread.latency.output_tokens == one.latency.output_tokens
    # at an arrival rate, for a duration, with SLOs: the same open-loop schedule from Ray actors
    load = LoadSettings(request_rates=[4.0], duration_s=1.0, seed=2, slo_ms={"ttft": 2000.0, "e2e": 10_000.0})
    rated = run_probe([vllm_off], prompts, settings, warmup=0, load=load, workers=WORKERS, ray_address="local")
    recs = rated.requests
    assert len(recs) == 4 and all(r.ok and r.request_rate == 4.0 and r.scheduled_at_ns is not None for r in recs)
    assert [w.finished for w in rated.scale.workers] == [2, 2]
    (level,) = rated.rates
    assert level.send_lag.requests == 4 and level.goodput.requests == 4
    assert level.goodput.good == sum(1 for r in recs if is_good(r, load.slo_ms))

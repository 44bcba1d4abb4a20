"""`reference serve` under concurrency, over real HTTP: batching, disconnects, per-step
metrics and request validation. Forwards are slowed by a hook where a test needs a
request to be mid-step at a known moment; no assertion depends on how long anything takes."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import httpx
import pytest

from specadapt.native_reference.engine import SpecEngine
from specadapt.native_reference.proposers import NgramProposer
from specadapt.native_reference.runtime import open_reference

from .test_server import APPS, chunk_ids, counter, counters, serving, stream_completion

PROMPTS = ["def add(a, b):\n    return a + b\n\ndef add(a, b):\n",
           "one two three four, one two three four, one two",
           "The quick brown fox jumps over the lazy dog. The quick brown",
           "a b c d e f g a b c d"]
MAX = 20


@pytest.fixture(scope="module")
def ref(tiny_dirs):
    target, _, _ = tiny_dirs
    return open_reference(target, ngram=True, k=3, dtype="float64")


@pytest.fixture(scope="module")
def truth(ref):
    """Each prompt decoded alone by a separate engine on the same weights (greedy)."""
    engine = SpecEngine(ref.engine.model, NgramProposer(1, 4), 3)
    return {p: engine.generate(ref.encode(p), MAX).tokens for p in PROMPTS}


def body(prompt, **kw):
    return {"prompt": prompt, "max_tokens": MAX, "temperature": 0, "logprobs": 0,
            "return_tokens_as_token_ids": True, "ignore_eos": True, **kw}


class slowed:
    """Every target forward sleeps first (a pre-hook), so requests overlap in time."""

    def __init__(self, ref, seconds):
        self.model, self.seconds = ref.engine.model, seconds

    def __enter__(self):
        self.handle = self.model.register_forward_pre_hook(lambda *_: time.sleep(self.seconds))
        return self

    def __exit__(self, *exc):
        self.handle.remove()


def test_concurrent_requests_are_batched_and_each_exact(ref, truth):
    async def one(client, base, prompt):
        got = []
        async with client.stream("POST", f"{base}/v1/completions", json={**body(prompt), "stream": True}) as r:
            assert r.status_code == 200
            async for line in r.aiter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    got += chunk_ids(json.loads(line[6:]))
        return got

    async def run(base):
        async with httpx.AsyncClient(timeout=120) as client:
            tasks = [asyncio.ensure_future(one(client, base, p)) for p in PROMPTS]
            await all_in_before_the_first_step(hold, base, tasks)
            return await asyncio.gather(*tasks)

    with held(ref, 1) as hold, serving(ref) as base:
        before = counters(base)
        results = asyncio.run(run(base))
        after = counters(base)
        scheduler = ref_app_scheduler(base)
    for prompt, got in zip(PROMPTS, results):
        assert got == truth[prompt]
    assert max(scheduler.batch_sizes) >= 2, scheduler.batch_sizes  # requests really shared steps
    assert counter(after, "vllm:generation_tokens_total") - counter(before, "vllm:generation_tokens_total") \
        == MAX * len(PROMPTS)
    assert counter(after, "vllm:num_requests_running") == 0


def ref_app_scheduler(base):
    return APPS[base].state.reference.scheduler


async def all_in_before_the_first_step(hold, base, tasks):
    """Release ``hold`` (held at the first forward: the first request's prefill) once every other
    request reached the scheduler: they all join the batch of the first step, however loaded the
    machine (a sleep per forward only made that likely)."""
    scheduler = ref_app_scheduler(base)
    deadline = time.monotonic() + 60
    while not (hold.count >= 1 and scheduler.inbox.qsize() + len(scheduler.waiting) >= len(tasks) - 1):
        failed = [t for t in tasks if t.done()]
        assert not failed, [t.exception() for t in failed]
        assert time.monotonic() < deadline, (f"in 60 s: {hold.count} forward(s) started, "
                                             f"{scheduler.inbox.qsize() + len(scheduler.waiting)} request(s) queued")
        await asyncio.sleep(0.01)
    hold.release()


@pytest.mark.parametrize("trial", range(3))
def test_disconnect_mid_stream_leaves_the_next_answer_exact(ref, truth, trial):
    """A client that goes away in the middle of a step: its row leaves the batch before the
    next step, and the next request's answer is the same token for token."""
    victim, next_prompt = PROMPTS[trial % 2], PROMPTS[2]
    with slowed(ref, 0.15), serving(ref) as base:
        with httpx.stream("POST", f"{base}/v1/completions", json={**body(victim), "stream": True},
                          timeout=60) as r:
            seen = 0
            for line in r.iter_lines():
                if line.startswith("data: ") and chunk_ids(json.loads(line[6:])):
                    seen += 1
                if seen == 2:
                    break  # leave mid-stream: the worker is inside a step right now
        chunks = stream_completion(base, body(next_prompt))
        scheduler = ref_app_scheduler(base)
        running = counter(counters(base), "vllm:num_requests_running")
    assert [t for c in chunks for t in chunk_ids(c)] == truth[next_prompt]
    assert not scheduler.running and running == 0


class held:
    """The target's ``nth`` forward (1: the prefill) waits until ``release()``: the stream is
    then certainly unfinished while the test looks at the server, however loaded the machine."""

    def __init__(self, ref, nth):
        self.model, self.nth, self.count = ref.engine.model, nth, 0
        self.gate = threading.Event()

    def _hook(self, *_):
        self.count += 1
        if self.count == self.nth:
            assert self.gate.wait(60), "the test never released the engine"

    def release(self):
        self.gate.set()

    def __enter__(self):
        self.handle = self.model.register_forward_pre_hook(self._hook)
        return self

    def __exit__(self, *exc):
        self.gate.set()
        self.handle.remove()


def test_metrics_move_during_a_stream(ref):
    """Counters are updated every step, as vLLM's are: a scrape during a long stream sees
    the tokens generated so far, not zero. The engine is held at its 4th forward (after the
    prefill and two steps: at least 3 tokens, at most 9 of the 20) while the test scrapes."""
    with held(ref, 4) as hold, serving(ref) as base:
        start = counter(counters(base), "vllm:generation_tokens_total")
        mid = None
        with httpx.stream("POST", f"{base}/v1/completions", json={**body(PROMPTS[3]), "stream": True},
                          timeout=60) as r:
            seen = 0
            for line in r.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]" and chunk_ids(json.loads(line[6:])):
                    seen += len(chunk_ids(json.loads(line[6:])))
                    if mid is None and seen >= 3:
                        mid = counter(counters(base), "vllm:generation_tokens_total") - start
                        running = counter(counters(base), "vllm:num_requests_running")
                        hold.release()
        end = counter(counters(base), "vllm:generation_tokens_total") - start
    assert 3 <= mid < MAX == end
    assert running == 1


@pytest.mark.parametrize("extra, message", [
    ({"top_p": 0}, "top_p"),
    ({"top_p": 1.5}, "top_p"),
    ({"top_k": -2}, "top_k"),
    ({"top_k": 2.5}, "top_k"),
    ({"temperature": -1}, "temperature"),
    ({"temperature": "hot"}, "temperature"),
    ({"max_tokens": 0}, "max_tokens"),
])
def test_bad_sampling_parameters_are_400(ref, extra, message):
    with serving(ref) as base:
        r = httpx.post(f"{base}/v1/completions", timeout=60, json={"prompt": "x", **extra})
    assert r.status_code == 400 and message in r.json()["error"]["message"]


def test_context_length_rule_is_vllms(ref):
    """prompt + max_tokens <= max_model_len is accepted, one more is refused (no k+1 margin)."""
    limit = ref.engine.max_model_len
    prompt = [5, 6, 7, 8] * ((limit - 6) // 4)
    room = limit - len(prompt)
    with serving(ref) as base:
        ok = httpx.post(f"{base}/v1/completions", timeout=120, json={
            "prompt": prompt, "max_tokens": room, "temperature": 0, "ignore_eos": True})
        over = httpx.post(f"{base}/v1/completions", timeout=60, json={
            "prompt": prompt, "max_tokens": room + 1})
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == room
    assert over.status_code == 400 and "maximum context length" in over.json()["error"]["message"]


def test_schedule_is_honoured_under_live_concurrency(tiny_dirs):
    """k by running batch size: a draft model always proposes k, so the draft-token counter
    must equal the sum over steps of batch size x scheduled k at that size."""
    target, draft, _ = tiny_dirs
    schedule = [[1, 1, 3], [2, 16, 1]]
    sched_ref = open_reference(target, draft, k=3, dtype="float64", schedule=schedule)

    async def one(client, base, prompt, n):
        r = await client.post(f"{base}/v1/completions", json={**body(prompt), "max_tokens": n})
        assert r.status_code == 200

    async def run(base):
        async with httpx.AsyncClient(timeout=120) as client:
            # different lengths: the batch shrinks from 4 to 1 as requests finish
            tasks = [asyncio.ensure_future(one(client, base, p, 6 + 6 * i)) for i, p in enumerate(PROMPTS)]
            await all_in_before_the_first_step(hold, base, tasks)
            await asyncio.gather(*tasks)

    with held(sched_ref, 1) as hold, serving(sched_ref) as base:
        before = counters(base)
        asyncio.run(run(base))
        after = counters(base)
        version = httpx.get(f"{base}/version").json()
        scheduler = ref_app_scheduler(base)
    sizes = scheduler.batch_sizes
    assert 1 in sizes and max(sizes) >= 2, sizes  # both parts of the schedule were used
    k_at = {1: 3}
    expected = sum(n * size * k_at.get(size, 1) for size, n in sizes.items())
    got = counter(after, "vllm:spec_decode_num_draft_tokens_total") - counter(
        before, "vllm:spec_decode_num_draft_tokens_total")
    assert got == expected
    assert version["num_speculative_tokens_per_batch_size"] == schedule

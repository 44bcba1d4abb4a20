"""Per-request speculation metrics in the reference server's answers, in vLLM 0.32's
``--per-request-spec-decode-metrics detailed`` shape: ``metrics.speculative_decoding`` at
the top of a non-streamed answer and on the final usage chunk of a stream. Every
request's counts add up to the /metrics counter deltas (alone and in a shared batch), and
agree with the library's own steps, pass by pass; a stream sends one chunk per pass.
Tiny random models, float64, a draft model, k = 3."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from specadapt.native_reference.engine import SpecEngine
from specadapt.native_reference.proposers import DraftModelProposer
from specadapt.native_reference.runtime import open_reference

from .test_server import counter, counters, serving, stream_completion
from .test_server_batching import all_in_before_the_first_step, held, ref_app_scheduler

K = 3
PROMPTS = ["def add(a, b):\n    return a + b\n\ndef add(a, b):\n",
           "one two three four, one two three four, one two",
           "The quick brown fox jumps over the lazy dog. The quick brown"]
MAX = 16
KEYS = ["mean_acceptance_length", "draft_acceptance_rate", "acceptance_histogram", "num_spec_steps",
        "num_accepted_draft_tokens", "num_draft_tokens", "num_spec_tokens"]
PER_STEP = ["per_step_accepted", "per_step_drafted"]  # vLLM's detailed level, only where there are steps
COUNTERS = {"num_spec_steps": "vllm:spec_decode_num_drafts_total",
            "num_draft_tokens": "vllm:spec_decode_num_draft_tokens_total",
            "num_accepted_draft_tokens": "vllm:spec_decode_num_accepted_tokens_total"}


@pytest.fixture(scope="module")
def ref(tiny_dirs):
    target, draft, _ = tiny_dirs
    return open_reference(target, draft, k=K, dtype="float64")


def request(base, prompt, chat, stream, **extra):
    """(the answer's metrics object or None, every chunk / the body) of one request."""
    path = "/v1/chat/completions" if chat else "/v1/completions"
    body = {"max_tokens": MAX, "temperature": 0, "ignore_eos": True, **extra}
    body.update({"messages": [{"role": "user", "content": prompt}]} if chat else {"prompt": prompt})
    if not stream:
        r = httpx.post(f"{base}{path}", json=body, timeout=60)
        assert r.status_code == 200, r.text
        answer = r.json()
        return answer.get("metrics"), answer
    chunks = stream_completion(base, body, path)
    with_metrics = [c for c in chunks if "metrics" in c]
    assert len(with_metrics) <= 1
    if with_metrics:  # on the final usage chunk only
        assert with_metrics[0] is chunks[-1] and chunks[-1]["choices"] == [] and "usage" in chunks[-1]
    return (with_metrics[0]["metrics"] if with_metrics else None), chunks


def check_shape(spec: dict) -> None:
    assert list(spec) == KEYS + (PER_STEP if spec["num_spec_steps"] else [])
    hist = spec["acceptance_histogram"]
    assert spec["num_spec_tokens"] == K and len(hist) == K + 1
    assert spec["num_spec_steps"] == sum(hist)
    assert spec["num_accepted_draft_tokens"] == sum(j * n for j, n in enumerate(hist))
    assert spec["num_accepted_draft_tokens"] <= spec["num_draft_tokens"] <= K * spec["num_spec_steps"]
    steps, accepted, drafted = spec["num_spec_steps"], spec["num_accepted_draft_tokens"], spec["num_draft_tokens"]
    assert spec["mean_acceptance_length"] == pytest.approx(1 + accepted / steps if steps else 1.0)
    assert spec["draft_acceptance_rate"] == pytest.approx(accepted / drafted if drafted else 0.0)
    assert isinstance(spec["mean_acceptance_length"], float) and isinstance(spec["draft_acceptance_rate"], float)
    if steps:  # the passes one by one: as many as steps, adding up to the counts and the histogram
        per_accepted, per_drafted = spec["per_step_accepted"], spec["per_step_drafted"]
        assert len(per_accepted) == len(per_drafted) == steps
        assert (sum(per_accepted), sum(per_drafted)) == (accepted, drafted)
        assert [per_accepted.count(j) for j in range(K + 1)] == hist
        assert all(0 <= a <= d <= K and d >= 1 for a, d in zip(per_accepted, per_drafted))


def deltas(before: dict, after: dict) -> dict:
    return {key: counter(after, name) - counter(before, name) for key, name in COUNTERS.items()}


@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_each_request_adds_up_to_the_counters(ref, chat, stream):
    with serving(ref) as base:
        totals = dict.fromkeys(COUNTERS, 0)
        before = start = counters(base)
        for prompt in PROMPTS:
            metrics, _ = request(base, prompt, chat, stream, stream_options={"include_usage": True})
            after = counters(base)
            spec = metrics["speculative_decoding"]
            check_shape(spec)
            assert {key: spec[key] for key in COUNTERS} == deltas(before, after)
            for key in COUNTERS:
                totals[key] += spec[key]
            before = after
        assert totals == deltas(start, counters(base))
    # not a vacuous check: drafts were both accepted and rejected
    assert 0 < totals["num_accepted_draft_tokens"] < totals["num_draft_tokens"]


def test_counts_equal_the_library_steps(ref):
    """The same greedy request decoded by the library: the histogram of its steps' accepted
    counts (steps with drafts only) is the answer's."""
    ids = ref.encode(PROMPTS[0])
    gen = SpecEngine(ref.engine.model, DraftModelProposer(ref.engine.proposer.model), K).generate(ids, MAX)
    hist = [0] * (K + 1)
    for step in gen.steps:
        if step.proposed:
            hist[step.accepted] += 1
    with serving(ref) as base:
        metrics, _ = request(base, PROMPTS[0], chat=False, stream=False)
    spec = metrics["speculative_decoding"]
    assert spec["acceptance_histogram"] == hist and sum(1 for n in hist if n) >= 2
    assert (spec["num_spec_steps"], spec["num_draft_tokens"], spec["num_accepted_draft_tokens"]) == (
        gen.stats.num_drafts, gen.stats.draft_tokens, gen.stats.accepted_tokens)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_each_pass_is_the_library_step_it_was(ref, stream):
    """The same greedy request decoded by the library, step by step: the answer's per-step arrays
    are its steps that proposed tokens (accepted, proposed), in order; streamed, each chunk
    carries one step's tokens (chunks are passes), and the arrays ride on the final usage chunk."""
    ids = ref.encode(PROMPTS[1])
    gen = SpecEngine(ref.engine.model, DraftModelProposer(ref.engine.proposer.model), K).generate(ids, MAX)
    drafted = [s for s in gen.steps if s.proposed]
    with serving(ref) as base:
        metrics, answer = request(base, PROMPTS[1], chat=False, stream=stream, return_token_ids=True,
                                  stream_options={"include_usage": True})
    spec = metrics["speculative_decoding"]
    assert spec["per_step_accepted"] == [s.accepted for s in drafted]
    assert spec["per_step_drafted"] == [len(s.proposed) for s in drafted]
    # not vacuous: some passes kept drafts and some kept none, and the first pass (prefill) drafted nothing
    assert 0 in spec["per_step_accepted"] and max(spec["per_step_accepted"]) > 0 and not gen.steps[0].proposed
    if stream:
        carrying = [c["choices"][0]["token_ids"] for c in answer if c["choices"] and c["choices"][0].get("token_ids")]
        assert carrying == [s.tokens for s in gen.steps]
        # a chunk's tokens - 1 are the pass's accepted drafts, but for the last pass, which max_tokens may cut
        *whole, last = [(len(t), s) for t, s in zip(carrying, gen.steps) if s.proposed]
        assert [n - 1 for n, _ in whole] == spec["per_step_accepted"][:-1]
        assert 1 <= last[0] <= spec["per_step_accepted"][-1] + 1 and last[1] is gen.steps[-1]
    else:
        assert answer["choices"][0]["token_ids"] == gen.tokens


def test_requests_sharing_steps_each_get_their_own_counts(ref):
    """Three requests in one batch (two streamed, one not): each answer's counts are its own,
    and together they are the counter deltas."""
    async def stream_one(client, base, prompt):
        out = None
        body = {"prompt": prompt, "max_tokens": MAX, "temperature": 0, "ignore_eos": True, "stream": True,
                "stream_options": {"include_usage": True}}
        async with client.stream("POST", f"{base}/v1/completions", json=body) as r:
            async for line in r.aiter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    out = json.loads(line[6:]).get("metrics", out)
        return out

    async def whole_one(client, base, prompt):
        r = await client.post(f"{base}/v1/chat/completions", json={
            "messages": [{"role": "user", "content": prompt}], "max_tokens": MAX, "temperature": 0,
            "ignore_eos": True})
        return r.json()["metrics"]

    async def run(base):
        async with httpx.AsyncClient(timeout=120) as client:
            tasks = [asyncio.ensure_future(stream_one(client, base, PROMPTS[0])),
                     asyncio.ensure_future(whole_one(client, base, PROMPTS[1])),
                     asyncio.ensure_future(stream_one(client, base, PROMPTS[2]))]
            await all_in_before_the_first_step(hold, base, tasks)
            return await asyncio.gather(*tasks)

    with held(ref, 1) as hold, serving(ref) as base:
        before = counters(base)
        answers = asyncio.run(run(base))
        after = counters(base)
        assert max(ref_app_scheduler(base).batch_sizes) == len(PROMPTS)
    specs = [a["speculative_decoding"] for a in answers]
    for spec in specs:
        check_shape(spec)
    assert {key: sum(s[key] for s in specs) for key in COUNTERS} == deltas(before, after)


def test_no_metrics_without_speculation_without_usage_or_when_off(ref, tiny_dirs):
    target, _, _ = tiny_dirs
    plain = open_reference(target, dtype="float64")  # spec off: no proposer
    with serving(plain) as base:
        metrics, body = request(base, PROMPTS[0], chat=False, stream=False)
        assert metrics is None and "metrics" not in body
        metrics, chunks = request(base, PROMPTS[0], chat=True, stream=True, stream_options={"include_usage": True})
        assert metrics is None and chunks[-1]["choices"] == [] and "usage" in chunks[-1]
    with serving(ref) as base:  # speculation, but no usage chunk to carry the metrics
        metrics, chunks = request(base, PROMPTS[0], chat=False, stream=True)
        assert metrics is None and all(c["choices"] for c in chunks)
    with serving(ref, spec_metrics=False) as base:
        assert request(base, PROMPTS[0], chat=False, stream=False)[0] is None
        assert request(base, PROMPTS[0], chat=True, stream=True, stream_options={"include_usage": True})[0] is None

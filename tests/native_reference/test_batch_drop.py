"""The batch-drop fault: a bug that fires only when two or more requests share a verify pass.

On the embedded model (SmolLM2-135M, float32, n-gram k = 4): alone, the faulty engine's
greedy output equals the healthy one's; in a batch, every row after the first loses the
last accepted draft of a pass, so the token after the gap takes its place, a token far
from the target's own choice there (no near-tie). End to end over HTTP (tiny random
models, float64): two requests sharing steps differ from spec off, the same two requests
one after the other do not."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
import torch

from specadapt.errors import UsageError
from specadapt.native_reference.engine import SpecEngine
from specadapt.native_reference.faults import BATCH_FAULTS, FAULTS, FEATURE_FAULTS, Fault, build_engine
from specadapt.native_reference.proposers import NgramProposer
from specadapt.native_reference.runtime import open_reference

from .test_server import chunk_ids, serving
from .test_server_batching import all_in_before_the_first_step, held, ref_app_scheduler

PROMPTS = ["a b c d e f g a b c d e f g a b c",
           "one two three four, one two three four, one two",
           "def add(a, b):\n    return a + b\n\ndef add(a, b):\n"]
N = 12
K = 4
FAULT = Fault.parse("batch-drop")


def test_batch_drop_is_declared_and_parsed():
    assert "batch-drop" in FAULTS and "batch-drop" in BATCH_FAULTS and "batch-drop" not in FEATURE_FAULTS
    assert FAULT == Fault("batch-drop")
    with pytest.raises(UsageError, match="takes no value"):
        Fault.parse("batch-drop=1")
    with pytest.raises(UsageError, match="unknown fault"):
        Fault.parse("batch-drops")


@pytest.fixture(scope="module")
def smol(embedded_dir):
    ref = open_reference(embedded_dir, dtype="float32")  # the target alone: its model and tokenizer
    return ref.engine.model, [ref.encode(p) for p in PROMPTS]


@pytest.fixture(scope="module")
def alone(smol):
    """Each prompt decoded alone by a healthy n-gram engine (equal to the target alone)."""
    model, prompts = smol
    return [SpecEngine(model, NgramProposer(1, 4), K).generate(ids, N) for ids in prompts]


def test_alone_the_fault_changes_nothing(smol, alone):
    model, prompts = smol
    for ids, good in zip(prompts, alone):
        faulty = build_engine(model, NgramProposer(1, 4), K, FAULT).generate(ids, N)
        assert faulty.tokens == good.tokens
        assert [s.tokens for s in faulty.steps] == [s.tokens for s in good.steps]
    # drafts were accepted alone, so a fault that fired on any pass would have shown
    assert sum(g.stats.accepted_tokens for g in alone) > 0


def test_in_a_batch_rows_after_the_first_lose_an_accepted_token(smol, alone):
    model, prompts = smol
    healthy = SpecEngine(model, NgramProposer(1, 4), K).generate_batch(prompts, N)
    assert [g.tokens for g in healthy] == [g.tokens for g in alone]  # the control: batching alone is exact
    faulty = build_engine(model, NgramProposer(1, 4), K, FAULT).generate_batch(prompts, N)
    assert faulty[0].tokens == alone[0].tokens  # the first row of every pass is never hit
    differ = [i for i in range(1, len(prompts)) if faulty[i].tokens != alone[i].tokens]
    assert differ, "batch-drop changed no row of the batch"
    for i in differ:
        got, want = faulty[i].tokens, alone[i].tokens
        j = next(n for n, (a, b) in enumerate(zip(got, want)) if a != b)
        # the token after the gap is the one the target chose after the dropped one
        assert got[j] == want[j + 1]
        # ... in a pass that had accepted drafts, and emitted one token fewer than it accepted + 1
        step = next(s for s in faulty[i].steps if s.position <= len(prompts[i]) + j < s.position + len(s.tokens))
        assert step.accepted >= 1 and len(step.tokens) == step.accepted
        # not a near-tie: the emitted token is far below the target's choice at that position
        with torch.no_grad():
            logp = model(torch.tensor([prompts[i] + want[:j]])).logits[0, -1].double().log_softmax(-1)
        assert int(logp.argmax()) == want[j]
        assert float(logp[want[j]] - logp[got[j]]) > 1.0


# -- end to end: concurrency against one request at a time ---------------------------------

MAX = 16


@pytest.fixture(scope="module")
def tiny_faulty(tiny_dirs):
    target, draft, _ = tiny_dirs
    return open_reference(target, draft, k=3, dtype="float64", fault="batch-drop")


def _body(prompt):
    return {"prompt": prompt, "max_tokens": MAX, "temperature": 0, "logprobs": 0,
            "return_tokens_as_token_ids": True, "ignore_eos": True, "stream": True}


async def _one(client, base, prompt):
    got = []
    async with client.stream("POST", f"{base}/v1/completions", json=_body(prompt)) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                got += chunk_ids(json.loads(line[6:]))
    return got


def test_server_concurrent_requests_diverge_sequential_ones_do_not(tiny_faulty):
    ref = tiny_faulty
    truth = [SpecEngine(ref.engine.model).generate(ref.encode(p), MAX).tokens for p in PROMPTS]

    async def together(base):
        async with httpx.AsyncClient(timeout=120) as client:
            tasks = [asyncio.ensure_future(_one(client, base, p)) for p in PROMPTS]
            await all_in_before_the_first_step(hold, base, tasks)
            return await asyncio.gather(*tasks)

    async def in_turn(base):
        async with httpx.AsyncClient(timeout=120) as client:
            return [await _one(client, base, p) for p in PROMPTS]

    with held(ref, 1) as hold, serving(ref) as base:
        batched = asyncio.run(together(base))
        assert max(ref_app_scheduler(base).batch_sizes) == len(PROMPTS)
    with serving(ref) as base:
        sequential = asyncio.run(in_turn(base))
        assert set(ref_app_scheduler(base).batch_sizes) == {1}
    assert sequential == truth
    assert sum(got != want for got, want in zip(batched, truth)) >= 1

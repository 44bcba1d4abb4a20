"""Speculation per request read from a real `specadapt reference serve` process equals the
engine's own exact log: a probe's passes of each answer are the tokens of each engine step the
library decodes for the same prompt (greedy, the same models, float64), its draft lengths where
known are the steps' proposed tokens, and the answers' sums are the server's counter deltas.
Tiny random models; a draft model and n-gram lookup, k = 3."""

from __future__ import annotations

import re

import httpx
import pytest

from specadapt.adapters.reference import ReferenceBackend, ReferenceLaunch
from specadapt.configs.spec import SpecConfig
from specadapt.native_reference.runtime import open_reference
from specadapt.orchestration.probe import run_probe
from specadapt.records import Prompt, RequestSettings

K = 3
MAX = 48  # long enough for the n-gram lookup to find repeats in the tiny model's answers
PROMPTS = {"code": "def add(a, b):\n    return a + b\n\ndef add(a, b):\n",
           "count": "one two three four, one two three four, one two",
           "fox": "The quick brown fox jumps over the lazy dog. The quick brown",
           "ab": "a b a b a b a b a b"}


METHODS = {"draft": lambda draft: dict(draft=draft), "ngram": lambda draft: dict(ngram=True, ngram_min=1, ngram_max=4)}


@pytest.fixture(scope="module", params=sorted(METHODS))
def method(request):
    return request.param


@pytest.fixture(scope="module")
def served(tiny_dirs, method):
    """A `specadapt reference serve` subprocess (a draft model or n-gram lookup, k = 3, float64)."""
    target, draft, _ = tiny_dirs
    spec = (SpecConfig(method="draft_model", k=K, draft=str(draft)) if method == "draft"
            else SpecConfig(method="ngram", k=K, ngram_min=1, ngram_max=4))
    with ReferenceBackend().launched_many([ReferenceLaunch(model=str(target), dtype="float64",
                                                           spec_config=spec)]) as (server,):
        yield server


@pytest.fixture(scope="module")
def library_steps(tiny_dirs, method):
    """Each prompt decoded by the library in this process, the same models and settings: its engine
    steps, in order."""
    target, draft, _ = tiny_dirs
    ref = open_reference(target, k=K, dtype="float64", **METHODS[method](draft))
    return {pid: ref.engine.generate(ref.encode(text), MAX).steps for pid, text in PROMPTS.items()}


def raw(base_url: str, name: str) -> float:
    """A counter straight from /metrics (not through specadapt's parser)."""
    text = httpx.get(base_url + "/metrics", timeout=10).text
    return sum(float(m.group(1)) for m in re.finditer(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.M))


def test_the_passes_read_from_the_server_are_the_engines_steps(served, library_steps):
    prompts = [Prompt(id=pid, category=f"cat-{pid}", prompt=text) for pid, text in PROMPTS.items()]
    accepted_name = "vllm:spec_decode_num_accepted_tokens_total"
    before = raw(served.base_url, accepted_name)
    report = run_probe(served, prompts, RequestSettings(max_tokens=MAX, extra_body={"ignore_eos": True}),
                       concurrency=1, warmup=0)
    after = raw(served.base_url, accepted_name)
    assert all(r.ok for r in report.requests), [r.error for r in report.requests]
    sp = report.speculation
    assert sp is not None and sp.available, sp and sp.source_note
    by_prompt = {a.prompt_id: a for a in sp.requests}
    assert sorted(by_prompt) == sorted(PROMPTS)
    # the answers give their own counts: the chunks are checked against them, not guessed
    assert {a.source for a in sp.requests} == {"chunks+response"}
    for pid, steps in library_steps.items():
        a = by_prompt[pid]
        assert a.passes == [len(s.tokens) for s in steps], pid
        assert a.accepted == sum(s.accepted for s in steps)
        assert a.drafted == sum(len(s.proposed) for s in steps)
        assert a.spec_steps == sum(1 for s in steps if s.proposed)
        rec = report.requests[a.index]
        if rec.spec_step_accepted is None:  # the answer gives its counts only: no draft length per pass
            assert a.drafted_per_pass is None
        else:  # it lists its passes (per_step_accepted/drafted): the draft lengths where they are certain
            assert rec.spec_step_accepted == [s.accepted for s in steps if s.proposed]
            want = [len(s.proposed) for s in steps]
            assert a.drafted_per_pass is not None and len(a.drafted_per_pass) == len(want), pid
            assert all(got is None or got == w for got, w in zip(a.drafted_per_pass, want)), (pid, a.drafted_per_pass)
            if all(w for w in want[1:]) or not any(w for w in want[1:]):  # all passes drafted, or none did
                assert a.drafted_per_pass == want, pid
    # not vacuous: some passes kept drafts and some kept none, and a listed draft length was read
    if any(r.spec_step_accepted is not None for r in report.requests):
        assert any(d for a in sp.requests for d in (a.drafted_per_pass or [])[1:])
    tokens = [len(s.tokens) for steps in library_steps.values() for s in steps[1:]]
    assert 1 in tokens and max(tokens) > 1
    # the answers' sums are the server's counters over the same requests
    total = sum(s.accepted for steps in library_steps.values() for s in steps)
    assert sum(a.accepted for a in sp.requests) == total == after - before
    (check,) = sp.checks
    assert check.agree and check.accepted_requests == check.accepted_counters == total
    assert check.drafted_requests == sum(len(s.proposed) for steps in library_steps.values() for s in steps)
    assert sp.k == K
    assert sorted(c.name for c in sp.categories) == [f"cat-{p}" for p in sorted(PROMPTS)]

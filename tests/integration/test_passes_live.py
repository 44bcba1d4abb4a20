"""Speculation per request on the suite's real vLLM n-gram server: serial requests on prompts whose
answers copy their input (drafts land), read pass by pass, add up to the server's counters over the
same requests, read by specadapt and again here straight from /metrics. Where the answers state
their own counts (``--per-request-spec-decode-metrics``) the sums equal the counters exactly; where
only the chunks tell, the counters may exceed them by at most one pass's draft per request (a length
limit cuts the last pass's accepted tokens), never fall short. A compare at concurrency 1 carries the
figures per category."""

from __future__ import annotations

import pytest

from specadapt.analysis.sections import section_data
from specadapt.orchestration.compare import run_compare
from specadapt.orchestration.probe import run_probe
from specadapt.records import CompareSettings, RequestSettings
from specadapt.records.passes import SpeculationSeen
from specadapt.workloads.prompts import canary_prompts, lesson_prompts

pytestmark = pytest.mark.integration

ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
DRAFTED = "vllm:spec_decode_num_draft_tokens_total"
PASSES = "vllm:spec_decode_num_drafts_total"  # passes that checked a draft
MAX_TOKENS = 40


def own_counts(records) -> bool:
    """Every answer stated its own drafted/accepted counts."""
    return all(r.spec_accepted is not None for r in records)


def check_answer(a, rec, k: int) -> None:
    """What holds for every answer read: its passes are its tokens, the first is the prefill's one, and
    a pass's known draft length holds its accepted tokens and is at most k."""
    assert a.prompt_id == rec.prompt_id and a.category == rec.category
    if a.passes is not None:
        assert sum(a.passes) == rec.output_tokens and a.passes[0] == 1
        assert a.accepted >= sum(t - 1 for t in a.passes)  # the last pass's accepted may be cut
    if a.drafted_per_pass is not None:
        assert len(a.drafted_per_pass) == len(a.passes) and a.drafted_per_pass[0] == 0
        assert all(d is None or t - 1 <= d <= k for t, d in zip(a.passes, a.drafted_per_pass))
    if a.source in ("chunks+response", "response"):
        assert (a.accepted, a.drafted, a.spec_steps) == (rec.spec_accepted, rec.spec_drafted, rec.spec_steps)


def test_serial_probe_adds_up_to_the_counters(vllm_ngram, settled_counter):
    prompts = canary_prompts() + lesson_prompts()
    url = vllm_ngram.base_url
    before = {n: settled_counter(url, n) for n in (ACCEPTED, DRAFTED, PASSES)}
    report = run_probe(vllm_ngram, prompts, RequestSettings(max_tokens=MAX_TOKENS), concurrency=1, warmup=0)
    after = {n: settled_counter(url, n) for n in (ACCEPTED, DRAFTED, PASSES)}
    records = report.requests
    assert all(r.ok for r in records), [r.error for r in records]
    sp = report.speculation
    assert sp is not None and sp.available, sp and sp.source_note
    k = report.server.num_speculative_tokens
    assert k == sp.k == 4
    assert len(sp.requests) == len(records)
    for a in sp.requests:
        check_answer(a, records[a.index], k)
    # the counters over the run, as specadapt read them and as read here
    counted = report.counters_after.accepted_tokens - report.counters_before.accepted_tokens
    assert counted == after[ACCEPTED] - before[ACCEPTED]
    by_requests = sum(a.accepted for a in sp.requests)
    (check,) = sp.checks
    assert check.agree, check.text
    assert check.accepted_requests == by_requests and check.accepted_counters == counted
    if own_counts(records):  # the answers' own counts: exactly the counters
        assert by_requests == counted
        assert sum(a.drafted for a in sp.requests) == after[DRAFTED] - before[DRAFTED]
        if all(a.spec_steps is not None for a in sp.requests):
            assert sum(a.spec_steps for a in sp.requests) == after[PASSES] - before[PASSES]
        assert {a.source for a in sp.requests} <= {"chunks+response", "response"}
    else:  # the chunks alone: the counters may exceed them by a cut last pass per request, never fall short
        assert {a.source for a in sp.requests} == {"chunks"}
        assert 0 <= counted - by_requests <= k * len(records)
    assert by_requests > 0  # drafts landed: the check is not 0 == 0
    with_passes = [a for a in sp.requests if a.passes]
    assert with_passes and max(max(a.passes) for a in with_passes) > 1
    print(f"\nprobe: {len(records)} answers, accepted by the answers {by_requests}, by the counters {counted:g}; "
          f"sources {sorted({a.source for a in sp.requests})}; tokens per pass "
          f"{sp.overall.tokens_per_pass}; acceptance {sp.overall.acceptance_rate}; draft lengths known for "
          f"{sum(d is not None for a in with_passes for d in (a.drafted_per_pass or []))} of "
          f"{sum(len(a.passes) for a in with_passes)} passes; first answer's passes {with_passes[0].passes}")


def test_compare_at_concurrency_1_gives_figures_per_category(vllm_off, vllm_ngram):
    prompts = canary_prompts()[:3] + lesson_prompts()[:1]
    settings = CompareSettings(concurrency=[1], repeat=1, warmup=0, request=RequestSettings(max_tokens=MAX_TOKENS),
                               triage=False, dtype="float32")
    report = run_compare(vllm_off, vllm_ngram, prompts, settings)
    sp = section_data(report, "speculation")
    assert isinstance(sp, SpeculationSeen)
    indexed = {i: r for i, r in enumerate(report.requests) if r.side == "on" and not r.warmup}
    assert all(r.ok for r in indexed.values())
    assert sp.available, sp.source_note
    assert sp.k == report.on_server.num_speculative_tokens == 4
    assert sorted(a.index for a in sp.requests) == sorted(indexed)
    for a in sp.requests:
        check_answer(a, indexed[a.index], sp.k)
    # per category: the answers' sums, and acceptance as accepted / drafted over them
    cats = {r.category for r in indexed.values()}
    assert len(cats) >= 2 and sorted(c.name for c in sp.categories) == sorted(cats)
    for c in sp.categories:
        mine = [a for a in sp.requests if a.category == c.name]
        assert c.requests == len(mine) and c.accepted == sum(a.accepted for a in mine)
        assert c.output_tokens == sum(indexed[a.index].output_tokens for a in mine)
        if c.drafted is not None:
            assert c.drafted == sum(a.drafted for a in mine)
            assert c.acceptance_rate == (c.accepted / c.drafted if c.drafted else None)
    # the level's counters
    pair = report.counters_on[1]
    counted = pair.after.accepted_tokens - pair.before.accepted_tokens
    by_requests = sum(a.accepted for a in sp.requests)
    if own_counts(indexed.values()):
        assert by_requests == counted
    else:
        assert 0 <= counted - by_requests <= sp.k * len(indexed)
    assert sp.checks and all(c.agree for c in sp.checks), [c.text for c in sp.checks]
    print(f"\ncompare: accepted by the answers {by_requests}, by the counters {counted:g}; sources "
          f"{sorted({a.source for a in sp.requests})}; accepted/drafted per category "
          + ", ".join(f"{c.name} {c.accepted}/{c.drafted}" for c in sp.categories))

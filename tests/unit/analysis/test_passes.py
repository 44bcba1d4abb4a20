"""Speculation per request and per pass of the target (analysis/passes.py): each source and its
checks, the figures, the answers drawn, and the probe and compare sections, on records and
counters built here. Every expected figure is worked out by hand from the records in the test."""

from __future__ import annotations

import math

import pytest

from specadapt.analysis import passes as ps
from specadapt.analysis.latency import latency_summary
from specadapt.analysis.passes import (
    NOT_AVAILABLE,
    Group,
    align,
    bin_width,
    check_chunks,
    check_counts,
    chosen,
    chunk_passes,
    compare_speculation,
    figures,
    merged_off,
    one_answer,
    percent,
    positions,
    probe_speculation,
    response_problem,
    seen,
    tokens_in_passes,
)
from specadapt.records import (
    AcceptanceSummary,
    CompareReport,
    CompareSettings,
    CounterSnapshot,
    ProbeReport,
    ProbeSettings,
    RequestSettings,
    ScaleLayout,
)
from specadapt.records.load import LoadSettings
from specadapt.records.passes import PositionBin, RequestPasses
from specadapt.records.reports import CounterPair
from specadapt.records.scale import WorkerInfo
from builders import request, server

BEFORE = (10, 100, 50)  # drafts, draft tokens, accepted tokens already counted before the window


def rec(chunks=(1, 1), source="usage", **fields):
    """An answer streamed as ``chunks`` (tokens per chunk), its output tokens their sum."""
    return request(chunk_tokens=list(chunks), token_source=source, output_tokens=sum(chunks), **fields)


def own(chunks=(1, 1), accepted=0, drafted=0, steps=None, **fields):
    """An answer that also states its own drafted and accepted counts."""
    return rec(chunks, spec_accepted=accepted, spec_drafted=drafted, spec_steps=steps, **fields)


def window(accepted, drafted=0, drafts=0, before=BEFORE) -> CounterPair:
    """The counters over a window in which the server counted these deltas."""
    return CounterPair(before=CounterSnapshot(drafts=before[0], draft_tokens=before[1], accepted_tokens=before[2]),
                       after=CounterSnapshot(drafts=before[0] + drafts, draft_tokens=before[1] + drafted,
                                             accepted_tokens=before[2] + accepted))


def passes(source="chunks", pid="p", cat="c", index=0, chunks=None, output=None, accepted=None, drafted=None,
           steps=None) -> RequestPasses:
    """An answer as analysed: its passes (None: unknown), output tokens (default: their sum)."""
    out = output if output is not None else sum(chunks or [])
    acc = accepted if accepted is not None else sum(t - 1 for t in chunks or [])
    return RequestPasses(index=index, prompt_id=pid, category=cat, source=source, passes=chunks,
                         output_tokens=out, accepted=acc, drafted=drafted, spec_steps=steps)


def group(records, counters=None, serial=True, label="concurrency 1") -> Group:
    return Group(label, list(enumerate(records)), counters, serial)


# ----------------------------------------------------------------------------- chunk_passes

@pytest.mark.parametrize("source", ["usage", "logprobs"])
def test_exact_chunks_are_the_passes_prefill_first(source):
    r = rec((1, 6, 1, 3), source)
    got, why = chunk_passes(r)
    assert (got, why) == ([1, 6, 1, 3], "")
    got.append(9)  # a copy: the record keeps its chunks
    assert r.chunk_tokens == [1, 6, 1, 3]


@pytest.mark.parametrize("source", ["chunks", None])
def test_guessed_chunk_counts_are_not_passes(source):
    got, why = chunk_passes(rec((1, 2), source))
    assert got is None
    assert why == "its chunk token counts are guesses (no usage or logprobs per chunk)"


def test_no_chunk_and_an_empty_chunk_are_not_passes():
    assert chunk_passes(rec(())) == (None, "no chunk carried a token")
    assert chunk_passes(rec((1, 0, 2))) == (None, "a chunk counted no token")


def test_a_first_chunk_of_several_tokens_is_merged_steps():
    got, why = chunk_passes(rec((3, 1, 1)))
    assert got is None
    assert why == "its first chunk carries 3 tokens, not the prefill's one: the server merged steps into one chunk"


# ----------------------------------------------------------------------------- align

def test_align_the_lessons_pass():
    # prefill 1 token, then one pass that accepted all 5 drafted tokens and added its own: 6 tokens
    assert align([6], [5], [5]) == [5]


def test_align_exact_every_pass_listed():
    # passes of 3, 1 and 2 tokens: accepted 2, 0, 1 of drafts of 3, 5, 2
    assert align([3, 1, 2], [2, 0, 1], [3, 5, 2]) == [3, 5, 2]


def test_align_one_token_passes_that_all_checked_a_draft():
    # between the two accepting passes two one-token passes and two steps that accepted nothing
    assert align([2, 1, 1, 2], [1, 0, 0, 1], [3, 4, 5, 6]) == [3, 4, 5, 6]


def test_align_one_token_passes_without_a_draft():
    # the list has no zero step between them: neither one-token pass checked a draft
    assert align([2, 1, 1, 2], [1, 1], [3, 6]) == [3, 0, 0, 6]


def test_align_some_one_token_passes_checked_a_draft_unknown_which():
    assert align([2, 1, 1, 2], [1, 0, 1], [3, 4, 6]) == [3, None, None, 6]


def test_align_stretches_before_the_first_and_after_the_last_accepting_pass():
    assert align([1, 1, 3], [0, 2], [2, 7]) == [None, None, 7]
    assert align([1, 1, 3], [0, 0, 2], [2, 4, 7]) == [2, 4, 7]
    assert align([1, 1, 3], [2], [7]) == [0, 0, 7]
    assert align([2, 1, 1], [1, 0, 0], [3, 4, 5]) == [3, 4, 5]
    assert align([2, 1, 1], [1], [3]) == [3, 0, 0]
    assert align([2, 1, 1], [1, 0], [3, 4]) == [3, None, None]


def test_align_as_many_steps_as_passes():
    assert align([1, 1], [0, 0], [2, 3]) == [2, 3]
    assert align([], [], []) == []


def test_align_the_last_pass_cut_by_a_limit():
    # the last pass accepted 3 of 3, but max_tokens let only 2 tokens through (1 accepted shown)
    assert align([3, 2], [2, 3], [3, 3]) == [3, 3]
    # cut to its first token: the step accepted 2 though the chunk shows none
    assert align([3, 1], [2, 2], [3, 4]) == [3, 4]
    assert align([1], [2], [3]) == [3]
    assert align([2, 1, 1], [1, 0, 2], [3, 4, 5]) == [3, 4, 5]


def test_align_a_pass_before_the_last_cannot_be_cut():
    assert align([2, 3], [3, 2], [3, 3]) is None


@pytest.mark.parametrize("decode, accepted, drafted", [
    ([2], [1], []),                      # lists of different lengths
    ([2], [1, 0], [2, 2]),               # more passes with a draft than passes
    ([], [1], [2]),
    ([3, 2], [1, 1], [3, 3]),            # a chunk shows 2 accepted, the list 1
    ([2, 2], [1, 0], [3, 3]),            # two accepting chunks, one accepting step
    ([3, 2], [2, 1, 1], [3, 3, 3]),      # the last chunk already accepted: no cut pass to add
    ([2, 2, 1, 1], [1, 0, 1, 0], [3, 3, 3, 3]),  # a zero step between two adjacent accepting passes
    ([2, 1], [0, 0], [3, 3]),            # the accepting chunk has no accepting step
])
def test_align_inconsistent_lists(decode, accepted, drafted):
    assert align(decode, accepted, drafted) is None


# ----------------------------------------------------------------------------- response_problem

HOLDS = (1, 3, 1, 2)  # 2 + 1 = 3 accepted by the chunks, 2 chunks of several tokens


def test_chunks_that_hold_against_the_answers_own_counts():
    assert response_problem(HOLDS, own(HOLDS, accepted=3, drafted=9, steps=3), 4) is None
    assert response_problem(HOLDS, own(HOLDS, accepted=3, steps=2), 4) is None  # steps = chunks of several


def test_chunks_that_show_more_accepted_than_the_answer():
    why = response_problem(HOLDS, own(HOLDS, accepted=2), 4)
    assert why == ("its chunks show 3 accepted draft tokens, its own count 2: a chunk carried several engine "
                   "steps")


def test_the_answer_may_count_at_most_one_cut_pass_more():
    assert response_problem(HOLDS, own(HOLDS, accepted=5), 2) is None  # 5 - 3 = 2 = k
    why = response_problem(HOLDS, own(HOLDS, accepted=6), 2)
    assert why == ("its own count says 6 accepted draft tokens, its chunks 3: more than one pass's draft (k = 2) "
                   "apart")


def test_the_answers_own_draft_length_comes_first():
    assert response_problem(HOLDS, own(HOLDS, accepted=6, spec_k=3), 2) is None
    why = response_problem(HOLDS, own(HOLDS, accepted=6, spec_k=2), 10)
    assert why is not None and "(k = 2)" in why


def test_no_draft_length_no_limit_on_the_cut():
    assert response_problem(HOLDS, own(HOLDS, accepted=100), None) is None


def test_no_own_count_reads_as_none_accepted():
    assert response_problem((1, 1), rec((1, 1)), 0) is None
    assert response_problem((1, 2), rec((1, 2)), 4) is not None


def test_more_chunks_of_several_tokens_than_passes_with_a_draft():
    why = response_problem(HOLDS, own(HOLDS, accepted=3, steps=1), 4)
    assert why == "2 of its chunks carry several tokens, but it says only 1 passes had a draft"


def test_chunks_against_the_answers_list_of_passes():
    listed = own(HOLDS, accepted=3, steps=3, spec_step_accepted=[2, 0, 1], spec_step_drafted=[4, 4, 4])
    assert response_problem(HOLDS, listed, 4) is None
    wrong = own(HOLDS, accepted=3, steps=3, spec_step_accepted=[1, 0, 2], spec_step_drafted=[4, 4, 4])
    assert response_problem(HOLDS, wrong, 4) == ("its chunks do not line up with the passes it lists "
                                                 "(per_step_accepted)")
    # half a list is no list
    assert response_problem(HOLDS, own(HOLDS, accepted=3, spec_step_accepted=[1, 0, 2]), 4) is None
    assert response_problem(HOLDS, own(HOLDS, accepted=3, spec_step_drafted=[4]), 4) is None


# ----------------------------------------------------------------------------- one_answer

def test_one_answer_chunks_and_response_the_lessons_example():
    r = own((1, 6), accepted=5, drafted=5, steps=1, prompt_id="capital", category="factual", repeat=2,
            concurrency=1, request_rate=None)
    a, why = one_answer(7, r, 5)
    assert why == ""
    assert (a.index, a.prompt_id, a.category, a.repeat, a.concurrency, a.request_rate) == \
           (7, "capital", "factual", 2, 1, None)
    assert (a.source, a.passes, a.drafted_per_pass) == ("chunks+response", [1, 6], None)
    assert (a.output_tokens, a.accepted, a.drafted, a.spec_steps) == (7, 5, 5, 1)
    assert a.tokens_per_pass == 7 / 2
    assert a.acceptance_rate == 1.0
    assert a.acceptance_length == 6.0
    assert tokens_in_passes(a) == "7 tokens in 2 passes of the target"


def test_one_answer_with_the_list_of_passes_knows_each_draft_length():
    r = own((1, 3, 1, 2), accepted=3, drafted=12, steps=3, spec_step_accepted=[2, 0, 1],
            spec_step_drafted=[4, 5, 3], repeat=1, concurrency=4, request_rate=2.0)
    a, _ = one_answer(0, r, 5)
    assert a.source == "chunks+response"
    assert a.drafted_per_pass == [0, 4, 5, 3]  # the prefill checks no draft
    assert (a.repeat, a.concurrency, a.request_rate) == (1, 4, 2.0)


def test_one_answer_half_a_list_of_passes_gives_no_draft_lengths():
    for half in ({"spec_step_accepted": [2, 0, 1]}, {"spec_step_drafted": [4, 5, 3]}):
        a, _ = one_answer(0, own((1, 3, 1, 2), accepted=3, drafted=12, steps=3, **half), 5)
        assert (a.source, a.drafted_per_pass) == ("chunks+response", None)


def test_one_answer_the_run_draft_length_bounds_the_cut():
    # no draft length of its own: the run's k = 2 says 6 - 3 accepted apart is too much
    a, why = one_answer(0, own((1, 3, 1, 2), accepted=6, drafted=12), 2)
    assert a.source == "response"
    assert why.endswith("(k = 2) apart")
    assert one_answer(0, own((1, 3, 1, 2), accepted=6, drafted=12), 3)[0].source == "chunks+response"


def test_one_answer_own_counts_when_the_chunks_are_guesses():
    a, why = one_answer(3, own((1, 4), accepted=3, drafted=4, steps=1, source="chunks"), 4)
    assert (a.source, a.passes, a.accepted, a.drafted, a.spec_steps) == ("response", None, 3, 4, 1)
    assert why == "its chunk token counts are guesses (no usage or logprobs per chunk)"
    assert a.tokens_per_pass is None
    assert tokens_in_passes(a) == "5 tokens"


def test_one_answer_own_counts_when_the_chunks_do_not_hold():
    a, why = one_answer(0, own((1, 4), accepted=1, drafted=4), 4)
    assert (a.source, a.passes, a.accepted) == ("response", None, 1)
    assert why.startswith("its chunks show 3 accepted draft tokens, its own count 1")


def test_one_answer_chunks_alone_to_be_checked_by_the_counters():
    a, why = one_answer(2, rec((1, 3, 1, 2)), 4)
    assert why == ""
    assert (a.source, a.passes, a.accepted, a.drafted, a.spec_steps) == ("chunks", [1, 3, 1, 2], 3, None, None)
    assert a.output_tokens == 7


def test_one_answer_neither():
    assert one_answer(0, rec((1, 2), "chunks"), 4) == \
           (None, "its chunk token counts are guesses (no usage or logprobs per chunk)")


# ----------------------------------------------------------------------------- check_counts

def own_answers():
    return [passes("response", index=0, output=5, accepted=3, drafted=6, steps=2),
            passes("response", index=1, output=9, accepted=4, drafted=8, steps=3)]


def test_counters_that_also_count_other_requests_check_nothing():
    g = group([request(), request()], window(accepted=7, drafted=14, drafts=5))
    g.uncounted = "they count the other side too"
    assert check_counts(g, own_answers()) is None
    assert check_chunks(g, chunk_answers(), 2) == (None, "concurrency 1: they count the other side too")


def test_own_counts_that_add_up_to_the_counters():
    g = group([request(), request()], window(accepted=7, drafted=14, drafts=5))
    c = check_counts(g, own_answers())
    assert c.agree
    assert (c.level, c.requests, c.accepted_requests, c.accepted_counters, c.drafted_requests,
            c.drafted_counters) == ("concurrency 1", 2, 7, 7, 14, 14)
    assert c.text == ("concurrency 1: the 2 answers' own counts add up to the server's counters (14 drafted, 7 "
                      "accepted)")


@pytest.mark.parametrize("accepted, drafted, drafts", [(8, 14, 5), (7, 15, 5), (7, 14, 6), (6, 14, 5)])
def test_own_counts_that_disagree_with_the_counters(accepted, drafted, drafts):
    c = check_counts(group([request(), request()], window(accepted, drafted, drafts)), own_answers())
    assert not c.agree
    assert (c.accepted_counters, c.drafted_counters) == (accepted, drafted)
    assert c.text == ("concurrency 1: the server's per-request counts and its counters disagree: the 2 answers say "
                      f"14 drafted, 7 accepted, 5 passes with a draft; the counters over the same requests "
                      f"{drafted} drafted, {accepted} accepted, {drafts} passes with a draft")


def test_passes_with_a_draft_unknown_in_an_answer_are_not_compared():
    answers = own_answers()
    answers[1].spec_steps = None
    assert check_counts(group([request(), request()], window(7, 14, 99)), answers).agree
    c = check_counts(group([request(), request()], window(8, 14, 99)), answers)
    assert not c.agree
    assert "passes with a draft" not in c.text
    assert "the 2 answers say 14 drafted, 7 accepted; the counters over the same requests 14 drafted, 8 " \
           "accepted" in c.text


def test_passes_with_a_draft_not_counted_by_the_server_are_not_compared():
    pair = window(7, 14, 5)
    pair.before.drafts = pair.after.drafts = None
    # without the drafts counter the snapshot has no spec counters at all
    assert check_counts(group([request(), request()], pair), own_answers()) is None


def test_no_counters_no_check():
    answers = own_answers()
    assert check_counts(group([request(), request()], None), answers) is None
    empty = CounterPair(before=CounterSnapshot(), after=CounterSnapshot())
    assert check_counts(group([request(), request()], empty), answers) is None
    half = window(7, 14, 5)
    half.before = CounterSnapshot()
    assert check_counts(group([request(), request()], half), answers) is None


def test_counters_that_went_back_are_no_check():
    reset = window(-1, 14, 5)
    assert check_counts(group([request(), request()], reset), own_answers()) is None
    assert check_counts(group([request(), request()], window(7, -1, 5)), own_answers()) is None


def test_counters_that_did_not_move_are_a_check():
    answers = [passes("response", index=0, output=3, accepted=0, drafted=0, steps=0)]
    c = check_counts(group([request()], window(0, 0, 0)), answers)
    assert c is not None and c.agree


def test_a_failed_answer_or_one_without_own_counts_leaves_the_counters_unchecked():
    answers = own_answers()
    assert check_counts(group([request(), request(), request(ok=False)], window(7, 14, 5)), answers) is None
    mixed = [answers[0], passes("chunks", index=1, chunks=[1, 5, 3], drafted=None)]
    assert check_counts(group([request(), request()], window(9, 14, 5)), mixed) is None


def test_answers_own_counts_without_drafted_check_the_accepted_only():
    answers = own_answers()
    answers[1].drafted = None
    c = check_counts(group([request(), request()], window(7, 14, 5)), answers)
    assert c.agree
    assert c.drafted_requests is None
    c = check_counts(group([request(), request()], window(8, 14, 5)), answers)
    assert not c.agree
    assert c.text == ("concurrency 1: the server's per-request counts and its counters disagree: the 2 answers say "
                      "7 accepted, 5 passes with a draft; the counters over the same requests 14 drafted, 8 "
                      "accepted, 5 passes with a draft")


# ----------------------------------------------------------------------------- check_chunks

def chunk_answers():
    return [passes(index=0, chunks=[1, 3, 1]), passes(index=1, chunks=[1, 2])]  # 2 + 1 = 3 accepted


def test_serial_chunks_that_the_counters_confirm():
    check, why = check_chunks(group([request(), request()], window(3)), chunk_answers(), 2)
    assert why == ""
    assert check.agree
    assert (check.requests, check.accepted_requests, check.accepted_counters) == (2, 3, 3)
    assert check.text == ("concurrency 1: 3 accepted draft tokens by the chunks, 3 by the server's counters over "
                          "the same 2 requests")


@pytest.mark.parametrize("counted, holds", [(3, True), (5, True), (7, True), (8, False)])
def test_a_cut_last_pass_allows_up_to_k_per_request(counted, holds):
    check, why = check_chunks(group([request(), request()], window(counted)), chunk_answers(), 2)
    assert check.agree is holds
    assert (why == "") is holds


def test_the_draft_length_sets_the_slack_not_the_longest_run_seen():
    # k = 4: up to 8 more than the chunks' 3, though no pass shows more than 2 accepted
    assert check_chunks(group([request(), request()], window(11)), chunk_answers(), 4)[0].agree
    assert not check_chunks(group([request(), request()], window(12)), chunk_answers(), 4)[0].agree


def test_no_answers_no_chunks_to_doubt():
    check, why = check_chunks(group([], window(0)), [], None)
    assert (check.agree, check.requests, why) == (True, 0, "")


def test_without_k_the_longest_accepted_run_seen_stands_for_it():
    # the longest pass shows 3 tokens: 2 accepted; 2 requests: up to 4 more than the chunks' 3
    assert check_chunks(group([request(), request()], window(7)), chunk_answers(), None)[0].agree
    assert not check_chunks(group([request(), request()], window(8)), chunk_answers(), None)[0].agree
    ones = [passes(index=0, chunks=[1, 1, 1])]
    assert check_chunks(group([request()], window(0)), ones, None)[0].agree
    assert not check_chunks(group([request()], window(1)), ones, None)[0].agree


def test_chunks_that_over_count_are_merged_steps():
    check, why = check_chunks(group([request(), request()], window(2)), chunk_answers(), 2)
    assert not check.agree
    assert why == check.text == ("concurrency 1: 3 accepted draft tokens by the chunks, 2 by the server's counters "
                                 "over the same 2 requests: the chunks are not one engine step each")


def test_chunks_not_serial_are_refused():
    check, why = check_chunks(group([request(), request()], window(3), serial=False, label="concurrency 4"),
                              chunk_answers(), 2)
    assert check is None
    assert why == ("concurrency 4: several requests were in flight, so a chunk can carry several engine steps, and "
                   "no answer gave its own counts to check them")


def test_chunks_without_counters_are_refused():
    check, why = check_chunks(group([request(), request()], None), chunk_answers(), 2)
    assert check is None
    assert why == ("concurrency 1: the server gives no spec-decode counters to check the chunks against, and no "
                   "answer gave its own counts")


def test_chunks_of_some_answers_only_are_refused():
    check, why = check_chunks(group([request(), request(), request(ok=False)], window(3)), chunk_answers(), 2)
    assert check is None
    assert why.startswith("concurrency 1: 1 answers have no exact chunks")


# ----------------------------------------------------------------------------- figures

def three_answers():
    return [passes("chunks+response", "p1", "cat-a", 0, [1, 6], drafted=5),           # 7 tokens in 2 passes
            passes("chunks+response", "p2", "cat-b", 1, [1, 1, 2, 1], drafted=4),     # 5 tokens in 4 passes
            passes("response", "p3", "cat-a", 2, None, output=10, accepted=2, drafted=8)]


def test_figures_of_a_group():
    f = figures("all", three_answers())
    assert (f.name, f.requests, f.output_tokens, f.accepted, f.drafted) == ("all", 3, 22, 8, 17)
    assert (f.passes, f.passes_tokens) == (6, 12)       # the answer without passes is left out of these
    assert f.acceptance_rate == pytest.approx(8 / 17)
    assert f.tokens_per_pass == 2.0
    # tokens per pass 1.25 and 3.5; linear between ranks
    assert f.tokens_per_pass_pct == pytest.approx({"p10": 1.475, "p50": 2.375, "p90": 3.275})
    # acceptance 1.0, 0.25, 0.25
    assert f.acceptance_rate_pct == pytest.approx({"p10": 0.25, "p50": 0.25, "p90": 0.85})
    # one-token passes: 1 + 3; two: 1; six: 1
    assert f.tokens_histogram == [4, 1, 0, 0, 0, 1]


def test_figures_with_a_drafted_count_unknown():
    answers = three_answers()
    answers[1].drafted = None
    f = figures("p", answers)
    assert f.drafted is None and f.acceptance_rate is None
    assert f.acceptance_rate_pct == pytest.approx({"p10": 0.25 + 0.1 * 0.75, "p50": 0.625, "p90": 0.925})


def test_figures_without_passes():
    f = figures("p3", three_answers()[2:])
    assert (f.passes, f.passes_tokens, f.tokens_per_pass) == (None, None, None)
    assert f.tokens_histogram == [] and f.tokens_per_pass_pct == {}
    assert f.acceptance_rate == 0.25
    assert f.acceptance_rate_pct == {"p10": 0.25, "p50": 0.25, "p90": 0.25}


def test_figures_with_nothing_drafted():
    f = figures("p", [passes("response", output=4, accepted=0, drafted=0)])
    assert f.acceptance_rate is None and f.acceptance_rate_pct == {}


# ----------------------------------------------------------------------------- positions

@pytest.mark.parametrize("longest, width", [(1, 4), (63, 4), (64, 4), (65, 8), (128, 8), (129, 16), (1000, 64)])
def test_bin_width(longest, width):
    assert bin_width(longest) == width
    assert math.ceil(longest / width) <= 16


def test_acceptance_by_position_the_lessons_answer_and_a_slow_one():
    # [1, 6]: position 0 the prefill's, 1-5 from the draft, 6 the target's own
    # [1, 1, 2, 1]: positions 0, 1 own, 2 from the draft, 3, 4 own
    bins = positions(three_answers())
    assert [(b.start, b.end, b.tokens, b.from_draft) for b in bins] == [(0, 4, 8, 4), (4, 7, 4, 2)]
    assert [b.share for b in bins] == [0.5, 0.5]


def test_acceptance_by_position_at_most_sixteen_bins_of_a_power_of_two():
    long = passes(chunks=[1] + [5] * 13)  # 66 tokens
    bins = positions([long])
    assert len(bins) == 9 and {b.end - b.start for b in bins[:-1]} == {8}
    assert (bins[-1].start, bins[-1].end) == (64, 66)
    # pass i (from 0) covers positions 1 + 5 (i - 1) .. 5 i: all but its last token from the draft
    assert sum(b.tokens for b in bins) == 66
    assert sum(b.from_draft for b in bins) == 13 * 4
    assert (bins[0].tokens, bins[0].from_draft) == (8, 6)  # 0 own, 1-4 draft, 5 own, 6-7 draft


def test_no_passes_no_positions():
    assert positions(three_answers()[2:]) == []
    assert positions([]) == []


# ----------------------------------------------------------------------------- chosen

def to_choose():
    return [passes(pid="a", index=0, chunks=[1, 1, 1]),        # 1.0
            passes(pid="b", index=1, chunks=[1, 2, 2]),        # 5/3
            passes(pid="b", index=2, chunks=[1, 6]),           # 3.5: b's best
            passes(pid="c", index=3, chunks=[1, 3, 1, 3]),     # 2.0
            passes("response", pid="d", index=4, output=30, accepted=25, drafted=25),
            passes(pid="e", index=5, chunks=[1, 1, 2])]        # 4/3


def test_chosen_best_first_then_worst_one_per_prompt():
    assert chosen(to_choose(), 0) == []
    assert chosen(to_choose(), 1) == [2]
    assert chosen(to_choose(), 2) == [2, 0]
    assert chosen(to_choose(), 3) == [2, 0, 3]
    assert chosen(to_choose(), 4) == [2, 0, 3, 5]
    assert chosen(to_choose(), 9) == [2, 0, 3, 5]  # d has no passes to draw
    more = [*to_choose(), passes(pid="f", index=6, chunks=[1, 2, 3]),   # 2.0, after c (index 3) on a tie
            passes(pid="g", index=7, chunks=[1, 4, 4])]                 # 3.0
    # ranked: b 3.5, g 3.0, c 2.0, f 2.0, e 4/3, a 1.0
    assert chosen(more, 6) == [2, 0, 7, 5, 3, 6]


def test_chosen_ties_go_to_the_earlier_answer():
    tied = [passes(pid="x", index=0, chunks=[1, 3]), passes(pid="y", index=1, chunks=[1, 3]),
            passes(pid="x", index=2, chunks=[1, 3])]
    assert chosen(tied, 3) == [0, 1]
    later = [passes(pid="y", index=4, chunks=[1, 3]), passes(pid="x", index=3, chunks=[1, 3])]
    assert chosen(later, 1) == [1]


# ----------------------------------------------------------------------------- seen

def test_seen_chunks_checked_by_the_counters():
    recs = [rec((1, 6), prompt_id="capital", category="factual"), rec((1, 1, 2, 1), prompt_id="poem", category="open"),
            rec((1, 2, 1), prompt_id="capital", category="factual", repeat=1)]
    s = seen([group(recs, window(5 + 1 + 1))], k=5, show=2)
    assert s.available and s.source == "chunks"
    assert [a.index for a in s.requests] == [0, 1, 2]
    assert [c.agree for c in s.checks] == [True]
    assert s.source_note == ("the streamed chunks (one engine step each), checked against the server's counters: 3 "
                             "answers; sums checked against the counters at 1 of 1 levels")
    assert (s.overall.accepted, s.overall.passes, s.overall.passes_tokens) == (7, 9, 16)
    assert [(f.name, f.requests, f.accepted) for f in s.prompts] == [("capital", 2, 6), ("poem", 1, 1)]
    assert [(f.name, f.passes) for f in s.categories] == [("factual", 5), ("open", 4)]
    assert s.positions == positions(s.requests)
    assert s.shown == [0, 1]  # capital's 7 tokens in 2 passes, then the poem's 5 in 4
    assert s.findings == [] and s.k == 5
    assert s.overall.name == "all"
    assert seen([group(recs, window(7))], k=5).shown == []  # none drawn unless asked


def test_seen_a_failed_answer_without_counts_does_not_end_the_group():
    recs = [request(ok=False), rec((1, 3)), rec((1, 2))]
    s = seen([Group("concurrency 1", [(i, r) for i, r in enumerate(recs)][1:], window(3))], k=4)
    assert [a.index for a in s.requests] == [1, 2]
    s = seen([group(recs, window(3))], k=4)
    assert not s.available  # the failed answer's steps are in the counters, not in any chunk
    assert "1 answers have no exact chunks" in s.source_note


def test_seen_reads_each_answer_against_the_draft_length():
    recs = [own((1, 3), accepted=5, drafted=6, steps=2)]  # 5 - 2 = 3 accepted beyond its chunks
    assert seen([group(recs, window(5, 6, 2))], k=3).requests[0].source == "chunks+response"
    assert seen([group(recs, window(5, 6, 2))], k=2).requests[0].source == "response"


def test_seen_checks_chunks_against_the_draft_length():
    # the chunks show 2 and 1 accepted; the counters 7: a cut last pass of up to k = 4 per request
    recs = [rec((1, 3)), rec((1, 2))]
    assert seen([group(recs, window(7))], k=4).available
    assert not seen([group(recs, window(7))], k=1).available


def test_seen_an_empty_group_is_no_check():
    s = seen([group([], window(0))], k=4)
    assert s.checks == [] and not s.available


def test_seen_every_reason_once_in_order():
    guessed = Group("concurrency 1", [(0, rec((1, 2), "chunks"))], window(1))
    busy = Group("concurrency 4", [(1, rec((1, 2)))], window(1), serial=False)
    again = Group("concurrency 8", [(2, rec((1, 2), "chunks"))], window(1))
    s = seen([guessed, busy], k=4)
    assert not s.available and s.k == 4
    assert s.source_note == NOT_AVAILABLE + (
        "concurrency 1: its chunk token counts are guesses (no usage or logprobs per chunk); concurrency 4: several "
        "requests were in flight, so a chunk can carry several engine steps, and no answer gave its own counts to "
        "check them")
    fine = group([rec((1, 3))], window(2), label="concurrency 2")
    s = seen([fine, busy, again], k=4)
    assert s.available
    assert s.source_note.endswith(
        "; not available at concurrency 4: several requests were in flight, so a chunk can carry several engine "
        "steps, and no answer gave its own counts to check them; concurrency 8: its chunk token counts are guesses "
        "(no usage or logprobs per chunk)")


def test_seen_refused_chunks_say_why_never_guess():
    recs = [rec((1, 6)), rec((1, 2))]
    s = seen([group(recs, window(6))], k=5, refuse="the spec-off side merges chunks")
    assert not s.available and s.source == "none" and s.requests == []
    assert s.source_note == NOT_AVAILABLE + "concurrency 1: the spec-off side merges chunks (1 more answers alike)"


def test_seen_refuse_leaves_the_answers_own_counts_without_passes():
    recs = [own((1, 6), accepted=5, drafted=5, steps=1, spec_step_accepted=[5], spec_step_drafted=[5]),
            own((1, 4), accepted=1, drafted=5, steps=1)]  # chunks that contradict the count: the reason is known
    s = seen([group(recs, window(6, 10, 2))], k=5, refuse="merged")
    assert s.available and s.source == "response"
    assert [(a.source, a.passes, a.drafted_per_pass, a.accepted) for a in s.requests] == \
           [("response", None, None, 5), ("response", None, None, 1)]
    assert s.checks[0].agree and s.findings == []
    assert s.positions == [] and s.shown == []
    assert s.source_note == ("each answer's own drafted and accepted counts (no pass order): 2 answers; sums checked "
                             "against the counters at 1 of 1 levels; no chunk read as a pass: merged")
    plain = seen([group([own((1, 6), accepted=5, drafted=5, steps=1)], window(5, 5, 1))], k=5)
    assert "no chunk read" not in plain.source_note


def test_seen_chunks_that_the_counters_refuse():
    s = seen([group([rec((1, 6))], window(3))], k=5)
    assert not s.available
    assert s.source_note == NOT_AVAILABLE + ("concurrency 1: 5 accepted draft tokens by the chunks, 3 by the "
                                            "server's counters over the same 1 requests: the chunks are not one "
                                            "engine step each")
    assert [c.agree for c in s.checks] == [False]


def test_seen_nothing_to_read():
    s = seen([group([])])
    assert not s.available and s.source_note == NOT_AVAILABLE + "no answer to read"
    assert seen([group([request(ok=False)], window(0))]).source_note == NOT_AVAILABLE + "no answer to read"
    failed = seen([group([rec((1, 2)), request(ok=False)], window(1))])
    assert not failed.available
    assert failed.source_note == NOT_AVAILABLE + "concurrency 1: 1 answers have no exact chunks (failed or counted " \
                                                 "by guess), so the counters cannot check the rest"


def test_seen_one_guessed_answer_says_its_reason_once():
    s = seen([group([rec((1, 2), "chunks")], window(1))])
    assert s.source_note == NOT_AVAILABLE + ("concurrency 1: its chunk token counts are guesses (no usage or logprobs "
                                            "per chunk)")


def test_seen_a_failed_answer_with_its_own_counts_is_read():
    recs = [own((1, 3), accepted=2, drafted=4, steps=1, ok=False), own((1, 1), accepted=0, drafted=4, steps=1)]
    s = seen([group(recs, window(2, 8, 2))], k=4)
    assert [a.index for a in s.requests] == [0, 1]
    assert s.checks[0].agree


def test_seen_counters_that_disagree_are_a_finding():
    recs = [own((1, 6), accepted=5, drafted=5, steps=1)]
    s = seen([group(recs, window(6, 5, 1))], k=5)
    assert s.available
    assert s.findings == [s.checks[0].text]
    assert "disagree" in s.findings[0]
    assert "sums checked" not in s.source_note


def test_seen_an_answer_whose_exact_chunks_contradict_it_is_a_finding():
    recs = [own((1, 6), accepted=2, drafted=5, prompt_id="x"), own((1, 3), accepted=2, drafted=5, source="chunks")]
    s = seen([group(recs, None)], k=5)
    assert [a.source for a in s.requests] == ["response", "response"]
    assert s.findings == ["x (concurrency 1): its chunks show 5 accepted draft tokens, its own count 2: a chunk "
                          "carried several engine steps"]  # the guessed chunks say nothing about the server
    assert s.source == "response"
    assert s.source_note == "each answer's own drafted and accepted counts (no pass order): 2 answers"


def test_seen_answers_that_contradict_themselves_are_one_finding_per_level():
    merged = [own((1, 6), accepted=2, drafted=5, prompt_id="x"), own((1, 4), accepted=1, drafted=5, prompt_id="y"),
              own((1, 2, 2), accepted=1, drafted=5, prompt_id="z")]
    level2 = Group("concurrency 2", [(3, own((1, 5), accepted=0, drafted=4, prompt_id="w"))], None, serial=False)
    s = seen([group(merged, None), level2], k=5)
    assert s.findings == [
        "x (concurrency 1): its chunks show 5 accepted draft tokens, its own count 2: a chunk carried several engine "
        "steps (2 more answers alike)",
        "w (concurrency 2): its chunks show 4 accepted draft tokens, its own count 0: a chunk carried several engine "
        "steps"]


def test_seen_some_answers_with_own_counts_some_without():
    recs = [own((1, 3), accepted=2, drafted=4, steps=1), rec((1, 2))]
    s = seen([group(recs, window(3))], k=4)
    assert [a.index for a in s.requests] == [0]
    assert s.checks == []
    assert s.source_note.endswith("; not available at concurrency 1: only some answers gave their own counts")


def test_seen_mixed_sources_over_levels():
    level1 = group([rec((1, 3)), rec((1, 2))], window(3), label="concurrency 1")
    level2 = Group("concurrency 2", [(2, own((1, 4), accepted=3, drafted=4, steps=1)),
                                     (3, own((1, 1, 2), accepted=1, drafted=4, steps=1, source="chunks"))],
                   window(4, 8, 2), serial=False)
    level3 = Group("concurrency 4", [(4, rec((1, 2)))], window(1), serial=False)
    s = seen([level3, level2, level1], k=4, show=1)
    assert [(a.index, a.source) for a in s.requests] == \
           [(0, "chunks"), (1, "chunks"), (2, "chunks+response"), (3, "response")]
    assert s.source == "chunks"
    assert [(c.level, c.agree) for c in s.checks] == [("concurrency 2", True), ("concurrency 1", True)]
    assert s.source_note == (
        "the streamed chunks (one engine step each), checked against the server's counters: 2 answers; "
        "the streamed chunks (one engine step each), checked against each answer's own counts: 1 answers; "
        "each answer's own drafted and accepted counts (no pass order): 1 answers; "
        "sums checked against the counters at 2 of 2 levels; "
        "not available at concurrency 4: several requests were in flight, so a chunk can carry several engine "
        "steps, and no answer gave its own counts to check them")
    assert s.shown == [2]  # 5 tokens in 2 passes


def test_seen_the_commonest_source_names_the_side_ties_to_the_best():
    one_each = [group([own((1, 3), accepted=2, drafted=4, steps=1)], window(2, 4, 1), label="concurrency 1"),
                Group("concurrency 2", [(1, own((1, 2), accepted=1, drafted=4, steps=1, source="chunks"))],
                      window(1, 4, 1), serial=False)]
    assert seen(one_each, k=4).source == "chunks+response"
    assert seen(list(reversed(one_each)), k=4).source == "chunks+response"


def test_seen_categories_sorted_prompts_in_answer_order():
    recs = [rec((1, 2), prompt_id="z", category="b"), rec((1, 2), prompt_id="a", category="a")]
    s = seen([group(recs, window(2))], k=4)
    assert [f.name for f in s.prompts] == ["z", "a"]
    assert [f.name for f in s.categories] == ["a", "b"]


# ----------------------------------------------------------------------------- compare and probe

def compare(records, settings=None, on_counters=None, rate_counters=None, k=3) -> CompareReport:
    return CompareReport(settings=settings or CompareSettings(show=1), off_server=server(base_url="http://off"),
                         on_server=server(base_url="http://on", num_speculative_tokens=k), requests=records,
                         counters_on=on_counters or {}, counters_on_rate=rate_counters or {})


def test_merged_off_names_the_spec_off_answers_of_several_tokens():
    assert merged_off([rec((1, 1, 1)), rec((1, 3), ok=False), rec((1, 3), "chunks")]) is None
    assert merged_off([rec((1, 2)), rec((1, 1)), rec((2, 1), "logprobs")]) == (
        "2 spec-off answer(s) streamed chunks of several tokens (a stream interval above 1, or chunks merged on the "
        "way), so a chunk is not one engine step")


def test_compare_groups_per_concurrency_and_request_rate():
    records = [
        rec((1, 2), side="on", warmup=True),                         # 0: warm-up, left out
        rec((1, 6), side="on", prompt_id="capital"),                 # 1: concurrency 1, 5 accepted
        rec((1, 1), side="off"),                                     # 2: spec off: one token per chunk
        rec((1, 3), side="on", prompt_id="poem", repeat=1),          # 3: concurrency 1, 2 accepted
        rec((1, 3), side="on", concurrency=2),                       # 4: concurrency 2, no own counts
        own((1, 4), accepted=3, drafted=3, steps=1, side="on", concurrency=0, request_rate=2.0),  # 5: rate 2/s
    ]
    report = compare(records, CompareSettings(concurrency=[1, 2], show=2),
                     {1: window(7), 2: window(2)}, {"2": window(3, 3, 1)})
    s = compare_speculation(report)
    assert s.k == 3
    assert [a.index for a in s.requests] == [1, 3, 5]
    assert [(c.level, c.agree) for c in s.checks] == [("concurrency 1", True), ("request rate 2/s", True)]
    assert "not available at concurrency 2: several requests were in flight" in s.source_note
    assert s.shown == [0, 1]  # capital 7 tokens in 2 passes, then poem 4 in 2


def test_compare_rates_are_never_serial():
    records = [rec((1, 3), side="on", concurrency=0, request_rate=math.inf)]
    s = compare_speculation(compare(records, on_counters={}, rate_counters={"inf": window(2)}))
    assert not s.available
    assert s.source_note == NOT_AVAILABLE + ("request rate inf/s: several requests were in flight, so a chunk can "
                                            "carry several engine steps, and no answer gave its own counts to "
                                            "check them")


def test_compare_counters_of_the_level():
    records = [rec((1, 3), side="on")]
    assert compare_speculation(compare(records, on_counters={1: window(2)})).available
    assert not compare_speculation(compare(records, on_counters={2: window(2)})).available
    rated = [own((1, 3), accepted=2, drafted=3, steps=1, side="on", concurrency=0, request_rate=0.5)]
    assert compare_speculation(compare(rated, rate_counters={"0.5": window(2, 3, 1)})).checks[0].agree
    assert compare_speculation(compare(rated, rate_counters={"2": window(2, 3, 1)})).checks == []


def test_compare_off_side_with_merged_chunks_refuses_the_on_sides_chunks():
    records = [rec((1, 3), side="on"), rec((1, 2, 1), side="off")]
    s = compare_speculation(compare(records, on_counters={1: window(2)}))
    assert not s.available
    assert s.source_note.startswith(NOT_AVAILABLE + "concurrency 1: 1 spec-off answer(s) streamed chunks of several "
                                                    "tokens")


def test_compare_one_server_as_both_sides_checks_nothing_by_its_counters():
    both = compare([rec((1, 3), side="on"), rec((1, 1), side="off")], on_counters={1: window(4)})
    both.off_server = both.on_server
    s = compare_speculation(both)
    assert not s.available and s.checks == []
    assert s.source_note == NOT_AVAILABLE + ("concurrency 1: the spec-on and spec-off sides are one server "
                                            "(http://on), whose counters count both sides")
    # the answers' own counts stand, without a check: the counters hold the spec-off side's 2 more accepted
    both.requests = [own((1, 3), accepted=2, drafted=3, steps=1, side="on"),
                     own((1, 3), accepted=2, drafted=3, steps=1, side="off")]
    both.counters_on = {1: window(4, 6, 2)}
    s = compare_speculation(both)
    assert s.available and s.source == "chunks+response"
    assert s.checks == [] and s.findings == []


def test_compare_without_a_spec_on_answer():
    assert compare_speculation(compare([rec((1, 1), side="off"), rec((1, 3), side="on", warmup=True)])) is None


def probe(records, concurrency=1, rates=(), scale=None, spec_enabled=True, before=BEFORE, accepted=0,
          show=1) -> ProbeReport:
    pair = window(accepted, before=before)
    return ProbeReport(settings=ProbeSettings(request=RequestSettings(), concurrency=concurrency, repeat=1, warmup=0,
                                              prompts_source="built-in", show=show,
                                              load=LoadSettings(request_rates=list(rates)) if rates else None),
                       server=server(spec_enabled=spec_enabled, num_speculative_tokens=5),
                       latency=latency_summary([]), acceptance=AcceptanceSummary(known=False),
                       counters_before=pair.before, counters_after=pair.after, requests=records, scale=scale)


def worker(i):
    return WorkerInfo(worker=i, kind="process", jobs=1, concurrency=1)


def test_probe_serial_at_concurrency_one():
    records = [rec((1, 6), warmup=True), rec((1, 6)), rec((1, 1, 2))]
    s = probe_speculation(probe(records, accepted=6))
    assert s.available and s.source == "chunks" and s.k == 5
    assert [a.index for a in s.requests] == [1, 2]
    assert [(c.level, c.agree) for c in s.checks] == [("the run", True)]
    assert s.shown == [0]


@pytest.mark.parametrize("kwargs", [
    {"concurrency": 2},
    {"rates": [1.0]},
    {"scale": ScaleLayout(executor="workers", workers_requested=2, workers=[worker(0), worker(1)])},
    {"scale": ScaleLayout(executor="merged", workers_requested=2)},
])
def test_probe_not_serial(kwargs):
    s = probe_speculation(probe([rec((1, 6))], accepted=5, **kwargs))
    assert not s.available
    assert s.source_note.startswith(NOT_AVAILABLE + "the run: several requests were in flight")


def test_probe_one_worker_is_serial():
    scale = ScaleLayout(executor="workers", workers_requested=1, workers=[worker(0)])
    assert probe_speculation(probe([rec((1, 6))], accepted=5, scale=scale)).available


def test_probe_spec_off_server_and_no_answers():
    assert probe_speculation(probe([rec((1, 6))], accepted=5, spec_enabled=False)) is None
    assert probe_speculation(probe([rec((1, 6))], accepted=5, spec_enabled=None)).available
    assert probe_speculation(probe([rec((1, 6), warmup=True)])) is None


# ----------------------------------------------------------------------------- captions

def test_percent():
    assert percent(None) == "-"
    assert percent(float("nan")) == "-"
    assert percent(0.456) == "46%"
    assert percent(1.0) == "100%"


def test_the_module_names_its_sources():
    assert set(ps.SOURCE_TEXT) == {"chunks+response", "chunks", "response"}


def test_the_records_figures_without_a_divisor():
    none = passes("response", output=4, accepted=0, drafted=0, steps=0)
    assert (none.acceptance_rate, none.acceptance_length, none.tokens_per_pass) == (None, None, None)
    some = passes("chunks+response", chunks=[1, 3, 1, 2], drafted=8, steps=4)  # 3 accepted over 4 passes with a draft
    assert (some.acceptance_rate, some.acceptance_length, some.tokens_per_pass) == (3 / 8, 1.75, 7 / 4)
    assert PositionBin(start=0, end=4, tokens=0, from_draft=0).share == 0.0
    assert PositionBin(start=0, end=4, tokens=4, from_draft=3).share == 0.75


def test_the_drawn_answers_are_the_shown_then_the_first_with_passes_of_each_named_prompt():
    from specadapt.analysis.passes import drawn, first_answer
    from specadapt.records.passes import RequestPasses, SpeculationSeen

    def answer(i, pid, passes):
        return RequestPasses(index=i, prompt_id=pid, category="c", source="chunks+response" if passes else "response",
                             passes=passes, output_tokens=3, accepted=1)

    answers = [answer(0, "a", None), answer(1, "a", [1, 2]), answer(2, "b", [1, 1, 1]), answer(3, "c", None)]
    seen = SpeculationSeen(available=True, requests=answers, shown=[2])
    assert first_answer(seen, "a") is answers[1]  # the first whose passes are known
    assert first_answer(seen, "c") is answers[3]  # none known: the first
    assert first_answer(seen, "z") is None
    assert drawn(seen) == [answers[2]]
    assert drawn(seen, ["b", "a", "c", "z"]) == [answers[2], answers[1], answers[3]]  # each once, shown first

"""Did speculation run, and on which prompts (analysis/activity.py): every source, its checks and the
evidence sentence, on records and counters built here."""

from __future__ import annotations

import pytest

from specadapt.analysis.activity import chunk_accepted, chunks_hold, compared_on, counter_totals, spec_activity
from specadapt.records import CompareReport, CompareSettings, CounterSnapshot, RequestRecord, ServerInfo
from specadapt.records.reports import CounterPair
from builders import request

OFF = ServerInfo(backend="vllm", base_url="http://off")


def rec(side, pid="a", chunks=(1, 1, 1), concurrency=1, repeat=0, ok=True, warmup=False, drafted=None, accepted=None,
        source="usage", rate=None, category="c"):
    return request(prompt_id=pid, category=category, side=side, concurrency=concurrency,
                   repeat=repeat, ok=ok, warmup=warmup, chunk_tokens=list(chunks), output_tokens=sum(chunks),
                   spec_drafted=drafted, spec_accepted=accepted, token_source=source, request_rate=rate)


def counters(drafted, accepted, before=(0, 0)) -> CounterPair:
    return CounterPair(before=CounterSnapshot(drafts=0, draft_tokens=before[0], accepted_tokens=before[1]),
                       after=CounterSnapshot(drafts=1, draft_tokens=before[0] + drafted,
                                             accepted_tokens=before[1] + accepted))


NO_COUNTERS = CounterPair(before=CounterSnapshot(), after=CounterSnapshot())


def report(records, levels=None, k=4, spec_enabled=True, rates=None) -> CompareReport:
    on = ServerInfo(backend="vllm", base_url="http://on", spec_enabled=spec_enabled, num_speculative_tokens=k,
                    spec_signal="spec-decode counters on /metrics" if spec_enabled else "no spec-decode counters")
    return CompareReport(settings=CompareSettings(), off_server=OFF, on_server=on, requests=records,
                         counters_on=levels or {}, counters_on_rate=rates or {})


def test_accepted_from_chunks_is_tokens_minus_chunks():
    assert chunk_accepted(rec("on", chunks=(1, 5, 5, 1, 3))) == 15 - 5
    assert chunk_accepted(rec("on", chunks=())) == 0


def test_only_answers_with_a_spec_off_partner_are_compared():
    recs = [rec("off", "a"), rec("on", "a"), rec("on", "b"), rec("off", "c", ok=False), rec("on", "c"),
            rec("off", "d", warmup=True), rec("on", "d", warmup=True), rec("off", "a", repeat=1),
            rec("on", "a", repeat=1)]
    assert [(r.prompt_id, r.repeat) for r in compared_on(recs)] == [("a", 0), ("a", 1)]


def test_chunks_checked_against_the_counters_give_each_prompt_its_accepted_tokens():
    recs = [rec("off", "a", (1,) * 9), rec("on", "a", (1, 5, 3)), rec("off", "b", (1,) * 3), rec("on", "b", (1, 1, 1)),
            rec("off", "a", (1,) * 9, concurrency=4), rec("on", "a", (1, 4, 4), concurrency=4)]
    a = spec_activity(report(recs, {1: counters(12, 6), 4: counters(8, 6)}))
    assert a.ran is True and (a.drafted, a.accepted) == (20, 12) and a.source == "chunks"
    assert a.evidence == "the spec-on server's counters: 20 draft tokens proposed, 12 accepted over the compared levels"
    assert a.source_note == ("streamed chunks, one engine step each: 12 accepted tokens by the chunks, 12 by the "
                             "server's counters at the same levels")
    by = {p.prompt_id: p for p in a.prompts}
    assert (by["a"].accepted, by["a"].exercised, by["a"].requests, by["a"].output_tokens) == (12, True, 2, 18)
    assert (by["b"].accepted, by["b"].exercised, by["b"].drafted) == (0, False, None)
    assert a.exercised_prompts == 1 and (a.accepted_output_tokens, a.output_tokens) == (12, 21)


def test_counters_may_exceed_the_chunks_by_at_most_k_per_request_and_never_fall_below():
    recs = [rec("off", "a", (1,) * 5), rec("on", "a", (1, 3)), rec("off", "b", (1,) * 5), rec("on", "b", (1, 2))]
    assert chunks_hold([r for r in recs if r.side == "on"], [], {(1, None): counters(9, 3 + 8)}, k=4)[0]
    ok, why = chunks_hold([r for r in recs if r.side == "on"], [], {(1, None): counters(9, 3 + 9)}, k=4)
    assert not ok and why == ("the chunks count 3 accepted tokens at concurrency 1, the server's counters 12: chunks "
                              "are not one engine step each there")
    ok, why = chunks_hold([r for r in recs if r.side == "on"], [], {(1, None): counters(9, 2)}, k=4)
    assert not ok and "the chunks count 3 accepted tokens at concurrency 1, the server's counters 2" in why


def test_without_k_the_largest_step_seen_bounds_the_shortfall():
    on = [rec("on", "a", (1, 3))]  # largest step: 2 accepted
    assert chunks_hold(on, [], {(1, None): counters(9, 2 + 2)}, k=None)[0]
    assert not chunks_hold(on, [], {(1, None): counters(9, 2 + 3)}, k=None)[0]


def test_chunk_counts_that_are_guesses_or_merged_spec_off_chunks_refuse_the_chunk_source():
    guessed = [rec("on", "a", (1, 3), source="chunks")]
    ok, why = chunks_hold(guessed, [], {}, 4)
    assert not ok and why.startswith("chunk token counts are guesses")
    ok, why = chunks_hold([rec("on", "a", (1, 3))], [rec("off", "a", (1, 2)), rec("off", "b", (2,))], {}, 4)
    assert not ok and why.startswith("2 spec-off answer(s) streamed chunks of several tokens")
    # a failed spec-off answer or a spec-off answer of one-token chunks does not refuse it
    assert chunks_hold([rec("on", "a", (1, 3))], [rec("off", "a", (1, 2), ok=False), rec("off", "b", (1, 1))], {}, 4)[0]


def test_without_counters_the_chunks_are_used_unchecked_and_say_so():
    recs = [rec("off", "a", (1,) * 6), rec("on", "a", (1, 5))]
    a = spec_activity(report(recs, {1: NO_COUNTERS}, spec_enabled=None))
    assert a.source == "chunks" and a.source_note.endswith("(not checked: the server gives no spec-decode counters)")
    assert a.ran is True and a.accepted == 4
    assert a.evidence == ("the streamed chunks: 4 tokens came in steps of more than one (the server gives no "
                          "spec-decode counters)")


def test_the_answers_own_counts_come_first_and_can_show_a_run_without_counters():
    recs = [rec("off", "a", (1,) * 6), rec("on", "a", (1, 5), drafted=8, accepted=4),
            rec("off", "b", (1,) * 2), rec("on", "b", (1, 1), drafted=4, accepted=0)]
    a = spec_activity(report(recs, {1: NO_COUNTERS}, spec_enabled=None))
    assert a.source == "response" and a.source_note == "the answers' own drafted and accepted counts"
    assert {p.prompt_id: (p.drafted, p.accepted, p.exercised) for p in a.prompts} == {
        "a": (8, 4, True), "b": (4, 0, False)}
    assert a.ran is True and (a.drafted, a.accepted) == (12, 4)
    assert a.evidence == "the answers' own counts: 12 draft tokens proposed, 4 accepted"
    idle = [rec("off", "a", (1, 1)), rec("on", "a", (1, 1), drafted=0, accepted=0)]
    a = spec_activity(report(idle, {1: NO_COUNTERS}, spec_enabled=None))
    assert a.ran is False and a.evidence == "the answers' own counts show no draft token proposed"


def test_one_answer_without_its_own_counts_falls_back_to_the_chunks():
    recs = [rec("off", "a", (1,) * 6), rec("on", "a", (1, 5), drafted=8, accepted=4), rec("off", "b", (1, 1)),
            rec("on", "b", (1, 1))]
    assert spec_activity(report(recs, {1: counters(8, 4)})).source == "chunks"


def test_the_spec_off_server_given_as_on_did_not_run():
    recs = [rec("off", "a", (1,) * 4), rec("on", "a", (1,) * 4)]
    a = spec_activity(report(recs, {1: NO_COUNTERS}, spec_enabled=False))
    assert a.ran is False and a.evidence == "the spec-on server says speculation is off (no spec-decode counters)"
    assert a.exercised_prompts == 0


def test_counters_that_show_no_draft_say_it_did_not_run():
    recs = [rec("off", "a", (1,) * 4), rec("on", "a", (1,) * 4)]
    a = spec_activity(report(recs, {1: counters(0, 0, before=(50, 20))}))
    assert a.ran is False and (a.drafted, a.accepted) == (0, 0)
    assert a.evidence == "the spec-on server's counters show no draft token proposed over the compared levels"


def test_counters_with_drafts_win_over_a_server_that_says_it_is_off():
    recs = [rec("off", "a", (1,) * 4), rec("on", "a", (1, 3))]
    assert spec_activity(report(recs, {1: counters(4, 2)}, spec_enabled=False)).ran is True


def test_nothing_shows_it_ran_when_there_is_no_evidence_at_all():
    recs = [rec("off", "a", (1,) * 4), rec("on", "a", (1,) * 4)]
    a = spec_activity(report(recs, {1: NO_COUNTERS}, spec_enabled=None))
    assert a.ran is None and a.evidence.startswith("nothing shows that speculation ran")
    assert a.source == "chunks" and a.exercised_prompts == 0


def test_no_per_prompt_source_leaves_every_prompt_unknown():
    recs = [rec("off", "a", (2, 2)), rec("on", "a", (1, 3))]
    a = spec_activity(report(recs, {1: counters(4, 2)}))
    assert a.source == "none" and a.source_note.startswith("1 spec-off answer(s) streamed chunks of several tokens")
    assert [(p.accepted, p.exercised) for p in a.prompts] == [(None, None)]
    assert a.exercised_prompts == 0 and a.accepted_output_tokens is None and a.ran is True


def test_nothing_compared_says_so():
    a = spec_activity(report([rec("off", "a", ok=False), rec("on", "a")], {1: counters(4, 2)}))
    assert (a.prompts, a.source, a.source_note, a.exercised_prompts) == ([], "none", "no pair was compared", 0)
    assert a.ran is True  # the counters still show that it drafted


def test_counter_totals_skip_levels_that_were_not_read_and_counters_that_went_down():
    went_down = CounterPair(before=CounterSnapshot(drafts=5, draft_tokens=20, accepted_tokens=9),
                            after=CounterSnapshot(drafts=1, draft_tokens=4, accepted_tokens=2))
    assert counter_totals([counters(4, 2), NO_COUNTERS, counters(6, 1), went_down]) == (10, 3)
    assert counter_totals([NO_COUNTERS, went_down]) is None
    assert counter_totals([]) is None


def test_rate_levels_are_checked_with_their_own_counters():
    inf = float("inf")
    recs = [rec("off", "a", (1,) * 6, concurrency=0, rate=inf), rec("on", "a", (1, 5), concurrency=0, rate=inf)]
    a = spec_activity(report(recs, {}, rates={"inf": counters(8, 4)}))
    assert a.source == "chunks" and a.source_note.startswith("streamed chunks, one engine step each: 4 accepted")
    a = spec_activity(report(recs, {}, rates={"inf": counters(8, 40)}))
    assert a.source == "none" and "at request rate inf/s" in a.source_note


@pytest.mark.parametrize("failed_counts", [True, False])
def test_failed_spec_on_answers_count_in_the_level_check_but_not_per_prompt(failed_counts):
    """A failed request took engine steps (its accepted tokens are in the counters) but is not compared."""
    failed = rec("on", "b", (1, 3), ok=False)
    recs = [rec("off", "a", (1,) * 6), rec("on", "a", (1, 5)), rec("off", "b", (1,) * 3)] + ([failed] if failed_counts else [])
    a = spec_activity(report(recs, {1: counters(12, 4 + (2 if failed_counts else 0))}))
    assert a.source == "chunks" and [p.prompt_id for p in a.prompts] == ["a"]


# --- the boundaries each figure turns on -------------------------------------------------------

def test_a_level_read_before_but_not_after_or_with_accepted_going_down_is_skipped():
    half = CounterPair(before=CounterSnapshot(drafts=0, draft_tokens=0, accepted_tokens=0), after=CounterSnapshot())
    down = CounterPair(before=CounterSnapshot(drafts=0, draft_tokens=0, accepted_tokens=9),
                       after=CounterSnapshot(drafts=1, draft_tokens=8, accepted_tokens=4))
    assert counter_totals([half, down]) is None
    assert counter_totals([half, down, counters(3, 1)]) == (3, 1)


def test_every_refusal_of_the_chunks_is_one_whole_sentence():
    assert chunks_hold([rec("on", "a", (1, 3), source="chunks")], [], {}, 4) == (False, (
        "chunk token counts are guesses (the server gave neither usage nor logprobs per chunk), so chunks cannot "
        "count accepted tokens"))
    assert chunks_hold([rec("on", "a", (1, 3))], [rec("off", "a", (1, 2))], {}, 4) == (False, (
        "1 spec-off answer(s) streamed chunks of several tokens (a stream interval above 1, or chunks merged on the "
        "way), so a chunk is not one engine step"))


def test_a_level_without_counters_does_not_stop_the_check_of_the_next():
    on = [rec("on", "a", (1, 3), concurrency=4)]
    ok, why = chunks_hold(on, [], {(1, None): NO_COUNTERS, (4, None): counters(9, 40)}, 4)
    assert not ok and "at concurrency 4" in why


def test_without_k_a_level_with_no_chunks_allows_no_shortfall():
    failed = rec("on", "a", (), ok=False)  # failed before its first token
    assert chunks_hold([failed], [], {(1, None): counters(1, 0)}, None)[0]
    ok, why = chunks_hold([failed], [], {(1, None): counters(1, 1)}, None)
    assert not ok and "the chunks count 0 accepted tokens at concurrency 1, the server's counters 1" in why
    # a level whose counters were read but none of whose requests is here
    assert chunks_hold([rec("on", "a", (1, 2))], [], {(1, None): counters(2, 1), (4, None): counters(0, 0)}, None)[0]


def test_the_sums_over_levels_are_stated():
    on = [rec("on", "a", (1, 3)), rec("on", "a", (1, 2), concurrency=4)]
    assert chunks_hold(on, [], {(1, None): counters(5, 2), (4, None): counters(5, 3)}, 4) == (True, (
        "streamed chunks, one engine step each: 3 accepted tokens by the chunks, 5 by the server's counters at the "
        "same levels"))


def test_the_servers_draft_length_bounds_the_shortfall_not_the_largest_step_seen():
    """k = 4 from the server: a last step that accepted 3 tokens max_tokens then cut is allowed, though
    no chunk showed more than one accepted token."""
    recs = [rec("off", "a", (1,) * 4), rec("on", "a", (1, 2, 1))]
    a = spec_activity(report(recs, {1: counters(8, 1 + 3)}, k=4))
    assert a.source == "chunks"
    assert spec_activity(report(recs, {1: counters(8, 1 + 3)}, k=None)).source == "none"


def test_spec_off_answers_do_not_count_in_the_spec_on_check():
    recs = [rec("off", "a", (1,) * 4, source="chunks"), rec("on", "a", (1, 3))]
    assert spec_activity(report(recs, {1: counters(4, 2)})).source == "chunks"


def test_a_rate_label_without_records_is_passed_over():
    recs = [rec("off", "a", (1,) * 4), rec("on", "a", (1, 3))]
    a = spec_activity(report(recs, {1: counters(4, 2)}, rates={"8": counters(4, 2)}))
    assert a.source == "chunks" and a.ran is True


def test_one_accepted_token_exercises_a_prompt_and_zero_drafted_stays_zero():
    recs = [rec("off", "a", (1,) * 4), rec("on", "a", (1, 2, 1), drafted=4, accepted=1),
            rec("off", "b", (1, 1)), rec("on", "b", (1, 1), drafted=0, accepted=0)]
    a = spec_activity(report(recs, {1: NO_COUNTERS}, spec_enabled=None))
    assert {p.prompt_id: (p.drafted, p.accepted, p.exercised) for p in a.prompts} == {
        "a": (4, 1, True), "b": (0, 0, False)}


def test_one_drafted_token_or_drafts_without_acceptance_show_it_ran():
    recs = [rec("off", "a", (1,) * 4), rec("on", "a", (1, 1, 1))]
    assert spec_activity(report(recs, {1: counters(1, 0)})).ran is True
    assert spec_activity(report(recs, {1: counters(8, 0)})).ran is True
    one = [rec("off", "a", (1,) * 4), rec("on", "a", (1, 1, 1), drafted=1, accepted=0)]
    a = spec_activity(report(one, {1: NO_COUNTERS}, spec_enabled=None))
    assert (a.ran, a.evidence) == (True, "the answers' own counts: 1 draft tokens proposed, 0 accepted")


def test_a_server_that_says_it_is_off_without_naming_the_signal():
    recs = [rec("off", "a", (1,) * 4), rec("on", "a", (1,) * 4)]
    r = report(recs, {1: NO_COUNTERS}, spec_enabled=False)
    r.on_server.spec_signal = None
    assert spec_activity(r).evidence == "the spec-on server says speculation is off"


def test_nothing_shows_it_ran_in_one_whole_sentence():
    recs = [rec("off", "a", (1,) * 4), rec("on", "a", (1,) * 4)]
    assert spec_activity(report(recs, {1: NO_COUNTERS}, spec_enabled=None)).evidence == (
        "nothing shows that speculation ran: the spec-on server gives no spec-decode counters and no per-request "
        "counts, and no streamed chunk carried more than one token")


def test_answers_that_state_accepted_but_not_drafted_tokens_do_not_pass_for_chunks():
    recs = [rec("off", "a", (1,) * 4), rec("on", "a", (1, 3), drafted=None, accepted=2)]
    a = spec_activity(report(recs, {1: NO_COUNTERS}, spec_enabled=None))
    assert a.source == "response" and a.ran is None and a.evidence.startswith("nothing shows that speculation ran")

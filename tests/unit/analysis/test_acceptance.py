from specadapt.analysis.acceptance import acceptance_summary
from specadapt.records import CounterSnapshot


def snap(drafts, tokens, acc, pos, gen=100.0):
    return CounterSnapshot(drafts=drafts, draft_tokens=tokens, accepted_tokens=acc,
                           accepted_per_position=dict(enumerate(pos)), generation_tokens=gen)


def test_deltas_and_formulas():
    before = snap(10, 40, 20, [8, 6, 4, 2], gen=50)
    after = snap(30, 120, 70, [26, 20, 14, 10], gen=180)
    s = acceptance_summary(before, after)
    assert s.known
    assert (s.drafts, s.draft_tokens, s.accepted_tokens) == (20, 80, 50)
    assert s.acceptance_rate == 50 / 80
    assert s.mean_acceptance_length == 1 + 50 / 20
    assert s.per_position_rate == [18 / 20, 14 / 20, 10 / 20, 8 / 20]
    assert s.per_position_conditional == [18 / 20, 14 / 18, 10 / 14, 8 / 10]
    assert s.generation_tokens == 130


def test_counter_reset_makes_acceptance_unknown_not_negative():
    s = acceptance_summary(snap(100, 400, 300, [90, 80, 70, 60]), snap(5, 20, 10, [4, 3, 2, 1]))
    assert not s.known
    assert s.acceptance_rate is None
    assert "went down" in s.reason


def test_spec_off_server_has_unknown_acceptance_with_reason():
    off = CounterSnapshot(generation_tokens=10)
    s = acceptance_summary(off, off.model_copy(update={"generation_tokens": 25}))
    assert not s.known and s.acceptance_rate is None
    assert s.reason == "the server exposes no spec-decode counters (speculation off, or stats disabled)"
    assert s.generation_tokens == 15


def test_no_drafts_during_run():
    a = snap(10, 40, 20, [8, 6, 4, 2])
    s = acceptance_summary(a, a)
    assert not s.known and "no drafts" in s.reason


WENT_DOWN = "spec-decode counters went down or vanished during the run (server restarted?)"


def test_unreadable_counters_say_which_and_keep_the_token_count():
    good = snap(10, 40, 20, [8, 6, 4, 2], gen=50)
    bad = CounterSnapshot(generation_tokens=80, source="unavailable: GET /metrics did not answer 200")
    s = acceptance_summary(good, bad)
    assert (s.known, s.generation_tokens) == (False, 30)
    assert s.reason == "counters could not be read (unavailable: GET /metrics did not answer 200)"
    first = acceptance_summary(bad.model_copy(update={"source": "unavailable: first"}),
                               bad.model_copy(update={"source": "unavailable: second"}))
    assert first.reason == "counters could not be read (unavailable: first)"


def test_counters_that_appear_or_vanish_make_acceptance_unknown():
    pairs = ((snap(10, 40, 20, [8, 6, 4, 2], gen=50), CounterSnapshot(generation_tokens=70)),
             (CounterSnapshot(generation_tokens=50), snap(10, 40, 20, [8, 6, 4, 2], gen=70)))
    for before, after in pairs:
        s = acceptance_summary(before, after)
        assert (s.known, s.acceptance_rate) == (False, None)
        assert s.reason == "spec-decode counters appeared or vanished during the run (server restarted?)"
        assert s.generation_tokens == 20


def test_generation_tokens_that_went_down_are_unknown_and_zero_is_kept():
    assert acceptance_summary(CounterSnapshot(generation_tokens=9), CounterSnapshot(generation_tokens=3)) \
        .generation_tokens is None
    assert acceptance_summary(CounterSnapshot(generation_tokens=9), CounterSnapshot(generation_tokens=9)) \
        .generation_tokens == 0
    s = acceptance_summary(snap(100, 400, 300, [90, 80, 70, 60], gen=90), snap(5, 20, 10, [4, 3, 2, 1], gen=10))
    assert (s.known, s.reason, s.generation_tokens) == (False, WENT_DOWN, None)


def test_a_position_that_first_appears_during_the_run_counts_from_zero():
    before = CounterSnapshot(drafts=0, draft_tokens=0, accepted_tokens=0, accepted_per_position={})
    after = CounterSnapshot(drafts=10, draft_tokens=20, accepted_tokens=9, accepted_per_position={0: 6, 1: 3})
    s = acceptance_summary(before, after)
    assert s.known and s.per_position_rate == [0.6, 0.3]


def test_a_position_that_vanishes_makes_acceptance_unknown():
    before = snap(10, 40, 20, [8, 6, 4, 2], gen=50)
    after = snap(30, 120, 70, [26, 20, 14], gen=150)
    s = acceptance_summary(before, after)
    assert (s.known, s.reason, s.generation_tokens) == (False, WENT_DOWN, 100)


def test_drafts_without_draft_tokens_are_no_drafts():
    before = snap(10, 40, 20, [8, 6])
    after = snap(20, 40, 20, [8, 6])
    s = acceptance_summary(before, after)
    assert (s.known, s.reason, s.drafts, s.draft_tokens) == (False, "no drafts were proposed during the run", 10, 0)


def test_a_conditional_rate_after_a_position_that_accepted_nothing_is_unknown():
    s = acceptance_summary(snap(0, 0, 0, [0, 0, 0]), snap(10, 30, 4, [4, 0, 0]))
    assert s.per_position_rate == [0.4, 0.0, 0.0]
    assert s.per_position_conditional == [0.4, 0.0, None]

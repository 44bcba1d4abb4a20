from specadapt.probes.acceptance import acceptance_summary
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
    assert "no spec-decode counters" in s.reason
    assert s.generation_tokens == 15


def test_no_drafts_during_run():
    a = snap(10, 40, 20, [8, 6, 4, 2])
    s = acceptance_summary(a, a)
    assert not s.known and "no drafts" in s.reason

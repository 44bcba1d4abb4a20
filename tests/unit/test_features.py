"""analysis/features.py at its edges: the bounds of each invariant and logprob rule, the problem and
verdict texts as a reader sees them, the stop pickers' limits, the derivations' own messages, and
the exact distribution of a setting on batches, at float64's range and with ties (the catalogue
and the common cases: tests/unit/test_feature_matrix.py). Expected values are worked out by hand."""

from __future__ import annotations

import asyncio
import math
import warnings

import numpy as np
import pytest

from specadapt.analysis import features as F
from specadapt.errors import UsageError
from specadapt.records.features import Activity, CellCheck
from specadapt.records.metrics import AcceptanceSummary


def A(text="", **kw):  # noqa: N802
    return F.Answer(text=text, **kw)


# --- invariants: where each rule starts to bite --------------------------------------------------
def test_a_kept_stop_string_at_the_end_does_not_hide_one_earlier():
    kept = {"stop": ["STOP"], "include_stop_str_in_output": True}
    # the kept one at the end is allowed; the one before it is still a stop the server ran past
    assert F.invariant_problems(A("ab STOP cd STOP", finish_reason="stop", stop_reason="STOP"), kept) == [
        "the stop string 'STOP' is in the output at character 3"]


def test_a_stop_string_is_reported_at_its_first_occurrence():
    assert F.invariant_problems(A("STOP x STOP"), {"stop": ["STOP"]}) == [
        "the stop string 'STOP' is in the output at character 0"]


def test_ignore_eos_answer_of_exactly_max_tokens_is_kept_whatever_its_finish_reason():
    params = {"ignore_eos": True, "max_tokens": 4}
    assert F.invariant_problems(A(token_ids=(1, 2, 3, 4), finish_reason="stop"), params) == []
    assert F.invariant_problems(A(token_ids=(1, 2, 3), finish_reason="stop"), params) == [
        "ignore_eos: the answer ended after 3 of 4 tokens (stop)"]


def test_a_structure_cut_by_the_length_limit_is_not_judged():
    rf = {"response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": F.PERSON_SCHEMA}}}
    assert F.invariant_problems(A('{"name": "Ada",', finish_reason="length"), rf) == []
    assert F.invariant_problems(A("555-", finish_reason="length"), {"structured_outputs": {"regex": F.PHONE_REGEX}}) == []
    # the same texts ended by the model are judged
    assert F.invariant_problems(A('{"name": "Ada",', finish_reason="stop"), rf) == [
        "the output is not JSON (Expecting property name enclosed in double quotes at character 15)"]
    assert F.invariant_problems(A("555-", finish_reason="stop"), {"structured_outputs": {"regex": F.PHONE_REGEX}}) == [
        "the output '555-' does not match the regex [0-9]{3}-[0-9]{4}"]


def test_a_schema_is_checked_only_for_a_json_schema_response_format():
    fmt = {"response_format": {"type": "json_object", "json_schema": {"name": "p", "schema": F.PERSON_SCHEMA}}}
    assert F.invariant_problems(A("not JSON at all"), fmt) == []


def test_structure_problems_quote_the_first_40_characters():
    text = "x" * 50
    assert F.invariant_problems(A(text), {"structured_outputs": {"regex": F.PHONE_REGEX}}) == [
        f"the output {'x' * 40!r} does not match the regex [0-9]{{3}}-[0-9]{{4}}"]
    assert F.invariant_problems(A(text), {"structured_outputs": {"choice": ["yes", "no"]}}) == [
        f"the output {'x' * 40!r} is not one of ['yes', 'no']"]


def test_logprob_problems_come_with_the_other_problems():
    answer = A(token_ids=(1, 2, 3), logprobs=(-0.1, -0.2))
    assert F.invariant_problems(answer, {"max_tokens": 2, "logprobs": 1}) == [
        "3 tokens generated, max_tokens is 2", "2 logprobs for 3 tokens"]


def test_logprob_rules_allow_rounding_at_zero_and_ties_in_the_top():
    params = {"logprobs": 2}
    assert F.invariant_problems(A(token_ids=(1,), logprobs=(1e-6,)), params) == []  # rounding above 0
    assert F.invariant_problems(A(token_ids=(1,), logprobs=(2e-6,)), params) == ["logprob above 0 at token 0"]
    tied = A(token_ids=(1,), logprobs=(-1.0,), top_logprobs=((("a", -1.0), ("b", -1.0), ("c", -2.0)),))
    assert F.invariant_problems(tied, params) == []
    # an inversion of at most 1e-9 nats is rounding too; more is an order broken
    swapped = A(token_ids=(1,), logprobs=(-1.0,), top_logprobs=((("a", -1.0), ("b", -1.0 + 1e-9)),))
    assert F.invariant_problems(swapped, params) == []
    swapped = A(token_ids=(1,), logprobs=(-1.0,), top_logprobs=((("a", -1.0), ("b", -1.0 + 2e-9)),))
    assert F.invariant_problems(swapped, params) == ["top logprobs not in descending order at token 0"]


# --- identity records and texts ------------------------------------------------------------------
def test_an_answer_is_a_successful_record_of_the_cell():
    record = F.answer_record(A("ab", token_ids=(4, 5)))
    assert (record.prompt_id, record.category, record.api, record.ok) == ("cell", "features", "completions", True)
    assert record.tokens == ["token_id:4", "token_id:5"] and record.output_tokens == 2 and record.text == "ab"
    assert F.answer_record(A("ab", completion_tokens=7)).output_tokens == 7
    assert F.answer_record(A("ab")).output_tokens == 0
    # the divergence carries what the record says
    d = F.divergence(A("ab", completion_tokens=3), A("ac"))
    assert (d.prompt_id, d.category, d.off_tokens, d.on_tokens) == ("cell", "features", 3, 0)


def test_difference_at_the_first_token_names_it_and_shows_20_characters_each_side():
    off, on = A("x" + "a" * 30, token_ids=(1, 2)), A("y" + "b" * 30, token_ids=(3, 2))
    assert F.difference_text(off, on, F.divergence(off, on)) == (
        f"spec on differs from spec off at token 0, character 0: off {'x' + 'a' * 19!r} vs on {'y' + 'b' * 19!r}")


def test_logprobs_differing_by_exactly_the_tolerance_agree():
    top = (("a", -1.0), ("b", -1.5))
    off = A(logprobs=(-1.0,), top_logprobs=(top,))
    assert F.logprob_differences(off, A(logprobs=(-1.5,), top_logprobs=(top,)), 0.5) == []
    # a top value off by exactly the tolerance, and a swap of two entries exactly the tolerance apart
    assert F.logprob_differences(off, A(logprobs=(-1.0,), top_logprobs=((("a", -1.0), ("b", -2.0)),)), 0.5) == []
    assert F.logprob_differences(off, A(logprobs=(-1.0,), top_logprobs=((("b", -1.5), ("a", -1.0)),)), 0.5) == []
    assert F.logprob_differences(off, A(logprobs=(-1.0,), top_logprobs=((("b", -1.5), ("a", -1.0)),)), 0.49) == [
        "token 0: top logprobs ranked differently at rank 1: 'b' on vs 'a' off"]


# --- the pickers ---------------------------------------------------------------------------------
def test_pick_stop_string_limits():
    prefix = "abcdefghijklmnop"
    assert F.pick_stop_string({3: prefix}, prefix + "q") == ("efghijklmnop", 3)  # 12 characters by default
    assert F.pick_stop_string({0: "a"}, "ab") == ("a", 0)  # one character is a stop string too
    assert F.pick_stop_string({2: "ab"}, "abc", max_chars=1) == ("b", 2)
    # a candidate whose text is not how the answer starts is skipped, even where a suffix would fit
    assert F.pick_stop_string({1: "xb"}, "abc") is None


def test_pick_stop_id_candidate_past_the_answer():
    assert F.pick_stop_id([5, 6], [2]) is None
    assert F.pick_stop_id([5, 6], [2, 1]) == (6, 1)


# --- the derivations' own messages ---------------------------------------------------------------
TEXT = {**{t: " " for t in range(10)}, 10: "x", 11: "y", 12: "z"}


class Ask:
    """The servers as a derivation sees them."""

    def __init__(self, chunks, baseline=None, max_model_len=64):
        self.chunks, self.natural = chunks, baseline
        self.max_tokens, self.max_model_len = 16, max_model_len
        self.detokenized: list[tuple[int, ...]] = []

    async def stream_chunks(self, prompt, max_tokens):
        return self.chunks

    async def detokenize(self, ids):
        self.detokenized.append(tuple(ids))
        return "".join(TEXT[t] for t in ids)

    async def baseline(self, prompt, max_tokens):
        return self.natural

    async def tokenize(self, text):
        assert text == F.LONG_TEXT
        return [7, 8, 9]


def run(derive, ask, prompt=F.REPEAT, params=None):
    return asyncio.run(derive(ask, F.Derived(prompt=prompt, params=dict(params or {}))))


def test_one_token_per_step_says_so():
    with pytest.raises(F.NotExercised) as exc:
        run(F.max_tokens_in_chunk, Ask([[1], [2], [3]]))
    assert str(exc.value) == ("the spec-on server's greedy answer came one token per step (3 tokens): no accepted "
                              "chunk to place the limit in")


def test_stop_string_candidates_are_the_first_eight_inside_a_chunk():
    # positions 2..11 lie inside the third chunk; the first eight (2..9) end on blanks only, the ninth on "x"
    ask = Ask([[0], [1], list(range(2, 13))])
    with pytest.raises(F.NotExercised) as exc:
        run(F.stop_string_in_chunk, ask)
    assert str(exc.value) == "no stop string completes inside an accepted chunk of the spec-on answer"
    assert sorted(len(ids) for ids in ask.detokenized) == [3, 4, 5, 6, 7, 8, 9, 10, 13]


def test_stop_token_seen_earlier_says_so():
    with pytest.raises(F.NotExercised) as exc:
        run(F.stop_token_in_chunk, Ask([[3], [4], [3, 4, 5]]))
    assert str(exc.value) == "every token inside an accepted chunk occurs earlier in the answer"


def test_min_tokens_of_an_answer_without_a_count_counts_one():
    cell = run(F.min_tokens_past_eos, Ask([], baseline=A("", finish_reason="stop")), prompt=F.SHORT_ANSWER)
    assert cell.params == {"min_tokens": 9, "max_tokens": 17}


def test_long_prompt_is_sized_from_max_model_len():
    cell = run(F.long_prompt(lambda n: n - 8, max_tokens=8), Ask([]), params={"ignore_eos": True})
    assert cell.prompt == [7, 8, 9] * 18 + [7, 8] and cell.params == {"ignore_eos": True, "max_tokens": 8}
    assert cell.notes == ["prompt of 56 tokens, max_model_len 64"]
    cell = run(F.long_prompt(lambda n: n // 2), Ask([], max_model_len=40))
    assert cell.prompt == [7, 8, 9] * 6 + [7, 8] and cell.params == {}
    assert cell.notes == ["prompt of 20 tokens, max_model_len 40"]
    with pytest.raises(F.CannotDerive) as exc:
        run(F.long_prompt(lambda n: n - 8), Ask([], max_model_len=None))
    assert str(exc.value) == "the servers do not say their max_model_len, so no prompt can be sized to it"


# --- the catalogue and settings ------------------------------------------------------------------
def test_parse_features_skips_empty_words_anywhere():
    assert F.parse_features("stop-string, ,seed,") == ["stop-string", "seed"]
    with pytest.raises(UsageError) as exc:
        F.parse_features(",")
    assert str(exc.value) == "--features names no feature: give all, or a comma-separated list"


def test_setting_defaults_and_top_k_one():
    assert F.Setting.of({"top_k": 5}) == F.Setting(1.0, 5, 1.0, 0.0)
    assert F.Setting(top_k=1).body() == {"temperature": 1.0, "top_p": 1.0, "top_k": 1}


def test_exactness_of_top_k_one_and_the_reason_otherwise():
    assert F.exactness_problem(F.Setting(temperature=0.7, top_k=1), 20, "server") is None
    assert F.exactness_problem(F.Setting(min_p=0.05), 20, "server") == (
        "the exact distribution of {'temperature': 1.0, 'top_p': 1.0, 'min_p': 0.05} needs the whole vocabulary, "
        "and the server returns the top 20 only: give --reference DIR (the target recomputed in float64), or a cell "
        "with top_k <= K")


# --- the exact distribution ----------------------------------------------------------------------
RAW = [2.0, 1.5, 0.3, -0.2, -1.0, -3.0]
SETTINGS = [F.Setting(), F.Setting(temperature=0.7), F.Setting(min_p=0.5), F.Setting(top_k=2), F.Setting(top_p=0.6),
            F.Setting(temperature=0.8, top_k=4, top_p=0.8, min_p=0.05)]


@pytest.mark.parametrize("s", SETTINGS, ids=str)
def test_each_row_of_a_batch_is_its_own_distribution(s):
    # rows of different shapes and scales: each must come out as it does alone at its own scale
    batch = np.array([RAW, [0.0] * 6, [v - 1000.0 for v in RAW[::-1]]])
    want = [F.processed_logprobs(np.array(RAW), s), F.processed_logprobs(np.zeros(6), s),
            F.processed_logprobs(np.array(RAW[::-1]), s)]
    got = F.processed_logprobs(batch, s)
    for g, w in zip(got, want):
        assert np.array_equal(np.isfinite(g), np.isfinite(w))
        assert np.allclose(g[np.isfinite(g)], w[np.isfinite(w)], rtol=0, atol=1e-9)
        assert math.fsum(np.exp(g)) == pytest.approx(1.0, abs=1e-12)


def test_the_scale_of_the_logits_does_not_matter_up_to_float64s_edge():
    base = F.processed_logprobs(np.array(RAW), F.Setting(temperature=0.7))
    for shift in (-1000.0, 1000.0):
        assert np.allclose(F.processed_logprobs(np.array(RAW) + shift, F.Setting(temperature=0.7)), base,
                           rtol=0, atol=1e-9)
    # logits at the edge of float64 still give a distribution (the row is normalised before anything is added)
    edge = F.processed_logprobs(np.array([1e308, 0.0]), F.Setting())
    assert edge[0] == 0.0 and edge[1] == -1e308


def test_the_result_is_float64_whatever_the_input():
    raw32 = np.array(RAW, dtype=np.float32)
    got = F.processed_logprobs(raw32, F.Setting(temperature=0.7))
    assert got.dtype == np.float64
    assert np.allclose(got, F.processed_logprobs(raw32.astype(np.float64), F.Setting(temperature=0.7)), rtol=0,
                       atol=1e-15)


def test_top_k_one_is_greedy_and_top_p_one_cuts_nothing():
    assert np.isfinite(F.processed_logprobs(np.array(RAW), F.Setting(top_k=1))).tolist() == [True] + [False] * 5
    # a token whose mass is below float64's resolution next to 1 is still in the support of top_p 1
    tiny = F.processed_logprobs(np.array([0.0, -50.0]), F.Setting())
    assert tiny[1] == pytest.approx(-50.0)


# 10 tokens of probability 0.08 (even ids) and 10 of 0.02 (odd ids): ties, in an order a fast sort reshuffles
TIED = np.log(np.array([0.08, 0.02] * 10))


def test_top_p_keeps_the_lowest_ids_among_ties():
    # mass before each 0.08 token: 0, 0.08, 0.16 < 0.2, then 0.24: three are kept, the lowest ids
    kept = np.flatnonzero(np.isfinite(F.processed_logprobs(TIED, F.Setting(top_p=0.2))))
    assert kept.tolist() == [0, 2, 4]


def test_logsumexp_of_no_mass_is_minus_infinity_silently():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert F._logsumexp(np.array([[-np.inf, -np.inf]]))[0, 0] == -np.inf


# --- draws -----------------------------------------------------------------------------------------
def test_draw_from_vocab_top_breaks_ties_by_id_and_says_the_support_is_whole_at_k():
    d = F.draw_from_vocab(TIED, 5, F.Setting(), k=3, position=2, prompt_id="p")
    assert list(d.top) == [0, 2, 4] and d.token == 5 and d.logprob == pytest.approx(math.log(0.02))
    assert not d.full_vocab
    raw = np.log(np.array([0.5, 0.3, 0.15, 0.05]))
    whole = F.draw_from_vocab(raw, 1, F.Setting(top_k=2), k=2, position=0, prompt_id="p")
    assert whole.full_vocab and set(whole.top) == {0, 1}


def test_draw_from_top_takes_the_k_most_likely_and_applies_min_p():
    top = {1: math.log(0.1), 2: math.log(0.3), 3: math.log(0.4)}
    d = F.draw_from_top(top, 2, F.Setting(top_k=2), position=3, prompt_id="q")
    assert d.top == pytest.approx({3: math.log(4 / 7), 2: math.log(3 / 7)})
    assert (d.token, d.position, d.prompt_id, d.full_vocab) == (2, 3, "q", True)
    # min_p 0.3 of the best (0.5): 0.1 and 0.05 are cut inside the top 4
    wide = {7: math.log(0.5), 8: math.log(0.3), 9: math.log(0.1), 10: math.log(0.05)}
    cut = F.draw_from_top(wide, 9, F.Setting(top_k=4, min_p=0.3), position=0, prompt_id="q")
    assert cut.top == pytest.approx({7: math.log(0.5 / 0.8), 8: math.log(0.3 / 0.8)}) and cut.logprob == -math.inf


# --- activity, verdicts, gate ------------------------------------------------------------------------
def test_activity_keeps_the_counters_it_was_read_from():
    idle = AcceptanceSummary(known=True, drafts=0, draft_tokens=0, accepted_tokens=0)
    assert F.activity_of(idle) == Activity(state="inactive", acceptance=idle)
    blind = AcceptanceSummary(known=False, reason="no spec_decode counters")
    activity = F.activity_of(blind)
    assert activity == Activity(state="unknown", acceptance=blind)
    assert activity.text == "unknown (no spec_decode counters)"


ACTIVE, INACTIVE = Activity(state="active"), Activity(state="inactive")


def test_verdict_texts():
    ok = CellCheck(name="identity", ok=True, detail="identical (8 tokens)")
    assert F.cell_verdict([ok], INACTIVE) == (
        "inactive", "the spec-on server proposed no draft during this cell (speculation was off for this feature, or "
                    "the answer too short to draft), so the result says nothing about speculation")
    # a near-tie found by another check than identity
    assert F.cell_verdict([CellCheck(name="logprobs", ok=True, detail="")], ACTIVE, near_tie=True) == (
        "near-tie", "numerical near-tie")
    two = [ok, CellCheck(name="invariant (spec-on)", ok=True, detail="kept")]
    assert F.cell_verdict(two, ACTIVE) == ("pass", "identical (8 tokens); kept")
    assert F.cell_verdict([CellCheck(name="seed", ok=True)], ACTIVE) == ("pass", "all checks passed")


def test_gate_with_require_active_keeps_the_failures_too():
    gate = F.feature_gate([("a", "pass"), ("b", "fail"), ("c", "inactive")], require_active=True)
    assert not gate.passed and gate.reasons == ["b: fail", "c: speculation inactive"]

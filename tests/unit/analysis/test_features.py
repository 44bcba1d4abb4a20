"""The request-feature matrix's pure parts (analysis/features.py): the catalogue, invariants, identity
and logprob comparison, derived parameters, the exact distribution of a sampling setting, verdicts
and the gate. Expected values are worked out by hand or by a brute-force computation written here."""
from __future__ import annotations
import asyncio
import math
import numpy as np
import pytest
from specadapt.analysis import features as F
from specadapt.errors import UsageError
from specadapt.records.features import Activity, CellCheck
from specadapt.records.metrics import AcceptanceSummary
import warnings


# --- the catalogue ------------------------------------------------------------------------------
def test_parse_features_all_groups_names_and_order():
    assert F.parse_features("all") == [f.name for f in F.FEATURES]
    assert F.parse_features("top-k-20, stop-string") == ["stop-string", "top-k-20"]  # the matrix's order
    assert F.parse_features("structured") == ["json-schema", "regex", "choice"]
    assert set(F.parse_features("distribution")) == {"temperature-0.7", "temperature-1.3", "top-p-0.9", "top-k-20",
                                                     "min-p-0.05", "combined"}
    assert F.parse_features("seed,seed") == ["seed"]
    det = F.parse_features("deterministic")
    assert "stop-string" in det and "seed" not in det and "top-k-20" not in det


@pytest.mark.parametrize("text", ["bogus", "stop-string,nope", "ALL"])
def test_unknown_feature_is_one_clear_line(text):
    with pytest.raises(UsageError, match="unknown feature"):
        F.parse_features(text)


def test_no_feature_named():
    with pytest.raises(UsageError, match="names no feature"):
        F.parse_features(" , ")


def test_every_kind_is_known_and_names_unique():
    assert {f.kind for f in F.FEATURES} == {"deterministic", "distribution", "seed"}
    assert len(F.BY_NAME) == len(F.FEATURES)
    # a distribution cell the server's top 20 can score exactly exists (top_k <= K)
    assert any(F.exactness_problem(F.Setting.of(f.sampling), 20, "server") is None for f in F.FEATURES
               if f.kind == "distribution")


# --- invariants ---------------------------------------------------------------------------------
def A(text="", **kw):  # noqa: N802
    return F.Answer(text=text, **kw)


def test_stop_string_absent_or_kept_at_the_end():
    assert F.invariant_problems(A("abc def"), {"stop": ["xyz"]}) == []
    assert F.invariant_problems(A("abc STOP def"), {"stop": "STOP"}) == ["the stop string 'STOP' is in the output "
                                                                         "at character 4"]
    kept = {"stop": ["STOP"], "include_stop_str_in_output": True}
    assert F.invariant_problems(A("abc STOP", finish_reason="stop", stop_reason="STOP"), kept) == []
    assert F.invariant_problems(A("abc STOP d", finish_reason="stop", stop_reason="STOP"), kept) == [
        "the stop string 'STOP' is in the output at character 4",
        "include_stop_str_in_output: the output does not end with the stop string 'STOP'"]
    # kept but the answer ended for another reason: no end-of-text rule
    assert F.invariant_problems(A("abc", finish_reason="length", stop_reason=None), kept) == []
    # without include_stop_str_in_output a stop string at the very end is still a fault
    assert F.invariant_problems(A("abc STOP"), {"stop": ["STOP"]}) != []


def test_length_limits():
    assert F.invariant_problems(A(token_ids=(1, 2, 3)), {"max_tokens": 3}) == []
    assert F.invariant_problems(A(token_ids=(1, 2, 3, 4)), {"max_tokens": 3}) == ["4 tokens generated, max_tokens is 3"]
    # completion_tokens counts where the ids are missing
    assert F.invariant_problems(A(completion_tokens=5), {"max_tokens": 4}) == ["5 tokens generated, max_tokens is 4"]
    assert F.invariant_problems(A(token_ids=(1,) * 7), {"min_tokens": 8}) == ["7 tokens generated, min_tokens is 8"]
    assert F.invariant_problems(A(token_ids=(1,) * 8), {"min_tokens": 8}) == []


def test_ignore_eos_runs_to_the_limit():
    params = {"ignore_eos": True, "max_tokens": 4}
    assert F.invariant_problems(A(token_ids=(1, 2), finish_reason="stop"), params) == [
        "ignore_eos: the answer ended after 2 of 4 tokens (stop)"]
    assert F.invariant_problems(A(token_ids=(1, 2, 3, 4), finish_reason="length"), params) == []
    # cut by the model length: "length" before max_tokens is allowed
    assert F.invariant_problems(A(token_ids=(1, 2), finish_reason="length"), params) == []


def test_model_length_kept():
    answer = A(token_ids=(1, 2, 3), prompt_tokens=14)
    assert F.invariant_problems(answer, {}, max_model_len=17) == []
    assert F.invariant_problems(answer, {}, max_model_len=16) == ["prompt 14 + 3 tokens exceed max_model_len 16"]


def test_stop_token_ids_end_the_answer():
    assert F.invariant_problems(A(token_ids=(5, 6, 9)), {"stop_token_ids": [9]}) == []
    assert F.invariant_problems(A(token_ids=(5, 9, 6)), {"stop_token_ids": [9]}) == [
        "stop token 9 at token 1, yet the answer went on"]


def test_logit_bias_ban():
    assert F.invariant_problems(A(token_ids=(5, 6)), {"logit_bias": {"7": -100}}) == []
    assert F.invariant_problems(A(token_ids=(5, 7)), {"logit_bias": {"7": -100}}) == [
        "token(s) [7] appear although logit_bias is -100"]
    assert F.invariant_problems(A(token_ids=(5, 7)), {"logit_bias": {"7": -99}}) == []  # not a ban


def test_structured_output_rules():
    rf = {"response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": F.PERSON_SCHEMA}}}
    assert F.invariant_problems(A('{"name": "Ada", "age": 36, "city": "London"}'), rf) == []
    assert "not JSON" in F.invariant_problems(A('{"name": "Ada",'), rf)[0]
    assert "breaks its schema" in F.invariant_problems(A('{"name": "Ada", "age": "x", "city": "L"}'), rf)[0]
    regex = {"structured_outputs": {"regex": F.PHONE_REGEX}}
    assert F.invariant_problems(A("555-1234"), regex) == []
    assert F.invariant_problems(A("555-12345"), regex) != []  # a full match, not a search
    choice = {"structured_outputs": {"choice": ["yes", "no"]}}
    assert F.invariant_problems(A("no"), choice) == []
    assert F.invariant_problems(A("No."), choice) == ["the output 'No.' is not one of ['yes', 'no']"]


def test_logprob_rules():
    params = {"logprobs": 2}
    good = A(token_ids=(1, 2), logprobs=(-0.1, -2.0), top_logprobs=((("a", -0.1), ("b", -3.0)),
                                                                      (("c", -1.0), ("d", -2.0))))
    assert F.invariant_problems(good, params) == []
    assert F.invariant_problems(A(token_ids=(1, 2), logprobs=(-0.1,)), params) == ["1 logprobs for 2 tokens"]
    assert F.invariant_problems(A(token_ids=(1,), logprobs=(0.5,)), params) == ["logprob above 0 at token 0"]
    unsorted = A(token_ids=(1,), logprobs=(-1.0,), top_logprobs=((("a", -2.0), ("b", -1.0)),))
    assert F.invariant_problems(unsorted, params) == ["top logprobs not in descending order at token 0"]
    # without logprobs asked, no logprob rule
    assert F.invariant_problems(A(token_ids=(1,), logprobs=(0.5,)), {}) == []


# --- identity and logprobs ----------------------------------------------------------------------
def where(off, on):
    d = F.divergence(off, on)
    return None if d is None else (d.char_index, d.token_index if d.token_index >= 0 else None)


def test_divergence_is_identity_first_divergence():
    assert F.divergence(A("abc", token_ids=(1, 2)), A("abc", token_ids=(1, 2))) is None
    assert where(A("abc"), A("abd")) == (2, None)
    assert where(A("abc", token_ids=(1, 2)), A("abcd", token_ids=(1, 2, 3))) == (3, 2)
    assert where(A("ab", token_ids=(1, 2)), A("ab", token_ids=(1, 3))) == (2, 1)
    # same text, token ids missing on one side: identical
    assert F.divergence(A("ab", token_ids=(1, 2)), A("ab")) is None
    d = F.divergence(A("ab", token_ids=(1, 2)), A("ab", token_ids=(1, 3)))
    assert (d.off_token, d.on_token) == ("token_id:2", "token_id:3")


def test_difference_text_names_both_sides():
    off, on = A("hello world", token_ids=(1, 2)), A("hello there", token_ids=(1, 3))
    text = F.difference_text(off, on, F.divergence(off, on))
    assert text == "spec on differs from spec off at token 1, character 6: off 'world' vs on 'there'"
    off, on = A("hello world"), A("hello there")
    assert F.difference_text(off, on, F.divergence(off, on)) == (
        "spec on differs from spec off at character 6: off 'world' vs on 'there'")


def test_identity_check_triages_with_identity_triage_at():
    off, on = A("ab", token_ids=(5, 1)), A("ac", token_ids=(5, 2))
    div = F.divergence(off, on)
    top = (("token_id:1", -0.5), ("token_id:2", -0.6))
    check, near = F.identity_check(off, on, div, top, 0.2)
    assert near and check.ok and check.detail.endswith("a numerical near-tie (margin 0.1 < 0.2 nats)")
    check, near = F.identity_check(off, on, div, top, 0.05)
    assert not near and not check.ok and check.detail.endswith("suspect (margin 0.1 nats, threshold 0.05)")
    # the spec-on token outside the top: a margin the top cannot show, never a near-tie
    check, near = F.identity_check(off, on, div, (("token_id:1", -0.5), ("token_id:3", -0.55)), 0.2)
    assert not near and "the spec-on token is not in the top 5" in check.detail
    check, near = F.identity_check(off, on, div, (("token_id:1", -0.5), ("token_id:3", -3.0)), 0.2)
    assert not near and "the spec-on token is not in the top 5" in check.detail
    # the spec-off token outside the top, or no top at all
    assert F.identity_check(off, on, div, (("token_id:4", -0.5), ("token_id:2", -0.6)), 0.2)[1] is False
    assert F.identity_check(off, on, div, (), 0.2)[1] is False


def test_logprob_differences():
    off = A(logprobs=(-0.1, -1.0), top_logprobs=((("a", -0.1), ("b", -2.0)), (("c", -1.0), ("d", -1.005))))
    same = A(logprobs=(-0.1, -1.0), top_logprobs=((("a", -0.1), ("b", -2.0)), (("d", -1.004), ("c", -1.0))))
    assert F.logprob_differences(off, same, 0.01) == []  # a swap of two entries within the tolerance
    moved = A(logprobs=(-0.1, -1.5), top_logprobs=off.top_logprobs)
    assert F.logprob_differences(off, moved, 0.01) == ["token 1: logprob -1.5000 on vs -1.0000 off (|diff| 0.5 > 0.01)"]
    swapped = A(logprobs=(-0.1, -1.0), top_logprobs=((("b", -2.0), ("a", -0.1)), off.top_logprobs[1]))
    assert F.logprob_differences(off, swapped, 0.01) == [
        "token 0: top logprobs ranked differently at rank 1: 'b' on vs 'a' off"]
    value = A(logprobs=(-0.1, -1.0), top_logprobs=((("a", -0.1), ("b", -2.5)), off.top_logprobs[1]))
    assert F.logprob_differences(off, value, 0.01) == ["token 0: top logprob of 'b' -2.5000 on vs -2.0000 off"]
    assert F.logprob_differences(off, value, 0.6) == []


# --- derived parameters ------------------------------------------------------------------------
def test_mid_chunk_positions():
    assert F.mid_chunk_positions([[1], [2, 3, 4], [5, 6]]) == [1, 2, 4]
    assert F.mid_chunk_positions([[1], [2], [3]]) == []


def test_pick_stop_string_ends_where_the_token_ends():
    full = "a b c a b c d"
    # token 5 ends at "a b c a b c" (its text prefix): " c" occurs first at 3, so a longer suffix is needed
    picked = F.pick_stop_string({5: "a b c a b c"}, full)
    assert picked == ("a b c a b c", 5)
    assert F.pick_stop_string({5: "a b c a b c"}, full, max_chars=6) == (" a b c", 5)
    assert F.pick_stop_string({5: "a b c a b c"}, full, max_chars=5) is None  # each first occurs earlier
    assert F.pick_stop_string({1: "zz", 3: "abX"}, "abXab") == ("abX", 3)  # the first candidate is no prefix
    assert F.pick_stop_string({2: "ab"}, "abXab") == ("ab", 2)
    assert F.pick_stop_string({1: "zz"}, "abc") is None  # not a prefix of the text
    assert F.pick_stop_string({1: "a  "}, "a  b") == ("a  ", 1)


def test_pick_stop_id_and_most_frequent():
    assert F.pick_stop_id([5, 6, 5, 7, 8], [2, 3]) == (7, 3)  # 5 occurs earlier
    assert F.pick_stop_id([5, 5], [1]) is None
    assert F.pick_stop_id([5], [3]) is None
    assert F.most_frequent([3, 1, 3, 1, 2]) == 1  # a tie: the lowest id
    assert F.most_frequent([4, 4, 1]) == 4
    assert F.most_frequent([]) is None


# --- the exact distribution ---------------------------------------------------------------------
def brute(raw, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0):
    """The same rules, one token at a time, with plain Python floats."""
    p = [math.exp(x / temperature) for x in raw]
    p = [v / sum(p) for v in p]
    keep = [v >= min_p * max(p) for v in p]
    if top_k:
        kth = sorted([v for v in p], reverse=True)[top_k - 1]
        keep = [k and v >= kth for k, v in zip(keep, p)]
    q = [v if k else 0.0 for v, k in zip(p, keep)]
    q = [v / sum(q) for v in q]
    if top_p < 1:
        order = sorted(range(len(q)), key=lambda i: -q[i])
        mass, kept = 0.0, set()
        for i in order:
            if mass >= top_p:
                break
            kept.add(i)
            mass += q[i]
        q = [v if i in kept else 0.0 for i, v in enumerate(q)]
        q = [v / sum(q) for v in q]
    return [math.log(v) if v > 0 else -math.inf for v in q]


RAW = [2.0, 1.5, 0.3, -0.2, -1.0, -3.0]


@pytest.mark.parametrize("setting", [dict(), dict(temperature=0.7), dict(temperature=1.3), dict(top_k=2),
                                     dict(top_p=0.6), dict(top_p=0.9, temperature=0.5), dict(min_p=0.2),
                                     dict(temperature=0.8, top_k=4, top_p=0.8, min_p=0.05), dict(top_k=6)])
def test_processed_logprobs_match_brute_force(setting):
    got = F.processed_logprobs(np.array(RAW), F.Setting(**setting))
    want = brute(RAW, **setting)
    for g, w in zip(got, want):
        assert (g == w == -math.inf) or g == pytest.approx(w, abs=1e-12)


def test_processed_logprobs_rows_independent_and_raw_scale_free():
    rows = np.array([RAW, RAW[::-1]])
    got = F.processed_logprobs(rows, F.Setting(top_k=2))
    assert np.isfinite(got[0]).sum() == 2 and np.isfinite(got[1]).sum() == 2
    assert np.isfinite(got[0, :2]).all() and np.isfinite(got[1, -2:]).all()
    shifted = F.processed_logprobs(np.array(RAW) - 7.0, F.Setting(temperature=0.7))
    assert np.allclose(shifted, F.processed_logprobs(np.array(RAW), F.Setting(temperature=0.7)))


def test_top_p_keeps_the_token_that_reaches_the_mass():
    # p = 0.5, 0.3, 0.2: top_p 0.5 keeps one token, 0.51 two, 0.8 two, 0.81 three
    raw = np.log([0.5, 0.3, 0.2])
    for top_p, kept in ((0.5, 1), (0.51, 2), (0.8, 2), (0.81, 3)):
        assert np.isfinite(F.processed_logprobs(raw, F.Setting(top_p=top_p))).sum() == kept


def test_min_p_threshold_is_relative_to_the_tempered_best():
    raw = np.log([0.5, 0.25, 0.125, 0.125])
    # exactly at the threshold is kept (vLLM masks probabilities below it)
    assert np.isfinite(F.processed_logprobs(raw, F.Setting(min_p=0.5))).tolist() == [True, True, False, False]
    assert np.isfinite(F.processed_logprobs(raw, F.Setting(min_p=0.51))).tolist() == [True, False, False, False]
    raw = np.log([0.6, 0.3, 0.1])
    # at temperature 2 the ratios are square roots: 0.1/0.6 -> 0.408
    assert np.isfinite(F.processed_logprobs(raw, F.Setting(temperature=2.0, min_p=0.4))).all()


def test_setting_body_and_of():
    s = F.Setting.of({"temperature": 0.8, "top_k": 20, "top_p": 0.9, "min_p": 0.05})
    assert s == F.Setting(0.8, 20, 0.9, 0.05)
    assert s.body() == {"temperature": 0.8, "top_p": 0.9, "top_k": 20, "min_p": 0.05}
    assert F.Setting.of({"temperature": 0.7}).body() == {"temperature": 0.7, "top_p": 1.0}


def test_exactness():
    assert F.exactness_problem(F.Setting(top_k=20), 20, "server") is None
    assert F.exactness_problem(F.Setting(top_k=21), 20, "server") is not None
    assert F.exactness_problem(F.Setting(temperature=0.7), 20, "server") is not None
    assert "--reference" in F.exactness_problem(F.Setting(min_p=0.05), 20, "server")
    assert F.exactness_problem(F.Setting(temperature=0.7), 20, "reference") is None
    # the raw setting is what a server's prompt logprobs are (`equiv --sampling`): exact from its top K
    assert F.Setting().raw and F.Setting.of({"temperature": 1.0, "top_p": 1.0}).raw
    assert not any(F.Setting(**kw).raw for kw in ({"temperature": 0.7}, {"top_k": 20}, {"top_p": 0.9},
                                                  {"min_p": 0.05}))
    assert F.exactness_problem(F.Setting(), 20, "server") is None
    assert all(not F.Setting.of(f.sampling).raw for f in F.FEATURES if f.kind == "distribution")


def test_draw_from_vocab():
    raw = np.log(np.array([0.5, 0.3, 0.15, 0.05]))
    d = F.draw_from_vocab(raw, 1, F.Setting(top_k=2), k=3, position=4, prompt_id="p")
    assert d.full_vocab and set(d.top) == {0, 1}
    assert d.logprob == pytest.approx(math.log(0.3 / 0.8)) and d.position == 4 and d.prompt_id == "p"
    outside = F.draw_from_vocab(raw, 3, F.Setting(top_k=2), k=3, position=0, prompt_id="p")
    assert outside.logprob == -math.inf
    wide = F.draw_from_vocab(raw, 3, F.Setting(), k=2, position=0, prompt_id="p")
    assert not wide.full_vocab and list(wide.top) == [0, 1] and wide.logprob == pytest.approx(math.log(0.05))


def test_draw_from_top():
    top = {7: math.log(0.4), 8: math.log(0.3), 9: math.log(0.1)}
    d = F.draw_from_top(top, 8, F.Setting(top_k=2), position=1, prompt_id="p")
    assert d.full_vocab and d.top == pytest.approx({7: math.log(4 / 7), 8: math.log(3 / 7)})
    assert d.logprob == pytest.approx(math.log(3 / 7))
    assert F.draw_from_top(top, 9, F.Setting(top_k=2), 0, "p").logprob == -math.inf
    assert F.draw_from_top(top, 5, F.Setting(top_k=2), 0, "p").logprob == -math.inf
    tempered = F.draw_from_top(top, 7, F.Setting(temperature=0.5, top_k=2), 0, "p")
    assert tempered.logprob == pytest.approx(math.log(0.16 / 0.25))


# --- activity, lossy, verdicts, gate --------------------------------------------------------------
def acc(draft_tokens, known=True):
    return AcceptanceSummary(known=known, draft_tokens=draft_tokens, accepted_tokens=0, acceptance_rate=0.0)


def test_activity_of():
    assert F.activity_of(None).state == "unknown"
    assert F.activity_of(acc(None)).state == "unknown"
    assert F.activity_of(acc(5, known=False)).state == "unknown"
    assert F.activity_of(acc(0)).state == "inactive"
    assert F.activity_of(acc(1)).state == "active"


OK = CellCheck(name="identity", ok=True, detail="identical (8 tokens)")
BAD = CellCheck(name="invariant (spec-on)", ok=False, detail="4 tokens generated, max_tokens is 3")
ACTIVE = Activity(state="active")
INACTIVE = Activity(state="inactive")


def test_cell_verdict():
    assert F.cell_verdict([OK], ACTIVE) == ("pass", "identical (8 tokens)")
    assert F.cell_verdict([OK, BAD], ACTIVE) == ("fail", "invariant (spec-on): 4 tokens generated, max_tokens is 3")
    verdict, reason = F.cell_verdict([OK, BAD], ACTIVE, lossy="relaxed")
    assert verdict == "lossy" and reason.startswith("lossy by configuration (relaxed); invariant (spec-on)")
    assert F.cell_verdict([OK], INACTIVE)[0] == "inactive"
    assert F.cell_verdict([OK, BAD], INACTIVE)[0] == "fail"  # a fault shows even when speculation was off
    assert F.cell_verdict([OK], None)[0] == "pass"  # unknown activity does not block a pass
    assert F.cell_verdict([OK], ACTIVE, near_tie=True) == ("near-tie", "identical (8 tokens)")
    assert F.cell_verdict([], ACTIVE) == ("error", "nothing was checked")
    both = CellCheck(name="invariant (spec-off)", ok=False, detail="x")
    assert "speculation off too" in F.cell_verdict([BAD, both], ACTIVE)[1]


def test_feature_gate():
    assert F.feature_gate([("a", "pass"), ("b", "inactive"), ("c", "unsupported")]).passed
    gate = F.feature_gate([("a", "pass"), ("b", "fail"), ("c", "error")])
    assert not gate.passed and gate.reasons == ["b: fail", "c: error"]
    assert F.feature_gate([("a", "near-tie"), ("b", "lossy"), ("c", "not-exact")]).passed
    strict = F.feature_gate([("a", "pass"), ("b", "inactive")], require_active=True)
    assert not strict.passed and strict.reasons == ["b: speculation inactive"]
    nothing = F.feature_gate([("a", "inactive"), ("b", "unsupported")])
    assert not nothing.passed and nothing.reasons == ["no cell passed: nothing about speculation was shown"]


# --- the cells, each one definition -------------------------------------------------------------
class FakeAsk:
    """The servers as a derivation sees them: streamed chunks and texts of the spec-on answer."""

    def __init__(self, chunks, texts=None, baseline=None, unit=(7, 8, 9), max_model_len=64):
        self.chunks, self.texts, self.natural, self.unit = chunks, texts or {}, baseline, list(unit)
        self.max_tokens, self.max_model_len = 16, max_model_len
        self.asked: list = []

    async def stream_chunks(self, prompt, max_tokens):
        self.asked.append(("stream", prompt, max_tokens))
        return self.chunks

    async def detokenize(self, ids):
        return self.texts[tuple(ids)]

    async def baseline(self, prompt, max_tokens):
        self.asked.append(("baseline", prompt, max_tokens))
        return self.natural

    async def tokenize(self, text):
        assert text == F.LONG_TEXT
        return self.unit


def derive(name, ask):
    feature = F.BY_NAME[name]
    return asyncio.run(feature.derive(ask, F.Derived(prompt=feature.prompt, params=dict(feature.params))))


def test_every_planted_feature_fault_is_caught_by_a_cell():
    from specadapt.native_reference.faults import FEATURE_FAULTS

    assert {fault for f in F.FEATURES for fault in f.catches} == set(FEATURE_FAULTS)
    assert [f.name for f in F.FEATURES if "stop-in-chunk" in f.catches] == ["stop-string", "stop-string-kept"]


def test_cells_are_whole_definitions():
    assert [f.name for f in F.FEATURES if f.sends != 1] == ["prefix-cache"]
    assert all(f.derive is None for f in F.FEATURES if f.kind != "deterministic")
    assert all(f.invariant is F.invariant_problems for f in F.FEATURES)
    derived = {f.name for f in F.FEATURES if f.derive is not None}
    assert derived == {"stop-string", "stop-string-kept", "stop-token-ids", "max-tokens", "min-tokens", "logit-bias",
                       "model-length", "chunked-prefill"}


def test_stop_derivations_place_the_stop_inside_a_chunk():
    chunks = [[1], [2], [3, 4, 5], [6]]
    ids = (1, 2, 3, 4, 5, 6)
    texts = {ids: " a b c d e f", (1, 2, 3): " a b c", (1, 2, 3, 4): " a b c d"}
    cell = derive("stop-string", FakeAsk(chunks, texts))
    assert cell.params == {"stop": [" a b c"]} and cell.notes == [
        "stop string ' a b c' completes at token 2, inside a streamed chunk"]
    kept = derive("stop-string-kept", FakeAsk(chunks, texts))
    assert kept.params == {"include_stop_str_in_output": True, "stop": [" a b c"]}
    cell = derive("stop-token-ids", FakeAsk(chunks))
    assert cell.params == {"stop_token_ids": [3]}
    assert cell.notes == ["stop token 3 first comes at token 2, inside a streamed chunk"]
    cell = derive("max-tokens", FakeAsk(chunks))
    assert cell.params == {"max_tokens": 3}
    assert cell.notes == ["max_tokens 3 ends inside a streamed chunk of the spec-on answer"]
    ask = FakeAsk([[4, 4], [5]])
    assert derive("logit-bias", ask).params == {"logit_bias": {"4": -100}}
    assert ask.asked == [("stream", F.REPEAT, 16)]


@pytest.mark.parametrize("name", ["stop-string", "stop-token-ids", "max-tokens"])
def test_one_token_per_step_is_not_exercised(name):
    with pytest.raises(F.NotExercised, match="one token per step"):
        derive(name, FakeAsk([[1, 2], [3], [4]]))  # the only chunk of two ends before token 2


def test_stop_token_seen_earlier_is_not_exercised():
    with pytest.raises(F.NotExercised, match="occurs earlier"):
        derive("stop-token-ids", FakeAsk([[3], [4], [3, 4, 5]]))


def test_min_tokens_past_the_baseline_eos():
    ask = FakeAsk([], baseline=A("Paris", token_ids=(1, 2), finish_reason="stop"))
    cell = derive("min-tokens", ask)
    assert cell.params == {"min_tokens": 10, "max_tokens": 18}
    assert cell.notes == ["the spec-off answer ends by itself after 2 tokens (stop)"]
    assert ask.asked == [("baseline", F.SHORT_ANSWER, 16)]


def test_long_prompts_are_sized_to_max_model_len():
    cell = derive("model-length", FakeAsk([]))
    assert len(cell.prompt) == 56 and cell.prompt[:4] == [7, 8, 9, 7]
    assert cell.params == {"ignore_eos": True, "max_tokens": 8}
    assert cell.notes == ["prompt of 56 tokens, max_model_len 64"]
    cell = derive("chunked-prefill", FakeAsk([]))
    assert len(cell.prompt) == 48 and cell.params == {}
    with pytest.raises(F.CannotDerive, match="max_model_len"):
        derive("chunked-prefill", FakeAsk([], max_model_len=None))


# analysis/features.py at its edges: the bounds of each invariant and logprob rule, the problem and
# verdict texts as a reader sees them, the stop pickers' limits, the derivations' own messages, and
# the exact distribution of a setting on batches, at float64's range and with ties (the catalogue
# and the common cases: tests/unit/test_feature_matrix.py). Expected values are worked out by hand.


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

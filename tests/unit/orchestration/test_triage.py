"""Every token of a diverging spec-on answer judged on its own prefix (analysis/identity.py
``path_verdict``, orchestration/triage.py ``path_triage``), and divergences seen only under
concurrency (``identity_report``); the spec-off server is a scripted httpx stand-in (exact answers
known): its /tokenize and its prompt_logprobs in vLLM 0.32's shape."""

from __future__ import annotations

import httpx
import orjson
import pytest

from specadapt.adapters.base import TokenRequests
from specadapt.analysis.identity import first_divergence, identity_report, path_verdict
from specadapt.orchestration.triage import path_triage
from specadapt.records import Prompt, RequestRecord, Triage

P = Prompt(id="p", category="open", messages=[{"role": "user", "content": "the capital of France"}])
BASE = Triage(verdict="near-tie", source="server-logprobs", margin=0.2, threshold=0.75, note="first")


def ids(*n):
    return [f"token_id:{i}" for i in n]


def test_a_large_margin_anywhere_on_the_path_makes_the_divergence_suspect():
    t = path_verdict(BASE, [0.2, 0.0, 3.1, 0.4], 5, ids(*range(10)), 0.75)
    assert t.verdict == "suspect" and (t.path_checked, t.path_margin, t.path_position, t.path_token) == (
        4, 3.1, 7, "token_id:7")
    assert t.note == ("first; spec-on token 7 is not the target's choice on the spec-on answer's own prefix "
                      "(margin 3.100 >= 0.75)")
    assert t.margin == 0.2  # the first differing token's own margin stays as it was


def test_the_threshold_itself_is_suspect_and_just_below_keeps_the_verdict():
    assert path_verdict(BASE, [0.0, 0.75], 0, ids(1, 2), 0.75).verdict == "suspect"
    t = path_verdict(BASE, [0.0, 0.7499], 0, ids(1, 2), 0.75)
    assert t.verdict == "near-tie" and t.note == "first" and t.path_margin == 0.7499


def test_an_unknown_triage_becomes_a_near_tie_when_every_path_token_is_within_the_threshold():
    unknown = Triage(verdict="unknown", source="none", threshold=0.75, margin=0.9, margin_is_lower_bound=True,
                     note="no top 5")
    t = path_verdict(unknown, [0.3, 0.1], 4, ids(*range(6)), 0.75)
    assert (t.verdict, t.margin, t.margin_is_lower_bound, t.source) == ("near-tie", 0.3, False, "server-logprobs")
    assert t.note == ("no top 5; all 2 spec-on tokens from the divergence on are within 0.75 of the target's top "
                      "choice on their own prefix")


def test_a_suspect_triage_stays_suspect_and_no_margins_say_so():
    suspect = BASE.model_copy(update={"verdict": "suspect"})
    assert path_verdict(suspect, [0.0], 0, ids(1), 0.75).verdict == "suspect"
    t = path_verdict(BASE, [], 3, ids(1), 0.75)
    assert t.verdict == "near-tie" and t.path_checked == 0
    assert t.note == "first; rest of the spec-on answer not checked: no token scored"


# --- path_triage against a scripted spec-off server ----------------------------------------------

class Off:
    base_url, model_id, verify = "http://off", "m", True

    def headers(self):
        return {}


def scripted(monkeypatch, prompt_ids, rows, status=200, echo=None):
    """rows[j]: {token id: logprob} at output position j (the sent token among them), each entry ranked by its
    logprob, or (logprob, rank) to give the rank; ``echo``: the prompt ids the server says it saw."""
    sent = []

    def handler(req):
        path, body = req.url.path, orjson.loads(req.content)
        sent.append((path, body, req.extensions["timeout"]["read"]))
        if path == "/tokenize":
            return httpx.Response(200, json={"tokens": prompt_ids}, request=req)
        if status != 200:
            return httpx.Response(status, json={"error": {"message": "no"}}, request=req)
        n = len(prompt_ids)
        plps = [None] + [{str(t): {"logprob": -1.0, "rank": 1}} for t in body["prompt"][1:n]]
        for j, row in enumerate(rows):
            ranked = sorted(row.items(), key=lambda kv: -(kv[1][0] if isinstance(kv[1], tuple) else kv[1]))
            plps.append({str(t): {"logprob": lp[0], "rank": lp[1]} if isinstance(lp, tuple)
                         else {"logprob": lp, "rank": r + 1} for r, (t, lp) in enumerate(ranked)})
        choice = {"prompt_logprobs": plps, "prompt_token_ids": echo if echo is not None else body["prompt"]}
        return httpx.Response(200, json={"choices": [choice]}, request=req)

    monkeypatch.setattr(Off, "transport", httpx.MockTransport(handler), raising=False)  # the wire's seam
    return sent


def on_rec(tokens):
    return RequestRecord(prompt_id="p", category="open", api="chat", side="on", ok=True, tokens=tokens)


def test_the_spec_on_answer_is_scored_after_the_prompt_and_a_dropped_token_is_found(monkeypatch):
    # off: 11 12 13 14; on drops 12: 11 13 14 -> at position 1 the target wanted 12, gave 13 a margin of 0.5
    # (a near-tie on its own), and at position 2 (after "11 13") it wants 12 again: 14 is 4 nats down
    off = RequestRecord(prompt_id="p", category="open", api="chat", side="off", ok=True, tokens=ids(11, 12, 13, 14))
    on = on_rec(ids(11, 13, 14))
    div = first_divergence(off, on)
    sent = scripted(monkeypatch, [1, 2, 3], [{11: -0.1, 9: -3}, {12: -0.5, 13: -1.0}, {12: -0.2, 14: -4.2}])
    t = path_triage(Off(), P, on, div, BASE, 0.75, TokenRequests())
    assert sent[0] == ("/tokenize", {"model": "m", "messages": [{"role": "user", "content": "the capital of France"}],
                                     "add_generation_prompt": True}, 120.0)
    path, body, timeout_s = sent[1]
    assert path == "/v1/completions" and body["prompt"] == [1, 2, 3, 11, 13, 14] and body["max_tokens"] == 1
    assert body["model"] == "m" and timeout_s == 120.0
    assert body["prompt_logprobs"] == 5 and body["return_token_ids"] is True and body["temperature"] == 0.0
    assert t.verdict == "suspect" and t.path_position == 2 and t.path_margin == pytest.approx(4.0)
    assert t.path_checked == 2 and t.path_token == "token_id:14"


def test_a_healthy_near_tie_path_stays_a_near_tie(monkeypatch):
    off = RequestRecord(prompt_id="p", category="open", api="chat", side="off", ok=True, tokens=ids(11, 12, 13))
    on = on_rec(ids(11, 20, 21))
    scripted(monkeypatch, [1], [{11: -0.1}, {12: -0.6, 20: -0.7}, {21: -0.05, 3: -2}])
    t = path_triage(Off(), P, on, first_divergence(off, on), BASE, 0.75, TokenRequests())
    assert t.verdict == "near-tie" and t.path_margin == pytest.approx(0.1) and t.path_position == 1


@pytest.mark.parametrize(("requests", "tokens", "why"), [
    (TokenRequests(prompt_logprobs=None), ids(1, 2), "the spec-off server gives no prompt logprobs"),
    (TokenRequests(), ["a", "b"], "the spec-on answer carries no token ids"),
    (TokenRequests(), [], "the spec-on answer carries no token ids"),
])
def test_what_cannot_be_scored_is_said_and_the_verdict_kept(monkeypatch, requests, tokens, why):
    sent = scripted(monkeypatch, [1], [])
    div = first_divergence(RequestRecord(prompt_id="p", category="o", api="chat", side="off", ok=True,
                                         tokens=ids(1, 9)), RequestRecord(prompt_id="p", category="o", api="chat",
                                                                           side="on", ok=True, tokens=ids(1, 8)))
    t = path_triage(Off(), P, on_rec(tokens), div, BASE, 0.75, requests)
    assert t.verdict == "near-tie" and t.note == f"first; rest of the spec-on answer not checked: {why}"
    assert sent == []


def test_an_answer_that_ends_at_the_divergence_is_not_scored(monkeypatch):
    sent = scripted(monkeypatch, [1], [])
    off = RequestRecord(prompt_id="p", category="o", api="chat", side="off", ok=True, tokens=ids(1, 2, 3))
    on = on_rec(ids(1, 2))
    t = path_triage(Off(), P, on, first_divergence(off, on), None, 0.75, TokenRequests())
    assert t.verdict == "unknown" and t.note == "rest of the spec-on answer not checked: the spec-on answer ends at the divergence"
    assert sent == []


def test_a_server_that_refuses_the_scoring_leaves_the_verdict_and_says_why(monkeypatch):
    scripted(monkeypatch, [1], [], status=400)
    off = RequestRecord(prompt_id="p", category="o", api="chat", side="off", ok=True, tokens=ids(1, 2))
    on = on_rec(ids(1, 3))
    t = path_triage(Off(), P, on, first_divergence(off, on), BASE, 0.75, TokenRequests())
    assert t.verdict == "near-tie"
    assert t.note == ("first; rest of the spec-on answer not checked: the spec-off server could not score it: "
                      "http://off/v1/completions refused the request (HTTP 400: no)")


# --- under concurrency ----------------------------------------------------------------------------

def pair(tokens_on, concurrency, repeat=0, replica=0):
    kw = dict(prompt_id="p", category="open", api="chat", ok=True, concurrency=concurrency, repeat=repeat,
              replica=replica)
    return [RequestRecord(side="off", tokens=["a", "b", "c"], text="abc", **kw),
            RequestRecord(side="on", tokens=tokens_on, text="".join(tokens_on), **kw)]


def verdict(*_):
    return Triage(verdict="suspect", source="server-logprobs", margin=3.0, threshold=0.75)


def test_a_prompt_identical_alone_and_diverging_in_batches_is_concurrency_only():
    recs = pair(["a", "b", "c"], 1) + pair(["a", "c"], 4) + pair(["a", "b", "c"], 4, replica=1)
    (ident,) = identity_report(recs, [P], verdict)
    assert ident.concurrency_only and ident.diverged_levels == [4] and ident.verdict == "suspect"
    assert (ident.pairs, ident.identical_pairs) == (3, 2)


def test_a_prompt_that_diverges_alone_too_is_not_concurrency_only():
    recs = pair(["a", "x", "c"], 1) + pair(["a", "c"], 4)
    (ident,) = identity_report(recs, [P], verdict)
    assert not ident.concurrency_only and ident.diverged_levels == [1, 4]


def test_without_a_pair_answered_alone_nothing_is_concurrency_only():
    (ident,) = identity_report(pair(["a", "c"], 4) + pair(["a", "c"], 2), [P], verdict)
    assert not ident.concurrency_only and ident.diverged_levels == [2, 4]
    (same,) = identity_report(pair(["a", "b", "c"], 1) + pair(["a", "b", "c"], 4), [P], verdict)
    assert not same.concurrency_only and same.diverged_levels == [] and same.verdict == "identical"


def test_a_divergence_at_the_first_token_is_scored_from_there_with_the_backends_keys(monkeypatch):
    sent = scripted(monkeypatch, [1], [{30: -2.0, 11: -0.1}, {12: -0.1}])
    off = RequestRecord(prompt_id="p", category="o", api="chat", side="off", ok=True, tokens=ids(11, 12))
    on = on_rec(ids(30, 12))
    t = path_triage(Off(), P, on, first_divergence(off, on), BASE, 0.75, TokenRequests(prompt_logprobs={"k": 1}),
                    timeout_s=7)
    assert (t.path_checked, t.path_position, t.verdict) == (2, 0, "suspect") and t.path_margin == pytest.approx(1.9)
    path, body, timeout_s = sent[1]
    assert body["k"] == 1 and "return_token_ids" not in body and timeout_s == 7


def test_a_spec_on_token_ranked_outside_the_top_is_measured_against_the_top(monkeypatch):
    """vLLM adds the token at the position with its own rank when it is outside the top K."""
    scripted(monkeypatch, [1], [{11: -0.1}, {20: (-9.0, 40), 12: (-0.2, 1)}])
    off = RequestRecord(prompt_id="p", category="o", api="chat", side="off", ok=True, tokens=ids(11, 12))
    on = on_rec(ids(11, 20))
    t = path_triage(Off(), P, on, first_divergence(off, on), BASE, 0.75, TokenRequests())
    assert t.path_margin == pytest.approx(8.8) and t.verdict == "suspect"
    scripted(monkeypatch, [1], [{11: -0.1}, {20: (-9.0, 40)}])  # no top at all: nothing above the token is known
    t = path_triage(Off(), P, on, first_divergence(off, on), BASE, 0.75, TokenRequests())
    assert t.path_margin == 0 and t.verdict == "near-tie"


def test_a_server_that_scored_other_ids_is_named_with_its_own_words(monkeypatch):
    scripted(monkeypatch, [1, 2], [{11: -0.1}, {13: -0.1}], echo=[1, 9, 11, 13])
    off = RequestRecord(prompt_id="p", category="o", api="chat", side="off", ok=True, tokens=ids(11, 12))
    on = on_rec(ids(11, 13))
    t = path_triage(Off(), P, on, first_divergence(off, on), BASE, 0.75, TokenRequests())
    assert t.verdict == "near-tie" and t.note == (
        "first; rest of the spec-on answer not checked: the source server's prompt differs from the ids sent (first "
        "at position 1 of 4): it must take the prompt as token ids")


# --- which spec-on answer, and which backend keys ---------------------------------------------------

def test_the_partner_of_a_spec_off_answer_is_the_spec_on_answer_of_the_same_pair():
    from specadapt.orchestration.compare import partner

    def r(side, **kw):
        base = dict(prompt_id="p", category="o", api="chat", side=side, ok=True, concurrency=4, repeat=1, replica=1)
        return RequestRecord(**{**base, **kw})

    off = r("off")
    right = r("on")
    others = [r("on", replica=0), r("on", repeat=0), r("on", concurrency=1), r("on", prompt_id="q"), r("on", turn=1),
              r("on", ok=False), r("on", warmup=True), r("off"), r("on", concurrency=0, request_rate=2.0)]
    assert partner([*others, right], off) is right
    assert partner(others, off) is None
    assert partner([], off) is None  # not even the spec-off answer's own pair is there


def test_the_token_keys_are_the_backends_and_none_for_a_backend_that_cannot_be_loaded():
    from specadapt.adapters.vllm import VLLMBackend
    from specadapt.orchestration.compare import token_requests_of

    assert token_requests_of(type("S", (), {"backend": "vllm"})()) == VLLMBackend.token_requests
    assert token_requests_of(type("S", (), {"backend": "no-such-backend"})()) == TokenRequests(
        sampled_ids=None, prompt_logprobs=None, output_ids=None)


def test_a_server_whose_scores_miss_the_sent_token_is_named_with_the_position(monkeypatch):
    scripted(monkeypatch, [1], [{11: -0.1}, {12: -0.1}])  # position 1 was sent 13: it is not among the entries
    off = RequestRecord(prompt_id="p", category="o", api="chat", side="off", ok=True, tokens=ids(11, 12))
    on = on_rec(ids(11, 13))
    t = path_triage(Off(), P, on, first_divergence(off, on), BASE, 0.75, TokenRequests())
    assert t.note == ("first; rest of the spec-on answer not checked: the source server's prompt logprobs at sampled "
                      "position 1 of prompt 'p' (sample 0) do not hold the sampled token 13: it scored other ids than "
                      "were sent")

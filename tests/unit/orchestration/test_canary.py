"""Canaries: verdicts from the golden's own logprobs (analysis/canary.py), and the round that asks a
server (orchestration/canary.py) against a scripted server on httpx.MockTransport."""

from __future__ import annotations

import json
import math

import httpx
import pytest

from specadapt.analysis import canary as ac
from specadapt.analysis.identity import canonical_dtype, default_threshold
from specadapt.errors import ServerError, UsageError
from specadapt.orchestration import canary as oc
from specadapt.records import (
    CanaryResult,
    GoldenAnswer,
    GoldenFile,
    Prompt,
    RequestRecord,
    RequestSettings,
    ServerInfo,
    read_golden,
    write_golden,
)
from builders import server

CHAT = Prompt(id="p", category="code", messages=[{"role": "user", "content": "copy: a b c"}])
COMP = Prompt(id="c", prompt="def add(x, y):")
T = 0.5  # nats


def golden(tokens, tops, *, text=None, prompt=CHAT, max_tokens=8, finish="length") -> GoldenAnswer:
    return GoldenAnswer(prompt_id=prompt.id, prompt=prompt, api=prompt.api, max_tokens=max_tokens,
                        text="".join(tokens) if text is None else text, tokens=tokens, top_logprobs=tops,
                        finish_reason=finish)


def live(tokens, *, text=None, finish="length", ok=True, error=None) -> RequestRecord:
    return RequestRecord(prompt_id="p", category="code", api="chat", ok=ok, error=error, tokens=tokens,
                         text="".join(tokens) if text is None else text, finish_reason=finish,
                         output_tokens=len(tokens))


# golden "a b c": at position 1 the golden chose "b" over "x" (0.3 nats behind), "y" (2 nats behind)
G = golden(["a", "b", "c"], [{"a": -0.01}, {"b": -0.6, "x": -0.9, "y": -2.6}, {"c": -0.05}])


# --- the verdict of one answer ---------------------------------------------------------------------
def test_identical():
    r = ac.judge(G, live(["a", "b", "c"]), T)
    assert (r.verdict, r.divergence, r.compared_tokens, r.error, r.note) == ("identical", None, 3, None, "")


def test_divergence_at_the_first_token():
    r = ac.judge(G, live(["z"]), T)
    assert r.verdict == "suspect" and r.divergence.token_index == 0


def test_a_golden_without_logprobs_at_the_position_is_unknown():
    g = golden(["a", "b"], [{"a": -0.01}])  # malformed: one top list short
    r = ac.judge(g, live(["a", "z"]), T)
    assert r.verdict == "unknown" and r.divergence.triage.source == "none"


def test_near_tie_by_the_goldens_logprobs():
    r = ac.judge(G, live(["a", "x", "c"]), T)
    d = r.divergence
    assert r.verdict == "near-tie"
    assert (d.token_index, d.off_token, d.on_token, d.kind) == (1, "b", "x", "token")
    t = d.triage
    assert t.source == "golden-logprobs" and not t.margin_is_lower_bound
    assert t.margin == pytest.approx(0.3) and t.threshold == T
    assert t.top_logprobs == {"b": -0.6, "x": -0.9, "y": -2.6}


def test_suspect_by_the_goldens_logprobs():
    r = ac.judge(G, live(["a", "y", "c"]), T)
    assert r.verdict == "suspect" and r.divergence.triage.margin == pytest.approx(2.0)
    # the margin just at the threshold is suspect, just below a near-tie
    assert ac.judge(G, live(["a", "y"]), 2.0).verdict == "suspect"
    assert ac.judge(G, live(["a", "y"]), 2.0 + 1e-9).verdict == "near-tie"


def test_the_threshold_decides_the_same_divergence():
    assert ac.judge(G, live(["a", "x", "c"]), 0.25).verdict == "suspect"
    assert ac.judge(G, live(["a", "x", "c"]), 0.35).verdict == "near-tie"


def test_live_token_outside_the_top_5_of_a_confident_golden_is_suspect():
    """Unlisted: at most the smallest listed probability and at most what the list leaves over."""
    g = golden(["a", "b"], [{"a": -0.01}, {"b": -0.05, "x": -4.0, "y": -5.0}])
    r = ac.judge(g, live(["a", "z"]), T)
    t = r.divergence.triage
    assert r.verdict == "suspect" and t.margin_is_lower_bound
    left = 1 - math.exp(-0.05) - math.exp(-4.0) - math.exp(-5.0)
    assert t.margin == pytest.approx(-0.05 - math.log(min(left, math.exp(-5.0))))
    assert t.note == f"the live token is not in the golden's top 3; from the golden's logprobs the margin is at least " \
                     f"{t.margin:.3f}"
    assert t.server_margin == t.margin
    # a threshold equal to the bound is suspect
    assert ac.judge(g, live(["a", "z"]), t.margin).verdict == "suspect"


def test_live_token_outside_the_top_5_of_a_flat_golden_is_unknown():
    """Five tokens within 0.4 nats leave up to 21% of the mass: the gap cannot be told, no page."""
    flat = {"b": -1.6, "c": -1.7, "d": -1.8, "e": -1.9, "f": -2.0}
    g = golden(["a", "b"], [{"a": -0.01}, flat])
    r = ac.judge(g, live(["a", "z"]), T)
    t = r.divergence.triage
    assert r.verdict == "unknown" and t.margin_is_lower_bound
    assert t.margin == pytest.approx(0.4)  # the smallest listed one is the tighter ceiling here
    assert t.margin < T
    # a larger threshold never makes it suspect; a smaller one does
    assert ac.judge(g, live(["a", "z"]), 0.39).verdict == "suspect"


def test_top_logprobs_summing_past_one_leave_a_floor_of_mass():
    g = golden(["a", "b"], [{"a": -0.01}, {"b": 0.0, "x": -1.0}])  # noise: more than all the mass
    r = ac.judge(g, live(["a", "z"]), T)
    assert r.verdict == "suspect"
    assert r.divergence.triage.margin == pytest.approx(-math.log(ac.MASS_FLOOR))
    # the bound, not the top list's own smallest gap (1 nat), is the margin reports show as the server's
    assert r.divergence.triage.server_margin == r.divergence.triage.margin


def test_live_answer_ended_where_a_confident_golden_went_on_is_suspect():
    """End of sequence where the golden gave 'c' with p 0.95: the end token had at most 0.05."""
    g = golden(["a", "b", "c"], [{"a": -0.01}, {"b": -0.01}, {"c": math.log(0.95), "d": math.log(0.01)}],
               finish="stop")
    r = ac.judge(g, live(["a", "b"], finish="stop"), T)
    d, t = r.divergence, r.divergence.triage
    assert (r.verdict, d.kind, d.token_index, d.off_token, d.on_token) == ("suspect", "length", 2, "c", None)
    assert t.margin == pytest.approx(math.log(0.95) - math.log(0.04)) and t.margin_is_lower_bound
    assert t.note.startswith("the live answer ended here; from the golden's logprobs the margin is at least ")


def test_live_answer_ended_where_the_golden_was_unsure_is_unknown():
    """The end token may be the listed 'd' (p 0.4): the margin may be as small as log(0.55/0.4)."""
    g = golden(["a", "b"], [{"a": -0.01}, {"b": math.log(0.55), "d": math.log(0.4)}], finish="stop")
    r = ac.judge(g, live(["a"], finish="stop"), T)
    t = r.divergence.triage
    assert r.verdict == "unknown" and t.margin == pytest.approx(math.log(0.55 / 0.4))


def test_golden_ended_where_the_live_answer_went_on_is_unknown():
    g = golden(["a", "b"], [{"a": -0.01}, {"b": -0.01}], finish="stop")
    r = ac.judge(g, live(["a", "b", "c"], finish="stop"), T)
    d = r.divergence
    assert (r.verdict, d.kind, d.token_index, d.off_token, d.on_token) == ("unknown", "length", 2, None, "c")
    assert d.triage.note == ("the golden answer ended here and the live one went on: the golden has no logprobs "
                             "past its end")


def test_a_live_answer_cut_by_its_length_limit_is_compared_on_its_length():
    r = ac.judge(G, live(["a", "b"], finish="length"), T)
    assert (r.verdict, r.compared_tokens) == ("identical", 2)
    assert r.note == "compared on the first 2 of the golden's 3 tokens: the live answer stopped at its length limit"
    # a different token inside the shorter length is still judged
    r = ac.judge(G, live(["a", "y"], finish="length"), T)
    assert (r.verdict, r.compared_tokens) == ("suspect", 2)
    # a shorter answer that ended by itself is not cut: it is a divergence
    assert ac.judge(G, live(["a", "b"], finish="stop"), T).verdict != "identical"


def test_a_cut_golden_keeps_its_text_when_it_is_no_prefix():
    r = ac.judge(G, live(["a", "b"], text="aX", finish="length"), T)
    assert r.verdict == "unknown" and r.divergence.char_index == 1
    assert r.divergence.triage.note == "the same tokens, a different text: a detokenization difference"
    assert "compared on the first 2" in r.note


def test_same_tokens_different_text_is_unknown():
    r = ac.judge(G, live(["a", "b", "c"], text="abd"), T)
    assert r.verdict == "unknown" and r.divergence.triage.source == "none"


def test_no_tokens_on_either_side_is_judged_on_text():
    g = golden([], [], text="abc")
    assert ac.judge(g, live([], text="abc"), T).verdict == "identical"
    r = ac.judge(g, live([], text="abd"), T)
    assert r.verdict == "unknown" and r.divergence.token_index == -1
    assert r.divergence.triage.note == "the answers carry no tokens (no logprobs), so no position to triage"


def test_tokens_named_differently_is_an_error():
    g = golden(["token_id:1", "token_id:2"], [{"token_id:1": -0.1}, {"token_id:2": -0.1}])
    r = ac.judge(g, live(["a", "b"]), T)
    assert r.verdict == "error" and r.compared_tokens == 2 and r.error == (
        "the golden answer and the server name tokens differently (ids on one side, text on the other): record the "
        "golden answers with the same backend")
    assert ac.judge(g, live(["token_id:1", "token_id:2"], text=g.text), T).verdict == "identical"


def test_failed_request_is_an_error():
    r = ac.judge(G, live([], ok=False, error="HTTP 500: boom"), T)
    assert (r.verdict, r.error, r.divergence) == ("error", "HTTP 500: boom", None)
    assert ac.judge(G, live([], ok=False), T).error == "the request failed"


# --- rounds, models, max_tokens ------------------------------------------------------------------
def test_worst_of_round():
    assert ac.worst([]) == "identical"
    assert ac.worst(["identical", "near-tie"]) == "near-tie"
    assert ac.worst(["near-tie", "unknown"]) == "unknown"
    assert ac.worst(["unknown", "error", "identical"]) == "error"
    assert ac.worst(["error", "suspect", "near-tie"]) == "suspect"
    assert ac.PAGED == ("suspect",)


def test_round_counts_every_verdict():
    results = [CanaryResult(prompt_id=str(i), verdict=v) for i, v in enumerate(["identical", "near-tie", "identical"])]
    r = ac.canary_round("http://s", 1.0, 2.0, results, ["n"])
    assert r.verdict == "near-tie" and not r.suspect
    assert r.counts == {"identical": 2, "near-tie": 1, "unknown": 0, "error": 0, "suspect": 0}
    assert (r.server, r.started_at, r.finished_at, r.notes) == ("http://s", 1.0, 2.0, ["n"])
    assert ac.canary_round("http://s", 1, 2, [CanaryResult(prompt_id="x", verdict="suspect")]).suspect


def info(**kw) -> ServerInfo:
    return server(**{"base_url": "http://s", **kw})


def golden_file(answers=(G,), **kw) -> GoldenFile:
    return GoldenFile(server=info(max_model_len=kw.pop("max_model_len", 2048)), dtype=kw.pop("dtype", "bfloat16"),
                      near_tie_threshold=kw.pop("threshold", T), settings=RequestSettings(), answers=list(answers))


def test_model_mismatch_is_refused_with_the_reason():
    gf = golden_file()
    assert ac.golden_mismatch(gf, info(max_model_len=2048, dtype="bf16")) == []
    assert ac.golden_mismatch(gf, info(model_id=None)) == []  # unknown: not a mismatch
    (reason,) = ac.golden_mismatch(gf, info(model_id="other"))
    assert reason == "the golden answers are of model m, the server serves other"
    (reason,) = ac.golden_mismatch(gf, info(max_model_len=4096))
    assert "max_model_len 2048" in reason and "4096" in reason
    (reason,) = ac.golden_mismatch(gf, info(dtype="torch.float16"))
    assert "recorded in bfloat16" in reason and "float16" in reason
    assert len(ac.golden_mismatch(gf, info(model_id="o", max_model_len=1, dtype="float32"))) == 3
    assert ac.golden_mismatch(golden_file(dtype=None), info(dtype="float32")) == []
    assert ac.golden_mismatch(golden_file(max_model_len=None), info(max_model_len=1)) == []


def test_canonical_dtype():
    assert canonical_dtype("torch.bfloat16") == canonical_dtype("BF16") == "bfloat16"
    assert canonical_dtype("half") == "float16" and canonical_dtype("int8") == "int8"
    assert default_threshold("torch.float16") == default_threshold("float16")


def test_spec_on_refusal():
    assert ac.spec_on_refusal(info(spec_enabled=False)) is None
    assert ac.spec_on_refusal(info(spec_enabled=None)) is None
    text = ac.spec_on_refusal(info(spec_enabled=True, spec_method="ngram", num_speculative_tokens=4))
    rest = ("golden answers must be the target's own output; record them from the spec-off server, "
            "or pass --allow-spec-on")
    assert text == f"http://s runs speculative decoding (ngram, k=4): {rest}"
    assert ac.spec_on_refusal(info(spec_enabled=True)) == f"http://s runs speculative decoding: {rest}"
    assert ac.spec_on_refusal(info(spec_enabled=True, num_speculative_tokens=3)) == (
        f"http://s runs speculative decoding (k=3): {rest}")


def test_canary_max_tokens():
    g = golden(["a"], [{"a": 0.0}], max_tokens=32)
    assert ac.canary_max_tokens(g, None) == (32, None)
    assert ac.canary_max_tokens(g, 32) == (32, None)
    assert ac.canary_max_tokens(g, 16) == (16, None)
    n, note = ac.canary_max_tokens(g, 64)
    assert n == 32 and note == "max_tokens 64 is more than the golden answers were recorded with (32): asked 32"


# --- the round against a scripted server -----------------------------------------------------------
class Scripted:
    """A vLLM-like server on httpx.MockTransport: GET /v1/models and POST completions; answers
    ``tokens`` (or an error status) and keeps every request."""

    def __init__(self, tokens=("token_id:1", "token_id:2"), status=200, spec_enabled=False):
        self.tokens, self.status, self.spec_enabled = list(tokens), status, spec_enabled
        self.requests: list[httpx.Request] = []
        self.base_url, self.model_id, self.verify = "http://scripted", "m", True
        self.identity_extras = {"return_tokens_as_token_ids": True}
        self.spec_extras = {}

    def headers(self):
        return {"Authorization": "Bearer k"}

    def describe(self):
        return info(base_url=self.base_url, spec_enabled=self.spec_enabled, dtype="float32", max_model_len=2048)

    def handle(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if isinstance(self.status, Exception):
            raise self.status
        if self.status != 200:
            return httpx.Response(self.status, text="engine dead")
        body = json.loads(request.content)
        toks = self.tokens[:body["max_tokens"]]
        entries = [{"token": t, "logprob": -0.1, "top_logprobs": [{"token": t, "logprob": -0.1},
                                                                 {"token": "token_id:9", "logprob": -3.0}]}
                   for t in toks]
        if request.url.path == "/v1/chat/completions":
            choice = {"message": {"role": "assistant", "content": "".join(toks)}, "logprobs": {"content": entries},
                      "finish_reason": "length"}
        else:
            choice = {"text": "".join(toks), "finish_reason": "length", "logprobs": {
                "tokens": toks, "token_logprobs": [-0.1] * len(toks),
                "top_logprobs": [{t: -0.1, "token_id:9": -3.0} for t in toks]}}
        return httpx.Response(200, json={"choices": [choice]})


@pytest.fixture
def scripted():
    """The scripted server behind the wire's transport seam (``handle`` looked up per request)."""
    server = Scripted()
    server.transport = httpx.MockTransport(lambda request: server.handle(request))
    return server


def test_record_golden_asks_greedy_labelled_requests_and_keeps_the_logprobs(scripted):
    gf = oc.record_golden(scripted, [CHAT, COMP], max_tokens=2, settings=RequestSettings(temperature=0.7))
    assert [a.prompt_id for a in gf.answers] == ["p", "c"] and gf.dtype == "float32"
    assert gf.near_tie_threshold == default_threshold("float32") and not gf.spec_on_allowed
    chat, comp = gf.answers
    assert chat.tokens == ["token_id:1", "token_id:2"] and chat.max_tokens == 2
    assert chat.top_logprobs[0] == {"token_id:1": -0.1, "token_id:9": -3.0}
    assert comp.api == "completions" and comp.top_logprobs[1] == {"token_id:2": -0.1, "token_id:9": -3.0}
    for req in scripted.requests:
        body = json.loads(req.content)
        assert req.headers["X-Specadapt-Canary"] == "1" and req.headers["Authorization"] == "Bearer k"
        assert req.extensions["timeout"] == dict.fromkeys(("connect", "read", "write", "pool"), 120.0)
        assert (body["user"], body["temperature"], body["stream"], body["max_tokens"]) == (
            "specadapt-canary", 0.0, False, 2)
        assert body["return_tokens_as_token_ids"] is True and "stream_options" not in body
    chat_body, comp_body = (json.loads(r.content) for r in scripted.requests)
    assert (chat_body["logprobs"], chat_body["top_logprobs"], comp_body["logprobs"]) == (True, 5, 5)


def test_record_golden_refusals(scripted):
    scripted.spec_enabled = True
    with pytest.raises(UsageError, match="runs speculative decoding"):
        oc.record_golden(scripted, [CHAT])
    assert scripted.requests == []  # refused before any request
    assert oc.record_golden(scripted, [CHAT], allow_spec_on=True).spec_on_allowed
    scripted.spec_enabled = False
    multi = Prompt(id="m", messages=[{"role": "user", "content": "hi"}], turns=["more"])
    with pytest.raises(UsageError, match="prompt m is a multi-turn conversation"):
        oc.record_golden(scripted, [multi])
    with pytest.raises(UsageError, match="no prompts"):
        oc.record_golden(scripted, [])
    scripted.tokens = []
    with pytest.raises(ServerError, match="gave no logprobs for prompt p"):
        oc.record_golden(scripted, [CHAT])
    scripted.status = 503
    with pytest.raises(ServerError, match="prompt p: HTTP 503: engine dead"):
        oc.record_golden(scripted, [CHAT])


def test_record_golden_dtype_and_threshold_given(scripted):
    scripted.describe = lambda: info(spec_enabled=False)  # says no dtype
    gf = oc.record_golden(scripted, [CHAT], dtype="float16")
    assert (gf.dtype, gf.near_tie_threshold) == ("float16", default_threshold("float16"))
    assert oc.record_golden(scripted, [CHAT], near_tie_threshold=0.3).near_tie_threshold == 0.3
    assert oc.record_golden(scripted, [CHAT, Prompt(id="q", prompt="x", max_tokens=1)]).answers[1].max_tokens == 1


def test_golden_file_round_trip(tmp_path, scripted):
    gf = oc.record_golden(scripted, [CHAT, COMP], max_tokens=2)
    path = tmp_path / "golden.json"
    write_golden(gf, path)
    assert read_golden(path) == gf and json.loads(path.read_text())["kind"] == "golden"
    assert [p.name for p in tmp_path.iterdir()] == ["golden.json"]  # no temp file left
    path.write_text(json.dumps({"kind": "compare"}))
    with pytest.raises(UsageError, match="is not a specadapt golden report"):
        read_golden(path)


def round_of(server, gf, **kw):
    sleeps: list[float] = []
    r = oc.run_canary_round(server, gf, now=iter([100.0, 107.0]).__next__, sleep=sleeps.append,
                            clock=lambda: 0.0, **kw)
    return r, sleeps


def test_round_is_identical_labelled_and_paced(scripted):
    gf = oc.record_golden(scripted, [CHAT, COMP, CHAT.model_copy(update={"id": "p2"})], max_tokens=2)
    scripted.requests.clear()
    r, sleeps = round_of(scripted, gf, min_gap_s=1.5)
    assert (r.verdict, r.started_at, r.finished_at, r.server) == ("identical", 100.0, 107.0, "http://scripted")
    assert [x.prompt_id for x in r.results] == ["p", "c", "p2"] and r.counts["identical"] == 3
    assert sleeps == [1.5, 1.5]  # between requests, not before the first
    for req in scripted.requests:
        assert req.headers["X-Specadapt-Canary"] == "1" and json.loads(req.content)["user"] == "specadapt-canary"


def test_round_never_sends_more_than_max_prompts_and_rotates(scripted):
    prompts = [Prompt(id=f"q{i}", prompt=f"x{i}") for i in range(5)]
    gf = oc.record_golden(scripted, prompts, max_tokens=2)
    assert [a.prompt_id for a in oc.canary_answers(gf)] == ["q0", "q1", "q2", "q3"]
    assert [a.prompt_id for a in oc.canary_answers(gf, 2, round_index=1)] == ["q2", "q3"]
    assert [a.prompt_id for a in oc.canary_answers(gf, 2, round_index=2)] == ["q4", "q0"]
    assert [a.prompt_id for a in oc.canary_answers(gf, 9)] == [f"q{i}" for i in range(5)]
    assert oc.canary_answers(gf.model_copy(update={"answers": []})) == []
    scripted.requests.clear()
    r, _ = round_of(scripted, gf, max_prompts=2, round_index=1)
    assert len(scripted.requests) == 2 and [x.prompt_id for x in r.results] == ["q2", "q3"]


def test_pacing_counts_the_time_a_request_took():
    sleeps: list[float] = []
    clock = iter([0.0, 10.0, 10.4, 11.0, 30.0]).__next__  # send 1 at 0, 2 at 10.4 (no wait), 3 0.6 s later
    server = Scripted()
    gf = golden_file([golden(["a"], [{"a": 0.0}], prompt=Prompt(id=f"q{i}", prompt="x")) for i in range(3)],
                     dtype=None, max_model_len=None)
    oc.run_canary_round(server, gf, min_gap_s=1.0, sleep=sleeps.append, clock=clock, info=info())
    assert sleeps == [pytest.approx(0.4)]  # the rest of the gap


def test_round_suspect_and_errors_never_raise(scripted):
    gf = oc.record_golden(scripted, [CHAT, COMP], max_tokens=2)
    scripted.tokens = ["token_id:1", "token_id:7"]  # not in the golden's top 2 at position 1: bound 3.0 - ...
    r, _ = round_of(scripted, gf)
    assert r.verdict == "suspect" and r.counts["suspect"] == 2
    assert r.results[0].divergence.triage.source == "golden-logprobs"
    scripted.status = 500
    r, _ = round_of(scripted, gf)
    assert r.verdict == "error" and all(x.error.startswith("HTTP 500") for x in r.results)
    scripted.status = httpx.ReadTimeout("slow")
    r, _ = round_of(scripted, gf)
    assert r.verdict == "error" and "did not answer in time" in r.results[0].error
    scripted.status = httpx.ConnectError("refused")
    r, _ = round_of(scripted, gf)
    assert "cannot connect to http://scripted" in r.results[0].error


def test_malformed_answer_is_an_error(scripted, monkeypatch):
    gf = oc.record_golden(scripted, [CHAT], max_tokens=2)
    scripted.handle = lambda request: httpx.Response(200, json={"choices": []})
    r, _ = round_of(scripted, gf)
    assert r.verdict == "error" and "not an OpenAI completion" in r.results[0].error


def test_round_against_another_model_is_error_before_any_request(scripted):
    gf = oc.record_golden(scripted, [CHAT], max_tokens=2)
    scripted.requests.clear()
    scripted.describe = lambda: info(model_id="other")
    r, _ = round_of(scripted, gf)
    assert r.verdict == "error" and scripted.requests == []
    assert r.results[0].error == "the golden answers are of model m, the server serves other"
    with pytest.raises(UsageError, match="cannot judge http://scripted: the golden answers are of model m"):
        oc.check_golden(scripted, gf)

    def broken():
        raise ServerError("gone")
    scripted.describe = broken
    r, _ = round_of(scripted, gf)
    assert r.verdict == "error" and "could not ask the server what it serves (gone)" in r.results[0].error
    # a caller that knows the server skips describe
    r, _ = round_of(scripted, gf, info=info())
    assert r.verdict == "identical"
    assert oc.check_golden(scripted, gf, info=info()).model_id == "m"


def test_round_max_tokens_other_than_the_goldens(scripted):
    gf = oc.record_golden(scripted, [CHAT], max_tokens=2)
    scripted.requests.clear()
    r, _ = round_of(scripted, gf, max_tokens=1)
    assert json.loads(scripted.requests[-1].content)["max_tokens"] == 1
    assert r.verdict == "identical" and r.results[0].compared_tokens == 1 and r.notes == []
    r, _ = round_of(scripted, gf, max_tokens=10)
    assert json.loads(scripted.requests[-1].content)["max_tokens"] == 2
    assert r.verdict == "identical" and r.notes == [
        "max_tokens 10 is more than the golden answers were recorded with (2): asked 2"]


def test_round_threshold_overrides_the_goldens(scripted):
    gf = oc.record_golden(scripted, [CHAT], max_tokens=2, near_tie_threshold=5.0)
    scripted.tokens = ["token_id:1", "token_id:9"]  # listed in the golden's top: margin 2.9
    assert round_of(scripted, gf)[0].verdict == "near-tie"
    assert round_of(scripted, gf, threshold=1.0)[0].verdict == "suspect"


def test_an_exception_inside_judging_is_an_error_result(scripted, monkeypatch):
    gf = oc.record_golden(scripted, [CHAT], max_tokens=2)

    def boom(*a, **kw):
        raise RuntimeError("bad golden")
    monkeypatch.setattr(oc, "judge", boom)
    r, _ = round_of(scripted, gf)
    assert r.verdict == "error" and r.results[0].error == "RuntimeError: bad golden"


def test_round_summary():
    ok = CanaryResult(prompt_id="a", verdict="identical")
    assert ac.round_summary(ac.canary_round("s", 0, 1, [ok, ok])) == "canary identical (2 identical)"
    assert ac.round_summary(ac.canary_round("s", 0, 1, [])) == "canary identical (no prompts)"
    err = CanaryResult(prompt_id="b", verdict="error", error="HTTP 500: x")
    assert ac.round_summary(ac.canary_round("s", 0, 1, [ok, err])) == (
        "canary error (1 identical, 1 error): b: HTTP 500: x")
    sus = ac.judge(G, live(["a", "y", "c"]), T)
    line = ac.round_summary(ac.canary_round("s", 0, 1, [err, sus, ok]))
    assert line == ("canary suspect (1 identical, 1 error, 1 suspect): p at token 1: 'y' where the golden has 'b', "
                    "margin 2.000 nats")
    unlisted = ac.judge(golden(["a", "b"], [{"a": -0.01}, {"b": -0.05}]), live(["a", "z"]), T)
    assert "margin >= " in ac.round_summary(ac.canary_round("s", 0, 1, [unlisted]))
    bare = CanaryResult(prompt_id="q", verdict="unknown")
    assert ac.round_summary(ac.canary_round("s", 0, 1, [bare])) == "canary unknown (1 unknown): q"
    # a round read back from a file may hold a divergence that was never triaged
    untriaged = sus.model_copy(update={"divergence": sus.divergence.model_copy(update={"triage": None})})
    assert ac.round_summary(ac.canary_round("s", 0, 1, [untriaged])) == (
        "canary suspect (1 suspect): p at token 1: 'y' where the golden has 'b'")
    none = ac.judge(golden([], [], text="abc"), live([], text="abd"), T)
    assert ac.round_summary(ac.canary_round("s", 0, 1, [none])) == (
        "canary unknown (1 unknown): p at token -1: None where the golden has None")

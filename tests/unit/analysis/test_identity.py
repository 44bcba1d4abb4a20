"""First divergence and triage, on records and a scripted spec-off server (the wire's httpx.MockTransport)."""
import httpx
import orjson
import pytest
from specadapt.analysis.identity import default_threshold, first_divergence, identity_report, token_id
from specadapt.orchestration import triage as triage_mod
from specadapt.orchestration.triage import readable_tokens, server_triage
from specadapt.records import Prompt, RequestRecord, RequestSettings
from specadapt.wire.http import Wire
from specadapt.analysis.identity import identity_report
from specadapt.records import ChatMessage, Prompt, RequestRecord
from builders import request


def answer_posts(monkeypatch, post):
    """Every Wire the triage makes answers through an httpx.MockTransport that calls
    ``post(url, json=, headers=, timeout=, verify=)``: the request's URL, JSON body, Authorization
    header, read timeout and the Wire's TLS setting."""
    class Scripted(Wire):
        def __init__(self, *args, **kw):
            def handler(req):
                auth = {"Authorization": req.headers["authorization"]} if "authorization" in req.headers else {}
                return post(str(req.url), json=orjson.loads(req.content), headers=auth,
                            timeout=req.extensions["timeout"]["read"], verify=self.verify)
            super().__init__(*args, **{**kw, "transport": httpx.MockTransport(handler)})
    monkeypatch.setattr(triage_mod, "Wire", Scripted)

P = Prompt(id="p", category="open", messages=[{"role": "user", "content": "reverse a string"}])


def rec(side, tokens, text=None, **kw):
    return request(category="open", side=side, tokens=tokens, text=text if text is not None else "".join(tokens),
                   output_tokens=len(tokens), **kw)


def test_identical_outputs_have_no_divergence():
    assert first_divergence(rec("off", ["a", "b"]), rec("on", ["a", "b"])) is None


def test_token_divergence_with_char_position_and_context():
    off = rec("off", ["def", " f", "(input", "_str", "):"])
    on = rec("on", ["def", " f", "(s", "):"])
    d = first_divergence(off, on)
    assert (d.kind, d.token_index, d.off_token, d.on_token) == ("token", 2, "(input", "(s")
    assert d.char_index == len("def f(")
    assert d.off_context == "def f(input_str):" and d.on_context == "def f(s):"


def test_same_text_different_tokens_is_still_a_divergence():
    d = first_divergence(rec("off", ["ab", "c"]), rec("on", ["a", "bc"]))
    assert d is not None and d.token_index == 0 and d.char_index == 3


def test_length_divergence():
    d = first_divergence(rec("off", ["a", "b", "c"]), rec("on", ["a", "b"]))
    assert d.kind == "length" and d.token_index == 2 and d.on_token is None


def test_thresholds_by_dtype():
    assert default_threshold("bfloat16") > default_threshold("float16") > default_threshold("float32")
    assert default_threshold("bf16") == default_threshold("bfloat16")
    assert default_threshold(None) == default_threshold("bfloat16")
    assert token_id("token_id:42") == 42 and token_id("hello") is None


class FakeOff:
    """A spec-off server whose top logprobs at each position are scripted."""

    base_url = "http://off.test"
    model_id = "m"
    verify = True

    def __init__(self, tokens, tops):
        self.tokens, self.tops, self.bodies = tokens, tops, []

    def headers(self):
        return {}


def scripted(monkeypatch, fake):
    def post(url, json=None, headers=None, timeout=None, verify=None):
        fake.bodies.append(json)
        n = json["max_tokens"]
        content = [{"token": t, "logprob": fake.tops[i][t],
                    "top_logprobs": [{"token": k, "logprob": v} for k, v in fake.tops[i].items()]}
                   for i, t in enumerate(fake.tokens[:n])]
        return httpx.Response(200, json={"choices": [{"logprobs": {"content": content}}]},
                              request=httpx.Request("POST", url))
    answer_posts(monkeypatch, post)


def test_near_tie_and_suspect_by_margin(monkeypatch):
    off = rec("off", ["def", "(input"])
    on = rec("on", ["def", "(s"])
    d = first_divergence(off, on)
    tie = FakeOff(["def", "(input"], [{"def": -0.01}, {"(input": -0.68, "(s": -0.81, "(x": -3.0}])
    scripted(monkeypatch, tie)
    t = server_triage(tie, P, RequestSettings(), d, off.tokens, threshold=0.5)
    assert t.verdict == "near-tie" and t.margin == pytest.approx(0.13) and not t.margin_is_lower_bound
    assert tie.bodies[0]["max_tokens"] == 2 and tie.bodies[0]["top_logprobs"] == 5 and not tie.bodies[0]["stream"]
    far = FakeOff(["def", "(input"], [{"def": -0.01}, {"(input": -0.05, "(s": -4.0}])
    scripted(monkeypatch, far)
    assert server_triage(far, P, RequestSettings(), d, off.tokens, threshold=0.5).verdict == "suspect"


def test_on_token_outside_top_k_gives_a_lower_bound(monkeypatch):
    off, on = rec("off", ["x", "a"]), rec("on", ["x", "zz"])
    d = first_divergence(off, on)
    fake = FakeOff(["x", "a"], [{"x": 0.0}, {"a": -0.1, "b": -2.0, "c": -2.5}])
    scripted(monkeypatch, fake)
    t = server_triage(fake, P, RequestSettings(), d, off.tokens, threshold=0.5)
    assert t.margin_is_lower_bound and t.margin == pytest.approx(2.4) and t.verdict == "suspect"


def test_identity_report_reports_an_origin_once_and_takes_the_worst_verdict():
    recs = []
    for repeat in range(3):
        recs.append(rec("off", ["a", "b", "c"], repeat=repeat))
        on_tokens = ["a", "X", "c"] if repeat < 2 else ["a", "b", "c"]
        recs.append(rec("on", on_tokens, repeat=repeat))
    calls = []

    def triage(prompt, div, off_rec):
        calls.append(div.token_index)
        from specadapt.records import Triage
        return Triage(verdict="near-tie", source="server-logprobs", margin=0.1, threshold=0.5)

    (ident,) = identity_report(recs, [P], triage)
    assert ident.pairs == 3 and ident.identical_pairs == 1
    assert ident.verdict == "near-tie" and ident.divergence.token_index == 1
    assert ident.same_origin_pairs == 1
    assert calls == [1]  # triaged once, at the origin


# --- thresholds and token ids ------------------------------------------------------------

def documented_thresholds() -> dict[str, float]:
    """The defaults as docs/compare.md states them ("bfloat16 0.75, float16 0.12, ...")."""
    import re
    from pathlib import Path

    text = " ".join((Path(__file__).parents[3] / "docs" / "compare.md").read_text().split())
    sentence = re.search(r"The threshold defaults by `--dtype`: (.*?) nats \(unknown dtype: ([0-9.]+)\)", text)
    assert sentence, "docs/compare.md no longer states the default thresholds"
    out = {name: float(v) for name, v in re.findall(r"(\w+) ([0-9.]+)", sentence.group(1))}
    out["unknown"] = float(sentence.group(2))
    return out


def test_default_thresholds_are_the_documented_ones():
    doc = documented_thresholds()
    assert set(doc) == {"bfloat16", "float16", "float32", "unknown"}
    for dtype in ("bfloat16", "float16", "float32"):
        assert default_threshold(dtype) == doc[dtype]
    assert default_threshold("int8") == default_threshold(None) == doc["unknown"]
    assert 0 < default_threshold("float64") < default_threshold("float32")


@pytest.mark.parametrize("alias, dtype", [
    ("bf16", "bfloat16"), ("fp16", "float16"), ("half", "float16"), ("fp32", "float32"), ("float", "float32"),
    ("fp64", "float64"), ("double", "float64"), ("BF16", "bfloat16"), ("Float16", "float16"),
    ("FLOAT64", "float64"),
])
def test_dtype_aliases_and_case(alias, dtype):
    assert default_threshold(alias) == default_threshold(dtype)
    assert len({default_threshold(d) for d in ("bfloat16", "float16", "float32", "float64")}) == 4  # all differ


@pytest.mark.parametrize("token", ["token_id:", "token_id:4x", "xtoken_id:4", "token_id:-4", "token_id: 4",
                                   "token_id:4\nfoo"])
def test_token_id_needs_the_whole_string(token):
    assert token_id(token) is None


def test_token_id_reads_the_number():
    assert token_id("token_id:0") == 0 and token_id("token_id:151643") == 151643


# --- first divergence ----------------------------------------------------------------------

def test_same_tokens_different_text_diverges_after_the_last_token():
    d = first_divergence(rec("off", ["a", "b"], text="ab"), rec("on", ["a", "b"], text="ab!"))
    assert (d.kind, d.token_index, d.off_token, d.on_token, d.char_index) == ("token", 2, None, None, 2)


def test_length_divergence_either_side_and_a_token_difference_in_unequal_lengths():
    d = first_divergence(rec("off", ["a"]), rec("on", ["a", "b", "c"]))
    assert (d.kind, d.token_index, d.off_token, d.on_token) == ("length", 1, None, "b")
    assert (d.off_tokens, d.on_tokens) == (1, 3)
    d = first_divergence(rec("off", ["a", "x", "c"]), rec("on", ["a", "b"]))
    assert (d.kind, d.token_index, d.off_token, d.on_token) == ("token", 1, "x", "b")
    d = first_divergence(rec("off", ["x"]), rec("on", ["a", "b"]))
    assert (d.kind, d.token_index, d.off_token, d.on_token) == ("token", 0, "x", "a")


def test_without_tokens_the_texts_decide_and_counts_come_from_usage():
    off = rec("off", [], text="hello world", concurrency=4, repeat=2, replica=1)
    off.output_tokens = 3
    on = rec("on", [], text="hello there")
    on.output_tokens = 5
    d = first_divergence(off, on)
    assert (d.kind, d.token_index, d.off_token, d.on_token, d.char_index) == ("token", -1, None, None, 6)
    assert (d.off_tokens, d.on_tokens) == (3, 5)
    assert (d.prompt_id, d.category, d.concurrency, d.repeat, d.replica) == ("p", "open", 4, 2, 1)
    assert first_divergence(rec("off", [], text="same"), rec("on", [], text="same")) is None
    # tokens on one side only: still the texts
    assert first_divergence(rec("off", ["same"]), rec("on", [], text="same")) is None
    assert first_divergence(rec("off", ["same"]), rec("on", [], text="sane")).token_index == -1


def test_context_is_forty_characters_either_side():
    before, after_off, after_on = "x" * 100, "A" + "o" * 100, "B" + "n" * 100
    d = first_divergence(rec("off", [before, after_off]), rec("on", [before, after_on]))
    assert d.char_index == 100
    assert d.off_context == "x" * 40 + after_off[:40]
    assert d.on_context == "x" * 40 + after_on[:40]
    d = first_divergence(rec("off", ["x" * 41, "a"]), rec("on", ["x" * 41, "b"]))
    assert d.off_context == "x" * 40 + "a" and d.on_context == "x" * 40 + "b"
    d = first_divergence(rec("off", ["x" * 39, "a"]), rec("on", ["x" * 39, "b"]))
    assert d.off_context == "x" * 39 + "a"


# --- the triage request and the server's answer ----------------------------------------------

C = Prompt(id="c", category="open", prompt="def reverse(s):")


def completions_scripted(monkeypatch, fake, token_logprobs=True):
    """The completions API's logprobs layout: tokens, token_logprobs, top_logprobs (dicts)."""
    def post(url, json=None, headers=None, timeout=None, verify=None):
        fake.bodies.append(json)
        n = json["max_tokens"]
        toks = fake.tokens[:n]
        lp = {"tokens": toks, "top_logprobs": [fake.tops[i] for i in range(len(toks))]}
        if token_logprobs:
            lp["token_logprobs"] = [fake.tops[i].get(t) for i, t in enumerate(toks)]
        return httpx.Response(200, json={"choices": [{"logprobs": lp}]}, request=httpx.Request("POST", url))
    answer_posts(monkeypatch, post)


def triage_at(monkeypatch, tops, off_tok="(input", on_tok="(s", threshold=0.5, tokens=None, api="chat"):
    """Triage of a divergence at token 1 (off "def" + off_tok, on "def" + on_tok)."""
    tokens = tokens or ["def", off_tok]
    fake = FakeOff(tokens, [{tokens[0]: -0.01}, tops])
    (scripted if api == "chat" else completions_scripted)(monkeypatch, fake)
    off, on = rec("off", ["def", off_tok]), rec("on", ["def", on_tok])
    d = first_divergence(off, on)
    return server_triage(fake, P if api == "chat" else C, RequestSettings(), d, off.tokens, threshold=threshold)


@pytest.mark.parametrize("api", ["chat", "completions"])
def test_a_margin_exactly_at_the_threshold_is_suspect_and_just_below_a_near_tie(monkeypatch, api):
    t = triage_at(monkeypatch, {"(input": -0.25, "(s": -0.75}, api=api)  # 0.5 exactly (binary fractions)
    assert (t.verdict, t.margin, t.server_margin, t.margin_is_lower_bound) == ("suspect", 0.5, 0.5, False)
    assert (t.source, t.threshold, t.note) == ("server-logprobs", 0.5, "")
    assert t.top_logprobs == {"(input": -0.25, "(s": -0.75}
    t = triage_at(monkeypatch, {"(input": -0.25, "(s": -0.625}, api=api)  # 0.375
    assert (t.verdict, t.margin) == ("near-tie", 0.375)


def test_a_negative_margin_is_judged_by_its_size(monkeypatch):
    """The spec-on token is the likelier one: the off server flipped; |margin| decides."""
    t = triage_at(monkeypatch, {"(input": -0.75, "(s": -0.25})
    assert (t.verdict, t.margin) == ("suspect", -0.5)
    t = triage_at(monkeypatch, {"(input": -0.625, "(s": -0.25})
    assert (t.verdict, t.margin) == ("near-tie", -0.375)


def test_a_lower_bound_below_the_threshold_is_unknown(monkeypatch):
    """On token outside the top 5, and the least of the top 5 is close: the true margin
    may be anything from there up, so neither near-tie nor suspect can be said."""
    t = triage_at(monkeypatch, {"(input": -0.25, "(x": -0.5, "(y": -0.625}, on_tok="(s")
    assert (t.verdict, t.margin, t.margin_is_lower_bound) == ("unknown", 0.375, True)
    assert t.source == "server-logprobs"
    assert t.note == "the spec-on token is not in the top 5, margin only known to be >= 0.375"


def test_a_lower_bound_at_the_threshold_is_suspect(monkeypatch):
    t = triage_at(monkeypatch, {"(input": -0.25, "(x": -0.5, "(y": -0.75}, on_tok="(s")
    assert (t.verdict, t.margin, t.margin_is_lower_bound, t.note) == ("suspect", 0.5, True, "")


def test_the_off_token_missing_from_the_answer_falls_back_to_the_servers_own_token(monkeypatch):
    """The off record's token is not in the top logprobs (the server answered differently
    this time): its own token at i is used and the changed prefix is noted."""
    t = triage_at(monkeypatch, {"(inp": -0.25, "(s": -1.0}, tokens=["dex", "(inp"])
    assert (t.verdict, t.margin) == ("suspect", 0.75)
    assert t.note == "the spec-off server's output changed between runs before this position"


def test_completions_without_token_logprobs_use_the_top_one_for_the_off_token(monkeypatch):
    fake = FakeOff(["def", "(input"], [{"def": -0.01}, {"(a": -0.25, "(s": -0.5, "(b": -2.0}])
    completions_scripted(monkeypatch, fake, token_logprobs=False)
    off, on = rec("off", ["def", "(input"]), rec("on", ["def", "(s"])
    d = first_divergence(off, on)
    t = server_triage(fake, C, RequestSettings(), d, off.tokens, threshold=0.5)
    assert (t.verdict, t.margin, t.margin_is_lower_bound) == ("near-tie", 0.25, False)


def test_completions_request_asks_for_top_logprobs_without_streaming(monkeypatch):
    fake = FakeOff(["def", "(input"], [{"def": -0.01}, {"(input": -0.25, "(s": -2.0}])
    completions_scripted(monkeypatch, fake)
    off, on = rec("off", ["def", "(input"]), rec("on", ["def", "(s"])
    d = first_divergence(off, on)
    settings = RequestSettings(logprobs=False, top_logprobs=0, max_tokens=500)
    assert server_triage(fake, C, settings, d, off.tokens, threshold=0.5).verdict == "suspect"
    (body,) = fake.bodies
    assert (body["logprobs"], body["max_tokens"], body["stream"], body["prompt"]) == (5, 2, False, C.prompt)
    assert "stream_options" not in body


def test_chat_request_asks_for_top_logprobs_without_streaming(monkeypatch):
    fake = FakeOff(["def", "(input"], [{"def": -0.01}, {"(input": -0.25, "(s": -2.0}])
    scripted(monkeypatch, fake)
    off, on = rec("off", ["def", "(input"]), rec("on", ["def", "(s"])
    d = first_divergence(off, on)
    server_triage(fake, P, RequestSettings(logprobs=False, top_logprobs=0), d, off.tokens, threshold=0.5)
    (body,) = fake.bodies
    assert (body["logprobs"], body["top_logprobs"], body["stream"]) == (True, 5, False)
    assert "stream_options" not in body and body["model"] == "m"


def test_chat_own_token_missing_from_its_top_list_is_added():
    from specadapt.analysis.identity import choice_logprobs

    choice = {"logprobs": {"content": [
        {"token": "a", "logprob": -0.1, "top_logprobs": [{"token": "a", "logprob": -0.1}]},
        {"token": "b", "logprob": -3.0, "top_logprobs": [{"token": "c", "logprob": -0.2}]},
    ]}}
    assert choice_logprobs(choice, "chat") == (["a", "b"], [{"a": -0.1}, {"c": -0.2, "b": -3.0}])
    assert choice_logprobs({"logprobs": None}, "chat") == ([], [])
    # a listed token keeps its listed value
    choice["logprobs"]["content"][1]["top_logprobs"].append({"token": "b", "logprob": -2.5})
    assert choice_logprobs(choice, "chat")[1][1] == {"c": -0.2, "b": -2.5}


def test_completions_choice_logprobs():
    from specadapt.analysis.identity import choice_logprobs

    choice = {"logprobs": {"tokens": ["a", "b"], "token_logprobs": [-0.1, -3.0],
                           "top_logprobs": [{"a": -0.1}, {"c": -0.2}]}}
    assert choice_logprobs(choice, "completions") == (["a", "b"], [{"a": -0.1}, {"c": -0.2, "b": -3.0}])
    choice["logprobs"]["top_logprobs"] = [{"a": -0.1}, None]
    assert choice_logprobs(choice, "completions")[1] == [{"a": -0.1}, {"b": -3.0}]
    # more top lists than tokens, or fewer own logprobs: each position as far as it is known
    choice = {"logprobs": {"tokens": ["a"], "token_logprobs": [], "top_logprobs": [{"a": -0.1}, {"c": -0.2}]}}
    assert choice_logprobs(choice, "completions") == (["a"], [{"a": -0.1}, {"c": -0.2}])
    choice = {"logprobs": {"tokens": ["a", "b"], "token_logprobs": [-0.5, -1.0]}}
    assert choice_logprobs(choice, "completions") == (["a", "b"], [{"a": -0.5}, {"b": -1.0}])


def test_no_token_position_is_unknown_without_asking(monkeypatch):
    fake = FakeOff([], [])
    scripted(monkeypatch, fake)
    d = first_divergence(rec("off", [], text="a"), rec("on", [], text="b"))
    t = server_triage(fake, P, RequestSettings(), d, [], threshold=0.5)
    assert (t.verdict, t.source, t.threshold, t.margin) == ("unknown", "none", 0.5, None)
    assert t.note == "the servers returned no tokens (no logprobs), so no position to triage"
    assert fake.bodies == []


@pytest.mark.parametrize("answer, name", [
    (httpx.ConnectError("refused"),
     "cannot connect to http://off.test: refused; is the server running and the URL right?"),
    (httpx.Response(200, content=b"not json"),
     "http://off.test answered /v1/chat/completions with something that is not JSON"),
    (httpx.Response(200, json={"error": "x"}),
     "the spec-off server answered without a choice (no 'choices[0]' object): not an OpenAI-compatible completion"),
    (httpx.Response(200, json={"choices": []}),
     "the spec-off server answered without a choice (no 'choices[0]' object): not an OpenAI-compatible completion"),
    (httpx.Response(400, json={"error": {"message": "top_logprobs too large"}}),
     "http://off.test/v1/chat/completions refused the request (HTTP 400: top_logprobs too large)"),
])
def test_a_server_that_cannot_answer_gives_unknown_with_the_reason(monkeypatch, answer, name):
    def post(url, **kw):
        if isinstance(answer, Exception):
            raise answer
        answer.request = httpx.Request("POST", url)
        return answer
    answer_posts(monkeypatch, post)
    off, on = rec("off", ["def", "(input"]), rec("on", ["def", "(s"])
    t = server_triage(FakeOff([], []), P, RequestSettings(), first_divergence(off, on), off.tokens, threshold=0.5)
    assert (t.verdict, t.source, t.threshold) == ("unknown", "none", 0.5)
    assert t.note == f"could not get logprobs from the spec-off server: {name}"


def test_no_logprobs_at_the_position_is_unknown(monkeypatch):
    def post(url, **kw):
        content = [{"token": "def", "logprob": -0.1, "top_logprobs": []}]
        return httpx.Response(200, json={"choices": [{"logprobs": {"content": content}}]},
                              request=httpx.Request("POST", url))
    answer_posts(monkeypatch, post)
    off, on = rec("off", ["def", "(input"]), rec("on", ["def", "(s"])
    t = server_triage(FakeOff([], []), P, RequestSettings(), first_divergence(off, on), off.tokens, threshold=0.5)
    assert (t.verdict, t.source, t.top_logprobs) == ("unknown", "none", {})
    assert t.note == "the spec-off server gave no logprobs at this position"


def test_an_output_that_ended_is_unknown(monkeypatch):
    """Length divergence: the on side stopped where the off side went on."""
    fake = FakeOff(["def", "(input"], [{"def": -0.01}, {"(input": -0.25, "(s": -2.0}])
    scripted(monkeypatch, fake)
    off, on = rec("off", ["def", "(input"]), rec("on", ["def"])
    t = server_triage(fake, P, RequestSettings(), first_divergence(off, on), off.tokens, threshold=0.5)
    assert (t.verdict, t.source, t.margin) == ("unknown", "server-logprobs", None)
    assert t.top_logprobs == {"(input": -0.25, "(s": -2.0}
    assert t.note == "one output ended here (end of sequence): its token's logprob is not known"


def test_notes_are_joined_when_the_prefix_changed_and_the_margin_is_a_bound(monkeypatch):
    t = triage_at(monkeypatch, {"(input": -0.25, "(y": -0.5}, tokens=["dex", "(input"])
    assert t.verdict == "unknown"
    assert t.note == ("the spec-off server's output changed between runs before this position; "
                      "the spec-on token is not in the top 5, margin only known to be >= 0.250")


# --- readable tokens -----------------------------------------------------------------------

def test_token_ids_are_made_readable_through_detokenize(monkeypatch):
    seen = []

    def post(url, json=None, headers=None, timeout=None, verify=None):
        seen.append((url, json, headers, timeout, verify))
        tid = json["tokens"][0]
        if tid == 7:
            return httpx.Response(404, json={"prompt": "nope"}, request=httpx.Request("POST", url))
        if tid == 8:
            raise httpx.ReadTimeout("slow")
        if tid == 9:
            return httpx.Response(200, json={"prompt": None}, request=httpx.Request("POST", url))
        return httpx.Response(200, json={"prompt": f"<{tid}>"}, request=httpx.Request("POST", url))
    answer_posts(monkeypatch, post)

    class Srv(FakeOff):
        verify = False

        def headers(self):
            return {"Authorization": "Bearer k"}

    srv = Srv([], [])
    d1 = first_divergence(rec("off", ["token_id:1", "token_id:5"]), rec("on", ["token_id:1", "token_id:6"]))
    d2 = first_divergence(rec("off", ["token_id:7", "x"]), rec("on", ["token_id:8"]))
    d3 = first_divergence(rec("off", ["token_id:9"]), rec("on", ["plain"]))
    readable_tokens(srv, [d1, d2, d3])
    assert (d1.off_token, d1.on_token) == ("<5> (id 5)", "<6> (id 6)")
    assert (d2.off_token, d2.on_token) == ("token_id:7", "token_id:8")
    assert (d3.off_token, d3.on_token) == ("token_id:9", "plain")
    assert seen[0] == ("http://off.test/detokenize", {"model": "m", "tokens": [5]}, {"Authorization": "Bearer k"},
                       10, False)
    assert len(seen) == 5  # "plain" is not asked about


def test_an_empty_detokenized_text_is_still_text(monkeypatch):
    answer_posts(monkeypatch, lambda url, **kw: httpx.Response(200, json={"prompt": ""},
                                                                         request=httpx.Request("POST", url)))
    d = first_divergence(rec("off", ["token_id:3"]), rec("on", ["token_id:4"]))
    readable_tokens(FakeOff([], []), [d])
    assert (d.off_token, d.on_token) == (" (id 3)", " (id 4)")


def test_the_triage_request_carries_the_servers_auth_tls_and_the_callers_timeout(monkeypatch):
    seen = {}

    def post(url, **kw):
        seen.update(kw, url=url)
        return httpx.Response(200, json={}, request=httpx.Request("POST", url))
    answer_posts(monkeypatch, post)

    class Srv(FakeOff):
        verify = "/ca.pem"

        def headers(self):
            return {"Authorization": "Bearer k"}

    off, on = rec("off", ["def", "(input"]), rec("on", ["def", "(s"])
    server_triage(Srv([], []), P, RequestSettings(), first_divergence(off, on), off.tokens, threshold=0.5,
                  timeout_s=12.5)
    body = seen.pop("json")
    assert (body["max_tokens"], body["stream"], body["top_logprobs"]) == (2, False, 5)
    assert seen == {"url": "http://off.test/v1/chat/completions", "headers": {"Authorization": "Bearer k"},
                    "timeout": 12.5, "verify": "/ca.pem"}


# --- identity per prompt -----------------------------------------------------------------------

def verdict_by_token(verdicts):
    """A triage that answers by the divergence's token index, recording its calls."""
    from specadapt.records import Triage

    calls = []

    def triage(prompt, div, off_rec):
        calls.append((prompt.id, div.token_index, div.concurrency, off_rec.concurrency))
        v = verdicts[div.token_index]
        return None if v is None else Triage(verdict=v, source="server-logprobs", threshold=0.5)
    return triage, calls


@pytest.mark.parametrize("order", [("near-tie", "suspect"), ("suspect", "near-tie"), ("near-tie", "unknown"),
                                   ("unknown", "suspect")])
def test_the_worst_verdict_over_a_prompts_origins_wins(order):
    """Two pairs diverge at different tokens (two origins): the prompt takes the worse
    verdict and that origin's divergence, whichever comes first."""
    recs = [rec("off", ["a", "b", "c"], repeat=0), rec("on", ["a", "X", "c"], repeat=0),
            rec("off", ["a", "b", "c"], repeat=1), rec("on", ["a", "b", "Y"], repeat=1),
            rec("off", ["a", "b", "c"], repeat=2), rec("on", ["a", "b", "Y"], repeat=2)]
    triage, calls = verdict_by_token({1: order[0], 2: order[1]})
    (ident,) = identity_report(recs, [P], triage)
    rank = ["near-tie", "unknown", "suspect"]
    worst = max(order, key=rank.index)
    where = 1 if worst == order[0] else 2
    assert (ident.verdict, ident.divergence.token_index) == (worst, where)
    assert ident.divergence.triage.verdict == worst
    assert ident.same_origin_pairs == (0 if where == 1 else 1)
    assert [c[1] for c in calls] == [1, 2]


def test_equal_verdicts_keep_the_earliest_origin():
    recs = [rec("off", ["a", "b", "c"], repeat=0), rec("on", ["a", "b", "Y"], repeat=0),
            rec("off", ["a", "b", "c"], repeat=1), rec("on", ["a", "X", "c"], repeat=1)]
    triage, _ = verdict_by_token({1: "suspect", 2: "suspect"})
    (ident,) = identity_report(recs, [P], triage)
    assert (ident.verdict, ident.divergence.token_index, ident.divergence.repeat) == ("suspect", 1, 1)


def test_no_triage_is_unknown_and_an_untriaged_origin_counts_as_unknown():
    recs = [rec("off", ["a", "b"]), rec("on", ["a", "X"])]
    (ident,) = identity_report(recs, [P], None)
    assert (ident.verdict, ident.divergence.triage) == ("unknown", None)
    triage, _ = verdict_by_token({1: None})
    (ident,) = identity_report(recs, [P], triage)
    assert ident.verdict == "unknown"
    recs += [rec("off", ["a", "b", "c"], repeat=1), rec("on", ["a", "b", "Z"], repeat=1)]
    triage, _ = verdict_by_token({1: None, 2: "near-tie"})
    (ident,) = identity_report(recs, [P], triage)
    assert (ident.verdict, ident.divergence.token_index) == ("unknown", 1)


def test_pairs_are_matched_by_concurrency_repeat_and_replica_and_the_origin_is_the_first_such_pair():
    recs = []
    for conc, repeat, replica in [(4, 0, 0), (1, 1, 0), (1, 0, 1), (1, 0, 0)]:
        recs.append(rec("off", ["a", "b"], concurrency=conc, repeat=repeat, replica=replica))
        recs.append(rec("on", ["a", "X"] if (conc, replica) != (1, 0) or repeat else ["a", "b"],
                        concurrency=conc, repeat=repeat, replica=replica))
    triage, calls = verdict_by_token({1: "near-tie"})
    (ident,) = identity_report(recs, [P], triage)
    assert (ident.pairs, ident.identical_pairs, ident.same_origin_pairs) == (4, 1, 2)
    d = ident.divergence
    assert (d.concurrency, d.repeat, d.replica) == (1, 0, 1)
    assert calls == [("p", 1, 1, 1)]  # the origin's own off record goes to the triage


def test_warmups_failures_and_one_sided_pairs_are_left_out():
    q = Prompt(id="q", category="grounded", prompt="x")
    r = Prompt(id="r", category="open", prompt="y")
    failed_off, failed_on = rec("off", ["a"], repeat=2), rec("on", ["Z"], repeat=3)
    failed_off.ok = failed_on.ok = False
    recs = [rec("off", ["a"]), rec("on", ["a"]),
            rec("off", ["a"], repeat=1), rec("on", ["Z"], repeat=1, warmup=True),
            failed_off, rec("on", ["Z"], repeat=2),
            rec("off", ["a"], repeat=3), failed_on]
    for side in ("off", "on"):
        recs.append(RequestRecord(prompt_id="q", category="grounded", api="completions", side=side, ok=True,
                                  tokens=["t"], text="t", output_tokens=1))
    recs.append(RequestRecord(prompt_id="r", category="open", api="completions", side="off", ok=True,
                              tokens=["t"], text="t", output_tokens=1))
    out = identity_report(recs, [q, r, P], None)
    assert [(i.prompt_id, i.category, i.pairs, i.identical_pairs, i.verdict) for i in out] == [
        ("q", "grounded", 1, 1, "identical"), ("p", "open", 1, 1, "identical")]
    assert out[0].divergence is None and out[0].same_origin_pairs == 0


def test_a_divergence_at_the_first_token_is_triaged(monkeypatch):
    fake = FakeOff(["(input"], [{"(input": -0.25, "(s": -0.75}])
    scripted(monkeypatch, fake)
    off, on = rec("off", ["(input", "x"]), rec("on", ["(s", "x"])
    d = first_divergence(off, on)
    assert d.token_index == 0
    t = server_triage(fake, P, RequestSettings(), d, off.tokens, threshold=0.5)
    assert (t.verdict, t.margin, t.note) == ("suspect", 0.5, "")
    assert fake.bodies[0]["max_tokens"] == 1


def test_the_recorded_off_token_is_judged_even_when_the_server_now_answers_another(monkeypatch):
    """The server's own token at i changed between runs; the recorded one is still in its top 5."""
    t = triage_at(monkeypatch, {"(x": -0.125, "(input": -0.25, "(s": -0.75}, tokens=["def", "(x"])
    assert (t.verdict, t.margin) == ("suspect", 0.5)


def test_the_servers_own_token_is_used_when_the_recorded_one_is_not_in_its_top_5(monkeypatch):
    t = triage_at(monkeypatch, {"(z": -0.25, "(inp": -0.5, "(s": -0.875}, tokens=["def", "(inp"])
    assert (t.verdict, t.margin) == ("near-tie", 0.375)  # logp("(inp") - logp("(s"), not the top entry's


def test_the_callers_timeout_reaches_the_request(monkeypatch):
    seen = []

    def post(url, json=None, headers=None, timeout=None, verify=None):
        seen.append(timeout)
        raise httpx.ReadTimeout("slow")
    answer_posts(monkeypatch, post)
    off, on = rec("off", ["def", "(input"]), rec("on", ["def", "(s"])
    d = first_divergence(off, on)
    server_triage(FakeOff([], []), P, RequestSettings(), d, off.tokens, threshold=0.5, timeout_s=7.5)
    server_triage(FakeOff([], []), P, RequestSettings(), d, off.tokens, threshold=0.5)
    assert seen[0] == 7.5 and isinstance(seen[1], float) and seen[1] > 0  # never unbounded


def test_a_completions_answer_with_fewer_tokens_than_logprobs(monkeypatch):
    """A malformed answer (more top_logprobs / token_logprobs entries than tokens) is read
    without an IndexError: no token of the server's own at i."""
    from specadapt.analysis.identity import choice_logprobs

    choice = {"logprobs": {"tokens": ["a"], "token_logprobs": [-0.1, -0.2], "top_logprobs": [{"a": -0.1}, {"c": -0.2}]}}
    assert choice_logprobs(choice, "completions") == (["a"], [{"a": -0.1}, {"c": -0.2}])

    def post(url, **kw):
        return httpx.Response(200, json={"choices": [choice]}, request=httpx.Request("POST", url))
    answer_posts(monkeypatch, post)
    off, on = rec("off", ["a"]), rec("on", ["a", "c"])  # the off side ended at 1
    t = server_triage(FakeOff([], []), C, RequestSettings(), first_divergence(off, on), off.tokens, threshold=0.5)
    assert (t.verdict, t.source, t.top_logprobs) == ("unknown", "server-logprobs", {"c": -0.2})


# identity_report on multi-turn conversations: each turn of a conversation is a pair of its own
# until the conversation first diverges; the turns after that have a different history. Checked
# where the turn numbers exceed the concurrency (closed loop at concurrency 1, and an arrival-rate
# run, whose records carry concurrency 0).
CHAT = Prompt(id="chat", category="talk", messages=[ChatMessage(role="user", content="hi")],
              turns=["more", "again", "last"])


def turn(side: str, n: int, tokens: list[str], **kw) -> RequestRecord:
    return RequestRecord(prompt_id="chat", category="talk", api="chat", side=side, ok=True, turn=n,
                         tokens=tokens, text="".join(tokens), output_tokens=len(tokens), **kw)


def conversation(outputs: list[tuple[list[str], list[str]]], **kw) -> list[RequestRecord]:
    """Off and on records of one conversation, one (off tokens, on tokens) per turn."""
    return [r for n, (off, on) in enumerate(outputs) for r in (turn("off", n, off, **kw), turn("on", n, on, **kw))]


def triage_calls():
    seen = []

    def triage(prompt, div, off):
        seen.append((div.turn, div.token_index, div.concurrency, off.turn))
        return None
    return triage, seen


SAME = [(["a", "b"], ["a", "b"]), (["c"], ["c"]), (["d", "e"], ["d", "e"])]


def test_an_identical_conversation_is_identical_at_every_turn():
    recs = conversation(SAME, concurrency=1) + conversation(SAME, concurrency=0, request_rate=2.0)
    triage, seen = triage_calls()
    (ident,) = identity_report(recs, [CHAT], triage)
    assert (ident.pairs, ident.identical_pairs, ident.different_history_pairs) == (6, 6, 0)
    assert (ident.verdict, ident.divergence, ident.same_origin_pairs) == ("identical", None, 0)
    assert seen == []


def test_a_conversation_that_first_diverges_at_a_late_turn_is_judged_there():
    # turns 0 and 1 identical, turn 2 diverges at its token 1, turn 3 follows another history
    outputs = SAME[:2] + [(["d", "e"], ["d", "X"]), (["f"], ["g"])]
    triage, seen = triage_calls()
    (ident,) = identity_report(conversation(outputs, concurrency=1), [CHAT], triage)
    assert (ident.pairs, ident.identical_pairs, ident.different_history_pairs) == (3, 2, 1)
    assert (ident.verdict, ident.divergence.turn, ident.divergence.token_index) == ("unknown", 2, 1)
    assert seen == [(2, 1, 1, 2)]


def test_at_an_arrival_rate_a_divergence_at_turn_1_is_the_origin():
    # concurrency 0 on every record of an arrival-rate run; the identical conversation at another
    # rate keeps all its turns
    outputs = SAME[:1] + [(["c"], ["Y"]), (["d", "e"], ["h"])]
    recs = conversation(outputs, concurrency=0, request_rate=1.0) + conversation(SAME, concurrency=0,
                                                                                 request_rate=4.0)
    triage, seen = triage_calls()
    (ident,) = identity_report(recs, [CHAT], triage)
    assert (ident.pairs, ident.identical_pairs, ident.different_history_pairs) == (5, 4, 1)
    assert (ident.verdict, ident.divergence.turn, ident.divergence.token_index) == ("unknown", 1, 0)
    assert seen == [(1, 0, 0, 1)]

"""First divergence and triage, on records and a scripted spec-off server (httpx mock)."""


import httpx
import pytest

from specadapt.probes.equivalence import (
    default_threshold,
    first_divergence,
    identity_report,
    server_triage,
    token_id,
)
from specadapt.records import Prompt, RequestRecord, RequestSettings

P = Prompt(id="p", category="open", messages=[{"role": "user", "content": "reverse a string"}])


def rec(side, tokens, text=None, **kw):
    return RequestRecord(prompt_id="p", category="open", api="chat", side=side, ok=True,
                         tokens=tokens, text=text if text is not None else "".join(tokens),
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
    monkeypatch.setattr(httpx, "post", post)


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

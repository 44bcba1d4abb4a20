"""The drawn answers in words: token ids read back through /detokenize (httpx.MockTransport)."""

from __future__ import annotations

import json

import httpx

from specadapt.adapters.base import ServerBase
from specadapt.analysis.sections import section_data
from specadapt.orchestration.readable import readable_answers
from specadapt.orchestration.triage import token_texts
from specadapt.report.passes_render import answer_text
from tests.unit.report.test_passes_render import lesson_compare_report

WORDS = {504: "The", 3575: " capital", 282: " of", 4649: " France", 314: " is", 7042: " Paris", 30: ".", 2: "<end>"}


class Detokenizer(ServerBase):
    """A server whose /detokenize knows ``words`` (and fails on any other id); it keeps its requests."""

    base_url, model_id, verify = "http://off", "m", True

    def __init__(self, words: dict[int, str] = WORDS):
        self.words = words
        self.asked: list[list[int]] = []
        self.transport = httpx.MockTransport(self.handle)

    def headers(self):
        return {}

    def handle(self, request: httpx.Request) -> httpx.Response:
        tokens = json.loads(request.content)["tokens"]
        self.asked.append(tokens)
        if request.url.path != "/detokenize" or any(t not in self.words for t in tokens):
            return httpx.Response(400, json={"error": {"message": "unknown token"}})
        return httpx.Response(200, json={"prompt": "".join(self.words[t] for t in tokens)})


def test_each_id_is_read_once_and_the_texts_follow_the_tokens():
    server = Detokenizer()
    ids = ["token_id:504", "token_id:3575", "token_id:282", "token_id:504"]
    assert token_texts(server, ids) == ["The", " capital", " of", "The"]
    assert server.asked == [[504], [3575], [282]]


def test_tokens_that_are_not_ids_or_that_the_server_cannot_read_give_none():
    server = Detokenizer()
    assert token_texts(server, ["The", "token_id:504"]) is None and server.asked == []
    assert token_texts(server, ["token_id:504", "token_id:999"]) is None
    assert token_texts(server, []) is None


def test_the_drawn_answers_get_their_texts_and_the_section_is_saved_back():
    report = lesson_compare_report(show=1)
    seen = report.sections["speculation"]
    (shown,) = seen["shown"]
    rec = report.requests[seen["requests"][shown]["index"]]
    words = list(rec.tokens)
    by_text = {w: 1000 + n for n, w in enumerate(dict.fromkeys(t for r in report.requests for t in r.tokens))}
    for r in report.requests:  # every answer's token strings become ids, as identity runs ask vLLM
        r.tokens = [f"token_id:{by_text[w]}" for w in r.tokens]
    server = Detokenizer({i: w for w, i in by_text.items()})
    assert readable_answers(server, report) == 1
    after = report.sections["speculation"]["requests"]
    assert after[shown]["texts"] == words
    assert all("texts" not in a for i, a in enumerate(after) if i != shown)  # only the drawn answer
    assert len(server.asked) == len(set(words))  # one request per distinct id
    a = section_data(report, "speculation").requests[shown]
    assert "token_id" not in answer_text(rec, a).plain and words[1] in answer_text(rec, a).plain

"""The cells of `equiv --features` as orchestration/features.py runs them, against two scripted
servers on the wire's transport seam (httpx.MockTransport): each cell's own definition (derivation,
sends, invariant) decides what is sent, the counter window says whether speculation ran, a
divergence is triaged with the spec-off server's top logprobs, and a 4xx makes a cell unsupported."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from specadapt.adapters.base import TokenRequests
from specadapt.analysis import features as F
from specadapt.analysis.sampling_check import PromptInput
from specadapt.errors import ServerUnreachable
from specadapt.orchestration.features import Endpoint, Matrix, run_cell
from specadapt.records import CounterSnapshot, Prompt
from specadapt.records.features import FeatureSettings
from specadapt.wire.http import Wire


def text_of(ids) -> str:
    return "".join(f" w{t}" for t in ids)


class Scripted:
    """A vLLM-like server: greedy answers ``ids`` (cut at max_tokens), streamed as ``chunks``; the
    spec-on one counts one draft of 4 tokens (3 accepted) per completion it answers."""

    def __init__(self, name, ids=(1, 2, 3, 4, 5, 6), chunks=None, spec=True, tops=None):
        self.name, self.ids, self.spec, self.tops = name, list(ids), spec, tops or {}
        self.chunks = chunks or [[t] for t in self.ids]
        self.base_url, self.model_id, self.verify = f"http://{name}", "m", True
        self.bodies: list[dict] = []
        self.refuse: int | None = None
        self.seeded = True  # a sampled answer follows its seed
        self.second: list[int] | None = None  # the ids of every answer after the first
        self.counters = CounterSnapshot(drafts=0, draft_tokens=0, accepted_tokens=0, source="test")
        self.transport = httpx.MockTransport(self.handle)

    def headers(self):
        return {}

    def start_run(self):
        pass

    def end_run(self):
        pass

    def read_counters(self):
        return self.counters

    def handle(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        self.bodies.append(body)
        if request.url.path == "/detokenize":
            return httpx.Response(200, json={"prompt": text_of(body["tokens"])})
        if request.url.path == "/tokenize":
            return httpx.Response(200, json={"tokens": [7, 8, 9], "count": 3})
        if self.refuse:
            return httpx.Response(self.refuse, json={"error": {"message": "not with speculation"}})
        if self.spec:
            c = self.counters
            self.counters = c.model_copy(update={"drafts": c.drafts + 1, "draft_tokens": c.draft_tokens + 4,
                                                 "accepted_tokens": c.accepted_tokens + 3})
        if body.get("stream"):
            events = "".join(f"data: {json.dumps({'choices': [{'token_ids': c}]})}\n\n" for c in self.chunks)
            return httpx.Response(200, text=events + "data: [DONE]\n\n", headers={"content-type": "text/event-stream"})
        answers = sum(1 for b in self.bodies if "prompt" in b and not b.get("stream"))
        ids = (self.second if self.second is not None and answers > 1 else self.ids)[:body["max_tokens"]]
        if "seed" in body and self.seeded:
            ids = [body["seed"]] * len(ids)
        choice = {"text": text_of(ids), "token_ids": ids, "finish_reason": "length"}
        if body.get("logprobs"):
            choice["logprobs"] = {"tokens": [f"token_id:{t}" for t in ids], "token_logprobs": [-0.1] * len(ids),
                                  "top_logprobs": [self.tops.get(j, {f"token_id:{t}": -0.1}) for j, t in
                                                   enumerate(ids)]}
        return httpx.Response(200, json={"choices": [choice], "usage": {"completion_tokens": len(ids)}})


SETTINGS = FeatureSettings(features=[], max_tokens=6, samples=1, sample_tokens=4, alpha=0.01, top_logprobs=5,
                           concurrency=1, seed=0, request_timeout_s=5, near_tie_threshold=0.01, source="server")


def cell(name, on: Scripted, off: Scripted, max_model_len=None, inputs=(), settings=SETTINGS):
    async def go():
        async with Wire.for_server(on) as on_wire, Wire.for_server(off) as off_wire:
            m = Matrix(on=Endpoint("spec-on", on, on_wire, TokenRequests()),
                       off=Endpoint("spec-off", off, off_wire, TokenRequests()), settings=settings, reference=None,
                       lossy=None, max_model_len=max_model_len)
            return await run_cell(m, F.BY_NAME[name], list(inputs))
    return asyncio.run(go())


def test_a_derived_cell_sends_what_its_derivation_chose_and_passes_when_speculation_ran():
    on = Scripted("on", chunks=[[1], [2], [3, 4, 5], [6]])
    off = Scripted("off", spec=False)
    c = cell("max-tokens", on, off)
    assert (c.verdict, c.params, c.requests, c.tokens) == ("pass", {"max_tokens": 3}, 1, 3)
    assert c.notes == ["max_tokens 3 ends inside a streamed chunk of the spec-on answer"]
    assert c.activity.state == "active" and c.activity.acceptance.draft_tokens == 4  # the cell's request only
    assert on.bodies[0]["stream"] is True and on.bodies[-1]["max_tokens"] == off.bodies[-1]["max_tokens"] == 3
    assert on.bodies[-1]["temperature"] == 0.0 and on.bodies[-1]["return_token_ids"] is True


def test_a_stop_string_cell_places_the_stop_inside_a_chunk_from_the_detokenized_answer():
    on = Scripted("on", chunks=[[1], [2], [3, 4, 5], [6]])
    c = cell("stop-string", on, Scripted("off", spec=False))
    assert c.params["stop"] == [" w1 w2 w3"] and c.notes == [
        "stop string ' w1 w2 w3' completes at token 2, inside a streamed chunk"]
    # the scripted servers ignore the stop: both sides break the invariant, and the reason says it
    assert c.verdict == "fail" and c.reason.startswith(
        "the server breaks the feature with speculation off too (not a speculation fault): invariant (spec-on): "
        "the stop string ' w1 w2 w3' is in the output")


def test_one_token_per_step_is_inactive_without_sending_the_cell():
    on, off = Scripted("on"), Scripted("off", spec=False)
    c = cell("stop-token-ids", on, off)
    assert c.verdict == "inactive" and c.reason.startswith("speculation not exercised: the spec-on server's greedy "
                                                           "answer came one token per step (6 tokens)")
    assert off.bodies == [] and len(on.bodies) == 1


def test_a_cell_sent_twice_checks_the_second_answer_against_the_first():
    on, off = Scripted("on"), Scripted("off", spec=False)
    on.second = [1, 2, 3, 4, 5, 6]
    c = cell("prefix-cache", on, off)
    assert (c.verdict, c.requests) == ("pass", 2) and [ch.name for ch in c.checks][-1] == "cache hit"
    assert len(on.bodies) == 2 and len(off.bodies) == 2
    on, off = Scripted("on"), Scripted("off", spec=False)
    on.second = [1, 2, 3, 4, 5, 7]
    c = cell("prefix-cache", on, off)
    assert c.verdict == "fail" and c.reason.startswith(
        "cache hit: the spec-on server's second answer differs from its first: spec on differs from spec off at "
        "token 5, character 17")


@pytest.mark.parametrize("margin, verdict", [(0.005, "near-tie"), (0.5, "fail")])
def test_a_divergence_is_triaged_from_the_spec_off_top_logprobs(margin, verdict):
    on = Scripted("on", ids=(1, 2, 9, 4, 5, 6))
    off = Scripted("off", spec=False, tops={2: {"token_id:3": -0.5, "token_id:9": -0.5 - margin}})
    on.second = list(on.ids)
    c = cell("prefix-cache", on, off)
    assert c.verdict == verdict
    triage = off.bodies[-1]
    assert (triage["max_tokens"], triage["logprobs"], triage["return_tokens_as_token_ids"]) == (3, 5, True)
    ident = next(ch for ch in c.checks if ch.name == "identity")
    assert ident.detail.startswith("spec on differs from spec off at token 2, character 8: off '3 w4 w5 w6' vs on '9 w4")


def test_no_draft_during_the_cell_is_inactive():
    c = cell("ignore-eos", Scripted("on", spec=False), Scripted("off", spec=False))
    assert c.verdict == "inactive" and c.activity.state == "inactive"


@pytest.mark.parametrize("status, verdict", [(400, "unsupported"), (500, "error")])
def test_a_refusal_is_unsupported_and_a_failure_an_error(status, verdict):
    on = Scripted("on")
    on.refuse = status
    c = cell("ignore-eos", on, Scripted("off", spec=False))
    assert c.verdict == verdict
    if status == 400:
        assert c.reason == "the spec-on server refuses it (HTTP 400: not with speculation)"
    else:
        assert c.reason.startswith("the spec-on server failed on this feature (HTTP 500 on /v1/chat/completions: not with speculation)")


def test_a_refused_stream_is_unsupported():
    on = Scripted("on")
    on.refuse = 400
    c = cell("max-tokens", on, Scripted("off", spec=False))
    assert (c.verdict, c.reason) == ("unsupported", "the spec-on server refuses it (HTTP 400: not with speculation)")


def test_a_long_prompt_without_max_model_len_cannot_be_checked():
    c = cell("chunked-prefill", Scripted("on"), Scripted("off", spec=False))
    assert c.verdict == "not-exact" and "max_model_len" in c.reason


def test_a_server_that_went_away_stops_the_run():
    on = Scripted("on")

    def dead(request):
        raise httpx.ConnectError("refused", request=request)
    on.transport = httpx.MockTransport(dead)
    with pytest.raises(ServerUnreachable, match=r"the spec-on server at http://on cannot be reached \(ConnectError\)"):
        cell("ignore-eos", on, Scripted("off", spec=False))


@pytest.mark.parametrize("seeded, verdict", [(True, "pass"), (False, "fail")])
def test_the_seed_cell_sends_one_seed_twice_and_three_others_one_at_a_time(seeded, verdict):
    on = Scripted("on")
    on.seeded = seeded
    inputs = [PromptInput(prompt=Prompt(id="p0", category="features", prompt="x"), ids=(5, 6), max_tokens=4)]
    c = cell("seed", on, Scripted("off", spec=False), inputs=inputs)
    assert all(b["prompt"] == [5, 6] for b in on.bodies)
    assert [b["seed"] for b in on.bodies] == [0, 0, 1, 2, 3]
    assert all(b["temperature"] == 1.0 and b["ignore_eos"] for b in on.bodies)
    assert (c.verdict, c.requests) == (verdict, 5)
    honoured = next(ch for ch in c.checks if ch.name == "seed honoured")
    assert honoured.ok is seeded


def test_a_distribution_cell_the_servers_top_k_cannot_score_is_not_exact_before_any_request():
    on = Scripted("on")
    c = cell("temperature-0.7", on, Scripted("off", spec=False))
    assert c.verdict == "not-exact" and "--reference DIR" in c.reason and on.bodies == []


def test_a_long_prompt_is_sized_by_the_spec_off_tokenizer():
    on, off = Scripted("on"), Scripted("off", spec=False)
    c = cell("model-length", on, off, max_model_len=40)
    assert off.bodies[0] == {"model": "m", "prompt": F.LONG_TEXT}
    assert on.bodies[0]["prompt"] == off.bodies[1]["prompt"] == [7, 8, 9] * 10 + [7, 8]
    assert on.bodies[0]["max_tokens"] == 8 and on.bodies[0]["ignore_eos"] is True
    assert (c.verdict, c.notes) == ("pass", ["prompt of 32 tokens, max_model_len 40"])


@pytest.mark.parametrize("name", ["max-tokens", "seed"])
def test_until_decided_leaves_the_cells_that_sample_no_distribution_as_they_are(name):
    """--until-decided (settings.looks) changes the distribution cells only: a greedy cell and the seed
    cell send the same requests and reach the same result with it as without."""
    results, sent = [], []
    for settings in (SETTINGS, SETTINGS.model_copy(update={"looks": 4})):
        on, off = Scripted("on", chunks=[[1], [2], [3, 4, 5], [6]]), Scripted("off", spec=False)
        inputs = [PromptInput(prompt=Prompt(id="p", prompt="x"), ids=(7, 8), max_tokens=4)]
        results.append(cell(name, on, off, inputs=inputs, settings=settings).model_dump(exclude={"seconds"}))
        sent.append((on.bodies, off.bodies))
    assert results[0] == results[1] and sent[0] == sent[1]
    assert results[1]["looks"] is None and results[1]["verdict"] == "pass" and sent[1][0]

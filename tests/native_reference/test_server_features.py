"""The server's request features (starlette TestClient, embedded model, n-gram k = 4):
vLLM's 400s, stop strings and stop token ids (text, stop_reason, usage, streaming equal
to non-streaming), the structured-output refusal, the stop-in-chunk fault end to end."""

from __future__ import annotations

import json

import pytest
from starlette.testclient import TestClient

from specadapt.native_reference.runtime import open_reference
from specadapt.native_reference.server import build_app

TEXT = "a b c d e f g a b c d e f g a b c d e f g a b c d e f g"


@pytest.fixture(scope="module")
def ref(embedded_dir):
    return open_reference(embedded_dir, ngram=True, k=4, dtype="float32")


@pytest.fixture(scope="module")
def client(ref):
    with TestClient(build_app(ref)) as c:
        yield c


def complete(client, **body):
    r = client.post("/v1/completions", json={"prompt": TEXT, "max_tokens": 12, "temperature": 0, **body})
    assert r.status_code == 200, r.text
    return r.json()


def stream(client, path="/v1/completions", **body):
    base = {"prompt": TEXT} if path == "/v1/completions" else {}
    with client.stream("POST", path, json={**base, "max_tokens": 12, "temperature": 0, "stream": True, **body}) as r:
        assert r.status_code == 200
        lines = [json.loads(x[6:]) for x in r.iter_lines() if x.startswith("data: ") and x != "data: [DONE]"]
    return lines


@pytest.mark.parametrize("body, param", [
    ({"min_p": 1.5}, "min_p"),
    ({"min_p": "x"}, "min_p"),
    ({"repetition_penalty": 0}, "repetition_penalty"),
    ({"frequency_penalty": 2.5}, "frequency_penalty"),
    ({"presence_penalty": -2.1}, "presence_penalty"),
    ({"min_tokens": -1}, "min_tokens"),
    ({"min_tokens": 13}, "min_tokens"),
    ({"logit_bias": {"abc": 1}}, "logit_bias"),
    ({"logit_bias": {"99999999": 1}}, "logit_bias"),
    ({"logit_bias": [1]}, "logit_bias"),
    ({"stop": ""}, "stop"),
    ({"stop": [1]}, "stop"),
    ({"stop_token_ids": ["1"]}, "stop_token_ids"),
    ({"stop_token_ids": [-1]}, "stop_token_ids"),
    ({"include_stop_str_in_output": "yes"}, "include_stop_str_in_output"),
    ({"temperature": -1}, "temperature"),
    ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}}, "response_format"),
    ({"structured_outputs": {"choice": ["a", "b"]}}, "structured_outputs"),
    ({"guided_json": {"type": "object"}}, "guided_json"),
    ({"guided_regex": "a+"}, "guided_regex"),
    ({"guided_choice": ["a"]}, "guided_choice"),
    ({"guided_grammar": "root ::= 'a'"}, "guided_grammar"),
])
@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
def test_refusals_name_the_parameter(client, body, param, chat):
    if chat:
        r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}],
                                                      "max_tokens": 12, **body})
    else:
        r = client.post("/v1/completions", json={"prompt": TEXT, "max_tokens": 12, **body})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and "\n" not in err["message"]
    if "structured" in param or "guided" in param or param == "response_format":
        assert "structured output is not supported by the reference server" in err["message"]


def test_accepted_values(client):
    body = complete(client, max_tokens=2, response_format={"type": "text"}, logit_bias={"5": 1000, 6: -1000},
                    min_p=0.1, repetition_penalty=1.1, frequency_penalty=-2, presence_penalty=2, min_tokens=2,
                    stop="zz", stop_token_ids=[5], include_stop_str_in_output=False)
    assert body["usage"]["completion_tokens"] == 2 and body["choices"][0]["stop_reason"] is None


@pytest.mark.parametrize("include", [False, True])
def test_stop_string(client, include):
    body = complete(client, stop=[" e", "zz"], include_stop_str_in_output=include, return_token_ids=True,
                    logprobs=0)
    choice = body["choices"][0]
    want = " a b c d e" if include else " a b c d"
    assert choice["text"] == want and choice["finish_reason"] == "stop" and choice["stop_reason"] == " e"
    # vLLM counts the tokens up to the one that completed the stop string
    assert body["usage"]["completion_tokens"] == 5 == len(choice["token_ids"]) == len(choice["logprobs"]["tokens"])
    chunks = stream(client, stop=[" e", "zz"], include_stop_str_in_output=include,
                    stream_options={"include_usage": True})
    assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == want
    assert chunks[-2]["choices"][0]["stop_reason"] == " e" and chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["usage"]["completion_tokens"] == 5


def test_stop_string_in_chat(client):
    msgs = [{"role": "user", "content": "Repeat exactly: " + TEXT}]
    plain = client.post("/v1/chat/completions", json={"messages": msgs, "max_tokens": 12, "temperature": 0}).json()
    text = plain["choices"][0]["message"]["content"]
    stop = text[3:5]
    cut = client.post("/v1/chat/completions", json={"messages": msgs, "max_tokens": 12, "temperature": 0,
                                                    "stop": stop}).json()
    choice = cut["choices"][0]
    assert choice["message"]["content"] == text[:text.index(stop)] and choice["stop_reason"] == stop
    chunks = stream(client, "/v1/chat/completions", messages=msgs, stop=stop)
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == choice["message"]["content"]


@pytest.mark.parametrize("include", [False, True])
def test_stop_token_ids(client, ref, include):
    d = ref.tokenizer(" d", add_special_tokens=False)["input_ids"][0]
    body = complete(client, stop_token_ids=[d], include_stop_str_in_output=include, return_token_ids=True)
    choice = body["choices"][0]
    assert choice["token_ids"][-1] == d and body["usage"]["completion_tokens"] == 4
    assert choice["finish_reason"] == "stop" and choice["stop_reason"] == d
    assert choice["text"] == (" a b c d" if include else " a b c")
    chunks = stream(client, stop_token_ids=[d], include_stop_str_in_output=include)
    assert "".join(c["choices"][0]["text"] for c in chunks) == choice["text"]


def test_length_and_eos_have_no_stop_reason(client):
    choice = complete(client, max_tokens=3)["choices"][0]
    assert choice["finish_reason"] == "length" and choice["stop_reason"] is None


def test_stop_in_chunk_fault_through_the_server(embedded_dir):
    faulty = open_reference(embedded_dir, ngram=True, k=4, dtype="float32", fault="stop-in-chunk")
    with TestClient(build_app(faulty)) as c:
        body = complete(c, stop=" e")
    choice = body["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["stop_reason"] == " e"
    assert choice["text"].startswith(" a b c d e f") and body["usage"]["completion_tokens"] > 5

"""The streaming client against scripted SSE bodies (httpx.MockTransport: exact bytes known)."""

import asyncio
import json

import httpx

from specadapt.probes.client import build_body, stream_request
from specadapt.records import Prompt, RequestSettings

CHAT = Prompt(id="c", category="open", messages=[{"role": "user", "content": "hi"}])
COMPLETION = Prompt(id="p", category="open", prompt="once upon")


def sse(*events) -> bytes:
    out = ""
    for e in events:
        out += "data: " + (e if isinstance(e, str) else json.dumps(e)) + "\n\n"
    return out.encode()


def chat_chunk(text, n_logprobs=0, usage=None, finish=None):
    choice = {"index": 0, "delta": {"content": text}, "finish_reason": finish}
    if n_logprobs:
        choice["logprobs"] = {"content": [{"token": f"t{i}", "logprob": -0.1, "top_logprobs": []}
                                          for i in range(n_logprobs)]}
    chunk = {"choices": [choice]}
    if usage is not None:
        chunk["usage"] = {"prompt_tokens": 7, "completion_tokens": usage}
    return chunk


def run(body: bytes, prompt=CHAT, status=200, content_type="text/event-stream"):
    seen = {}

    def handler(request: httpx.Request) -> httpx.Response:
        seen["path"] = request.url.path
        seen["json"] = json.loads(request.content)
        return httpx.Response(status, headers={"content-type": content_type}, content=body)

    async def go():
        async with httpx.AsyncClient(base_url="http://s", transport=httpx.MockTransport(handler)) as client:
            return await stream_request(client, prompt, "m", RequestSettings(), run_t0_ns=0)

    return asyncio.run(go()), seen


def test_usage_deltas_count_tokens_per_chunk():
    body = sse(chat_chunk("", usage=0), chat_chunk("a", 1, usage=1), chat_chunk("bcde", 4, usage=5),
               chat_chunk("f", 1, usage=6, finish="length"), {"choices": [], "usage": {"completion_tokens": 6}},
               "[DONE]")
    rec, seen = run(body)
    assert rec.ok and rec.error is None
    assert rec.chunk_tokens == [1, 4, 1] and rec.output_tokens == 6
    assert rec.token_source == "usage" and rec.text == "abcdef" and rec.finish_reason == "length"
    assert rec.prompt_tokens == 7 and len(rec.tokens) == 6
    assert seen["path"] == "/v1/chat/completions"
    assert seen["json"]["temperature"] == 0.0 and seen["json"]["stream_options"]["continuous_usage_stats"]


def test_logprobs_count_when_no_continuous_usage():
    rec, _ = run(sse(chat_chunk("ab", 2), chat_chunk("c", 1), "[DONE]"))
    assert rec.chunk_tokens == [2, 1] and rec.token_source == "logprobs" and rec.output_tokens == 3


def test_last_resort_counts_one_per_chunk_and_says_so():
    rec, _ = run(sse(chat_chunk("ab"), chat_chunk("c"), "[DONE]"))
    assert rec.chunk_tokens == [1, 1] and rec.token_source == "chunks"


def test_completions_api_body_and_parsing():
    chunk = {"choices": [{"index": 0, "text": "xy", "logprobs": {"tokens": ["x", "y"], "token_logprobs": [-1, -2],
                                                                 "top_logprobs": None}}],
             "usage": {"completion_tokens": 2}}
    rec, seen = run(sse(chunk, "[DONE]"), prompt=COMPLETION)
    assert seen["path"] == "/v1/completions" and seen["json"]["prompt"] == "once upon"
    assert rec.ok and rec.text == "xy" and rec.tokens == ["x", "y"] and rec.token_logprobs == [-1.0, -2.0]


def test_http_error_is_recorded_not_raised():
    rec, _ = run(b'{"error": "overloaded"}', status=503, content_type="application/json")
    assert not rec.ok and rec.status_code == 503 and rec.error.startswith("HTTP 503")


def test_missing_done_is_a_failure():
    rec, _ = run(sse(chat_chunk("a", 1, usage=1)))
    assert not rec.ok and rec.error == "stream ended without [DONE]"


def test_malformed_sse_data_is_a_failure():
    rec, _ = run(sse(chat_chunk("a", 1, usage=1), "{oops"))
    assert not rec.ok and "malformed SSE data" in rec.error


def test_non_sse_answer_is_a_failure():
    rec, _ = run(b"<html></html>", content_type="text/html")
    assert not rec.ok and "SSEError" in rec.error


def test_build_body_respects_prompt_max_tokens_and_seed():
    p = Prompt(id="x", prompt="a", max_tokens=7)
    path, body = build_body(p, "m", RequestSettings(seed=None, logprobs=False))
    assert path == "/v1/completions" and body["max_tokens"] == 7
    assert "seed" not in body and "logprobs" not in body

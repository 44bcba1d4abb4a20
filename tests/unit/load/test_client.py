"""The streaming client against scripted SSE bodies (a scripted transport: exact bytes known), and its
times against an injected clock that the transport advances: exact to the nanosecond, no wall clock."""
import asyncio
import contextlib
import inspect
import json
from pathlib import Path
import time
import aiohttp
import orjson
import pytest
from specadapt.analysis.latency import itl_values_ns, latency_summary, tpot_ns
from specadapt.load import client as client_mod
from specadapt.load.client import _chunk_logprobs, _delta_text, _retryable, build_body, stream_request
from specadapt.records import Prompt, RequestRecord, RequestSettings
import datetime
import ipaddress
import math
import ssl
import sys
import types
from aiohttp import web
from multidict import CIMultiDict
from specadapt.load.client import StreamState, run as run_client, stream_request
from specadapt.load.spread import client_for, target_of
from specadapt.wire.sse import SSEParser
from specadapt.wire.stream import StreamClient, _AiohttpResponse, ssl_for

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


class Answer:
    """One scripted HTTP answer: a status, a content type and body pieces, each handed out when the
    transport says it arrives (``on_piece`` moves a fake clock)."""

    def __init__(self, status=200, content_type="text/event-stream", pieces=(), on_piece=None):
        self.status, self.content_type, self.pieces, self.on_piece = status, content_type, list(pieces), on_piece

    async def read(self) -> bytes:
        return b"".join(data for _, data in self.pieces)

    async def chunks(self):
        for at, data in self.pieces:
            if self.on_piece:
                self.on_piece(at)
            if isinstance(data, BaseException):
                raise data
            yield data

    async def finish(self):
        self.finished = True


class Scripted:
    """A stand-in for StreamClient: ``handler(path, body)`` returns an Answer or raises (the body went
    through JSON as on the wire)."""

    def __init__(self, handler):
        self.handler = handler

    @contextlib.asynccontextmanager
    async def post_stream(self, path, body):
        yield self.handler(path, orjson.loads(orjson.dumps(body)))


def run(body: bytes, prompt=CHAT, status=200, content_type="text/event-stream"):
    seen = {}

    def handler(path, body_json):
        seen["path"] = path
        seen["json"] = body_json
        return Answer(status, content_type, [(0, body)])

    async def go():
        return await stream_request(Scripted(handler), prompt, "m", RequestSettings(), run_t0_ns=0)

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


# --- Exact times: an injected clock that the transport advances as it hands out bytes ---------------------------
#
# Nothing here is measured: the fake clock only moves when the mock transport says a header or a piece of the
# body "arrives", so every time the client records is known to the nanosecond and asserted with ==.

MS = 1_000_000
START = 7_000_000_000  # the fake clock's reading at the first send
RUN_T0 = START - 5 * MS  # the run started 5 ms before this request was sent


class FakeClock:
    def __init__(self, now: int = START):
        self.now = now
        self.reads: list[int] = []

    def __call__(self) -> int:
        self.reads.append(self.now)
        return self.now

    def at(self, ms_since_start: float) -> None:
        """Move to START + ms (never backwards: the clock is monotonic)."""
        target = START + round(ms_since_start * MS)
        assert target >= self.now, "a script must not move the clock backwards"
        self.now = target


def timed(pieces: list[tuple[float, object]]) -> list[tuple[float, bytes]]:
    """(ms, event) -> (ms, SSE bytes of that one event); bytes (and an exception to raise there) pass through."""
    return [(ms, e if isinstance(e, (bytes, BaseException)) else sse(e)) for ms, e in pieces]


def run_timed(attempts: list, prompt=CHAT, settings: RequestSettings | None = None):
    """Each attempt is (headers_ms, status, pieces) or an exception to raise at headers_ms:
    (headers_ms, exception). Returns the record, the clock, and the clock at each send."""
    clock = FakeClock()
    sends: list[int] = []
    queue = list(attempts)

    def handler(path, body):
        sends.append(clock.now)
        headers_ms, *rest = queue.pop(0)
        clock.at(headers_ms)
        if isinstance(rest[0], BaseException):
            raise rest[0]
        status, pieces = rest
        if status != 200:
            return Answer(status, "application/json", [(headers_ms, b'{"error": "busy"}')])
        return Answer(200, pieces=timed(pieces), on_piece=clock.at)

    async def go():
        return await stream_request(Scripted(handler), prompt, "m", settings or RequestSettings(), run_t0_ns=RUN_T0,
                                    clock=clock)

    rec = asyncio.run(go())
    assert not queue, "every scripted attempt was used"
    return rec, clock, sends


def test_default_clock_is_the_monotonic_perf_counter():
    # The runner's run_t0_ns and the scripted server's log are time.perf_counter_ns: the same clock.
    assert inspect.signature(stream_request).parameters["clock"].default is time.perf_counter_ns


def test_exact_times_with_usage_and_a_speculative_multi_token_chunk():
    rec, clock, sends = run_timed([(3, 200, [
        (10, chat_chunk("", usage=0)),            # role chunk: no token, no time recorded
        (20, chat_chunk("a", 1, usage=1)),        # first token: TTFT 20 ms
        (50, chat_chunk("bcde", 4, usage=5)),     # one SSE chunk with k+1 = 4 tokens (3 drafts accepted + bonus)
        (62, chat_chunk("", 1, usage=6)),         # a token that detokenizes to nothing: still a token
        (71, chat_chunk("fg", 3, usage=9, finish="length")),
        (72, {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 9}}),  # usage-only chunk
        (80, "[DONE]"),
    ])])
    assert sends == [START] and clock.reads[0] == START  # t0 is read at the send
    assert rec.ok and rec.sent_at_ns == 5 * MS
    assert rec.chunk_ns == [20 * MS, 50 * MS, 62 * MS, 71 * MS]
    assert rec.chunk_tokens == [1, 4, 1, 3]
    assert rec.token_source == "usage" and rec.output_tokens == 9 and rec.text == "abcdefg"
    assert rec.ttft_ns == 20 * MS and rec.e2e_ns == 80 * MS
    # Per token: the 30 ms before the 4-token chunk is 4 ITLs of 7.5 ms, not one of 30 ms.
    assert itl_values_ns(rec) == [7.5 * MS] * 4 + [12 * MS] + [3 * MS] * 3
    assert tpot_ns(rec) == (80 - 20) * MS / (9 - 1) == 7.5 * MS


def test_exact_summary_of_the_scripted_request():
    rec, _, _ = run_timed([(3, 200, [
        (20, chat_chunk("a", 1, usage=1)), (50, chat_chunk("bcde", 4, usage=5)),
        (62, chat_chunk("", 1, usage=6)), (71, chat_chunk("fg", 3, usage=9)), (80, "[DONE]")])])
    s = latency_summary([rec])
    assert (s.requests, s.succeeded, s.output_tokens) == (1, 1, 9)
    assert (s.ttft_ms.count, s.ttft_ms.p50, s.e2e_ms.p50, s.tpot_ms.p50) == (1, 20.0, 80.0, 7.5)
    assert (s.itl_ms.count, s.itl_ms.mean, s.itl_ms.p50, s.itl_ms.min, s.itl_ms.max) == (8, 6.375, 7.5, 3.0, 12.0)
    assert s.duration_s == 0.08 and s.tokens_per_chunk_mean == 9 / 4


def test_exact_times_counted_by_logprobs():
    rec, _, _ = run_timed([(1, 200, [
        (15, chat_chunk("ab", 2)), (25, chat_chunk("", 1)),  # an empty-text token still has its logprob
        (45, chat_chunk("cdef", 4)), (46, "[DONE]")])])
    assert rec.ok and rec.token_source == "logprobs"
    assert rec.chunk_ns == [15 * MS, 25 * MS, 45 * MS] and rec.chunk_tokens == [2, 1, 4]
    assert rec.output_tokens == 7 and rec.ttft_ns == 15 * MS and rec.e2e_ns == 46 * MS
    # ITL starts at the first chunk: its second token has no gap of its own (TTFT covers it).
    assert itl_values_ns(rec) == [10 * MS] + [5 * MS] * 4
    assert tpot_ns(rec) == (46 - 15) * MS / 6


def test_exact_times_counted_by_chunks_fold_empty_chunks_into_the_next_gap():
    rec, _, _ = run_timed([(1, 200, [
        (10, chat_chunk("a")), (14, chat_chunk("")),  # no text, no usage, no logprobs: not a token
        (30, chat_chunk("bcd")), (41, chat_chunk("e")), (41.5, "[DONE]")])])
    assert rec.ok and rec.token_source == "chunks"
    assert rec.chunk_ns == [10 * MS, 30 * MS, 41 * MS] and rec.chunk_tokens == [1, 1, 1]
    assert itl_values_ns(rec) == [20 * MS, 11 * MS]  # 10 -> 30 ms: the empty chunk at 14 ms is no arrival
    assert rec.e2e_ns == 41_500_000 and tpot_ns(rec) == (41_500_000 - 10 * MS) / 2


def test_completions_api_times_and_logprob_counts():
    def chunk(text, n):
        return {"choices": [{"index": 0, "text": text, "logprobs": {
            "tokens": list(text) or ["<0x0A>"] * n, "token_logprobs": [-1.0] * n, "top_logprobs": None}}]}

    rec, _, _ = run_timed([(2, 200, [(9, chunk("xy", 2)), (33, chunk("zwv", 3)), (40, "[DONE]")])],
                          prompt=COMPLETION)
    assert rec.chunk_ns == [9 * MS, 33 * MS] and rec.chunk_tokens == [2, 3] and rec.token_source == "logprobs"
    assert itl_values_ns(rec) == [8 * MS] * 3 and tpot_ns(rec) == (40 - 9) * MS / 4


def test_a_chunk_arrives_when_its_last_byte_does_and_coalesced_chunks_share_a_time():
    a, b, c = sse(chat_chunk("a", 1, usage=1)), sse(chat_chunk("b", 1, usage=2)), sse(chat_chunk("c", 1, usage=3))
    rec, _, _ = run_timed([(1, 200, [
        (10, a[:17]), (12, a[17:]),     # one event split over two reads: it arrives at 12 ms
        (30, b + c),                    # two events in one read (coalesced on the wire): both at 30 ms
        (31, b"data: [DO"), (35, b"NE]\n\n")])])
    assert rec.chunk_ns == [12 * MS, 30 * MS, 30 * MS] and rec.chunk_tokens == [1, 1, 1]
    assert itl_values_ns(rec) == [18 * MS, 0.0] and rec.e2e_ns == 35 * MS


def test_usage_only_on_the_last_chunk_does_not_make_a_phantom_chunk():
    # A server that ignores continuous_usage_stats but puts the total on its last content chunk:
    # the last chunk carries 1 token (its logprob), not all 4 (the usage total minus nothing).
    last = chat_chunk("d", 1, usage=4, finish="stop")
    rec, _, _ = run_timed([(1, 200, [(10, chat_chunk("a", 1)), (20, chat_chunk("bc", 2)), (30, last),
                                     (31, "[DONE]")])])
    assert rec.chunk_tokens == [1, 2, 1] and rec.output_tokens == 4 and rec.token_source == "logprobs"
    assert itl_values_ns(rec) == [5 * MS, 5 * MS, 10 * MS]


def test_usage_back_on_every_chunk_counts_by_usage_again():
    rec, _, _ = run_timed([(1, 200, [(10, chat_chunk("a", 1)), (20, chat_chunk("bc", 2, usage=3)),
                                     (40, chat_chunk("def", 3, usage=7)), (41, "[DONE]")])])
    # 7 - 3 = 4 tokens by usage (one more than the 3 logprobs: usage is the server's own count).
    assert rec.chunk_tokens == [1, 2, 4] and rec.output_tokens == 7 and rec.token_source == "logprobs"
    assert itl_values_ns(rec) == [5 * MS] * 2 + [5 * MS] * 4


def test_retried_request_times_run_from_the_first_send():
    settings = RequestSettings(retries=3, retry_backoff_s=0.0)
    rec, clock, sends = run_timed([
        (2, refused()),                                  # attempt 1: refused after 2 ms
        (9, 503, []),                                    # attempt 2: HTTP 503 at 9 ms
        (13, 200, [(40, chat_chunk("a", 1, usage=1)), (55, chat_chunk("bc", 2, usage=3)), (60, "[DONE]")]),
    ], settings=settings)
    assert sends == [START, START + 2 * MS, START + 9 * MS]
    assert rec.ok and rec.attempts == 3 and len(rec.retried_errors) == 2
    assert rec.retried_errors[0].startswith("ClientConnectorError") and rec.retried_errors[1].startswith("HTTP 503")
    assert rec.sent_at_ns == 5 * MS  # the first send, not the last
    assert rec.chunk_ns == [40 * MS, 55 * MS] and rec.ttft_ns == 40 * MS and rec.e2e_ns == 60 * MS
    assert itl_values_ns(rec) == [7.5 * MS] * 2 and tpot_ns(rec) == 10 * MS


def test_a_failed_stream_keeps_exact_times_of_what_arrived():
    rec, _, _ = run_timed([(1, 200, [(10, chat_chunk("a", 1, usage=1)), (25, chat_chunk("bc", 2, usage=3))])])
    assert not rec.ok and rec.error_kind == "no_done"
    assert rec.chunk_ns == [10 * MS, 25 * MS] and rec.chunk_tokens == [1, 2] and rec.e2e_ns == 25 * MS


# --- Exact values of the body, the parsed logprobs and every error path -------------------------------------------

STREAM_OPTIONS = {"include_usage": True, "continuous_usage_stats": True}


def run_with(body: bytes, prompt=CHAT, settings: RequestSettings | None = None, status=200,
             content_type="text/event-stream", **kwargs):
    """Like run(), with settings and stream_request keywords (repeat, warmup)."""
    seen = {}

    def handler(path, body_json):
        seen["path"] = path
        seen["json"] = body_json
        return Answer(status, content_type, [(0, body)])

    async def go():
        return await stream_request(Scripted(handler), prompt, "m", settings or RequestSettings(), run_t0_ns=0,
                                    **kwargs)

    return asyncio.run(go()), seen


def test_build_body_chat_is_exact():
    p = Prompt(id="x", messages=[{"role": "system", "content": "s"}, {"role": "user", "content": "u"}])
    s = RequestSettings(max_tokens=64, temperature=0.7, seed=5, logprobs=True, top_logprobs=3,
                        extra_body={"top_k": 1, "ignore_eos": True})
    assert build_body(p, "model-a", s) == ("/v1/chat/completions", {
        "model": "model-a", "max_tokens": 64, "temperature": 0.7, "stream": True, "stream_options": STREAM_OPTIONS,
        "seed": 5, "top_k": 1, "ignore_eos": True,
        "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}],
        "logprobs": True, "top_logprobs": 3})


def test_build_body_chat_without_logprobs_or_seed():
    p = Prompt(id="x", messages=[{"role": "user", "content": "u"}], max_tokens=9)
    assert build_body(p, "m", RequestSettings(seed=None, logprobs=False)) == ("/v1/chat/completions", {
        "model": "m", "max_tokens": 9, "temperature": 0.0, "stream": True, "stream_options": STREAM_OPTIONS,
        "messages": [{"role": "user", "content": "u"}]})


def test_build_body_completions_is_exact():
    # Completions API: logprobs is the number of top alternatives (an int), no top_logprobs field; seed 0 is sent.
    p = Prompt(id="x", prompt="a", max_tokens=7)
    s = RequestSettings(max_tokens=64, seed=0, logprobs=True, top_logprobs=2, extra_body={"min_tokens": 3})
    assert build_body(p, "m", s) == ("/v1/completions", {
        "model": "m", "max_tokens": 7, "temperature": 0.0, "stream": True, "stream_options": STREAM_OPTIONS,
        "seed": 0, "min_tokens": 3, "prompt": "a", "logprobs": 2})


def test_request_sent_is_the_built_body_with_the_model_and_defaults_recorded():
    rec, seen = run_with(sse(chat_chunk("a", 1, usage=1), "[DONE]"))
    assert seen["path"] == "/v1/chat/completions" and seen["json"] == build_body(CHAT, "m", RequestSettings())[1]
    assert seen["json"]["model"] == "m"
    assert rec.repeat == 0 and rec.warmup is False and rec.prompt_id == "c" and rec.category == "open"
    rec, _ = run_with(sse(chat_chunk("a", 1, usage=1), "[DONE]"), repeat=3, warmup=True)
    assert rec.repeat == 3 and rec.warmup is True


def test_chunk_logprobs_chat_shape():
    choice = {"logprobs": {"content": [
        {"token": "a", "logprob": -0.5, "top_logprobs": [{"token": "a", "logprob": -0.5}, {"token": "b", "logprob": -1}]},
        {"logprob": -2, "top_logprobs": None},  # no token string
        {"token": "c"},                          # no logprob, no alternatives
    ]}}
    assert _chunk_logprobs(choice, "chat") == (["a", "", "c"], [-0.5, -2.0, 0.0], [{"a": -0.5, "b": -1.0}, {}, {}])
    assert _chunk_logprobs({"logprobs": None}, "chat") == ([], [], [])
    assert _chunk_logprobs({"logprobs": {"content": None}}, "chat") == ([], [], [])


def test_chunk_logprobs_completions_shape():
    choice = {"logprobs": {"tokens": ["x", "y", "z"], "token_logprobs": [None, -1, -2.5],
                           "top_logprobs": [None, {"y": -1, "w": -3}, {"z": -2.5}]}}
    assert _chunk_logprobs(choice, "completions") == (
        ["x", "y", "z"], [0.0, -1.0, -2.5], [{}, {"y": -1.0, "w": -3.0}, {"z": -2.5}])
    assert _chunk_logprobs({}, "completions") == ([], [], [])


def test_delta_text_of_missing_fields_is_empty():
    assert _delta_text({"index": 0}, "completions") == "" and _delta_text({"text": None}, "completions") == ""
    assert _delta_text({"text": "x"}, "completions") == "x"
    assert _delta_text({"delta": None}, "chat") == "" and _delta_text({"delta": {"content": "y"}}, "chat") == "y"


def test_logprobs_and_alternatives_accumulate_over_chunks():
    def chunk(entries, usage):
        return {"choices": [{"index": 0, "delta": {"content": "".join(t for t, _, _ in entries)},
                             "logprobs": {"content": [
                                 {"token": t, "logprob": lp, "top_logprobs": [{"token": k, "logprob": v}
                                                                              for k, v in tops.items()]}
                                 for t, lp, tops in entries]}}],
                "usage": {"completion_tokens": usage}}

    body = sse(chunk([("a", -0.1, {"a": -0.1, "b": -2.5})], 1),
               chunk([("b", -0.7, {"b": -0.7, "c": -0.8}), ("c", -0.2, {"c": -0.2})], 3),
               chunk([("d", -1.5, {"d": -1.5, "e": -1.6})], 4), "[DONE]")
    rec, _ = run_with(body, settings=RequestSettings(top_logprobs=2))
    assert rec.ok and rec.text == "abcd" and rec.chunk_tokens == [1, 2, 1]
    assert rec.tokens == ["a", "b", "c", "d"]
    assert rec.token_logprobs == [-0.1, -0.7, -0.2, -1.5]
    assert rec.top_logprobs == [{"a": -0.1, "b": -2.5}, {"b": -0.7, "c": -0.8}, {"c": -0.2}, {"d": -1.5, "e": -1.6}]


def test_first_chunk_counted_by_usage_from_zero():
    # No usage-only chunk before it: completion_tokens 2 on the first token chunk is 2 tokens since 0.
    rec, _ = run_with(sse(chat_chunk("ab", 1, usage=2), chat_chunk("c", 1, usage=3), "[DONE]"))
    assert rec.chunk_tokens == [2, 1] and rec.token_source == "usage" and rec.output_tokens == 3


def test_a_chunk_without_tokens_or_usage_keeps_counting_by_usage():
    # A role chunk without usage carries no token: the usage count is not given up for it.
    rec, _ = run_with(sse(chat_chunk(""), chat_chunk("ab", 1, usage=2), chat_chunk("c", 1, usage=3), "[DONE]"))
    assert rec.chunk_tokens == [2, 1] and rec.token_source == "usage"


def test_only_the_first_choice_is_read():
    chunk = {"choices": [{"index": 0, "delta": {"content": "a"}, "finish_reason": None},
                         {"index": 1, "delta": {"content": "ZZ"}, "finish_reason": "stop",
                          "logprobs": {"content": [{"token": "Z", "logprob": -3.0}]}}],
             "usage": {"completion_tokens": 1}}
    rec, _ = run_with(sse(chunk, "[DONE]"))
    assert rec.text == "a" and rec.finish_reason is None and rec.tokens == [] and rec.token_logprobs == []


def test_http_error_detail_is_exact():
    rec, _ = run_with(b'{"error": "overloaded"}', status=503, content_type="application/json")
    assert rec.error == 'HTTP 503: {"error": "overloaded"}' and rec.error_kind == "http_status"
    assert rec.status_code == 503 and rec.chunk_ns == [] and rec.e2e_ns is None
    rec, _ = run_with(b"bad \xff\nline", status=500, content_type="text/plain")  # invalid UTF-8, a newline
    assert rec.error == "HTTP 500: bad \ufffd line"
    rec, _ = run_with(b"x" * 300, status=500, content_type="text/plain")
    assert rec.error == "HTTP 500: " + "x" * 200


def test_malformed_sse_data_message_is_exact():
    rec, _ = run_with(sse(chat_chunk("a", 1, usage=1), "{oops"))
    assert rec.error == "malformed SSE data: '{oops'" and rec.error_kind == "malformed" and not rec.ok
    rec, _ = run_with(sse("x" * 100))
    assert rec.error == f"malformed SSE data: {'x' * 80!r}"


@pytest.mark.parametrize("event", ['[1, 2]', '{"choices": ["x"]}', '{"choices": [{"delta": "x"}]}',
                                   '{"choices": [{"text": "a"}], "usage": {"completion_tokens": "many"}}'])
def test_json_of_the_wrong_shape_is_malformed_not_raised(event):
    rec, _ = run_with(sse(chat_chunk("a", 1, usage=1), event, "[DONE]"))
    assert rec.error == f"malformed SSE data: {event!r}" and rec.error_kind == "malformed" and not rec.ok
    assert rec.chunk_tokens == [1]


def test_non_sse_answer_is_malformed():
    rec, _ = run_with(b"<html></html>", content_type="text/html")
    assert rec.error_kind == "malformed" and rec.error.startswith("SSEError: ")


def test_error_chunk_in_stream():
    rec, _ = run_with(sse(chat_chunk("a", 1, usage=1), {"error": {"message": "boom", "code": 500}}, "[DONE]"))
    assert rec.error == "server error in stream: {'message': 'boom', 'code': 500}"
    assert rec.error_kind == "server_error" and not rec.ok and rec.chunk_tokens == [1]
    rec, _ = run_with(sse({"error": "e" * 300, "choices": []}, "[DONE]"))
    assert rec.error == "server error in stream: " + "e" * 200 and rec.error_kind == "server_error"


def test_error_field_beside_choices_is_not_a_failure():
    chunk = chat_chunk("a", 1, usage=1)
    chunk["error"] = None
    rec, _ = run_with(sse(chunk, "[DONE]"))
    assert rec.ok and rec.error is None and rec.text == "a"


def test_no_token_stream_and_a_single_token_stream():
    rec, _ = run_with(sse(chat_chunk("", usage=0), "[DONE]"))
    assert not rec.ok and rec.output_tokens == 0
    assert rec.error == "stream ended without any output token" and rec.error_kind == "no_tokens"
    rec, _ = run_with(sse(chat_chunk("a", 1, usage=1), "[DONE]"))
    assert rec.ok and rec.error is None and rec.error_kind is None and rec.output_tokens == 1


def refused(detail="Connect call failed ('127.0.0.1', 9)"):
    key = aiohttp.client_reqrep.ConnectionKey("127.0.0.1", 9, False, True, None, None, None, None)
    return aiohttp.ClientConnectorError(key, ConnectionRefusedError(111, detail))


@pytest.mark.parametrize("exc, error, kind", [
    (aiohttp.ServerTimeoutError("Timeout on reading data from socket"),
     "ServerTimeoutError: Timeout on reading data from socket", "timeout"),
    (aiohttp.ConnectionTimeoutError("Connection timeout to host http://s"),
     "ConnectionTimeoutError: Connection timeout to host http://s", "timeout"),
    (refused(), "ClientConnectorError: Cannot connect to host 127.0.0.1:9 ssl:default "
                "[Connect call failed ('127.0.0.1', 9)]", "connect"),
    (refused("refused\nmore detail"), "ClientConnectorError: Cannot connect to host 127.0.0.1:9 ssl:default "
                                      "[refused", "connect"),
    (aiohttp.ServerDisconnectedError(), "ServerDisconnectedError: Server disconnected", "disconnect"),
    (aiohttp.ClientPayloadError(""), "ClientPayloadError: no detail", "disconnect"),
    (aiohttp.ClientOSError(32, "Broken pipe"), "ClientOSError: [Errno 32] Broken pipe", "disconnect"),
    (aiohttp.InvalidURL("ftp://s"), "InvalidURL: ftp://s", "other"),
])
def test_transport_errors_have_exact_message_and_kind(exc, error, kind):
    rec, _, _ = run_timed([(2, exc)])
    assert rec.error == error and rec.error_kind == kind and not rec.ok and rec.attempts == 1


def test_long_transport_error_is_cut_to_300_characters():
    rec, _, _ = run_timed([(2, aiohttp.ClientPayloadError("y" * 500))])
    assert rec.error == "ClientPayloadError: " + "y" * 280 and len(rec.error) == 300


def test_disconnect_mid_stream_keeps_what_arrived_and_is_not_retried():
    rec, _, _ = run_timed([(1, 200, [(10, chat_chunk("a", 1, usage=1)),
                                     (20, aiohttp.ClientPayloadError("Response payload is not completed"))])],
                          settings=RequestSettings(retries=2, retry_backoff_s=0.0))
    assert rec.error == "ClientPayloadError: Response payload is not completed" and rec.error_kind == "disconnect"
    assert rec.chunk_ns == [10 * MS] and rec.attempts == 1 and rec.e2e_ns is None and rec.output_tokens == 0


def test_request_timeout_is_recorded():
    clock = FakeClock()

    class Hanging(Answer):
        async def chunks(self):  # one token chunk, then nothing for 2 s (then the end without [DONE])
            yield sse(chat_chunk("a", 1, usage=1))
            await asyncio.sleep(2)

    async def go():
        return await stream_request(Scripted(lambda path, body: Hanging()), CHAT, "m",
                                    RequestSettings(request_timeout_s=0.05), run_t0_ns=RUN_T0, clock=clock)

    rec = asyncio.run(go())
    assert rec.error == "timed out after 0.05 s" and rec.error_kind == "timeout" and not rec.ok
    assert rec.chunk_tokens == [1] and rec.e2e_ns is None


@pytest.mark.parametrize("status, retried", [(429, True), (500, True), (502, True), (503, True), (504, True),
                                             (400, False), (404, False), (501, False)])
def test_retry_decision_per_status(status, retried):
    ok = (1, 200, [(5, chat_chunk("a", 1, usage=1)), (6, "[DONE]")])
    attempts = [(1, status, []), ok] if retried else [(1, status, [])]
    rec, _, _ = run_timed(attempts, settings=RequestSettings(retries=2, retry_backoff_s=0.0))
    if retried:
        assert rec.ok and rec.attempts == 2 and rec.retried_errors == [f'HTTP {status}: {{"error": "busy"}}']
    else:
        assert not rec.ok and rec.attempts == 1 and rec.retried_errors == [] and rec.status_code == status


def test_one_retry_allowed_is_used():
    rec, _, sends = run_timed([(1, 503, []), (2, 200, [(5, chat_chunk("a", 1, usage=1)), (6, "[DONE]")])],
                              settings=RequestSettings(retries=1, retry_backoff_s=0.0))
    assert rec.ok and rec.attempts == 2 and len(sends) == 2


def test_retries_stop_after_the_allowed_number():
    rec, _, _ = run_timed([(1, 503, []), (2, 503, [])], settings=RequestSettings(retries=1, retry_backoff_s=0.0))
    assert not rec.ok and rec.attempts == 2 and rec.error_kind == "http_status"
    assert rec.retried_errors == ['HTTP 503: {"error": "busy"}']


def test_backoff_grows_with_the_attempt(monkeypatch):
    slept: list[float] = []

    async def fake_sleep(seconds):
        slept.append(seconds)

    monkeypatch.setattr(client_mod.asyncio, "sleep", fake_sleep)
    rec, _, _ = run_timed([(1, 503, []), (2, 502, []), (3, 200, [(5, chat_chunk("a", 1, usage=1)), (6, "[DONE]")])],
                          settings=RequestSettings(retries=3, retry_backoff_s=0.5))
    assert rec.ok and rec.attempts == 3 and slept == [0.5, 1.0]


def test_no_resend_after_a_token_arrived():
    rec = RequestRecord(prompt_id="c", category="open", api="chat", error_kind="connect", chunk_ns=[1],
                        error="ConnectError: x")
    assert _retryable(rec) is False
    rec = RequestRecord(prompt_id="c", category="open", api="chat", error_kind="connect", error="ConnectError: x")
    assert _retryable(rec) is True
    rec = RequestRecord(prompt_id="c", category="open", api="chat", error_kind="timeout", status_code=503)
    assert _retryable(rec) is False


def test_done_with_spaces_around_it_ends_the_stream():
    rec, _ = run_with(sse(chat_chunk("a", 1, usage=1)) + b"data:  [DONE] \n\n")
    assert rec.ok and rec.error is None and rec.e2e_ns is not None


def test_a_timeout_while_waiting_for_the_body_end_after_done_is_no_failure():
    class SlowEnd(Answer):
        async def finish(self):  # the end of the body never comes: the request timeout runs out here
            await asyncio.sleep(2)

    def handler(path, body):
        return SlowEnd(pieces=[(0, sse(chat_chunk("a", 1, usage=1), "[DONE]"))])

    async def go():
        return await stream_request(Scripted(handler), CHAT, "m", RequestSettings(request_timeout_s=0.05), run_t0_ns=0)

    rec = asyncio.run(go())
    assert rec.ok and rec.error is None and rec.error_kind is None and rec.output_tokens == 1


def test_usage_only_chunk_beyond_the_content_counts_in_the_total_but_is_no_chunk():
    # The final usage-only chunk says 4 tokens while the content chunks carried 3: no phantom chunk for the
    # difference, and the server's total is the output count. prompt_tokens 0 is a value, not a missing one.
    def usage_chunk(total):
        return {"choices": [], "usage": {"prompt_tokens": 0, "completion_tokens": total}}

    rec, _ = run_with(sse(chat_chunk("a", 1, usage=1), chat_chunk("bc", 2, usage=3), usage_chunk(4), "[DONE]"))
    assert rec.chunk_tokens == [1, 2] and len(rec.chunk_ns) == 2
    assert rec.output_tokens == 4 and rec.prompt_tokens == 0 and rec.ok


SPEC = {"mean_acceptance_length": 2.5, "draft_acceptance_rate": 0.375, "acceptance_histogram": [1, 0, 2, 1, 0],
        "num_spec_steps": 4, "num_accepted_draft_tokens": 6, "num_draft_tokens": 16, "num_spec_tokens": 4}


def test_per_request_spec_metrics_on_the_final_usage_chunk_are_kept():
    """vLLM 0.32 with --per-request-spec-decode-metrics puts metrics.speculative_decoding on the final usage
    chunk (shape from vllm/entrypoints/generate/base/protocol.py, SpeculativeDecodingMetrics)."""
    body = sse(chat_chunk("a", 1, usage=1), chat_chunk("bcd", 3, usage=4),
               {"choices": [], "usage": {"completion_tokens": 4}, "metrics": {"speculative_decoding": SPEC}},
               "[DONE]")
    rec, _ = run(body)
    assert (rec.spec_drafted, rec.spec_accepted, rec.spec_steps) == (16, 6, 4)
    assert rec.chunk_tokens == [1, 3] and rec.output_tokens == 4


def test_llamacpp_timings_give_drafted_and_accepted_without_steps():
    """llama.cpp's server answers with timings.draft_n / draft_n_accepted (constructed from its README's field
    names, tools/server/README.md)."""
    body = sse(chat_chunk("ab", 2), {"choices": [], "timings": {"draft_n": 9, "draft_n_accepted": 5}}, "[DONE]")
    rec, _ = run(body)
    assert (rec.spec_drafted, rec.spec_accepted, rec.spec_steps) == (9, 5, None)


LLAMACPP = Path(__file__).parents[2] / "fixtures" / "llamacpp"


def test_llamacpp_timings_on_its_final_usage_chunk_are_kept():
    """llama-server's streamed chat puts timings on its last chunk, the usage chunk with no choices
    (tools/server/server-task.cpp to_json_oaicompat_chat_stream; constructed, tests/fixtures/llamacpp/README.md)."""
    body = (LLAMACPP / "chat-stream-draft-timings.sse").read_bytes()
    events = [json.loads(line[6:]) for line in body.decode().splitlines() if line.startswith("data: {")]
    timings = events[-1]["timings"]
    rec, _ = run(body)
    assert (rec.spec_drafted, rec.spec_accepted) == (timings["draft_n"], timings["draft_n_accepted"])
    assert (rec.spec_steps, rec.spec_histogram, rec.spec_step_accepted, rec.spec_k) == (None, None, None, None)
    assert rec.output_tokens == events[-1]["usage"]["completion_tokens"]


def test_llamacpp_timings_without_a_draft_leave_the_counts_unknown():
    """llama-server writes draft_n and draft_n_accepted only when draft_n > 0 (result_timings::to_json)."""
    text = (LLAMACPP / "chat-stream-draft-timings.sse").read_text()
    undrafted = text.replace(',"draft_n":12,"draft_n_accepted":7', "")
    assert undrafted != text
    rec, _ = run(undrafted.encode())
    assert rec.ok and (rec.spec_drafted, rec.spec_accepted) == (None, None)


@pytest.mark.parametrize("extra", [{}, {"metrics": None}, {"metrics": {"speculative_decoding": None}},
                                   {"metrics": {"speculative_decoding": {"num_draft_tokens": "9"}}},
                                   {"timings": {"draft_n": None}}, {"metrics": []}])
def test_answers_without_usable_spec_counts_leave_the_record_unknown(extra):
    rec, _ = run(sse(chat_chunk("ab", 2), {"choices": [], **extra}, "[DONE]"))
    assert rec.ok and (rec.spec_drafted, rec.spec_accepted, rec.spec_steps) == (None, None, None)
    assert "spec_drafted" not in json.loads(rec.model_dump_json())


def test_counts_that_are_not_integers_are_left_unknown_one_by_one():
    spec = {**SPEC, "num_accepted_draft_tokens": "6", "num_spec_steps": 4.0}
    rec, _ = run(sse(chat_chunk("ab", 2), {"choices": [], "metrics": {"speculative_decoding": spec}}, "[DONE]"))
    assert (rec.spec_drafted, rec.spec_accepted, rec.spec_steps) == (16, None, None)
    rec, _ = run(sse(chat_chunk("ab", 2), {"choices": [], "timings": {"draft_n": 9, "draft_n_accepted": 5.5}}, "[DONE]"))
    assert (rec.spec_drafted, rec.spec_accepted) == (9, None)


def test_vllm_detailed_per_step_lists_are_kept_in_order():
    """vLLM 0.32 --per-request-spec-decode-metrics detailed adds per_step_accepted / per_step_drafted
    (vllm/v1/metrics/stats.py RequestSpecDecodeMetrics.to_dict): one entry per pass that had a draft."""
    detailed = {**SPEC, "per_step_accepted": [2, 0, 3, 2], "per_step_drafted": [4, 4, 4, 4]}
    body = sse(chat_chunk("a", 1, usage=1), chat_chunk("bcd", 3, usage=4),
               {"choices": [], "usage": {"completion_tokens": 4}, "metrics": {"speculative_decoding": detailed}},
               "[DONE]")
    rec, _ = run(body)
    assert rec.spec_step_accepted == [2, 0, 3, 2] and rec.spec_step_drafted == [4, 4, 4, 4]
    assert rec.spec_histogram == SPEC["acceptance_histogram"] and rec.spec_k == 4
    rec, _ = run(sse(chat_chunk("ab", 2), {"choices": [], "metrics": {"speculative_decoding": SPEC}}, "[DONE]"))
    assert (rec.spec_step_accepted, rec.spec_step_drafted) == (None, None)  # the summary level lists none


SGLANG = Path(__file__).parents[2] / "fixtures" / "sglang"


def sglang_details(answer: dict) -> dict:
    return answer["sglext"]["spec_tokens_details"]


def test_sglang_spec_tokens_details_streamed_on_their_own_chunk_are_kept():
    """SGLang with return_spec_tokens_details: sglext.spec_tokens_details on a chunk with no choices after
    the content (constructed, tests/fixtures/sglang/README.md); the record takes its passes, accepted and
    proposed drafts and histogram, and no per-pass lists or draft length, which SGLang does not give."""
    body = (SGLANG / "chat-stream-spec-tokens-details.sse").read_bytes()
    events = [json.loads(line[6:]) for line in body.decode().splitlines() if line.startswith("data: {")]
    details = next(sglang_details(e) for e in events if "sglext" in e)
    rec, _ = run(body)
    assert (rec.spec_steps, rec.spec_accepted, rec.spec_drafted) == (
        details["spec_verify_ct"], details["spec_num_correct_drafts"], details["spec_num_proposed_drafts"])
    assert rec.spec_histogram == details["spec_correct_drafts_histogram"]
    assert (rec.spec_step_accepted, rec.spec_step_drafted, rec.spec_k) == (None, None, None)
    # the chunks are the passes: the prefill's token, then accepted + 1 per pass, as the histogram says
    hist = details["spec_correct_drafts_histogram"]
    assert sorted(rec.chunk_tokens[1:]) == sorted(j + 1 for j, n in enumerate(hist) for _ in range(n))
    assert rec.chunk_tokens[0] == 1 and rec.output_tokens == events[-1]["usage"]["completion_tokens"]


def test_sglang_spec_tokens_details_of_a_whole_answer_are_read():
    answer = json.loads((SGLANG / "completion-spec-tokens-details.json").read_text())
    rec = RequestRecord(prompt_id="p", category="open", api="completions")
    client_mod._spec_counts(answer, rec)
    details = sglang_details(answer)
    assert (rec.spec_steps, rec.spec_accepted, rec.spec_drafted, rec.spec_histogram) == (
        details["spec_verify_ct"], details["spec_num_correct_drafts"], details["spec_num_proposed_drafts"],
        details["spec_correct_drafts_histogram"])


@pytest.mark.parametrize("ext", [
    {"spec_tokens_details": [{"spec_verify_ct": 4, "spec_num_correct_drafts": 6}]},  # n > 1: one per choice
    {"spec_tokens_details": {"spec_num_correct_drafts": 6, "spec_num_proposed_drafts": 12}},  # no passes
    {"spec_tokens_details": {"spec_verify_ct": True}}, {"cached_tokens_details": {"device": 4}}, None, []])
def test_sglang_answers_without_usable_details_leave_the_record_unknown(ext):
    rec, _ = run(sse(chat_chunk("ab", 2), {"choices": [], "usage": None, "sglext": ext}, "[DONE]"))
    assert rec.ok and (rec.spec_drafted, rec.spec_accepted, rec.spec_steps, rec.spec_histogram) == (None,) * 4


def test_sglang_counts_missing_or_not_integers_are_left_unknown_one_by_one():
    """SGLang fills a missing count with 0 and a missing histogram with []: [] is no histogram."""
    details = {"spec_verify_ct": 4, "spec_num_correct_drafts": 6.0, "spec_correct_drafts_histogram": []}
    rec, _ = run(sse(chat_chunk("ab", 2), {"choices": [], "sglext": {"spec_tokens_details": details}}, "[DONE]"))
    assert (rec.spec_steps, rec.spec_accepted, rec.spec_drafted, rec.spec_histogram) == (4, None, None, None)


# Edges of the streaming client: SSE framing across reads (a CR at the end of a read, a BOM), what is
# read after the stream is over for the client, the fallback JSON parser, the end of the body after [DONE],
# and the wiring of a client to its server (TLS trust, connection limit, read timeout, base URL).
BOM = b"\xef\xbb\xbf"


def sse_client(*events) -> bytes:
    return b"".join(b"data: " + (e.encode() if isinstance(e, str) else orjson.dumps(e)) + b"\n\n" for e in events)


def chat_chunk_client(text, usage=None):
    chunk = {"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}
    if usage is not None:
        chunk["usage"] = {"prompt_tokens": 4, "completion_tokens": usage}
    return chunk


class Answer_client:
    """One HTTP answer; ``body`` arrives in one read, or one read per item when it is a list."""

    def __init__(self, body, status=200, content_type="text/event-stream"):
        self.status, self.content_type = status, content_type
        self.reads = body if isinstance(body, list) else [body]

    async def read(self) -> bytes:
        return b"".join(self.reads)

    async def chunks(self):
        for piece in self.reads:
            yield piece

    async def finish(self):
        pass


class Scripted_client:
    def __init__(self, answer: Answer_client):
        self.answer = answer

    @contextlib.asynccontextmanager
    async def post_stream(self, path, body):
        yield self.answer


def send(body, prompt=CHAT, **answer):
    return asyncio.run(stream_request(Scripted_client(Answer_client(body, **answer)), prompt, "m", RequestSettings(), run_t0_ns=0))


# --- the event loop ---------------------------------------------------------------------------------------------

def test_run_falls_back_to_asyncio_without_uvloop(monkeypatch):
    monkeypatch.setitem(sys.modules, "uvloop", None)  # `import uvloop` now fails as if it were not installed

    async def answer():
        return type(asyncio.get_running_loop()).__module__.split(".")[0], 42

    assert run_client(answer()) == ("asyncio", 42)


# --- SSE framing across reads ---------------------------------------------------------------------------------

def frame(*reads: bytes) -> list[list[bytes]]:
    parser = SSEParser()
    return [parser.feed(r) for r in reads]


def test_a_cr_ending_one_read_is_a_line_end_only_once():
    # "data: a" CR | "data: b" | "x" LF LF: the CR ended the first line; the second line runs on into the third read
    assert frame(b"data: a\r", b"data: b", b"x\n\n") == [[], [], [b"a\nbx"]]


def test_a_bom_after_an_empty_read_is_still_the_streams_first_bytes():
    assert frame(b"", BOM + b"data: a\n\n") == [[], [b"a"]]


def test_a_bom_later_in_the_stream_is_not_dropped():
    # only the stream's first bytes may be a BOM; later, "\ufeffdata" is an unknown field name (ignored)
    assert frame(b"data: a\n\n", BOM + b"data: b\n\n", b"data: c\n\n") == [[b"a"], [], [b"c"]]


# --- what is read after the stream is over for the client -----------------------------------------------------

def test_events_after_done_are_not_read():
    for body in (sse_client(chat_chunk_client("a", 1), "[DONE]", chat_chunk_client("b", 2)),  # in the same read
                 [sse_client(chat_chunk_client("a", 1), "[DONE]"), sse_client(chat_chunk_client("b", 2))]):  # in a later read
        rec = send(body)
        assert rec.ok and rec.text == "a" and rec.chunk_tokens == [1] and rec.output_tokens == 1


def test_events_after_an_error_event_in_the_same_read_are_not_read():
    rec = send(sse_client({"error": {"message": "overloaded"}}, chat_chunk_client("a", 1), "[DONE]"))
    assert rec.error == "server error in stream: {'message': 'overloaded'}" and rec.error_kind == "server_error"
    assert rec.text == "" and rec.chunk_ns == [] and rec.output_tokens == 0


def test_events_after_a_malformed_event_are_not_read():
    for body in (sse_client("{not json", chat_chunk_client("a", 1), "[DONE]"), [sse_client("{not json"), sse_client(chat_chunk_client("a", 1), "[DONE]")]):
        rec = send(body)
        assert rec.error == "malformed SSE data: '{not json'" and rec.error_kind == "malformed"
        assert rec.text == "" and rec.chunk_ns == []


def test_malformed_data_that_is_not_utf8_is_shown_with_replacement_characters():
    rec = send(b"data: \xff\xfe{\n\n")
    assert rec.error == "malformed SSE data: '\ufffd\ufffd{'" and rec.error_kind == "malformed"


def test_a_non_sse_answer_names_its_content_type():
    rec = send(b'{"x": 1}', content_type="application/json")
    assert rec.error == ("SSEError: Expected response header Content-Type to contain 'text/event-stream', "
                         "got 'application/json'")
    assert rec.error_kind == "malformed" and not rec.ok


# --- JSON: orjson first, Python's json for what orjson refuses --------------------------------------------------

def test_nan_that_only_pythons_json_reads_is_a_value_not_a_malformed_chunk():
    chunk = (b'{"choices": [{"index": 0, "text": "a", "logprobs": {"tokens": ["a"], "token_logprobs": [NaN], '
             b'"top_logprobs": null}}], "usage": {"prompt_tokens": 2, "completion_tokens": 1}}')
    rec = send(b"data: " + chunk + b"\n\ndata: [DONE]\n\n", prompt=COMPLETION)
    assert rec.ok and rec.error is None and rec.text == "a" and rec.tokens == ["a"]
    assert len(rec.token_logprobs) == 1 and math.isnan(rec.token_logprobs[0])


def test_ordinary_chunks_never_reach_the_slow_fallback_parser(monkeypatch):
    class Refused(Exception):
        pass

    def slow(data):
        raise Refused(data)

    monkeypatch.setattr(client_mod, "json", types.SimpleNamespace(loads=slow))
    rec = send(sse_client(chat_chunk_client("a", 1), chat_chunk_client("b", 2), "[DONE]"))
    assert rec.ok and rec.text == "ab"


# --- parsed fields ---------------------------------------------------------------------------------------------

def test_a_completions_chunk_without_text_adds_no_text():
    last = {"choices": [{"index": 0, "text": "", "finish_reason": "length"}], "usage": {"completion_tokens": 1}}
    nulled = {"choices": [{"index": 0, "text": None}], "usage": {"completion_tokens": 1}}
    rec = send(sse_client({"choices": [{"index": 0, "text": "a"}], "usage": {"completion_tokens": 1}}, nulled, last,
                   "[DONE]"), prompt=COMPLETION)
    assert rec.text == "a" and rec.chunk_tokens == [1] and rec.finish_reason == "length" and rec.ok


def test_prompt_tokens_stay_unknown_without_usage():
    rec = send(sse_client(chat_chunk_client("a"), chat_chunk_client("b"), "[DONE]"))
    assert rec.ok and rec.prompt_tokens is None and rec.token_source == "chunks" and rec.output_tokens == 2


def test_close_again_after_more_data_keeps_all_the_text():
    rec = RequestRecord(prompt_id="c", category="open", api="chat")
    state = StreamState(rec, 0, lambda: 5)
    assert state.feed(sse_client(chat_chunk_client("a", 1))) is False
    state.close()
    assert rec.text == "a"
    assert state.feed(sse_client(chat_chunk_client("b", 2))) is False
    state.close()
    assert rec.text == "ab" and rec.error is None and rec.chunk_tokens == [1, 1]


# --- the HTTP answer: content type and the end of the body after [DONE] ---------------------------------------

class Content:
    """What _AiohttpResponse.finish reads of aiohttp's body stream."""

    def __init__(self, wait):
        self.wait, self.waited = wait, False

    def is_eof(self):
        return False

    async def wait_eof(self):
        self.waited = True
        await self.wait()


def response(headers=(), wait=None):
    return types.SimpleNamespace(status=200, headers=CIMultiDict(headers), content=Content(wait))


def test_a_missing_content_type_is_empty():
    assert _AiohttpResponse(response()).content_type == ""
    assert _AiohttpResponse(response([("Content-Type", "text/event-stream")])).content_type == "text/event-stream"


def test_the_end_of_the_body_is_waited_for_only_a_moment():
    async def never():
        await asyncio.sleep(3600)

    resp = _AiohttpResponse(response(wait=never))

    async def go():
        await asyncio.wait_for(resp.finish(), 5)  # returns after DRAIN_S, quietly

    asyncio.run(go())
    assert resp._resp.content.waited


@pytest.mark.parametrize("exc", [aiohttp.ClientPayloadError("Response payload is not completed"),
                                 aiohttp.ServerDisconnectedError()])
def test_a_connection_lost_after_done_is_no_fault(exc):
    async def lost():
        raise exc

    resp = _AiohttpResponse(response(wait=lost))
    asyncio.run(resp.finish())
    assert resp._resp.content.waited


# --- the client's wiring to its server ----------------------------------------------------------------------------

def test_base_url_drops_only_trailing_slashes():
    assert StreamClient(None, "http://127.0.0.1:8000/").base_url == "http://127.0.0.1:8000"
    assert StreamClient(None, "https://gw.example/team-X//").base_url == "https://gw.example/team-X"


def self_signed(tmp):
    pytest.importorskip("cryptography")
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "specadapt client test")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = tmp / "cert.pem", tmp / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path, cert.public_bytes(serialization.Encoding.DER)


def test_ca_bundle_path_and_certifi_default_trust(tmp_path):
    cert, _key, der = self_signed(tmp_path)
    assert ssl_for(str(cert)).get_ca_certs(binary_form=True) == [der]
    import certifi
    pems = open(certifi.where()).read().split("-----END CERTIFICATE-----")
    bundle = {ssl.PEM_cert_to_DER_cert(p[p.index("-----BEGIN"):] + "-----END CERTIFICATE-----\n")
              for p in pems if "-----BEGIN CERTIFICATE-----" in p}
    assert set(ssl_for(True).get_ca_certs(binary_form=True)) == bundle


class Server:
    model_id = "m"

    def __init__(self, base_url, verify):
        self.base_url, self.verify = base_url, verify

    def headers(self):
        return {"Authorization": "Bearer k"}


async def handler(request):
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    await resp.write(sse_client(chat_chunk_client("a", 1), "[DONE]"))
    return resp


def test_the_client_for_a_server_uses_its_tls_setting_concurrency_and_timeout(tmp_path):
    cert, key, _der = self_signed(tmp_path)
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert, key)
    settings = RequestSettings(request_timeout_s=7.5)

    async def go():
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", handler)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=server_ctx)
        await site.start()
        url = f"https://127.0.0.1:{runner.addresses[0][1]}"
        out = {}
        try:
            for verify in (False, str(cert), True):
                async with client_for(target_of(Server(url + "/", verify)), settings, 3) as c:
                    rec = await stream_request(c, CHAT, "m", settings, run_t0_ns=0)
                    out[verify] = (rec.ok, rec.error_kind, rec.text, c.session.connector.limit,
                                   c.session.timeout.sock_read, c.base_url)
        finally:
            await runner.cleanup()
        return url, out

    url, out = asyncio.run(go())
    assert out[False] == (True, None, "a", 3, 7.5, url)
    assert out[str(cert)] == (True, None, "a", 3, 7.5, url)
    assert out[True][:3] == (False, "connect", "")  # a self-signed certificate is not in certifi's bundle

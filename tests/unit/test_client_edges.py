"""Edges of the streaming client: SSE framing across reads (a CR at the end of a read, a BOM), what is
read after the stream is over for the client, the fallback JSON parser, the end of the body after [DONE],
and the wiring of a client to its server (TLS trust, connection limit, read timeout, base URL)."""

import asyncio
import contextlib
import datetime
import ipaddress
import math
import ssl
import sys
import types

import aiohttp
import orjson
import pytest
from aiohttp import web
from multidict import CIMultiDict

from specadapt.load import client as client_mod
from specadapt.load.client import StreamState, run, stream_request
from specadapt.load.spread import client_for, target_of
from specadapt.records import Prompt, RequestRecord, RequestSettings
from specadapt.wire.sse import SSEParser
from specadapt.wire.stream import StreamClient, _AiohttpResponse, ssl_for

CHAT = Prompt(id="c", category="open", messages=[{"role": "user", "content": "hi"}])
COMPLETION = Prompt(id="p", category="open", prompt="once upon")
BOM = b"\xef\xbb\xbf"


def sse(*events) -> bytes:
    return b"".join(b"data: " + (e.encode() if isinstance(e, str) else orjson.dumps(e)) + b"\n\n" for e in events)


def chat_chunk(text, usage=None):
    chunk = {"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}
    if usage is not None:
        chunk["usage"] = {"prompt_tokens": 4, "completion_tokens": usage}
    return chunk


class Answer:
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


class Scripted:
    def __init__(self, answer: Answer):
        self.answer = answer

    @contextlib.asynccontextmanager
    async def post_stream(self, path, body):
        yield self.answer


def send(body, prompt=CHAT, **answer):
    return asyncio.run(stream_request(Scripted(Answer(body, **answer)), prompt, "m", RequestSettings(), run_t0_ns=0))


# --- the event loop ---------------------------------------------------------------------------------------------

def test_run_falls_back_to_asyncio_without_uvloop(monkeypatch):
    monkeypatch.setitem(sys.modules, "uvloop", None)  # `import uvloop` now fails as if it were not installed

    async def answer():
        return type(asyncio.get_running_loop()).__module__.split(".")[0], 42

    assert run(answer()) == ("asyncio", 42)


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
    for body in (sse(chat_chunk("a", 1), "[DONE]", chat_chunk("b", 2)),  # in the same read
                 [sse(chat_chunk("a", 1), "[DONE]"), sse(chat_chunk("b", 2))]):  # in a later read
        rec = send(body)
        assert rec.ok and rec.text == "a" and rec.chunk_tokens == [1] and rec.output_tokens == 1


def test_events_after_an_error_event_in_the_same_read_are_not_read():
    rec = send(sse({"error": {"message": "overloaded"}}, chat_chunk("a", 1), "[DONE]"))
    assert rec.error == "server error in stream: {'message': 'overloaded'}" and rec.error_kind == "server_error"
    assert rec.text == "" and rec.chunk_ns == [] and rec.output_tokens == 0


def test_events_after_a_malformed_event_are_not_read():
    for body in (sse("{not json", chat_chunk("a", 1), "[DONE]"), [sse("{not json"), sse(chat_chunk("a", 1), "[DONE]")]):
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
    rec = send(sse(chat_chunk("a", 1), chat_chunk("b", 2), "[DONE]"))
    assert rec.ok and rec.text == "ab"


# --- parsed fields ---------------------------------------------------------------------------------------------

def test_a_completions_chunk_without_text_adds_no_text():
    last = {"choices": [{"index": 0, "text": "", "finish_reason": "length"}], "usage": {"completion_tokens": 1}}
    nulled = {"choices": [{"index": 0, "text": None}], "usage": {"completion_tokens": 1}}
    rec = send(sse({"choices": [{"index": 0, "text": "a"}], "usage": {"completion_tokens": 1}}, nulled, last,
                   "[DONE]"), prompt=COMPLETION)
    assert rec.text == "a" and rec.chunk_tokens == [1] and rec.finish_reason == "length" and rec.ok


def test_prompt_tokens_stay_unknown_without_usage():
    rec = send(sse(chat_chunk("a"), chat_chunk("b"), "[DONE]"))
    assert rec.ok and rec.prompt_tokens is None and rec.token_source == "chunks" and rec.output_tokens == 2


def test_close_again_after_more_data_keeps_all_the_text():
    rec = RequestRecord(prompt_id="c", category="open", api="chat")
    state = StreamState(rec, 0, lambda: 5)
    assert state.feed(sse(chat_chunk("a", 1))) is False
    state.close()
    assert rec.text == "a"
    assert state.feed(sse(chat_chunk("b", 2))) is False
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
    await resp.write(sse(chat_chunk("a", 1), "[DONE]"))
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

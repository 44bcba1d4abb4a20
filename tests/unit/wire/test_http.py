"""The one wire (specadapt/wire/): its mapping of every fault to specadapt's errors, the OpenAI shapes
it parses once, its event streams, and that nothing else in specadapt imports an HTTP library."""

from __future__ import annotations

import ast
import asyncio
import socket
import subprocess
import sys
from pathlib import Path

import aiohttp
import httpx
import orjson
import pytest

from specadapt.errors import NotAServer, RequestRefused, ServerError, ServerUnreachable, SpecadaptError, UsageError
from specadapt.records import Prompt
from specadapt.wire.http import Wire, answer_json, check_url, fault_kind
from specadapt.wire.openai import error_message, first_choice, parse_detokenize, parse_tokenize, tokenize_body
from specadapt.wire.stream import describe, error_kind

ROOT = Path(__file__).resolve().parents[3]
URL = "http://srv.test"


def wire(handler, **kw) -> Wire:
    return Wire(URL, {"Authorization": "Bearer k"}, transport=httpx.MockTransport(handler), **kw)


def raising(exc):
    def handler(request):
        raise exc
    return handler


def answering(status, **kw):
    return lambda request: httpx.Response(status, **kw)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- faults below HTTP -----------------------------------------------------------------------------

def test_a_refused_connection_is_server_unreachable_with_the_hint():
    url = f"http://127.0.0.1:{closed_port()}"
    with Wire(url, timeout_s=5) as w, pytest.raises(ServerUnreachable) as err:
        w.post_json("/v1/completions", {})
    assert str(err.value).startswith(f"cannot connect to {url}: ")
    assert str(err.value).endswith("; is the server running and the URL right?")
    assert isinstance(err.value.__cause__, httpx.ConnectError) and fault_kind(err.value) == "connect"


def test_a_timeout_is_server_unreachable_and_says_so():
    with pytest.raises(ServerUnreachable) as err:
        wire(raising(httpx.ReadTimeout("slow"))).post_json("/tokenize", {})
    assert str(err.value) == f"{URL} did not answer in time (ReadTimeout)"
    assert fault_kind(err.value) == "timeout"


def test_a_certificate_that_cannot_be_verified_names_the_flags():
    exc = httpx.ConnectError("[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: self-signed certificate")
    with pytest.raises(ServerUnreachable) as err:
        wire(raising(exc)).get("/v1/models")
    assert str(err.value) == (f"the TLS certificate of {URL} could not be verified ([SSL: CERTIFICATE_VERIFY_FAILED] "
                              "certificate verify failed: self-signed certificate): pass --ca-bundle with the CA that "
                              "signed it, or --insecure to skip verification")


def test_any_other_transport_fault_is_server_unreachable():
    with pytest.raises(ServerUnreachable, match=r"^HTTP error talking to http://srv.test: RemoteProtocolError: cut$"):
        wire(raising(httpx.RemoteProtocolError("cut"))).post("/x", {})


# --- statuses -------------------------------------------------------------------------------------

def test_a_4xx_is_request_refused_with_its_status_and_the_servers_message():
    w = wire(answering(400, json={"error": {"message": "logprobs  must be\n at most 20", "type": "BadRequest"}}))
    with pytest.raises(RequestRefused) as err:
        w.post_json("/v1/completions", {"logprobs": 50})
    assert (err.value.status, err.value.server_message) == (400, "logprobs must be at most 20")
    assert str(err.value) == f"{URL}/v1/completions refused the request (HTTP 400: logprobs must be at most 20)"
    assert isinstance(err.value, ServerError)


@pytest.mark.parametrize("status", [404, 422])
def test_every_other_4xx_is_refused_too(status):
    with pytest.raises(RequestRefused) as err:
        wire(answering(status, text="nope")).post_json("/v1/x", {})
    assert err.value.status == status and err.value.server_message == "nope"


@pytest.mark.parametrize("status", [401, 403])
def test_401_and_403_ask_for_the_api_key(status):
    with pytest.raises(UsageError) as err:
        wire(answering(status)).post_json("/v1/completions", {})
    assert str(err.value) == (f"{URL}/v1/completions answered {status}: the server wants an API key; pass --api-key "
                              "or set SPECADAPT_API_KEY")
    with pytest.raises(UsageError):
        wire(answering(status)).get_json("/v1/models")


def test_a_5xx_is_a_server_error_not_a_refusal():
    with pytest.raises(ServerError) as err:
        wire(answering(503, json={"detail": "overloaded"})).post_json("/v1/completions", {})
    assert not isinstance(err.value, RequestRefused)
    assert str(err.value) == f"{URL}/v1/completions failed (HTTP 503: overloaded)"


def test_a_body_that_is_not_json_is_not_a_server():
    with pytest.raises(NotAServer, match=r"^http://srv.test answered /v1/completions with something that is not JSON$"):
        wire(answering(200, text="<html>hello</html>")).post_json("/v1/completions", {})


def test_get_json_is_none_for_a_missing_endpoint_or_a_body_that_is_not_json():
    assert wire(answering(404, text="no")).get_json("/version") is None
    assert wire(answering(200, text="not json")).get_json("/version") is None
    assert wire(answering(200, json={"version": "1"})).get_json("/version") == {"version": "1"}


def test_status_is_none_without_an_answer():
    assert wire(answering(503)).status("/health") == 503
    assert wire(raising(httpx.ConnectError("refused"))).status("/health") is None


def test_answer_json_is_the_one_mapping():
    assert answer_json(URL, "/p", 201, b'{"a": 1}') == {"a": 1}
    with pytest.raises(RequestRefused):
        answer_json(URL, "/p", 429, b"")


# --- what is sent ---------------------------------------------------------------------------------

def test_a_post_carries_the_json_body_auth_extra_headers_and_the_timeout():
    seen = []

    def handler(request):
        seen.append(request)
        return httpx.Response(200, json={"ok": True})
    w = wire(handler, timeout_s=12.5)
    assert w.post_json("/tokenize", {"a": 1}, headers={"X-Canary": "1"}) == {"ok": True}
    w.post_json("/tokenize", {"a": 2}, timeout_s=3.0)
    first, second = seen
    assert str(first.url) == f"{URL}/tokenize" and orjson.loads(first.content) == {"a": 1}
    assert first.headers["authorization"] == "Bearer k" and first.headers["x-canary"] == "1"
    assert first.headers["content-type"] == "application/json"
    assert first.extensions["timeout"]["read"] == 12.5 and second.extensions["timeout"]["read"] == 3.0
    assert "x-canary" not in second.headers


def test_for_server_takes_the_url_auth_tls_and_the_servers_transport():
    seen = []

    class Srv:
        base_url, verify = URL, "/ca.pem"
        transport = httpx.MockTransport(lambda request: seen.append(request) or httpx.Response(200, json={}))

        def headers(self):
            return {"Authorization": "Bearer s"}

    w = Wire.for_server(Srv(), timeout_s=4)
    assert (w.base_url, w.verify, w.timeout_s) == (URL, "/ca.pem", 4)
    w.get_json("/v1/models")
    assert seen[0].headers["authorization"] == "Bearer s"
    assert "Bearer" not in repr(w)


def test_the_async_client_has_one_connection_per_unit_of_concurrency():
    async def main():
        async with Wire(URL, concurrency=7) as w:
            pool = w.aclient._transport._pool
            return pool._max_connections, pool._max_keepalive_connections
    assert asyncio.run(main()) == (7, 7)


def test_apost_json_maps_like_post_json():
    def handler(request):
        body = orjson.loads(request.content)
        return httpx.Response(body["status"], json={"error": {"message": "why"}, "n": 1})

    async def main():
        async with wire(handler) as w:
            ok = await w.apost_json("/p", {"status": 200})
            with pytest.raises(RequestRefused) as err:
                await w.apost_json("/p", {"status": 400})
            return ok, err.value.status

    assert asyncio.run(main()) == ({"error": {"message": "why"}, "n": 1}, 400)

    async def unreachable():
        async with wire(raising(httpx.ConnectTimeout("slow"))) as w:
            await w.apost_json("/p", {})
    with pytest.raises(ServerUnreachable, match="did not answer in time"):
        asyncio.run(unreachable())


def test_a_wire_used_on_two_event_loops_gets_a_client_on_each():
    w = wire(answering(200, json={"n": 1}))
    assert asyncio.run(w.apost_json("/p", {})) == {"n": 1}
    assert asyncio.run(w.apost_json("/p", {})) == {"n": 1}


# --- event streams --------------------------------------------------------------------------------

def streaming(pieces: list[bytes], status=200, ctype="text/event-stream", fail: Exception | None = None):
    async def body():
        for p in pieces:
            yield p
        if fail is not None:
            raise fail

    return lambda request: httpx.Response(status, headers={"content-type": ctype}, content=body())


async def events(w: Wire) -> list[dict]:
    return [e async for e in w.stream_events("/v1/completions", {"stream": True})]


def test_stream_events_frames_events_split_over_reads_and_crlf():
    pieces = [b'data: {"choices": [{"token_ids": [1', b', 2]}]}\r', b'\n\r\n: keep-alive\r\n\r\ndata:{"choices"',
              b': [{"token_ids": [3]}]}\n\ndata: [DO', b'NE]\r\n\r\ndata: {"after": "done"}\n\n']
    got = asyncio.run(events(wire(streaming(pieces))))
    assert got == [{"choices": [{"token_ids": [1, 2]}]}, {"choices": [{"token_ids": [3]}]}]


def test_stream_events_ends_at_the_end_of_the_body_without_done():
    assert asyncio.run(events(wire(streaming([b'data: {"a": 1}\n\n', b'data: {"b"'])))) == [{"a": 1}]


def test_a_refused_stream_is_request_refused():
    with pytest.raises(RequestRefused) as err:
        asyncio.run(events(wire(streaming([b'{"error": {"message": "no streams"}}'], status=400,
                                          ctype="application/json"))))
    assert (err.value.status, err.value.server_message) == (400, "no streams")


def test_an_answer_that_is_not_an_event_stream_is_not_a_server():
    with pytest.raises(NotAServer, match="application/json, not an event stream"):
        asyncio.run(events(wire(streaming([b"{}"], ctype="application/json"))))
    with pytest.raises(NotAServer, match="not a JSON object"):
        asyncio.run(events(wire(streaming([b"data: [1, 2]\n\n"]))))


def test_a_stream_cut_midway_is_server_unreachable():
    with pytest.raises(ServerUnreachable, match="RemoteProtocolError"):
        asyncio.run(events(wire(streaming([b'data: {"a": 1}\n\n'], fail=httpx.RemoteProtocolError("peer closed")))))


# --- the OpenAI shapes (pure) ---------------------------------------------------------------------

def test_first_choice_is_the_one_parse_of_choices_0():
    assert first_choice({"choices": [{"text": "a"}, {"text": "b"}]}) == {"text": "a"}
    for bad in ({"choices": []}, {"error": "x"}, {"choices": ["text"]}, [], None, {"choices": {"0": {}}}):
        with pytest.raises(NotAServer) as err:
            first_choice(bad, "the spec-off server")
        assert str(err.value) == ("the spec-off server answered without a choice (no 'choices[0]' object): not an "
                                  "OpenAI-compatible completion")
        assert "\n" not in str(err.value)


def test_the_tokenize_body_for_text_and_chat_prompts():
    assert tokenize_body(Prompt(id="t", prompt="once upon"), "m") == {"model": "m", "prompt": "once upon"}
    chat = Prompt(id="c", messages=[{"role": "user", "content": "hi"}])
    assert tokenize_body(chat, "m") == {"model": "m", "messages": [{"role": "user", "content": "hi"}],
                                        "add_generation_prompt": True}


def test_the_tokenize_answer_is_a_list_of_ints():
    assert parse_tokenize({"tokens": [1, 2, 3], "count": 3}) == [1, 2, 3]
    for bad in ({"tokens": []}, {"tokens": [1, "2"]}, {"tokens": "1 2"}, {}, [1, 2], None, {"tokens": [1.0]}):
        with pytest.raises(NotAServer, match=r"^the server's /tokenize answer has no list of token ids \('tokens'\)$"):
            parse_tokenize(bad)


def test_the_detokenize_answer():
    assert parse_detokenize({"prompt": ""}) == "" and parse_detokenize({"prompt": None}) is None
    assert parse_detokenize("x") is None


@pytest.mark.parametrize("body, msg", [
    (b'{"error": {"message": "bad  k\\n"}}', "bad k"),
    (b'{"error": "plain"}', "plain"),
    (b'{"message": "m"}', "m"),
    (b'{"detail": "d"}', "d"),
    (b'{"other": 1}', '{"other": 1}'),
    (b"Internal\n Server Error", "Internal Server Error"),
    (b"", "no detail"),
    ("x" * 400, "x" * 300),
])
def test_the_error_message_of_a_non_2xx_body(body, msg):
    assert error_message(body) == msg


def test_check_url():
    assert check_url(" http://h:8000/v1/ ") == "http://h:8000"
    for bad in ("h:8000", "ftp://h", "http://"):
        with pytest.raises(UsageError):
            check_url(bad)


# --- the load client's faults ---------------------------------------------------------------------

def test_the_stream_clients_faults_get_a_kind_and_one_line():
    assert error_kind(aiohttp.ServerDisconnectedError()) == "disconnect"
    assert error_kind(asyncio.TimeoutError()) == "timeout"
    assert error_kind(aiohttp.InvalidURL("x")) == "other"
    assert describe(aiohttp.ClientPayloadError("a\nb")) == "ClientPayloadError: a"
    assert len(describe(aiohttp.ClientPayloadError("y" * 500))) == 300


# --- one wire ---------------------------------------------------------------------------------------

HTTP_LIBRARIES = {"httpx", "aiohttp"}


def http_importers() -> list[str]:
    """specadapt modules outside specadapt/wire/ that import an HTTP library (at any depth of the module)."""
    found = []
    for path in sorted((ROOT / "specadapt").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith("specadapt/wire/"):
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=rel)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else []
            if any(n.split(".")[0] in HTTP_LIBRARIES for n in names):
                found.append(rel)
                break
    return found


def test_no_module_outside_the_wire_imports_an_http_library():
    assert http_importers() == []


def test_the_wire_packages_pure_modules_import_no_http_library():
    code = ("import sys, specadapt.wire, specadapt.wire.sse, specadapt.wire.openai; "
            "print(sorted(m for m in ('httpx', 'aiohttp') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"


def test_every_wire_fault_is_a_specadapt_error():
    for exc in (RequestRefused("x", 400, "m"), ServerUnreachable("x"), NotAServer("x")):
        assert isinstance(exc, SpecadaptError) and exc.exit_code == 2

"""StreamClient over real loopback HTTP (an aiohttp test server in the test's own event loop): what goes
on the wire (method, path, JSON body, auth header), what comes back, the client's own chunk count."""

import asyncio

import orjson
from aiohttp import web
from aiohttp.test_utils import TestServer

from specadapt.load.client import build_body, run, stream_request
from specadapt.load.spread import client_for, target_of
from specadapt.records import Prompt, RequestSettings
from specadapt.wire.stream import connect, ssl_for

PROMPT = Prompt(id="w", messages=[{"role": "user", "content": "hi"}])
KEY = "sk-test-do-not-leak-123"


def chunk(text, usage):
    return {"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}],
            "usage": {"prompt_tokens": 3, "completion_tokens": usage}}


class FakeServer:
    """The parts of a Server that ``target_of`` reads."""

    def __init__(self, base_url):
        self.base_url, self.verify, self.model_id = base_url, False, "m"

    def headers(self):
        return {"Authorization": f"Bearer {KEY}"}


async def serve(handler):
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    return server


def test_request_on_the_wire_and_a_streamed_answer():
    seen = []

    async def handler(request):
        seen.append((request.method, request.path, request.headers.get("Authorization"),
                     request.headers.get("Content-Type"), orjson.loads(await request.read()),
                     request.transport.get_extra_info("peername")))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for part in (b": comment\r\n\r\n", b"data: " + orjson.dumps(chunk("a", 1)) + b"\r\n\r\n",
                     b"data: " + orjson.dumps(chunk("bc", 3)) + b"\n\ndata: [DONE]\n\n"):
            await resp.write(part)
        await asyncio.sleep(0.01)  # the end of the body comes a little after [DONE]
        return resp

    async def go():
        server = await serve(handler)
        try:
            settings = RequestSettings(request_timeout_s=5)
            target = target_of(FakeServer(str(server.make_url("/"))))
            async with client_for(target, settings, 2) as c:
                rec = await stream_request(c, PROMPT, target.model, settings, run_t0_ns=0)
                again = await stream_request(c, PROMPT, target.model, settings, run_t0_ns=0)
                return rec, again, c.chunks_read
        finally:
            await server.close()

    rec, again, chunks = run(go())
    assert rec.ok and rec.text == "abc" and rec.chunk_tokens == [1, 2] and rec.prompt_tokens == 3
    assert again.ok and again.text == "abc"
    assert chunks == 6  # per request two data events and [DONE]; the comment block is no event
    assert seen[0][5] == seen[1][5]  # the second request came on the first one's connection (kept after [DONE])
    method, path, auth, content_type, body, _ = seen[0]
    assert (method, path, auth, content_type) == ("POST", "/v1/chat/completions", f"Bearer {KEY}", "application/json")
    assert body == build_body(PROMPT, "m", RequestSettings())[1]


def test_http_error_body_never_carries_the_key_and_get_json_reads_a_document():
    async def handler(request):
        if request.method == "GET":
            return web.json_response({"x": [1, 2]})
        return web.Response(status=401, text="invalid key", content_type="text/plain")

    async def go():
        server = await serve(handler)
        try:
            async with connect(str(server.make_url("")), headers={"Authorization": f"Bearer {KEY}"}) as c:
                rec = await stream_request(c, PROMPT, "m", RequestSettings(), run_t0_ns=0)
                return rec, await c.get_json("/_script/log")
        finally:
            await server.close()

    rec, doc = asyncio.run(go())
    assert rec.error == "HTTP 401: invalid key" and rec.error_kind == "http_status" and KEY not in rec.model_dump_json()
    assert doc == {"x": [1, 2]}


def test_tls_settings_follow_server_verify(tmp_path):
    import ssl
    assert ssl_for(False) is False
    ctx = ssl.create_default_context()
    assert ssl_for(ctx) is ctx
    on = ssl_for(True)
    assert isinstance(on, ssl.SSLContext) and on.verify_mode == ssl.CERT_REQUIRED and on.check_hostname


def test_run_uses_uvloop_when_installed():
    async def loop_kind():
        return type(asyncio.get_running_loop()).__module__

    try:
        import uvloop  # noqa: F401
        expected = "uvloop"
    except ImportError:
        expected = "asyncio"
    assert run(loop_kind()).split(".")[0] == expected

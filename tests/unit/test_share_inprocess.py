"""The worker side of spreading load, run in this process: ``execute_share`` against a loopback server
(targets, models, auth, conversations, a failed turn and its unsent turns, every record reported once),
``client_for``'s wiring, the worker's watchdog, and ``worker_main`` with stand-ins for the parent's
events, shared value and queue (start, stop, a parent gone, an abort, a stop while a stream stalls)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
import threading
import time

import pytest
from aiohttp import web
from specadapt.load.share import Job, Share, Target, client_for, execute_share, worker_main

from specadapt.load import share as share_mod
from specadapt.load.client import stream_request
from specadapt.records import Prompt, RequestSettings


class LoopbackServer:
    """An OpenAI-style streaming server on its own thread and event loop (so that a worker's loop in the
    test's thread can reach it). The last user text decides: "fail" answers HTTP 500, "stall" never ends;
    anything else streams "re:<text>" in two chunks. ``seen`` keeps what each request carried."""

    def __init__(self):
        self.seen: list[dict] = []
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    async def handle(self, request):
        body = await request.json()
        chat = request.path.endswith("/chat/completions")
        said = body["messages"][-1]["content"] if chat else body["prompt"]
        self.seen.append({"path": request.path, "auth": request.headers.get("Authorization"), "model": body["model"],
                          "max_tokens": body["max_tokens"], "said": said,
                          "history": [m["content"] for m in body.get("messages", [])]})
        if "fail" in said:
            return web.Response(status=500, text="scripted failure")
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        if "stall" in said:
            await asyncio.sleep(30)
        answer = f"re:{said}"
        for n, part in enumerate((answer[:3], answer[3:]), start=1):
            choice = {"index": 0, "delta": {"content": part}} if chat else {"index": 0, "text": part}
            chunk = {"choices": [choice], "usage": {"prompt_tokens": 1, "completion_tokens": n}}
            await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        return resp

    async def _start(self):
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        self.runner = web.AppRunner(app, shutdown_timeout=1, handler_cancellation=True)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", 0).start()
        return f"http://127.0.0.1:{self.runner.addresses[0][1]}"

    def __enter__(self):
        self.thread.start()
        self.url = asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(10)
        return self

    def __exit__(self, *exc):
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture(scope="module")
def server():
    with LoopbackServer() as s:
        yield s


@pytest.fixture
def fresh(server):
    server.seen.clear()
    return server


def chat(pid: str, text: str, turns=None) -> Prompt:
    return Prompt(id=pid, messages=[{"role": "user", "content": text}], turns=turns)


SETTINGS = RequestSettings(max_tokens=5, request_timeout_s=10)


# --- execute_share ------------------------------------------------------------------------------------
def test_execute_share_sends_each_job_to_its_target_and_reports_every_record_once(fresh):
    url = fresh.url
    targets = [Target(url + "/a", "model-a", {"Authorization": "Bearer ka"}),
               Target(url + "/b", "model-b", {"Authorization": "Bearer kb"})]
    share = Share(worker=1, concurrency=2, jobs=(
        Job(index=2, prompt=Prompt(id="p", prompt="one"), repeat=1, target=1),
        Job(index=5, prompt=chat("conv", "hello", turns=["fail now", "never sent"]), target=0),
        Job(index=8, prompt=chat("q", "two"), repeat=2, target=0)))
    reported = []
    pairs = asyncio.run(execute_share(share, targets, SETTINGS, time.perf_counter_ns(),
                                      on_record=lambda job, rec: reported.append((job.index, rec))))
    got = [(i, r.prompt_id, r.turn, r.repeat, r.target, r.ok, r.error_kind, r.text) for i, r in pairs]
    assert got == [
        (2, "p", 0, 1, url + "/b", True, None, "re:one"),
        (5, "conv", 0, 0, url + "/a", True, None, "re:hello"),
        (5, "conv", 1, 0, url + "/a", False, "http_status", ""),
        (5, "conv", 2, 0, url + "/a", False, "not_sent", ""),
        (8, "q", 0, 2, url + "/a", True, None, "re:two"),
    ]
    assert pairs[2][1].error == "HTTP 500: scripted failure"
    assert pairs[3][1].error == "not sent: turn 1 of this conversation failed"
    # every record reported once, the unsent turn too (the same objects as returned)
    assert sorted((i, id(r)) for i, r in reported) == sorted((i, id(r)) for i, r in pairs)
    assert all(r.sent_at_ns >= 0 for _, r in pairs) and pairs[2][1].sent_at_ns >= pairs[1][1].sent_at_ns
    seen = sorted(fresh.seen, key=lambda s: s["said"])
    assert [(s["path"], s["auth"], s["model"], s["max_tokens"], s["said"], s["history"]) for s in seen] == [
        ("/a/v1/chat/completions", "Bearer ka", "model-a", 5, "fail now", ["hello", "re:hello", "fail now"]),
        ("/a/v1/chat/completions", "Bearer ka", "model-a", 5, "hello", ["hello"]),
        ("/b/v1/completions", "Bearer kb", "model-b", 5, "one", []),
        ("/a/v1/chat/completions", "Bearer ka", "model-a", 5, "two", ["two"]),
    ]


def test_execute_share_without_a_callback_returns_the_pairs(fresh):
    share = Share(worker=0, concurrency=1, jobs=(Job(index=0, prompt=chat("x", "fail", turns=["later"])),
                                                 Job(index=1, prompt=chat("y", "ok"))))
    pairs = asyncio.run(execute_share(share, [Target(fresh.url, "m")], SETTINGS, 0))
    assert [(i, r.prompt_id, r.turn, r.error_kind, r.target) for i, r in pairs] == [
        (0, "x", 0, "http_status", fresh.url), (0, "x", 1, "not_sent", fresh.url), (1, "y", 0, None, fresh.url)]


def test_client_for_carries_the_targets_url_headers_limit_and_timeout(fresh):
    target = Target(fresh.url + "/r/", "m", {"Authorization": "Bearer k"}, verify=False)

    async def go():
        async with client_for(target, RequestSettings(request_timeout_s=7.5), 3) as c:
            rec = await stream_request(c, chat("c", "hi"), "m", SETTINGS, run_t0_ns=0)
            return rec, c.base_url, c.session.connector.limit, c.session.timeout.sock_read

    rec, base_url, limit, sock_read = asyncio.run(go())
    assert (rec.ok, rec.text, base_url, limit, sock_read) == (True, "re:hi", fresh.url + "/r", 3, 7.5)
    assert [(s["path"], s["auth"]) for s in fresh.seen] == [("/r/v1/chat/completions", "Bearer k")]


def test_client_for_follows_the_targets_tls_setting(tmp_path):
    pytest.importorskip("cryptography")
    import datetime
    import ipaddress
    import ssl

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "specadapt share test")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert_path, key_path)
    server = LoopbackServer()

    async def start_tls():
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", server.handle)
        server.runner = web.AppRunner(app, shutdown_timeout=1)
        await server.runner.setup()
        await web.TCPSite(server.runner, "127.0.0.1", 0, ssl_context=ctx).start()
        return f"https://127.0.0.1:{server.runner.addresses[0][1]}"

    server._start = start_tls

    async def send(target):
        async with client_for(target, SETTINGS, 1) as c:
            return await stream_request(c, chat("t", "hi"), "m", SETTINGS, run_t0_ns=0)

    with server:
        got = {verify: asyncio.run(send(Target(server.url, "m", verify=verify)))
               for verify in (False, str(cert_path), True)}
    assert (got[False].ok, got[False].text) == (True, "re:hi")
    assert (got[str(cert_path)].ok, got[str(cert_path)].text) == (True, "re:hi")
    assert (got[True].ok, got[True].error_kind) == (False, "connect")  # self-signed: not trusted by default


# --- the watchdog ---------------------------------------------------------------------------------
class PollingSleep:
    """Stands in for asyncio.sleep in the watchdog: records each pause; ``then`` runs at the n-th."""

    def __init__(self, monkeypatch, at: int | None = None, then=None):
        self.pauses: list = []
        self.at, self.then = at, then
        real = asyncio.sleep

        async def sleep(seconds):
            self.pauses.append(seconds)
            if len(self.pauses) == self.at:
                self.then()
            if len(self.pauses) > 20:
                raise RuntimeError("the watchdog kept polling")
            await real(0)

        monkeypatch.setattr(share_mod.asyncio, "sleep", sleep)


def test_the_watchdog_polls_every_tenth_of_a_second_until_stop(monkeypatch):
    stop = threading.Event()
    polls = PollingSleep(monkeypatch, at=3, then=stop.set)
    asyncio.run(share_mod._watchdog(os.getppid(), stop))
    assert polls.pauses == [0.1, 0.1, 0.1]


def test_the_watchdog_ends_at_once_when_the_parent_is_gone_or_stop_is_set(monkeypatch):
    polls = PollingSleep(monkeypatch)
    asyncio.run(share_mod._watchdog(os.getppid() + 100_000, threading.Event()))  # not our parent: it is gone
    stop = threading.Event()
    stop.set()
    asyncio.run(share_mod._watchdog(os.getppid(), stop))
    assert polls.pauses == []


# --- worker_main ----------------------------------------------------------------------------------
class Go:
    """The start event: ``wait`` returns True from call ``opens_at`` on (never, when None)."""

    def __init__(self, opens_at: int | None):
        self.opens_at, self.waits = opens_at, []

    def wait(self, timeout):
        self.waits.append(timeout)
        if len(self.waits) > 50:
            raise RuntimeError("waited for the start too long")
        return self.opens_at is not None and len(self.waits) >= self.opens_at


class Stop:
    """The stop event: set from the start, or once ``when()`` says so; counts how often it was asked."""

    def __init__(self, is_set=False, when=None):
        self._set, self.when, self.asked = is_set, when, 0

    def is_set(self):
        self.asked += 1
        if self.asked > 100:
            raise RuntimeError("asked too often")
        return self._set or bool(self.when and self.when())


class T0:
    def __init__(self, value):
        self.value = value


class Out:
    def __init__(self):
        self.items: list[tuple] = []

    def put(self, item):
        self.items.append(item)


@pytest.fixture
def sigint():
    before = signal.getsignal(signal.SIGINT)
    yield
    signal.signal(signal.SIGINT, before)


def ready(worker: int) -> tuple:
    return ("ready", worker, os.getpid(), socket.gethostname())


def test_worker_waits_for_the_start_streams_its_share_and_says_done(fresh, sigint):
    share = Share(worker=3, concurrency=2, jobs=(Job(index=4, prompt=Prompt(id="a", prompt="hi"), repeat=1),
                                                 Job(index=6, prompt=chat("b", "yo"))))
    go, stop, out = Go(opens_at=3), Stop(), Out()
    worker_main(share, [Target(fresh.url, "m")], SETTINGS, os.getppid(), go, stop, T0(0), out)
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN  # Ctrl-C is the parent's
    assert go.waits == [0.1, 0.1, 0.1]
    assert out.items[0] == ready(3) and out.items[-1] == ("done", 3, None, None)
    records = sorted(out.items[1:-1], key=lambda item: item[2])
    assert [(kind, w, i, r.prompt_id, r.repeat, r.ok, r.text, r.target) for kind, w, i, r in records] == [
        ("record", 3, 4, "a", 1, True, "re:hi", fresh.url), ("record", 3, 6, "b", 0, True, "re:yo", fresh.url)]
    assert all(r.sent_at_ns > 0 for *_, r in records)  # from the parent's t0 (0 here) on the shared clock
    assert stop.asked < 50  # the worker ended with its work, not when asked to stop


@pytest.mark.parametrize("parent_gone, stopped", [(True, False), (False, True)])
def test_worker_gives_up_waiting_for_the_start(fresh, sigint, parent_gone, stopped):
    # the parent is gone, or says stop, while the worker waits for the start
    parent, stop, go, out = os.getppid() + (100_000 if parent_gone else 0), Stop(is_set=stopped), Go(None), Out()
    worker_main(Share(worker=0, concurrency=1, jobs=(Job(index=0, prompt=chat("x", "hi")),)),
                [Target(fresh.url, "m")], SETTINGS, parent, go, stop, T0(0), out)
    assert out.items == [ready(0)] and go.waits == [0.1] and fresh.seen == []


@pytest.mark.parametrize("stopped, t0", [(False, -1), (True, 5)])
def test_worker_sends_nothing_after_an_abort_at_the_start(fresh, sigint, stopped, t0):
    # the start came with t0 -1 (the parent aborted), or with stop set
    out = Out()
    worker_main(Share(worker=2, concurrency=1, jobs=(Job(index=0, prompt=chat("x", "hi")),)),
                [Target(fresh.url, "m")], SETTINGS, os.getppid(), Go(opens_at=1), Stop(is_set=stopped), T0(t0), out)
    assert out.items == [ready(2)] and fresh.seen == []


def test_a_stop_during_the_run_ends_a_stalled_stream_and_keeps_what_finished(fresh, sigint):
    out = Out()
    share = Share(worker=1, concurrency=2, jobs=(Job(index=0, prompt=chat("s", "stall")),
                                                 Job(index=1, prompt=chat("f", "fast"))))
    stop = Stop(when=lambda: any(item[0] == "record" for item in out.items))
    worker_main(share, [Target(fresh.url, "m")], RequestSettings(max_tokens=5, request_timeout_s=20),
                os.getppid(), Go(opens_at=1), stop, T0(time.perf_counter_ns()), out)
    assert [item[:3] for item in out.items] == [ready(1)[:3], ("record", 1, 1), ("done", 1, None)]
    assert out.items[1][3].text == "re:fast"


def test_a_share_that_fails_ends_the_worker_quietly(fresh, sigint, caplog):
    out = Out()
    share = Share(worker=0, concurrency=1, jobs=(Job(index=0, prompt=chat("x", "hi"), target=1),))  # no target 1
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        worker_main(share, [Target(fresh.url, "m")], SETTINGS, os.getppid(), Go(opens_at=1), Stop(), T0(0), out)
    assert out.items == [ready(0), ("done", 0, None, None)]
    assert not [r for r in caplog.records if "never retrieved" in r.getMessage()]

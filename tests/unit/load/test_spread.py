"""Sending a share, run in this process against a loopback server: ``execute_share`` (targets, models,
auth, conversations, a failed turn and its unsent turns, every record reported once with its job,
stamps, open loop, duration), the clients kept across runs (``ClientCache``), ``client_for`` and TLS,
targets made portable for other processes, ``worker_main`` with stand-ins for the parent's queues
and events, and ``Executor.run`` in this process (watch, accept, progress, Ctrl-C)."""
from __future__ import annotations
import asyncio
import datetime
import functools
import ipaddress
import json
import os
import pickle
import queue
import signal
import socket
import ssl
import threading
import time
import pytest
from aiohttp import web
from specadapt.load import executors, plan, spread
from specadapt.load.client import stream_request
from specadapt.load.engine import Job, LoadEngine, key
from specadapt.load.executors import worker_main
from specadapt.load.plan import Share, Stamp
from specadapt.load.spread import (
    CA_BUNDLE_ATTR,
    INTERRUPTED,
    ClientCache,
    InProcess,
    Target,
    client_for,
    execute_share,
    portable,
    target_of,
)
from specadapt.records import Prompt, RequestRecord, RequestSettings, WorkerInfo
import contextlib
import certifi  # httpx's CA bundle (a dependency of httpx)
from specadapt.load import spread
from specadapt.load.engine import Job
from specadapt.load.plan import Share
from specadapt.load.spread import ClientCache, Target


class LoopbackServer:
    """An OpenAI-style streaming server on its own thread and event loop (so that a worker's loop in the
    test's thread can reach it). The last user text decides: "fail" answers HTTP 500, "stall" never ends,
    "hold:X" waits (10 s at most) until a request "release:X" has come; anything else streams
    "re:<text>" in two chunks. ``seen`` keeps what each request carried, in the order they came."""

    def __init__(self):
        self.seen: list[dict] = []
        self.events: dict[str, asyncio.Event] = {}
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def event(self, name: str) -> asyncio.Event:
        return self.events.setdefault(name, asyncio.Event())

    async def handle(self, request):
        body = await request.json()
        chat = request.path.endswith("/chat/completions")
        said = body["messages"][-1]["content"] if chat else body["prompt"]
        self.seen.append({"path": request.path, "auth": request.headers.get("Authorization"), "model": body["model"],
                          "max_tokens": body["max_tokens"], "said": said,
                          "history": [m["content"] for m in body.get("messages", [])]})
        if "fail" in said:
            return web.Response(status=500, text="scripted failure")
        if said.startswith("release:"):
            self.event(said.split(":", 1)[1]).set()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        if "stall" in said:
            await asyncio.sleep(30)
        answer = f"re:{said}"
        if said.startswith("hold:"):
            try:
                await asyncio.wait_for(self.event(said.split(":", 1)[1]).wait(), 10)
            except TimeoutError:
                answer = "never released"
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
    server.events.clear()
    return server


def chat(pid: str, text: str, turns=None) -> Prompt:
    return Prompt(id=pid, messages=[{"role": "user", "content": text}], turns=turns)


SETTINGS = RequestSettings(max_tokens=5, request_timeout_s=10)


def said(server) -> list[str]:
    return sorted(s["said"] for s in server.seen)


def in_order(pairs):
    return sorted(pairs, key=lambda p: key(*p))


# --- execute_share ------------------------------------------------------------------------------------
def test_execute_share_sends_each_job_to_its_target_and_reports_every_record_once(fresh):
    url = fresh.url
    targets = [Target(url + "/a", "model-a", {"Authorization": "Bearer ka"}),
               Target(url + "/b", "model-b", {"Authorization": "Bearer kb"})]
    share = Share(worker=1, settings=SETTINGS, concurrency=2, jobs=(
        Job(index=2, prompt=Prompt(id="p", prompt="one"), repeat=1, target=1),
        Job(index=5, prompt=chat("conv", "hello", turns=["fail now", "never sent"]), target=0, copy_index=3),
        Job(index=8, prompt=chat("q", "two"), repeat=2, target=0)))
    reported = []
    pairs = asyncio.run(execute_share(share, targets, time.perf_counter_ns(),
                                      on_record=lambda job, rec: reported.append((job, rec))))
    got = [(j.index, r.prompt_id, r.turn, r.repeat, r.replica, r.target, r.ok, r.error_kind, r.text)
           for j, r in in_order(pairs)]
    assert got == [  # by (repeat, copy, job index, turn)
        (5, "conv", 0, 0, 3, url + "/a", True, None, "re:hello"),
        (5, "conv", 1, 0, 3, url + "/a", False, "http_status", ""),
        (5, "conv", 2, 0, 3, url + "/a", False, "not_sent", ""),
        (2, "p", 0, 1, 0, url + "/b", True, None, "re:one"),
        (8, "q", 0, 2, 0, url + "/a", True, None, "re:two"),
    ]
    conv = [r for j, r in in_order(pairs) if j.index == 5]
    assert conv[1].error == "HTTP 500: scripted failure"
    assert conv[2].error == "not sent: turn 1 of this conversation failed"
    # every record reported once, the unsent turn too, with its own job (the same objects as returned)
    assert [(id(j), id(r)) for j, r in reported] == [(id(j), id(r)) for j, r in pairs]
    assert len({id(r) for _, r in pairs}) == 5
    assert all(any(j is planned for planned in share.jobs) for j, _ in pairs)
    assert all(r.sent_at_ns >= 0 for _, r in pairs) and conv[1].sent_at_ns >= conv[0].sent_at_ns
    seen = sorted(fresh.seen, key=lambda s: s["said"])
    assert [(s["path"], s["auth"], s["model"], s["max_tokens"], s["said"], s["history"]) for s in seen] == [
        ("/a/v1/chat/completions", "Bearer ka", "model-a", 5, "fail now", ["hello", "re:hello", "fail now"]),
        ("/a/v1/chat/completions", "Bearer ka", "model-a", 5, "hello", ["hello"]),
        ("/b/v1/completions", "Bearer kb", "model-b", 5, "one", []),
        ("/a/v1/chat/completions", "Bearer ka", "model-a", 5, "two", ["two"]),
    ]


def test_execute_share_without_a_callback_returns_the_pairs_in_the_closed_loop_order(fresh):
    share = Share(worker=0, settings=SETTINGS, concurrency=1, jobs=(
        Job(index=0, prompt=chat("x", "fail", turns=["later"])), Job(index=1, prompt=chat("y", "ok"))))
    pairs = asyncio.run(execute_share(share, [Target(fresh.url, "m")], 0))
    assert [(j.index, r.prompt_id, r.turn, r.error_kind, r.target) for j, r in pairs] == [
        (0, "x", 0, "http_status", fresh.url), (0, "x", 1, "not_sent", fresh.url), (1, "y", 0, None, fresh.url)]
    assert said(fresh) == ["fail", "ok"]  # the unsent turn never reached the server


def test_execute_share_uses_the_shares_request_settings(fresh):
    share = Share(worker=0, settings=RequestSettings(max_tokens=17, request_timeout_s=10), concurrency=1,
                  jobs=(Job(prompt=chat("a", "hi")),))
    (pair,) = asyncio.run(execute_share(share, [Target(fresh.url, "served")], 0))
    assert pair[1].ok and [(s["model"], s["max_tokens"]) for s in fresh.seen] == [("served", 17)]


@pytest.mark.parametrize("stamp, side, concurrency, rate, warmup", [
    (Stamp(), "", 1, None, False),  # nothing stamped: the records as sent
    (Stamp(side="on", concurrency=6), "on", 6, None, False),
    (Stamp(side="off", concurrency=0, request_rate=12.5, warmup=True), "off", 0, 12.5, True),
    (Stamp(request_rate=float("inf")), "", 1, float("inf"), False),
])
def test_the_stamp_marks_every_record_the_unsent_turns_too(fresh, stamp, side, concurrency, rate, warmup):
    share = Share(worker=0, settings=SETTINGS, concurrency=2, stamp=stamp, jobs=(
        Job(index=0, prompt=chat("c", "fail", turns=["more"])), Job(index=1, prompt=Prompt(id="p", prompt="x"))))
    pairs = asyncio.run(execute_share(share, [Target(fresh.url, "m")], 0))
    assert sorted(r.error_kind or "ok" for _, r in pairs) == ["http_status", "not_sent", "ok"]
    assert [(r.side, r.concurrency, r.request_rate, r.warmup, r.target) for _, r in pairs] == \
        [(side, concurrency, rate, warmup, fresh.url)] * 3


def test_an_open_loop_share_sends_on_the_offsets_without_waiting_for_a_free_stream(fresh):
    t0 = time.perf_counter_ns()
    share = Share(worker=0, settings=SETTINGS, concurrency=None, jobs=(
        Job(index=0, prompt=chat("held", "hold:o"), offset_ns=0),
        Job(index=1, prompt=chat("conv", "first", turns=["second"]), offset_ns=60_000_000),
        Job(index=2, prompt=chat("rel", "release:o"), offset_ns=30_000_000)))
    pairs = asyncio.run(execute_share(share, [Target(fresh.url, "m")], t0))
    got = {(r.prompt_id, r.turn): r for _, r in pairs}
    # the held request was answered only once the later arrival had come: nothing waited for it
    assert got["held", 0].text == "re:hold:o" and got["rel", 0].text == "re:release:o"
    assert [s["said"] for s in fresh.seen][:2] == ["hold:o", "release:o"]
    assert [(k, r.scheduled_at_ns) for k, r in sorted(got.items())] == [
        (("conv", 0), 60_000_000), (("conv", 1), None), (("held", 0), 0), (("rel", 0), 30_000_000)]
    for (_, turn), r in got.items():  # sent on the schedule (no earlier than it), from the share's t0
        if turn == 0:
            assert r.sent_at_ns >= r.scheduled_at_ns - 1_000_000
    assert got["conv", 1].sent_at_ns >= got["conv", 0].sent_at_ns
    assert all(r.ok and r.target == fresh.url for r in got.values())


def test_a_closed_share_with_a_duration_cycles_its_jobs_counting_the_passes(fresh, monkeypatch):
    """The engine's clock, injected: one second passes per finished record, so with 2.5 s three
    jobs start (the share's two, then the first again as the next pass) and no more."""
    done: list = []
    t0 = time.perf_counter_ns()
    monkeypatch.setattr(spread, "LoadEngine", functools.partial(LoadEngine, clock=lambda: t0 + len(done) * 10**9))
    for cycle in ("copy_index", "repeat"):
        done.clear()
        share = Share(worker=0, settings=SETTINGS, concurrency=1, duration_s=2.5, cycle=cycle,
                      jobs=(Job(index=0, prompt=chat("a", "one"), repeat=4), Job(index=1, prompt=chat("b", "two"))))
        pairs = asyncio.run(execute_share(share, [Target(fresh.url, "m")], t0,
                                          on_record=lambda job, rec: done.append(rec)))
        got = [(j.index, r.prompt_id, j.repeat, j.copy_index, r.repeat, r.replica) for j, r in pairs]
        if cycle == "copy_index":
            assert got == [(0, "a", 4, 0, 4, 0), (1, "b", 0, 0, 0, 0), (0, "a", 4, 1, 4, 1)]
        else:
            assert got == [(0, "a", 4, 0, 4, 0), (1, "b", 0, 0, 0, 0), (0, "a", 5, 0, 5, 0)]
        assert len({key(j, r) for j, r in pairs}) == 3  # each pass is another request
    assert said(fresh) == ["one", "one", "one", "one", "two", "two"]


def test_a_duration_already_over_sends_nothing(fresh):
    share = Share(worker=0, settings=SETTINGS, concurrency=2, duration_s=0.0, jobs=(Job(prompt=chat("a", "x")),))
    assert asyncio.run(execute_share(share, [Target(fresh.url, "m")], time.perf_counter_ns())) == []
    assert fresh.seen == []


def test_an_empty_share_opens_nothing_and_returns_nothing(fresh):
    assert asyncio.run(execute_share(Share(worker=0, settings=SETTINGS, concurrency=1, jobs=()), [], 0)) == []


# --- clients kept across runs ------------------------------------------------------------------------
def test_the_cache_keeps_one_client_per_target_timeout_and_width_across_shares(fresh):
    target = Target(fresh.url, "m", {"Authorization": "Bearer k"})

    def share(text: str) -> Share:
        return Share(worker=0, settings=SETTINGS, concurrency=1, jobs=(Job(prompt=chat(text, text)),))

    async def go():
        cache = ClientCache()
        try:
            client = await cache.get(target, SETTINGS, 1)
            first = await execute_share(share("one"), [target], 0, cache=cache)
            second = await execute_share(share("two"), [target], 0, cache=cache)
            again = await cache.get(Target(fresh.url, "other model", {"Authorization": "Bearer k"}), SETTINGS, 1)
            others = [await cache.get(target, SETTINGS, 2),
                      await cache.get(target, RequestSettings(max_tokens=5, request_timeout_s=11), 1),
                      await cache.get(Target(fresh.url, "m", {"Authorization": "Bearer other"}), SETTINGS, 1),
                      await cache.get(Target(fresh.url + "/x", "m", {"Authorization": "Bearer k"}), SETTINGS, 1)]
            open_after_runs = not client.session.closed
            counted = client.chunks_read, cache.chunks_read
        finally:
            await cache.aclose()
        return client, first + second, again, others, open_after_runs, counted, client.session.closed

    client, pairs, again, others, open_after_runs, counted, closed_at_end = asyncio.run(go())
    assert [r.text for _, r in pairs] == ["re:one", "re:two"]
    # both shares streamed through the one client (its own count has both; two data events and
    # [DONE] per request), which stayed open between them and closed with the cache
    assert counted == (6, 6) and open_after_runs and closed_at_end
    assert again is client  # the model is sent in the body, not a client setting
    assert len({id(c) for c in [client, *others]}) == 5  # another width, timeout, auth or URL: another client


# --- client_for and TLS ----------------------------------------------------------------------------
def test_client_for_carries_the_targets_url_headers_limit_and_timeout(fresh):
    target = Target(fresh.url + "/r/", "m", {"Authorization": "Bearer k"}, verify=False)

    async def go():
        async with client_for(target, RequestSettings(request_timeout_s=7.5), 3) as c:
            rec = await stream_request(c, chat("c", "hi"), "m", SETTINGS, run_t0_ns=0)
            return rec, c.base_url, c.session.connector.limit, c.session.timeout.sock_read, c.session

    rec, base_url, limit, sock_read, session = asyncio.run(go())
    assert (rec.ok, rec.text, base_url, limit, sock_read) == (True, "re:hi", fresh.url + "/r", 3, 7.5)
    assert session.closed  # the context closes the client
    assert [(s["path"], s["auth"]) for s in fresh.seen] == [("/r/v1/chat/completions", "Bearer k")]


class FakeServer:
    """The parts of a Server that ``target_of`` reads."""

    def __init__(self, verify):
        self.base_url, self.model_id, self.verify = "https://h:8000", "served-model", verify

    def headers(self):
        return {"Authorization": "Bearer s"}


def test_target_of_reads_the_servers_url_model_auth_and_tls_setting():
    t = target_of(FakeServer(False))
    assert t == Target("https://h:8000", "served-model", {"Authorization": "Bearer s"}, False)
    assert target_of(FakeServer("/ca.pem")).verify == "/ca.pem"
    ctx = ssl.create_default_context()
    assert target_of(FakeServer(ctx)).verify is ctx  # the context as it is (portable() converts it)


def test_portable_turns_a_tls_context_into_the_bundle_it_came_from_and_pickles():
    named = ssl.create_default_context()
    setattr(named, CA_BUNDLE_ATTR, "/etc/ca.pem")
    base = Target("https://h:1", "m", {"Authorization": "Bearer k"})
    assert portable(Target("https://h:1", "m", {"Authorization": "Bearer k"}, named)) == \
        Target("https://h:1", "m", {"Authorization": "Bearer k"}, "/etc/ca.pem")
    assert portable(Target("https://h:1", "m", verify=ssl.create_default_context())).verify is True
    for verify in (True, False, "/ca.pem"):
        t = Target("https://h:1", "m", verify=verify)
        assert portable(t) is t
    with pytest.raises(TypeError):
        pickle.dumps(Target("https://h:1", "m", verify=named))  # why targets are made portable
    back = pickle.loads(pickle.dumps(portable(Target(base.base_url, base.model, base.headers, named))))
    assert back == Target("https://h:1", "m", {"Authorization": "Bearer k"}, "/etc/ca.pem")


def test_client_for_follows_the_targets_tls_setting(tmp_path):
    pytest.importorskip("cryptography")
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    pkey = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "specadapt share test")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(pkey.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
            .sign(pkey, hashes.SHA256()))
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(pkey.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
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

    trusting = ssl.create_default_context(cafile=str(cert_path))
    setattr(trusting, CA_BUNDLE_ATTR, str(cert_path))
    verifies = {"off": False, "bundle path": str(cert_path), "default": True, "context": trusting,
                "context, made portable": portable(Target("x", "m", verify=trusting)).verify,
                "default context": ssl.create_default_context()}
    with server:
        got = {name: asyncio.run(send(Target(server.url, "m", verify=verify))) for name, verify in verifies.items()}
    assert verifies["context, made portable"] == str(cert_path)
    assert {name: (r.ok, r.text or r.error_kind) for name, r in got.items()} == {
        "off": (True, "re:hi"), "bundle path": (True, "re:hi"), "context": (True, "re:hi"),
        "context, made portable": (True, "re:hi"),
        "default": (False, "connect"), "default context": (False, "connect")}  # self-signed: not trusted by default
    assert len(server.seen) == 4  # the refused handshakes never reached the handler


# --- worker_main ----------------------------------------------------------------------------------
class Out:
    """The parent's queue: what the worker puts; ``on_put`` sees each item as it comes."""

    def __init__(self, on_put=None):
        self.items: list[tuple] = []
        self.on_put = on_put

    def put(self, item):
        self.items.append(item)
        if self.on_put is not None:
            self.on_put(item)

    def records(self) -> list[tuple]:
        return [item for item in self.items if item[0] == "record"]


def inbox(*messages) -> queue.Queue:
    q: queue.Queue = queue.Queue()
    for m in messages:
        q.put(m)
    return q


@pytest.fixture
def sigint():
    before = signal.getsignal(signal.SIGINT)
    yield
    signal.signal(signal.SIGINT, before)


def ready(worker: int) -> tuple:
    return ("ready", worker, os.getpid(), socket.gethostname())


def test_a_worker_runs_each_share_it_is_given_says_done_and_ends_on_stop(fresh, sigint):
    one = Share(worker=3, settings=SETTINGS, concurrency=2, stamp=Stamp(side="on"), jobs=(
        Job(index=4, prompt=Prompt(id="a", prompt="hi"), repeat=1), Job(index=6, prompt=chat("b", "yo"))))
    two = Share(worker=3, settings=SETTINGS, concurrency=1, jobs=(Job(index=9, prompt=chat("c", "again")),))
    targets = [Target(fresh.url, "m")]
    out, cancel = Out(), threading.Event()
    t0 = time.perf_counter_ns()
    worker_main(3, os.getppid(), inbox(("run", one, targets, t0), ("run", two, targets, t0), ("stop",)), out, cancel)
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN  # Ctrl-C is the parent's
    kinds = [item[0] for item in out.items]
    assert kinds == ["ready", "record", "record", "done", "record", "done"]
    assert out.items[0] == ready(3) and out.items[3] == out.items[5] == ("done", 3, None, None)
    got = sorted((j.index, r.prompt_id, r.repeat, r.side, r.ok, r.text, r.target) for _, w, j, r in out.records())
    assert got == [(4, "a", 1, "on", True, "re:hi", fresh.url), (6, "b", 0, "on", True, "re:yo", fresh.url),
                   (9, "c", 0, "", True, "re:again", fresh.url)]
    assert {w for _, w, _, _ in out.records()} == {3}
    assert all(r.sent_at_ns >= 0 for *_, r in out.records())  # from the parent's t0, on the shared clock


def test_a_worker_told_to_stop_sends_nothing(fresh, sigint):
    out = Out()
    worker_main(0, os.getppid(), inbox(("stop",)), out, threading.Event())
    assert out.items == [ready(0)] and fresh.seen == []


def test_a_worker_ends_when_its_parent_is_gone(fresh, sigint):
    out = Out()
    worker_main(1, os.getppid() + 100_000, inbox(), out, threading.Event())  # not our parent: it is gone
    assert out.items == [ready(1)] and fresh.seen == []


def stalled_share(worker: int) -> Share:
    return Share(worker=worker, settings=RequestSettings(max_tokens=5, request_timeout_s=20), concurrency=2,
                 jobs=(Job(index=0, prompt=chat("s", "stall")), Job(index=1, prompt=chat("f", "fast"))))


def test_a_cancel_during_a_stalled_stream_ends_the_share_and_keeps_what_finished(fresh, sigint):
    cancel = threading.Event()
    out = Out(on_put=lambda item: item[0] == "record" and cancel.set())
    worker_main(1, os.getppid(), inbox(("run", stalled_share(1), [Target(fresh.url, "m")], time.perf_counter_ns()),
                                       ("stop",)), out, cancel)
    assert [item[:3] for item in out.items] == [ready(1)[:3], ("record", 1, out.items[1][2]), ("done", 1, None)]
    assert (out.items[1][2].index, out.items[1][3].text) == (1, "re:fast")
    assert said(fresh) == ["fast", "stall"]


def test_the_parent_gone_during_a_stalled_stream_ends_the_worker_and_keeps_what_finished(fresh, sigint,
                                                                                      monkeypatch):
    out = Out()
    parent = 424242
    monkeypatch.setattr(spread.os, "getppid", lambda: parent if not out.records() else parent + 1)
    worker_main(2, parent, inbox(("run", stalled_share(2), [Target(fresh.url, "m")], time.perf_counter_ns())),
                out, threading.Event())
    assert [item[0] for item in out.items] == ["ready", "record", "done"]
    assert out.items[1][3].prompt_id == "f" and out.items[1][3].ok


def test_an_error_in_a_share_ends_the_worker_with_it(fresh, sigint):
    """The worker process then exits with an error code, which the parent reports."""
    out = Out()
    share = Share(worker=0, settings=SETTINGS, concurrency=1, jobs=(Job(prompt=chat("x", "hi"), target=1),))
    with pytest.raises(IndexError):  # no target 1
        worker_main(0, os.getppid(), inbox(("run", share, [Target(fresh.url, "m")], 0), ("stop",)), out,
                    threading.Event())
    assert out.items == [ready(0)] and fresh.seen == []


# --- Executor.run in this process ------------------------------------------------------------------
def run_in_process(shares, targets, **kw):
    executor = InProcess()

    async def go():
        try:
            return await executor.run(shares, targets, **kw)
        finally:
            await executor.aclose()

    return executor, asyncio.run(go())


def test_a_run_gathers_every_record_once_in_the_one_process_order(fresh):
    targets = [Target(fresh.url + "/a", "m"), Target(fresh.url + "/b", "m")]
    shares = plan.split(plan.closed_jobs([chat("c", "hi", turns=["more"]), Prompt(id="p", prompt="x")], repeat=2,
                                             replicas=2), SETTINGS, 3, 2)
    seen = []
    t0 = time.perf_counter_ns() - 5 * 10**9
    executor, result = run_in_process(shares, targets, progress=seen.append, t0_ns=t0)
    assert result is executor.last and result.partial_reason is None and result.planned == 6
    assert [(r.repeat, r.prompt_id, r.turn, r.target) for r in result.records] == [
        (0, "c", 0, fresh.url + "/a"), (0, "c", 1, fresh.url + "/a"), (0, "p", 0, fresh.url + "/b"),
        (1, "c", 0, fresh.url + "/a"), (1, "c", 1, fresh.url + "/a"), (1, "p", 0, fresh.url + "/b")]
    assert sorted(map(id, seen)) == sorted(map(id, result.records))  # progress saw each record once
    assert all(r.sent_at_ns >= 5 * 10**9 for r in result.records)  # counted from the t0 given
    info = executor.infos[0]
    assert (info.jobs, info.concurrency, info.finished, info.t0_mono_ns) == (6, 2, 6, t0)  # planned requests: a conversation counts its turns


def test_a_watch_that_names_a_reason_stops_the_run_and_keeps_what_finished(fresh):
    seen = []
    share = Share(worker=0, settings=RequestSettings(max_tokens=5, request_timeout_s=20), concurrency=1, jobs=(
        Job(index=0, prompt=chat("a", "first")), Job(index=1, prompt=chat("s", "stall")),
        Job(index=2, prompt=chat("n", "never"))))
    polls = []

    def watch():
        polls.append(len(seen))
        return "the vllm server exited" if seen else None

    executor, result = run_in_process([share], [Target(fresh.url, "m")], progress=seen.append, watch=watch)
    assert result.partial_reason == "the vllm server exited" and result is executor.last
    assert [(r.prompt_id, r.ok) for r in result.records] == [("a", True)] and seen == result.records
    assert said(fresh) == ["first", "stall"]  # the job after the stalled one was never sent
    assert polls[-1] == 1 and result.planned == 3


def test_accept_drops_a_failed_record_and_is_asked_about_failures_only(fresh):
    asked, seen = [], []

    async def accept(rec):
        asked.append(rec.prompt_id)
        return rec.prompt_id != "dying"

    share = Share(worker=0, settings=SETTINGS, concurrency=1, jobs=(
        Job(index=0, prompt=chat("dying", "fail")), Job(index=1, prompt=chat("bad", "fail too")),
        Job(index=2, prompt=chat("ok", "fine"))))
    executor, result = run_in_process([share], [Target(fresh.url, "m")], progress=seen.append, accept=accept)
    assert [(r.prompt_id, r.ok) for r in result.records] == [("bad", False), ("ok", True)]
    assert asked == ["dying", "bad"] and seen == result.records
    assert executor.infos[0].finished == 2 and result.partial_reason is None


def test_failures_are_judged_side_by_side_not_one_after_the_other(fresh):
    """Each failure's check may wait (a dying server's exit is seen a moment late): the checks of
    several failures run together, so none holds up the others or the records that succeeded."""
    release = asyncio.Event()
    in_check, most = [0], [0]

    async def accept(rec):
        in_check[0] += 1
        most[0] = max(most[0], in_check[0])
        if most[0] == 3:
            release.set()  # every failure is being judged at once
        await asyncio.wait_for(release.wait(), 10)
        in_check[0] -= 1
        return True

    share = Share(worker=0, settings=SETTINGS, concurrency=3, jobs=tuple(
        Job(index=i, prompt=chat(f"f{i}", "fail")) for i in range(3)) + (Job(index=3, prompt=chat("ok", "fine")),))
    _, result = run_in_process([share], [Target(fresh.url, "m")], accept=accept)
    assert most[0] == 3 and len(result.records) == 4


def test_without_a_started_server_a_failure_counts_at_once(monkeypatch):
    """ServerGuard over servers specadapt did not start: nothing can die under the run, so a failed
    request is accepted without waiting."""
    from specadapt.orchestration.probe import ServerGuard

    async def no_sleep(_s):
        raise AssertionError("waited")

    monkeypatch.setattr(asyncio, "sleep", no_sleep)

    class Connected:
        process = None

    guard = ServerGuard([Connected()])
    assert guard.servers == [] and guard.watch() is None
    assert asyncio.run(guard.accept(RequestRecord(prompt_id="x", category="c", api="chat", ok=False))) is True


def test_the_unsent_turns_of_a_dropped_turn_go_with_it(fresh):
    """A turn that failed because the run is stopping is no finished request, and neither are the
    turns it left unsent; a conversation whose failure counts keeps its unsent turns."""
    asked = []

    async def accept(rec):
        asked.append((rec.prompt_id, rec.turn))
        return rec.prompt_id != "dying"

    share = Share(worker=0, settings=SETTINGS, concurrency=2, jobs=(
        Job(index=0, prompt=chat("dying", "hi", turns=["fail", "third"])),
        Job(index=1, prompt=chat("bad", "fail", turns=["second"]))))
    _, result = run_in_process([share], [Target(fresh.url, "m")], accept=accept)
    assert [(r.prompt_id, r.turn, r.error_kind) for r in result.records] == [
        ("dying", 0, None), ("bad", 0, "http_status"), ("bad", 1, "not_sent")]
    assert sorted(asked) == [("bad", 0), ("dying", 1)]  # unsent turns are never asked about


def test_a_run_cancelled_like_ctrl_c_keeps_what_finished_in_last(fresh):
    executor = InProcess()
    seen = []
    share = stalled_share(0)

    async def go():
        task = asyncio.ensure_future(executor.run([share], [Target(fresh.url, "m")], progress=seen.append))
        while not seen:
            await asyncio.sleep(0.01)
        task.cancel()
        try:
            with pytest.raises(asyncio.CancelledError):
                await task
        finally:
            await executor.aclose()

    asyncio.run(go())
    assert executor.last.partial_reason == "interrupted (Ctrl-C)" != INTERRUPTED  # one process: no worker to stop
    assert [(r.prompt_id, r.ok) for r in executor.last.records] == [("f", True)]


def test_an_error_that_is_not_a_stopped_worker_is_raised(fresh):
    share = Share(worker=0, settings=SETTINGS, concurrency=1, jobs=(Job(prompt=chat("x", "hi"), target=1),))
    with pytest.raises(IndexError):
        run_in_process([share], [Target(fresh.url, "m")], watch=lambda: None)


# --- the worker pool's parent side, with stand-ins for its processes and queues ----------------------
class FakeProcess:
    def __init__(self, pid: int):
        self.pid, self.exitcode = pid, None


class Pipe:
    """The workers' queue to the parent; ``when_empty(queue, n)`` runs each time the parent finds it
    empty (the n-th time: what the workers do meanwhile)."""

    def __init__(self, when_empty):
        self.q: queue.Queue = queue.Queue()
        self.when_empty, self.empty_reads = when_empty, 0

    def get_nowait(self):
        try:
            return self.q.get_nowait()
        except queue.Empty:
            self.empty_reads += 1
            self.when_empty(self.q, self.empty_reads)
            raise

    def get(self, timeout=None):
        return self.get_nowait()


def pool_parent(when_empty) -> executors.WorkerPool:
    """A WorkerPool's parent side for two workers, without processes (nothing is spawned)."""
    pool = object.__new__(executors.WorkerPool)
    spread.Executor.__init__(pool)
    pool.n, pool.stop_grace_s = 2, 5.0
    pool.cancel = threading.Event()
    pool.inboxes = {0: queue.Queue(), 1: queue.Queue()}
    pool.procs = {0: FakeProcess(100), 1: FakeProcess(101)}
    pool.infos = {w: spread.WorkerInfo(worker=w, kind="process", jobs=0, concurrency=0) for w in range(2)}
    pool.out = Pipe(when_empty)
    return pool


def test_a_dead_worker_stops_the_run_and_keeps_what_the_others_had_finished():
    """Worker 1 dies while worker 0's finished request is still on its way in the pipe: the run
    stops with the reason and keeps that request (only the requests in flight are lost)."""
    jobs = plan.closed_jobs([Prompt(id="a", prompt="x"), Prompt(id="b", prompt="y")])
    shares = plan.split(jobs, SETTINGS, 2, 2)
    finished = spread.RequestRecord(prompt_id="a", category="c", api="completions", ok=True, text="done")
    pool: executors.WorkerPool

    def worker_1_dies(pipe, n):
        if n > 1:
            return
        pool.procs[1].exitcode = -9
        pipe.put(("record", 0, jobs[0], finished))
        pipe.put(("done", 0, None, None))

    pool = pool_parent(worker_1_dies)
    seen = []
    result = asyncio.run(pool.run(shares, [Target("http://h", "m")], progress=seen.append, t0_ns=7))
    assert result.partial_reason == "worker 1 (pid 101) exited with code -9 after 0 of 1 requests; every worker " \
                                    "was stopped"
    assert result.records == [finished] and seen == [finished] and pool.cancel.is_set()
    assert [(i.worker, i.jobs, i.finished, i.error, i.t0_mono_ns) for i in pool.infos.values()] == [
        (0, 1, 1, None, 7), (1, 1, 0, "exited with code -9", 7)]
    sent = [pool.inboxes[w].get_nowait() for w in (0, 1)]
    assert [(m[0], m[1], m[3]) for m in sent] == [("run", shares[0], 7), ("run", shares[1], 7)]


def record(pid: str) -> spread.RequestRecord:
    return spread.RequestRecord(prompt_id=pid, category="c", api="completions", ok=True, text=pid)


def test_a_stopped_run_takes_what_the_workers_finished_until_each_says_done_or_dies():
    """The run is stopped (its watch names a reason): worker 0 hands in what it had finished and says
    done; worker 1 dies without a word, and the parent stops waiting for it at once."""
    jobs = plan.closed_jobs([Prompt(id="a", prompt="x"), Prompt(id="b", prompt="y")])
    shares = plan.split(jobs, SETTINGS, 2, 2)
    late = record("a")
    pool: executors.WorkerPool
    died_at: list[int] = []

    def workers(pipe, n):
        if pool.cancel.is_set() and not died_at:
            pipe.put(("record", 0, jobs[0], late))
            pipe.put(("done", 0, None, None))
            pool.procs[1].exitcode = 1
            died_at.append(n)

    pool = pool_parent(workers)
    pool.stop_grace_s = 30.0
    result = asyncio.run(pool.run(shares, [Target("http://h", "m")], watch=lambda: "the vllm server exited"))
    assert result.partial_reason == "the vllm server exited" and result.records == [late]
    assert pool.out.empty_reads - died_at[0] <= 3  # no waiting out the grace period for the dead worker
    assert [i.finished for i in pool.infos.values()] == [1, 0]


def test_the_in_process_worker_adds_up_its_runs_and_keeps_its_clients_across_them(fresh):
    """Two runs on one InProcess: its one worker is this process (pid, host), its planned requests add
    up, its concurrency is the most any share had (an open-loop share counts 0), and both runs read
    through the same kept clients (the chunks they read are counted on the executor)."""
    executor = InProcess()
    info = executor.infos[0]
    assert (info.worker, info.kind, info.pid, info.node, info.jobs, info.concurrency) == (
        0, "process", os.getpid(), socket.gethostname(), 0, 0)
    closed = Share(worker=0, settings=SETTINGS, concurrency=2, jobs=(
        Job(index=0, prompt=chat("a", "one")), Job(index=1, prompt=chat("b", "two", turns=["more"]))))
    opened = Share(worker=0, settings=SETTINGS, concurrency=None, jobs=(Job(index=0, prompt=chat("c", "x"), offset_ns=0),))

    async def go():
        try:
            await executor.run([opened], [Target(fresh.url, "m")])
            first = executor.chunks_read, info.concurrency
            await executor.run([closed], [Target(fresh.url, "m")])
            return first, executor.chunks_read
        finally:
            await executor.aclose()

    (first, open_width), both = asyncio.run(go())
    assert open_width == 0  # an open-loop share has no stream count
    assert (info.jobs, info.concurrency, info.finished) == (1 + 3, 2, 4)
    assert 0 < first < both  # the second run's chunks counted on the same executor's clients


def test_done_text_says_of_how_many_unless_a_duration_went_past_one_pass():
    info = WorkerInfo(worker=0, kind="process", jobs=8, concurrency=1, finished=3)
    assert spread.done_text(info) == "3 of 8"
    assert spread.done_text(info.model_copy(update={"finished": 8})) == "8 of 8"
    assert spread.done_text(info.model_copy(update={"finished": 12})) == "12"


def test_a_worker_stopped_while_the_run_is_being_stopped_is_no_error():
    """When the watch stops a run, an executor whose work ends with WorkerStopped as it is cancelled
    gives the partial result with the watch's reason, and raises nothing."""

    class Stopping(spread.Executor):
        async def _execute(self, shares, targets, emit, t0):
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                raise spread.WorkerStopped("worker 0 stopped") from None

    executor = Stopping()
    executor.infos = {0: WorkerInfo(worker=0, kind="process", jobs=0, concurrency=0)}
    share = Share(worker=0, settings=SETTINGS, concurrency=1, jobs=(Job(prompt=chat("a", "x")),))
    result = asyncio.run(executor.run([share], [Target("http://unused", "m")], watch=lambda: "the server exited"))
    assert result.partial_reason == "the server exited" and result.records == []


class Scripted(spread.Executor):
    """An executor that hands the run a fixed sequence of (worker, job, record), as records from
    two workers arrive interleaved in the parent."""

    def __init__(self, sequence):
        super().__init__()
        self.sequence = sequence
        self.infos = {w: WorkerInfo(worker=w, kind="process", jobs=0, concurrency=0) for w in (0, 1)}

    async def _execute(self, shares, targets, emit, t0):
        for item in self.sequence:
            emit(*item)


def failed(pid: str, turn: int, kind: str = "http_status") -> RequestRecord:
    return RequestRecord(prompt_id=pid, category="c", api="chat", turn=turn, ok=False, error_kind=kind)


def test_each_conversation_keeps_its_own_verdict_when_workers_interleave():
    """Worker 0's conversation A fails because its server is dying (not accepted), worker 1's B fails
    on its own (accepted); their unsent turns arrive after both failures: A's go with A, B's stay. A
    turn left unsent without a judged failure here counts as it is."""
    a, b, c = (Job(index=i, prompt=chat(p, "x", turns=["y"])) for i, p in enumerate("ABC"))
    sequence = [(0, a, failed("A", 0)), (1, b, failed("B", 0)), (0, a, failed("A", 1, "not_sent")),
                (1, b, failed("B", 1, "not_sent")), (1, c, failed("C", 1, "not_sent"))]

    async def accept(rec):
        return rec.prompt_id != "A"

    executor = Scripted(sequence)
    share = Share(worker=0, settings=SETTINGS, concurrency=1, jobs=(a, b, c))
    result = asyncio.run(executor.run([share], [Target("http://unused", "m")], accept=accept))
    assert sorted((r.prompt_id, r.turn) for r in result.records) == [("B", 0), ("B", 1), ("C", 1)]
    assert (executor.infos[0].finished, executor.infos[1].finished) == (0, 3)


def test_an_executor_before_its_first_run_has_an_empty_last_result():
    """What a Ctrl-C before the first run finds: no records, no reason yet."""
    executor = spread.Executor()
    assert executor.infos == {} and executor.last.records == [] and executor.last.partial_reason is None


# load/spread.py where the tests above leave it open: the kept clients told apart


def clients(*targets: Target) -> list[int]:
    """For each target in turn, which client the cache hands out: 0 for the first client made, 1 for
    the second, ..."""

    async def go():
        cache = ClientCache()
        try:
            return [await cache.get(t, SETTINGS, 1) for t in targets]
        finally:
            await cache.aclose()

    got = asyncio.run(go())
    first_seen: list = []
    for c in got:
        if not any(c is s for s in first_seen):
            first_seen.append(c)
    return [next(i for i, s in enumerate(first_seen) if s is c) for c in got]


def test_the_cache_keeps_a_client_per_tls_setting():
    """Verification on or off, a CA bundle path and each TLS context are other settings: other clients.
    The same setting, given again, reuses its client: the same context, or an equal bundle path."""
    url = "https://h.invalid:8000"
    bundle = certifi.where()
    same_bundle = "/".join(bundle.split("/"))  # an equal path, another string object
    assert same_bundle == bundle and same_bundle is not bundle
    one, other = ssl.create_default_context(), ssl.create_default_context()
    assert clients(Target(url, "m", verify=True), Target(url, "m", verify=False), Target(url, "m", verify=bundle),
                   Target(url, "m", verify=one), Target(url, "m", verify=other), Target(url, "m", verify=True),
                   Target(url, "m", verify=False), Target(url, "other model", verify=same_bundle),
                   Target(url, "m", verify=one)) == [0, 1, 2, 3, 4, 0, 1, 2, 3]


class Finishing(spread.Executor):
    """Hands the run its records at once (no server); the run ends before any poll of ``watch``
    is due, so ``watch`` is asked once the work is done."""

    def __init__(self, records: list[RequestRecord]):
        super().__init__()
        self.records = records
        self.infos = {0: WorkerInfo(worker=0, kind="process", jobs=0, concurrency=0)}

    async def _execute(self, shares, targets, emit, t0):
        for i, rec in enumerate(self.records):
            emit(0, Job(index=i, prompt=Prompt(id=rec.prompt_id, prompt="x")), rec)


def finished(pid: str) -> RequestRecord:
    return RequestRecord(prompt_id=pid, category="c", api="completions", ok=True, text=pid)


def test_a_server_that_died_as_the_run_ended_makes_the_run_partial_with_every_record_kept():
    """Every request finished, but the watch names a reason once they had: the run says why it is
    partial (its server died at the very end) and keeps what finished; a watch with nothing to say
    leaves the run whole."""
    share = Share(worker=0, settings=SETTINGS, concurrency=1, jobs=(Job(prompt=Prompt(id="a", prompt="x")),))
    executor = Finishing([finished("a"), finished("b")])
    seen: list[RequestRecord] = []

    def watch():
        return "the vllm server exited with code -9" if len(seen) == 2 else None

    result = asyncio.run(executor.run([share], [Target("http://unused", "m")], progress=seen.append, watch=watch))
    assert result.partial_reason == "the vllm server exited with code -9"
    assert [r.prompt_id for r in result.records] == ["a", "b"] and seen == result.records
    whole = asyncio.run(Finishing([finished("a")]).run([share], [Target("http://unused", "m")], watch=lambda: None))
    assert whole.partial_reason is None and [r.prompt_id for r in whole.records] == ["a"]


def test_a_share_without_a_cache_closes_the_clients_it_opened(monkeypatch):
    """``execute_share`` without a cache opens its own clients and closes them when the share ends
    (with one, they stay open for the next run: the cache tests above)."""
    opened: list = []
    real = spread.client_for

    @contextlib.asynccontextmanager
    async def client_for(target, settings, concurrency):
        async with real(target, settings, concurrency) as client:
            opened.append(client)
            yield client

    monkeypatch.setattr(spread, "client_for", client_for)
    share = Share(worker=0, settings=SETTINGS, concurrency=1, jobs=(Job(prompt=Prompt(id="a", prompt="x")),))

    async def go():  # looked at before the event loop ends (asyncio.run closes what is left open)
        ((_, rec),) = await spread.execute_share(share, [Target("http://127.0.0.1:9", "m")], 0)
        return rec, [c.session.closed for c in opened]

    rec, closed = asyncio.run(go())
    assert (rec.ok, rec.error_kind) == (False, "connect")  # nothing listens there: no server needed
    assert closed == [True]

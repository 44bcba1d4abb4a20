"""load/spread.py where tests/unit/test_share_inprocess.py leaves it open: the kept clients told apart
by their TLS setting, and a run whose server died just as its last request finished."""

from __future__ import annotations

import asyncio
import contextlib
import ssl

import certifi  # httpx's CA bundle (a dependency of httpx)

from specadapt.load import spread
from specadapt.load.engine import Job
from specadapt.load.plan import Share
from specadapt.load.spread import ClientCache, Target
from specadapt.records import Prompt, RequestRecord, RequestSettings, WorkerInfo

SETTINGS = RequestSettings(max_tokens=5, request_timeout_s=10)


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
    (with one, they stay open for the next run: test_share_inprocess.py)."""
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

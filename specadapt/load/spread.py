"""Where a run's requests go and how they are sent: targets and their clients, ``execute_share``
(one share through the load engine from the current process's event loop) and the ``Executor``
seam with its in-process form (worker processes and Ray actors: ``load.executors``).

``execute_share`` is the one way requests are sent: the in-process executor, every worker
process and every Ray actor run it, so closed loop, open loop, duration and conversations
behave the same on every path. ``Executor.run(shares, targets)`` (a coroutine; one run is one
level or one block) brings every finished record back to this process at once (it feeds the
progress bar), so a crash, a dead server or Ctrl-C loses only the requests in flight:
``watch`` (a callable the parent polls) names a reason to stop, ``accept`` drops records that
failed because of it, and the run returns what finished with the reason
(``RunResult.partial_reason``). After Ctrl-C the executor's ``last`` holds what the
interrupted run had gathered.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import ssl
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from specadapt.errors import SpecadaptError
from specadapt.load.client import stream_request
from specadapt.wire.stream import StreamClient, connect
from specadapt.load.engine import Job, LoadEngine, OnRecord, cycle_jobs
from specadapt.load.plan import RunResult, Share, planned_turns
from specadapt.load.progress import Progress
from specadapt.records import Prompt, RequestRecord, RequestSettings, WorkerInfo

INTERRUPTED = "interrupted (Ctrl-C); every worker was stopped"
OPEN_LOOP_CONNECTIONS = 1024
"""Connections a client may open in an open-loop run (arrivals do not wait for a free stream)."""
POLL_S = 0.2


# --- where requests go ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Target:
    """What a client needs to reach one server. Picklable (for worker processes and Ray actors)
    once ``portable``: no sockets, and a TLS context carried as the CA bundle it was built from."""

    base_url: str
    model: str
    headers: dict[str, str] = field(default_factory=dict)
    verify: bool | str | ssl.SSLContext = True  # on, a CA bundle path, a context, or off


CA_BUNDLE_ATTR = "specadapt_ca_bundle"
"""A TLS context made from a CA bundle file carries the file's path under this attribute."""


def target_of(server: Any) -> Target:
    """A server (``adapters.base.Server``) as a client reaches it (a TLS context as it is: ``portable``
    turns it into the CA bundle it was made from for another process)."""
    return Target(base_url=server.base_url, model=server.model_id, headers=dict(server.headers()),
                  verify=server.verify)


def portable(target: Target) -> Target:
    """``target`` for another process: a TLS context becomes the CA bundle path it was made from
    (a context without one: default verification)."""
    if isinstance(target.verify, ssl.SSLContext):
        return replace(target, verify=getattr(target.verify, CA_BUNDLE_ATTR, None) or True)
    return target


def client_for(target: Target, settings: RequestSettings,
               concurrency: int) -> contextlib.AbstractAsyncContextManager[StreamClient]:
    """The streaming client for one target in this process (one per event loop): its auth and TLS
    settings, a connection per stream."""
    return connect(target.base_url, headers=target.headers, verify=target.verify, concurrency=concurrency,
                   request_timeout_s=settings.request_timeout_s)


class ClientCache:
    """The streaming clients of one event loop, kept open across runs (a level's or a pair's requests
    reuse their connections, as one client would): one per target, request timeout and width."""

    def __init__(self) -> None:
        self._stack = contextlib.AsyncExitStack()
        self._clients: dict[tuple, StreamClient] = {}

    async def get(self, target: Target, settings: RequestSettings, width: int) -> StreamClient:
        verify = target.verify if not isinstance(target.verify, ssl.SSLContext) else id(target.verify)
        k = (target.base_url, tuple(sorted(target.headers.items())), verify, settings.request_timeout_s, width)
        if k not in self._clients:
            self._clients[k] = await self._stack.enter_async_context(client_for(target, settings, width))
        return self._clients[k]

    @property
    def chunks_read(self) -> int:
        return sum(c.chunks_read for c in self._clients.values())

    async def aclose(self) -> None:
        await self._stack.aclose()
        self._clients.clear()


async def execute_share(share: Share, targets: Sequence[Target], t0_ns: int, on_record: OnRecord | None = None,
                        cache: ClientCache | None = None) -> list[tuple[Job, RequestRecord]]:
    """Stream ``share``'s jobs from this process's event loop, send times counted from ``t0_ns``
    (time.perf_counter_ns); (job, record) pairs, every planned turn of every job (a turn left
    unsent after a failed one is recorded as not sent). ``on_record`` sees each as it finishes.
    ``cache``: clients kept open across runs (without it, the share's own, closed at its end)."""
    used = sorted({j.target for j in share.jobs})
    width = share.concurrency if share.concurrency is not None else OPEN_LOOP_CONNECTIONS
    stamp = share.stamp
    pairs: list[tuple[Job, RequestRecord]] = []

    def finished(job: Job, rec: RequestRecord) -> None:
        rec.target = targets[job.target].base_url
        if stamp.side is not None:
            rec.side = stamp.side  # type: ignore[assignment]
        if stamp.concurrency is not None:
            rec.concurrency = stamp.concurrency
        rec.request_rate = stamp.request_rate
        pairs.append((job, rec))
        if on_record is not None:
            on_record(job, rec)

    own = cache is None
    cache = cache or ClientCache()
    try:
        clients = {t: await cache.get(targets[t], share.settings, width) for t in used}

        async def send(prompt: Prompt, job: Job, turn: int) -> RequestRecord:
            return await stream_request(clients[job.target], prompt, targets[job.target].model, share.settings, t0_ns,
                                        repeat=job.repeat, warmup=stamp.warmup)

        engine = LoadEngine(send, on_record=finished)
        if share.concurrency is None:
            await engine.open_loop(share.jobs, t0_ns)
        elif share.duration_s is not None:
            await engine.closed_loop(cycle_jobs(share.jobs, share.cycle), t0_ns, share.concurrency, share.duration_s)
        else:
            await engine.closed_loop(share.jobs, t0_ns, share.concurrency)
    finally:
        if own:
            await cache.aclose()
    return pairs


Watch = Callable[[], str | None]
"""Polled while a run goes: a reason to stop it (a managed server died), or None."""
Accept = Callable[[RequestRecord], Awaitable[bool]]
"""Whether a record counts as finished (False: it failed because of what ``watch`` reports)."""


def done_text(info: WorkerInfo) -> str:
    """'3 of 8' (finished of planned), or '12' when a duration cycled past one pass."""
    return f"{info.finished} of {info.jobs}" if info.finished <= info.jobs else str(info.finished)


class Executor:
    """Runs shares and brings their records back to this process; ``infos`` describes the workers."""

    kind = "process"
    shared_clock = True
    """Whether the workers time their records on this process's clock (one machine): then a run
    can be timed from a ``t0_ns`` given for several runs, one timeline."""
    interrupted = "interrupted (Ctrl-C)"
    """The partial reason of a run that Ctrl-C ended."""

    def __init__(self) -> None:
        self.infos: dict[int, WorkerInfo] = {}
        self.last = RunResult()

    def __enter__(self) -> Executor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop every worker (nothing to stop in this process)."""

    async def aclose(self) -> None:
        """Close what this event loop holds open (clients kept across runs)."""

    async def run(self, shares: Sequence[Share], targets: Sequence[Target], progress: Progress | None = None,
                  watch: Watch | None = None, accept: Accept | None = None, t0_ns: int | None = None) -> RunResult:
        """Run ``shares`` together (one level or one block) and gather their records. Send times
        count from ``t0_ns`` (this process's time.perf_counter_ns; default: now); Ray actors
        count from their own start instant."""
        result = self.last = RunResult(planned=planned_turns(shares))
        inbox: asyncio.Queue = asyncio.Queue()
        verdicts: dict[tuple[int, int, int], asyncio.Future] = {}  # a conversation's failed turn: does it count?
        pending: set[asyncio.Future] = set()

        def keep(worker: int, job: Job, rec: RequestRecord) -> None:
            result.pairs.append((job, rec))
            self.infos[worker].finished += 1
            if progress is not None:
                progress(rec)

        async def keep_if(verdict: asyncio.Future, worker: int, job: Job, rec: RequestRecord) -> None:
            if await verdict:
                keep(worker, job, rec)

        def take(worker: int, job: Job, rec: RequestRecord) -> None:
            """A failed request counts unless ``accept`` says it failed because the run is stopping
            (its server died); the turns it left unsent go with it. The checks run side by side."""
            if accept is None or rec.ok:
                keep(worker, job, rec)
                return
            conversation = (job.repeat, job.copy_index, job.index)
            if rec.error_kind == "not_sent":
                verdict = verdicts.get(conversation)
                if verdict is None:  # no failed turn of it was judged here
                    keep(worker, job, rec)
                    return
            else:
                verdict = verdicts[conversation] = asyncio.ensure_future(accept(rec))
            pending.add(asyncio.ensure_future(keep_if(verdict, worker, job, rec)))

        async def consume() -> None:
            while True:
                item = await inbox.get()
                try:
                    take(*item)
                finally:
                    inbox.task_done()

        consumer = asyncio.ensure_future(consume())
        t0 = time.perf_counter_ns() if t0_ns is None else t0_ns
        work = asyncio.ensure_future(self._execute(shares, targets, lambda w, j, r: inbox.put_nowait((w, j, r)), t0))
        try:
            while not work.done():
                done, _ = await asyncio.wait({work}, timeout=POLL_S)
                if done:
                    break
                reason = watch() if watch is not None else None
                if reason is not None:
                    result.partial_reason = reason
                    await self._cancel(work)
                    break
            if work.done() and not work.cancelled() and work.exception() is not None:
                if not isinstance(work.exception(), WorkerStopped):
                    raise work.exception()  # type: ignore[misc]
                result.partial_reason = result.partial_reason or str(work.exception())
            await inbox.join()
            await asyncio.gather(*pending)
            if result.partial_reason is None and watch is not None:  # it may have died at the very end
                result.partial_reason = watch()
        except asyncio.CancelledError:  # Ctrl-C: the records back so far stay in ``last``
            await self._cancel(work)
            while not inbox.empty():
                take(*inbox.get_nowait())
            result.partial_reason = self.interrupted
            raise
        finally:
            consumer.cancel()
            for task in (*pending, *verdicts.values()):  # a failure still being judged at Ctrl-C is left out
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await consumer
        return result

    async def _execute(self, shares: Sequence[Share], targets: Sequence[Target], emit: Emit, t0: int) -> None:
        raise NotImplementedError

    async def _cancel(self, work: asyncio.Future) -> None:
        work.cancel()
        with contextlib.suppress(asyncio.CancelledError, WorkerStopped):
            await work


Emit = Callable[[int, Job, RequestRecord], None]
"""An executor hands each record to the run: (worker, job, record)."""


class WorkerStopped(SpecadaptError):
    """A worker ended before its share was done (its message says which and why)."""


class InProcess(Executor):
    """Every share from this process's event loop, its clients kept open across runs until
    ``aclose``; ``chunks_read`` counts what they read."""

    kind = "process"

    def __init__(self) -> None:
        super().__init__()
        self.cache = ClientCache()
        self.infos = {0: WorkerInfo(worker=0, kind="process", pid=os.getpid(), node=socket.gethostname(), jobs=0,
                                    concurrency=0)}

    @property
    def chunks_read(self) -> int:
        return self.cache.chunks_read

    async def aclose(self) -> None:
        await self.cache.aclose()

    async def _execute(self, shares: Sequence[Share], targets: Sequence[Target], emit: Emit, t0: int) -> None:
        info = self.infos[0]
        info.jobs += planned_turns(shares)
        info.concurrency = max([info.concurrency, *(s.concurrency or 0 for s in shares)])
        if info.t0_mono_ns is None:
            info.t0_mono_ns = t0
        await asyncio.gather(*(execute_share(s, targets, t0, lambda j, r: emit(0, j, r), self.cache) for s in shares))



"""The plan of a run's requests: the jobs of one level in the order one process sends them, and
their shares over the workers (what ``load.spread`` executes and ``load.executors`` spreads).

- ``closed_jobs`` / ``rate_jobs``: the jobs of one level in the order one process sends them (job
  i to replica i mod R); at an arrival rate each with its send offset on the seeded schedule.
- ``split``: the jobs over W workers, job i to worker i mod W. Closed loop: the concurrency C
  over the workers (worker w gets C // W streams, plus one when w < C mod W; a worker needs at
  least one job and one stream, so W is cut to min(W, jobs, C)). Open loop (jobs carry their
  send offsets): the arrivals dealt round robin, W cut to min(W, jobs). With a duration each
  worker cycles its own jobs until the time is up.
- ``RunResult``: what a run brought back, its records in the one-process order whatever sent them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from pydantic import BaseModel

from specadapt.load.arrivals import arrivals_for_duration, schedule_ns
from specadapt.load.engine import CycleField, Job, key
from specadapt.records import Prompt, RequestRecord, RequestSettings
from specadapt.records.load import LoadSettings


# --- jobs and shares ------------------------------------------------------------------------------
class Stamp(BaseModel):
    """What every record of a share is marked with: its side, level and rate (None: left as sent)."""

    side: str | None = None
    concurrency: int | None = None
    request_rate: float | None = None
    warmup: bool = False


@dataclass(frozen=True)
class Share:
    """What one worker runs: its jobs with their request settings; closed loop at most
    ``concurrency`` streams at a time (with ``duration_s``: the jobs cycled, ``cycle`` counting
    the passes, none started after it), open loop on the jobs' offsets when ``concurrency`` is None."""

    worker: int
    jobs: tuple[Job, ...]
    settings: RequestSettings
    concurrency: int | None
    duration_s: float | None = None
    cycle: CycleField = "repeat"
    stamp: Stamp = field(default_factory=Stamp)


def closed_jobs(prompts: Sequence[Prompt], repeat: int = 1, copies: int = 1, replicas: int = 1,
                first_repeat: int = 0) -> list[Job]:
    """The jobs of a closed-loop run in the order one process sends them (repeat by repeat, copy
    by copy, prompt by prompt); job i to replica i mod ``replicas``."""
    if replicas < 1:
        raise ValueError("at least one replica")
    order = [(p, first_repeat + r, c) for r in range(repeat) for c in range(copies) for p in prompts]
    return [Job(index=i, prompt=p, repeat=r, copy_index=c, target=i % replicas) for i, (p, r, c) in enumerate(order)]


def rate_jobs(prompts: Sequence[Prompt], rate: float, load: LoadSettings, *, passes: int = 1, block: int | None = None,
              replicas: int = 1) -> list[Job]:
    """The jobs of one arrival-rate schedule, each with its send offset: ceil(rate * duration) arrivals
    with --duration (at rate inf, and without it, the prompt set ``passes`` times), the prompts
    cycled. ``block``: one block of an A/B run, seeded seed + block, every job of repeat ``block``
    with its pass as the copy index; else the pass is the repeat, seeded by the seed."""
    n = len(prompts) * passes
    if load.duration_s is not None and not math.isinf(rate):
        n = arrivals_for_duration(rate, load.duration_s)
    offsets = schedule_ns(rate, n, load.burstiness, load.seed + (block or 0))
    size = len(prompts)
    return [Job(index=i, prompt=prompts[i % size], offset_ns=off, target=i % replicas,
                repeat=block if block is not None else i // size, copy_index=i // size if block is not None else 0)
            for i, off in enumerate(offsets)]


def split(jobs: Sequence[Job], settings: RequestSettings, concurrency: int | None, workers: int, *,
          duration_s: float | None = None, cycle: CycleField = "repeat", stamp: Stamp | None = None) -> list[Share]:
    """``jobs`` over at most ``workers`` workers (see the module docstring)."""
    if workers < 1 or (concurrency is not None and concurrency < 1):
        raise ValueError("workers and concurrency must be at least 1")
    if not jobs:
        return []
    n = min(workers, len(jobs)) if concurrency is None else min(workers, len(jobs), concurrency)
    stamp = stamp or Stamp()
    if concurrency is None:
        return [Share(worker=w, jobs=tuple(jobs[w::n]), settings=settings, concurrency=None, stamp=stamp)
                for w in range(n)]
    base, extra = divmod(concurrency, n)
    return [Share(worker=w, jobs=tuple(jobs[w::n]), settings=settings, concurrency=base + (1 if w < extra else 0),
                  duration_s=duration_s, cycle=cycle, stamp=stamp) for w in range(n)]


# --- one run's result -----------------------------------------------------------------------------
@dataclass
class RunResult:
    """What one run brought back: every accepted record with its job, and why it stopped early
    (None when every job finished)."""

    pairs: list[tuple[Job, RequestRecord]] = field(default_factory=list)
    partial_reason: str | None = None
    planned: int = 0

    @property
    def records(self) -> list[RequestRecord]:
        """The records in the one-process order (repeat, copy, job, turn), whatever sent them."""
        keys = [key(j, r) for j, r in self.pairs]
        if len(set(keys)) != len(keys):
            raise AssertionError("a request came back twice")
        return [r for _, r in sorted(self.pairs, key=lambda p: key(*p))]


def planned_turns(shares: Sequence[Share]) -> int:
    """Requests the shares plan (a conversation's turns each; with a duration, one pass)."""
    return sum(1 + len(j.prompt.turns or []) for s in shares for j in s.jobs)

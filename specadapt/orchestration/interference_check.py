"""The interference check before a compare: do the two servers stall each other's first token?

A few short requests of one prompt (its first message, MAX_TOKENS tokens), one at a time: ALONE
to the spec-off server alone, ALONE to the spec-on server alone, then PAIRS pairs alternating
off, on, off, on, ... So each side's first tokens right after its own request (alone) stand
against those right after the other side's. 2 x ALONE + 2 x PAIRS requests (20): a second or so
on a GPU, some seconds on a CPU. They take the compare's own way (load.plan.split, the run's
executor, the load client), are judged by the rule the run's own records are
(analysis/interference.py), and are not part of the run.

The rule's typical first token stands while more than a quarter of a side's requests do not
stall: each side has ALONE - 1 requests right after its own of ALONE + PAIRS, so 4 (ALONE - 1) >
ALONE + PAIRS.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from specadapt.adapters.base import Server
from specadapt.analysis.interference import interference
from specadapt.load.client import run as run_loop
from specadapt.load.engine import Job
from specadapt.load.plan import Stamp, split
from specadapt.load.spread import Executor, InProcess, WorkerStopped, target_of
from specadapt.records import Prompt, RequestRecord, RequestSettings
from specadapt.records.interference import InterferenceFinding

ALONE = 5
"""Requests to each side alone."""
PAIRS = 5
"""Then this many pairs, the sides alternating."""
MAX_TOKENS = 4
"""Tokens per request: the first token is what the check looks at."""


def needs_check(run_pairs: int) -> bool:
    """Whether a run with ``run_pairs`` pairs at concurrency 1 needs the check: with at least as many
    requests to each side as the check sends (ALONE + PAIRS), the run's own records show the order."""
    return run_pairs < ALONE + PAIRS


def check_order(alone: int = ALONE, pairs: int = PAIRS) -> list[str]:
    """The sides in the order the check sends to them."""
    return ["off"] * alone + ["on"] * alone + ["off", "on"] * pairs


def check_prompt(prompt: Prompt) -> Prompt:
    """The prompt as the check sends it: its first message only (no later turns), MAX_TOKENS tokens."""
    return prompt.model_copy(update={"max_tokens": MAX_TOKENS, "turns": None})


async def _send(executor: Executor, server: Server, side: str, job: Job, request: RequestSettings,
                t0: int) -> list[RequestRecord]:
    """One request to one side, as the compare runner sends a block of one."""
    shares = split([job], request, 1, 1, stamp=Stamp(side=side, concurrency=1))
    result = await executor.run(shares, [target_of(server)], None, t0_ns=t0)
    if result.partial_reason is not None:
        raise WorkerStopped(result.partial_reason)
    return result.records


async def check_sides(off: Server, on: Server, prompt: Prompt, requests: Mapping[str, RequestSettings],
                      executor: Executor, t0: int | None = None, warm: bool = True) -> InterferenceFinding:
    """The check through ``executor`` (one clock for every worker: send times are compared);
    ``requests``: each side's request settings ('off', 'on'); send times from ``t0`` (default: now).
    With ``warm``, one request to each side first, not judged: a server's first request after its
    start waits seconds (the first pass's allocations) and is no stall."""
    servers = {"off": off, "on": on}
    t0 = time.perf_counter_ns() if t0 is None else t0
    sent = check_prompt(prompt)
    for side in ("off", "on") if warm else ():
        await _send(executor, servers[side], side, Job(index=0, prompt=sent), requests[side], t0)
    records: list[RequestRecord] = []
    for i, side in enumerate(check_order()):
        records += await _send(executor, servers[side], side, Job(index=i, prompt=sent), requests[side], t0)
    return interference(records, urls=(off.base_url, on.base_url), source="check")


def check_interference(off: Server, on: Server, prompt: Prompt,
                       request: RequestSettings | None = None) -> InterferenceFinding:
    """The check on two servers from this process (``request``: both sides' settings; default
    greedy, without logprobs)."""
    request = request or RequestSettings(logprobs=False)

    async def go() -> InterferenceFinding:
        executor = InProcess()
        try:
            return await check_sides(off, on, prompt, {"off": request, "on": request}, executor)
        finally:
            await executor.aclose()

    return run_loop(go())

"""Start servers from LaunchPlans, wait until healthy, yield connected Servers, stop them.

One life cycle for every backend; the process handling itself is ManagedProcess's.
Processes are started from the calling thread (the parent-death signal is tied to the
thread that forks, so a short-lived worker thread must not start them); only the health
waits run in threads, so several servers come up side by side.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from specadapt.adapters.plan import LaunchPlan
from specadapt.adapters.process import ManagedProcess


@contextmanager
def launched_many(plans: Sequence[LaunchPlan], connects: Sequence[Callable[[str], Any]],
                  startup_timeout_s: float = 900.0, on_wait: Callable[[float, str], None] | None = None,
                  on_plan: Callable[[LaunchPlan, Path], None] | None = None) -> Iterator[list[Any]]:
    """Start every plan, wait until all answer, yield ``connect(base_url)`` for each; stop every
    process group on exit (also when one of them fails to start)."""
    with ExitStack() as stack:
        procs = []
        for plan in plans:
            proc = stack.enter_context(ManagedProcess(plan))
            if on_plan:
                on_plan(plan, proc.log_path)
            procs.append(proc)
        if len(procs) == 1:
            procs[0].wait_healthy(startup_timeout_s, on_wait)
        else:
            with ThreadPoolExecutor(len(procs)) as pool:
                for fut in [pool.submit(p.wait_healthy, startup_timeout_s) for p in procs]:
                    fut.result()
        servers = []
        for proc, connect in zip(procs, connects):
            server = connect(proc.plan.base_url)
            server.process = proc
            stack.callback(server.close)
            servers.append(server)
        yield servers


@contextmanager
def launched(plan: LaunchPlan, connect: Callable[[str], Any], startup_timeout_s: float = 900.0,
             on_wait: Callable[[float, str], None] | None = None,
             on_plan: Callable[[LaunchPlan, Path], None] | None = None) -> Iterator[Any]:
    """Run ``plan`` under ManagedProcess; ``connect(base_url)`` makes the Server yielded."""
    with launched_many([plan], [connect], startup_timeout_s, on_wait, on_plan) as (server,):
        yield server

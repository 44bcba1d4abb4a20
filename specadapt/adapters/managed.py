"""Start one server from a LaunchPlan, wait until healthy, yield a connected Server, stop it.

The same life cycle for every backend that is not vLLM (vLLM keeps its own, which starts
several servers side by side); the process handling itself is ManagedProcess's.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

from specadapt.adapters.base import LaunchPlan
from specadapt.adapters.process import ManagedProcess


@contextmanager
def launched(plan: LaunchPlan, connect: Callable[[str], Any], startup_timeout_s: float = 900.0,
             on_wait: Callable[[float, str], None] | None = None,
             on_plan: Callable[[LaunchPlan, Path], None] | None = None) -> Iterator[Any]:
    """Run ``plan`` under ManagedProcess; ``connect(base_url)`` makes the Server yielded."""
    with ManagedProcess(plan) as proc:
        if on_plan:
            on_plan(plan, proc.log_path)
        proc.wait_healthy(startup_timeout_s, on_wait)
        server = connect(plan.base_url)
        server.process = proc
        try:
            yield server
        finally:
            server.close()

"""Test tools shipped with specadapt: the scripted SSE server and a way to start it managed."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path

from specadapt.adapters.base import LaunchPlan
from specadapt.adapters.process import ManagedProcess, free_port


def script(**fields) -> str:
    """Prompt text that tells the scripted server what to do (see scripted_server)."""
    return json.dumps(fields, separators=(",", ":"))


def scripted_plan(port: int, host: str = "127.0.0.1", api_key: str | None = None,
                  ssl: tuple[str, str] | None = None, stall_after_other: tuple[Path, float] | None = None) -> LaunchPlan:
    """``stall_after_other``: (shared file, ms): stall after another server's request (see scripted_server)."""
    argv = [sys.executable, "-m", "specadapt.testing.scripted_server", f"--host={host}", f"--port={port}"]
    if api_key:
        argv.append(f"--api-key={api_key}")
    if stall_after_other:
        argv.append(f"--stall-after-other={stall_after_other[0]},{stall_after_other[1]:g}")
    if ssl:
        argv += [f"--ssl-certfile={ssl[0]}", f"--ssl-keyfile={ssl[1]}"]
    return LaunchPlan(backend="scripted", argv=argv, host=host, port=port, health_path="/health",
                      spec_enabled=True, model="scripted")


@contextlib.contextmanager
def scripted_server(log_path: Path, api_key: str | None = None, ssl: tuple[str, str] | None = None,
                    stall_after_other: tuple[Path, float] | None = None) -> Iterator[object]:
    """Start the scripted server as a managed process; yield the ManagedProcess (healthy)."""
    plan = scripted_plan(free_port(), api_key=api_key, ssl=ssl, stall_after_other=stall_after_other)
    with ManagedProcess(plan, log_path=log_path, grace_s=5) as mp:
        if not ssl:
            mp.wait_healthy(60)
        yield mp

"""Suite-wide guard: no process started by the tests outlives the test session."""

import psutil
import pytest


@pytest.fixture(scope="session", autouse=True)
def no_process_left_behind():
    """Set up first, torn down last: after every other fixture has stopped its servers,
    nothing that this pytest process started may still be running."""
    me = psutil.Process()
    yield
    children = me.children(recursive=True)
    _gone, alive = psutil.wait_procs(children, timeout=30)
    alive = [p for p in alive if p.status() != psutil.STATUS_ZOMBIE]
    names = [f"{p.pid} {' '.join(p.cmdline())[:120]}" for p in alive]
    for p in alive:
        p.kill()
    assert not alive, f"processes left running after the test session: {names}"

"""Suite-wide guards: no process started by the tests outlives the test session, and under CI
no test skips that the suite does not expect to skip (tests/skip_gate.py)."""

import os

import psutil
import pytest
import skip_gate


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


_SKIPS: list[skip_gate.Skip] = []


def pytest_collectreport(report):
    if report.skipped:  # a module skipped as a whole (importorskip at module level)
        _SKIPS.append(skip_gate.Skip(report.nodeid, skip_gate.skip_reason(report.longrepr)))


def pytest_runtest_logreport(report):
    if report.skipped and not hasattr(report, "wasxfail"):
        _SKIPS.append(skip_gate.Skip(report.nodeid, skip_gate.skip_reason(report.longrepr)))


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus):
    if not skip_gate.ci_enabled(os.environ):
        return
    bad = skip_gate.unexpected(_SKIPS)
    if not bad:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    for line in skip_gate.summary(bad):
        if reporter is not None:
            reporter.write_line(line, red=True)
        else:
            print(line)
    if session.exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED

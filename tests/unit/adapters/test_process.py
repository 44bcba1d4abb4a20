"""ManagedProcess with real child process trees (python subprocesses, real sockets)."""

import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path
import time

import psutil
import pytest

from specadapt.adapters.base import LaunchPlan
from specadapt.adapters.process import ManagedProcess, free_port
from specadapt.errors import PortInUse, ServerStartError

# The stand-in servers end on SIGTERM as real servers do, whatever disposition the test run
# hands down (a run started with SIGTERM ignored would otherwise wait out every grace period).
SIGTERM_ENDS = "import signal; signal.signal(signal.SIGTERM, signal.SIG_DFL); "

# A tiny "server": forks a grandchild (sleeps), then serves HTTP on the given port.
TREE_SERVER = SIGTERM_ENDS + textwrap.dedent("""
    import http.server, subprocess, sys
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    print("serving", flush=True)
    http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), http.server.SimpleHTTPRequestHandler).serve_forever()
""")


def plan_for(code: str, port: int, *args: str) -> LaunchPlan:
    return LaunchPlan(backend="test", argv=[sys.executable, "-c", code, str(port), *args], port=port,
                      health_path="/", spec_enabled=False, model="none")


def tree(pid: int) -> list[psutil.Process]:
    proc = psutil.Process(pid)
    return [proc, *proc.children(recursive=True)]


def assert_all_gone(procs, timeout=10):
    _gone, alive = psutil.wait_procs(procs, timeout=timeout)
    assert not [p for p in alive if p.status() != psutil.STATUS_ZOMBIE], alive


def test_start_wait_healthy_and_stop_the_whole_tree(tmp_path):
    port = free_port()
    mp = ManagedProcess(plan_for(TREE_SERVER, port), log_path=tmp_path / "log")
    with mp:
        waited = mp.wait_healthy(timeout_s=30)
        assert waited < 30
        procs = tree(mp.pid)
        assert len(procs) >= 2  # server and its grandchild
        assert os.getpgid(mp.pid) == mp.pid  # its own process group
    assert_all_gone(procs)
    assert "serving" in (tmp_path / "log").read_text()


def test_death_during_startup_reports_exit_code_and_log_tail(tmp_path):
    code = "import sys; print('loading weights'); print('RuntimeError: no such model', flush=True); sys.exit(3)"
    mp = ManagedProcess(plan_for(code, free_port()), log_path=tmp_path / "log")
    with mp, pytest.raises(ServerStartError) as err:
        mp.wait_healthy(timeout_s=30)
    assert err.value.process_exit_code == 3
    assert "exited with code 3 during start-up" in str(err.value)
    assert "RuntimeError: no such model" in err.value.log_tail


def test_health_timeout_stops_the_process(tmp_path):
    mp = ManagedProcess(plan_for(SIGTERM_ENDS + "import time; time.sleep(600)", free_port()),
                        log_path=tmp_path / "log")
    with mp, pytest.raises(ServerStartError, match="did not answer / within 1 s"):
        mp.wait_healthy(timeout_s=1)
    assert not mp.alive()


def test_sigterm_ignoring_server_is_killed_after_grace(tmp_path):
    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(600)"
    mp = ManagedProcess(plan_for(code, free_port()), log_path=tmp_path / "log", grace_s=1.0)
    mp.start()
    deadline = time.monotonic() + 30  # SIGTERM is ignored once it said "up" (a sleep races its start-up)
    while "up" not in (tmp_path / "log").read_text():
        assert time.monotonic() < deadline, "the child did not start in 30 s"
        time.sleep(0.05)
    t0 = time.monotonic()
    assert mp.stop() == -signal.SIGKILL
    assert time.monotonic() - t0 < 10


def test_port_in_use_is_refused_before_starting(tmp_path):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        with pytest.raises(PortInUse, match=f"port {port} on 127.0.0.1 is already in use"):
            ManagedProcess(plan_for(TREE_SERVER, port), log_path=tmp_path / "log").start()


# A program that starts a managed tree the way the CLI does, then waits to be signalled.
# Ctrl-C reaches the CLI as KeyboardInterrupt: Python's own SIGINT handler, which Python
# installs at start-up only when SIGINT is not ignored. The test run may itself ignore
# SIGINT (a background job of a non-interactive shell), and an ignored disposition is
# inherited, so the program installs that handler itself, as a foreground CLI has it.
PARENT = textwrap.dedent("""
    import signal, sys, time
    from specadapt.adapters.base import LaunchPlan
    from specadapt.adapters.process import ManagedProcess, install_signal_handlers
    signal.signal(signal.SIGINT, signal.default_int_handler)
    install_signal_handlers()
    port = int(sys.argv[1])
    plan = LaunchPlan(backend="t", argv=[sys.executable, "-c", sys.argv[2], str(port)], port=port,
                      health_path="/", spec_enabled=False, model="none")
    with ManagedProcess(plan, log_path=__import__("pathlib").Path(sys.argv[3])) as mp:
        mp.wait_healthy(30)
        print(mp.pid, flush=True)
        time.sleep(600)
""")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_parent_signal_stops_the_server_tree(tmp_path, sig):
    parent = subprocess.Popen([sys.executable, "-c", PARENT, str(free_port()), TREE_SERVER, str(tmp_path / "log")],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        server_pid = int(parent.stdout.readline())
        procs = tree(server_pid)
        assert len(procs) >= 2
        parent.send_signal(sig)
        parent.wait(30)
        assert_all_gone(procs)
        assert "Traceback" not in parent.stderr.read() or sig == signal.SIGINT
    finally:
        parent.kill()


# The same, but it prints the watchdog's pid too and then ends as the test says.
ENDINGS = textwrap.dedent("""
    import os, signal, sys, time
    from specadapt.adapters.base import LaunchPlan
    from specadapt.adapters.process import ManagedProcess, install_signal_handlers
    install_signal_handlers()
    port, how = int(sys.argv[1]), sys.argv[4]
    plan = LaunchPlan(backend="t", argv=[sys.executable, "-c", sys.argv[2], str(port)], port=port,
                      health_path="/", spec_enabled=False, model="none")
    mp = ManagedProcess(plan, log_path=__import__("pathlib").Path(sys.argv[3]), grace_s=2)
    mp.start()
    mp.wait_healthy(30)
    print(mp.pid, mp.watchdog.pid, flush=True)
    sys.stdin.readline()  # the test has looked at the tree
    if how == "exception":
        with mp:
            raise RuntimeError("boom")
    if how == "normal":
        sys.exit(0)  # no context manager: the atexit hook stops it
    time.sleep(600)  # "sigkill": the test kills us
""")


@pytest.mark.parametrize("how", ["sigkill", "exception", "normal"])
def test_nothing_survives_any_ending_of_the_parent(tmp_path, how):
    parent = subprocess.Popen([sys.executable, "-c", ENDINGS, str(free_port()), TREE_SERVER, str(tmp_path / "log"),
                               how], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        server_pid, watchdog_pid = map(int, parent.stdout.readline().split())
        procs = tree(server_pid)
        assert len(procs) >= 2 and all(os.getpgid(p.pid) == server_pid for p in procs)
        watchdog = psutil.Process(watchdog_pid)
        if how == "sigkill":  # no handler, no atexit: only the watchdog is left to act
            parent.kill()
        else:
            parent.stdin.write("go\n")
            parent.stdin.flush()
        parent.wait(30)
        t0 = time.monotonic()
        assert_all_gone(procs + [watchdog], timeout=15)
        assert time.monotonic() - t0 < 15
        if how == "exception":
            assert "RuntimeError: boom" in parent.stderr.read()
    finally:
        parent.kill()


REPORT_DISPOSITIONS = textwrap.dedent("""
    import signal, sys
    ignored = [signal.getsignal(s) == signal.SIG_IGN for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)]
    print(" ".join("ignored" if i else "handled" for i in ignored), flush=True)
""")


def test_a_started_server_gets_default_signal_dispositions(tmp_path):
    """Ignored signals of the process that runs specadapt are not handed to the servers it starts."""
    saved = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        port = free_port()
        mp = ManagedProcess(plan_for(REPORT_DISPOSITIONS, port), log_path=tmp_path / "log", grace_s=5).start()
        assert mp.proc.wait(timeout=60) == 0
        mp.stop()
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)
    assert (tmp_path / "log").read_text().split() == ["handled"] * 3


def test_a_scratch_directory_lives_as_long_as_its_server(tmp_path, monkeypatch):
    """LaunchPlan.scratch_env: a fresh directory per server start (vLLM puts its sockets there), gone once the
    server is stopped, whatever the server left in it; a variable already set in the environment stands."""
    monkeypatch.delenv("SCRATCH_DIR", raising=False)
    code = SIGTERM_ENDS + textwrap.dedent("""
        import http.server, os, pathlib, sys
        pathlib.Path(os.environ["SCRATCH_DIR"], "socket").write_text("left behind")
        print("scratch", os.environ["SCRATCH_DIR"], flush=True)
        http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), http.server.SimpleHTTPRequestHandler).serve_forever()
    """)
    dirs = []
    for _ in range(2):
        plan = plan_for(code, free_port()).model_copy(update={"scratch_env": ["SCRATCH_DIR"]})
        mp = ManagedProcess(plan, log_path=tmp_path / f"log{len(dirs)}")
        with mp:
            mp.wait_healthy(timeout_s=30)
            (line,) = [x for x in mp.log_path.read_text().splitlines() if x.startswith("scratch ")]
            dirs.append(line.split(" ", 1)[1])
            assert (Path(dirs[-1]) / "socket").read_text() == "left behind"
        assert not Path(dirs[-1]).exists()
    assert dirs[0] != dirs[1] and "SCRATCH_DIR" not in plan.env
    mine = tmp_path / "mine"
    mine.mkdir()
    monkeypatch.setenv("SCRATCH_DIR", str(mine))
    plan = plan_for(code, free_port()).model_copy(update={"scratch_env": ["SCRATCH_DIR"]})
    with ManagedProcess(plan, log_path=tmp_path / "log-mine") as mp:
        mp.wait_healthy(timeout_s=30)
    assert (mine / "socket").read_text() == "left behind"  # the user's own directory: used, and kept


def test_vllm_servers_get_a_socket_directory_of_their_own():
    from specadapt.adapters.vllm import VLLMBackend, VLLMLaunch

    plan = VLLMBackend().launch_plan(VLLMLaunch(model="/m", python=sys.executable, port=free_port()))
    assert plan.scratch_env == ["VLLM_RPC_BASE_PATH"] and "VLLM_RPC_BASE_PATH" not in plan.env

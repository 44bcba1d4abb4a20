"""A managed server process: start in its own process group, wait healthy, stop the group.

Every process started here is stopped when specadapt exits, however it exits: the
context manager stops it on normal exit and on exceptions (KeyboardInterrupt included),
``install_signal_handlers`` turns SIGTERM/SIGHUP into a normal unwinding exit, an
``atexit`` hook stops whatever is still registered, and on Linux the child gets a
parent-death signal so it ends even if specadapt is killed with SIGKILL. That signal
is tied to the thread that starts the child: call ``start()`` from a thread that lives as
long as the server should (the main thread), never from a short-lived worker thread.

The parent-death signal reaches only the direct child; a server's workers (vLLM's engine
core, its GPU workers) would outlive a SIGKILLed specadapt. So each group also gets a
watchdog: a tiny separate process, in its own session, holding the read end of a pipe
whose write end only specadapt holds. When specadapt dies in any way the kernel closes
that pipe; the watchdog reads EOF and stops the whole group (SIGTERM, then SIGKILL after
the grace period). On a normal stop specadapt writes "q" first and the watchdog leaves
quietly; it also leaves by itself once the group is gone.
"""

from __future__ import annotations

import atexit
import collections
import ctypes
import errno
import functools
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from specadapt.adapters.plan import LaunchPlan
from specadapt.errors import PortInUse, ServerStartError
from specadapt.paths import runs_dir
from specadapt.wire.http import Wire

LOG_TAIL_LINES = 30
_LIVE: set[ManagedProcess] = set()
_LIVE_LOCK = threading.Lock()


def free_port(host: str = "127.0.0.1") -> int:
    """A port the OS says is free right now on ``host``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def check_port_free(host: str, port: int) -> None:
    """Raise PortInUse with the fix if ``host:port`` cannot be bound."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise PortInUse(
                    f"port {port} on {host} is already in use: pass another --port, or none to pick a free one"
                ) from exc
            raise PortInUse(f"cannot bind {host}:{port} ({exc.strerror}): pass another --host/--port") from exc


SERVER_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _prepare_child(cpus: list[int] | None = None) -> None:  # runs in the child between fork and exec
    """Default dispositions for the signals that stop a server (an ignored SIGTERM, inherited
    from a background job that started specadapt, would make every stop wait out the grace
    period), SIGTERM when specadapt dies (Linux), and with ``cpus`` the CPUs the server and
    every process it starts may run on (the affinity mask is inherited across fork and exec)."""
    if cpus:
        os.sched_setaffinity(0, cpus)
    for sig in SERVER_SIGNALS:
        signal.signal(sig, signal.SIG_DFL)
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL("libc.so.6", use_errno=True)
            libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        except OSError:
            pass


WATCHDOG = r"""
import os, select, signal, sys, time
pgid, grace = int(sys.argv[1]), float(sys.argv[2])
signal.signal(signal.SIGINT, signal.SIG_IGN)

def alive():
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True

while alive():
    if select.select([0], [], [], 1.0)[0]:
        if os.read(0, 1) == b"q":
            sys.exit(0)
        os.killpg(pgid, signal.SIGTERM) if alive() else None
        deadline = time.monotonic() + grace
        while alive() and time.monotonic() < deadline:
            time.sleep(0.1)
        if alive():
            os.killpg(pgid, signal.SIGKILL)
        sys.exit(0)
"""


def start_watchdog(pgid: int, grace_s: float) -> subprocess.Popen:
    """A process that stops group ``pgid`` when the returned Popen's stdin pipe closes
    without a "q" first (that is, when this process dies)."""
    return subprocess.Popen([sys.executable, "-c", WATCHDOG, str(pgid), str(grace_s)], stdin=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                            close_fds=True)


def tail_lines(path: Path, n: int = LOG_TAIL_LINES) -> str:
    try:
        with open(path, errors="replace") as fh:
            return "".join(collections.deque(fh, maxlen=n)).rstrip()
    except OSError:
        return ""


class ManagedProcess:
    """One server process (and its whole group) that specadapt owns."""

    def __init__(self, plan: LaunchPlan, log_path: Path | None = None, grace_s: float = 15.0):
        self.plan = plan
        stamp = time.strftime("%Y%m%d-%H%M%S")
        self.log_path = log_path or runs_dir() / f"{plan.backend}-{stamp}-{plan.port}.log"
        self.grace_s = grace_s
        self.proc: subprocess.Popen | None = None
        self.watchdog: subprocess.Popen | None = None
        self._log_fh = None
        self._scratch: list[str] = []  # the plan's scratch directories made for this run (removed by stop)

    # -- life cycle -------------------------------------------------------------------
    def start(self) -> ManagedProcess:
        check_port_free(self.plan.host, self.plan.port)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log_fh = open(self.log_path, "ab")
        env = {**os.environ, **self.plan.env}
        for name in self.plan.scratch_env:
            if name not in env:
                env[name] = tempfile.mkdtemp(prefix=f"specadapt-{self.plan.backend}-")
                self._scratch.append(env[name])
        try:
            self.proc = subprocess.Popen(
                self.plan.argv, env=env, stdin=subprocess.DEVNULL, stdout=self._log_fh,
                stderr=subprocess.STDOUT, start_new_session=True,
                preexec_fn=functools.partial(_prepare_child, self.plan.cpus), close_fds=True,
            )
        except (OSError, subprocess.SubprocessError) as exc:  # SubprocessError: _prepare_child failed (its CPUs)
            self._log_fh.close()
            self._remove_scratch()
            why = getattr(exc, "strerror", None) or str(exc)
            where = f" on CPUs {self.plan.cpus}" if self.plan.cpus else ""
            raise ServerStartError(f"cannot start {self.plan.argv[0]}{where}: {why}") from exc
        try:
            self.watchdog = start_watchdog(self.proc.pid, self.grace_s)
        except OSError:  # the group is still stopped by stop(), atexit and the parent-death signal
            self.watchdog = None
        with _LIVE_LOCK:
            _LIVE.add(self)
        return self

    def log_tail(self, n: int = LOG_TAIL_LINES) -> str:
        """The last lines of the server log, with the plan's secrets (API keys) scrubbed."""
        text = tail_lines(self.log_path, n)
        for secret in self.plan.secrets():
            text = text.replace(secret, "REDACTED")
        return text

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_healthy(self, timeout_s: float = 600.0,
                     on_wait: Callable[[float, str], None] | None = None) -> float:
        """Poll the health route until 200; return seconds waited.

        Raises ServerStartError (exit code and the last log lines) if the process dies
        first, or if ``timeout_s`` passes.
        """
        assert self.proc is not None, "start() first"
        t0 = time.monotonic()
        with Wire(self.plan.base_url, timeout_s=2.0) as wire:
            while True:
                elapsed = time.monotonic() - t0
                code = self.proc.poll()
                if code is not None:
                    raise ServerStartError(
                        f"{self.plan.backend} server exited with code {code} during start-up "
                        f"(log: {self.log_path})", log_tail=self.log_tail(), exit_code=code)
                if wire.status(self.plan.health_path) == 200:
                    return elapsed
                if elapsed > timeout_s:
                    tail = self.log_tail()
                    self.stop()
                    raise ServerStartError(
                        f"{self.plan.backend} server did not answer {self.plan.health_path} within "
                        f"{timeout_s:.0f} s; stopped it (log: {self.log_path})", log_tail=tail)
                if on_wait:
                    last = self.log_tail(1)
                    on_wait(elapsed, last[-160:])
                time.sleep(0.5)

    def stop(self) -> int | None:
        """SIGTERM the process group, SIGKILL after the grace period; return the exit code."""
        if self.proc is None:
            return None
        try:
            descendants = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.Error:
            descendants = []
        if self.proc.poll() is None:
            self._signal_group(signal.SIGTERM)
            try:
                self.proc.wait(self.grace_s)
            except subprocess.TimeoutExpired:
                self._signal_group(signal.SIGKILL)
                self.proc.wait(5)
        # Anything that left the group (setsid) but descends from our child dies too.
        _gone, alive = psutil.wait_procs(descendants, timeout=self.grace_s if descendants else 0)
        for p in alive:
            try:
                p.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(alive, timeout=5)
        self._signal_group(signal.SIGKILL)  # stragglers still in the group
        self._dismiss_watchdog()
        with _LIVE_LOCK:
            _LIVE.discard(self)
        if self._log_fh and not self._log_fh.closed:
            self._log_fh.close()
        self._remove_scratch()
        return self.proc.returncode

    def _remove_scratch(self) -> None:
        while self._scratch:
            shutil.rmtree(self._scratch.pop(), ignore_errors=True)

    def _dismiss_watchdog(self) -> None:
        if self.watchdog is None:
            return
        try:
            self.watchdog.stdin.write(b"q")
            self.watchdog.stdin.close()
        except (OSError, ValueError):
            pass
        try:
            self.watchdog.wait(5)
        except subprocess.TimeoutExpired:
            self.watchdog.kill()
            self.watchdog.wait(5)

    def _signal_group(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def __enter__(self) -> ManagedProcess:
        if self.proc is None:
            self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def stop_all() -> None:
    """Stop every managed process still registered (atexit and signal paths)."""
    with _LIVE_LOCK:
        live = list(_LIVE)
    for mp in live:
        try:
            mp.stop()
        except Exception:  # noqa: BLE001 - best effort at exit; never mask the real exit
            pass


atexit.register(stop_all)


def install_signal_handlers() -> None:
    """Turn SIGTERM and SIGHUP into SystemExit so context managers stop our servers."""

    def _exit(signum, _frame):
        signal.signal(signum, signal.SIG_DFL)  # a second signal ends us at once
        raise SystemExit(128 + signum)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _exit)

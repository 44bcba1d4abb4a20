"""Ctrl-C: one line, exit 130, after the run's context managers have closed (real subprocess)."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys


def test_ctrl_c_exits_130_with_one_line():
    with socket.socket() as listener:  # accepts the connection and never answers
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        proc = subprocess.Popen(
            [sys.executable, "-m", "specadapt", "probe", "--url", f"http://127.0.0.1:{port}"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # not an inherited SIG_IGN
        try:
            listener.settimeout(120)
            conn, _ = listener.accept()  # the probe is now waiting on GET /v1/models
            proc.send_signal(signal.SIGINT)
            _out, err = proc.communicate(timeout=60)
            conn.close()
        finally:
            proc.kill()
    assert proc.returncode == 130, err
    assert err.strip().splitlines() == ["error: interrupted; every server this run started has been stopped"]

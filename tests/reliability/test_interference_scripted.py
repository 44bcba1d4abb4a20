"""compare against two scripted servers that stall each other's first token (real subprocesses, real
HTTP on loopback): the spec-on server's first token waits when the spec-off server served the request
before it, as two servers on one machine's cores did. The report names the interference with its
counts and size, in the check before the run and in the run's own records, and the diagnosis does
not put the later first token down to speculation; two servers that do not stall each other show
none. Assertions are on counts and on the stall size against the planted one, never on timings
alone."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import pytest

from specadapt.records.interference import InterferenceFinding
from specadapt.records.reports import read_compare_report
from specadapt.testing import script, scripted_server

STALL_MS = 500


@pytest.fixture
def two_servers(tmp_path):
    """Start two scripted servers; ``stall``: the spec-on one stalls STALL_MS after the spec-off one's
    request (the spec-off one only says when it served). Yields (off URL, on URL)."""
    def start(stall: bool):
        shared = tmp_path / "last-served"
        off_stall = (shared, 0) if stall else None
        on_stall = (shared, STALL_MS) if stall else None
        return scripted_server(tmp_path / "off.log", stall_after_other=off_stall), \
            scripted_server(tmp_path / "on.log", stall_after_other=on_stall)
    return start


def run_compare_cli(tmp_path, off_url: str, on_url: str, n_prompts: int = 9, repeat: int = 1):
    """compare at concurrency 1 over ``n_prompts`` x ``repeat`` pairs (fewer than 10: the check runs first)."""
    httpx.post(off_url + "/_script/metrics", json={"mode": "off"})  # the spec-off side shows no spec counters
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "prompt": script(id=f"itf-{i}", ttft_ms=20, itl_ms=5,
                                                                             tokens=8)}) + "\n" for i in range(n_prompts)))
    out = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, "-m", "specadapt", "compare", "--off", off_url, "--on", on_url, "--prompts", str(prompts),
         "--concurrency", "1", "--repeat", str(repeat), "--warmup", "1", "--max-tokens", "8", "--no-triage",
         "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return read_compare_report(out), proc.stdout


def test_servers_that_stall_each_other_are_named_and_speculation_is_not_blamed(tmp_path, two_servers):
    off_cm, on_cm = two_servers(stall=True)
    with off_cm as off, on_cm as on:
        report, console = run_compare_cli(tmp_path, off.plan.base_url, on.plan.base_url)
        stalled = [e for e in httpx.get(on.plan.base_url + "/_script/log").json().values() if e["stalled_ms"]]
    assert stalled  # the spec-on server did stall
    run = InterferenceFinding.model_validate(report.sections["interference"])
    check = report.interference_check
    for f in (run, check):
        assert f.detected and f.order == "judged", f.text
        on_side = next(s for s in f.sides if s.side == "on")
        # every request right after the spec-off side's stalled (a loaded machine may add a stray one after
        # its own side, never take a planted one away)
        assert on_side.stalls_after_other == on_side.after_other >= 4
        assert on_side.stalls_after_same <= 1
        assert 0.5 * STALL_MS <= on_side.stall_ms <= 2 * STALL_MS
        assert f.text.startswith("interference between the sides: ")
    assert check.host == "both servers are on this machine (127.0.0.1)"
    assert next(s for s in check.sides if s.side == "off").stalls_after_other == 0
    codes = [c.code for c in report.diagnosis.causes]
    assert "interference" in codes and "overhead" not in codes
    assert report.diagnosis.advice[0].code == "interference"
    assert any(n.startswith("the servers stalled each other's first token") for n in report.notes)
    assert "interference, the check before the run: interference between the sides:" in console
    assert "interference, the run: interference between the sides:" in console


def test_servers_that_do_not_stall_each_other_show_no_interference(tmp_path, two_servers):
    off_cm, on_cm = two_servers(stall=False)
    with off_cm as off, on_cm as on:
        report, console = run_compare_cli(tmp_path, off.plan.base_url, on.plan.base_url)
    run = InterferenceFinding.model_validate(report.sections["interference"])
    assert not run.detected and not report.interference_check.detected
    assert report.interference_check.order == "judged"
    assert "interference" not in [c.code for c in report.diagnosis.causes]
    assert "interference, the check before the run: no " in console


def test_a_run_with_as_many_pairs_as_the_check_shows_the_interference_by_itself(tmp_path, two_servers):
    """10 pairs at concurrency 1 (the check's count, where compare skips it): the run's own records
    name the interference, with no check before the run."""
    off_cm, on_cm = two_servers(stall=True)
    with off_cm as off, on_cm as on:
        report, console = run_compare_cli(tmp_path, off.plan.base_url, on.plan.base_url, n_prompts=5, repeat=2)
    run = InterferenceFinding.model_validate(report.sections["interference"])
    assert report.interference_check is None and "the check before the run" not in console
    assert run.detected and run.order == "judged", run.text
    on_side = next(s for s in run.sides if s.side == "on")
    assert on_side.stalls_after_other == on_side.after_other >= 4
    assert "interference" in [c.code for c in report.diagnosis.causes]
    assert "interference, the run: interference between the sides:" in console

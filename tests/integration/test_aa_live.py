"""A/A, live: compare with one spec-ON server given as --off and as --on.

Nothing differs between the sides, so every speed interval must cover 1.0x (or be withheld for
too few units), no level may be called faster or slower, and every prompt's output must be
identical. The server speculates, so compare computes a speed verdict at every level (with a
spec-off server on both sides it would withhold it as "no-speculation", and the check could not
fail). Concurrency 1 (pairs) and 2 (blocks) with --repeat 5: 15 pairs at 1, 5 blocks at 2,
each prompt's intervals over 5 units. The check itself, with its chance of a false alarm, is
tests/aa_verdict.py; tests/unit/analysis/test_speed_aa.py shows that it fails when the intervals are too narrow.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from aa_verdict import check_aa
from test_compare_vllm import CAPITAL, COPY, REVERSE, prompts_file

pytestmark = pytest.mark.integration


def aa_runner(tmp_path, server, concurrency: str, repeat: int):
    prompts = prompts_file(tmp_path, COPY, REVERSE, CAPITAL)

    def run(attempt: int) -> dict:
        out = tmp_path / f"aa-{attempt}.json"
        proc = subprocess.run([sys.executable, "-m", "specadapt", "compare", "--off", server.base_url,
                               "--on", server.base_url, "--prompts", str(prompts), "--concurrency", concurrency,
                               "--repeat", str(repeat), "--max-tokens", "8", "--json", str(out)],
                              capture_output=True, text=True, timeout=1200)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        report = json.loads(out.read_text())
        (report["printed_load_line"],) = [line for line in proc.stdout.splitlines() if line.startswith("load: ")]
        return report
    return run


def check_printed_and_identity(report: dict) -> None:
    """What the console said agrees with the verdict, and the outputs are identical."""
    load = report["printed_load_line"]
    assert "no clear difference" in load and "faster" not in load and "slower" not in load, load
    assert report["on_server"]["spec_enabled"] is True
    assert [p["verdict"] for p in report["identity"]] == ["identical"] * 3, report["identity"]


@pytest.mark.timed
def test_aa_same_spec_on_vllm_server_twice(tmp_path, vllm_ngram_fp32):
    report = check_aa(aa_runner(tmp_path, vllm_ngram_fp32, "1,2", 5), [1, 2],
                      {1: ("pairs", 15), 2: ("blocks", 5)})
    check_printed_and_identity(report)
    assert all(p["ratios"]["tpot"]["n"] == 5 for lv in report["levels"] for p in lv["by_prompt"])


@pytest.mark.timed
def test_aa_same_spec_on_reference_server_twice(tmp_path, reference_ngram_server):
    report = check_aa(aa_runner(tmp_path, reference_ngram_server, "1", 3), [1], {1: ("pairs", 9)})
    check_printed_and_identity(report)

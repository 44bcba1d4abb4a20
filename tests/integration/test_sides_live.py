"""Sides that do not disturb each other, live (vLLM CPU build, the embedded model).

- An A/A that `specadapt compare` starts itself: two spec-off servers side by side. Each is placed
  on its own CPUs (the launch records say which, and nothing else differs), and nothing tells the
  sides apart: no interference between them, no first-token difference, identical text. Started
  on the same cores (``--launch shared``, the way servers ran before placement) the same pair
  stalls the other's first token by about a second after every switch of side on these machines
  (benchmarks/side_by_side_stalls.py measures it); the interference check would name it.
- The demo's comparison of the n-gram draft on the session's servers (spec off and spec on placed
  on separate halves of the CPUs, as the demo places them): its headline's verdicts agree, or the
  report names the one reason why not, and that reason is never interference.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys

import pytest
from test_compare_vllm import CAPITAL, COPY, REVERSE, prompts_file

from specadapt.analysis.diagnosis import ttft_ratio
from specadapt.analysis.headline import headline
from specadapt.analysis.pairs import pair_records
from specadapt.analysis.stats import ratio_ci
from specadapt.orchestration.demo import DemoOptions, plan_demo, run_demo
from specadapt.records import CompareReport

pytestmark = pytest.mark.integration

OFF = json.dumps({"method": "off"})


@pytest.mark.timed
def test_aa_of_two_spec_off_servers_started_side_by_side(tmp_path, embedded_model):
    out = tmp_path / "aa.json"
    proc = subprocess.run([sys.executable, "-m", "specadapt", "compare", "--spec-config", OFF, "--dtype", "float32",
                           "--server-arg=--enforce-eager", "--prompts", str(prompts_file(tmp_path, COPY, REVERSE, CAPITAL)),
                           "--repeat", "4", "--max-tokens", "8", "--startup-timeout", "900", "--json", str(out)],
                          capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "differ in more than speculation" not in proc.stderr
    report = CompareReport.model_validate_json(out.read_text())
    off, on = report.off_server.launch, report.on_server.launch
    assert off.cpus and on.cpus and not set(off.cpus) & set(on.cpus), (off.cpus, on.cpus)
    assert off.env["VLLM_CPU_OMP_THREADS_BIND"] != on.env["VLLM_CPU_OMP_THREADS_BIND"]
    assert any(n.startswith("placement: each side on its own share of the machine") for n in report.notes)
    interference = report.sections.get("interference")
    assert interference is not None and interference["detected"] is False, interference
    pairs = pair_records(report.requests, 1)
    assert len(pairs) == 12
    # no first-token difference: the interval of TTFT on/off covers 1 (at 99.9%, so that chance alone
    # fails this test once in a thousand runs; a second-long stall after every switch lies far outside it)
    ttft = ttft_ratio(pairs)
    wide = ratio_ci([r for r in _log_ttft(pairs)], "pairs", level=0.999)
    assert wide.low <= 1.0 <= wide.high, (ttft, wide)
    assert [p.verdict for p in report.identity] == ["identical"] * 3


def _log_ttft(pairs):
    import math

    return [math.log(on.ttft_ns / off.ttft_ns) for off, on in pairs if off.ttft_ns and on.ttft_ns]


@pytest.mark.timed
def test_demo_ngram_headline_is_consistent(tmp_path, vllm_off_fp32, vllm_ngram_fp32, embedded_model):
    """The demo's n-gram comparison on the session's placed servers: was the response faster, and do
    TPOT, E2E and tokens/s agree (or the report says why, and it is not interference)."""
    plan = plan_demo(DemoOptions(dtype="float32", max_tokens=32), model=embedded_model, check=False)
    plan.runs = [r for r in plan.runs if r.name == "ngram"]
    plan.launch = {k: v for k, v in plan.launch.items() if k in ("spec-off", "ngram")}

    def launcher(opts_list, timeout, on_plan):
        return contextlib.nullcontext([vllm_off_fp32, vllm_ngram_fp32])

    report = run_demo(plan, launcher=launcher, make_draft=lambda src, layers, dest: dest)
    (run,) = report.runs
    compare = run.compare
    assert compare.sections["interference"]["detected"] is False, compare.sections["interference"]
    h = headline(compare)
    s = compare.levels[0].speed
    assert s.tpot.verdict == "faster", h.figures  # a draft that matches these prompts: decoding is faster
    if h.agree:
        assert h.why_not is None and s.e2e.verdict == s.tpot.verdict == s.throughput.verdict
    else:
        assert h.why_not and "interference" not in h.why_not, h
    assert compare.diagnosis is not None
    assert all("first token comes" not in c.text for c in compare.diagnosis.causes), compare.diagnosis.causes

"""llama.cpp live, through the plugin layer: 'specadapt probe --backend llamacpp' on the
embedded SmolLM2 GGUF with prompt-lookup drafting on vs off, then 'report compare'.

Opt-in (pytest -m llamacpp): llama-cpp-python builds llama.cpp from source (about 4.5
minutes on 2 cores), too slow for CI. The interpreter that has it is
$SPECADAPT_LLAMACPP_PYTHON (default /tmp/v-llama/bin/python). Figures are written to
$SPECADAPT_LLAMACPP_RESULTS when set (README "Backends" records one run).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.llamacpp, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
NGRAM_K4 = "--draft_model prompt-lookup-decoding --draft_model_num_pred_tokens 4"  # llama.cpp's own form


@pytest.fixture(scope="module")
def llama_python() -> str:
    python = os.environ.get("SPECADAPT_LLAMACPP_PYTHON", "/tmp/v-llama/bin/python")
    code = "import llama_cpp.server.app"
    if not Path(python).is_file() or subprocess.run([python, "-c", code], capture_output=True).returncode:
        pytest.fail(f"{python} has no llama-cpp-python[server]: build it (see README 'Backends') or set "
                    "SPECADAPT_LLAMACPP_PYTHON")
    return python


def specadapt(*args: str, timeout: float = 1500) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "specadapt", *args], capture_output=True, text=True, env=env,
                          timeout=timeout)


@pytest.fixture(scope="module")
def reports(llama_python, tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("llamacpp")
    found = {}
    for name, spec in (("off", None), ("on", NGRAM_K4)):
        path = out / f"{name}.json"
        args = ["probe", "--backend", "llamacpp", "--python", llama_python, "--max-tokens", "64",
                "--server-arg=--n_threads", "--server-arg=1", "--json", str(path)]
        if spec:
            args += ["--spec-config", spec]
        done = specadapt(*args)
        assert done.returncode == 0, done.stderr[-3000:]
        assert "note: llama-cpp-python's server exposes no speculative-decoding counters" in done.stderr
        found[name] = path
    return found


def test_probe_on_and_off(reports):
    off, on = (json.loads(reports[k].read_text()) for k in ("off", "on"))
    for r in (off, on):
        assert r["server"]["backend"] == "llamacpp" and r["latency"]["failed"] == 0
        assert r["latency"]["output_tokens"] > 0 and r["acceptance"]["known"] is False
    assert off["server"]["spec_enabled"] is False
    assert on["server"]["spec_enabled"] is True and on["server"]["num_speculative_tokens"] == 4
    assert on["server"]["version"] == off["server"]["version"] and on["server"]["version"]
    same = sum(a["text"] == b["text"] for a, b in zip(off["requests"], on["requests"]))
    results = {
        "version": on["server"]["version"],
        "tokens_per_s": {"off": off["latency"]["output_tokens_per_s"], "on": on["latency"]["output_tokens_per_s"]},
        "output_tokens": {"off": off["latency"]["output_tokens"], "on": on["latency"]["output_tokens"]},
        "tokens_per_chunk": {"off": off["latency"]["tokens_per_chunk_mean"],
                             "on": on["latency"]["tokens_per_chunk_mean"]},
        "identical_outputs": f"{same}/{len(on['requests'])}",
        "token_sources": {"off": off["token_sources"], "on": on["token_sources"]},
    }
    print(json.dumps(results, indent=2))
    if os.environ.get("SPECADAPT_LLAMACPP_RESULTS"):
        Path(os.environ["SPECADAPT_LLAMACPP_RESULTS"]).write_text(json.dumps(results, indent=2))
    assert len(on["requests"]) == len(off["requests"]) == 8


def test_report_compare_side_by_side(reports):
    done = specadapt("report", "compare", str(reports["off"]), str(reports["on"]), timeout=120)
    assert done.returncode == 0, done.stderr
    assert "spec on vs off" in done.stdout and "speedup" in done.stdout

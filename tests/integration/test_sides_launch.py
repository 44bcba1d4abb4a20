"""compare starts the pair itself (reference engine): the JSON report records what each side ran
with, and the two launches are identical apart from speculation."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from specadapt.analysis.sides import side_differences
from specadapt.records import CompareReport

pytestmark = pytest.mark.integration

NGRAM_K4 = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 4}
PROMPT = {"id": "capital", "category": "open",
          "messages": [{"role": "user", "content": "What is the capital of France?"}]}


def test_compare_records_both_launches_identical_apart_from_speculation(tmp_path, embedded_model):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps(PROMPT) + "\n")
    out = tmp_path / "report.json"
    proc = subprocess.run([sys.executable, "-m", "specadapt", "compare", "--backend", "reference", "--model",
                           embedded_model, "--spec-config", json.dumps(NGRAM_K4), "--dtype", "float32",
                           "--prompts", str(prompts), "--repeat", "1", "--warmup", "0", "--max-tokens", "8",
                           "--startup-timeout", "300", "--no-interference-check", "--json", str(out)],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "differ in more than speculation" not in proc.stderr
    raw = json.loads(out.read_text())
    off, on = raw["off_server"]["launch"], raw["on_server"]["launch"]
    # the spec-on argv is the spec-off argv plus the speculative flags (ports aside), by hand
    assert off["spec_args"] == [] and on["spec_args"][0] == "--ngram" and "--k=4" in on["spec_args"]
    cut = on["argv"].index(on["spec_args"][0])
    on_without_spec = on["argv"][:cut] + on["argv"][cut + len(on["spec_args"]):]
    ports = [a for a in off["argv"] + on["argv"] if a.startswith("--port=")]
    assert len(ports) == 2 and ports[0] != ports[1]
    assert [a for a in off["argv"] if a not in ports] == [a for a in on_without_spec if a not in ports]
    assert off["argv"][:5] == [sys.executable, "-m", "specadapt", "reference", "serve"]
    # each side on its own half of the CPUs, as many threads there: the only difference, and a placement
    assert off["cpus"] and on["cpus"] and not set(off["cpus"]) & set(on["cpus"]) and len(off["cpus"]) == len(on["cpus"])
    assert off["env"] == on["env"] == {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                                       "OMP_NUM_THREADS": str(len(off["cpus"]))}
    assert off["inherited_env"] == on["inherited_env"]
    assert off["python"] == on["python"] == sys.executable and off["package_version"] == on["package_version"]
    report = CompareReport.model_validate(raw)
    assert side_differences(report.off_server, report.on_server) == []

"""`specadapt equiv --features --until-decided` end to end against the loopback fake of vLLM's API
(tests/commands/test_sampling_cli.py), taught here to apply a request's temperature and top_k: a
distribution cell sends its samples in 4 looks and stops early only to reject."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner
from commands.test_sampling_cli import VOCAB, FakeVLLM, _Handler, probs

from specadapt.cli import cli


class _Filtered(_Handler):
    """Samples the chain at the request's temperature and top_k, or with the fake's fault: "top-k
    ignored" (the whole vocabulary, a filter skipped) or "cold" (at half the asked temperature)."""

    def _weights(self, prev: int, body) -> np.ndarray:
        fake = self.server.fake
        temperature = body.get("temperature", 1.0) * (0.5 if fake.fault == "cold" else 1.0)
        top_k = 0 if fake.fault == "top-k ignored" else body.get("top_k", 0)
        q = probs(prev) ** (1 / temperature)
        return np.where(q >= np.sort(q)[-top_k], q, 0.0) if 0 < top_k < VOCAB else q


class FilteredVLLM(FakeVLLM):
    def __init__(self, spec: bool, fault: str | None = None):
        super().__init__(spec)
        self.fault = fault
        self.httpd.RequestHandlerClass = _Filtered


def run(*args: str):
    result = CliRunner().invoke(cli, ["equiv", "--features", "top-k-20", *args], terminal_width=400)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result


def sampled(server: FakeVLLM) -> list[dict]:
    return [b for path, b in server.bodies if path == "/v1/completions" and b.get("prompt_logprobs") is None]


def test_a_cell_that_ignores_top_k_stops_at_the_first_look_and_every_output_says_so(tmp_path):
    with FilteredVLLM(spec=False) as off, FilteredVLLM(spec=True, fault="top-k ignored") as on:
        result = run("--until-decided", "--off", off.url, "--on", on.url, "--samples", "8", "--max-tokens", "32",
                     "--out", str(tmp_path / "out"))
        sent = sampled(on)
    assert result.exit_code == 1, result.output
    # 3 prompts x 8 samples in 4 looks: the first look is each prompt's first two samples (seeds 0, 1, 8, 9, ...)
    assert sorted(b["seed"] for b in sent) == [0, 1, 8, 9, 16, 17]
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["settings"]["looks"] == 4
    (cell,) = report["cells"]
    looks = cell["looks"]
    assert (looks["looks"], looks["stopped_at"], looks["samples"], looks["fixed_samples"]) == (4, 1, 6, 24)
    assert looks["alphas"] == pytest.approx([0.01 / 6] * 3 + [0.005])
    assert cell["verdict"] == "fail" and cell["stats"]["alpha"] == pytest.approx(0.01 / 6)
    assert "0.00167 at each of looks 1-3 and 0.005 at the last" in result.output
    assert "top-k-20: until decided: stopped at look 1 of 4" in result.output
    assert "stopped at look 1 of 4" in (tmp_path / "out" / "summary.md").read_text()


def test_a_correct_cell_runs_all_four_looks_and_passes(tmp_path):
    with FilteredVLLM(spec=False) as off, FilteredVLLM(spec=True) as on:
        result = run("--until-decided", "--off", off.url, "--on", on.url, "--max-tokens", "32", "--seed", "5",
                     "--json", str(tmp_path / "r.json"))
        sent = sampled(on)
    assert result.exit_code == 0, result.output
    assert sorted(b["seed"] for b in sent) == list(range(5, 5 + 24))  # every sample of the fixed design, once
    (cell,) = json.loads((tmp_path / "r.json").read_text())["cells"]
    assert cell["verdict"] == "pass" and cell["looks"]["stopped_at"] == 4 and cell["looks"]["samples"] == 24
    assert [h["samples"] for h in cell["looks"]["history"]] == [6, 12, 18, 24]
    assert "top-k-20: until decided: ran all 4 looks" in result.output


@pytest.mark.parametrize(("extra", "refused"), [(["--max-units", "12"], "--max-units belongs"),
                                                (["--equivalence-margin", "0.05"], "--equivalence-margin belongs")])
def test_the_speed_rule_s_options_stay_refused_with_features(extra, refused):
    result = run("--off", "http://127.0.0.1:9", "--on", "http://127.0.0.1:9", "--until-decided", *extra)
    assert result.exit_code == 2
    assert [ln for ln in result.output.splitlines() if ln.startswith("error: ")] == [
        f"error: {refused} to compare and equiv's identity gate, not to --sampling or --features (they decide on "
        "their own samples)"]

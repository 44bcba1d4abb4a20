"""`specadapt equiv --sampling --until-decided` end to end against the loopback fake of vLLM's API
(tests/commands/test_sampling_cli.py): four looks, an interim look stops only to reject."""

from __future__ import annotations

import json

import pytest
from commands.test_sampling_cli import FakeVLLM, prompts, run  # noqa: F401 (prompts: a fixture)


def sampled(server: FakeVLLM) -> list[dict]:
    return [b for path, b in server.bodies if path == "/v1/completions"]


def test_a_grossly_different_distribution_stops_at_the_first_look_with_differs(tmp_path, prompts):
    with FakeVLLM(spec=False) as off, FakeVLLM(spec=True, temperature=0.5) as on:
        result = run("--until-decided", "--off", off.url, "--on", on.url, "--prompts", str(prompts), "--samples", "16",
                     "--max-tokens", "16", "--out", str(tmp_path / "out"))
        sent, scored = sampled(on), sampled(off)
    assert result.exit_code == 1, result.output
    # the first of 4 looks: 32 samples / 4 = 8 sent and scored, 4 per prompt (seeds 0-3 and 16-19)
    assert len(sent) == 8 and len(scored) == 8
    assert sorted(b["seed"] for b in sent) == [0, 1, 2, 3, 16, 17, 18, 19]
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    looks = report["looks"]
    assert (looks["looks"], looks["stopped_at"], looks["samples"], looks["fixed_samples"]) == (4, 1, 8, 32)
    assert [h["status"] for h in looks["history"]] == ["inconsistent"]
    assert report["stats"]["status"] == "inconsistent" and report["stats"]["n_tokens"] == 8 * 16
    assert report["stats"]["alpha"] == pytest.approx(0.01 / 6)
    assert report["settings"]["looks"] == 4 and not report["gate"]["passed"]
    assert "until decided: stopped at look 1 of 4: the sampling distribution differs" in result.output
    assert "after 8 of the fixed design's 32 samples" in result.output
    assert "false-alarm rate: alpha = 0.01 over 4 looks" in result.output
    assert "stopped at look 1 of 4" in (tmp_path / "out" / "summary.md").read_text()


def test_identical_distributions_run_all_four_looks_and_pass_as_the_fixed_design_at_half_alpha(tmp_path, prompts):
    common = ["--prompts", str(prompts), "--samples", "16", "--max-tokens", "16", "--seed", "7"]
    with FakeVLLM(spec=False) as off, FakeVLLM(spec=True) as on:
        result = run("--until-decided", "--off", off.url, "--on", on.url, *common, "--json", str(tmp_path / "r.json"))
        sent = sampled(on)
        fixed = run("--alpha", "0.005", "--off", off.url, "--on", on.url, *common, "--json", str(tmp_path / "f.json"))
    assert result.exit_code == 0, result.output
    assert fixed.exit_code == 0, fixed.output
    assert sorted(b["seed"] for b in sent) == list(range(7, 7 + 32))  # every sample of the fixed design, once
    report = json.loads((tmp_path / "r.json").read_text())
    looks = report["looks"]
    assert (looks["stopped_at"], looks["samples"], looks["fixed_samples"]) == (4, 32, 32)
    assert [h["samples"] for h in looks["history"]] == [8, 16, 24, 32]
    assert [h["alpha"] for h in looks["history"]] == pytest.approx([0.01 / 6] * 3 + [0.005])
    assert all(h["status"] == "consistent" for h in looks["history"])
    assert report["gate"]["passed"] is True
    # the last look tests the very tokens of the fixed design, at alpha / 2: the same statistics
    alone = json.loads((tmp_path / "f.json").read_text())
    assert alone["looks"] is None and alone["settings"]["looks"] is None
    assert report["stats"] == alone["stats"]
    assert "until decided: ran all 4 looks" in result.output


def test_the_rule_is_refused_with_the_servers_one_after_the_other():
    result = run("--until-decided", "--spec-config", '{"method": "ngram", "k": 4}', "--launch", "sequential")
    assert result.exit_code == 2
    assert [ln for ln in result.output.splitlines() if ln.startswith("error: ")] == [
        "error: --until-decided needs both servers up at once (each look's samples are scored as they come): leave "
        "out --launch sequential, or --until-decided"]

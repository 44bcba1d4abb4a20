"""specadapt as a library: a user's own script (plain Python in a process of its own, without the
command layer) runs a compare and a sampling check against stand-in servers and gets reports
whose figures it prints; and check_sampling's paths (one server after the other, its bars and
messages, plans it refuses) in this process.

The stand-ins: the scripted SSE server (specadapt.testing: a real process whose tokens and
speculative counters are known) for the compare, and the loopback fake of vLLM's sampling and
scoring API of the ``equiv --sampling`` tests for the sampling check.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from commands.test_sampling_cli import FakeVLLM

import specadapt
from specadapt.orchestration import sampling
from specadapt.orchestration.servers import Messages, ServerOptions, ServerPlan, Side, plan_servers
from specadapt.records import Prompt
from specadapt.records.sampling_report import SamplingSettings
from specadapt.testing import scripted_server

pytest.importorskip("uvicorn", reason="the scripted server needs uvicorn (pip install 'specadapt[test]')")

ROOT = Path(specadapt.__file__).resolve().parents[1]

USER_SCRIPT = textwrap.dedent('''
    """Compare spec off with spec on, then check the sampling distribution, without the CLI."""
    import json
    import sys

    from specadapt.orchestration.ab import compare_servers
    from specadapt.orchestration.sampling import check_sampling, sampling_sides, tokenizer_text
    from specadapt.orchestration.servers import ServerOptions, ab_sides, plan_servers
    from specadapt.records import CompareSettings, Prompt, RequestSettings
    from specadapt.records.sampling_report import SamplingSettings
    from specadapt.testing import script

    scripted, off_url, on_url = sys.argv[1:4]
    bars = []

    def bar(label, total):
        bars.append([label, total, 0])
        def tick(record):
            bars[-1][2] += 1
        return tick

    opts = ServerOptions()  # vLLM, the command line's defaults
    prompts = [Prompt(id=f"p{i}", prompt=script(id=f"lib-{i}", ttft_ms=2, itl_ms=1, tokens=6, tokens_per_chunk=3))
               for i in range(2)]
    request = RequestSettings(max_tokens=6, logprobs=True, top_logprobs=0)
    compares = {}
    for interleaved in (True, False):
        settings = CompareSettings(concurrency=[1], repeat=2, warmup=0, request=request, triage=False,
                                   interleaved=interleaved)
        report = compare_servers(plan_servers(opts, ab_sides(scripted, scripted)), prompts, settings, bars=bar)
        level = report.levels[0]
        compares["interleaved" if interleaved else "one after the other"] = {
            "counts": report.counts,
            "requests": [[r.side, r.prompt_id, r.ok, r.output_tokens] for r in report.requests],
            "level": level.concurrency,
            "pairs": level.pairs,
            "acceptance_rate": level.acceptance.acceptance_rate,
            "mean_acceptance_length": level.acceptance.mean_acceptance_length,
        }

    plan = plan_servers(opts, sampling_sides(off_url, on_url, None))
    settings = SamplingSettings(samples=8, max_tokens=16, alpha=0.01, top_logprobs=20, concurrency=4, seed=5,
                                request_timeout_s=30, source="server", tokenizer=tokenizer_text(True, False, None))
    prompts = [Prompt(id="chat", messages=[{"role": "user", "content": "hi"}]), Prompt(id="text", prompt="a b")]
    report = check_sampling(plan, prompts, settings, bars=bar)
    checked = {"passed": report.gate.passed, "status": report.stats.status, "tokens": report.stats.n_tokens,
               "prompts": [[p.prompt_id, p.samples, p.tokens] for p in report.prompts],
               "drafts": report.acceptance.drafts, "source": report.source}
    commands = sorted(m for m in sys.modules if m == "specadapt.cli" or m.startswith("specadapt.commands"))
    print(json.dumps({"compare": compares, "sampling": checked, "bars": bars, "command_layer": commands}))
''')


@pytest.fixture(scope="module")
def scripted(tmp_path_factory):
    with scripted_server(tmp_path_factory.mktemp("scripted") / "server.log") as process:
        yield process.plan.base_url


def test_a_users_script_runs_a_compare_and_a_sampling_check_and_reads_the_figures(tmp_path, scripted):
    (tmp_path / "user.py").write_text(USER_SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with FakeVLLM(spec=False) as off, FakeVLLM(spec=True) as on:
        proc = subprocess.run([sys.executable, str(tmp_path / "user.py"), scripted, off.url, on.url], cwd=ROOT,
                              env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr == ""  # a library prints nothing unless the script configures logging
    out = json.loads(proc.stdout)
    assert out["command_layer"] == []  # the command layer (click) was never imported
    for how, compare in out["compare"].items():
        assert compare["counts"] == {"identical": 2, "near-tie": 0, "suspect": 0, "unknown": 0}, how
        assert sorted(map(tuple, compare["requests"])) == sorted(
            (side, p, True, 6) for side in ("off", "on") for p in ("p0", "p1") for _ in range(2)), how
        assert (compare["level"], compare["pairs"]) == (1, 4), how
        # every chunk of 3 tokens is one draft of k=3 with 2 accepted (the scripted server's counters)
        assert compare["acceptance_rate"] == pytest.approx(2 / 3), how
        assert compare["mean_acceptance_length"] == pytest.approx(3.0), how
    checked = out["sampling"]
    assert (checked["passed"], checked["status"], checked["tokens"]) == (True, "consistent", 2 * 8 * 16)
    assert checked["prompts"] == [["chat", 8, 128], ["text", 8, 128]]
    assert checked["drafts"] == 16  # the spec-on fake counts one draft per sampling request
    assert checked["source"].startswith(f"the spec-off server's prompt_logprobs at {off.url}")
    assert out["bars"] == [["comparing", 8, 8], ["spec on", 4, 4], ["spec off", 4, 4],
                           ["sampling", 16, 16], ["scoring", 16, 16]]


# --- check_sampling in this process ----------------------------------------------------------------
PROMPTS = [Prompt(id="chat", messages=[{"role": "user", "content": "hi"}]), Prompt(id="text", prompt="a b")]


def settings(**kw) -> SamplingSettings:
    base = dict(samples=4, max_tokens=10, alpha=0.01, top_logprobs=5, concurrency=2, seed=100, request_timeout_s=30,
                source="server", tokenizer="t")
    return SamplingSettings(**{**base, **kw})


def plan_of(off: FakeVLLM, on: FakeVLLM) -> ServerPlan:
    return plan_servers(ServerOptions(), sampling.sampling_sides(off.url, on.url, None))


class Bars:
    def __init__(self):
        self.asked: list[tuple[str, int]] = []
        self.records: list = []

    def __call__(self, label: str, total: int):
        self.asked.append((label, total))
        return self.records.append


def test_one_after_the_other_the_spec_on_server_tokenizes_and_samples_and_the_spec_off_server_scores():
    bars, said = Bars(), []
    with FakeVLLM(spec=False) as off, FakeVLLM(spec=True) as on:
        report = sampling.check_sampling(plan_of(off, on), PROMPTS, settings(), sequential=True, bars=bars,
                                         messages=Messages(say=said.append))
    assert [path for path, _ in on.bodies[:2]] == ["/tokenize", "/tokenize"]
    assert {path for path, _ in on.bodies[2:]} == {"/v1/completions"} and len(on.bodies) == 2 + 8
    assert all("prompt_logprobs" not in body for _, body in on.bodies)
    assert [path for path, _ in off.bodies] == ["/v1/completions"] * 8  # scoring only: no /tokenize
    assert all(body["prompt_logprobs"] == 5 for _, body in off.bodies)
    assert bars.asked == [("sampling", 8), ("scoring", 8)]
    assert sorted(r.prompt_id for r in bars.records) == ["chat"] * 8 + ["text"] * 8
    sampled = [r for r in bars.records if r.output_tokens == 10]
    assert len(sampled) == 8 and all(r.ok and r.finish_reason == "length" and r.status_code == 200 for r in sampled)
    assert [(p.prompt_id, p.samples, p.tokens) for p in report.prompts] == [("chat", 4, 40), ("text", 4, 40)]
    assert report.source_server is not None and report.source_server.base_url == off.url
    assert report.on_server.base_url == on.url and report.acceptance.drafts == 8
    assert said == []  # servers given by URL: nothing started, nothing to say


def test_side_by_side_the_spec_off_server_tokenizes_and_scores():
    with FakeVLLM(spec=False) as off, FakeVLLM(spec=True) as on:
        report = sampling.check_sampling(plan_of(off, on), PROMPTS, settings(samples=2))
    assert [path for path, _ in off.bodies[:2]] == ["/tokenize", "/tokenize"] and len(off.bodies) == 2 + 4
    assert {path for path, _ in on.bodies} == {"/v1/completions"} and len(on.bodies) == 4
    assert [(p.prompt_id, p.samples, p.prompt_tokens) for p in report.prompts] == [("chat", 2, 3), ("text", 2, 2)]


def test_the_sides_of_the_check_and_what_tokenizes():
    assert [s.label for s in sampling.sampling_sides(None, None, None)] == ["spec-off", "spec-on"]
    assert [(s.label, s.url) for s in sampling.sampling_sides(None, None, "/ref")] == [("spec-on", None)]
    assert [(s.label, s.url) for s in sampling.sampling_sides("http://a", "http://b", "/ref")] == [
        ("spec-off", "http://a"), ("spec-on", "http://b")]
    assert sampling.tokenizer_text(True, False, None) == "the spec-off server's /tokenize"
    assert sampling.tokenizer_text(True, True, None) == ("the spec-on server's /tokenize (servers started one "
                                                         "after the other)")
    assert sampling.tokenizer_text(False, False, "/ref") == "the local tokenizer of /ref"


def test_a_plan_without_a_spec_on_side_or_a_source_is_refused():
    plan = plan_servers(ServerOptions(), [Side(url="http://a", label="spec-off")])
    with pytest.raises(ValueError, match="a spec-on side"):
        sampling.check_sampling(plan, PROMPTS, settings())
    alone = plan_servers(ServerOptions(), [Side(url="http://b", label="spec-on")])
    with pytest.raises(ValueError, match="needs the reference distribution"):
        sampling.check_sampling(alone, PROMPTS, settings())
    strange = plan_servers(ServerOptions(), [Side(url="http://b", label="spec-on"), Side(url="http://c", label="x")])
    with pytest.raises(ValueError, match="optionally, a spec-off side"):
        sampling.check_sampling(strange, PROMPTS, settings())


def test_the_documented_example_runs_against_the_scripted_server(tmp_path, scripted):
    """docs/library.md's example, its two URLs pointed at the scripted server (as the spec-off and the
    spec-on side, so the outputs are identical and the gate passes), run as a user's script."""
    page = (ROOT / "docs" / "library.md").read_text()
    code = page.split("```python\n", 1)[1].split("```", 1)[0]
    for name in ("OFF", "ON"):
        line = next(ln for ln in code.splitlines() if ln.startswith(f"{name} = "))
        code = code.replace(line, f"{name} = {scripted!r}")
    code = code.replace("max_tokens=32", "max_tokens=4").replace("duration_s=5", "duration_s=1")
    (tmp_path / "example.py").write_text(code)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, str(tmp_path / "example.py")], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert [ln.split(":")[0] for ln in lines[:2]] == ["2 req/s", "4 req/s"]  # one line per rate, its goodput
    assert lines[-1].startswith("gate: passed") and "'identical': 2" in lines[-1]

"""Speculation per request against the scripted server (real HTTP on loopback, a separate process):
chunks that are one engine step each are read as passes and add up to the server's counters;
chunks that merge engine steps (a stream interval above 1) are refused, never misread as passes."""

from __future__ import annotations

import json

import httpx
from click.testing import CliRunner

from specadapt.cli import cli
from specadapt.orchestration.probe import run_probe
from specadapt.records import Prompt, RequestSettings
from specadapt.testing import script

# Engine steps per answer: the prefill's one token, then passes of the target that each accepted
# tokens - 1 draft tokens (the scripted server drafts k = 3, so at most 4 tokens a pass).
STEPS = {"a": [1, 4, 1, 3, 2, 4, 1], "b": [1, 1, 4, 4, 2, 1, 3, 1]}
ACCEPTED = {"a": 3 + 0 + 2 + 1 + 3 + 0, "b": 0 + 3 + 3 + 1 + 0 + 2 + 0}  # by hand: tokens - 1 per pass


def prompts(tag: str, steps_per_chunk: int) -> list[Prompt]:
    return [Prompt(id=p, category=f"cat-{p}",
                   prompt=script(id=f"{tag}-{p}", ttft_ms=2, itl_ms=1, steps=steps, steps_per_chunk=steps_per_chunk))
            for p, steps in STEPS.items()]


def counters(url: str) -> dict[str, float]:
    """The scripted server's spec counters, read here (not through specadapt's parser)."""
    out = {}
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith("vllm:spec_decode_num_accepted_tokens_total"):
            out["accepted"] = float(line.split()[-1])
        if line.startswith("vllm:spec_decode_num_drafts_total"):
            out["drafts"] = float(line.split()[-1])
    return out


def test_one_step_chunks_are_read_as_passes_that_add_up_to_the_counters(server, scripted_url):
    before = counters(scripted_url)
    report = run_probe(server, prompts("one", 1), RequestSettings(max_tokens=32), concurrency=1, warmup=0, show=2)
    after = counters(scripted_url)
    # the server counted exactly the scripted steps (the tool is what the test says it is)
    assert after["accepted"] - before["accepted"] == sum(ACCEPTED.values())
    assert after["drafts"] - before["drafts"] == sum(len(s) - 1 for s in STEPS.values())
    sp = report.speculation
    assert sp is not None and sp.available, sp and sp.source_note
    assert sp.source == "chunks"
    by_prompt = {a.prompt_id: a for a in sp.requests}
    assert sorted(by_prompt) == sorted(STEPS)
    for p, steps in STEPS.items():
        assert by_prompt[p].passes == steps
        assert by_prompt[p].accepted == ACCEPTED[p]
        assert by_prompt[p].category == f"cat-{p}"
    # the per-request sum equals the counters' delta over the same requests, both as read here and as reported
    assert sum(a.accepted for a in sp.requests) == after["accepted"] - before["accepted"]
    assert report.counters_after.accepted_tokens - report.counters_before.accepted_tokens == sum(ACCEPTED.values())
    (check,) = sp.checks
    assert check.agree and check.accepted_requests == check.accepted_counters == sum(ACCEPTED.values())
    assert sp.overall.passes == sum(len(s) for s in STEPS.values())
    assert sp.overall.tokens_histogram == [sum(s.count(t) for s in STEPS.values()) for t in range(1, 5)]
    assert sorted(c.name for c in sp.categories) == ["cat-a", "cat-b"]
    assert report.settings.show == 2 and sorted(sp.requests[i].prompt_id for i in sp.shown) == sorted(STEPS)


def test_merged_chunks_are_refused_not_misread(server, scripted_url):
    before = counters(scripted_url)
    report = run_probe(server, prompts("merged", 2), RequestSettings(max_tokens=32), concurrency=1, warmup=0)
    after = counters(scripted_url)
    # the counters still count every engine step; the chunks merged two steps each after the prefill
    assert after["accepted"] - before["accepted"] == sum(ACCEPTED.values())
    for r in report.requests:
        steps = STEPS[r.prompt_id]
        merged = [steps[0]] + [sum(steps[i:i + 2]) for i in range(1, len(steps), 2)]
        assert r.ok and r.chunk_tokens == merged, (r.chunk_tokens, merged)
    sp = report.speculation
    assert sp is not None and not sp.available
    assert sp.source_note.startswith("per-request acceptance not available: ")
    assert "not one engine step" in sp.source_note, sp.source_note
    assert sp.requests == [] and sp.overall is None
    (check,) = sp.checks  # the chunks claim more accepted tokens than the server counted
    assert not check.agree and check.accepted_counters == sum(ACCEPTED.values())
    assert check.accepted_requests > check.accepted_counters


def test_probe_cli_json_carries_the_refusal_and_the_passes(scripted_url, tmp_path):
    def probe(tag: str, steps_per_chunk: int) -> dict:
        path = tmp_path / f"{tag}.jsonl"
        path.write_text("".join(json.dumps({"id": p.id, "category": p.category, "prompt": p.prompt}) + "\n"
                                for p in prompts(tag, steps_per_chunk)))
        out = tmp_path / f"{tag}.json"
        res = CliRunner().invoke(cli, ["probe", "--url", scripted_url, "--prompts", str(path), "--concurrency", "1",
                                       "--warmup", "0", "--max-tokens", "32", "--json", str(out)])
        assert res.exit_code == 0, res.output
        return json.loads(out.read_text())["speculation"]

    merged = probe("cli-merged", 2)
    assert merged["available"] is False and "not one engine step" in merged["source_note"]
    one = probe("cli-one", 1)
    assert one["available"] is True
    assert {r["prompt_id"]: r["passes"] for r in one["requests"]} == STEPS
    (check,) = one["checks"]
    assert check["agree"] and check["accepted_counters"] == sum(ACCEPTED.values())


def test_a_first_chunk_of_several_tokens_is_refused(server):
    """Chunks of a fixed size from the first token on: the prefill's one token is not alone, so no chunk
    is read as a pass, whatever the counters say."""
    prompts = [Prompt(id=f"fixed{i}", prompt=script(id=f"fixed-{i}", ttft_ms=2, itl_ms=1, tokens=12,
                                                    tokens_per_chunk=4)) for i in range(2)]
    report = run_probe(server, prompts, RequestSettings(max_tokens=32), concurrency=1, warmup=0)
    assert [r.chunk_tokens for r in report.requests] == [[4, 4, 4]] * 2
    sp = report.speculation
    assert sp is not None and not sp.available and sp.requests == []
    assert "its first chunk carries 4 tokens, not the prefill's one" in sp.source_note, sp.source_note

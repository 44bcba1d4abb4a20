"""The distribution cells of `equiv --features --until-decided` in this process, on the loopback fake of
vLLM's sampling and scoring API taught to apply the cell's temperature and top_k
(tests/commands/test_features_until_decided.py ``FilteredVLLM``): a cell whose samples are grossly wrong stops at the first look, a correct one
runs every look, passes, and tests at its last look the very tokens of the fixed design at alpha / 2."""

from __future__ import annotations

import asyncio

import pytest
from commands.test_features_until_decided import FilteredVLLM
from commands.test_sampling_cli import FakeVLLM

from specadapt.analysis import features as F
from specadapt.orchestration import features
from specadapt.orchestration.servers import ServerOptions, ServerPlan, ab_sides, plan_servers
from specadapt.records.features import FeatureSettings


def settings(**kw) -> FeatureSettings:
    base = dict(features=["top-k-20"], max_tokens=8, samples=8, sample_tokens=32, alpha=0.01, top_logprobs=20,
                concurrency=2, seed=3, request_timeout_s=30, near_tie_threshold=0.01, source="server", looks=4)
    return FeatureSettings(**{**base, **kw})


def plan_of(off: FakeVLLM, on: FakeVLLM) -> ServerPlan:
    return plan_servers(ServerOptions(), ab_sides(off.url, on.url))


def sampled(server: FakeVLLM) -> list[dict]:
    return [b for path, b in server.bodies if path == "/v1/completions" and b.get("prompt_logprobs") is None]


def scored(server: FakeVLLM) -> list[dict]:
    return [b for path, b in server.bodies if path == "/v1/completions" and b.get("prompt_logprobs") is not None]


@pytest.mark.parametrize("fault", ["top-k ignored", "cold"])
def test_a_grossly_wrong_distribution_stops_the_cell_at_the_first_look(fault):
    """3 prompts x 8 samples = 24 samples in 4 looks of 6 (each prompt's first two, seeds base + 8 p + j):
    192 tokens at look 1, rejected there at alpha / 6."""
    with FilteredVLLM(spec=False) as off, FilteredVLLM(spec=True, fault=fault) as on:
        report = features.check_features(plan_of(off, on), settings())
        sent, tested = sampled(on), scored(off)
    (cell,) = report.cells
    assert sorted(b["seed"] for b in sent) == [3, 4, 11, 12, 19, 20]
    assert len(tested) == 6 and all(b["top_k"] == 20 for b in sent)
    assert cell.verdict == "fail" and not report.gate.passed
    looks = cell.looks
    assert looks is not None
    assert (looks.looks, looks.stopped_at, looks.samples, looks.fixed_samples) == (4, 1, 6, 24)
    assert looks.alphas == pytest.approx([0.01 / 6] * 3 + [0.005])
    assert [h.status for h in looks.history] == ["inconsistent"]
    assert cell.stats.alpha == pytest.approx(0.01 / 6) and cell.stats.n_tokens == 6 * 32
    assert (cell.requests, cell.tokens) == (6, 6 * 32)
    assert cell.notes == [f"until decided: {looks.text}"]
    assert looks.text.startswith("stopped at look 1 of 4") and "after 6 of the fixed design's 24 samples" in looks.text
    assert cell.activity.acceptance.drafts == 6  # the counters over the samples sent


def test_a_correct_distribution_runs_every_look_and_passes_as_the_fixed_design_at_half_alpha():
    with FilteredVLLM(spec=False) as off, FilteredVLLM(spec=True) as on:
        report = features.check_features(plan_of(off, on), settings())
        seeds = [b["seed"] for b in sampled(on)]
        fixed = features.check_features(plan_of(off, on), settings(looks=None, alpha=0.005))
    (cell,), (alone,) = report.cells, fixed.cells
    # each look's batch drawn whole before the next: each prompt's next two seeds
    assert [sorted(seeds[6 * i:6 * i + 6]) for i in range(4)] == [
        [3 + 2 * i, 4 + 2 * i, 11 + 2 * i, 12 + 2 * i, 19 + 2 * i, 20 + 2 * i] for i in range(4)]
    assert cell.verdict == "pass" and report.gate.passed
    looks = cell.looks
    assert (looks.stopped_at, looks.samples, looks.fixed_samples) == (4, 24, 24)
    assert [h.samples for h in looks.history] == [6, 12, 18, 24]
    assert [h.alpha for h in looks.history] == pytest.approx([0.01 / 6] * 3 + [0.005])
    assert all(h.status == "consistent" for h in looks.history)
    assert looks.text.startswith("ran all 4 looks")
    # the last look tests the fixed design's very tokens in its order, at alpha / 2: the same statistics
    assert alone.verdict == "pass" and alone.looks is None and alone.notes == []
    assert cell.stats == alone.stats and cell.stats.alpha == pytest.approx(0.005)
    assert (cell.requests, cell.tokens) == (alone.requests, alone.tokens) == (24, 24 * 32)


def test_without_the_rule_a_faulty_cell_sends_every_sample_and_states_no_looks():
    with FilteredVLLM(spec=False) as off, FilteredVLLM(spec=True, fault="top-k ignored") as on:
        report = features.check_features(plan_of(off, on), settings(looks=None))
        sent = sampled(on)
    (cell,) = report.cells
    assert len(sent) == 24 and cell.verdict == "fail" and cell.looks is None and cell.notes == []
    assert cell.stats.alpha == pytest.approx(0.01)


def test_a_cell_that_cannot_be_scored_exactly_is_refused_before_any_look():
    with FilteredVLLM(spec=False) as off, FilteredVLLM(spec=True) as on:
        report = features.check_features(plan_of(off, on), settings(features=["temperature-0.7"]))
        sent = sampled(on)
    (cell,) = report.cells
    assert cell.verdict == "not-exact" and cell.looks is None and sent == []


def test_looks_need_the_setting():
    m = features.Matrix(on=None, off=None, settings=settings(looks=None), reference=None, lossy=None,
                        max_model_len=None)
    with pytest.raises(ValueError, match="needs settings.looks"):
        asyncio.run(features.sample_in_looks(m, F.Setting.of({"top_k": 20}), []))

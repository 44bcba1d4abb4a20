"""check_sampling with looks (equiv --sampling --until-decided) in this process, on the loopback fake of
vLLM's sampling and scoring API: what each look sends, the bars, and the plans it refuses."""

from __future__ import annotations

import pytest
from commands.test_sampling_cli import FakeVLLM

from specadapt.errors import UsageError
from specadapt.orchestration import sampling
from specadapt.records.sampling_report import SamplingSettings
from tests.unit.test_library_use import PROMPTS, plan_of  # the same two prompts, the same plan

def settings(**kw) -> SamplingSettings:
    base = dict(samples=8, max_tokens=16, alpha=0.01, top_logprobs=20, concurrency=2, seed=40, request_timeout_s=30,
                source="server", tokenizer="t", looks=4)
    return SamplingSettings(**{**base, **kw})


class Bars:
    def __init__(self):
        self.asked: list[tuple[str, int]] = []
        self.ticks: dict[str, int] = {}

    def __call__(self, label: str, total: int):
        self.asked.append((label, total))
        self.ticks[label] = 0

        def tick(record):
            self.ticks[label] += 1
        return tick


@pytest.mark.parametrize("max_tokens, stopped_at", [(32, 1), (16, 2)])
def test_a_faulty_sampler_is_stopped_at_the_first_look_that_can_test(max_tokens, stopped_at):
    """4 samples a look: 128 tokens at 32 each, tested and rejected at once; at 16 each the first look
    has 64 tokens, too few to test (fewer than 5 per PIT bin), so the run goes on and stops at look 2."""
    bars = Bars()
    with FakeVLLM(spec=False) as off, FakeVLLM(spec=True, temperature=0.5) as on:
        report = sampling.check_sampling(plan_of(off, on), PROMPTS, settings(max_tokens=max_tokens), bars=bars)
        sent = [b["seed"] for p, b in on.bodies if p == "/v1/completions"]
        scored = [b for p, b in off.bodies if p == "/v1/completions"]
    # 16 samples / 4 looks: each look the next two of each prompt (chat: seeds 40-47, text: 48-55)
    first = [40, 41, 48, 49] if stopped_at == 1 else [40, 41, 42, 43, 48, 49, 50, 51]
    used = len(first)
    assert sorted(sent) == first and len(scored) == used
    assert bars.asked == [("sampling", 16), ("scoring", 16)] and bars.ticks == {"sampling": used, "scoring": used}
    assert report.looks is not None and (report.looks.stopped_at, report.looks.samples) == (stopped_at, used)
    assert [h.status for h in report.looks.history] == ["too-few"] * (stopped_at - 1) + ["inconsistent"]
    assert report.stats.n_tokens == used * max_tokens and report.stats.status == "inconsistent"
    assert [(p.prompt_id, p.samples) for p in report.prompts] == [("chat", used // 2), ("text", used // 2)]
    assert report.acceptance.drafts == used  # the counters over the samples sent


def test_a_healthy_sampler_sends_every_batch_scoring_each_before_the_next_is_drawn():
    with FakeVLLM(spec=False) as off, FakeVLLM(spec=True) as on:
        report = sampling.check_sampling(plan_of(off, on), PROMPTS, settings(), bars=Bars())
        seeds = [b["seed"] for p, b in on.bodies if p == "/v1/completions"]
    # each look's batch is drawn whole before the next one: seeds of batch i come before those of batch i + 1
    batches = [{40, 41, 48, 49}, {42, 43, 50, 51}, {44, 45, 52, 53}, {46, 47, 54, 55}]
    assert [set(seeds[4 * i:4 * i + 4]) for i in range(4)] == batches
    assert report.looks.stopped_at == 4 and [h.samples for h in report.looks.history] == [4, 8, 12, 16]
    assert report.gate.passed and report.stats.alpha == pytest.approx(0.005)


def test_looks_are_refused_with_the_servers_one_after_the_other_and_need_the_setting():
    with FakeVLLM(spec=False) as off, FakeVLLM(spec=True) as on:
        with pytest.raises(UsageError, match="--until-decided needs both servers up at once"):
            sampling.check_sampling(plan_of(off, on), PROMPTS, settings(), sequential=True)
        assert on.bodies == [] and off.bodies == []
    with pytest.raises(ValueError, match="needs settings.looks"):
        sampling.sample_and_score_in_looks(None, None, [], settings(looks=None))

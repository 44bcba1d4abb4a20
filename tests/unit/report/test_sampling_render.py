"""The sampling report's renderers with and without the looks of --until-decided."""

from __future__ import annotations

from rich.console import Console

from specadapt.analysis import sampling_check as C
from specadapt.records import ServerInfo
from specadapt.records.sampling import SamplingStats, SamplingTest
from specadapt.records.sampling_report import PromptTokens, SamplingLook, SamplingReport, SamplingSettings
from specadapt.report import sampling_render as R


def report(looks: bool) -> SamplingReport:
    settings = SamplingSettings(samples=16, max_tokens=16, alpha=0.01, top_logprobs=20, concurrency=4, seed=0,
                                request_timeout_s=60, source="server", tokenizer="t", looks=4 if looks else None)
    alpha = 0.01 / 6 if looks else 0.01
    stats = SamplingStats(status="inconsistent", passed=False, n_tokens=128, min_tokens=100, alpha=alpha,
                          per_test_alpha=alpha / 3, power=0.8, bins=20, seed=0,
                          tests=[SamplingTest(name="pit-ks", statistic=0.4, p_value=1e-9, rejected=True)],
                          pit_histogram=[6] * 20, pit_expected_per_bin=6.4, rank_categories=[], summary="s")
    on = ServerInfo(backend="vllm", base_url="http://on", model_id="m", spec_enabled=True)
    outcome = C.looks_outcome(0.01, 4, 32, [SamplingLook(look=1, samples=8, tokens=128, alpha=alpha,
                                                         status="inconsistent", smallest_p=1e-9)]) if looks else None
    return SamplingReport(settings=settings, on_server=on, source="src", stats=stats,
                          prompts=[PromptTokens(prompt_id="p", category="c", prompt_tokens=3, samples=8, tokens=128,
                                                in_top_k=120)],
                          gate=C.sampling_gate(stats), looks=outcome)


def test_with_looks_the_false_alarm_rate_is_the_runs_alpha_and_the_deciding_looks_share():
    lines = R.power_lines(report(looks=True))
    assert lines[0] == ("false-alarm rate: alpha = 0.01 over 4 looks (the look that decided: 0.00167 family-wise, "
                        "over 1 tests, each at 0.000556): a correct server fails at most 1 run in 100")
    assert R.looks_line(report(looks=True)).startswith("until decided: stopped at look 1 of 4: the sampling "
                                                       "distribution differs (p=1e-09 <= 0.000556), after 8 of")


def test_without_looks_the_lines_are_as_before():
    assert R.looks_line(report(looks=False)) is None
    assert R.power_lines(report(looks=False))[0] == ("false-alarm rate: alpha = 0.01 family-wise (over 1 tests, each "
                                                     "at 0.00333): a correct server fails about 1 run in 100")
    assert "until decided" not in R.to_markdown(report(looks=False))


def test_console_and_markdown_carry_the_looks():
    md = R.to_markdown(report(looks=True))
    assert "\nUntil decided: stopped at look 1 of 4: " in md and "at most alpha in all).\n" in md
    console = Console(record=True, width=400)
    R.render_console(report(looks=True), console)
    text = console.export_text()
    assert "until decided: stopped at look 1 of 4" in text
    assert text.index("until decided:") < text.index("gate: FAIL")

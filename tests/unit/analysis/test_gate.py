"""The staging gate of `equiv` (analysis/gate.py): every threshold, its boundary and its exact reason."""

from __future__ import annotations

import pytest

from specadapt.analysis.gate import apply_gate
from specadapt.records import (
    CompareReport,
    CompareSettings,
    LevelResult,
    PromptIdentity,
    RatioCI,
    ServerInfo,
    SpeedRatios,
)

INFO = ServerInfo(backend="vllm", base_url="http://x")


def identity(verdicts: dict[str, str]) -> list[PromptIdentity]:
    return [PromptIdentity(prompt_id=pid, category="c", pairs=1, identical_pairs=int(v == "identical"), verdict=v)
            for pid, v in verdicts.items()]


def level(concurrency: int, throughput: float | None) -> LevelResult:
    ratio = RatioCI(point=throughput)
    return LevelResult.model_construct(concurrency=concurrency, pairs=1,
                                       speed=SpeedRatios(tpot=ratio, e2e=ratio, throughput=ratio))


def report(verdicts: dict[str, str], counts: dict[str, int], levels: list[LevelResult] = ()) -> CompareReport:
    return CompareReport(settings=CompareSettings(), off_server=INFO, on_server=INFO, identity=identity(verdicts),
                         counts=counts, levels=list(levels))


def test_a_clean_report_passes_and_the_gate_records_its_thresholds():
    r = report({"a": "identical"}, {"identical": 1}, [level(1, 1.5)])
    gate = apply_gate(r, max_suspect=2, max_near_tie=3, min_speedup=1.25)
    assert (gate.passed, gate.reasons) == (True, [])
    assert (gate.max_suspect, gate.max_near_tie, gate.min_speedup) == (2, 3, 1.25)
    assert r.gate is gate


def test_unknown_counts_as_suspect_and_both_are_named():
    r = report({"i": "identical", "s": "suspect", "u": "unknown", "n": "near-tie"},
               {"identical": 1, "suspect": 1, "unknown": 1, "near-tie": 1})
    gate = apply_gate(r, max_suspect=1)
    assert not gate.passed
    assert gate.reasons == ["2 suspect divergence(s) (max 1): s, u"]
    assert apply_gate(r, max_suspect=2).passed


@pytest.mark.parametrize("counts", [{"unknown": 1}, {"suspect": 1}])
def test_a_missing_count_is_zero(counts):
    verdict = next(iter(counts))
    assert apply_gate(report({"x": verdict}, counts), max_suspect=1).passed
    assert apply_gate(report({"x": "identical"}, {"identical": 1}), max_suspect=0, max_near_tie=0).passed


def test_at_most_ten_suspect_prompts_are_named():
    verdicts = {f"p{i:02d}": "suspect" for i in range(12)}
    gate = apply_gate(report(verdicts, {"suspect": 12}), max_suspect=0)
    assert gate.reasons == ["12 suspect divergence(s) (max 0): " + ", ".join(f"p{i:02d}" for i in range(10))]


def test_near_ties_fail_only_above_the_limit():
    r = report({"a": "near-tie", "b": "near-tie"}, {"near-tie": 2})
    assert apply_gate(r, max_near_tie=2).passed
    assert apply_gate(r).passed  # no limit: any number of near-ties
    gate = apply_gate(r, max_near_tie=1)
    assert gate.reasons == ["2 near-tie divergence(s) (max 1)"]


def test_speedup_is_read_at_the_first_level_and_the_limit_itself_passes():
    r = report({"a": "identical"}, {"identical": 1}, [level(4, 1.2), level(8, 0.5)])
    assert apply_gate(r, min_speedup=1.2).passed
    gate = apply_gate(r, min_speedup=1.21)
    assert gate.reasons == ["throughput speedup 1.20x at concurrency 4 is below 1.21x"]


@pytest.mark.parametrize("levels, where", [([], "?"), ([level(2, None)], "2")])
def test_an_unknown_speedup_fails_a_speedup_limit(levels, where):
    gate = apply_gate(report({"a": "identical"}, {"identical": 1}, levels), min_speedup=1.0)
    assert gate.reasons == [f"throughput speedup unknown at concurrency {where} is below 1.00x"]


def test_nothing_compared_fails():
    gate = apply_gate(report({}, {}))
    assert (gate.passed, gate.reasons) == (False, ["no prompt pair succeeded on both servers: nothing was compared"])


# ------------------------------------------------------------------------------ what the gate certifies

from specadapt.analysis.gate import bound_text, rate_bound  # noqa: E402
from specadapt.analysis.proof import rate_upper_bound  # noqa: E402
from specadapt.records import PromptActivity, SpecActivity  # noqa: E402


def active(report_: CompareReport, exercised: dict[str, bool | None], ran: bool | None = True,
           source: str = "chunks") -> CompareReport:
    prompts = [PromptActivity(prompt_id=pid, category="c", requests=1, output_tokens=10,
                              accepted=None if ex is None else 4 * ex, exercised=ex) for pid, ex in exercised.items()]
    report_.activity = SpecActivity(ran=ran, evidence="EVIDENCE", source=source, prompts=prompts,
                                    exercised_prompts=sum(1 for p in prompts if p.exercised))
    return report_


def test_a_spec_on_server_that_did_not_run_fails_unless_allowed():
    r = active(report({"a": "identical"}, {"identical": 1}), {"a": False}, ran=False)
    gate = apply_gate(r)
    assert gate.reasons == ["speculation did not run: an identity pass would prove nothing (EVIDENCE; "
                            "--allow-inactive accepts this)"]
    assert apply_gate(r, allow_inactive=True).passed and r.gate.allow_inactive


def test_a_run_that_cannot_show_speculation_ran_fails_unless_allowed():
    r = active(report({"a": "identical"}, {"identical": 1}), {"a": None}, ran=None, source="none")
    assert apply_gate(r).reasons == ["speculation not shown to run: an identity pass may prove nothing (EVIDENCE; "
                                     "--allow-inactive accepts this)"]
    assert apply_gate(r, allow_inactive=True).passed


def test_a_report_without_activity_is_judged_on_its_thresholds_alone():
    r = report({"a": "identical"}, {"identical": 1})
    gate = apply_gate(r)
    assert gate.passed and gate.bound is None


def test_a_lossy_configuration_fails_unless_allowed_and_names_every_setting():
    r = active(report({"a": "identical"}, {"identical": 1}), {"a": True})
    r.lossy = ["rejection_sample_method 'synthetic': X", "Y"]
    assert apply_gate(r).reasons == ["lossy by configuration, so identity is not promised: rejection_sample_method "
                                     "'synthetic': X; Y (--allow-lossy accepts this)"]
    assert apply_gate(r, allow_lossy=True).passed and r.gate.allow_lossy


def test_a_server_that_exited_during_the_run_fails_with_its_reason():
    r = active(report({"a": "identical"}, {"identical": 1}), {"a": True})
    r.server_exits = ["the spec-on server exited with code 1 during the run, saying: AssertionError: no"]
    assert apply_gate(r).reasons == r.server_exits


def test_the_bound_counts_exercised_prompts_and_their_suspects_only():
    r = active(report({"a": "identical", "b": "suspect", "c": "unknown", "d": "suspect", "e": "near-tie"},
                      {"identical": 1, "suspect": 2, "unknown": 1, "near-tie": 1}),
               {"a": True, "b": True, "c": True, "d": False, "e": True})
    bound = apply_gate(r, max_suspect=5).bound
    assert (bound.exercised_prompts, bound.suspect_prompts) == (4, 2)
    assert bound.upper == rate_upper_bound(2, 4) and bound.confidence == 0.95
    assert bound.exercised_tokens == 16
    assert set(bound.prompts_for) == {"0.01", "0.05"} and bound.prompts_for["0.05"] > bound.prompts_for["0.01"] / 10


def test_the_bound_has_no_token_count_without_a_per_prompt_source():
    r = active(report({"a": "identical"}, {"identical": 1}), {"a": None}, source="none")
    bound = rate_bound(r)
    assert (bound.exercised_prompts, bound.upper, bound.exercised_tokens) == (0, 1.0, None)
    assert bound_text(bound) == "no prompt used an accepted draft: the run bounds no suspect rate"


def test_bound_text_states_the_bound_and_the_prompts_it_would_take():
    r = active(report({p: "identical" for p in "abcdef"}, {"identical": 6}), {p: True for p in "abcdef"})
    assert bound_text(rate_bound(r)) == ("0 suspect in 6 exercised prompts: suspect rate below 39.3% at 95% confidence "
                                         "(showing 1% takes 299, 5% takes 59 exercised prompts at 0 suspect)")


def test_max_suspect_rate_fails_a_bound_above_it_and_says_how_many_more_prompts():
    r = active(report({p: "identical" for p in "abcdef"}, {"identical": 6}), {p: True for p in "abcdef"})
    gate = apply_gate(r, max_suspect_rate=0.05)
    assert (gate.max_suspect_rate, gate.allow_inactive, gate.allow_lossy) == (0.05, False, False)
    assert gate.reasons == ["suspect rate shown only below 39.3% (0 suspect in 6 exercised prompts, 95% confidence), "
                            "above --max-suspect-rate 5%: 53 more exercised prompts would be needed at 0 suspect "
                            "(59 in all)"]
    assert apply_gate(r, max_suspect_rate=0.4).passed  # 39.3% <= 40%
    assert not apply_gate(r, max_suspect_rate=rate_upper_bound(0, 6) * 0.999).passed
    assert apply_gate(r, max_suspect_rate=rate_upper_bound(0, 6)).passed  # the bound itself passes


def test_max_suspect_rate_without_activity_fails_saying_why():
    r = report({"a": "identical"}, {"identical": 1})
    assert apply_gate(r, max_suspect_rate=0.5).reasons == [
        "--max-suspect-rate: the report has no record of speculation per prompt to bound the rate over"]


def test_the_sampling_and_features_gates_are_one_model_and_old_reports_load():
    from specadapt.records.features import FeatureGate
    from specadapt.records.reports import PassGate
    from specadapt.records.sampling_report import SamplingGate

    assert FeatureGate is SamplingGate is PassGate
    assert list(PassGate.model_fields) == ["passed", "reasons"]
    saved = {"passed": False, "reasons": ["top-k-20: fail"]}  # a gate as reports before the one model saved it
    assert PassGate.model_validate(saved).model_dump() == saved
    assert PassGate(passed=True).model_dump_json() == '{"passed":true,"reasons":[]}'

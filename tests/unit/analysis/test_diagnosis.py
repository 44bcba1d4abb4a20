"""The diagnosis on constructed levels: each figure against its formula worked by hand, each cause
where its evidence is and absent where it is not, and "not enough evidence" where it is thin."""

from __future__ import annotations

import math

import pytest

from specadapt.analysis import diagnosis as dg
from specadapt.analysis.pairs import pair_records
from specadapt.analysis.text import pct
from specadapt.native_reference import theory
from specadapt.records import (
    AcceptanceSummary,
    Distribution,
    LatencySummary,
    LevelResult,
    RatioCI,
    RequestRecord,
    SpeedRatios,
)
from specadapt.records.diagnosis import Advice
from specadapt.records.requests import RequestSettings


def lat(ttft_ms: float = 50.0) -> LatencySummary:
    d = Distribution(count=1, mean=ttft_ms)
    return LatencySummary(requests=1, succeeded=1, failed=0, output_tokens=0, duration_s=1.0, output_tokens_per_s=None,
                          ttft_ms=d, itl_ms=Distribution(), tpot_ms=Distribution(), e2e_ms=Distribution(),
                          tokens_per_chunk_mean=None)


def ratio(point, low=None, high=None) -> RatioCI:
    return RatioCI(point=point, low=low, high=high, n=8, method="t")


def level(s: RatioCI, drafts=100.0, accepted=200.0, per_pos=(0.8, 0.6, 0.4, 0.2), known=True, concurrency=1,
          ttft_off=50.0, ttft_on=50.0, rate=None, cats=None) -> LevelResult:
    k = len(per_pos)
    acc = AcceptanceSummary(known=known, drafts=drafts if known else None, draft_tokens=k * drafts if known else None,
                            accepted_tokens=accepted if known else None,
                            acceptance_rate=accepted / (k * drafts) if known and drafts else None,
                            mean_acceptance_length=1 + accepted / drafts if known and drafts else None,
                            per_position_rate=list(per_pos) if known else [])
    lv = LevelResult(concurrency=concurrency, request_rate=rate, pairs=8, speed=SpeedRatios(tpot=s, e2e=s, throughput=s),
                     off=lat(ttft_off), on=lat(ttft_on), acceptance=acc)
    if cats:
        lv.by_category = {c: SpeedRatios(tpot=r, e2e=r, throughput=r) for c, r in cats.items()}
    return lv


def on_records(decode_tokens: int, n: int = 4) -> list[RequestRecord]:
    """``n`` spec-on requests with ``decode_tokens`` decode tokens in all (output tokens - 1 each)."""
    per = decode_tokens // n
    return [RequestRecord(prompt_id=f"p{i}", category="x", api="chat", side="on", ok=True, output_tokens=per + 1,
                          chunk_ns=[1_000, 2_000], chunk_tokens=[1, per], e2e_ns=3_000) for i in range(n)]


# --- the arithmetic, worked by hand ----------------------------------------------------------------
def test_pass_cost_counts_plain_steps_apart_from_verify_passes():
    # N = 400 decode tokens, A = 200 accepted, D = 100 passes -> P = 100 plain steps.
    # S = 1.25: the spec-on side took 400 / 1.25 = 320 steps' time; 100 went to plain steps,
    # so a pass cost (320 - 100) / 100 = 2.2 steps; with S in [1.0, 1.6]: [(250-100)/100, (400-100)/100].
    f = dg.level_figures(level(ratio(1.25, 1.0, 1.6)), on_records(400), 4, None)
    assert f.plain_steps == 100
    assert f.pass_cost == pytest.approx(2.2)
    assert (f.pass_cost_low, f.pass_cost_high) == (pytest.approx(1.5), pytest.approx(3.0))
    assert f.tokens_per_pass == pytest.approx(3.0)
    assert f.tokens_per_step == pytest.approx(400 / 200)
    # ideal: every pass one step: 400 tokens in 100 + 100 steps
    assert f.ideal_speedup == pytest.approx(2.0)
    assert f.measured_over_ideal == pytest.approx(1.25 / 2.0)


def test_without_plain_steps_the_pass_cost_is_tokens_per_pass_over_the_ratio():
    f = dg.level_figures(level(ratio(0.9, 0.8, 1.0)), on_records(300), 4, None)  # N = A + D
    assert f.plain_steps == 0
    assert f.pass_cost == pytest.approx(3.0 / 0.9)
    assert f.pass_cost_low == pytest.approx(3.0 / 1.0) and f.pass_cost_high == pytest.approx(3.0 / 0.8)


def test_counts_that_disagree_fall_back_to_tokens_per_pass_over_the_ratio():
    # N = 200 < A + D = 300 by more than 5% of D: the plain steps are unknown, v = L / S
    f = dg.level_figures(level(ratio(1.5, 1.2, 1.8)), on_records(200), 4, None)
    assert f.plain_steps is None
    assert f.pass_cost == pytest.approx(3.0 / 1.5)
    assert "unknown" in f.pass_cost_source
    # within 5% of D a small negative count is 0 plain steps
    assert dg.plain_steps(296, level(ratio(1.0)).acceptance) == 0.0
    assert dg.plain_steps(294, level(ratio(1.0)).acceptance) is None


def test_break_even_acceptance_yields_the_pass_cost_in_tokens():
    f = dg.level_figures(level(ratio(1.2, 1.1, 1.3)), on_records(300), 4, None)
    a = f.break_even_acceptance
    assert theory.expected_tokens_per_pass(a, 4) == pytest.approx(f.pass_cost, rel=1e-6)
    assert f.break_even_possible is True
    assert dg.break_even_acceptance(0.9, 4) == 0.0
    assert dg.break_even_acceptance(5.0, 4) == pytest.approx(1.0, abs=1e-6)
    assert dg.break_even_acceptance(5.01, 4) is None


def test_draft_cost_goes_into_the_ideal_and_is_taken_out_of_the_verify_cost():
    draft = dg.DraftCost(per_token=0.25, source="test")
    f = dg.level_figures(level(ratio(0.5, 0.45, 0.55)), on_records(300), 4, draft)
    assert f.draft_cost_per_pass == pytest.approx(1.0)
    assert f.ideal_speedup == pytest.approx(300 / (100 * 2.0))
    point, low, high = dg.verify_cost(f)
    assert point == pytest.approx(3.0 / 0.5 - 1.0)
    assert low == pytest.approx(3.0 / 0.55 - 1.0) and high == pytest.approx(3.0 / 0.45 - 1.0)


def test_one_k_model_is_one_plus_c_k_through_the_pass_cost():
    f = dg.level_figures(level(ratio(1.0, 0.9, 1.1)), on_records(300), 4, None)
    c = (3.0 - 1.0) / 4
    assert f.model == "1 + c k" and f.model_v == 1.0 and f.model_c == pytest.approx(c)
    assert f.model_speedup == pytest.approx((1 + 0.8 + 0.6 + 0.4 + 0.2) / (1 + 4 * c))
    preds = {k: (1 + sum([0.8, 0.6, 0.4, 0.2][:k])) / (1 + c * k) for k in range(1, 5)}
    preds[0] = 1.0
    best = max(preds, key=lambda k: (preds[k], -k))
    assert f.model_best_k == best and f.model_best_speedup == pytest.approx(preds[best])
    assert f.measured_over_model is None  # one point: the model is fitted to it


def test_with_plain_steps_the_one_k_model_reproduces_the_measured_ratio():
    # N = 400, A = 200, D = 100: P = 100 plain steps (rho = 1 per pass)
    f = dg.level_figures(level(ratio(1.25, 1.0, 1.6)), on_records(400), 4, None)
    assert f.model_speedup == pytest.approx(1.25)
    c = (f.pass_cost - 1) / 4
    assert dg.model_ratio([0.8, 0.6, 0.4, 0.2], 1.0, c, 2, rho=1.0) == pytest.approx((1 + 1 + 1.4) / (1 + 1 + 2 * c))
    assert dg.model_ratio([0.8], 1.0, c, 0, rho=1.0) == 1.0
    assert dg.model_ratio([0.8], 1.0, c, 2, rho=1.0) is None  # fewer rates than k


def test_tunes_fit_gives_the_model_and_the_measured_over_model():
    f = dg.level_figures(level(ratio(1.4, 1.3, 1.5)), on_records(300), 4, None, fit_v=1.1, fit_c=0.2)
    assert f.model == "v + c k" and f.model_v == 1.1 and f.model_c == 0.2
    expected = (1 + 2.0) / (1.1 + 0.8)
    assert f.model_speedup == pytest.approx(expected)
    assert f.measured_over_model == pytest.approx(1.4 / expected)


def test_ttft_ratio_over_pairs_and_verdict():
    def rec(side, pid, rep, ttft_ms):
        return RequestRecord(prompt_id=pid, category="x", api="chat", side=side, repeat=rep, ok=True, output_tokens=2,
                             chunk_ns=[int(ttft_ms * 1e6), int(ttft_ms * 1e6) + 1], chunk_tokens=[1, 1],
                             e2e_ns=int(ttft_ms * 1e6) + 2)
    recs = [rec("off", "a", 0, 40), rec("on", "a", 0, 80), rec("off", "b", 0, 50), rec("on", "b", 0, 50),
            rec("on", "c", 0, 10)]  # c has no off side: no pair
    r = dg.ttft_ratio(pair_records(recs, 1))
    assert r.n == 2 and r.point == pytest.approx(math.sqrt(2.0))
    f = dg.level_figures(level(ratio(0.8, 0.7, 0.9)), on_records(300), 4, None)
    assert f.verdict == "slower"
    assert dg.level_figures(level(ratio(1.0, 0.9, 1.1)), on_records(300), 4, None).verdict == "no clear difference"
    assert dg.level_figures(level(ratio(1.0)), on_records(300), 4, None).verdict == "unknown"


# --- the causes ---------------------------------------------------------------------------------
CPU_AVX2 = dg.Hardware(cpu_model="AMD EPYC", cores=2, native_dtypes=("float32",),
                       missing_flags=("avx512f", "avx512_bf16", "amx_bf16"))
CPU_BF16 = dg.Hardware(cpu_model="AMD EPYC", cores=2, native_dtypes=("float32", "bfloat16"))
GPU = dg.Hardware(cpu_model="Xeon", cores=16, native_dtypes=("float32", "float16", "bfloat16"), gpus=("NVIDIA H200",))


def diagnose(levels, ctx=dg.Context(k=4), records=None, draft=None):
    figs = [dg.level_figures(lv, records if records is not None else on_records(300), 4, draft) for lv in levels]
    return dg.diagnose(figs, ctx)


def codes(d) -> set[str]:
    return {c.code for c in d.causes}


def test_bfloat16_emulated_on_an_avx2_cpu_is_the_compute_bound_cause_with_the_dtype_advice():
    # the bf16 row: 3.01 tokens per pass, TPOT 0.83x [0.76, 0.89]
    d = diagnose([level(ratio(0.83, 0.76, 0.89))], dg.Context(k=4, dtype="bfloat16", hardware=CPU_AVX2))
    assert "verify-compute-bound" in codes(d)
    cause = next(c for c in d.causes if c.code == "verify-compute-bound")
    assert "no native support" in cause.text and "avx512_bf16" in cause.text
    assert cause.figures["verify_cost"] == pytest.approx(3.0 / 0.83)
    assert any(a.code == "dtype" and "float32" in a.text for a in d.advice)
    assert d.headline.startswith("Spec on is slower at concurrency 1") and "compute-bound" in d.headline


def test_native_dtype_on_a_cpu_says_the_cpu_is_compute_bound_without_a_dtype_advice():
    d = diagnose([level(ratio(0.83, 0.76, 0.89))], dg.Context(k=4, dtype="bfloat16", hardware=CPU_BF16))
    cause = next(c for c in d.causes if c.code == "verify-compute-bound")
    assert "no native support" not in cause.text and "limited by arithmetic" in cause.text
    assert not any(a.code == "dtype" for a in d.advice)


def test_unknown_hardware_says_the_reason_cannot_be_told():
    d = diagnose([level(ratio(0.83, 0.76, 0.89))], dg.Context(k=4, dtype="bfloat16", hardware=None))
    cause = next(c for c in d.causes if c.code == "verify-compute-bound")
    assert "cannot be told" in cause.text


def test_a_gpu_at_a_high_batch_is_saturated():
    lv = level(ratio(0.7, 0.6, 0.8), concurrency=16)
    d = diagnose([lv], dg.Context(k=4, dtype="bfloat16", hardware=GPU))
    cause = next(c for c in d.causes if c.code == "verify-compute-bound")
    assert "saturated" in cause.text and "H200" in cause.text
    assert any(a.code == "batch-size" for a in d.advice)


def test_a_pass_cost_whose_interval_reaches_the_threshold_is_not_called_compute_bound():
    # v = 3 / 2.2 = 1.36 with the low end 3 / 2.4 = 1.25 < 1.5: not compute-bound
    d = diagnose([level(ratio(2.2, 1.9, 2.4))])
    assert "verify-compute-bound" not in codes(d) and "pays" in codes(d)
    # low end just above the threshold: 3 / 1.9 = 1.58
    d = diagnose([level(ratio(1.7, 1.5, 1.9))])
    assert "verify-compute-bound" in codes(d)


def test_without_an_interval_there_is_no_cause_and_the_gap_is_said():
    d = diagnose([level(ratio(0.5))])
    assert "verify-compute-bound" not in codes(d)
    assert any("point estimate" in g for g in d.evidence_gaps)
    assert any(a.code == "evidence" for a in d.advice)


def test_low_acceptance_with_the_categories_that_pay_and_lose():
    cats = {"code": ratio(1.4, 1.2, 1.6), "qa": ratio(0.8, 0.7, 0.9), "math": ratio(1.0, 0.9, 1.1)}
    lv = level(ratio(0.95, 0.9, 1.0), accepted=80.0, per_pos=(0.4, 0.2, 0.1, 0.1))  # 80 / 400 = 20%
    figs = [dg.level_figures(lv, on_records(180), 4, None)]
    d = dg.diagnose(figs, dg.Context(k=4, categories=cats))
    cause = next(c for c in d.causes if c.code == "low-acceptance")
    assert "20% of draft tokens accepted" in cause.text
    assert "pays on code" in cause.text and "loses on qa" in cause.text and "math" not in cause.text
    assert any(a.code == "draft" and "pays on code" in a.text for a in d.advice)


def test_acceptance_above_the_floor_but_below_break_even():
    # 50% acceptance, L = 3, but the pass costs 3 / 0.9 = 3.33 steps > 3 tokens
    d = diagnose([level(ratio(0.9, 0.85, 0.95))], dg.Context(k=4, hardware=CPU_BF16, dtype="float32"))
    cause = next(c for c in d.causes if c.code == "low-acceptance")
    assert "below break-even" in cause.text


def test_no_acceptance_cause_when_it_pays():
    d = diagnose([level(ratio(1.3, 1.2, 1.4))])
    assert "low-acceptance" not in codes(d) and "pays" in codes(d)
    assert d.headline.startswith("Spec on is faster") and "speculation pays" in d.headline


def test_an_expensive_draft_model_is_a_cause_with_its_source():
    draft = dg.DraftCost(per_token=0.4, source="the draft's parameters over the target's")
    lv = level(ratio(0.45, 0.4, 0.5), accepted=8.0, per_pos=(0.05, 0.02, 0.01, 0.0))
    figs = [dg.level_figures(lv, on_records(108), 4, draft)]
    d = dg.diagnose(figs, dg.Context(k=4, draft=draft, hardware=CPU_BF16, dtype="bfloat16"))
    assert {"draft-expensive", "low-acceptance"} <= codes(d)
    cause = next(c for c in d.causes if c.code == "draft-expensive")
    assert "0.40 decode steps per draft token" in cause.text and "parameters" in cause.text
    # a cheap draft is no cause
    cheap = dg.DraftCost(per_token=0.01, source="x")
    d = dg.diagnose([dg.level_figures(lv, on_records(108), 4, cheap)], dg.Context(k=4))
    assert "draft-expensive" not in codes(d)


def test_k_too_long_when_late_positions_do_not_pay_for_themselves():
    # c = (v - 1) / k with v = 3 / 1.05: positions 3 and 4 (0.05, 0.02) earn less than c
    lv = level(ratio(1.05, 1.0, 1.1), accepted=172.0, per_pos=(0.9, 0.75, 0.05, 0.02))
    figs = [dg.level_figures(lv, on_records(272), 4, None)]
    d = dg.diagnose(figs, dg.Context(k=4))
    cause = next(c for c in d.causes if c.code == "k-too-long")
    assert figs[0].model_best_k == 2 and "k=2" in cause.text
    assert any(a.code == "k" and "k=2" in a.text for a in d.advice)


def test_off_is_advised_when_no_k_beats_off_and_when_no_acceptance_can_pay():
    lv = level(ratio(0.4, 0.35, 0.45), accepted=40.0, per_pos=(0.2, 0.1, 0.05, 0.05))  # L = 1.4, v = 3.5
    d = diagnose([lv], records=on_records(140))
    assert any(a.code == "off" and "no k up to 4 beats off" in a.text for a in d.advice)
    lv = level(ratio(0.5, 0.45, 0.55))  # v = 6 > k + 1 = 5
    d = diagnose([lv])
    assert any(a.code == "off" and "no acceptance can pay" in a.text for a in d.advice)
    assert d.levels[0].break_even_possible is False


def test_past_the_crossover_names_both_levels_and_the_rising_pass_cost():
    lvs = [level(ratio(1.3, 1.2, 1.4), concurrency=1), level(ratio(1.0, 0.9, 1.1), concurrency=4),
           level(ratio(0.8, 0.7, 0.9), concurrency=16)]
    d = diagnose(lvs)
    cause = next(c for c in d.causes if c.code == "past-crossover")
    assert "faster up to concurrency 1" in cause.text and "slower from 16" in cause.text
    assert f"{3 / 1.3:.2f} decode steps at 1" in cause.text and f"{3 / 0.8:.2f} at 16" in cause.text
    assert cause.level == "concurrency 16 and above"
    assert any(a.code == "batch-size" and "up to concurrency 1 only" in a.text for a in d.advice)
    # slower first, faster later: no crossover
    d = diagnose([level(ratio(0.8, 0.7, 0.9), concurrency=1), level(ratio(1.3, 1.2, 1.4), concurrency=4)])
    assert "past-crossover" not in codes(d)


def test_a_later_first_token_is_an_overhead_only_beyond_its_interval():
    def with_ttft(t):
        return dg.diagnose([dg.level_figures(level(ratio(1.0, 0.9, 1.1)), on_records(300), 4, None, ttft=t)],
                           dg.Context(k=4))
    cause = next(c for c in with_ttft(ratio(1.3, 1.1, 1.5)).causes if c.code == "overhead")
    assert "30% later" in cause.text and "[1.10, 1.50]" in cause.text
    assert "overhead" not in codes(with_ttft(ratio(1.2, 1.1, 1.3)))  # under 25% later
    assert "overhead" not in codes(with_ttft(ratio(1.6, 0.9, 2.5)))  # the interval reaches 1
    assert "overhead" not in codes(with_ttft(ratio(1.6)))  # no interval


def test_thin_evidence_is_said_and_no_cause_is_made_up():
    d = diagnose([level(ratio(0.5, 0.4, 0.6), drafts=20.0, accepted=40.0)], records=on_records(60))
    assert not d.causes and any("only 20 verify passes" in g for g in d.evidence_gaps)
    d = diagnose([level(ratio(0.5, 0.4, 0.6), known=False)])
    assert not d.causes and any("acceptance unknown" in g for g in d.evidence_gaps)
    d = diagnose([level(ratio(0.5, 0.4, 0.6), known=False)], dg.Context(k=4, spec_enabled=False))
    assert codes(d) == {"speculation-off"}
    # k = 1, 40% accepted: 1.4 tokens per pass at 1.4 [1.33, 1.47] decode steps: even, and no cause for it
    lv = level(ratio(1.0, 0.95, 1.05), accepted=40.0, per_pos=(0.4,))
    d = dg.diagnose([dg.level_figures(lv, on_records(140), 1, None)], dg.Context(k=1))
    assert not d.causes and "no single cause" in d.headline


def test_causes_of_several_levels_are_merged_under_one_code():
    lvs = [level(ratio(0.8, 0.7, 0.9), concurrency=1), level(ratio(0.7, 0.6, 0.8), concurrency=2)]
    d = diagnose(lvs, dg.Context(k=4, hardware=CPU_AVX2, dtype="bfloat16"))
    cb = [c for c in d.causes if c.code == "verify-compute-bound"]
    assert len(cb) == 1 and cb[0].level == "concurrency 1, concurrency 2"
    assert len([a for a in d.advice if a.code == "dtype"]) == 1


def test_param_count_and_the_draft_cost_from_configs():
    smol = {"hidden_size": 576, "num_hidden_layers": 30, "vocab_size": 49152, "intermediate_size": 1536,
            "num_attention_heads": 9, "num_key_value_heads": 3, "hidden_act": "silu", "tie_word_embeddings": True}
    # by hand: embeddings 49152*576; per layer q,o 2*576^2 + k,v 2*576*192 + MLP 3*576*1536
    per_layer = 2 * 576 * 576 + 2 * 576 * 192 + 3 * 576 * 1536
    assert dg.param_count(smol) == 49152 * 576 + 30 * per_layer
    cut = dict(smol, num_hidden_layers=8)
    cost = dg.draft_cost_from_configs(cut, smol)
    assert cost.per_token == pytest.approx((49152 * 576 + 8 * per_layer) / (49152 * 576 + 30 * per_layer))
    assert "config.json" in cost.source
    untied = dict(smol, tie_word_embeddings=False, hidden_act="gelu", model_type="gpt2")
    assert dg.param_count(untied) == 2 * 49152 * 576 + 30 * (2 * 576 * 576 + 2 * 576 * 192 + 2 * 576 * 1536)
    assert dg.param_count({"hidden_size": 8}) is None
    assert dg.draft_cost_from_configs({}, smol) is None


def test_rate_levels_are_named_by_rate_and_kept_out_of_the_crossover():
    lv = level(ratio(0.8, 0.7, 0.9), concurrency=0, rate=2.0)
    assert dg.level_name(lv) == "2 req/s"
    assert dg.level_name(level(ratio(1.0), concurrency=0, rate=math.inf)) == "all at once"
    d = diagnose([level(ratio(1.3, 1.2, 1.4)), lv])
    assert "past-crossover" not in codes(d)


def test_the_compare_reads_the_draft_cost_from_the_two_config_files(tmp_path):
    import json

    from specadapt.orchestration.compare import draft_cost_of
    from specadapt.records import CompareReport, CompareSettings, ServerInfo

    base = {"hidden_size": 64, "vocab_size": 1000, "intermediate_size": 128, "num_attention_heads": 4,
            "tie_word_embeddings": True}
    for name, layers in (("target", 10), ("draft", 2)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(dict(base, num_hidden_layers=layers)))
    info = ServerInfo(backend="vllm", base_url="http://x", model_root=str(tmp_path / "target"),
                      spec_draft=str(tmp_path / "draft"))

    def report(on, settings=CompareSettings()):
        return CompareReport(settings=settings, off_server=on, on_server=on)

    cost = draft_cost_of(report(info))
    per_layer = 2 * 64 * 64 + 2 * 64 * 64 + 3 * 64 * 128
    assert cost.per_token == pytest.approx((64_000 + 2 * per_layer) / (64_000 + 10 * per_layer))
    assert draft_cost_of(report(info, CompareSettings(draft_cost=0.3))) == dg.DraftCost(0.3, "--draft-cost")
    assert draft_cost_of(report(info.model_copy(update={"spec_draft": None}))) is None  # n-gram: no model
    assert draft_cost_of(report(info.model_copy(update={"spec_draft": str(tmp_path / "none")}))) is None
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text("{not json")
    assert draft_cost_of(report(info.model_copy(update={"spec_draft": str(tmp_path / "broken")}))) is None


def test_tune_reads_its_largest_k_through_the_fit_over_every_k():
    from specadapt.orchestration import tune as tuning
    from specadapt.records import CompareReport, CompareSettings, RequestSettings, ServerInfo
    from specadapt.records.tune import Candidate, TuneSettings

    rates = [0.8, 0.6, 0.4, 0.2]

    def cand(k: int, s: float) -> Candidate:
        lv = level(ratio(s, s - 0.1, s + 0.1), accepted=100.0 * sum(rates[:k]), per_pos=tuple(rates[:k]))
        info = ServerInfo(backend="vllm", base_url="http://on", num_speculative_tokens=k)
        compare = CompareReport(settings=CompareSettings(), off_server=info, on_server=info, levels=[lv],
                                counts={"identical": 1})
        return Candidate(label=f"k={k}", variant="", k=k, compare=compare)

    settings = TuneSettings(backend="vllm", base_spec={"method": "ngram", "k": 4}, ks=[0, 1, 2, 4], concurrency=[1],
                            repeat=2, warmup=0, request=RequestSettings())
    report = tuning.TuneReport(settings=settings, candidates=[Candidate(label="off", variant="", k=0,
                                                                        status="baseline"),
                                                              cand(1, 1.5), cand(2, 1.8), cand(4, 2.0)])
    tuning.analyse(report)
    (fit,) = report.fits
    assert fit.form == "v + c k"
    d = report.diagnosis
    assert d.headline.startswith("k=4, the largest k measured: Spec on is faster")
    (f,) = d.levels
    assert f.model == "v + c k" and f.model_v == pytest.approx(fit.v) and f.model_c == pytest.approx(fit.c)
    assert f.model_speedup == pytest.approx((1 + sum(rates)) / (fit.v + 4 * fit.c))
    assert f.measured_over_model == pytest.approx(2.0 / f.model_speedup)


# --- the sentences, word for word (pinned for mutation testing; every figure worked by hand) -------
def test_every_sentence_of_a_bfloat16_run_on_an_avx2_cpu():
    # N = 300 = A + D: no plain steps; L = 3; S = 0.8 [0.75, 0.85] -> v = 3.75 [3.53, 4.00]
    # model 1 + c k, c = (3.75 - 1) / 4 = 0.6875: S(1) = 1.8 / 1.6875 = 1.07, S(4) = 3 / 3.75 = 0.80
    d = diagnose([level(ratio(0.8, 0.75, 0.85))], dg.Context(k=4, dtype="bfloat16", hardware=CPU_AVX2))
    a = theory.acceptance_from_mean_length(3.75, 4)
    assert [(c.code, c.level, c.text) for c in d.causes] == [
        ("verify-compute-bound", "concurrency 1",
         "the verify pass is compute-bound: checking 5 tokens costs 3.75 [3.53, 4.00] decode steps (memory-bound "
         "ideal: 1); bfloat16 has no native support on AMD EPYC (no avx512_bf16, amx_bf16): its matrix products "
         "are emulated"),
        ("low-acceptance", "concurrency 1",
         f"acceptance below break-even: at 3.75 decode steps per pass it takes 3.75 tokens per pass (acceptance "
         f"{100 * a:.0f}% per token) to break even; the draft gives 3.00 (50%)"),
        ("k-too-long", "concurrency 1",
         "k=4 drafts too far: positions after 1 are accepted 60% / 40% / 20% of passes, too little for the 0.69 "
         "decode steps each extra draft token costs; the model predicts 1.07x at k=1 against 0.80x at k=4"),
    ]
    assert [(x.code, x.text) for x in d.advice] == [
        ("dtype", "serve float32 here (native on AMD EPYC; `--dtype auto` picks it), or use a CPU with "
                  "AVX512-BF16/AMX or a GPU for bfloat16"),
        ("k", "run k=1 at concurrency 1 (predicted 1.07x); `specadapt tune --k 0,1,4` measures it"),
    ]
    assert d.headline == ("Spec on is slower at concurrency 1 (TPOT 0.80x [0.75, 0.85]): " + d.causes[0].text + ".")
    assert d.evidence_gaps == [] and d.thresholds == dg.THRESHOLDS


def test_the_reason_for_a_compute_bound_pass_on_each_kind_of_machine():
    f = dg.level_figures(level(ratio(0.8, 0.75, 0.85)), on_records(300), 4, None)
    f16 = dg.level_figures(level(ratio(0.8, 0.75, 0.85), concurrency=8), on_records(300), 4, None)
    rate = dg.level_figures(level(ratio(0.8, 0.75, 0.85), concurrency=0, rate=2.0), on_records(300), 4, None)
    assert dg.compute_bound_reason(dg.Context(k=4), f) == (dg.UNKNOWN_HARDWARE, [])
    batch = [Advice(code="batch-size", text="speculate at lower batch sizes only: `specadapt tune` writes a "
                                            "per-batch-size schedule")]
    gpu = dg.Context(k=4, dtype="bfloat16", hardware=GPU)
    assert dg.compute_bound_reason(gpu, f16) == (
        "the GPU (NVIDIA H200) is saturated at concurrency 8: every request's 5 tokens per step keep it computing",
        batch)
    assert dg.compute_bound_reason(gpu, rate)[1] == batch
    assert dg.compute_bound_reason(gpu, dg.level_figures(level(ratio(0.8, 0.75, 0.85), concurrency=7),
                                                         on_records(300), 4, None)) == (
        "on the GPU (NVIDIA H200) a pass costs more than a step even at concurrency 7 (a large k or model)", [])
    native = dg.Context(k=4, dtype="bfloat16", hardware=CPU_BF16)
    assert dg.compute_bound_reason(native, f) == (
        "on AMD EPYC (2 cores) the pass is limited by arithmetic, not memory, even in bfloat16", [])
    bare = dg.Hardware(native_dtypes=("float32",))
    assert dg.compute_bound_reason(dg.Context(k=4, hardware=bare), f) == (
        "on this CPU (its cores) the pass is limited by arithmetic, not memory, even in its dtype", [])
    fp16 = dg.compute_bound_reason(dg.Context(k=4, dtype="float16", hardware=dg.Hardware(
        cpu_model="Xeon", native_dtypes=("float32", "bfloat16"), missing_flags=("avx512_fp16", "amx_fp16",
                                                                             "avx512f"))), f)
    assert fp16 == ("float16 has no native support on Xeon (no avx512_fp16, amx_fp16): its matrix products are "
                    "emulated", [Advice(code="dtype", text="serve bfloat16 here (native on Xeon; `--dtype auto` "
                                                           "picks it), or use a CPU with AVX512-BF16/AMX or a GPU "
                                                           "for float16")])
    nothing = dg.compute_bound_reason(dg.Context(k=4, dtype="bfloat16", hardware=dg.Hardware()), f)
    assert nothing[0] == ("bfloat16 has no native support on this CPU (no native instructions for it): its matrix "
                          "products are emulated") and "serve float32 here" in nothing[1][0].text
    # float32 is never emulated: the CPU is limited by arithmetic
    assert "limited by arithmetic" in dg.compute_bound_reason(dg.Context(k=4, dtype="float32", hardware=CPU_AVX2),
                                                              f)[0]


def test_every_sentence_of_a_paying_run_and_of_thin_evidence():
    d = diagnose([level(ratio(1.5, 1.4, 1.6))])  # v = 2 [1.88, 2.14]; ideal 3
    assert [(c.code, c.text) for c in d.causes] == [
        ("pays", "speculation pays: 3.00 tokens per verify pass at a cost of 2.00 [1.88, 2.14] decode steps "
                 "(ideal 3.00x if a pass cost one step)"),
        ("verify-compute-bound", "the verify pass is compute-bound: checking 5 tokens costs 2.00 [1.88, 2.14] "
                                 "decode steps (memory-bound ideal: 1); " + dg.UNKNOWN_HARDWARE),
        # c = (2 - 1) / 4 = 0.25: S(2) = 2.4 / 1.5 = 1.60 beats S(4) = 3 / 2 = 1.50
        ("k-too-long", "k=4 drafts too far: positions after 2 are accepted 40% / 20% of passes, too little for the "
                       "0.25 decode steps each extra draft token costs; the model predicts 1.60x at k=2 against "
                       "1.50x at k=4")]
    assert d.headline == "Spec on is faster at concurrency 1 (TPOT 1.50x [1.40, 1.60]): " + d.causes[0].text + "."
    d = diagnose([level(ratio(0.5, 0.4, 0.6), drafts=20.0, accepted=40.0)], records=on_records(60))
    assert d.evidence_gaps == ["concurrency 1: only 20 verify passes (fewer than 30): too few to read acceptance; "
                               "send more prompts or tokens"]
    assert d.advice == [Advice(code="evidence", text="more evidence: --repeat or --max-tokens higher, or more "
                                                     "prompts")]
    d = diagnose([level(ratio(0.5, 0.4, 0.6), known=False)])
    assert d.evidence_gaps == ["concurrency 1: acceptance unknown (no spec-decode counters read), so the pass cost "
                               "and the causes cannot be told apart"]
    d = diagnose([level(ratio(0.5, 0.4, 0.6), known=False)], dg.Context(k=4, spec_enabled=False))
    assert [c.text for c in d.causes] == ["the spec-on server shows no speculation counters: speculation is off "
                                          "there, so there is nothing to diagnose"]
    assert d.headline == "Spec on is slower at concurrency 1 (TPOT 0.50x [0.40, 0.60]): " + d.causes[0].text + "."
    d = diagnose([level(ratio(0.5))])
    assert d.evidence_gaps == ["concurrency 1: the TPOT ratio has no interval (too few pairs or blocks), so the pass "
                               "cost 6.00 decode steps is a point estimate only; add --repeat"]
    assert d.headline.startswith("Spec on is of unknown speed at concurrency 1 (TPOT 0.50x (no interval))")
    d = diagnose([level(RatioCI(point=None))])
    assert d.evidence_gaps == ["concurrency 1: no TPOT ratio, so the pass cost is unknown"]
    assert dg.diagnose([], dg.Context()).headline == "nothing was measured"


def test_every_sentence_of_a_poor_draft_model_and_its_advice():
    # N = 108, A = 8, D = 100: P = 0; L = 1.08, acceptance 8 / 400 = 2%; S = 0.45 -> v = 2.40 [2.16, 2.70]
    draft = dg.DraftCost(per_token=0.4, source="the draft's parameters over the target's")
    lv = level(ratio(0.45, 0.4, 0.5), accepted=8.0, per_pos=(0.05, 0.02, 0.01, 0.0))
    d = dg.diagnose([dg.level_figures(lv, on_records(108), 4, draft)], dg.Context(k=4, draft=draft))
    texts = {c.code: c.text for c in d.causes}
    assert texts["low-acceptance"] == ("the draft does not match this traffic: 2% of draft tokens accepted (per "
                                       "position 5% / 2% / 1% / 0%), 1.08 tokens per pass")
    assert texts["draft-expensive"] == ("the draft model is expensive: 0.40 decode steps per draft token, 1.60 of "
                                        "the 2.40 a pass costs (the draft's parameters over the target's)")
    assert "verify-compute-bound" not in texts  # 2.40 - 1.60 = 0.80 [0.56, 1.10] left for the verify pass
    assert [a.text for a in d.advice] == [
        "a better-matched draft: EAGLE/MTP heads trained for this target, or n-gram only where the answer copies "
        "the input",
        "a smaller draft (or fewer draft tokens): each draft token costs 0.40 decode steps here",
        "turn speculation off at concurrency 1: the cost model (1 + c k, c = 0.35) predicts no k up to 4 beats off "
        "(k=4: 0.45x)",
    ]
    assert d.headline == ("Spec on is slower at concurrency 1 (TPOT 0.45x [0.40, 0.50]): " + texts["draft-expensive"]
                          + ".")
    # the draft-expensive threshold: a quarter of the pass cost, inclusive
    f = dg.level_figures(lv, on_records(108), 4, dg.DraftCost(per_token=0.15, source="x"))  # 0.6 of 2.4 = 25%
    assert "draft-expensive" in codes(dg.diagnose([f], dg.Context(k=4)))
    f = dg.level_figures(lv, on_records(108), 4, dg.DraftCost(per_token=0.149, source="x"))
    assert "draft-expensive" not in codes(dg.diagnose([f], dg.Context(k=4)))


def test_the_crossover_and_the_overhead_word_for_word():
    lvs = [level(ratio(1.5, 1.4, 1.6), concurrency=1), level(ratio(1.2, 1.1, 1.3), concurrency=2),
           level(ratio(0.75, 0.7, 0.8), concurrency=8), level(ratio(0.6, 0.5, 0.7), concurrency=16)]
    cause, advice = dg.crossover_cause([dg.level_figures(lv, on_records(300), 4, None) for lv in lvs])
    assert cause.text == ("the load is past the crossover: faster up to concurrency 2 (1.20x [1.10, 1.30]), slower "
                          "from 8 (0.75x [0.70, 0.80]): a verify pass costs 2.50 decode steps at 2 and 4.00 at 8, as "
                          "the batch fills the hardware")
    assert cause.level == "concurrency 8 and above" and cause.figures == {"last_faster": 2, "first_slower": 8}
    assert advice.text == ("speculate up to concurrency 2 only: `specadapt tune` writes the per-batch-size schedule "
                           "(vLLM num_speculative_tokens_per_batch_size, TensorRT-LLM draft_len_schedule)")
    # without counters the pass costs are unknown: the crossover is still said, without them
    bare = [dg.level_figures(level(ratio(1.5, 1.4, 1.6), known=False), [], 4, None),
            dg.level_figures(level(ratio(0.6, 0.5, 0.7), known=False, concurrency=4), [], 4, None)]
    assert dg.crossover_cause(bare)[0].text == ("the load is past the crossover: faster up to concurrency 1 "
                                                "(1.50x [1.40, 1.60]), slower from 4 (0.60x [0.50, 0.70])")
    assert dg.crossover_cause(bare[:1]) == (None, None)
    t = ratio(1.3, 1.1, 1.5)
    f = dg.level_figures(level(ratio(1.0, 0.9, 1.1)), on_records(300), 4, None, ttft=t)
    draft = dg.DraftCost(per_token=0.01, source="x")
    over = {c.code: c.text for c in dg.diagnose([f], dg.Context(k=4)).causes}["overhead"]
    assert over == ("the first token comes 30% later with speculation on (TTFT on/off 1.30x [1.10, 1.50]): work "
                    "outside the decode steps (prefill, scheduling, the proposer)")
    over = {c.code: c.text for c in dg.diagnose([f], dg.Context(k=4, draft=draft)).causes}["overhead"]
    assert over.endswith("(prefill, scheduling, the proposer, the draft model's own prefill)")
    assert "overhead" not in codes(dg.diagnose([dg.level_figures(level(ratio(1.0, 0.9, 1.1)), on_records(300), 4,
                                                                 None, ttft=ratio(1.26, 1.0, 1.5))], dg.Context(k=4)))


def test_diagnose_compare_reads_each_level_from_its_own_records_and_counters(monkeypatch):
    """Closed-loop levels 1 and 4 and a rate level; warm-up, off-side and other levels' records
    must not count towards a level's decode tokens N."""
    from specadapt.records import (
        CompareReport,
        CompareSettings,
        CounterPair,
        CounterSnapshot,
        GpuInfo,
        HardwareInfo,
        ServerInfo,
    )

    def rec(side, pid, rep, tokens, ttft_ms, conc=1, rate=None, warmup=False, cat="code"):
        t = int(ttft_ms * 1e6)
        return RequestRecord(prompt_id=pid, category=cat, api="chat", side=side, repeat=rep, ok=True,
                             output_tokens=tokens, chunk_ns=[t, t + 1000], chunk_tokens=[1, tokens - 1],
                             e2e_ns=t + 2000, concurrency=conc, request_rate=rate, warmup=warmup)

    recs = [rec("on", "w", 0, 500, 10, warmup=True), rec("off", "w", 0, 500, 10, warmup=True)]
    for rep in range(5):
        recs += [rec("off", "a", rep, 101, 40, cat="code"), rec("on", "a", rep, 101, 80, cat="code"),
                 rec("off", "b", rep, 101, 50, cat="qa"), rec("on", "b", rep, 101, 50, cat="qa")]
    recs += [rec("on", "a", 0, 51, 10, conc=4), rec("off", "a", 0, 51, 10, conc=4),
             rec("on", "a", 0, 31, 10, conc=0, rate=2.0)]
    hw = HardwareInfo(source="x", cpu_model="Box", cores=8, native_dtypes=["float32"], cpu_flags_missing=["amx_bf16"],
                      gpus=[GpuInfo(name="G1")])
    on = ServerInfo(backend="vllm", base_url="http://on", num_speculative_tokens=4, spec_enabled=True, hardware=hw,
                    dtype="float16")
    report = CompareReport(settings=CompareSettings(concurrency=[1, 4]), off_server=on, on_server=on, requests=recs,
                           counters_on={1: CounterPair(before=CounterSnapshot(), after=CounterSnapshot())})
    report.levels = [level(ratio(1.2, 1.1, 1.3), drafts=250.0, accepted=600.0, cats={
        "code": ratio(1.5, 1.2, 1.8), "qa": ratio(0.9, 0.8, 0.95)}), level(ratio(0.9, 0.8, 1.0), concurrency=4,
                                                                           drafts=20.0, accepted=20.0)]
    report.rate_levels = [level(ratio(1.0, 0.9, 1.1), concurrency=0, rate=2.0, drafts=10.0, accepted=10.0)]
    d = dg.diagnose_compare(report)
    one, four, rate = d.levels
    assert [f.level for f in d.levels] == ["concurrency 1", "concurrency 4", "2 req/s"]
    # level 1: 10 spec-on requests of 101 tokens: N = 1000; P = 1000 - 600 - 250 = 150
    assert one.plain_steps == 150 and one.k == 4
    assert one.pass_cost == pytest.approx((1000 / 1.2 - 150) / 250)
    assert four.plain_steps == 50 - 20 - 20 and rate.plain_steps == 30 - 10 - 10
    # TTFT only at concurrency 1, over its pairs: a 80 / 40 (x5) and b 50 / 50 (x5)
    assert one.ttft_ratio.n == 10 and one.ttft_ratio.point == pytest.approx(math.sqrt(2.0))
    assert four.ttft_ratio is None and rate.ttft_ratio is None
    assert four.model == "1 + c k" and rate.model == "1 + c k"
    assert dg.hardware_of(on) == dg.Hardware(cpu_model="Box", cores=8, native_dtypes=("float32",), gpus=("G1",),
                                            missing_flags=("amx_bf16",))
    assert dg.hardware_of(ServerInfo(backend="vllm", base_url="http://x")) is None
    fits = {1: (1.1, 0.3), 4: (1.5, 0.6)}
    d2 = dg.diagnose_compare(report, fits=fits)
    assert [(f.model, f.model_v, f.model_c) for f in d2.levels] == [("v + c k", 1.1, 0.3), ("v + c k", 1.5, 0.6),
                                                                  ("1 + c k", 1.0, pytest.approx(rate.model_c))]
    # the context: k, dtype (settings first, else the server's), hardware, spec on, categories
    seen = {}
    real = dg.diagnose

    def spy(figs, ctx):
        seen["ctx"] = ctx
        return real(figs, ctx)

    monkeypatch.setattr(dg, "diagnose", spy)
    dg.diagnose_compare(report, draft=dg.DraftCost(0.1, "s"))
    ctx = seen["ctx"]
    assert (ctx.k, ctx.dtype, ctx.spec_enabled, ctx.draft) == (4, "float16", True, dg.DraftCost(0.1, "s"))
    assert ctx.hardware == dg.hardware_of(on) and set(ctx.categories) == {"code", "qa"}
    assert ctx.categories["code"].point == 1.5
    report.settings.dtype = "bfloat16"
    dg.diagnose_compare(report)
    assert seen["ctx"].dtype == "bfloat16"
    report.levels[0].by_category = {"code": report.levels[0].by_category["code"]}
    dg.diagnose_compare(report)
    assert dict(seen["ctx"].categories) == {}  # one category: nothing to compare


def test_the_category_sentence_names_only_the_categories_beyond_their_interval():
    cats = {"code": ratio(1.4, 1.2, 1.6), "qa": ratio(0.8, 0.7, 0.9), "rag": ratio(1.3, 1.01, 1.5),
            "math": ratio(1.0, 0.9, 1.1), "edge": ratio(1.0, 1.0, 1.2), "none": RatioCI(point=2.0)}
    assert dg._categories(cats) == ("; by prompt category it pays on code (1.40x [1.20, 1.60]), rag (1.30x [1.01, "
                                    "1.50]) and loses on qa (0.80x [0.70, 0.90])")
    assert dg._categories(cats, short=True) == " (it pays on code, rag)"
    assert dg._categories({"qa": ratio(0.8, 0.7, 0.9)}, short=True) == ""
    assert dg._categories({"qa": ratio(0.8, 0.7, 0.9)}) == "; by prompt category it loses on qa (0.80x [0.70, 0.90])"
    assert dg._categories({"math": ratio(1.0, 0.9, 1.1)}) == "" and dg._categories({}) == ""


def test_param_count_reads_the_defaults_of_a_config():
    # no intermediate size: 4 h; no head counts: one head, so the KV width is h; not tied by default
    cfg = {"hidden_size": 10, "num_hidden_layers": 2, "vocab_size": 100, "hidden_act": "relu"}
    assert dg.param_count(cfg) == 2 * 100 * 10 + 2 * (2 * 100 + 2 * 100 + 2 * 10 * 40)
    gated = dict(cfg, hidden_act="silu")  # a gated MLP: gate, up and down
    assert dg.param_count(gated) == 2 * 100 * 10 + 2 * (2 * 100 + 2 * 100 + 3 * 10 * 40)
    assert dg.param_count(dict(cfg, hidden_act="relu", model_type="llama")) == dg.param_count(cfg)
    for act in ("silu", "swiglu", "gelu_pytorch_tanh"):
        assert dg.param_count(dict(cfg, hidden_act=act)) == dg.param_count(gated)
    assert dg.param_count({k: v for k, v in cfg.items() if k != "hidden_act"}) == dg.param_count(gated)  # silu
    gqa = dict(cfg, num_attention_heads=10, num_key_value_heads=5)
    assert dg.param_count(gqa) == 2 * 100 * 10 + 2 * (2 * 100 + 2 * 10 * 5 + 2 * 10 * 40)
    # KV width h * kv / heads in whole units (10 * 1 // 3 = 3); a KV head count alone: one attention head
    assert dg.param_count(dict(cfg, num_attention_heads=3, num_key_value_heads=1)) == \
        2 * 100 * 10 + 2 * (2 * 100 + 2 * 10 * 3 + 2 * 10 * 40)
    assert dg.param_count(dict(cfg, num_key_value_heads=2)) == 2 * 100 * 10 + 2 * (2 * 100 + 2 * 10 * 20 + 2 * 10 * 40)
    tied = dict(cfg, tie_word_embeddings=True)
    assert dg.param_count(tied) == dg.param_count(cfg) - 100 * 10
    for key in ("hidden_size", "num_hidden_layers", "vocab_size"):
        assert dg.param_count({k: v for k, v in cfg.items() if k != key}) is None
    assert dg.param_count(dict(cfg, hidden_size="wide")) is None
    assert dg.draft_cost_from_configs(cfg, {}) is None
    # 1.5M and 3.5M parameters exactly (embeddings only, untied): rounded to whole millions
    draft, target = {"hidden_size": 100, "num_hidden_layers": 0, "vocab_size": 7500}, \
        {"hidden_size": 100, "num_hidden_layers": 0, "vocab_size": 17500}
    cost = dg.draft_cost_from_configs(draft, target)
    assert cost == dg.DraftCost(per_token=1.5 / 3.5, source="the draft's parameters over the target's (2M / 4M, "
                                                           "from their config.json)")


def test_small_figures_at_their_edges():
    acc = level(ratio(1.0)).acceptance  # D = 100, A = 200
    assert dg.plain_steps(0, acc) is None
    assert dg.plain_steps(300, acc.model_copy(update={"accepted_tokens": None})) is None
    assert dg.plain_steps(300, acc.model_copy(update={"drafts": 0.0})) is None
    assert dg.plain_steps(295, acc) == 0.0  # -5 = 5% of D: still counted as 0
    assert dg.plain_steps(310, acc) == 10
    assert dg.pass_cost(300, 0.0, 100.0, None) is None and dg.pass_cost(300, 0.0, 100.0, 0.0) is None
    assert dg.pass_cost(300, 0.0, 0.0, 1.0) is None and dg.pass_cost(300, 10.0, 100.0, 1.0) == 2.9
    assert dg.ideal_speedup(300, 0.0, 0.0, 4, 0.0) is None and dg.ideal_speedup(300, 0.0, 100.0, 4, 0.5) == 1.0
    assert dg.break_even_acceptance(1.0, 4) == 0.0 and dg.break_even_acceptance(1.01, 4) > 0
    recs = on_records(300) + [RequestRecord(prompt_id="f", category="x", api="chat", side="on", ok=False,
                                            output_tokens=50, chunk_ns=[1, 2], chunk_tokens=[1, 49], e2e_ns=3),
                              RequestRecord(prompt_id="o", category="x", api="chat", side="on", ok=True,
                                            output_tokens=1, chunk_ns=[1], chunk_tokens=[1], e2e_ns=3),
                              RequestRecord(prompt_id="n", category="x", api="chat", side="on", ok=True,
                                            output_tokens=9, chunk_ns=[], chunk_tokens=[], e2e_ns=None)]
    assert dg.decode_tokens(recs) == 300  # failed, one-token and unfinished requests left out
    assert dg.verdict_of(None) == "unknown" and dg.verdict_of(RatioCI(point=1.2, low=1.1)) == "unknown"
    assert dg.verdict_of(ratio(1.2, 1.1, 1.3)) == "faster" and dg.verdict_of(ratio(0.8, 0.7, 0.9)) == "slower"
    assert dg._x(None) == "-" and dg._x(1.234) == "1.23x"
    assert dg.ratio_text(None) == "-" and dg.ratio_text(RatioCI(point=None)) == "-" and dg.ratio_text(RatioCI(point=1.5, low=1.2)) == \
        "1.50x (no interval)"
    assert dg._interval(None, 2.0) == "" and dg._interval(1.0, None) == "" and dg._interval(1.0, 2.0) == " [1.00, 2.00]"
    assert pct(0.456, 0) == "46%" and pct(0.456) == "45.6%" and pct(None) == "-"
    # k from the per-position rates where the server did not say it
    f = dg.level_figures(level(ratio(1.0, 0.9, 1.1)), on_records(300), None, None)
    assert f.k == 4 and f.draft_cost_per_pass == 0.0 and f.draft_cost_source is None
    src = dg.level_figures(level(ratio(1.0, 0.9, 1.1)), on_records(300), 4, dg.DraftCost(0.1, "here"))
    assert src.draft_cost_source == "here" and src.draft_cost_per_pass == pytest.approx(0.4)


def test_ttft_pairs_are_keyed_by_prompt_repeat_copy_and_turn():
    def rec(side, ttft, **kw):
        t = int(ttft * 1e6)
        return RequestRecord(prompt_id=kw.pop("pid", "a"), category="x", api="chat", side=side, ok=kw.pop("ok", True),
                             output_tokens=2, chunk_ns=[t, t + 1], chunk_tokens=[1, 1], e2e_ns=t + 2, **kw)
    recs = [rec("off", 10), rec("on", 20),
            rec("off", 10, repeat=1), rec("on", 40, repeat=1),
            rec("off", 10, replica=1), rec("on", 80, replica=1),
            rec("off", 10, turn=1), rec("on", 160, turn=1),
            rec("off", 10, warmup=True, repeat=9), rec("on", 1000, warmup=True, repeat=9),
            rec("off", 10, ok=False, repeat=8), rec("on", 1000, repeat=8)]
    empty = RequestRecord(prompt_id="e", category="x", api="chat", side="on", ok=True, output_tokens=0, e2e_ns=5)
    recs += [rec("off", 10, pid="e"), empty]  # an answer without a first token: no TTFT to pair
    r = dg.ttft_ratio(pair_records(recs, 1))
    assert r.n == 4 and r.point == pytest.approx((2 * 4 * 8 * 16) ** 0.25)


def test_tune_diagnoses_the_chosen_variants_largest_measured_k_with_its_draft_cost():
    from specadapt.records import CompareReport, CompareSettings, RequestSettings, ServerInfo
    from specadapt.records.diagnosis import Diagnosis, LevelFigures
    from specadapt.records.tune import Candidate, LevelFit, Recommendation, TuneReport, TuneSettings

    def cand(k, variant="", status="measured"):
        lv = level(ratio(1.2, 1.1, 1.3), accepted=100.0 * k * 0.5, per_pos=tuple([0.5] * k))
        info = ServerInfo(backend="vllm", base_url="http://on", num_speculative_tokens=k)
        cmp = CompareReport(settings=CompareSettings(), off_server=info, on_server=info, levels=[lv])
        cmp.diagnosis = Diagnosis(headline="x", levels=[LevelFigures(level="c", concurrency=1, k=k,
                                                                     draft_cost_per_pass=0.2 * k,
                                                                     draft_cost_source="cfg")])
        return Candidate(label=f"k={k} {variant}".strip(), variant=variant, k=k, compare=cmp, status=status)

    settings = TuneSettings(backend="vllm", base_spec={}, ks=[0, 2, 4, 6], concurrency=[1], repeat=2, warmup=0,
                            request=RequestSettings())
    report = TuneReport(settings=settings, candidates=[cand(2), cand(4), cand(6, "w=3"), cand(8, status="failed")],
                        recommendation=Recommendation(form="fixed", variant=""),
                        fits=[LevelFit(concurrency=1, variant="", form="v + c k", v=1.2, c=0.1),
                              LevelFit(concurrency=1, variant="w=3", form="v + c k", v=9.0, c=9.0),
                              LevelFit(concurrency=4, variant="", form="1 + c k", v=1.0, c=0.5)])
    d = dg.diagnose_tune(report)
    assert d.headline.startswith("k=4, the largest k measured: ")
    (f,) = d.levels
    assert (f.k, f.model, f.model_v, f.model_c) == (4, "v + c k", 1.2, 0.1)
    assert f.draft_cost_per_pass == pytest.approx(0.8) and f.draft_cost_source == "cfg"
    report.recommendation.variant = "w=3"
    assert dg.diagnose_tune(report).headline.startswith("k=6 w=3, the largest k measured")
    report.recommendation.variant = "other"
    assert dg.diagnose_tune(report) is None
    assert dg._draft_of(None) is None
    assert dg._draft_of(Diagnosis(headline="x", levels=[LevelFigures(level="c", concurrency=1, k=4)])) is None



# --- edges that decide a figure or a verdict (pinned for mutation testing) ------------------------
def acceptance_without_positions(drafts=100.0, accepted=200.0) -> AcceptanceSummary:
    return AcceptanceSummary(known=True, drafts=drafts, draft_tokens=4 * drafts, accepted_tokens=accepted,
                             acceptance_rate=accepted / (4 * drafts), mean_acceptance_length=1 + accepted / drafts)


def test_thresholds_are_strict_where_the_docs_say_above_or_below():
    # 30 verify passes are enough to read acceptance (fewer than 30 are not)
    assert not diagnose([level(ratio(1.3, 1.2, 1.4), drafts=30.0, accepted=60.0)], records=on_records(90)).evidence_gaps
    # acceptance of exactly 30% is not low: 120 of 400 draft tokens
    d = diagnose([level(ratio(1.3, 1.2, 1.4), accepted=120.0, per_pos=(0.5, 0.4, 0.2, 0.1))], records=on_records(220))
    assert "low-acceptance" not in codes(d)
    # a verify pass whose low end is exactly 1.5 decode steps is not compute-bound: 3 / 2.0
    assert "verify-compute-bound" not in codes(diagnose([level(ratio(1.8, 1.6, 2.0))]))
    # a first token exactly 25% later is no overhead
    f = dg.level_figures(level(ratio(1.0, 0.9, 1.1)), on_records(300), 4, None, ttft=ratio(1.25, 1.1, 1.4))
    assert "overhead" not in codes(dg.diagnose([f], dg.Context(k=4)))
    # TTFT low end exactly 1: no overhead either
    f = dg.level_figures(level(ratio(1.0, 0.9, 1.1)), on_records(300), 4, None, ttft=ratio(1.5, 1.0, 2.0))
    assert "overhead" not in codes(dg.diagnose([f], dg.Context(k=4)))
    # a pass costing exactly k + 1 steps can still be paid for (by a draft that is always right)
    f = dg.level_figures(level(ratio(0.5, 0.45, 0.55), accepted=150.0), on_records(250, 5), 4, None)  # 2.5 / 0.5
    assert f.pass_cost == 5.0 and f.break_even_possible is True
    # the category that just reaches 1 neither pays nor loses
    assert dg._categories({"a": ratio(0.9, 0.8, 1.0), "b": ratio(1.1, 1.0, 1.2)}) == ""
    assert dg._categories({"a": ratio(0.8, 0.7, 0.9), "b": ratio(0.7, 0.6, 0.8)}) == (
        "; by prompt category it loses on a (0.80x [0.70, 0.90]), b (0.70x [0.60, 0.80])")


def test_a_small_gain_from_a_shorter_k_is_not_advised():
    # tune's model v = 1, c = 0.09 over rates 0.5, 0.1: S(1) = 1.5 / 1.09 = 1.376, S(2) = 1.6 / 1.18 = 1.356,
    # 1.5% better at k=1: under the 2% the advice needs
    lv = level(ratio(1.35, 1.3, 1.4), accepted=60.0, per_pos=(0.5, 0.1))
    f = dg.level_figures(lv, on_records(160), 2, None, fit_v=1.0, fit_c=0.09)
    assert f.model_best_k == 1 and f.model_best_speedup / f.model_speedup == pytest.approx(1.0149, abs=1e-4)
    d = dg.diagnose([f], dg.Context(k=2))
    assert "k-too-long" not in codes(d) and not any(a.code == "k" for a in d.advice)
    # c = 0.1: S(1) = 1.364, S(2) = 1.333, 2.3% better: advised
    f = dg.level_figures(lv, on_records(160), 2, None, fit_v=1.0, fit_c=0.1)
    assert "k-too-long" in codes(dg.diagnose([f], dg.Context(k=2)))


def test_the_model_needs_both_fitted_numbers_and_the_rates():
    lv = level(ratio(1.2, 1.1, 1.3))
    f = dg.level_figures(lv, on_records(300), 4, None, fit_v=1.1, fit_c=None)
    assert f.model == "1 + c k" and f.model_v == 1.0
    no_rates = lv.model_copy(update={"acceptance": acceptance_without_positions()})
    f = dg.level_figures(no_rates, on_records(300), 4, None)
    assert f.k == 4 and f.pass_cost is not None and f.model is None and f.model_best_k is None
    # no k from the server and no per-position counters: k unknown, and the sentences say k + 1
    f = dg.level_figures(no_rates.model_copy(update={"speed": level(ratio(0.5, 0.45, 0.55)).speed}),
                         on_records(300), None, None)
    assert f.k is None and f.break_even_possible is None and f.ideal_speedup is None
    d = dg.diagnose([f], dg.Context())
    assert next(c for c in d.causes if c.code == "verify-compute-bound").text.startswith(
        "the verify pass is compute-bound: checking k + 1 tokens costs 6.00")
    gpu = dg.compute_bound_reason(dg.Context(hardware=GPU), f.model_copy(update={"concurrency": 8,
                                                                                "level": "concurrency 8"}))
    assert gpu[0] == "the GPU (NVIDIA H200) is saturated at concurrency 8: every request's k + 1 tokens per step " \
                     "keep it computing"
    # rates for more positions than k: the model looks at k' <= k only
    f = dg.level_figures(level(ratio(1.2, 1.1, 1.3), accepted=200.0), on_records(300), 2, None)
    assert f.model_best_k <= 2 and f.k == 2


def test_model_ratio_counts_the_plain_steps_from_k_1_on():
    assert dg.model_ratio([0.5], 1.0, 0.2, 1, rho=2.0) == pytest.approx((2 + 1.5) / (2 + 1.2))
    assert dg.model_ratio([0.5], 1.0, 0.2, 1, rho=0.0) == pytest.approx(1.5 / 1.2)


def test_every_level_adds_its_advice_and_gaps():
    lvs = [level(ratio(0.4, 0.35, 0.45), accepted=40.0, per_pos=(0.2, 0.1, 0.05, 0.05)),  # advice: off
           level(ratio(0.5, 0.4, 0.6), concurrency=2, drafts=20.0, accepted=40.0)]          # a gap
    figs = [dg.level_figures(lvs[0], on_records(140), 4, None), dg.level_figures(lvs[1], on_records(60), 4, None)]
    d = dg.diagnose(figs, dg.Context(k=4))
    assert any(a.code == "off" for a in d.advice) and d.advice[-1].code == "evidence"
    assert len(d.evidence_gaps) == 1 and d.evidence_gaps[0].startswith("concurrency 2: only 20")
    figs = [dg.level_figures(level(ratio(0.5), concurrency=c), on_records(300), 4, None) for c in (1, 2)]
    assert len(dg.diagnose(figs, dg.Context(k=4)).evidence_gaps) == 2


def test_the_headline_of_a_slower_first_level_never_says_it_pays():
    lvs = [level(ratio(0.8, 0.75, 0.85), accepted=300.0, per_pos=(0.9, 0.8, 0.7, 0.6)),
           level(ratio(1.5, 1.4, 1.6), concurrency=2, accepted=300.0, per_pos=(0.9, 0.8, 0.7, 0.6))]
    d = diagnose(lvs, records=on_records(400))
    assert "pays" in codes(d)
    assert d.headline == ("Spec on is slower at concurrency 1 (TPOT 0.80x [0.75, 0.85]): "
                          + next(c for c in d.causes if c.code == "verify-compute-bound").text + ".")
    d = diagnose([level(ratio(1.0, 0.95, 1.05), accepted=40.0, per_pos=(0.4,))], dg.Context(k=1),
                 records=on_records(140))
    assert d.headline == ("Spec on is neither clearly faster nor slower at concurrency 1 (TPOT 1.00x [0.95, 1.05]); "
                          "the figures point to no single cause.")


def test_the_crossover_with_one_pass_cost_unknown_says_no_rise():
    figs = [dg.level_figures(level(ratio(1.5, 1.4, 1.6)), on_records(300), 4, None),
            dg.level_figures(level(ratio(0.6, 0.5, 0.7), known=False, concurrency=4), [], 4, None)]
    assert dg.crossover_cause(figs)[0].text.endswith("slower from 4 (0.60x [0.50, 0.70])")


def test_small_edges_of_the_counts():
    one = AcceptanceSummary(known=True, drafts=1.0, draft_tokens=4.0, accepted_tokens=0.0)
    assert dg.plain_steps(1, one) == 0.0 and dg.pass_cost(10, 0.0, 1.0, 1.0) == 10.0
    two = RequestRecord(prompt_id="t", category="x", api="chat", side="on", ok=True, output_tokens=2,
                        chunk_ns=[1, 2], chunk_tokens=[1, 1], e2e_ns=3)
    assert dg.decode_tokens([two]) == 1
    assert dg.verdict_of(RatioCI(point=1.2, low=None, high=1.3)) == "unknown"
    lv = level(ratio(1.2, 1.1, 1.3))
    f = dg.level_figures(lv, on_records(300), 4, None)
    assert f.e2e_ratio == lv.speed.e2e and f.pass_cost_source == ("(decode tokens / TPOT ratio - plain steps) / "
                                                                    "verify passes")
    assert dg.level_figures(lv, on_records(200), 4, None).pass_cost_source == (
        "tokens per pass / TPOT ratio (decode steps without a draft unknown)")
    unknown = lv.model_copy(update={"acceptance": lv.acceptance.model_copy(update={"known": False})})
    assert dg.level_figures(unknown, on_records(300), 4, None).pass_cost is None
    assert dg.compute_bound_reason(dg.Context(k=4, dtype="bfloat16", hardware=dg.Hardware(
        cpu_model="C", missing_flags=("amx_tile",))), f)[0] == (
        "bfloat16 has no native support on C (no amx_tile): its matrix products are emulated")


def test_every_cause_carries_its_figures():
    d = diagnose([level(ratio(0.8, 0.75, 0.85))], dg.Context(k=4, dtype="bfloat16", hardware=CPU_AVX2))
    figs = {c.code: c.figures for c in d.causes}
    a = theory.acceptance_from_mean_length(3.75, 4)
    assert figs["verify-compute-bound"] == {"verify_cost": pytest.approx(3.75), "low": pytest.approx(3 / 0.85)}
    assert figs["low-acceptance"] == {"break_even_acceptance": pytest.approx(a), "acceptance_rate": 0.5}
    assert figs["k-too-long"] == {"model_best_k": 1, "model_best_speedup": pytest.approx(1.8 / 1.6875)}
    d = diagnose([level(ratio(1.5, 1.4, 1.6))])
    assert {c.code: c.figures for c in d.causes}["pays"] == {"tokens_per_pass": 3.0, "pass_cost": pytest.approx(2.0)}
    draft = dg.DraftCost(per_token=0.4, source="s")
    lv = level(ratio(0.45, 0.4, 0.5), accepted=8.0, per_pos=(0.05, 0.02, 0.01, 0.0))
    figs = {c.code: c.figures for c in dg.diagnose([dg.level_figures(lv, on_records(108), 4, draft)],
                                                   dg.Context(k=4)).causes}
    assert figs["low-acceptance"] == {"acceptance_rate": 0.02}
    assert figs["draft-expensive"] == {"draft_cost_per_pass": pytest.approx(1.6)}
    f = dg.level_figures(level(ratio(1.0, 0.9, 1.1)), on_records(300), 4, None, ttft=ratio(1.3, 1.1, 1.5))
    assert {c.code: c.figures for c in dg.diagnose([f], dg.Context(k=4)).causes}["overhead"] == {"ttft_ratio": 1.3}
    # the off advice word for word
    d = diagnose([level(ratio(0.5, 0.45, 0.55))])
    assert any(x.text == "at 6.00 decode steps per pass no acceptance can pay at concurrency 1: even a draft that is "
                         "always right gives 5 tokens per pass" for x in d.advice)


def test_a_low_acceptance_advice_names_the_categories_that_pay():
    cats = {"code": ratio(1.4, 1.2, 1.6), "qa": ratio(0.8, 0.7, 0.9)}
    lv = level(ratio(0.95, 0.9, 1.0), accepted=80.0, per_pos=(0.4, 0.2, 0.1, 0.1))
    d = dg.diagnose([dg.level_figures(lv, on_records(180), 4, None)], dg.Context(k=4, categories=cats))
    assert [a.text for a in d.advice if a.code == "draft"] == [
        "a better-matched draft: EAGLE/MTP heads trained for this target, or n-gram only where the answer copies "
        "the input (it pays on code)"]


def test_compare_with_rate_levels_only_and_k_from_the_server(monkeypatch):
    from specadapt.records import CompareReport, CompareSettings, ServerInfo

    on = ServerInfo(backend="vllm", base_url="http://on", num_speculative_tokens=4, spec_enabled=True)
    rate = level(ratio(0.5, 0.45, 0.55), concurrency=0, rate=1.0, cats={"a": ratio(1.3, 1.2, 1.4),
                                                                        "b": ratio(0.7, 0.6, 0.8)})
    rate.acceptance = acceptance_without_positions()
    report = CompareReport(settings=CompareSettings(concurrency=[]), off_server=on, on_server=on,
                           requests=[r.model_copy(update={"concurrency": 0, "request_rate": 1.0})
                                     for r in on_records(300)], rate_levels=[rate])
    seen = {}
    real = dg.diagnose
    monkeypatch.setattr(dg, "diagnose", lambda figs, ctx: seen.update(ctx=ctx) or real(figs, ctx))
    d = dg.diagnose_compare(report)
    assert set(seen["ctx"].categories) == {"a", "b"}
    (f,) = d.levels
    assert f.k == 4 and f.level == "1 req/s"  # k from the server: there are no per-position rates


def test_tune_takes_a_k_of_1_and_leaves_a_zero_draft_cost_out():
    from specadapt.records.diagnosis import Diagnosis, LevelFigures

    assert dg._draft_of(Diagnosis(headline="x", levels=[LevelFigures(level="c", concurrency=1, k=4,
                                                                     draft_cost_per_pass=0.0,
                                                                     draft_cost_source="s")])) is None
    assert dg._draft_of(Diagnosis(headline="x", levels=[LevelFigures(level="c", concurrency=1, k=None,
                                                                     draft_cost_per_pass=0.4,
                                                                     draft_cost_source="s")])) is None


def test_the_model_never_looks_past_the_running_k():
    # tune's fit v = 1, c = 0.05 over four rates of 0.9: k'=3 and 4 would beat k'=2, but k is 2
    f = dg.level_figures(level(ratio(2.0, 1.9, 2.1), accepted=360.0, per_pos=(0.9, 0.9, 0.9, 0.9)), on_records(460),
                         2, None, fit_v=1.0, fit_c=0.05)
    assert f.model_best_k == 2 and f.model_best_speedup == pytest.approx(2.8 / 1.1)


def test_without_k_a_paying_level_names_no_ideal():
    lv = level(ratio(1.5, 1.4, 1.6)).model_copy(update={"acceptance": acceptance_without_positions()})
    d = dg.diagnose([dg.level_figures(lv, on_records(300), None, None)], dg.Context())
    assert [c.text for c in d.causes if c.code == "pays"] == [
        "speculation pays: 3.00 tokens per verify pass at a cost of 2.00 [1.88, 2.14] decode steps"]


def test_a_first_level_without_causes_does_not_borrow_another_levels_pays():
    quiet = level(ratio(1.0, 0.95, 1.05), accepted=40.0, per_pos=(0.4,))  # k = 1: even, no cause
    fast = level(ratio(1.5, 1.4, 1.6), concurrency=2, accepted=40.0, per_pos=(0.4,))  # v = 1.4 / 1.5 < 1
    figs = [dg.level_figures(quiet, on_records(140), 1, None), dg.level_figures(fast, on_records(140), 1, None)]
    d = dg.diagnose(figs, dg.Context(k=1))
    assert codes(d) == {"pays"} and d.headline.endswith("; the figures point to no single cause.")


def test_a_compare_without_levels_says_nothing_was_measured():
    from specadapt.records import CompareReport, CompareSettings, ServerInfo

    on = ServerInfo(backend="vllm", base_url="http://on")
    d = dg.diagnose_compare(CompareReport(settings=CompareSettings(), off_server=on, on_server=on))
    assert d.headline == "nothing was measured" and d.levels == []


def test_tune_reads_a_measured_k_of_1_and_never_a_k_of_0():
    from specadapt.records import CompareReport, CompareSettings, ServerInfo
    from specadapt.records.tune import Candidate, Recommendation, TuneReport, TuneSettings

    def cand(k):
        info = ServerInfo(backend="vllm", base_url="http://on", num_speculative_tokens=k or None)
        lv = level(ratio(1.2, 1.1, 1.3), accepted=50.0, per_pos=(0.5,))
        return Candidate(label=f"k={k}", variant="", k=k, compare=CompareReport(
            settings=CompareSettings(), off_server=info, on_server=info, levels=[lv]))

    settings = TuneSettings(backend="vllm", base_spec={}, ks=[0, 1], concurrency=[1], repeat=2, warmup=0,
                            request=RequestSettings())

    def tune(*cands):
        return TuneReport(settings=settings, candidates=list(cands), recommendation=Recommendation(form="fixed"))
    assert dg.diagnose_tune(tune(cand(1))).headline.startswith("k=1, the largest k measured")
    assert dg.diagnose_tune(tune(cand(0))) is None


# --- where drafts land, worked by hand -------------------------------------------------------------
def answer(i: int, prompt: str, category: str, passes: list[int], drafted: int | None):
    """One answer with k = 4: its passes (prefill first); accepted = sum(passes - 1)."""
    from specadapt.records.passes import RequestPasses
    return RequestPasses(index=i, prompt_id=prompt, category=category, source="chunks+response", passes=passes,
                         output_tokens=sum(passes), accepted=sum(t - 1 for t in passes), drafted=drafted)


def speculation(answers, k: int | None = 4):
    """The section over ``answers``, its figures summed by analysis/passes.py per prompt and category."""
    from specadapt.analysis.passes import figures
    from specadapt.records.passes import SpeculationSeen
    prompts: dict[str, list] = {}
    cats: dict[str, list] = {}
    for a in answers:
        prompts.setdefault(a.prompt_id, []).append(a)
        cats.setdefault(a.category, []).append(a)
    return SpeculationSeen(available=True, source="chunks+response", k=k, requests=list(answers),
                           overall=figures("all", answers), prompts=[figures(p, v) for p, v in prompts.items()],
                           categories=[figures(c, v) for c, v in sorted(cats.items())])


# code: c1 accepts 4+4+4+3 = 15 of 16 (94%), 20 tokens in 5 passes (4.00); c2 accepts 2+2+0+0+1 = 5 of 20
# (25%), 11 tokens in 6 passes (1.83); together 20 of 36 (56%), 31 tokens in 11 passes (2.82): they land.
# chat: h1 accepts 0 of 16, 5 tokens in 5 passes: they do not land.
# qa: q1 accepts 2 of 12 (17%), 6 in 4 passes (1.50); q2 accepts 4 of 8 (50%: the land bound itself), 7 in 3
# passes (2.33); together 6 of 20 (30%: the low-acceptance bound itself, not below it), 13 in 7 (1.86): partly.
LANDING_ANSWERS = [answer(0, "c1", "code", [1, 5, 5, 5, 4], 16), answer(1, "c2", "code", [1, 3, 3, 1, 1, 2], 20),
                   answer(2, "h1", "chat", [1, 1, 1, 1, 1], 16), answer(3, "q1", "qa", [1, 2, 2, 1], 12),
                   answer(4, "q2", "qa", [1, 4, 2], 8)]
SPEEDS = {"code": ratio(1.4, 1.2, 1.6), "chat": ratio(0.85, 0.8, 0.9), "qa": ratio(1.0, 0.9, 1.1)}


def at(speeds, concurrency=1, rate=None) -> LevelResult:
    """A first level whose TPOT ratio per category is ``speeds``."""
    return level(ratio(1.0, 0.9, 1.1), concurrency=0 if rate else concurrency, rate=rate, cats=speeds)


def test_drafts_land_names_the_categories_and_prompts_by_acceptance_and_by_speed():
    groups, text = dg.drafts_land(speculation(LANDING_ANSWERS), "", at(SPEEDS))
    assert text == (
        "Drafts land on code (acceptance 56%, 2.82 tokens per pass); partly on qa (acceptance 30%, 1.86 tokens per "
        "pass); they do not on chat (acceptance 0%, 1.00 tokens per pass). "
        "Within code, drafts land on c1 (acceptance 94%, 4.00 tokens per pass); they do not on c2 (acceptance 25%, "
        "1.83 tokens per pass). "
        "Within qa, drafts land on q2 (acceptance 50%, 2.33 tokens per pass); they do not on q1 (acceptance 17%, "
        "1.50 tokens per pass). "
        "By speed at concurrency 1: chat is slower (TPOT 0.85x [0.80, 0.90]), where its drafts do not land: its "
        "passes check drafts that are thrown away; code is faster (TPOT 1.40x [1.20, 1.60]), where its drafts land; "
        "qa is neither clearly faster nor slower (TPOT 1.00x [0.90, 1.10]), where its drafts land partly.")
    assert [(g.kind, g.name, g.category, g.lands) for g in groups] == [
        ("category", "chat", "chat", "not"), ("category", "code", "code", "land"), ("category", "qa", "qa", "partly"),
        ("prompt", "c1", "code", "land"), ("prompt", "c2", "code", "not"), ("prompt", "q1", "qa", "not"),
        ("prompt", "q2", "qa", "land")]
    code = groups[1]
    assert (code.requests, code.drafted, code.acceptance_rate, code.land_rate) == (2, 36, 20 / 36, 20 / 36)
    assert code.tokens_per_pass == pytest.approx(31 / 11) and code.tpot_ratio == SPEEDS["code"]
    assert groups[3].tpot_ratio is None  # prompts have no speed of their own


def test_the_landing_bounds_and_the_rate_where_drafted_tokens_are_not_known():
    from specadapt.records.passes import PassFigures
    assert [dg.land_class(r) for r in (None, 0.0, 0.2999, 0.3, 0.4999, 0.5, 1.0)] == [
        "unknown", "not", "not", "partly", "partly", "land", "land"]
    counted = PassFigures(name="x", requests=1, output_tokens=9, accepted=3, drafted=12, tokens_per_pass=3.0)
    assert dg.land_rate(counted, 4) == 0.25  # accepted / drafted first, not (3 - 1) / 4
    assert dg.land_rate(counted.model_copy(update={"drafted": 0}), 4) == 0.0
    chunks = counted.model_copy(update={"drafted": None})
    assert dg.land_rate(chunks, 4) == 0.5 and dg.land_rate(chunks, 8) == 0.25
    assert dg.land_rate(chunks, None) is None and dg.land_rate(chunks, 0) is None
    assert dg.land_rate(chunks.model_copy(update={"tokens_per_pass": None}), 4) is None


def test_unknown_drafts_no_draft_at_all_and_the_prompts_counted_beyond_three():
    # chunks only (drafted unknown): "a" 2.50 tokens per pass -> (2.5 - 1) / 4 = 0.375, partly; "b" 1.00 -> 0
    chunky = [answer(0, "a", "rag", [1, 2, 2, 5], None), answer(1, "b", "math", [1, 1, 1, 1], None)]
    groups, text = dg.drafts_land(speculation(chunky), "", at({}))
    assert [g.land_rate for g in groups] == [0.0, 0.375]
    assert text == "Drafts land partly on rag (2.50 tokens per pass); they do not on math (1.00 tokens per pass)."
    _, text = dg.drafts_land(speculation(chunky, k=None), "", None)
    assert text == "Whether drafts land is not known on math (1.00 tokens per pass) and rag (2.50 tokens per pass)."
    # n-gram found nothing to draft: 0 drafted, "no draft proposed", not landing
    _, text = dg.drafts_land(speculation([answer(0, "a", "chat", [1, 1, 1], 0)]), "", None)
    assert text == "Drafts do not land on chat (no draft proposed, 1.00 tokens per pass)."
    # five prompts in one category: one lands, four do not; of those the three lowest are named, lowest first
    many = [answer(0, "top", "qa", [1, 5], 4), answer(1, "n1", "qa", [1, 2], 4), answer(2, "n2", "qa", [1, 1], 4),
            answer(3, "n3", "qa", [1, 1, 1], 8), answer(4, "n4", "qa", [1, 1, 2, 1], 12)]
    _, text = dg.drafts_land(speculation(many), "", None)
    # qa: accepted 4 + 1 + 0 + 0 + 1 = 6 of 4 + 4 + 4 + 8 + 12 = 32 (19%), 6 + 3 + 2 + 3 + 5 = 19 tokens in
    # 2 + 2 + 2 + 3 + 4 = 13 passes (1.46); n1 (1 of 4, 25%) is the one counted, not named
    assert text == ("Drafts do not land on qa (acceptance 19%, 1.46 tokens per pass). Within qa, drafts land on top "
                    "(acceptance 100%, 3.00 tokens per pass); they do not on n2 (acceptance 0%, 1.00 tokens per pass), "
                    "n3 (acceptance 0%, 1.00 tokens per pass), n4 (acceptance 8%, 1.25 tokens per pass) and 1 more.")
    # a category whose prompts all land alike is not broken down: 4 + 3 of 8 (88%), 6 + 5 tokens in 4 passes
    alike = [answer(0, "p", "qa", [1, 5], 4), answer(1, "q", "qa", [1, 4], 4)]
    _, text = dg.drafts_land(speculation(alike), "", None)
    assert text == "Drafts land on qa (acceptance 88%, 2.75 tokens per pass)."


def test_speed_and_acceptance_that_disagree_are_said_so():
    lands = [answer(0, "a", "code", [1, 5], 4), answer(1, "b", "chat", [1, 1, 1], 8)]
    speeds = {"code": ratio(1.0, 0.9, 1.1), "chat": ratio(1.3, 1.1, 1.5)}
    _, text = dg.drafts_land(speculation(lands), "", at(speeds, rate=2.0))
    assert text.endswith(
        "By speed at 2 req/s: chat is faster (TPOT 1.30x [1.10, 1.50]) although its drafts do not land; code is "
        "neither clearly faster nor slower (TPOT 1.00x [0.90, 1.10]) although its drafts land: its passes cost "
        "about what their accepted tokens save.")
    _, text = dg.drafts_land(speculation(lands), "", at({"code": ratio(0.8, 0.7, 0.9), "chat": ratio(1.0, 0.9, 1.1),
                                                        "math": ratio(2.0, 1.5, 2.5)}))
    assert text.endswith(
        "By speed at concurrency 1: chat is neither clearly faster nor slower (TPOT 1.00x [0.90, 1.10]), where its "
        "drafts do not land; code is slower (TPOT 0.80x [0.70, 0.90]) although its drafts land: its passes cost "
        "more than their accepted tokens save.")
    # no interval: no verdict, so speed is not tied to landing
    _, text = dg.drafts_land(speculation(lands), "", at({"code": RatioCI(point=1.2), "chat": RatioCI(point=1.0)}))
    assert "By speed" not in text and "TPOT" not in text


def test_without_per_request_acceptance_one_sentence_says_why():
    from specadapt.records.passes import SpeculationSeen
    off = SpeculationSeen(available=False, source_note="per-request acceptance not available: concurrency 4: several "
                                                       "requests were in flight")
    assert dg.drafts_land(off, "", at(SPEEDS, concurrency=4)) == (
        [], "Per-request acceptance not available: concurrency 4: several requests were in flight.")
    assert dg.drafts_land(SpeculationSeen(available=False), "", None) == (
        [], "Per-request acceptance not available: no reason given.")
    assert dg.drafts_land(None, "the section does not read back", None) == (
        [], "Per-request acceptance not available: the section does not read back.")
    assert dg.drafts_land(None, "", at(SPEEDS)) == ([], "")


def test_diagnose_compare_reads_the_speculation_section_and_the_first_levels_category_speeds():
    from specadapt.records import CompareReport, CompareSettings, ServerInfo
    on = ServerInfo(backend="vllm", base_url="http://on", num_speculative_tokens=4, spec_enabled=True)
    report = CompareReport(settings=CompareSettings(concurrency=[1, 4]), off_server=on, on_server=on, requests=[])
    report.levels = [level(ratio(1.1, 1.0, 1.2), cats={"code": SPEEDS["code"]}),
                     level(ratio(0.9, 0.8, 0.95), concurrency=4, cats={"code": ratio(0.5, 0.4, 0.6)})]
    assert dg.diagnose_compare(report).drafts_land == "" and dg.diagnose_compare(report).landing == []
    report.sections["speculation"] = speculation([answer(0, "c1", "code", [1, 5, 5, 5, 4], 16)]).model_dump(mode="json")
    d = dg.diagnose_compare(report)
    assert d.drafts_land == ("Drafts land on code (acceptance 94%, 4.00 tokens per pass). By speed at concurrency 1: "
                             "code is faster (TPOT 1.40x [1.20, 1.60]), where its drafts land.")
    assert [(g.name, g.lands, g.tpot_ratio) for g in d.landing] == [("code", "land", SPEEDS["code"])]
    report.sections["speculation"] = {"available": True, "k": "four"}
    assert dg.diagnose_compare(report).drafts_land == (
        "Per-request acceptance not available: the speculation section does not read back (k: Input should be a "
        "valid integer, unable to parse string as an integer).")
    report.levels = []
    report.rate_levels = [level(ratio(1.1, 1.0, 1.2), concurrency=0, rate=2.0, cats={"code": SPEEDS["chat"]})]
    report.sections["speculation"] = speculation([answer(0, "c1", "code", [1, 5, 5, 5, 4], 16)]).model_dump(mode="json")
    assert dg.diagnose_compare(report).drafts_land.endswith(
        "By speed at 2 req/s: code is slower (TPOT 0.85x [0.80, 0.90]) although its drafts land: its passes cost "
        "more than their accepted tokens save.")


def test_the_order_the_count_and_the_groups_without_figures():
    # two categories land: the higher rate first (beta 4 of 4, then alpha 3 of 5 = 60%)
    two = [answer(0, "a", "alpha", [1, 4], 5), answer(1, "b", "beta", [1, 5], 4)]
    _, text = dg.drafts_land(speculation(two), "", None)
    assert text == "Drafts land on beta (acceptance 100%, 3.00 tokens per pass) and alpha (acceptance 60%, 2.50 tokens " \
                   "per pass)."
    # exactly three prompts that do not land are all named, none counted
    three = [answer(0, "top", "qa", [1, 5], 4), answer(1, "n1", "qa", [1, 1], 4), answer(2, "n2", "qa", [1, 1], 4),
             answer(3, "n3", "qa", [1, 1], 4)]
    _, text = dg.drafts_land(speculation(three), "", None)
    assert text.endswith("they do not on n1 (acceptance 0%, 1.00 tokens per pass), n2 (acceptance 0%, 1.00 tokens per "
                         "pass) and n3 (acceptance 0%, 1.00 tokens per pass).")
    # chunks only, two prompts of one category: each judged by (T - 1) / k with the section's k = 4
    chunky = [answer(0, "a", "rag", [1, 2, 2, 5], None), answer(1, "b", "rag", [1, 1, 1, 1], None)]
    groups, text = dg.drafts_land(speculation(chunky), "", at({"rag": ratio(1.3, 1.1, 1.5)}))
    # rag: 1 + 2 + 2 + 5 + 1 + 1 + 1 + 1 = 14 tokens in 8 passes (1.75): (1.75 - 1) / 4 = 18.75%
    assert [(g.name, g.land_rate) for g in groups] == [("rag", 0.1875), ("a", 0.375), ("b", 0.0)]
    assert text == ("Drafts do not land on rag (1.75 tokens per pass). Within rag, drafts land partly on a (2.50 tokens "
                    "per pass); they do not on b (1.00 tokens per pass). By speed at concurrency 1: rag is faster (TPOT "
                    "1.30x [1.10, 1.50]) although its drafts do not land.")
    # k unknown: whether they land is not known, and the speed is said without a tie
    _, text = dg.drafts_land(speculation(chunky, k=None), "", at({"rag": ratio(1.3, 1.1, 1.5)}))
    assert text == ("Whether drafts land is not known on rag (1.75 tokens per pass). By speed at concurrency 1: rag is "
                    "faster (TPOT 1.30x [1.10, 1.50]).")
    # a group with no figure at all is named bare
    from specadapt.records.passes import PassFigures, SpeculationSeen
    bare = SpeculationSeen(available=True, k=4, categories=[PassFigures(name="x", requests=1, output_tokens=3,
                                                                         accepted=0)])
    assert dg.drafts_land(bare, "", None)[1] == "Whether drafts land is not known on x."

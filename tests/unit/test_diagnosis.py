"""The diagnosis on constructed levels: each figure against its formula worked by hand, each cause
where its evidence is and absent where it is not, and "not enough evidence" where it is thin."""

from __future__ import annotations

import math

import pytest

from specadapt.native_reference import theory
from specadapt.probes import diagnosis as dg
from specadapt.records import (
    AcceptanceSummary,
    Distribution,
    LatencySummary,
    LevelResult,
    RatioCI,
    RequestRecord,
    SpeedRatios,
)


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
    r = dg.ttft_ratio(recs)
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

    from specadapt.probes.compare import draft_cost_of
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


def test_tune_reads_its_largest_k_through_the_fit_over_every_k():
    from specadapt.probes import tune as tuning
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

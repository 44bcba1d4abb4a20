"""The configs `specadapt tune` writes: one recommendation, the same draft length per batch size
in vLLM's and TensorRT-LLM's words, every file validated before it is written."""

from __future__ import annotations

import json
from bisect import bisect_left

import pytest
import yaml

from specadapt.adapters.spec_config import load_spec_config
from specadapt.configs import tuned as T
from specadapt.configs.render import render
from specadapt.configs.spec import SpecConfig
from specadapt.configs.vllm import spec_from_vllm_json
from specadapt.errors import UsageError
from specadapt.records.schedule import k_for_batch
from specadapt.records.tune import Recommendation

NGRAM = SpecConfig(method="ngram", k=4, ngram_max=3)
HF_TARGET = "HuggingFaceTB/SmolLM2-135M-Instruct"  # not a local directory: vLLM's check does not apply


def trt_lookup(sc: dict, batch_size: int) -> int:
    """TensorRT-LLM's rule, on a written speculative_config: draft_len_schedule's first key >= the
    batch size, nothing past the largest key; max_concurrency: off above it; else max_draft_len."""
    schedule = sc.get("draft_len_schedule")
    if schedule is not None:
        keys = sorted(int(key) for key in schedule)
        i = bisect_left(keys, batch_size)
        return schedule[keys[i]] if i < len(keys) else 0
    if sc.get("max_concurrency") is not None and batch_size > sc["max_concurrency"]:
        return 0
    return sc["max_draft_len"]


def sc_of(spec: SpecConfig) -> dict:
    return yaml.safe_load(render(spec, "trtllm", "yaml"))["speculative_config"]


# ------------------------------------------------------------------ vLLM form

@pytest.mark.parametrize("schedule", [None, [(1, 64, 4)], [(1, 8, 4), (9, 64, 4)]])
def test_vllm_spec_without_a_schedule_where_k_holds_everywhere(schedule):
    spec = T.vllm_spec(NGRAM.model_copy(update={"k": 2}), 4, schedule)
    assert (spec.k, spec.k_per_batch_size, spec.ngram_max) == (4, None, 3)
    assert "num_speculative_tokens_per_batch_size" not in json.loads(render(spec, "vllm", "json"))


def test_vllm_spec_carries_the_schedule_sorted():
    spec = T.vllm_spec(NGRAM, 4, [(9, 64, 1), (1, 8, 4)])
    assert (spec.k, spec.k_per_batch_size) == (4, [(1, 8, 4), (9, 64, 1)])


def test_vllm_spec_drops_tensorrt_llm_fields_of_the_base():
    for extra in ({"max_concurrency": 8}, {"draft_len_schedule": {8: 4, 64: 0}}):
        spec = T.vllm_spec(NGRAM.model_copy(update=extra), 4, [(1, 8, 4), (9, 64, 0)])
        assert (spec.max_concurrency, spec.draft_len_schedule) == (None, None)


def test_the_smallest_k_and_a_base_without_k():
    assert T.vllm_spec(NGRAM, 1, None).k == 1
    assert T.trtllm_spec(NGRAM, 1, None)[0].k == 1
    bare = SpecConfig(method="ngram", ngram_max=3)
    assert T.vllm_spec(bare, 3, None).k == 3
    assert T.trtllm_spec(bare, 3, None)[0].k == 3
    assert T.trtllm_spec(bare.model_copy(update={"k": 2}), 3, [(1, 8, 3), (9, 64, 0)])[0].k == 3


def test_trtllm_spec_drops_the_other_schedule_fields_of_the_base():
    base = NGRAM.model_copy(update={"k_per_batch_size": [(1, 64, 4)], "max_concurrency": 4,
                                    "draft_len_schedule": {8: 4}})
    for schedule in (None, [(1, 8, 4), (9, 64, 0)], [(1, 8, 4), (9, 64, 2)]):
        spec, _ = T.trtllm_spec(base, 4, schedule)
        assert spec.k_per_batch_size is None
        assert (spec.max_concurrency is None) or (spec.draft_len_schedule is None)
    assert T.trtllm_spec(base, 4, None)[0].model_dump(include={"max_concurrency", "draft_len_schedule"}) == \
        {"max_concurrency": None, "draft_len_schedule": None}


@pytest.mark.parametrize("k", [0, -1])
def test_off_has_no_speculative_config(k):
    with pytest.raises(ValueError, match="off has no speculative config"):
        T.vllm_spec(NGRAM, k, None)
    with pytest.raises(ValueError, match="off has no speculative config"):
        T.trtllm_spec(NGRAM, k, None)


@pytest.mark.parametrize("schedule,says", [
    ([(1, 8, 5), (9, 64, 1)], "between 0 and k=4"),
    ([(2, 64, 4)], "must start at 1"),
])
def test_a_schedule_vllm_would_not_run_as_written_is_refused(schedule, says):
    for convert in (T.vllm_spec, T.trtllm_spec):
        with pytest.raises(UsageError, match=says):
            convert(NGRAM, 4, schedule)


# ------------------------------------------------------------------ TensorRT-LLM form

SCHEDULES = {
    "fixed": [(1, 64, 4)],
    "cut-off": [(1, 8, 4), (9, 64, 0)],
    "cut-off after a gap": [(1, 8, 4), (12, 64, 0)],
    "steps down to off": [(1, 4, 4), (5, 16, 2), (17, 64, 0)],
    "steps down, still drafting": [(1, 4, 4), (5, 16, 2), (17, 64, 1)],
    "gap, still drafting": [(1, 8, 4), (12, 64, 1)],
    "equal neighbours": [(1, 4, 4), (5, 8, 4), (9, 32, 2), (33, 64, 2)],
    "engine k above the schedule": [(1, 8, 3), (9, 64, 1)],
    "one drafting range, then off, ending early": [(1, 2, 4), (3, 3, 0)],
}
EXPECTED = {  # the TensorRT-LLM fields each schedule becomes
    "fixed": (4, None, None),
    "cut-off": (4, 8, None),
    "cut-off after a gap": (4, 11, None),
    "steps down to off": (4, None, {4: 4, 16: 2, 64: 0}),
    "steps down, still drafting": (4, None, {4: 4, 16: 2, T.TRTLLM_MAX_BATCH_SIZE: 1}),
    "gap, still drafting": (4, None, {11: 4, T.TRTLLM_MAX_BATCH_SIZE: 1}),
    "equal neighbours": (4, None, {8: 4, T.TRTLLM_MAX_BATCH_SIZE: 2}),
    "engine k above the schedule": (3, None, {8: 3, T.TRTLLM_MAX_BATCH_SIZE: 1}),
    "one drafting range, then off, ending early": (4, 2, None),
}


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_trtllm_form_of_each_schedule(name):
    spec, note = T.trtllm_spec(NGRAM, 4, SCHEDULES[name])
    assert (spec.k, spec.max_concurrency, spec.draft_len_schedule) == EXPECTED[name]
    assert spec.k_per_batch_size is None and note


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_trtllm_draft_length_equals_vllms_at_every_batch_size(name):
    schedule = SCHEDULES[name]
    spec, _ = T.trtllm_spec(NGRAM, 4, schedule)
    sc = sc_of(spec)
    for batch_size in [*range(1, 65), 65, 100, 1000, T.TRTLLM_MAX_BATCH_SIZE]:
        assert trt_lookup(sc, batch_size) == k_for_batch(schedule, batch_size, 4), batch_size
    assert T.first_disagreement(schedule, 4, spec) is None


def test_notes_say_what_each_form_means():
    assert T.trtllm_spec(NGRAM, 4, None)[1] == "max_draft_len 4 at every batch size"
    assert T.trtllm_spec(NGRAM, 4, SCHEDULES["cut-off"])[1] == \
        "max_draft_len 4 up to batch size 8, speculation off above (max_concurrency)"
    _, drafting = T.trtllm_spec(NGRAM, 4, SCHEDULES["steps down, still drafting"])
    assert "first key >= the batch size" in drafting
    assert f"default max_batch_size ({T.TRTLLM_MAX_BATCH_SIZE}), so batch sizes above 64 keep draft length 1" \
        in drafting
    assert drafting == ("draft_len_schedule: each key is the largest batch size of its draft length (TensorRT-LLM "
                        "takes the first key >= the batch size); the last key is TensorRT-LLM's default "
                        "max_batch_size (2048), so batch sizes above 64 keep draft length 1 as in vLLM "
                        "(TensorRT-LLM drafts nothing past the largest key)")
    _, to_off = T.trtllm_spec(NGRAM, 4, SCHEDULES["steps down to off"])
    assert to_off == ("draft_len_schedule: each key is the largest batch size of its draft length "
                      "(TensorRT-LLM takes the first key >= the batch size)")


def test_a_last_range_past_tensorrt_llms_default_batch_keeps_its_end():
    big = T.TRTLLM_MAX_BATCH_SIZE + 100
    spec, note = T.trtllm_spec(NGRAM, 4, [(1, 8, 4), (9, big, 2)])
    assert spec.draft_len_schedule == {8: 4, big: 2} and "max_batch_size" not in note
    at_default, at_default_note = T.trtllm_spec(NGRAM, 4, [(1, 8, 4), (9, T.TRTLLM_MAX_BATCH_SIZE, 2)])
    assert at_default.draft_len_schedule == {8: 4, T.TRTLLM_MAX_BATCH_SIZE: 2}
    assert "max_batch_size" not in at_default_note


@pytest.mark.parametrize("schedule,rise", [
    ([(1, 8, 2), (9, 64, 4)], "from 2 to 4 above batch size 8"),
    ([(1, 8, 4), (9, 16, 0), (17, 64, 4)], "from 0 to 4 above batch size 16"),
    ([(1, 8, 3), (9, 16, 2), (20, 64, 3)], "from 2 to 3 above batch size 19"),
])
def test_a_draft_length_rising_with_batch_size_cannot_be_written(schedule, rise):
    spec, why = T.trtllm_spec(NGRAM, 4, schedule)
    assert spec is None
    assert why == (f"the schedule raises the draft length {rise}; TensorRT-LLM drafts the most at the "
                   "smallest batch size (draft_len_schedule's smallest key must equal max_draft_len), so it "
                   "cannot say this: deploy the fixed k instead")


def test_a_schedule_that_never_drafts_has_no_trtllm_config():
    spec, why = T.trtllm_spec(NGRAM, 4, [(1, 64, 0)])
    assert spec is None and why.startswith("the schedule drafts nothing at any batch size")


@pytest.mark.parametrize("base,says", [
    (SpecConfig(method="suffix", k=4), "does not support method 'suffix'"),
    (SpecConfig(method="eagle", k=4, draft="/heads"), "does not support method 'eagle'"),
])
def test_methods_tensorrt_llm_cannot_run(base, says):
    spec, why = T.trtllm_spec(base, 4, None)
    assert spec is None
    assert why.startswith("TensorRT-LLM cannot run this config: ") and says in why


@pytest.mark.parametrize("schedule,floored", [
    ([(1, 8, 4), (9, 64, 0)], True), ([(1, 4, 4), (5, 8, 2), (9, 64, 0)], True),
    ([(1, 8, 4), (9, 64, 1)], False), (None, False),
])
def test_a_draft_model_schedule_that_stops_drafting_warns_of_tensorrt_llms_floor(schedule, floored):
    # tensorrt_llm/_torch/speculative/utils.py get_draft_len_for_batch_size(min_draft_len); 1 for Draft_Target
    floor = "; newer TensorRT-LLM drafts at least 1 token with Draft_Target where this says 0 (min_runtime_draft_len)"
    draft = SpecConfig(method="draft_model", k=4, draft="/d")
    assert T.trtllm_spec(draft, 4, schedule)[1].endswith(floor) is floored
    assert floor not in T.trtllm_spec(NGRAM, 4, schedule)[1]
    dropped = T.trtllm_spec(draft.model_copy(update={"tp": 2, "draft_tp": 1}), 4, schedule)[1]
    assert "(draft_tp dropped: " in dropped and dropped.endswith(floor) is floored


def test_every_reason_tensorrt_llm_cannot_run_it_is_given():
    _, why = T.trtllm_spec(SpecConfig(method="eagle", k=4), 4, None)
    assert "EAGLE-3 checkpoint. Method 'eagle' needs a draft" in why


def test_vllm_only_draft_settings_are_dropped_with_a_word():
    base = SpecConfig(method="draft_model", k=4, draft="/d", tp=2, draft_tp=1)
    spec, note = T.trtllm_spec(base, 4, None)
    assert (spec.draft_tp, spec.tp, spec.draft) == (None, 2, "/d")
    assert note.endswith("(draft_tp dropped: TensorRT-LLM runs the draft at the target's tensor parallel "
                         "size and has no minimum n-gram)")
    ngram, ngram_note = T.trtllm_spec(NGRAM.model_copy(update={"ngram_min": 2}), 4, None)
    assert ngram.ngram_min is None and "(ngram_min dropped" in ngram_note
    both = NGRAM.model_copy(update={"ngram_min": 2, "draft_tp": 1})
    assert " (draft_tp, ngram_min dropped: " in T.trtllm_spec(both, 4, None)[1]
    assert "dropped" not in T.trtllm_spec(NGRAM, 4, None)[1]


# ------------------------------------------------------------------ the lookups themselves

@pytest.mark.parametrize("batch_size,draft_len", [(1, 4), (4, 4), (5, 2), (8, 2), (9, 1), (32, 1), (33, 0)])
def test_trtllm_draft_len_follows_tensorrt_llms_documented_example(batch_size, draft_len):
    # llm_args.py DecodingBaseConfig.draft_len_schedule: {4: 4, 8: 2, 32: 1}
    spec = SpecConfig(method="ngram", k=4, draft_len_schedule={4: 4, 8: 2, 32: 1})
    assert T.trtllm_draft_len(spec, batch_size) == draft_len


def test_trtllm_draft_len_of_a_cut_off_and_of_a_fixed_k():
    cut = SpecConfig(method="ngram", k=3, max_concurrency=8)
    assert [T.trtllm_draft_len(cut, b) for b in (1, 8, 9)] == [3, 3, 0]
    assert T.trtllm_draft_len(SpecConfig(method="ngram", k=3), 4096) == 3
    assert T.trtllm_draft_len(SpecConfig(method="ngram", k=1, max_concurrency=8), 8) == 1


@pytest.mark.parametrize("trt,first", [
    (SpecConfig(method="ngram", k=4, draft_len_schedule={8: 4, 64: 2}), 65),
    (SpecConfig(method="ngram", k=4, draft_len_schedule={9: 4, T.TRTLLM_MAX_BATCH_SIZE: 2}), 9),
    (SpecConfig(method="ngram", k=4, max_concurrency=8), 9),
    (SpecConfig(method="ngram", k=4), 9),
    (SpecConfig(method="ngram", k=3, draft_len_schedule={8: 3, T.TRTLLM_MAX_BATCH_SIZE: 2}), 1),
])
def test_first_disagreement_finds_the_first_batch_size_that_differs(trt, first):
    assert T.first_disagreement([(1, 8, 4), (9, 64, 2)], 4, trt) == first


def test_first_disagreement_looks_only_as_far_as_asked():
    trt = SpecConfig(method="ngram", k=4, draft_len_schedule={8: 4, 64: 2})
    assert T.first_disagreement([(1, 8, 4), (9, 64, 2)], 4, trt, upto=64) is None
    assert T.first_disagreement([(1, 8, 4), (9, 64, 2)], 4, trt, upto=65) == 65


# ------------------------------------------------------------------ the files

def _write(tmp_path, rec, base=NGRAM, **kw):
    return T.write_tuned_configs(base, rec, tmp_path, target=HF_TARGET, **kw)


def test_a_schedule_writes_three_files_validated_and_read_back(tmp_path):
    schedule = [(1, 4, 4), (5, 16, 2), (17, 64, 1)]
    rec = Recommendation(form="schedule", k=4, schedule=schedule, fixed_fallback_k=3)
    written = _write(tmp_path, rec)
    assert [(w.engine, w.path, w.form) for w in written] == [
        ("vllm", str(tmp_path / "vllm-speculative-config.json"), "schedule"),
        ("vllm", str(tmp_path / "vllm-fixed-k.json"), "fixed"),
        ("trtllm", str(tmp_path / "trtllm-config.yaml"), "schedule")]
    assert sorted(p.name for p in tmp_path.iterdir()) == \
        ["trtllm-config.yaml", "vllm-fixed-k.json", "vllm-speculative-config.json"]
    assert written[0].checked_by == written[1].checked_by == ["specadapt rules (vLLM 0.32.0)"]
    assert written[2].checked_by == ["specadapt rules (TensorRT-LLM)", "TensorRT-LLM field rules",
                                     f"draft length equal to vLLM's at batch sizes 1-{T.TRTLLM_MAX_BATCH_SIZE}"]
    assert written[0].note is None and "does not apply num_speculative_tokens_per_batch_size" in written[1].note
    assert written[2].note == T.trtllm_spec(NGRAM, 4, schedule)[1]

    vllm_text = (tmp_path / "vllm-speculative-config.json").read_text()
    back = spec_from_vllm_json(json.loads(vllm_text))
    assert (back.method, back.k, back.ngram_max, back.k_per_batch_size) == ("ngram", 4, 3, schedule)
    # the same text `specadapt config --format json` writes for that spec
    assert vllm_text == render(SpecConfig(method="ngram", k=4, ngram_max=3, k_per_batch_size=schedule),
                               "vllm", "json")
    fixed = spec_from_vllm_json(json.loads((tmp_path / "vllm-fixed-k.json").read_text()))
    assert (fixed.k, fixed.k_per_batch_size) == (3, None)

    doc = yaml.safe_load((tmp_path / "trtllm-config.yaml").read_text())
    trt = load_spec_config(str(tmp_path / "trtllm-config.yaml"), "trtllm")
    assert (trt.method, trt.k, trt.ngram_max, trt.max_concurrency) == ("ngram", 4, 3, None)
    assert trt.draft_len_schedule == {4: 4, 16: 2, T.TRTLLM_MAX_BATCH_SIZE: 1}
    assert [trt_lookup(doc["speculative_config"], b) for b in range(1, 65)] == \
        [k_for_batch(back.k_per_batch_size, b, back.k) for b in range(1, 65)]


def test_a_cut_off_schedule_reads_back_as_max_concurrency(tmp_path):
    rec = Recommendation(form="schedule", k=4, schedule=[(1, 8, 4), (9, 64, 0)], fixed_fallback_k=4)
    written = _write(tmp_path, rec)
    assert written[-1].form == "max_concurrency"
    trt = load_spec_config(str(tmp_path / "trtllm-config.yaml"), "trtllm")
    assert (trt.k, trt.max_concurrency, trt.draft_len_schedule) == (4, 8, None)
    back = spec_from_vllm_json(json.loads((tmp_path / "vllm-speculative-config.json").read_text()))
    assert back.k_per_batch_size == [(1, 8, 4), (9, 64, 0)]


@pytest.mark.parametrize("fallback", [None, 0])
def test_no_fixed_fallback_file_without_a_fallback_k(tmp_path, fallback):
    rec = Recommendation(form="schedule", k=4, schedule=[(1, 8, 4), (9, 64, 1)], fixed_fallback_k=fallback)
    assert [w.form for w in _write(tmp_path, rec)] == ["schedule", "schedule"]
    assert not (tmp_path / "vllm-fixed-k.json").exists()


def test_a_schedule_that_is_k_everywhere_is_written_fixed(tmp_path):
    rec = Recommendation(form="schedule", k=4, schedule=[(1, 8, 4), (9, 64, 4)], fixed_fallback_k=4)
    assert [(w.path.rsplit("/", 1)[1], w.form) for w in _write(tmp_path, rec)] == \
        [("vllm-speculative-config.json", "fixed"), ("trtllm-config.yaml", "fixed")]


def test_fixed_writes_both_engines_at_that_k(tmp_path):
    base = SpecConfig(method="draft_model", k=2, draft="/models/draft", dtype="bfloat16")
    written = _write(tmp_path, Recommendation(form="fixed", k=5, fixed_fallback_k=5), base=base)
    assert [(w.engine, w.form) for w in written] == [("vllm", "fixed"), ("trtllm", "fixed")]
    vllm = spec_from_vllm_json(json.loads((tmp_path / "vllm-speculative-config.json").read_text()))
    assert (vllm.method, vllm.k, vllm.draft, vllm.k_per_batch_size) == ("draft_model", 5, "/models/draft", None)
    trt = load_spec_config(str(tmp_path / "trtllm-config.yaml"), "trtllm")
    assert (trt.method, trt.k, trt.draft, trt.draft_len_schedule, trt.max_concurrency) == \
        ("draft_model", 5, "/models/draft", None, None)
    assert yaml.safe_load((tmp_path / "trtllm-config.yaml").read_text())["dtype"] == "bfloat16"


@pytest.mark.parametrize("form,note", [("off", T.OFF_NOTE), ("none", T.NONE_NOTE)])
def test_off_and_none_write_nothing_and_say_why(tmp_path, form, note):
    written = _write(tmp_path, Recommendation(form=form, k=0))
    assert [(w.engine, w.path, w.form, w.note) for w in written] == \
        [("vllm", None, "off", note), ("trtllm", None, "off", note)]
    assert list(tmp_path.iterdir()) == []
    assert T.OFF_NOTE == ("speculation did not pay at any measured batch size: deploy without a "
                          "speculative config")


def test_a_rising_schedule_writes_vllm_only(tmp_path):
    rec = Recommendation(form="schedule", k=4, schedule=[(1, 8, 2), (9, 64, 4)], fixed_fallback_k=2)
    written = _write(tmp_path, rec)
    assert [(w.engine, w.form) for w in written[:2]] == [("vllm", "schedule"), ("vllm", "fixed")]
    assert (written[2].engine, written[2].path, written[2].form) == ("trtllm", None, None)
    assert "from 2 to 4 above batch size 8" in written[2].note and written[2].checked_by == []
    assert not (tmp_path / "trtllm-config.yaml").exists()


def test_a_method_tensorrt_llm_cannot_run_writes_vllm_only(tmp_path):
    written = _write(tmp_path, Recommendation(form="fixed", k=3), base=SpecConfig(method="suffix", k=3))
    assert written[1].path is None and "does not support method 'suffix'" in written[1].note
    assert [p.name for p in tmp_path.iterdir()] == ["vllm-speculative-config.json"]


def test_nothing_is_written_when_a_config_fails_validation(tmp_path):
    base = SpecConfig(method="draft_model", k=4)  # no draft
    rec = Recommendation(form="schedule", k=4, schedule=[(1, 8, 4), (9, 64, 1)], fixed_fallback_k=4)
    with pytest.raises(UsageError, match="needs a draft"):
        _write(tmp_path, rec, base=base)
    assert list(tmp_path.iterdir()) == []


def test_the_target_argument_wins_and_the_vllm_check_needs_a_local_model(tmp_path):
    base = NGRAM.model_copy(update={"target": "/not/a/model"})
    assert not T.vllm_checkable(base)
    assert not T.vllm_checkable(NGRAM.model_copy(update={"target": HF_TARGET}))
    rec = Recommendation(form="fixed", k=4)
    written = T.write_tuned_configs(base, rec, tmp_path, target=HF_TARGET)
    assert written[0].checked_by == ["specadapt rules (vLLM 0.32.0)"]


def test_a_draft_that_is_not_local_skips_vllms_check(smol_dir):
    local = SpecConfig(method="draft_model", k=3, draft=str(smol_dir), target=str(smol_dir))
    assert T.vllm_checkable(local) is True
    assert T.vllm_checkable(local.model_copy(update={"draft": HF_TARGET})) is False
    assert T.vllm_checkable(local.model_copy(update={"target": None})) is False


@pytest.fixture
def fake_vllm(monkeypatch):
    """vLLM's check replaced by a recorder (the real one below imports vllm)."""
    seen = []

    def check(spec):
        seen.append(spec)
        return f"checked k={spec.k} target={spec.target}"

    monkeypatch.setattr(T, "vllm_checkable", lambda spec: True)
    monkeypatch.setattr(T, "vllm_engine_check", check)
    return seen


def test_every_vllm_file_goes_through_vllms_check_by_default(tmp_path, fake_vllm):
    rec = Recommendation(form="schedule", k=4, schedule=[(1, 8, 4), (9, 64, 1)], fixed_fallback_k=3)
    written = T.write_tuned_configs(NGRAM, rec, tmp_path, target="/m")
    assert [w.checked_by[1:] for w in written[:2]] == [["checked k=4 target=/m"], ["checked k=3 target=/m"]]
    assert [s.k_per_batch_size for s in fake_vllm] == [[(1, 8, 4), (9, 64, 1)], None]
    unchecked = T.write_tuned_configs(NGRAM, rec, tmp_path / "b", target="/m", vllm_check=False)
    assert [w.checked_by for w in unchecked[:2]] == [["specadapt rules (vLLM 0.32.0)"]] * 2
    assert len(fake_vllm) == 2


def test_vllms_check_is_skipped_where_it_cannot_run(tmp_path, fake_vllm, monkeypatch):
    monkeypatch.setattr(T, "vllm_checkable", lambda spec: False)
    written = T.write_tuned_configs(NGRAM, Recommendation(form="fixed", k=4), tmp_path, target="/m")
    assert written[0].checked_by == ["specadapt rules (vLLM 0.32.0)"] and fake_vllm == []


def test_the_target_is_the_argument_or_else_the_bases(tmp_path, fake_vllm):
    base = NGRAM.model_copy(update={"target": "/base"})
    T.write_tuned_configs(base, Recommendation(form="fixed", k=4), tmp_path, target="/given")
    T.write_tuned_configs(base, Recommendation(form="fixed", k=4), tmp_path)
    assert [s.target for s in fake_vllm] == ["/given", "/base"]


def test_a_tensorrt_llm_config_that_would_draft_otherwise_than_vllm_is_not_written(tmp_path, monkeypatch):
    monkeypatch.setattr(T, "first_disagreement", lambda schedule, k, trt: 7)
    rec = Recommendation(form="schedule", k=4, schedule=[(1, 8, 4), (9, 64, 1)])
    with pytest.raises(RuntimeError, match="^TensorRT-LLM's draft length differs from vLLM's at batch size 7$"):
        T.write_tuned_configs(NGRAM, rec, tmp_path, target=HF_TARGET)
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------ vLLM's own check (imports vllm)

@pytest.mark.slow
def test_vllm_builds_the_written_schedule(tmp_path, smol_dir):
    rec = Recommendation(form="schedule", k=4, schedule=[(1, 4, 4), (5, 16, 2), (17, 64, 0)], fixed_fallback_k=3)
    written = T.write_tuned_configs(NGRAM, rec, tmp_path, target=str(smol_dir))
    assert written[0].checked_by == [
        "specadapt rules (vLLM 0.32.0)",
        "vLLM 0.32.0 create_speculative_config and validate_and_normalize_dynamic_sd_schedule"]
    assert written[1].checked_by == ["specadapt rules (vLLM 0.32.0)", "vLLM 0.32.0 create_speculative_config"]
    off = T.write_tuned_configs(NGRAM, rec, tmp_path / "unchecked", target=str(smol_dir), vllm_check=False)
    assert off[0].checked_by == ["specadapt rules (vLLM 0.32.0)"]


@pytest.mark.slow
def test_a_config_vllm_refuses_is_a_usage_error_and_no_file(tmp_path, smol_dir):
    # specadapt carries vLLM-only keys verbatim; vLLM's SpeculativeConfig checks their values
    base = NGRAM.model_copy(update={"native_extras": {"vllm": {"rejection_sample_method": "bogus"}}})
    with pytest.raises(UsageError) as err:
        T.write_tuned_configs(base, Recommendation(form="fixed", k=4), tmp_path, target=str(smol_dir))
    message = str(err.value)
    assert message.startswith('vLLM 0.32.0 refuses the speculative config {"method":"ngram",')
    assert "rejection_sample_method" in message and "\n" not in message
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_a_schedule_vllm_refuses_is_refused_by_specadapt_first(tmp_path, smol_dir):
    """vLLM's schedule rules are a subset of specadapt's, so no schedule reaches vLLM's check that
    vLLM refuses: a bad one stops at specadapt's rules, before vLLM is asked or a file written."""
    from vllm.v1.spec_decode.dynamic.utils import validate_and_normalize_dynamic_sd_schedule

    bad = [(1, 8, 4), (8, 64, 1)]  # overlapping ranges
    with pytest.raises(ValueError, match="non-overlapping"):
        validate_and_normalize_dynamic_sd_schedule([list(e) for e in bad])
    with pytest.raises(UsageError, match="overlaps the previous range"):
        T.write_tuned_configs(NGRAM, Recommendation(form="schedule", k=4, schedule=bad), tmp_path,
                              target=str(smol_dir))
    assert list(tmp_path.iterdir()) == []

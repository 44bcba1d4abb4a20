"""The one function that says what looks wrong about two sides (analysis/sides.py ``side_notes``),
as `equiv` (compare), `equiv --sampling` and `equiv --features` call it."""

from __future__ import annotations

from specadapt.analysis.sides import side_notes
from specadapt.records import ServerInfo

ON = ServerInfo(backend="vllm", base_url="http://on", model_id="a", spec_enabled=False, dtype="float16")
OFF = ServerInfo(backend="vllm", base_url="http://off", model_id="b", spec_enabled=True, dtype="bfloat16")


def test_sampling_wording_with_every_difference():
    assert side_notes(OFF, ON) == [
        "the spec-off server has spec-decode counters: speculation looks ON there",
        "the spec-on server has no spec-decode counters: speculation looks OFF there",
        "the servers serve different model ids (b vs a)",
        "the sides differ in more than speculation: dtype: bfloat16 on the spec-off side, float16 on the spec-on side"]


def test_compare_wording_names_the_sides_off_and_on():
    notes = side_notes(OFF, ON, off_name="the 'off' server", on_name="the 'on' server")
    assert notes[:2] == ["the 'off' server has spec-decode counters: speculation looks ON there",
                         "the 'on' server has no spec-decode counters: speculation looks OFF there"]
    assert len(notes) == 4


def test_features_wording_without_the_other_differences():
    assert side_notes(OFF, ON, no_counters="every cell's activity is unknown", differences=False) == [
        "the spec-off server has spec-decode counters: speculation looks ON there",
        "the spec-on server has no spec-decode counters: every cell's activity is unknown",
        "the servers serve different model ids (b vs a)"]


def test_healthy_sides_and_no_spec_off_server():
    healthy_on = ON.model_copy(update={"spec_enabled": True, "model_id": "b", "dtype": "bfloat16"})
    healthy_off = OFF.model_copy(update={"spec_enabled": False})
    assert side_notes(healthy_off, healthy_on) == []
    assert side_notes(None, ON) == ["the spec-on server has no spec-decode counters: speculation looks OFF there"]
    assert side_notes(None, healthy_on) == []

import json
import sys

import pytest

from specadapt.adapters.plan import launch_record
from specadapt.adapters.vllm import VLLMLaunch, launch_plan
from specadapt.analysis.sides import launch_differences
from specadapt.configs.spec import SpecConfig


def test_spec_off_plan_has_no_speculative_config():
    plan = launch_plan(VLLMLaunch(model="/m", port=8000))
    assert plan.argv[:3] == [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
    assert "--model=/m" in plan.argv and "--port=8000" in plan.argv
    assert not any(a.startswith("--speculative-config") for a in plan.argv)
    assert not plan.spec_enabled and plan.spec_args == []


def test_spec_on_plan_renders_the_spec_as_vllm_json():
    spec = SpecConfig(method="ngram", k=4, ngram_min=2, ngram_max=4, native_extras={"vllm": {"enforce_eager": True}})
    plan = launch_plan(VLLMLaunch(model="/m", port=8000, spec_config=spec, dtype="bfloat16",
                                  extra_args=["--enforce-eager"]))
    flag = [a for a in plan.argv if a.startswith("--speculative-config=")]
    assert len(flag) == 1 and json.loads(flag[0].split("=", 1)[1]) == {
        "method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4,
        "enforce_eager": True}
    assert "--dtype=bfloat16" in plan.argv
    assert plan.argv[-1] == "--enforce-eager"  # extra args come last, verbatim
    assert plan.spec_enabled


def test_free_port_is_chosen_when_none_given():
    plan = launch_plan(VLLMLaunch(model="/m"))
    assert 0 < plan.port < 65536 and plan.base_url == f"http://127.0.0.1:{plan.port}"


def test_hostile_model_path_stays_one_value():
    plan = launch_plan(VLLMLaunch(model="--trust-remote-code", port=8000))
    assert "--model=--trust-remote-code" in plan.argv
    assert "--trust-remote-code" not in plan.argv


def test_interpreter_is_configurable():
    plan = launch_plan(VLLMLaunch(model="/m", port=8000, python="/opt/gpu-venv/bin/python"))
    assert plan.argv[0] == "/opt/gpu-venv/bin/python"


def test_a_spec_vllm_refuses_is_one_line_naming_the_problem():
    from specadapt.adapters.vllm import VLLMBackend
    from specadapt.errors import UsageError

    opts = VLLMLaunch(model="/m", spec_config=SpecConfig(method="ngram", k=4, max_concurrency=4))
    with pytest.raises(UsageError, match="^--spec-config: max_concurrency and draft_len_schedule are TensorRT-LLM "
                                         "settings"):
        with VLLMBackend().launched(opts):
            pass


# --- both sides of a comparison: the same argv and environment apart from speculation -------------------

NGRAM = SpecConfig(method="ngram", k=4, ngram_min=2, ngram_max=4)


def fake_python(tmp_path, with_iomp: bool) -> str:
    """An interpreter path in a fake environment; lib/libiomp5.so there when ``with_iomp``."""
    (tmp_path / "bin").mkdir()
    (tmp_path / "lib").mkdir()
    if with_iomp:
        (tmp_path / "lib" / "libiomp5.so").write_bytes(b"")
    return str(tmp_path / "bin" / "python")


def vllm_pair(python: str, **kw):
    off = launch_plan(VLLMLaunch(model="/m", port=8001, python=python, **kw))
    on = launch_plan(VLLMLaunch(model="/m", port=8002, python=python, spec_config=NGRAM, **kw))
    return off, on


def without_spec(plan) -> list[str]:
    """argv with the speculative flag and the port value taken out, by hand."""
    return [a for a in plan.argv if not a.startswith(("--speculative-config=", "--port="))]


@pytest.mark.parametrize("with_iomp", [True, False])
def test_vllm_pair_has_equal_env_and_argv_apart_from_the_spec_flag(tmp_path, monkeypatch, with_iomp):
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    off, on = vllm_pair(fake_python(tmp_path, with_iomp), dtype="bfloat16", extra_args=["--enforce-eager"])
    assert off.env == on.env
    assert without_spec(off) == without_spec(on) and len(on.argv) == len(off.argv) + 1
    iomp = str(tmp_path / "lib" / "libiomp5.so")
    assert off.env.get("LD_PRELOAD") == (iomp if with_iomp else None)
    assert any(iomp in n for n in off.notes) == with_iomp
    # the record of each says which argv entries carry the speculation; the rest compares equal
    assert off.spec_args == [] and on.spec_args == [a for a in on.argv if a.startswith("--speculative-config=")]
    assert launch_record(off).comparable_argv() == launch_record(on).comparable_argv()
    assert launch_differences(launch_record(off), launch_record(on)) == []


def test_a_user_ld_preload_is_respected_the_same_way_on_both_sides(tmp_path, monkeypatch):
    monkeypatch.setenv("LD_PRELOAD", "/opt/mine/libtcmalloc.so")
    off, on = vllm_pair(fake_python(tmp_path, with_iomp=True))
    assert "LD_PRELOAD" not in off.env and "LD_PRELOAD" not in on.env  # theirs is inherited as it is
    records = launch_record(off), launch_record(on)
    assert [r.inherited_env.get("LD_PRELOAD") for r in records] == ["/opt/mine/libtcmalloc.so"] * 2
    assert launch_differences(*records) == []


def test_the_old_spec_only_preload_would_be_flagged(tmp_path, monkeypatch):
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    off, on = vllm_pair(fake_python(tmp_path, with_iomp=True))
    off.env.pop("LD_PRELOAD")  # what specadapt used to do: preload on the spec-on side only
    lines = launch_differences(launch_record(off), launch_record(on))
    assert len(lines) == 1 and lines[0].startswith("environment LD_PRELOAD: unset on the spec-off side, ")
    assert str(tmp_path / "lib" / "libiomp5.so") in lines[0]

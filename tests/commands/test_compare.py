"""compare and equiv with the real backends: where they share options with probe, they behave
exactly like probe (these were drift bugs when compare had its own copy of the options)."""

from __future__ import annotations

import contextlib
import json

import pytest
from click.testing import CliRunner

from specadapt.adapters.llamacpp import LlamaCppBackend
from specadapt.cli import cli
from specadapt.commands.compare import parse_levels
from specadapt.errors import UsageError

NGRAM = json.dumps({"method": "ngram", "k": 4})  # the neutral form: every backend takes it


@pytest.fixture(autouse=True)
def _no_embedded_model(tmp_path, monkeypatch):
    """An empty cache: the embedded model is not fetched here, whatever this machine has."""
    monkeypatch.setenv("SPECADAPT_CACHE_DIR", str(tmp_path / "cache"))


def error_lines(*args: str) -> list[str]:
    result = CliRunner().invoke(cli, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert result.exit_code == 2, result.output
    return [ln for ln in result.output.splitlines() if ln.startswith(("error: ", "Error: "))]


@pytest.mark.parametrize("command", ["compare", "equiv"])
def test_a_missing_gguf_is_the_same_error_as_probe_s(tmp_path, command):
    """llamacpp serves a .gguf file: no 'not a Hugging Face model directory' from compare."""
    gguf = tmp_path / "m.gguf"
    line = f"error: GGUF model {gguf} not found: pass an existing .gguf file"
    assert error_lines("probe", "--backend", "llamacpp", "--model", str(gguf)) == [line]
    assert error_lines(command, "--backend", "llamacpp", "--model", str(gguf), "--spec-config", NGRAM) == [line]


def test_compare_starts_llamacpp_from_the_gguf_probe_would_start(tmp_path, monkeypatch):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    started = []

    @contextlib.contextmanager
    def launched_many(opts_list, **kw):
        started.append(list(opts_list))
        raise UsageError("stopped by the test")
        yield  # pragma: no cover

    monkeypatch.setattr(LlamaCppBackend, "launched_many", staticmethod(launched_many), raising=False)
    assert error_lines("probe", "--backend", "llamacpp", "--model", str(gguf)) == ["error: stopped by the test"]
    assert error_lines("compare", "--backend", "llamacpp", "--model", str(gguf), "--spec-config", NGRAM) == [
        "error: stopped by the test"]
    (probed,), (off, on) = started
    assert probed.model == off.model == on.model == str(gguf.resolve())
    assert off.spec_config is None and on.spec_config is not None


@pytest.mark.parametrize("command", ["compare", "equiv"])
def test_trtllm_without_model_says_it_needs_one_like_probe(command):
    line = ("error: --backend trtllm needs --model (an HF model directory or id): the embedded GGUF model cannot "
            "be served by TensorRT-LLM")
    assert error_lines("probe", "--backend", "trtllm") == [line]
    assert error_lines(command, "--backend", "trtllm", "--spec-config", NGRAM) == [line]


@pytest.mark.parametrize("command", ["compare", "equiv"])
def test_a_launch_option_the_backend_refuses_is_one_line_like_probe(command):
    line = "error: --backend trtllm: dtype: Input should be 'auto', 'float16', 'bfloat16' or 'float32'"
    assert error_lines("probe", "--backend", "trtllm", "--model", "/m", "--dtype", "fp7") == [line]
    assert error_lines(command, "--backend", "trtllm", "--model", "/m", "--dtype", "fp7", "--spec-config", NGRAM) == [
        line]


@pytest.mark.parametrize("command", ["compare", "equiv"])
def test_a_bad_spec_config_is_the_same_error_as_probe_s(tmp_path, command):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    bad = '{"method": "ngram",'
    line = ("error: --spec-config is not valid JSON (Expecting property name enclosed in double quotes at column 20): "
            "give a JSON object such as '{\"method\": \"ngram\", \"k\": 4}' or a file path")
    assert error_lines("probe", "--model", str(model), "--spec-config", bad) == [line]
    assert error_lines(command, "--model", str(model), "--spec-config", bad) == [line]


def test_concurrency_levels():
    assert parse_levels("4, 1,2,2") == [1, 2, 4]
    with pytest.raises(UsageError, match="give comma-separated integers"):
        parse_levels("1,x")
    with pytest.raises(UsageError, match="every level must be an integer >= 1"):
        parse_levels("0,1")


@pytest.mark.parametrize(("command", "args", "shown"), [("compare", [], 1), ("compare", ["--show", "3"], 3),
                                                         ("equiv", ["--show", "0"], 0)])
def test_show_reaches_the_settings_the_reports_draw_from(monkeypatch, command, args, shown):
    """--show N (default 1) is CompareSettings.show, for compare and for equiv's greedy gate."""
    from specadapt.commands import compare as compare_command

    seen = []

    def stop(plan, prompts, settings, *rest):
        seen.append(settings)
        raise UsageError("stopped by the test")

    monkeypatch.setattr(compare_command, "compare_servers", stop)
    assert error_lines(command, "--off", "http://off:8000", "--on", "http://on:8000", *args) == [
        "error: stopped by the test"]
    assert [s.show for s in seen] == [shown]
    assert error_lines(command, "--off", "http://off:8000", "--on", "http://on:8000", "--show", "-1")


# ------------------------------------------------------------------ run until decided: options and refusals

OFF_ON = ("--off", "http://off:8000", "--on", "http://on:8000")


def settings_given(monkeypatch, command: str, *args: str):
    """The (prompts, settings) compare and equiv hand to compare_servers for these options."""
    from specadapt.commands import compare as compare_command

    seen = []

    def stop(plan, prompts, settings, *rest):
        seen.append((prompts, settings))
        raise UsageError("stopped by the test")

    monkeypatch.setattr(compare_command, "compare_servers", stop)
    assert error_lines(command, *OFF_ON, *args) == ["error: stopped by the test"]
    (given,) = seen
    return given


def prompts_file(tmp_path, plain: int, chats: int = 0):
    """A JSONL prompt set: ``plain`` single prompts and ``chats`` conversations of 2 user turns."""
    lines = [json.dumps({"id": f"p{i}", "prompt": f"say {i}"}) for i in range(plain)]
    lines += [json.dumps({"id": f"c{i}", "messages": [{"role": "user", "content": "hi"}], "turns": ["more"]})
              for i in range(chats)]
    path = tmp_path / "prompts.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


@pytest.mark.parametrize("command", ["compare", "equiv"])
def test_without_until_decided_the_design_stays_fixed(monkeypatch, command):
    _, settings = settings_given(monkeypatch, command)
    assert settings.sequential is None


def test_compare_until_decided_takes_the_rule_s_options(monkeypatch):
    from specadapt.records import SequentialDesign

    _, plain = settings_given(monkeypatch, "compare", "--until-decided")
    assert plain.sequential == SequentialDesign(alpha=0.05, max_units=40, margin=None, min_units=0,
                                                fail_divergences=None)
    _, given = settings_given(monkeypatch, "compare", "--until-decided", "--max-units", "12",
                              "--equivalence-margin", "0.05", "--alpha", "0.01")
    s = given.sequential
    assert (s.max_units, s.margin, s.alpha, s.min_units, s.fail_divergences) == (12, 0.05, 0.01, 0, None)


def test_equiv_until_decided_answers_each_prompt_once_and_stops_to_fail_past_the_gate(monkeypatch, tmp_path):
    path = prompts_file(tmp_path, plain=2, chats=1)  # at concurrency 1: 2 + 2 turn pairs
    prompts, settings = settings_given(monkeypatch, "equiv", "--prompts", path, "--until-decided",
                                       "--max-suspect", "1", "--max-near-tie", "2")
    assert len(prompts) == 3 and settings.concurrency == [1, 4]
    s = settings.sequential
    assert (s.min_units, s.fail_divergences, s.max_units, s.alpha) == (4, 1 + 2 + 1, 40, 0.05)
    # near-ties unlimited: no count of divergences fails the gate; --alpha is the rule's here
    _, settings = settings_given(monkeypatch, "equiv", "--prompts", path, "--until-decided", "--alpha", "0.01")
    assert (settings.sequential.fail_divergences, settings.sequential.alpha) == (None, 0.01)
    # without concurrency 1 no floor: a block sends the whole set
    _, settings = settings_given(monkeypatch, "equiv", "--prompts", path, "--until-decided", "--concurrency", "4")
    assert settings.sequential.min_units == 0


def test_equiv_raises_its_default_cap_to_a_pass_over_the_prompts_and_refuses_a_lower_one(monkeypatch, tmp_path):
    path = prompts_file(tmp_path, plain=50)
    _, settings = settings_given(monkeypatch, "equiv", "--prompts", path, "--until-decided")
    assert (settings.sequential.min_units, settings.sequential.max_units) == (50, 50)
    assert error_lines("equiv", *OFF_ON, "--prompts", path, "--until-decided", "--max-units", "10") == [
        "error: --max-units 10 is below the 50 pairs that answer each prompt once at concurrency 1, which equiv's "
        "identity check needs: give at least 50"]


@pytest.mark.parametrize("command", ["compare", "equiv"])
@pytest.mark.parametrize(("args", "line"), [
    # the first interval at phi 0.1 comes at 3 units (0.1/3.1 squared is below 0.05 squared); the first look at 6
    (["--until-decided", "--max-units", "5"],
     "error: --max-units 5 cannot decide: the rule needs at least 6 units (at --alpha 0.05)"),
    (["--until-decided", "--equivalence-margin", "0"],
     "error: --equivalence-margin 0: give a margin between 0 and 1, exclusive (0.05 for +-5%)"),
    (["--until-decided", "--equivalence-margin", "1"],
     "error: --equivalence-margin 1: give a margin between 0 and 1, exclusive (0.05 for +-5%)"),
    (["--until-decided", "--alpha", "0.5"],
     "error: --alpha 0.5: the rule's error rate must be between 0 and 0.5, exclusive (e.g. 0.05)"),
    (["--max-units", "12", "--equivalence-margin", "0.1"],
     "error: --max-units, --equivalence-margin belong to --until-decided: add --until-decided, or leave them out"),
])
def test_the_rule_s_bad_options_are_refused_in_one_line(command, args, line):
    assert error_lines(command, *OFF_ON, *args) == [line]


def test_compare_s_alpha_belongs_to_the_rule_and_equiv_s_without_it_to_sampling():
    assert error_lines("compare", *OFF_ON, "--alpha", "0.1") == [
        "error: --alpha belongs to --until-decided: add --until-decided, or leave them out"]
    assert error_lines("equiv", *OFF_ON, "--alpha", "0.1") == [
        "error: --alpha belongs to --sampling: add --sampling, or leave them out"]
    assert error_lines("equiv", *OFF_ON, "--until-decided", "--samples", "3") == [
        "error: --samples belongs to --sampling: add --sampling, or leave them out"]
    assert len(error_lines("compare", *OFF_ON, "--until-decided", "--alpha", "0")) == 1  # outside (0, 1): click's


@pytest.mark.parametrize("command", ["compare", "equiv"])
def test_the_rule_is_refused_with_the_servers_one_after_the_other(command):
    from specadapt.orchestration.compare import ONE_AFTER_THE_OTHER

    assert error_lines(command, "--spec-config", NGRAM, "--launch", "sequential", "--until-decided") == [
        f"error: {ONE_AFTER_THE_OTHER}"]
    assert ONE_AFTER_THE_OTHER.startswith("--until-decided needs both servers up at once")


@pytest.mark.parametrize(("check", "refused"), [(["--sampling"], "--max-units belongs"),
                                                (["--features", "all"], "--max-units belongs")])
def test_equiv_s_sampling_and_features_refuse_the_rule(check, refused):
    """--sampling and --features take --until-decided (they stop early only to reject) but not the speed rule's cap."""
    assert error_lines("equiv", *OFF_ON, *check, "--until-decided", "--max-units", "12") == [
        f"error: {refused} to compare and equiv's identity gate, not to --sampling or "
        "--features (they decide on their own samples)"]


@pytest.mark.parametrize(("args", "alpha"), [([], 0.01), (["--alpha", "0.2"], 0.2)])
def test_equiv_sampling_keeps_its_own_alpha(monkeypatch, args, alpha):
    from specadapt.commands import sampling as sampling_command

    seen = []

    def stop(ctx, server_opts, off_url, on_url, launch, kw):
        seen.append(kw["alpha"])
        raise UsageError("stopped by the test")

    monkeypatch.setattr(sampling_command, "run_sampling", stop)
    assert error_lines("equiv", *OFF_ON, "--sampling", *args) == ["error: stopped by the test"]
    assert seen == [alpha]

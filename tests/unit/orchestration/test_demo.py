"""The demo's orchestration (orchestration/demo.py) with stand-in servers and a stand-in A/B: the dtype
for the machine, the plan (prompts, servers, settings), the order of the runs, every server
stopped however the demo ends, and the bad input refused before anything starts."""

from __future__ import annotations

import contextlib
import json
import math
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from specadapt.adapters.vllm import launch_plan
from specadapt.cli import cli
from specadapt.errors import ServerStartError, UsageError
from specadapt.models import COMPLETE_MARKER, decoder_layers, truncated_model_dir
from specadapt.orchestration import demo
from specadapt.records import CompareReport, CompareSettings, HardwareInfo, ServerInfo
# the fake sides of the run-until-decided tests: exact TPOTs per side, prompt and repeat, no HTTP
from tests.unit.orchestration.test_compare_sequential import wired  # noqa: F401

HW = HardwareInfo(source="this machine (specadapt started the server here)", cpu_model="Some CPU", cores=2,
                  cpu_flags=["avx2", "avx512f", "avx512_bf16"], native_dtypes=["float32", "bfloat16"])


def test_auto_dtype_is_the_hardware_modules_choice_for_this_machine(monkeypatch):
    seen = []
    monkeypatch.setattr(demo, "local_hardware", lambda source: seen.append(source) or HW)
    monkeypatch.setattr(demo, "resolve_auto_dtype", lambda hw: ("bfloat16", f"{hw.cpu_model} runs bfloat16"))
    assert demo.auto_dtype() == ("bfloat16", "Some CPU runs bfloat16", HW)
    assert seen == ["this machine (specadapt started the server here)"]


def test_an_explicit_dtype_is_kept_and_said_so(monkeypatch):
    monkeypatch.setattr(demo, "auto_dtype", lambda: ("bfloat16", "bfloat16: because", HW))
    assert demo.resolve_dtype("float32") == ("float32", "asked for with --dtype", HW)
    assert demo.resolve_dtype("auto") == ("bfloat16", "bfloat16: because", HW)
    with pytest.raises(UsageError, match="--dtype float16: give one of auto, bfloat16, float32"):
        demo.resolve_dtype("float16")


@pytest.fixture
def model_dir(tmp_path, monkeypatch) -> Path:
    """A stand-in embedded model (config only) in a cache of its own."""
    monkeypatch.setenv("SPECADAPT_CACHE_DIR", str(tmp_path / "cache"))
    path = tmp_path / "cache" / "models" / "SmolLM2-135M-Instruct"
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"num_hidden_layers": 30}))
    (path / COMPLETE_MARKER).write_text("x\n")
    monkeypatch.setattr(demo, "auto_dtype", lambda: ("bfloat16", "the CPU has avx512_bf16", HW))
    return path


def test_the_plan_has_three_servers_the_lessons_prompt_four_grounded_ones_and_one_set_of_settings(model_dir):
    plan = demo.plan_demo(demo.DemoOptions(max_tokens=64, repeat=3), check=False)
    assert decoder_layers(model_dir) == 30
    assert [p.id for p in plan.prompts] == list(demo.PROMPT_IDS)
    assert {p.grounding for p in plan.prompts} == {"input-grounded"}
    lesson, *grounded = plan.prompts
    assert (lesson.id, lesson.category) == ("capital-sentence", "lesson")
    assert len(grounded) == 4 and {p.category for p in grounded} <= {"code", "rag"}
    assert set(demo.SHOWN_PROMPT_IDS) <= set(demo.PROMPT_IDS) and demo.SHOWN_PROMPT_IDS[0] == lesson.id
    assert list(plan.launch) == ["spec-off", "ngram", "draft-model"]
    assert plan.launch["spec-off"].spec_config is None
    ngram = plan.launch["ngram"].spec_config
    assert (ngram.method, ngram.k, ngram.ngram_min, ngram.ngram_max) == ("ngram", 4, 2, 4)
    draft = plan.launch["draft-model"].spec_config
    assert (draft.method, draft.k) == ("draft_model", 3)
    assert draft.draft == str(truncated_model_dir(model_dir, 8)) == str(plan.draft_dir)
    assert plan.draft_dir.name == "SmolLM2-135M-Instruct-first8"
    assert {o.dtype for o in plan.launch.values()} == {"bfloat16"}
    assert all(o.extra_args == ["--enforce-eager"] for o in plan.launch.values())
    s = plan.settings
    assert (s.concurrency, s.repeat, s.request.max_tokens, s.dtype, s.reference, s.interleaved) == \
           ([1], 3, 64, "bfloat16", str(model_dir), True)
    assert s.draft_cost is None  # a draft model's cost is read from its config.json and the target's
    assert s.show == 0  # the demo names the answers it draws (SHOWN_PROMPT_IDS), not each compare
    assert s.draw_prompts == list(demo.SHOWN_PROMPT_IDS)  # and the compare reads those back in words
    compiled = demo.plan_demo(demo.DemoOptions(compile=True, server_args=("--max-num-seqs=4",)), check=False)
    assert all(o.extra_args == ["--max-num-seqs=4"] for o in compiled.launch.values())


@pytest.mark.parametrize("layers", [0, 30, 31, -1])
def test_draft_layers_outside_the_model_are_refused_with_its_depth(model_dir, layers):
    with pytest.raises(UsageError) as err:
        demo.plan_demo(demo.DemoOptions(draft_layers=layers), check=False)
    assert str(err.value) == (f"--draft-layers {layers}: the embedded model has 30 decoder layers; give 1 to 29")


class StandIn:
    def __init__(self, name: str):
        self.name = name
        self.base_url = f"http://{name}"


class Recorder:
    """A launcher, a compare and a draft maker that record what the demo asked of them."""

    def __init__(self, fail_start: Exception | None = None, fail_compare: BaseException | None = None):
        self.events: list[str] = []
        self.compares: list[tuple[str, str, list[str], CompareSettings]] = []
        self.fail_start, self.fail_compare = fail_start, fail_compare

    @contextlib.contextmanager
    def launcher(self, opts_list, startup_timeout_s, on_plan):
        self.events.append(f"start {len(opts_list)} (timeout {startup_timeout_s:g})")
        for opts in opts_list:
            on_plan(launch_plan(opts.model_copy(update={"port": 9})), Path("/logs/x.log"))
        try:
            if self.fail_start:
                raise self.fail_start
            yield [StandIn(o.spec_config.method if o.spec_config else "off") for o in opts_list]
        finally:
            self.events.append("stopped")

    def compare(self, off, on, prompts, settings, progress):
        self.events.append(f"compare {off.name} vs {on.name}")
        if self.fail_compare:
            raise self.fail_compare
        self.compares.append((off.name, on.name, [p.id for p in prompts], settings))
        info = ServerInfo(backend="vllm", base_url=on.base_url)
        return CompareReport(settings=settings, off_server=ServerInfo(backend="vllm", base_url=off.base_url),
                             on_server=info, counts={"identical": 4})

    def make_draft(self, src, layers, dest):
        self.events.append(f"draft {Path(src).name} {layers} {Path(dest).name}")
        return dest


class Steps(demo.DemoProgress):
    def __init__(self):
        self.lines: list[str] = []

    def step(self, text):
        self.lines.append(text)

    def server_planned(self, name, plan, log_path):
        self.lines.append(f"planned {name}")

    def servers_up(self, elapsed_s):
        self.lines.append("up")

    def run_done(self, name, seconds):
        self.lines.append(f"done {name}")

    def stop(self):
        self.lines.append("stop")


def test_the_demo_starts_every_server_once_and_runs_both_comparisons_against_spec_off(model_dir):
    plan = demo.plan_demo(demo.DemoOptions(startup_timeout_s=60), check=False)
    rec, steps = Recorder(), Steps()
    report = demo.run_demo(plan, steps, launcher=rec.launcher, compare=rec.compare, make_draft=rec.make_draft)
    assert rec.events == ["draft SmolLM2-135M-Instruct 8 SmolLM2-135M-Instruct-first8", "start 3 (timeout 60)",
                          "compare off vs ngram", "compare off vs draft_model", "stopped"]
    assert [(off, on) for off, on, _, _ in rec.compares] == [("off", "ngram"), ("off", "draft_model")]
    assert rec.compares[0][2] == rec.compares[1][2] == list(demo.PROMPT_IDS)
    first, second = rec.compares[0][3], rec.compares[1][3]
    assert first is not second  # run_compare fills in settings: each run has its own copy
    assert first.model_dump() == second.model_dump()
    assert steps.lines[0] == "dtype bfloat16: the CPU has avx512_bf16"
    assert steps.lines[2:] == ["planned spec-off", "planned ngram", "planned draft-model", "up", "done ngram",
                               "done draft-model", "stop"]
    assert [r.name for r in report.runs] == ["ngram", "draft-model"]
    assert [r.shown_prompts for r in report.runs] == [["capital-sentence", "repeat-paragraph"]] * 2
    assert report.runs[1].spec_config == {"method": "draft_model", "model": str(plan.draft_dir),
                                          "num_speculative_tokens": 3}
    assert report.kind == "demo" and report.dtype == "bfloat16" and report.hardware == HW
    assert set(report.timings.runs_s) == {"ngram", "draft-model"}
    assert report.timings.total_s >= report.timings.servers_s + sum(report.timings.runs_s.values())


def test_only_prompts_that_were_sent_are_shown(model_dir):
    plan = demo.plan_demo(demo.DemoOptions(), check=False)
    plan.prompts = demo.pick_prompts(["repeat-paragraph", "json-rewrite"])
    rec = Recorder()
    report = demo.run_demo(plan, Steps(), launcher=rec.launcher, compare=rec.compare, make_draft=rec.make_draft)
    assert [r.shown_prompts for r in report.runs] == [["repeat-paragraph"]] * 2


def test_the_lessons_prompt_asks_for_an_answer_that_restates_its_words():
    (prompt,) = demo.pick_prompts([demo.LESSON_PROMPT_ID])
    question = prompt.messages[0].content
    # the answer's first words stand in the prompt, so an n-gram draft proposes them
    assert question.startswith("What is the capital of France?") and question.endswith("\nThe capital of France is")
    with pytest.raises(UsageError, match="the built-in prompts have no nope"):
        demo.pick_prompts(["capital-sentence", "nope"])


@pytest.mark.parametrize("fault", [KeyboardInterrupt(), ServerStartError("the vllm server exited with code 1")])
def test_every_server_is_stopped_however_the_demo_ends(model_dir, fault):
    plan = demo.plan_demo(demo.DemoOptions(), check=False)
    if isinstance(fault, KeyboardInterrupt):
        rec = Recorder(fail_compare=fault)
    else:
        rec = Recorder(fail_start=fault)
    steps = Steps()
    with pytest.raises(type(fault)):
        demo.run_demo(plan, steps, launcher=rec.launcher, compare=rec.compare, make_draft=rec.make_draft)
    assert rec.events[-1] == "stopped"
    assert steps.lines[-1] == "stop"
    assert ("compare off vs ngram" in rec.events) == isinstance(fault, KeyboardInterrupt)


def test_the_health_watch_says_when_each_server_answers():
    from fake_openai import FakeOpenAIServer  # tests/unit is on sys.path

    seen: list[str] = []

    class Seen(demo.DemoProgress):
        def server_up(self, name, elapsed_s):
            seen.append(name)

    with FakeOpenAIServer() as fake:
        port = int(fake.url.rsplit(":", 1)[1])
        up = launch_plan(demo.VLLMLaunch(model="m", port=port))
        down = launch_plan(demo.VLLMLaunch(model="m", port=1))
        with demo.HealthWatch(Seen(), time.monotonic(), interval_s=0.05) as watch:
            watch.add("up", up)
            watch.add("down", down)
            deadline = time.monotonic() + 10
            while not seen and time.monotonic() < deadline:
                time.sleep(0.05)
        assert seen == ["up"] and list(watch.pending) == ["down"] and "up" in watch.up


# --- the command: bad input, one line, exit 2, before anything starts ----------------------------
def error_lines(output: str) -> list[str]:
    return [ln for ln in output.splitlines() if ln.startswith(("error: ", "Error: "))]


def test_draft_layers_out_of_range_through_the_command(model_dir):
    result = CliRunner().invoke(cli, ["demo", "--draft-layers", "30", "--out", str(model_dir.parent / "o")])
    assert result.exit_code == 2
    assert error_lines(result.output) == ["error: --draft-layers 30: the embedded model has 30 decoder layers; "
                                          "give 1 to 29"]
    assert "Traceback" not in result.output
    assert not truncated_model_dir(model_dir, 30).exists() and not (model_dir.parent / "o").exists()


@pytest.mark.parametrize("argv, line", [
    (["--repeat", "1"], "Error: Invalid value for '--repeat': 1 is not in the range x>=2."),
    (["--max-tokens", "0"], "Error: Invalid value for '--max-tokens': 0 is not in the range x>=1."),
    (["--dtype", "float16"], "Error: Invalid value for '--dtype': 'float16' is not one of 'auto', 'bfloat16', "
                             "'float32'."),
])
def test_bad_options_through_the_command(model_dir, argv, line):
    result = CliRunner().invoke(cli, ["demo", *argv])
    assert result.exit_code == 2 and error_lines(result.output) == [line]


def test_an_interpreter_without_vllm_is_refused_before_the_draft_is_made(model_dir, tmp_path):
    result = CliRunner().invoke(cli, ["demo", "--python", str(tmp_path / "nope"), "--out", str(tmp_path / "o")])
    assert result.exit_code == 2
    (line,) = error_lines(result.output)
    assert line.startswith(f"error: cannot run --python {tmp_path / 'nope'}")
    assert not truncated_model_dir(model_dir, 8).exists()


def test_without_the_embedded_model_the_demo_says_how_to_fetch_it(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECADAPT_CACHE_DIR", str(tmp_path))
    result = CliRunner().invoke(cli, ["demo"])
    assert result.exit_code == 2
    (line,) = error_lines(result.output)
    assert line.startswith("error: the embedded default model is not fetched yet") and "models fetch" in line


def with_launcher(monkeypatch, launcher, compare=None):
    """The real command and orchestration, with ``launcher`` instead of vLLM and no draft written."""
    from specadapt.commands import demo as command

    def run(plan, progress):
        return demo.run_demo(plan, progress, launcher=launcher, compare=compare or demo.run_compare,
                             make_draft=lambda src, layers, dest: dest)

    monkeypatch.setattr(command, "run_demo", run)
    monkeypatch.setattr(demo.VLLMBackend, "check_launch", lambda self, opts: None)


def test_a_server_that_fails_to_start_is_one_line_and_exit_2(model_dir, monkeypatch, tmp_path):
    rec = Recorder(fail_start=ServerStartError("the vllm server exited with code 1 during start-up"))
    with_launcher(monkeypatch, rec.launcher)
    result = CliRunner().invoke(cli, ["demo", "--out", str(tmp_path / "o")])
    assert result.exit_code == 2
    assert error_lines(result.output) == ["error: the vllm server exited with code 1 during start-up"]
    assert "Traceback" not in result.output and rec.events[-1] == "stopped" and not (tmp_path / "o").exists()


def test_ctrl_c_stops_the_servers_and_exits_130(model_dir, monkeypatch, tmp_path):
    from specadapt.cli import INTERRUPTED

    rec = Recorder(fail_compare=KeyboardInterrupt())  # Ctrl-C during the first run
    with_launcher(monkeypatch, rec.launcher, compare=rec.compare)
    result = CliRunner().invoke(cli, ["demo", "--out", str(tmp_path / "o")])
    assert result.exit_code == 130
    assert INTERRUPTED in result.output and rec.events[-1] == "stopped"




# --- run until decided ------------------------------------------------------------------------------
def test_each_run_stops_once_decided_within_the_fixed_designs_pairs(model_dir):
    plan = demo.plan_demo(demo.DemoOptions(repeat=3), check=False)
    design = plan.settings.sequential
    # 5 prompts x 3 repeats: never more pairs than the fixed design; every prompt once before a stop
    assert (design.max_units, design.min_units, design.primary, design.alpha) == (15, 5, "tpot", 0.05)
    assert design.margin is None and design.fail_divergences is None
    assert plan.settings.repeat == 3  # the fixed design stays the cap's measure
    assert plan.notes[-1] == ("each run stops as soon as its TPOT ratio is decided (run until decided: anytime-valid "
                              "95% interval after every pair, error rate 0.05 whenever it stops), after every prompt "
                              "once and at most the 15 pairs of the fixed design (every prompt 3 times; --fixed "
                              "sends them all)")
    rec = Recorder()
    demo.run_demo(plan, Steps(), launcher=rec.launcher, compare=rec.compare, make_draft=rec.make_draft)
    assert [s.sequential for _, _, _, s in rec.compares] == [design, design]


def test_fixed_keeps_the_fixed_design(model_dir):
    plan = demo.plan_demo(demo.DemoOptions(fixed=True), check=False)
    assert plan.settings.sequential is None and plan.settings.repeat == 2
    assert plan.notes[-1] == ("fixed design (--fixed): each run sends every prompt 2 times (10 pairs), whatever the "
                              "intervals show")


def test_a_cap_below_what_the_rule_needs_is_refused_with_the_least_that_decides():
    design = demo.SequentialDesign(max_units=2)
    # the rule's first look (6 units) comes after its first interval (phi 0.1, alpha 0.05: r^(n-1) < alpha^2 first
    # at n = 3, (0.1/3.1)^2 = 0.00104 < 0.0025 < (0.1/2.1) = 0.048)
    assert (design.phi, design.first_look) == (0.1, 6)
    assert demo.demo_design(3, 2).max_units == 6
    with pytest.raises(UsageError) as err:
        demo.demo_design(5, 1)
    assert str(err.value) == ("--repeat 1 with 5 prompts gives at most 5 pairs: the rule needs at least 6 to decide "
                              "(give a larger --repeat, or --fixed)")
    one_each = demo.demo_design(7, 1)  # the floor (every prompt once) never passes the cap: both count prompts
    assert (one_each.min_units, one_each.max_units) == (7, 7)


@pytest.mark.filterwarnings("ignore:No artists with labels found")  # the stand-in runs have nothing to plot
@pytest.mark.parametrize("argv, sequential", [([], True), (["--fixed"], False)])
def test_the_command_runs_until_decided_unless_fixed(model_dir, monkeypatch, tmp_path, argv, sequential):
    rec = Recorder()
    with_launcher(monkeypatch, rec.launcher, compare=rec.compare)
    result = CliRunner().invoke(cli, ["demo", "--out", str(tmp_path / "o"), *argv])
    assert result.exit_code == 0, result.output
    assert [s.sequential is not None for _, _, _, s in rec.compares] == [sequential, sequential]
    saved = json.loads((tmp_path / "o" / "report.json").read_text())
    assert [r["compare"]["settings"].get("sequential") is not None for r in saved["runs"]] == [sequential] * 2


NOISE = [0.03, -0.02, 0.04, -0.03, 0.01, -0.02, 0.03, -0.04, 0.0, 0.02]


@pytest.mark.parametrize("fixed", [False, True])
def test_the_demo_through_the_real_compare_sends_fewer_requests_once_decided(model_dir, wired, fixed):
    """Spec on at half the spec-off TPOT (noise sd about 0.03 in log): at the first look (6 pairs) the
    interval is about exp(log 2 +- 4.9 x 0.028 / sqrt(6)) = [1.88, 2.12] (phi 0.1, alpha 0.05: r = 0.1/6.1,
    A = (r alpha^2)^(1/6) = 0.186, factor sqrt(5 (1 - A) / (A - r)) = 4.9), so each run stops there: 12
    requests against the fixed design's 5 prompts x 2 repeats x 2 sides = 20."""
    from specadapt.report import demo_render

    plan = demo.plan_demo(demo.DemoOptions(fixed=fixed), check=False)
    ids = [p.id for p in plan.prompts]

    def tpot(side, pid, repeat):
        return 20.0 if side == "off" else 10.0 * math.exp(NOISE[(repeat * len(ids) + ids.index(pid)) % len(NOISE)])

    off, on, wire = wired(tpot)
    report = demo.run_demo(plan, launcher=lambda opts, timeout, on_plan: contextlib.nullcontext([off, on, on]),
                           make_draft=lambda src, layers, dest: dest)
    sent = [sum(1 for r in run.compare.requests if not r.warmup) for run in report.runs]
    if fixed:
        assert sent == [20, 20] and [run.compare.levels[0].pairs for run in report.runs] == [10, 10]
        assert demo_render.total_saving_line(report) is None
        return
    assert sent == [12, 12]
    for run in report.runs:
        (lv,) = run.compare.levels
        assert (lv.pairs, lv.sequential.units, lv.sequential.verdict, lv.sequential.stopped) == (6, 6, "faster",
                                                                                                  "decided")
        assert (lv.sequential.requests, lv.sequential.fixed_requests) == (12, 20)
        assert lv.sequential.interval.low == pytest.approx(1.88, abs=0.01)
        assert "; 12 requests against 20 for the fixed design (40% saved)" in demo_render.run_line(run)
    assert demo_render.total_saving_line(report) == ("run until decided: 24 requests against 40 for the fixed "
                                                     "design (40% saved) in all")

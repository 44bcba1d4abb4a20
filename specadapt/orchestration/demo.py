"""The demo: what speculative decoding buys, and what it costs, on this machine, in one run.

Three vLLM servers of the embedded model start side by side, in one dtype chosen for the
machine: speculation off; n-gram k=4 (a draft that matches input-grounded prompts, whose
answers copy the prompt); and a draft model that is the target cut to its first few decoder
layers (a draft that predicts the target badly). The spec-off server runs on one half of the CPUs and both
spec-on servers on the other (``off_and_on_halves``): the two sides of each comparison never share
a core, so neither stalls the other's first token. The same input-grounded prompts then go
through two interleaved comparisons against the one spec-off server (orchestration/compare.py):
n-gram vs off, then the draft model vs off. Identity is checked token by token in both, each
divergence triaged in float64 with the embedded model.

Each run stops as soon as its verdict is decided (``demo_design``: run until decided, the anytime-valid
interval of the TPOT ratio after every pair), after every prompt once and at most the pairs of the fixed
design, so it never sends more than the fixed design would; ``DemoOptions.fixed`` keeps the fixed design.

The first prompt is the lesson's example: a short factual question whose answer restates the
question's words ("The capital of France is Paris."), so the n-gram draft proposes "capital of
France is", the target accepts all of it in one pass and adds "Paris" itself. Each run names the
prompts whose spec-on answers the reports draw pass by pass (``SHOWN_PROMPT_IDS``: the lesson's
example and one grounded prompt), the same for both runs, so a reader sees them side by side:
several tokens a pass for the n-gram draft, about one for the poorly matched one.

Nothing here prints: ``DemoProgress`` receives every step, and the command layer shows them.
The launcher and the comparison are parameters, so the orchestration runs without vLLM in tests.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ContextManager

from specadapt.adapters.base import LaunchPlan, Server
from specadapt.adapters.hardware import STARTED_HERE, local_hardware, resolve_auto_dtype
from specadapt.adapters.placement import usable_cpus
from specadapt.adapters.vllm import VLLMBackend, VLLMLaunch, spec_json
from specadapt.analysis.sequential import fewest_units_to_decide
from specadapt.configs.spec import SpecConfig
from specadapt.errors import UsageError
from specadapt.load.progress import Progress
from specadapt.models import decoder_layers, is_complete, resolve_model_dir, truncated_model_dir
from specadapt.orchestration.compare import run_compare, total_requests
from specadapt.orchestration.servers import off_and_on_halves
from specadapt.records import CompareReport, CompareSettings, HardwareInfo, Prompt, RequestSettings
from specadapt.records.demo import DemoReport, DemoRun, DemoTimings
from specadapt.records.sequential import SequentialDesign
from specadapt.wire.http import Wire
from specadapt.workloads.prompts import lesson_prompts, load_builtin

# The lesson's example (workloads/data/lesson_prompts.jsonl, category lesson), then input-grounded prompts
# whose answers copy the input (built-in categories code and rag).
LESSON_PROMPT_ID = "capital-sentence"
PROMPT_IDS = (LESSON_PROMPT_ID, "copy-code-docstrings", "repeat-paragraph", "json-rewrite", "completion-code")
SHOWN_PROMPT_IDS = (LESSON_PROMPT_ID, "repeat-paragraph")
"""The prompts whose spec-on answers each run draws pass by pass."""
NGRAM = SpecConfig(method="ngram", k=4, ngram_min=2, ngram_max=4)
DRAFT_K = 3
DRAFT_LAYERS = 8
DTYPES = ("auto", "bfloat16", "float32")
EAGER = "--enforce-eager"
ON_SERVERS = ("the two spec-on servers", "compared one after the other")

# (launch options, startup timeout, on_plan) -> servers, stopped when the context exits
Launcher = Callable[[Sequence[VLLMLaunch], float, Callable[[LaunchPlan, Path], None]], ContextManager[list[Server]]]
Compare = Callable[[Server, Server, list[Prompt], CompareSettings, Progress], CompareReport]
MakeDraft = Callable[[Path, int, Path], Path]


# --- the dtype for this machine ------------------------------------------------------------------
def auto_dtype() -> tuple[str, str, HardwareInfo]:
    """(dtype, reason, hardware) for this machine: the dtype it runs natively (adapters/hardware)."""
    hw = local_hardware(STARTED_HERE)
    dtype, reason = resolve_auto_dtype(hw)
    return dtype, reason, hw


def resolve_dtype(requested: str) -> tuple[str, str, HardwareInfo]:
    """(dtype, reason, hardware) for ``--dtype``: auto picks for the machine; the others are kept."""
    if requested not in DTYPES:
        raise UsageError(f"--dtype {requested}: give one of {', '.join(DTYPES)}")
    if requested == "auto":
        return auto_dtype()
    _, _, hardware = auto_dtype()
    return requested, "asked for with --dtype", hardware


# --- the plan ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class DemoOptions:
    dtype: str = "auto"
    max_tokens: int = 96
    repeat: int = 2
    draft_layers: int = DRAFT_LAYERS
    python: str = field(default_factory=lambda: sys.executable)
    startup_timeout_s: float = 900.0
    server_args: tuple[str, ...] = ()
    compile: bool = False
    """False: every server runs with --enforce-eager (no torch.compile at start-up)."""
    fixed: bool = False
    """True: the fixed design (every prompt ``repeat`` times); False: each run stops once decided (``demo_design``)."""


@dataclass(frozen=True)
class RunSpec:
    """One comparison of the demo (the spec-on server it needs and what it is there to show)."""

    name: str
    title: str
    draft: str
    lesson: str
    spec: SpecConfig


@dataclass
class DemoPlan:
    """Everything decided before anything starts."""

    model: Path
    layers: int
    draft_dir: Path
    draft_layers: int
    dtype: str
    dtype_reason: str
    hardware: HardwareInfo
    prompts: list[Prompt]
    settings: CompareSettings
    runs: list[RunSpec]
    launch: dict[str, VLLMLaunch]  # "spec-off" and one per run, in start order
    startup_timeout_s: float
    notes: list[str] = field(default_factory=list)


def pick_prompts(ids: Sequence[str] = PROMPT_IDS) -> list[Prompt]:
    by_id = {p.id: p for p in [*lesson_prompts(), *load_builtin("default")]}
    missing = [i for i in ids if i not in by_id]
    if missing:
        raise UsageError(f"the built-in prompts have no {', '.join(missing)}")
    return [by_id[i] for i in ids]


def demo_design(prompts: int, repeat: int) -> SequentialDesign:
    """Run until decided within the fixed design: at most its prompts x ``repeat`` pairs (so a run never sends
    more than the fixed design), and every prompt at least once before a stop (its identity is checked)."""
    design = SequentialDesign(max_units=prompts * repeat, min_units=prompts)
    least = fewest_units_to_decide(design)
    if design.max_units < least:
        raise UsageError(f"--repeat {repeat} with {prompts} prompts gives at most {design.max_units} pairs: the rule "
                         f"needs at least {least} to decide (give a larger --repeat, or --fixed)")
    return design


def design_note(design: SequentialDesign | None, prompts: int, repeat: int) -> str:
    """What the runs' design is, in one sentence for the report's notes."""
    if design is None:
        return (f"fixed design (--fixed): each run sends every prompt {repeat} times ({prompts * repeat} pairs), "
                "whatever the intervals show")
    return (f"each run stops as soon as its TPOT ratio is decided (run until decided: anytime-valid "
            f"{1 - design.alpha:.0%} interval after every pair, error rate {design.alpha:g} whenever it stops), "
            f"after every prompt once and at most the {design.max_units} pairs of the fixed design (every prompt "
            f"{repeat} times; --fixed sends them all)")


def plan_demo(opts: DemoOptions, model: Path | None = None, check: bool = True) -> DemoPlan:
    """Check every option and decide the servers, prompts and settings; start and write nothing.
    ``check``: also ask the backend whether it can start each server (the interpreter has vLLM)."""
    model = Path(model) if model is not None else resolve_model_dir(None)
    layers = decoder_layers(model)
    if layers is None:
        raise UsageError(f"{model}/config.json does not say how many decoder layers the model has")
    if not 1 <= opts.draft_layers < layers:
        raise UsageError(f"--draft-layers {opts.draft_layers}: the embedded model has {layers} decoder layers; "
                         f"give 1 to {layers - 1}")
    if opts.max_tokens < 1 or opts.repeat < 2:
        raise UsageError(f"--repeat {opts.repeat}: give at least 2 (intervals need independent pairs)"
                         if opts.repeat < 2 else f"--max-tokens {opts.max_tokens}: give at least 1")
    prompts = pick_prompts()
    design = None if opts.fixed else demo_design(len(prompts), opts.repeat)
    dtype, reason, hardware = resolve_dtype(opts.dtype)
    draft_dir = truncated_model_dir(model, opts.draft_layers)
    runs = [
        RunSpec(name="ngram", title="spec off vs a well-matched draft: vLLM n-gram, k=4",
                draft=f"n-gram prompt lookup, k={NGRAM.k}, n-gram size {NGRAM.ngram_min} to {NGRAM.ngram_max}: "
                      "the next tokens are looked up in the prompt",
                lesson="the answers copy the prompt, so the draft is often right and costs nothing: "
                       "speculation pays, and the output is the same",
                spec=NGRAM),
        RunSpec(name="draft-model", title=f"spec off vs a poorly-matched draft: the first {opts.draft_layers} "
                                          f"of {layers} layers, k={DRAFT_K}",
                draft=f"draft model {draft_dir.name}: the target cut to its first {opts.draft_layers} of {layers} "
                      f"decoder layers, k={DRAFT_K}",
                lesson="the draft predicts the target badly and costs a share of a target step per draft token: "
                       "almost nothing is accepted, so speculation loses",
                spec=SpecConfig(method="draft_model", k=DRAFT_K, draft=str(draft_dir))),
    ]
    extra = [*opts.server_args]
    notes = []
    if not opts.compile and EAGER not in extra:
        extra.append(EAGER)
        notes.append("every server runs with --enforce-eager (no torch.compile at start-up, so all three are up "
                     "in minutes; each decode step is slower, alike on every side)")
    off_cpus, on_cpus, placed = off_and_on_halves(usable_cpus(), *ON_SERVERS)
    notes.append(placed)
    notes.append(design_note(design, len(prompts), opts.repeat))
    launch = {"spec-off": VLLMLaunch(model=str(model), spec_config=None, python=opts.python, dtype=dtype,
                                     extra_args=extra, cpus=off_cpus)}
    for run in runs:
        launch[run.name] = VLLMLaunch(model=str(model), spec_config=run.spec, python=opts.python, dtype=dtype,
                                      extra_args=extra, cpus=on_cpus)
    backend = VLLMBackend()
    for opt in launch.values():
        spec_json(opt.spec_config)  # the configs vLLM would refuse, before anything is written
    if check:
        backend.check_launch(launch["spec-off"])
    request = RequestSettings(max_tokens=opts.max_tokens, seed=0, logprobs=True, top_logprobs=0)
    # show=0: each run's compare draws no answer of its own choosing; the demo names its own (SHOWN_PROMPT_IDS)
    settings = CompareSettings(concurrency=[1], repeat=opts.repeat, warmup=1, request=request,
                               prompts_source=f"built-in, input-grounded: {', '.join(PROMPT_IDS)}", dtype=dtype,
                               triage=True, reference=str(model), interleaved=True, interference_check=True, show=0,
                               draw_prompts=list(SHOWN_PROMPT_IDS),
                               sequential=design)
    return DemoPlan(model=model, layers=layers, draft_dir=draft_dir, draft_layers=opts.draft_layers, dtype=dtype,
                    dtype_reason=reason, hardware=hardware, prompts=prompts, settings=settings, runs=runs,
                    launch=launch, startup_timeout_s=opts.startup_timeout_s, notes=notes)


# --- progress ------------------------------------------------------------------------------------
class DemoProgress:
    """What the demo reports while it runs (every method a no-op here; the command shows them)."""

    def step(self, text: str) -> None: ...

    def server_planned(self, name: str, plan: LaunchPlan, log_path: Path) -> None: ...

    def waiting(self, elapsed_s: float, pending: list[str]) -> None: ...

    def server_up(self, name: str, elapsed_s: float) -> None: ...

    def servers_up(self, elapsed_s: float) -> None: ...

    @contextlib.contextmanager
    def run(self, name: str, title: str, total: int) -> Iterator[Progress]:
        yield lambda rec: None

    def run_done(self, name: str, seconds: float) -> None: ...

    def stop(self) -> None:
        """The demo ends (done, failed or interrupted): end any spinner or bar."""


class HealthWatch:
    """Polls each planned server's health URL in a thread and says when each answers (the servers
    start side by side, so the launcher itself only says when all of them do)."""

    def __init__(self, progress: DemoProgress, t0: float, interval_s: float = 1.0):
        self.progress, self.t0, self.interval_s = progress, t0, interval_s
        self.pending: dict[str, str] = {}  # name -> health URL
        self.up: dict[str, float] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="demo-health")

    def add(self, name: str, plan: LaunchPlan) -> None:
        with self._lock:
            self.pending[name] = plan.base_url + plan.health_path

    def __enter__(self) -> HealthWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Stop polling (once every server answered, or when the start failed)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def _loop(self) -> None:
        with Wire("", timeout_s=2.0) as wire:  # whole URLs
            while not self._stop.wait(self.interval_s):
                with self._lock:
                    pending = dict(self.pending)
                for name, url in pending.items():
                    if wire.status(url) == 200:
                        with self._lock:
                            self.pending.pop(name, None)
                            self.up[name] = time.monotonic() - self.t0
                        self.progress.server_up(name, self.up[name])
                if self.pending:
                    self.progress.waiting(time.monotonic() - self.t0, sorted(self.pending))


def vllm_launcher(opts_list: Sequence[VLLMLaunch], startup_timeout_s: float,
                  on_plan: Callable[[LaunchPlan, Path], None]) -> ContextManager[list[Server]]:
    return VLLMBackend().launched_many(list(opts_list), startup_timeout_s=startup_timeout_s, on_plan=on_plan)


def make_truncated_draft(src: Path, layers: int, dest: Path) -> Path:
    from specadapt.native_reference.models import truncated_copy  # torch: only when the demo runs

    return truncated_copy(src, layers, dest)


def run_demo(plan: DemoPlan, progress: DemoProgress | None = None, launcher: Launcher = vllm_launcher,
             compare: Compare = run_compare, make_draft: MakeDraft = make_truncated_draft) -> DemoReport:
    """Make the draft, start every server side by side, run each comparison against the spec-off
    server; every server is stopped when this returns or raises (Ctrl-C included)."""
    progress = progress or DemoProgress()
    t0 = time.monotonic()
    timings = DemoTimings()
    runs: list[DemoRun] = []
    try:
        progress.step(f"dtype {plan.dtype}: {plan.dtype_reason}")
        reused = is_complete(plan.draft_dir)
        make_draft(plan.model, plan.draft_layers, plan.draft_dir)
        timings.draft_s = time.monotonic() - t0
        progress.step(f"draft model {'found' if reused else 'made'} in {timings.draft_s:.0f} s: {plan.draft_dir}")
        names = list(plan.launch)
        order = iter(names)
        t_servers = time.monotonic()
        with HealthWatch(progress, t_servers) as watch:
            def on_plan(launch_plan: LaunchPlan, log_path: Path) -> None:
                name = next(order)
                watch.add(name, launch_plan)
                progress.server_planned(name, launch_plan, log_path)

            servers_cm = launcher([plan.launch[n] for n in names], plan.startup_timeout_s, on_plan)
            with contextlib.ExitStack() as stack:
                servers = dict(zip(names, stack.enter_context(servers_cm), strict=True))
                watch.close()
                timings.servers_s = time.monotonic() - t_servers
                for name in names:
                    if name not in watch.up:
                        progress.server_up(name, timings.servers_s)
                progress.servers_up(timings.servers_s)
                total = total_requests(len(plan.prompts), plan.settings, plan.prompts)
                sent = {p.id for p in plan.prompts}
                shown = [i for i in SHOWN_PROMPT_IDS if i in sent]
                for spec in plan.runs:
                    settings = plan.settings.model_copy(deep=True)  # the draft's cost: from its config.json
                    t_run = time.monotonic()
                    with progress.run(spec.name, spec.title, total) as advance:
                        report = compare(servers["spec-off"], servers[spec.name], plan.prompts, settings, advance)
                    seconds = time.monotonic() - t_run
                    timings.runs_s[spec.name] = seconds
                    progress.run_done(spec.name, seconds)
                    runs.append(DemoRun(name=spec.name, title=spec.title, draft=spec.draft, lesson=spec.lesson,
                                        spec_config=spec_json(spec.spec) or {}, seconds=seconds, compare=report,
                                        shown_prompts=shown))
    finally:
        progress.stop()
    timings.total_s = time.monotonic() - t0
    return DemoReport(model=str(plan.model), dtype=plan.dtype, dtype_reason=plan.dtype_reason,
                      hardware=plan.hardware, prompts=[p.id for p in plan.prompts], runs=runs, timings=timings,
                      notes=list(plan.notes))

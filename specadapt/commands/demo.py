"""`specadapt demo`: the lesson of speculative decoding on this machine, in one run and one report
(orchestration/demo.py does the work; report/demo_render.py renders it)."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path

import click
from rich.console import Console

from specadapt.adapters.base import LaunchPlan
from specadapt.commands._console import progress_bar, say, stderr
from specadapt.load.progress import Progress
from specadapt.orchestration.demo import DRAFT_LAYERS, DTYPES, DemoOptions, DemoProgress, plan_demo, run_demo
from specadapt.report.demo_render import render_console, timing_line, write_demo_outputs


class ConsoleProgress(DemoProgress):
    """The demo's steps on stderr: one line per step, a spinner while the servers start, a bar per run."""

    def __init__(self) -> None:
        self._status = None
        self._notes: set[str] = set()
        self._runs = 0

    def step(self, text: str) -> None:
        say(text)

    def server_planned(self, name: str, plan: LaunchPlan, log_path: Path) -> None:
        say(f"starting the {name} server: {plan.printable()}")
        say(f"server log: {log_path}")
        for note in plan.notes:
            if note not in self._notes:
                self._notes.add(note)
                say(f"note: {note}")

    def waiting(self, elapsed_s: float, pending: list[str]) -> None:
        text = f"waiting for the {', '.join(pending)} server{'s' if len(pending) > 1 else ''} ({elapsed_s:.0f} s)"
        if self._status is None:
            self._status = stderr.status(text)
            self._status.start()
        else:
            self._status.update(text)

    def server_up(self, name: str, elapsed_s: float) -> None:
        say(f"the {name} server answered after {elapsed_s:.0f} s")

    def servers_up(self, elapsed_s: float) -> None:
        self.stop()
        say(f"all servers up after {elapsed_s:.0f} s")

    @contextlib.contextmanager
    def run(self, name: str, title: str, total: int) -> Iterator[Progress]:
        self._runs += 1
        say(f"run {self._runs}: {title}")
        with progress_bar() as bar:
            task = bar.add_task(f"run {self._runs} ({name})", total=total)
            yield lambda rec: bar.advance(task)

    def run_done(self, name: str, seconds: float) -> None:
        say(f"run {self._runs} ({name}) done in {seconds:.0f} s")

    def stop(self) -> None:
        if self._status is not None:
            self._status.stop()
            self._status = None


@click.command("demo")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=Path("out"),
              show_default=True, help="Write report.json, summary.md, report.html and junit.xml here.")
@click.option("--dtype", type=click.Choice(DTYPES), default="auto", show_default=True,
              help="Dtype of every server; auto: bfloat16 where the CPU has bfloat16 instructions "
                   "(avx512_bf16, amx_bf16), else float32.")
@click.option("--max-tokens", type=click.IntRange(1), default=96, show_default=True, help="Tokens per answer.")
@click.option("--repeat", type=click.IntRange(2), default=2, show_default=True,
              help="Send the prompt set this many times per run (at least 2: intervals need pairs).")
@click.option("--draft-layers", type=int, default=DRAFT_LAYERS, show_default=True,
              help="Decoder layers of the embedded model the poorly-matched draft keeps.")
@click.option("--python", default=sys.executable, show_default="this interpreter",
              help="Interpreter that has vLLM installed.")
@click.option("--startup-timeout", type=click.FloatRange(1), default=900, show_default=True,
              help="Seconds to wait for the servers to answer.")
@click.option("--server-arg", "server_args", multiple=True,
              help="Extra argument for every server, verbatim; repeat for several.")
@click.option("--compile", "compile_", is_flag=True,
              help="Let vLLM compile its model (torch.compile) instead of running eagerly: faster decode steps, "
                   "minutes more to start.")
@click.option("--fixed", is_flag=True,
              help="The fixed design: every prompt --repeat times in each run. Without it each run stops as soon "
                   "as its TPOT ratio is decided (anytime-valid interval after every pair), after every prompt once "
                   "and never past the fixed design's pairs; the reports say the requests it saved.")
def demo(out_dir: Path, dtype: str, max_tokens: int, repeat: int, draft_layers: int, python: str,
         startup_timeout: float, server_args: tuple[str, ...], compile_: bool, fixed: bool) -> None:
    """Speculative decoding, what it buys and what it costs, on this machine: spec off against a well-matched draft
    (vLLM n-gram, k=4) and against a poorly-matched one (the embedded model cut to its first layers, k=3), on
    input-grounded prompts; speed with intervals, identity token by token, and the report's diagnosis; each run
    stops once decided (--fixed: the fixed design); the lesson's example (a short factual question whose answer
    restates its words) and one grounded answer drawn pass by pass for both drafts. Starts three vLLM servers
    side by side (the embedded model, the CPU build works). Exit 0 when both runs completed: the verdicts are
    information, not a gate."""
    opts = DemoOptions(dtype=dtype, max_tokens=max_tokens, repeat=repeat, draft_layers=draft_layers, python=python,
                       startup_timeout_s=startup_timeout, server_args=server_args, compile=compile_, fixed=fixed)
    plan = plan_demo(opts)
    report = run_demo(plan, ConsoleProgress())
    written = write_demo_outputs(report, out_dir)
    render_console(report, Console(), timing=False)
    for path in written:
        stderr.print(f"wrote {path}")
    say(timing_line(report))
    sys.exit(0)

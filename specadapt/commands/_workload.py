"""The workload options shared by probe, compare and equiv: which prompts a run sends.

``@workload_options`` adds the options and hands the command their values as one dict,
``workload_opts``; ``load_workload(**workload_opts)`` reads and selects the prompts (workloads/datasets.py)
and prints what the selection kept and dropped.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from rich.markup import escape

from specadapt.commands._console import stderr
from specadapt.errors import UsageError
from specadapt.records import Prompt, WorkloadInfo
from specadapt.workloads.datasets import FORMATS, load, summary_line
from specadapt.workloads.prompts import WORKLOADS

WORKLOAD_PARAMS = ("dataset", "prompts_file", "workload", "dataset_format", "dataset_column", "max_turns",
                   "num_prompts", "dataset_seed", "min_input_chars", "max_input_chars", "category")


def _options() -> list[Callable]:
    return [
        click.option("--dataset", type=click.Path(),  # str: a Path would fold "hf://x" into "hf:/x"
                     help="Local prompt data: specadapt JSONL, ShareGPT JSON, Spec-Bench question.jsonl, Parquet, "
                          "Arrow or a datasets save_to_disk folder (see docs/workloads.md). Default: the built-in "
                          "workload."),
        click.option("--prompts", "prompts_file", type=click.Path(),
                     help="Same as --dataset (kept for JSONL prompt files)."),
        click.option("--workload", type=click.Choice(list(WORKLOADS)),
                     help="A built-in prompt set (default: default, single-turn; spec-bench: the six Spec-Bench "
                          "task categories plus code, with multi-turn conversations)."),
        click.option("--dataset-format", type=click.Choice(FORMATS), default="auto", show_default=True,
                     help="The format of --dataset (auto: from the extension and the first record)."),
        click.option("--dataset-column",
                     help="Parquet/Arrow/save_to_disk: the column holding the prompts (default: the first of "
                          "conversations, messages, turns, prompt, question)."),
        click.option("--max-turns", type=click.IntRange(1),
                     help="At most this many user turns per conversation, the first included (1: single-turn)."),
        click.option("--num-prompts", type=click.IntRange(1),
                     help="Send a random sample of this many prompts (after the filters; --dataset-seed)."),
        click.option("--dataset-seed", type=int, default=0, show_default=True,
                     help="Seed of --num-prompts' sample: the same seed picks the same prompts in the same order."),
        click.option("--min-input-chars", type=click.IntRange(0),
                     help="Drop prompts whose first request is shorter than this many characters."),
        click.option("--max-input-chars", type=click.IntRange(1),
                     help="Drop prompts whose first request is longer than this many characters."),
        click.option("--category",
                     help="Keep only these prompt categories, comma-separated (e.g. qa,rag)."),
    ]


def workload_options(command: Callable) -> Callable:
    """Add the workload options; the command gets their values as ``workload_opts``."""

    @functools.wraps(command)
    def with_workload_options(**kw: Any) -> Any:
        opts = {name: kw.pop(name) for name in WORKLOAD_PARAMS}
        return command(workload_opts=opts, **kw)

    for option in reversed(_options()):
        with_workload_options = option(with_workload_options)
    return with_workload_options


def load_workload(*, dataset: str | Path | None = None, prompts_file: str | Path | None = None, workload: str | None = None,
                  quiet: bool = False, **options: Any) -> tuple[list[Prompt], WorkloadInfo]:
    """The run's prompts and their WorkloadInfo; prints the selection summary and its warnings to stderr."""
    if dataset is not None and prompts_file is not None:
        raise UsageError("give --dataset or --prompts, not both (--prompts is another name for --dataset)")
    prompts, info = load(dataset=dataset if dataset is not None else prompts_file, workload=workload, **options)
    if not quiet:
        for note in info.notes:
            stderr.print(f"[yellow]warning:[/] {escape(note)}", highlight=False, soft_wrap=True)
        dropped = info.unusable or info.filtered_category or info.filtered_length or info.sampled_out
        if dataset is not None or workload is not None or dropped:  # plain --prompts runs print as before
            stderr.print(summary_line(info), highlight=False, markup=False, soft_wrap=True)
    return prompts, info

"""Prompt sets: the built-in workloads and the user's JSONL files (other formats: workloads/datasets.py).

One JSON object per line::

    {"prompt": "text"}                                 -> completions API
    {"messages": [{"role": "user", "content": "..."}]} -> chat API
    optional: "id", "category", "max_tokens"

Invalid lines are reported with their line number.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from specadapt.errors import UsageError
from specadapt.records import Prompt

MAX_LINE_BYTES = 1_000_000

# The built-in workloads (--workload NAME): files in specadapt/workloads/data/.
WORKLOADS = {
    "default": "default_prompts.jsonl",
    "spec-bench": "spec_bench_prompts.jsonl",
}


def _short(err: ValidationError) -> str:
    first = err.errors()[0]
    loc = ".".join(str(p) for p in first["loc"])
    msg = first["msg"].removeprefix("Value error, ")
    return f"{loc}: {msg}" if loc else msg


def parse_prompt_lines(lines: list[str], source: str) -> list[Prompt]:
    prompts: list[Prompt] = []
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        if len(line.encode()) > MAX_LINE_BYTES:
            raise UsageError(f"{source}:{lineno}: line is longer than {MAX_LINE_BYTES} bytes")
        try:
            data: Any = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UsageError(f"{source}:{lineno}: not valid JSON ({exc.msg}); each line must be one JSON object") from exc
        if not isinstance(data, dict):
            raise UsageError(f"{source}:{lineno}: expected a JSON object, got {type(data).__name__}")
        try:
            prompt = Prompt.model_validate(data)
        except ValidationError as exc:
            raise UsageError(f"{source}:{lineno}: {_short(exc)}") from exc
        prompts.append(prompt.model_copy(update={"id": prompt.id or f"line{lineno}"}))
    if not prompts:
        raise UsageError(f"{source} has no prompts: give one JSON object per line")
    ids = [p.id for p in prompts]
    dupes = sorted({i for i in ids if ids.count(i) > 1})
    if dupes:
        raise UsageError(f"{source}: prompt ids must be unique; repeated: {', '.join(dupes[:5])}")
    return prompts


def load_builtin(name: str = "default") -> list[Prompt]:
    """A built-in workload by name (see ``WORKLOADS``)."""
    if name not in WORKLOADS:
        raise UsageError(f"--workload {name}: unknown; the built-in workloads are {', '.join(WORKLOADS)}")
    text = resources.files("specadapt.workloads").joinpath(f"data/{WORKLOADS[name]}").read_text(encoding="utf-8")
    return parse_prompt_lines(text.splitlines(), f"built-in workload {name}")


# The built-in canary set (`specadapt watch record-golden` without --prompts): prompts whose answers copy
# their input (code, a paragraph, JSON), so that a draft proposes and the target accepts often and a
# canary exercises the verify path; three chat, one completion.
CANARY_PROMPT_IDS = ("copy-code-docstrings", "repeat-paragraph", "json-rewrite", "completion-code")


def canary_prompts() -> list[Prompt]:
    """The built-in canary prompts (``CANARY_PROMPT_IDS``, from the default workload)."""
    by_id = {p.id: p for p in load_builtin("default")}
    return [by_id[i] for i in CANARY_PROMPT_IDS]


# The lesson's example (the demo sends it): a short factual question whose answer restates the question's
# words, so a draft that looks the next tokens up in the prompt proposes "capital of France is", the
# target accepts them all in one pass and adds "Paris" itself. Not part of any --workload.
LESSON_PROMPTS = "lesson_prompts.jsonl"


def lesson_prompts() -> list[Prompt]:
    """The lesson's example prompts (``LESSON_PROMPTS``, category ``lesson``)."""
    text = resources.files("specadapt.workloads").joinpath(f"data/{LESSON_PROMPTS}").read_text(encoding="utf-8")
    return parse_prompt_lines(text.splitlines(), "built-in lesson prompts")


def load_prompts(path: str | Path | None) -> list[Prompt]:
    """The user's JSONL file, or the built-in default set when ``path`` is None."""
    if path is None:
        return load_builtin("default")
    path = Path(path)
    if not path.exists():
        raise UsageError(f"prompt file {path} does not exist")
    if path.is_dir():
        raise UsageError(f"prompt file {path} is a directory: give a JSONL file")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"{path} is not UTF-8 text") from exc
    return parse_prompt_lines(text.splitlines(), str(path))

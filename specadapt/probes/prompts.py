"""Prompt sets: the built-in default and the user's JSONL files.

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
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from specadapt.errors import UsageError

MAX_LINE_BYTES = 1_000_000


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "user", "assistant"]
    content: str


class Prompt(BaseModel):
    """One request's input. Exactly one of ``prompt`` (completions) or ``messages`` (chat)."""

    model_config = ConfigDict(extra="forbid")
    id: str = ""
    category: str = Field("default", description="Group for per-category figures, e.g. grounded/open.")
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    max_tokens: int | None = Field(None, gt=0, description="Overrides --max-tokens for this prompt.")

    @model_validator(mode="after")
    def _one_kind(self) -> "Prompt":
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give exactly one of 'prompt' (completions) or 'messages' (chat)")
        if self.prompt is not None and not self.prompt.strip():
            raise ValueError("'prompt' is empty")
        if self.messages is not None and not self.messages:
            raise ValueError("'messages' is empty")
        return self

    @property
    def api(self) -> Literal["chat", "completions"]:
        return "chat" if self.messages is not None else "completions"

    def text(self) -> str:
        if self.prompt is not None:
            return self.prompt
        return "\n".join(m.content for m in self.messages or [])


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


def load_prompts(path: str | Path | None) -> list[Prompt]:
    """The user's JSONL file, or the built-in default set when ``path`` is None."""
    if path is None:
        text = resources.files("specadapt.probes").joinpath("data/default_prompts.jsonl").read_text()
        return parse_prompt_lines(text.splitlines(), "built-in prompts")
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

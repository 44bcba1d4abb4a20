"""Where a run's prompts came from and what the selection kept (saved in probe and compare reports)."""

from __future__ import annotations

from pydantic import BaseModel, Field


class WorkloadInfo(BaseModel):
    """The prompt set of a run: its source, its format, and every step that dropped prompts."""

    source: str = Field(description="'built-in' (the default set), 'built-in:NAME' (--workload NAME) or the file's path.")
    format: str = Field(description="jsonl, sharegpt, spec-bench, parquet, arrow or hf-disk (the detected or given format).")
    column: str | None = Field(None, description="The column the prompts were read from (Parquet, Arrow, hf-disk).")
    read: int = Field(0, description="Prompts read from the source (records with a usable prompt).")
    unusable: int = Field(0, description="Records skipped: no user message to send.")
    filtered_category: int = Field(0, description="Prompts dropped by --category.")
    filtered_length: int = Field(0, description="Prompts dropped by --min-input-chars/--max-input-chars.")
    sampled_out: int = Field(0, description="Prompts left out by --num-prompts.")
    selected: int = Field(0, description="Prompts sent (after every step above).")
    num_prompts: int | None = Field(None, description="--num-prompts as given.")
    seed: int | None = Field(None, description="--dataset-seed of the sample (None: no sampling).")
    max_turns: int | None = Field(None, description="--max-turns: user turns kept per conversation.")
    min_input_chars: int | None = None
    max_input_chars: int | None = None
    category_filter: list[str] | None = Field(None, description="--category as given.")
    categories: dict[str, int] = Field(default_factory=dict, description="Selected prompts per category.")
    multi_turn: int = Field(0, description="Selected prompts with later user turns.")
    notes: list[str] = Field(default_factory=list, description="Warnings about the selection, one line each.")

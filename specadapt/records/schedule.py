"""A draft length per batch size: vLLM's ``num_speculative_tokens_per_batch_size``.

The schedule is a list of inclusive batch-size ranges ``[start, end, k]``. The rules are
vLLM's (``vllm/v1/spec_decode/dynamic/utils.py``, 0.32): ranges are positive, start <=
end, sorted without overlap, the first starts at 1; a batch size in a gap between ranges
or past the last one takes the k of the range before it; no k exceeds the engine's
``num_speculative_tokens``. specadapt is stricter on one point: a k above the engine's is
refused (vLLM silently lowers it), so what is written is what runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import yaml

from specadapt.errors import UsageError

FIX = "write it as [[1, END1, K1], [END1+1, END2, K2], ...]"


def read_schedule(value: str, flag: str) -> object:
    """A schedule given on the command line as ``flag``: inline JSON, or a JSON/YAML file holding it
    (YAML is a superset of JSON). Parsed, not checked: see schedule_problems."""
    path = Path(value)
    text = path.read_text() if not value.lstrip().startswith("[") and path.is_file() else value
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        raise UsageError(f"{flag}: {value!r} is not JSON: {FIX}") from None


def schedule_problems(schedule: object, k: int | None) -> list[str]:
    """Every reason ``schedule`` is not a valid schedule for an engine with ``k`` draft tokens."""
    if not isinstance(schedule, (list, tuple)) or not schedule:
        return [f"num_speculative_tokens_per_batch_size must be a non-empty list: {FIX}."]
    entries = []
    for entry in schedule:
        if not isinstance(entry, (list, tuple)) or len(entry) != 3 \
                or not all(isinstance(x, int) and not isinstance(x, bool) for x in entry):
            return [f"Entry {entry!r} of num_speculative_tokens_per_batch_size is "
                    f"not three integers [start, end, k]: {FIX}."]
        entries.append(tuple(entry))
    problems = []
    prev_end = 0
    for start, end, kk in sorted(entries):
        if start <= 0 or end < start:
            problems.append(f"Batch-size range [{start}, {end}] must be positive with start <= end: {FIX}.")
        elif start <= prev_end:
            problems.append(f"Batch-size range [{start}, {end}] overlaps the previous range: {FIX}.")
        if kk < 0 or (k is not None and kk > k):
            problems.append(f"Draft length {kk} for batch sizes {start}-{end} must be between "
                            f"0 and k={k}: lower it or raise k.")
        prev_end = max(prev_end, end)
    if min(entries)[0] != 1:
        problems.append(f"The first batch-size range must start at 1 so every batch size has "
                        f"a draft length: {FIX}.")
    return problems


def k_for_batch(schedule: Sequence[Sequence[int]], batch_size: int, k: int) -> int:
    """The draft length at ``batch_size``: its range's k; in a gap or past the last range,
    the k of the range before it (vLLM's carry-forward); never above ``k``. An empty
    schedule means k at every batch size."""
    chosen = k
    for start, end, kk in sorted(tuple(e) for e in schedule):
        if start > batch_size:
            break
        chosen = kk
    return min(chosen, k)

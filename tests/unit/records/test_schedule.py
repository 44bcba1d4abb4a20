"""The draft-length schedule (vLLM's num_speculative_tokens_per_batch_size): rules and lookup."""

from __future__ import annotations

import pytest

from specadapt.errors import UsageError
from specadapt.records.schedule import FIX, k_for_batch, read_schedule, schedule_problems


@pytest.mark.parametrize("value", [None, [], (), "[[1, 8, 2]]", {"1": 2}, 3])
def test_not_a_non_empty_list(value):
    assert schedule_problems(value, 4) == [
        f"num_speculative_tokens_per_batch_size must be a non-empty list: {FIX}."]


def test_a_valid_schedule_has_no_problems():
    assert schedule_problems([[9, 64, 0], [1, 8, 4]], 4) == []
    assert schedule_problems(([1, 1, 4], (2, 2, 0)), None) == []


@pytest.mark.parametrize("entry", [[1, 8], [1, 8, 2, 3], [1, 8, True], [1.0, 8, 2], "abc"])
def test_an_entry_that_is_not_three_integers(entry):
    assert schedule_problems([entry], 4) == [
        f"Entry {entry!r} of num_speculative_tokens_per_batch_size is not three integers "
        f"[start, end, k]: {FIX}."]


def test_every_problem_is_reported_once():
    problems = schedule_problems([[3, 2, 1], [2, 9, 7], [5, 6, -1]], 4)
    assert problems == [
        "Draft length 7 for batch sizes 2-9 must be between 0 and k=4: lower it or raise k.",
        f"Batch-size range [3, 2] must be positive with start <= end: {FIX}.",
        f"Batch-size range [5, 6] overlaps the previous range: {FIX}.",
        "Draft length -1 for batch sizes 5-6 must be between 0 and k=4: lower it or raise k.",
        f"The first batch-size range must start at 1 so every batch size has a draft length: {FIX}.",
    ]


def test_k_lookup_carries_forward_and_caps():
    schedule = [[1, 2, 4], [5, 8, 1]]
    assert [k_for_batch(schedule, b, 3) for b in range(1, 11)] == [3, 3, 3, 3, 1, 1, 1, 1, 1, 1]
    assert k_for_batch([], 5, 2) == 2


def test_read_schedule_inline_or_from_a_file(tmp_path):
    assert read_schedule("[[1, 4, 4], [5, 16, 2]]", "--schedule") == [[1, 4, 4], [5, 16, 2]]
    json_file, yaml_file = tmp_path / "s.json", tmp_path / "s.yaml"
    json_file.write_text("[[1, 2, 3]]")
    yaml_file.write_text("- [1, 8, 4]\n- [9, 64, 0]\n")
    assert read_schedule(str(json_file), "--schedule") == [[1, 2, 3]]
    assert read_schedule(str(yaml_file), "--x") == [[1, 8, 4], [9, 64, 0]]
    with pytest.raises(UsageError) as err:
        read_schedule("[[1, 4, 4]", "--num-speculative-tokens-per-batch-size")
    assert str(err.value) == f"--num-speculative-tokens-per-batch-size: '[[1, 4, 4]' is not JSON: {FIX}"


def test_read_schedule_tells_long_inline_json_from_a_path():
    """A long inline schedule is never looked up as a file (the name would be too long for the OS),
    leading blanks included; text that is neither JSON nor a file is one clear error."""
    ranges = [[i, i, 2] for i in range(1, 80)]
    assert read_schedule("  " + str(ranges), "--schedule") == ranges
    with pytest.raises(UsageError, match=r"^--schedule: '\{not json' is not JSON"):
        read_schedule("{not json", "--schedule")

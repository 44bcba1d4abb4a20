"""Edges of reading local datasets: JSON-lines records longer than the sniffed head, blank and
over-long lines, the parse cache, table id/category/grounding columns, and every message a missing
library or an unreadable file gives (one line naming the file)."""

from __future__ import annotations

import json
import os
import sys
import types
from pathlib import Path

import pytest

from specadapt.errors import MissingDependency, UsageError
from specadapt.workloads import datasets
from specadapt.workloads.datasets import detect_format, read_builtin, read_dataset
from specadapt.workloads.prompts import MAX_LINE_BYTES


def user(p) -> list[str]:
    return [m.content for m in p.messages or [] if m.role == "user"]


def line_of(record: dict, size: int) -> str:
    """``record`` as one JSON line of exactly ``size`` bytes (padded in a field nobody reads)."""
    base = json.dumps({**record, "pad": ""})
    return json.dumps({**record, "pad": "x" * (size - len(base))})


# --- detection of JSON lines whose first record is long ----------------------------------------
def test_a_sharegpt_json_lines_file_with_a_first_record_past_the_head_is_detected(tmp_path):
    long_chat = {"id": "long", "conversations": [{"from": "human", "value": "q" * 100_000},
                                                 {"from": "gpt", "value": "a"}, {"from": "human", "value": "more"}]}
    f = tmp_path / "chats.jsonl"
    f.write_text("\n  " + json.dumps(long_chat) + "\n")  # leading blank line and spaces, one record
    assert detect_format(f) == "sharegpt"
    prompts, info = read_dataset(f)
    assert info.format == "sharegpt" and [(p.id, len(user(p)[0]), p.turns) for p in prompts] == [
        ("long", 100_000, ["more"])]


def test_a_first_record_of_the_longest_allowed_line_is_detected_and_a_longer_one_refused(tmp_path):
    f = tmp_path / "sb.jsonl"
    f.write_text(line_of({"question_id": 3, "category": "qa", "turns": ["t"]}, MAX_LINE_BYTES) + "\n")
    assert detect_format(f) == "spec-bench"
    g = tmp_path / "over.jsonl"
    g.write_text(line_of({"question_id": 3, "turns": ["t"]}, MAX_LINE_BYTES + 1) + "\n")
    with pytest.raises(UsageError) as err:
        read_dataset(g)
    assert str(err.value) == f"{g}:1: line is longer than {MAX_LINE_BYTES} bytes"


def test_an_empty_json_list_is_left_to_the_jsonl_parser(tmp_path):
    f = tmp_path / "empty.json"
    f.write_text("[]")
    assert detect_format(f) == "jsonl"
    with pytest.raises(UsageError) as err:
        read_dataset(f)
    assert str(err.value) == f"{f}:1: expected a JSON object, got list"


# --- JSON records ------------------------------------------------------------------------------
def test_a_json_list_after_blank_space_is_one_document(tmp_path):
    f = tmp_path / "d.json"
    f.write_text('\n   [{"conversations": [{"from": "human", "value": "a"}]},\n'
                 ' {"conversations": [{"from": "human", "value": "b"}]}]\n')
    prompts, info = read_dataset(f, "sharegpt")
    assert [(p.id, user(p)) for p in prompts] == [("record1", ["a"]), ("record2", ["b"])] and info.read == 2


def test_blank_lines_between_json_lines_are_skipped_not_the_end(tmp_path):
    f = tmp_path / "q.jsonl"
    f.write_text('{"question_id": 1, "turns": ["a"]}\n\n   \n{"question_id": 2, "turns": ["b"]}\n')
    prompts, info = read_dataset(f, "spec-bench")
    assert [(p.id, user(p)) for p in prompts] == [("1", ["a"]), ("2", ["b"])] and info.read == 2


def test_a_json_line_of_exactly_the_limit_is_read_and_one_byte_more_is_refused(tmp_path):
    f = tmp_path / "q.jsonl"
    f.write_text('{"question_id": 1, "turns": ["a"]}\n'
                 + line_of({"question_id": 2, "turns": ["b"]}, MAX_LINE_BYTES) + "\n")
    prompts, _ = read_dataset(f, "spec-bench")
    assert [p.id for p in prompts] == ["1", "2"]
    f.write_text('{"question_id": 1, "turns": ["a"]}\n'
                 + line_of({"question_id": 2, "turns": ["b"]}, MAX_LINE_BYTES + 1) + "\n")
    with pytest.raises(UsageError) as err:
        read_dataset(f, "spec-bench")
    assert str(err.value) == f"{f}:2: line is longer than {MAX_LINE_BYTES} bytes"


def test_a_parsed_document_is_read_again_when_its_time_or_size_changes(tmp_path):
    f = tmp_path / "d.json"
    t = 1_700_000_000_000_000_000
    datasets._parsed.cache_clear()
    try:
        f.write_text("[1]")
        os.utime(f, ns=(t, t))
        assert datasets._json_document(f) == [1]
        f.write_text("[2]")  # the same size, a later time
        os.utime(f, ns=(t, t + 1_000))
        assert datasets._json_document(f) == [2]
        f.write_text("[33]")  # the same time, another size
        os.utime(f, ns=(t, t + 1_000))
        assert datasets._json_document(f) == [33]
    finally:
        datasets._parsed.cache_clear()


# --- unreadable files: one line naming the file ------------------------------------------------
def test_a_file_gone_between_detection_and_reading_is_named(tmp_path):
    gone = tmp_path / "gone.json"
    for read in (datasets._read_bytes, datasets._json_document):
        with pytest.raises(UsageError) as err:
            read(gone)
        assert str(err.value) == f"cannot read {gone}: No such file or directory"


def test_a_read_error_without_a_system_message_shows_the_error(tmp_path, monkeypatch):
    f = tmp_path / "d.json"
    f.write_text("[]")

    def fail(self, *a, **k):
        raise OSError("device went away")

    monkeypatch.setattr(Path, "read_bytes", fail)
    with pytest.raises(UsageError) as err:
        datasets._read_bytes(f)
    assert str(err.value) == f"cannot read {f}: device went away"


def test_an_unreadable_jsonl_file_is_named(tmp_path, monkeypatch):
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "x"}\n')

    def refuse(self, *a, **k):
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "read_text", refuse)
    with pytest.raises(UsageError) as err:
        read_dataset(f, "jsonl")
    assert str(err.value) == f"cannot read {f}: Permission denied"


def test_jsonl_errors_name_the_file_and_line_and_nothing_is_unusable(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "x"}\n{"prompt": 5, "id": [1]\n')
    with pytest.raises(UsageError) as err:
        read_dataset(f)
    assert str(err.value).startswith(f"{f}:2: not valid JSON (")
    f.write_text('{"prompt": "x"}\n{"prompt": "y"}\n')
    prompts, info = read_dataset(f)
    assert (info.format, info.read, info.unusable, info.notes) == ("jsonl", 2, 0, [])


def test_unknown_format_and_a_folder_for_a_file_format(tmp_path):
    with pytest.raises(UsageError) as err:
        read_dataset(tmp_path, "csv")
    assert str(err.value) == ("--dataset-format csv: unknown format; give one of auto, jsonl, sharegpt, spec-bench, "
                              "parquet, arrow, hf-disk")
    with pytest.raises(UsageError) as err:
        read_dataset(tmp_path, "sharegpt")
    assert str(err.value) == f"{tmp_path} is a folder: give a file for --dataset-format sharegpt"


def test_builtin_workloads_are_jsonl():
    _, info = read_builtin("default")
    assert (info.source, info.format) == ("built-in", "jsonl")
    _, info = read_builtin("spec-bench")
    assert (info.source, info.format) == ("built-in:spec-bench", "jsonl")


# --- tables ------------------------------------------------------------------------------------
def test_missing_pyarrow_names_the_extra_to_install(tmp_path, monkeypatch):
    f = tmp_path / "d.parquet"
    f.write_bytes(b"PAR1")
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # `import pyarrow` fails as if it were not installed
    for fmt in ("parquet", "arrow"):
        with pytest.raises(MissingDependency) as err:
            read_dataset(f, fmt)
        assert str(err.value) == ("Reading Parquet and Arrow files needs the Python package 'pyarrow', which is not "
                                  "installed: pip install 'specadapt[datasets]'")
        assert (err.value.module, err.value.extra) == ("pyarrow", "datasets")


def test_missing_datasets_library_names_the_extra_to_install(tmp_path, monkeypatch):
    (tmp_path / "dataset_info.json").write_text("{}")
    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(MissingDependency) as err:
        read_dataset(tmp_path)
    assert str(err.value) == ("Reading save_to_disk folders needs the Python package 'datasets', which is not "
                              "installed: pip install 'specadapt[datasets]'")
    assert (err.value.module, err.value.extra) == ("datasets", "datasets")


def test_a_folder_the_datasets_library_cannot_load_is_one_line(tmp_path, monkeypatch):
    (tmp_path / "dataset_info.json").write_text("{}")

    def load_from_disk(path):
        raise ValueError("no arrow files here")

    fake = types.ModuleType("datasets")
    fake.load_from_disk = load_from_disk
    fake.DatasetDict = dict
    monkeypatch.setitem(sys.modules, "datasets", fake)
    with pytest.raises(UsageError) as err:
        read_dataset(tmp_path)
    assert str(err.value) == f"cannot read {tmp_path} as a save_to_disk folder (ValueError: no arrow files here)"


def test_an_unreadable_parquet_file_says_parquet(tmp_path):
    pytest.importorskip("pyarrow")
    f = tmp_path / "bad.parquet"
    f.write_bytes(b"not parquet at all")
    for fmt in ("auto", "parquet"):
        with pytest.raises(UsageError) as err:
            read_dataset(f, fmt)
        assert str(err.value).startswith(f"cannot read {f} as Parquet (")


def test_table_ids_categories_and_groundings_from_their_columns(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    f = tmp_path / "q.parquet"
    pq.write_table(pa.table({"prompt": ["a", "b"], "question_id": [7, 8], "category": ["qa", "qa"],
                             "grounding": ["input-grounded", None]}), f)
    prompts, _ = read_dataset(f)
    assert [(p.id, p.category, p.grounding, user(p)) for p in prompts] == [
        ("7", "qa", "input-grounded", ["a"]), ("8", "qa", "open", ["b"])]
    g = tmp_path / "c.parquet"
    pq.write_table(pa.table({"conversation_id": ["conv-1"], "prompt": ["c"]}), g)
    prompts, _ = read_dataset(g)
    assert [(p.id, user(p)) for p in prompts] == [("conv-1", ["c"])]


def test_a_table_without_any_usable_prompt_names_the_file_and_first_row(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    f = tmp_path / "e.parquet"
    pq.write_table(pa.table({"prompt": [None, "  "]}), f)
    with pytest.raises(UsageError) as err:
        read_dataset(f)
    assert str(err.value) == f"{f}: no record with a usable prompt (a non-empty user message) (first: {f}: row 1)"


def test_a_utf8_prompt_file_is_read_as_utf8_whatever_the_locale(tmp_path):
    import locale

    f = tmp_path / "p.jsonl"
    f.write_bytes('{"id": "c", "prompt": "café"}\n'.encode())
    before = locale.setlocale(locale.LC_CTYPE)
    locale.setlocale(locale.LC_CTYPE, "C")  # an ASCII locale: text files opened without an encoding would fail
    try:
        prompts, _ = read_dataset(f, "jsonl")
    finally:
        locale.setlocale(locale.LC_CTYPE, before)
    assert [(p.id, p.prompt) for p in prompts] == [("c", "café")]

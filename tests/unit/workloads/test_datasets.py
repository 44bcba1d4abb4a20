"""Workloads from local files (workloads/datasets.py, commands/_workload.py): every format, the
selection and its counts, every bad input as one line naming the file and the record."""
from __future__ import annotations
import json
from pathlib import Path
import pytest
from click.testing import CliRunner
from specadapt.cli import cli
from specadapt.errors import UsageError
from specadapt.records import Prompt, WorkloadInfo
from specadapt.workloads import datasets
from specadapt.workloads.datasets import detect_format, grounding_of, load, read_dataset, select
from specadapt.workloads.prompts import load_builtin
import os
import sys
import types
from specadapt.errors import MissingDependency, UsageError
from specadapt.workloads.datasets import detect_format, read_builtin, read_dataset
from specadapt.workloads.prompts import MAX_LINE_BYTES

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "datasets"
SPEC_BENCH = FIXTURES / "spec_bench_question.jsonl"
SHAREGPT = FIXTURES / "sharegpt.json"


def user(p: Prompt) -> list[str]:
    return [m.content for m in p.messages or [] if m.role == "user"]


def write_json(path: Path, data) -> Path:
    path.write_text(json.dumps(data))
    return path


def write_lines(path: Path, records) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


# --- Spec-Bench -----------------------------------------------------------------------------------
def test_spec_bench_file_keeps_its_categories_first_turn_and_later_turns():
    prompts, info = read_dataset(SPEC_BENCH)
    by_id = {p.id: p for p in prompts}
    raw = [json.loads(line) for line in SPEC_BENCH.read_text().splitlines()]
    assert info.format == "spec-bench" and info.read == len(raw) == len(prompts) and info.unusable == 0
    for rec in raw:
        p = by_id[str(rec["question_id"])]
        assert p.category == rec["category"] and p.api == "chat"
        assert [m.role for m in p.messages] == ["user"] and user(p) == rec["turns"][:1]
        assert p.turns == (rec["turns"][1:] or None)
        for ref in rec.get("reference", []):  # the reference answers are never sent
            assert ref not in p.text() and ref not in (p.turns or [])
    assert by_id["81"].turns == ["Rewrite your note as a four-line poem."]


def test_grounding_follows_spec_bench_categories():
    prompts, _ = read_dataset(SPEC_BENCH)
    grounding = {p.category: p.grounding for p in prompts}
    assert grounding == {"writing": "open", "math": "open", "coding": "open", "translation": "input-grounded",
                         "summarization": "input-grounded", "qa": "open", "math_reasoning": "open",
                         "rag": "input-grounded"}
    for name in ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities", "qa",
                 "math_reasoning", "conversation"):
        assert grounding_of(name) == "open"
    assert grounding_of("RAG") == "input-grounded"
    assert grounding_of("my-own") is None and grounding_of("code") is None


def test_an_explicit_grounding_in_the_record_wins(tmp_path):
    f = write_lines(tmp_path / "q.jsonl", [{"question_id": 1, "category": "qa", "grounding": "input-grounded",
                                            "turns": ["a"]}, {"question_id": 2, "turns": ["b"]}])
    prompts, _ = read_dataset(f)
    assert [(p.grounding, p.category) for p in prompts] == [("input-grounded", "qa"), (None, "default")]


# --- ShareGPT -------------------------------------------------------------------------------------
def test_sharegpt_sends_the_first_user_message_and_keeps_later_ones_as_turns():
    prompts, info = read_dataset(SHAREGPT)
    by_id = {p.id: p for p in prompts}
    assert info.format == "sharegpt" and info.read == 3 and info.unusable == 1
    assert info.notes == [f"{SHAREGPT}: record 3: no user message to send; skipped (1 such record)"]
    chat1 = by_id["chat-1"]
    assert user(chat1) == ["What is a good name for a grey cat?"]
    assert chat1.turns == ["Give me three more.", "Which one is shortest?"]
    assert "Smokey" not in chat1.text() and not any("Ash" in t for t in chat1.turns)  # gpt answers not sent
    assert [(m.role, m.content) for m in by_id["chat-2"].messages] == [
        ("system", "You answer in one sentence."), ("user", "Why is the sky blue?")]
    assert by_id["chat-2"].turns is None
    assert [m.role for m in by_id["chat-4"].messages] == ["user"]  # a leading gpt message is dropped
    assert {p.category for p in prompts} == {"conversation"}


def test_role_content_variant_and_json_lines_and_content_parts(tmp_path):
    conv = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello"},
            {"role": "user", "content": [{"type": "text", "text": "And "}, {"type": "text", "text": "bye"}]}]
    f = write_json(tmp_path / "chats.json", [{"messages": conv}, {"id": "x", "messages": conv[:2]}])
    prompts, info = read_dataset(f)
    assert info.format == "sharegpt" and [p.id for p in prompts] == ["record1", "x"]
    assert [m.role for m in prompts[0].messages] == ["system", "user"] and prompts[0].turns == ["And bye"]
    g = write_lines(tmp_path / "sg.jsonl", [{"id": "a", "conversations": [{"from": "human", "value": "q1"},
                                                                          {"from": "gpt", "value": "a1"},
                                                                          {"from": "user", "value": "q2"}]}])
    prompts, info = read_dataset(g)
    assert info.format == "sharegpt" and user(prompts[0]) == ["q1"] and prompts[0].turns == ["q2"]


def test_repeated_ids_are_made_unique(tmp_path):
    conv = [{"from": "human", "value": "q"}]
    f = write_json(tmp_path / "d.json", [{"id": "a", "conversations": conv}] * 3)
    assert [p.id for p in read_dataset(f)[0]] == ["a", "a#2", "a#3"]


def test_max_turns_caps_user_turns_the_first_included():
    for cap, turns in ((1, None), (2, ["Give me three more."]), (3, ["Give me three more.", "Which one is shortest?"]),
                       (9, ["Give me three more.", "Which one is shortest?"])):
        prompts, info = load(dataset=SHAREGPT, max_turns=cap)
        assert next(p for p in prompts if p.id == "chat-1").turns == turns
        assert info.max_turns == cap
    assert load(dataset=SHAREGPT, max_turns=1)[1].multi_turn == 0
    with pytest.raises(UsageError, match="--max-turns 0: give 1 or more"):
        datasets.cap_turns([], 0)


# --- JSONL (specadapt's own format) ---------------------------------------------------------------
def test_specadapt_jsonl_is_detected_and_read_unchanged(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text('{"id": "a", "prompt": "x"}\n{"messages": [{"role": "user", "content": "y"},'
                 ' {"role": "assistant", "content": "z"}], "turns": ["w"]}\n')
    prompts, info = read_dataset(f)
    assert info.format == "jsonl" and [p.id for p in prompts] == ["a", "line2"]
    assert prompts[0].api == "completions" and len(prompts[1].messages) == 2 and prompts[1].turns == ["w"]


def test_detection_by_suffix_and_first_record(tmp_path):
    assert detect_format(SPEC_BENCH) == "spec-bench" and detect_format(SHAREGPT) == "sharegpt"
    assert detect_format(write_lines(tmp_path / "a.txt", [{"prompt": "x"}])) == "jsonl"
    assert detect_format(write_lines(tmp_path / "b.data", [{"turns": ["x"]}])) == "spec-bench"
    assert detect_format(tmp_path / "c.parquet") == "parquet"
    assert detect_format(write_lines(tmp_path / "l.jsonl", [["a"]])) == "jsonl"  # its parser names the line
    assert detect_format(write_json(tmp_path / "m.json", [{"messages": [{"role": "user", "content": "x"}]}])) \
        == "sharegpt"
    for suffix in (".arrow", ".feather"):
        assert detect_format(tmp_path / f"c{suffix}") == "arrow"
    (tmp_path / "PAR").write_bytes(b"PAR1....")
    assert detect_format(tmp_path / "PAR") == "parquet"


# --- tables ---------------------------------------------------------------------------------------
ROWS = {"id": ["r1", "r2", "r3", "r4"], "category": ["qa", "rag", "qa", "qa"],
        "question": ["What is 2+2?", "Name a colour.", "", "Why?"],
        "turns": [["t1", "t2"], ["u1"], ["v1"], ["w1", "w2", "w3"]]}


def test_parquet_reads_the_first_prompt_column_or_the_chosen_one(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    f = tmp_path / "d.parquet"
    pq.write_table(pa.table(ROWS), f)
    prompts, info = read_dataset(f)
    assert info.format == "parquet" and info.column == "turns" and info.read == 4
    assert [(p.id, p.category, user(p), p.turns) for p in prompts][:2] == [
        ("r1", "qa", ["t1"], ["t2"]), ("r2", "rag", ["u1"], None)]
    assert prompts[1].grounding == "input-grounded"
    prompts, info = read_dataset(f, column="question")
    assert [p.id for p in prompts] == ["r1", "r2", "r4"] and info.unusable == 1 and info.column == "question"
    assert info.notes == [f"{f}: row 3: no user message to send; skipped (1 such record)"]
    with pytest.raises(UsageError) as err:
        read_dataset(f, column="text")
    assert str(err.value) == f"--dataset-column text: no such column in {f}; its columns: id, category, question, turns"


def test_table_without_a_prompt_column_and_cells_of_the_wrong_type(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    f = tmp_path / "d.parquet"
    pq.write_table(pa.table({"text": ["a"], "n": [1]}), f)
    with pytest.raises(UsageError) as err:
        read_dataset(f)
    assert str(err.value) == (f"{f} has no prompt column (conversations, messages, turns, prompt, question); its "
                              "columns: text, n; choose one with --dataset-column")
    with pytest.raises(UsageError, match=r"d.parquet: row 1: column 'n' holds int; expected text"):
        read_dataset(f, column="n")


def test_arrow_file_and_stream_and_conversations_column(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.feather as feather
    import pyarrow.ipc as ipc

    conv = [[{"from": "human", "value": "hello"}, {"from": "gpt", "value": "hi"}, {"from": "human", "value": "bye"}]]
    table = pa.table({"conversations": conv, "prompt": ["ignored"]})
    feather.write_feather(table, tmp_path / "d.feather")
    with ipc.new_stream(tmp_path / "d.arrow", table.schema) as w:
        w.write_table(table)
    for name in ("d.feather", "d.arrow"):
        prompts, info = read_dataset(tmp_path / name)
        assert info.format == "arrow" and info.column == "conversations"
        assert user(prompts[0]) == ["hello"] and prompts[0].turns == ["bye"]
    (tmp_path / "bad.arrow").write_bytes(b"not arrow at all")
    with pytest.raises(UsageError, match=r"cannot read .*bad.arrow as Arrow"):
        read_dataset(tmp_path / "bad.arrow")


def test_save_to_disk_folder_one_split_and_many(tmp_path):
    ds_lib = pytest.importorskip("datasets")
    ds = ds_lib.Dataset.from_dict({"prompt": ["one", "two"], "category": ["qa", "math"]})
    ds.save_to_disk(str(tmp_path / "plain"))
    prompts, info = read_dataset(tmp_path / "plain")
    assert info.format == "hf-disk" and [user(p) for p in prompts] == [["one"], ["two"]]
    assert [p.category for p in prompts] == ["qa", "math"] and all(p.api == "chat" for p in prompts)
    ds_lib.DatasetDict({"train": ds}).save_to_disk(str(tmp_path / "one"))
    assert read_dataset(tmp_path / "one")[1].read == 2
    ds_lib.DatasetDict({"train": ds, "test": ds}).save_to_disk(str(tmp_path / "two"))
    with pytest.raises(UsageError) as err:
        read_dataset(tmp_path / "two")
    assert str(err.value) == (f"{tmp_path / 'two'} holds the splits train, test: give one split's folder, "
                              f"e.g. {tmp_path / 'two' / 'train'}")


# --- selection ------------------------------------------------------------------------------------
def many(n: int, categories=("a", "b")) -> list[Prompt]:
    return [Prompt(id=f"p{i}", category=categories[i % len(categories)], prompt="x" * (i + 1)) for i in range(n)]


def info() -> WorkloadInfo:
    return WorkloadInfo(source="f.jsonl", format="jsonl", read=0)


def test_sample_is_reproducible_and_depends_on_the_seed():
    prompts = many(40)
    picks = {seed: [p.id for p in select(prompts, info(), num_prompts=10, seed=seed)] for seed in (0, 1)}
    assert picks[0] == [p.id for p in select(prompts, info(), num_prompts=10, seed=0)]
    assert picks[0] != picks[1] and len(set(picks[0])) == 10
    assert set(picks[0]) <= {p.id for p in prompts}
    i = info()
    select(prompts, i, num_prompts=10, seed=0)
    assert (i.sampled_out, i.selected, i.seed, i.num_prompts) == (30, 10, 0, 10)
    # taking all of them is a reproducible reordering, not a warning
    j = info()
    assert sorted(p.id for p in select(prompts, j, num_prompts=40, seed=5)) == sorted(p.id for p in prompts)
    assert j.notes == [] and j.sampled_out == 0 and j.seed == 5


def test_more_prompts_asked_than_there_are_warns_and_uses_all_in_file_order():
    i = info()
    kept = select(many(3), i, num_prompts=4)
    assert [p.id for p in kept] == ["p0", "p1", "p2"] and i.selected == 3 and i.seed is None
    assert i.notes == ["--num-prompts 4: only 3 prompts left after filtering; using all of them"]


def test_category_filter_counts_and_names_what_is_missing():
    i = info()
    kept = select(many(10, ("qa", "rag", "math")), i, categories=["qa", "math", "nope"])
    assert {p.category for p in kept} == {"qa", "math"} and i.filtered_category == 3 and i.selected == 7
    assert i.categories == {"math": 3, "qa": 4}
    assert i.notes == ["--category: nope not in f.jsonl (categories there: math, qa, rag)"]
    with pytest.raises(UsageError) as err:
        select(many(4), info(), categories=["x"])
    assert str(err.value) == "f.jsonl: no prompt left after --category x; categories in the file: a, b"
    with pytest.raises(UsageError, match="categories in the workload: code, conversation, math"):
        select(load_builtin("default"), WorkloadInfo(source="built-in", format="jsonl"), categories=["x"])


def test_length_bounds_are_inclusive_and_counted():
    prompts = many(10)  # input lengths 1..10
    i = info()
    kept = select(prompts, i, min_input_chars=3, max_input_chars=7)
    assert [len(p.text()) for p in kept] == [3, 4, 5, 6, 7] and i.filtered_length == 5
    assert (i.min_input_chars, i.max_input_chars) == (3, 7)
    assert [len(p.text()) for p in select(prompts, info(), min_input_chars=10)] == [10]
    assert [len(p.text()) for p in select(prompts, info(), max_input_chars=1)] == [1]
    assert len(select(prompts, info(), min_input_chars=4, max_input_chars=4)) == 1
    with pytest.raises(UsageError) as err:
        select(prompts, info(), min_input_chars=11)
    assert str(err.value) == ("f.jsonl: no prompt left after --min-input-chars/--max-input-chars; the input lengths "
                              "there run from 1 to 10 characters")
    with pytest.raises(UsageError, match="--min-input-chars 5 is above --max-input-chars 4"):
        select(prompts, info(), min_input_chars=5, max_input_chars=4)


def test_input_length_is_the_first_request_only():
    p = Prompt(messages=[{"role": "system", "content": "ab"}, {"role": "user", "content": "cde"}], turns=["fghij"])
    assert datasets.input_chars(p) == len("ab\ncde")


def test_steps_run_in_order_category_then_length_then_sample():
    i = info()
    kept = select(many(20), i, categories=["a"], max_input_chars=10, num_prompts=2, seed=3)
    assert (i.filtered_category, i.filtered_length, i.sampled_out, i.selected) == (10, 5, 3, 2)
    assert all(p.category == "a" and len(p.text()) <= 10 for p in kept)


def test_load_builtin_workloads_with_selection():
    prompts, i = load(workload="spec-bench", category="conversation")
    assert i.source == "built-in:spec-bench" and {p.category for p in prompts} == {"conversation"}
    assert i.multi_turn == len(prompts) >= 2
    prompts, i = load()
    assert i.source == "built-in" and i.read == i.selected == len(load_builtin("default"))


# --- bad input ------------------------------------------------------------------------------------
@pytest.mark.parametrize("value, message", [
    ("hf://datasets/x/y", "--dataset hf://datasets/x/y: not a local path; specadapt reads local files only"),
    ("https://example.com/d.json", "not a local path"),
    ("anon8231489123/ShareGPT_Vicuna_unfiltered", "no such local file or folder (hub names are not fetched"),
    ("nope/missing.json", "prompt file nope/missing.json does not exist"),
])
def test_only_local_paths(value, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UsageError) as err:
        read_dataset(value)
    assert message in str(err.value)


@pytest.mark.parametrize("name, text, fmt, message", [
    ("bad.jsonl", '{"question_id": 1, "turns": ["a"]}\n{"question_id": 2, "turns": [\n', "auto",
     "bad.jsonl:2: not valid JSON"),
    ("bad.json", '[{"conversations": []},\n {"conversations": [}]', "auto", "bad.json:2: not valid JSON"),
    ("list.jsonl", '{"question_id": 1, "turns": "a"}\n[1]\n', "auto", "list.jsonl:2: expected a JSON object, got list"),
    ("turns.jsonl", '{"question_id": 1, "turns": [1, 2]}\n', "auto",
     "turns.jsonl:1: 'turns' must be a list of strings"),
    ("role.json", '[{"conversations": [{"from": "robot", "value": "x"}]}]', "auto",
     "role.json: record 1: message 1 comes from 'robot'; expected human/user, gpt/assistant or system"),
    ("conv.json", '[{"conversations": "hello"}]', "auto", "conv.json: record 1: 'conversations' must be a list"),
    ("empty.json", '[{"conversations": [{"from": "gpt", "value": "x"}]}, {"conversations": []}]', "auto",
     "empty.json: no record with a usable prompt (a non-empty user message) (first: "),
    ("what.csv", "a,b\n1,2\n", "auto", "cannot tell the format of"),
    ("p.jsonl", '{"prompt": "x"}\n', "parquet", "cannot read"),
])
def test_bad_input_names_file_and_record(tmp_path, name, text, fmt, message):
    f = tmp_path / name
    f.write_text(text)
    with pytest.raises(UsageError) as err:
        read_dataset(f, fmt)
    assert message in str(err.value) and str(tmp_path) in str(err.value)


def test_unreadable_file(tmp_path, monkeypatch):
    f = tmp_path / "locked.json"
    f.write_text('[{"conversations": [{"from": "human", "value": "x"}]}]')

    def refuse(self, *a, **k):
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "read_bytes", refuse)
    monkeypatch.setattr(Path, "open", refuse)
    with pytest.raises(UsageError) as err:
        read_dataset(f)
    assert str(err.value) == f"cannot read {f}: Permission denied"


def test_unreadable_bytes_and_folders(tmp_path):
    f = tmp_path / "latin.jsonl"
    f.write_bytes(b'{"prompt": "caf\xe9"}\n')
    with pytest.raises(UsageError, match="latin.jsonl is not UTF-8 text"):
        read_dataset(f)
    with pytest.raises(UsageError, match="is a folder but no datasets save_to_disk folder"):
        read_dataset(tmp_path)
    with pytest.raises(UsageError, match="--dataset-format nope: unknown format"):
        read_dataset(f, "nope")
    with pytest.raises(UsageError, match="--dataset-column applies to Parquet, Arrow and save_to_disk data"):
        read_dataset(SHAREGPT, column="conversations")


def test_conflicting_sources():
    with pytest.raises(UsageError, match="give --dataset \\(or --prompts\\) or --workload, not both"):
        load(dataset=SHAREGPT, workload="default")
    with pytest.raises(UsageError, match="--dataset-format and --dataset-column need --dataset PATH"):
        load(dataset_format="sharegpt")
    with pytest.raises(UsageError, match="--category ',': give comma-separated category names"):
        load(category=",")


# --- the CLI --------------------------------------------------------------------------------------
def test_cli_refuses_bad_workloads_with_exit_2_before_any_server():
    runner = CliRunner()
    result = runner.invoke(cli, ["probe", "--url", "http://127.0.0.1:9", "--dataset", "hf://x/y"])
    assert result.exit_code == 2 and "--dataset hf://x/y: not a local path" in result.output
    assert "Traceback" not in result.output
    result = runner.invoke(cli, ["compare", "--off", "http://127.0.0.1:9", "--on", "http://127.0.0.1:9",
                                 "--dataset", str(SPEC_BENCH), "--category", "nothing"])
    assert result.exit_code == 2
    assert ("no prompt left after --category nothing; categories in the file: coding, math, math_reasoning, qa, "
            "rag, summarization, translation, writing") in result.output
    result = runner.invoke(cli, ["equiv", "--off", "http://127.0.0.1:9", "--on", "http://127.0.0.1:9",
                                 "--prompts", str(SPEC_BENCH), "--dataset", str(SHAREGPT)])
    assert result.exit_code == 2 and "give --dataset or --prompts, not both" in result.output


def test_cli_probe_sends_the_selection_and_saves_the_workload(tmp_path):
    pytest.importorskip("uvicorn")
    from specadapt.testing import scripted_server

    out = tmp_path / "r.json"
    with scripted_server(tmp_path / "server.log") as mp:
        result = CliRunner().invoke(cli, ["probe", "--url", mp.plan.base_url, "--dataset", str(SPEC_BENCH),
                                          "--category", "qa,rag,translation,writing", "--num-prompts", "3",
                                          "--dataset-seed", "7", "--max-tokens", "4", "--warmup", "0",
                                          "--json", str(out)])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    wl = report["settings"]["workload"]
    assert report["settings"]["prompts_source"] == str(SPEC_BENCH) == wl["source"]
    assert (wl["format"], wl["read"], wl["filtered_category"], wl["sampled_out"], wl["selected"], wl["seed"]) == (
        "spec-bench", 8, 4, 1, 3, 7)
    expected, _ = load(dataset=SPEC_BENCH, category="qa,rag,translation,writing", num_prompts=3, dataset_seed=7)
    assert list(dict.fromkeys(r["prompt_id"] for r in report["requests"])) == [p.id for p in expected]
    assert set(report["by_category"]) == {p.category for p in expected}
    assert "prompts: 3 sent" in result.output and "8 read from" in result.output
    shown = CliRunner().invoke(cli, ["report", "show", str(out)])
    assert shown.exit_code == 0 and f"prompts: 3 from {SPEC_BENCH} (spec-bench): " in shown.output
    assert "by prompt category" in shown.output


# --- the rules, one case each (mutation-tested: every branch and constant here can fail a test) ---------
@pytest.mark.parametrize("record, fmt", [
    ({"conversations": []}, "sharegpt"),
    ({"question_id": 1, "prompt": "x"}, "spec-bench"),
    ({"turns": ["a"]}, "spec-bench"),
    ({"turns": ["a"], "messages": [{"role": "user", "content": "x"}]}, "jsonl"),
    ({"turns": ["a"], "prompt": "x"}, "jsonl"),
    ({"messages": [{"from": "human", "value": "x"}]}, "sharegpt"),
    ({"messages": [{"role": "user", "value": "x"}]}, "sharegpt"),
    ({"messages": [{"from": "human", "content": "x"}]}, "sharegpt"),
    ({"messages": [{"role": "user", "content": "x"}]}, "jsonl"),
    ({"messages": ["from", "value"]}, "jsonl"),
    ({"messages": [{"role": "user", "content": "x"}], "model": "m"}, "sharegpt"),
    ({"prompt": "x", "model": "m"}, "jsonl"),
])
def test_record_format(record, fmt):
    assert datasets._record_format(record) == fmt


def test_system_messages_only_before_the_first_user_message_and_only_the_first():
    conv = [{"from": "system", "value": "  "}, {"from": "system", "value": "S1"}, {"from": "system", "value": "S2"},
            {"from": "human", "value": "Q1"}, {"from": "system", "value": "S3"}, {"from": "human", "value": " "},
            {"from": "human", "value": None}, {"from": "gpt", "value": "A"}, {"from": "human", "value": "Q2"}]
    p = datasets.from_conversation({"conversations": conv}, "f: record 1", "record1")
    assert [(m.role, m.content) for m in p.messages] == [("system", "S1"), ("user", "Q1")]
    assert p.turns == ["Q2"] and p.id == "record1"
    only_system = [{"from": "system", "value": "S"}]
    assert datasets.from_conversation({"conversations": only_system}, "f", "r") is None


def test_content_parts_keep_their_text_parts_only():
    parts = [{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {"url": "x"}}, {"text": "b"},
             {"type": "text"}, {"type": "refusal", "text": "no"}]
    assert datasets._text(parts, "f", "v") == "ab"
    assert datasets._text(None, "f", "v") == ""
    with pytest.raises(UsageError) as err:
        datasets._text(3, "f: record 2", "message 1's value")
    assert str(err.value) == "f: record 2: message 1's value is int; expected text"
    with pytest.raises(UsageError) as err:
        datasets._text(["a"], "f", "v")
    assert str(err.value) == "f: v is list; expected text"


@pytest.mark.parametrize("record, message", [
    ({"conversations": "x"}, "L: 'conversations' must be a list of messages ({\"from\": \"human\", \"value\": ...} "
                             "or {\"role\": \"user\", \"content\": ...})"),
    ({"conversations": ["x"]}, "L: message 1 is str; expected an object with from/value or role/content"),
    ({"conversations": [{"value": "x"}]}, "L: message 1 has no 'from' (or 'role')"),
    ({"conversations": [{"from": "human", "value": "x"}, {"from": "Robot", "value": "y"}]},
     "L: message 2 comes from 'robot'; expected human/user, gpt/assistant or system"),
    ({"conversations": [{"from": "human", "value": 5}]}, "L: message 1's value is int; expected text"),
])
def test_conversation_errors_exactly(record, message):
    with pytest.raises(UsageError) as err:
        datasets.from_conversation(record, "L", "r")
    assert str(err.value) == message


def test_ids_categories_and_grounding_from_the_record():
    rid = datasets._record_id
    assert rid({"id": "a", "question_id": 2}, "f") == "a"
    assert rid({"id": " ", "question_id": 2}, "f") == "2"
    assert rid({"conversation_id": "c"}, "f") == "c" and rid({"id": None}, "f") == "f"
    p = datasets.from_turns({"category": "rag", "grounding": "open", "turns": ["q"]}, "L", "r")
    assert (p.category, p.grounding) == ("rag", "open")
    p = datasets.from_turns({"category": "  ", "grounding": "sometimes", "turns": "q"}, "L", "r")
    assert (p.category, p.grounding, p.turns) == ("default", None, None)
    assert datasets.from_turns({"turns": [" ", ""]}, "L", "r") is None


def test_unusable_records_counted_with_the_first_named(tmp_path):
    empty = [{"from": "gpt", "value": "x"}]
    f = write_json(tmp_path / "d.json", [{"conversations": empty}, {"conversations": [{"from": "human", "value": "q"}]},
                                         {"conversations": empty}])
    _, info = read_dataset(f)
    assert info.notes == [f"{f}: record 1: no user message to send; skipped (2 such records)"] and info.unusable == 2
    g = write_json(tmp_path / "none.json", [])
    with pytest.raises(UsageError) as err:
        read_dataset(g, "sharegpt")
    assert str(err.value) == f"{g}: no record with a usable prompt (a non-empty user message)"
    h = write_json(tmp_path / "gone.json", [{"conversations": empty}, {"conversations": empty}])
    with pytest.raises(UsageError) as err:
        read_dataset(h)
    assert str(err.value) == f"{h}: no record with a usable prompt (a non-empty user message) (first: {h}: record 1)"


def test_table_cells_any_column_name_and_row_numbers(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    f = tmp_path / "d.parquet"
    dialog = [[{"role": "user", "content": "q1"}, {"role": "assistant", "content": "a"}, {"role": "user", "content": "q2"}],
              [{"role": "user", "content": "q"}, {"role": "robot", "content": "x"}]]
    pq.write_table(pa.table({"dialog": dialog, "lines": [["t1", "t2"], ["u1"]], "text": ["  ", "hi"]}), f)
    prompts, _ = read_dataset(f, column="lines")
    assert [(p.id, user(p), p.turns) for p in prompts] == [("record1", ["t1"], ["t2"]), ("record2", ["u1"], None)]
    prompts, info = read_dataset(f, column="text")
    assert [(p.id, user(p)) for p in prompts] == [("record2", ["hi"])] and info.unusable == 1
    with pytest.raises(UsageError) as err:
        read_dataset(f, column="dialog")
    assert str(err.value) == (f"{f}: row 2: message 2 comes from 'robot'; expected human/user, gpt/assistant or "
                              "system")
    pq.write_table(pa.table({"dialog": dialog[:1]}), f)
    prompts, _ = read_dataset(f, column="dialog")
    assert user(prompts[0]) == ["q1"] and prompts[0].turns == ["q2"]
    pq.write_table(pa.table({"prompt": [[1, 2]]}), f)
    with pytest.raises(UsageError) as err:
        read_dataset(f)
    assert str(err.value) == (f"{f}: row 1: column 'prompt' holds list; expected text, a list of texts or a list of "
                              "messages")


def test_selection_rules_exactly():
    prompts = many(6, ("qa", "rag", "math"))
    assert [p.id for p in select(prompts, info(), num_prompts=3)] == \
        [p.id for p in select(prompts, info(), num_prompts=3, seed=0)]
    assert len(select(prompts, info(), num_prompts=1)) == 1
    with pytest.raises(UsageError) as err:
        select(prompts, info(), num_prompts=0)
    assert str(err.value) == "--num-prompts 0: give 1 or more"
    i = info()
    select(prompts, i, categories=["qa", "nope", "gone"])
    assert i.category_filter == ["qa", "nope", "gone"]
    assert i.notes == ["--category: nope, gone not in f.jsonl (categories there: math, qa, rag)"]
    with pytest.raises(UsageError) as err:
        select(prompts, info(), categories=["x", "y"])
    assert str(err.value) == "f.jsonl: no prompt left after --category x,y; categories in the file: math, qa, rag"
    with pytest.raises(UsageError) as err:
        select(prompts, WorkloadInfo(source="built-in:spec-bench", format="jsonl"), categories=["x"])
    assert str(err.value) == ("built-in:spec-bench: no prompt left after --category x; categories in the workload: "
                              "math, qa, rag")
    blank = Prompt(id="blank", messages=[{"role": "user", "content": ""}])
    assert [p.id for p in select([blank], info(), max_input_chars=5)] == ["blank"]
    j = info()
    assert len(select(many(1), j, num_prompts=2)) == 1
    assert j.notes == ["--num-prompts 2: only 1 prompt left after filtering; using all of them"]
    k = info()
    select(many(2), k, num_prompts=3)
    assert k.notes == ["--num-prompts 3: only 2 prompts left after filtering; using all of them"]


def test_load_passes_every_option_through(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    f = tmp_path / "d.parquet"
    pq.write_table(pa.table({"prompt": ["a", "bb", "ccc"], "question": ["x" * 10, "y", "z"]}), f)
    prompts, i = load(dataset=f, dataset_column="question", min_input_chars=2)
    assert [user(p) for p in prompts] == [["x" * 10]] and i.column == "question" and i.filtered_length == 2
    prompts, i = load(dataset=f, max_input_chars=2, num_prompts=1, dataset_seed=4)
    assert i.column == "prompt" and i.filtered_length == 1 and i.seed == 4 and i.selected == 1
    same, _ = load(dataset=f, max_input_chars=2, num_prompts=1, dataset_seed=4)
    assert same == prompts
    default_seed, j = load(dataset=f, num_prompts=2)
    assert j.seed == 0 and default_seed == select(read_dataset(f)[0], info(), num_prompts=2, seed=0)
    prompts, i = load(dataset=SHAREGPT, max_turns=1)
    assert i.multi_turn == 0 and i.max_turns == 1
    for kwargs, message in (
            (dict(dataset=SHAREGPT, workload="default"), "give --dataset (or --prompts) or --workload, not both"),
            (dict(dataset_format="sharegpt"), "--dataset-format and --dataset-column need --dataset PATH"),
            (dict(dataset_column="prompt"), "--dataset-format and --dataset-column need --dataset PATH"),
            (dict(workload="nope"), "--workload nope: unknown; the built-in workloads are default, spec-bench"),
            (dict(category=" , "), "--category ' , ': give comma-separated category names, e.g. qa,rag")):
        with pytest.raises(UsageError) as err:
            load(**kwargs)
        assert str(err.value) == message


def test_summary_line_names_every_step():
    i = WorkloadInfo(source="d.json", format="sharegpt", read=50, unusable=2, filtered_category=10, filtered_length=5,
                     sampled_out=30, selected=5, seed=3, categories={"qa": 2, "rag": 3}, multi_turn=1)
    assert datasets.summary_line(i) == ("prompts: 5 sent (qa 2, rag 3; 1 multi-turn); 50 read from d.json (sharegpt); "
                                        "2 without a user message; 10 dropped by --category; 5 dropped by input "
                                        "length; 5 sampled with seed 3")
    j = WorkloadInfo(source="t.parquet", format="parquet", column="prompt", read=4, selected=4, categories={"x": 4})
    assert datasets.summary_line(j) == "prompts: 4 sent (x 4); 4 read from t.parquet (parquet, column prompt)"


def test_detection_rules_exactly(tmp_path):
    for marker in ("dataset_info.json", "dataset_dict.json", "state.json"):
        d = tmp_path / marker.split(".")[0]
        d.mkdir()
        (d / marker).write_text("{}")
        assert detect_format(d) == "hf-disk"
    with pytest.raises(UsageError) as err:
        detect_format(tmp_path)
    assert str(err.value) == (f"{tmp_path} is a folder but no datasets save_to_disk folder (no dataset_info.json or "
                              "dataset_dict.json in it): give a file, or a folder written by save_to_disk")
    assert detect_format(tmp_path / "x.ipc") == "arrow"
    (tmp_path / "file.bin").write_bytes(b"ARROW1\x00\x00")
    (tmp_path / "stream.bin").write_bytes(b"\xff\xff\xff\xff\x10\x00")
    assert detect_format(tmp_path / "file.bin") == detect_format(tmp_path / "stream.bin") == "arrow"
    (tmp_path / "lead.data").write_text('\n\n  {"turns": ["a"]}\n')
    assert detect_format(tmp_path / "lead.data") == "spec-bench"
    assert detect_format(write_json(tmp_path / "sb.json", [{"question_id": 1, "turns": ["a"]}])) == "spec-bench"
    for name, text in (("empty.jsonl", ""), ("words.jsonl", "hello\n"), ("list.json", "[1]")):
        (tmp_path / name).write_text(text)
        assert detect_format(tmp_path / name) == "jsonl"
    (tmp_path / "empty.csv").write_text("")
    with pytest.raises(UsageError) as err:
        detect_format(tmp_path / "empty.csv")
    assert str(err.value) == (f"cannot tell the format of {tmp_path / 'empty.csv'}: give --dataset-format (jsonl, "
                              "sharegpt, spec-bench, parquet, arrow, hf-disk)")


def test_local_path_messages_exactly(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UsageError) as err:
        datasets.local_path("s3://bucket/d.json")
    assert str(err.value) == ("--dataset s3://bucket/d.json: not a local path; specadapt reads local files only "
                              "(download the dataset first and give the file or folder)")
    with pytest.raises(UsageError) as err:
        datasets.local_path("org/name")
    assert str(err.value) == ("--dataset org/name: no such local file or folder (hub names are not fetched; download "
                              "the dataset first and give its local path)")
    (tmp_path / "org").mkdir()
    (tmp_path / "org" / "name").write_text("{}")
    assert datasets.local_path("org/name") == Path("org/name")


# Edges of reading local datasets: JSON-lines records longer than the sniffed head, blank and
# over-long lines, the parse cache, table id/category/grounding columns, and every message a missing
# library or an unreadable file gives (one line naming the file).
def user_datasets(p) -> list[str]:
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
    assert info.format == "sharegpt" and [(p.id, len(user_datasets(p)[0]), p.turns) for p in prompts] == [
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
    assert [(p.id, user_datasets(p)) for p in prompts] == [("record1", ["a"]), ("record2", ["b"])] and info.read == 2


def test_blank_lines_between_json_lines_are_skipped_not_the_end(tmp_path):
    f = tmp_path / "q.jsonl"
    f.write_text('{"question_id": 1, "turns": ["a"]}\n\n   \n{"question_id": 2, "turns": ["b"]}\n')
    prompts, info = read_dataset(f, "spec-bench")
    assert [(p.id, user_datasets(p)) for p in prompts] == [("1", ["a"]), ("2", ["b"])] and info.read == 2


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
    assert [(p.id, p.category, p.grounding, user_datasets(p)) for p in prompts] == [
        ("7", "qa", "input-grounded", ["a"]), ("8", "qa", "open", ["b"])]
    g = tmp_path / "c.parquet"
    pq.write_table(pa.table({"conversation_id": ["conv-1"], "prompt": ["c"]}), g)
    prompts, _ = read_dataset(g)
    assert [(p.id, user_datasets(p)) for p in prompts] == [("conv-1", ["c"])]


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

import json

import pytest

from specadapt.errors import UsageError
from specadapt.workloads.prompts import WORKLOADS, lesson_prompts, load_builtin, load_prompts, parse_prompt_lines

CATEGORIES = {"conversation", "translation", "summarization", "qa", "math", "rag", "code"}
# Ids that tests and the benchmark pages name: they stay in the default set.
KEPT_IDS = {"copy-code-docstrings", "repeat-paragraph", "json-rewrite", "completion-code", "reverse-string",
            "capital-france", "story", "completion-open"}


def test_builtin_set_mixes_grounded_and_open_and_both_apis():
    prompts = load_prompts(None)
    assert {p.category for p in prompts} == CATEGORIES
    assert {p.grounding for p in prompts} == {"input-grounded", "open"}
    assert {p.api for p in prompts} == {"chat", "completions"}
    assert len({p.id for p in prompts}) == len(prompts)
    assert KEPT_IDS <= {p.id for p in prompts}
    assert 8 <= len(prompts) <= 14
    # One request per prompt: the live suite sends the default set through runners that count so.
    assert not any(p.turns for p in prompts)


def test_spec_bench_workload_covers_every_category_twice_with_multi_turn_conversations():
    prompts = load_builtin("spec-bench")
    per_category = {c: [p for p in prompts if p.category == c] for c in CATEGORIES}
    assert {p.category for p in prompts} == CATEGORIES
    assert all(len(ps) >= 2 for ps in per_category.values())
    assert all(p.grounding is not None for p in prompts)
    assert all(p.turns and 1 <= len(p.turns) <= 2 for p in per_category["conversation"])
    assert {p.grounding for p in prompts if p.category in ("translation", "summarization", "rag")} == {"input-grounded"}
    assert len({p.id for p in prompts}) == len(prompts)


def test_every_builtin_workload_loads_and_unknown_names_are_refused():
    assert set(WORKLOADS) == {"default", "spec-bench"}
    assert load_builtin("default") == load_prompts(None)
    with pytest.raises(UsageError, match="--workload nope: unknown; the built-in workloads are default, spec-bench"):
        load_builtin("nope")


def test_the_lessons_prompts_are_a_category_of_their_own_and_in_no_workload():
    lesson = lesson_prompts()
    assert [(p.category, p.grounding, p.api) for p in lesson] == [("lesson", "input-grounded", "chat")]
    every = [p for name in WORKLOADS for p in load_builtin(name)]
    assert not {p.id for p in lesson} & {p.id for p in every}  # one id, one prompt, wherever it is looked up
    assert "lesson" not in {p.category for p in every}


def test_ids_default_to_line_numbers(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "a"}\n\n{"messages": [{"role": "user", "content": "b"}], "max_tokens": 5}\n')
    prompts = load_prompts(f)
    assert [p.id for p in prompts] == ["line1", "line3"]
    assert prompts[1].max_tokens == 5 and prompts[1].api == "chat"


@pytest.mark.parametrize("lines, message", [
    (['{"prompt": "ok"}', "{not json"], "p.jsonl:2: not valid JSON"),
    (['[1, 2]'], "p.jsonl:1: expected a JSON object, got list"),
    (['{"text": "x"}'], "p.jsonl:1: text: Extra inputs are not permitted"),
    (['{"prompt": "a", "messages": [{"role": "user", "content": "b"}]}'], "p.jsonl:1:"),
    (['{"prompt": "   "}'], "'prompt' is empty"),
    (['{"prompt": "a", "max_tokens": 0}'], "p.jsonl:1: max_tokens"),
    (['{"messages": [{"role": "robot", "content": "b"}]}'], "p.jsonl:1: messages.0.role"),
    ([], "has no prompts"),
    (['{"id": "a", "prompt": "x"}', '{"id": "a", "prompt": "y"}'], "repeated: a"),
])
def test_invalid_lines_name_their_line(lines, message):
    with pytest.raises(UsageError) as err:
        parse_prompt_lines(lines, "p.jsonl")
    assert message in str(err.value)


def test_huge_line_is_refused(tmp_path):
    f = tmp_path / "big.jsonl"
    f.write_text(json.dumps({"prompt": "x" * 1_100_000}) + "\n")
    with pytest.raises(UsageError, match="big.jsonl:1: line is longer"):
        load_prompts(f)


def test_missing_file(tmp_path):
    with pytest.raises(UsageError, match="does not exist"):
        load_prompts(tmp_path / "nope.jsonl")

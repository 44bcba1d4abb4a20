import json

import pytest

from specadapt.errors import UsageError
from specadapt.probes.prompts import load_prompts, parse_prompt_lines


def test_builtin_set_mixes_grounded_and_open_and_both_apis():
    prompts = load_prompts(None)
    assert {p.category for p in prompts} == {"grounded", "open"}
    assert {p.api for p in prompts} == {"chat", "completions"}
    assert len({p.id for p in prompts}) == len(prompts)


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

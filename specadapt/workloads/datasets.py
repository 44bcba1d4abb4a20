"""Prompt sets from the operator's own local files, and the selection applied to any prompt set.

Formats (``--dataset-format``, detected from the file when ``auto``):

- ``jsonl``: specadapt's own prompt lines (workloads/prompts.py), unchanged;
- ``sharegpt``: a JSON list (or JSON lines) of ``{"id"?, "conversations": [{"from", "value"}]}``,
  or the ``"messages": [{"role", "content"}]`` variant. One prompt per conversation: the system
  message (if any) and the first user message are sent first; the later user messages become
  ``turns``. The assistant answers in the file are never sent (at replay the server's own
  answers are);
- ``spec-bench``: Spec-Bench's ``question.jsonl`` (``{"question_id", "category", "turns"}``);
- ``parquet``, ``arrow`` (Arrow IPC file or stream, ``.arrow``/``.feather``) and ``hf-disk``
  (a ``datasets.save_to_disk`` folder), read with pyarrow / datasets (``specadapt[datasets]``):
  one column holds the prompts (conversations, messages, turns, prompt or question, or
  ``--dataset-column``).

Only local paths are read: anything that looks like a URL or a hub name is refused.
Every step that drops prompts is counted in the returned ``WorkloadInfo``.
"""

from __future__ import annotations

import functools
import re
from collections import Counter
from pathlib import Path
from typing import Any, Literal

import orjson

from specadapt.errors import MissingDependency, UsageError
from specadapt.records import ChatMessage, Prompt, WorkloadInfo
from specadapt.workloads.prompts import MAX_LINE_BYTES, WORKLOADS, load_builtin, parse_prompt_lines

FORMATS = ("auto", "jsonl", "sharegpt", "spec-bench", "parquet", "arrow", "hf-disk")
TABLE_FORMATS = ("parquet", "arrow", "hf-disk")
PROMPT_COLUMNS = ("conversations", "messages", "turns", "prompt", "question")
INSTALL_HINT = "pip install 'specadapt[datasets]'"

# Spec-Bench's category strings (its mt_bench part keeps MT-Bench's eight), and the names of the
# built-in workloads. Input-grounded: the answer copies much of the input, so drafts that look
# up the prompt are accepted often.
INPUT_GROUNDED = frozenset({"translation", "summarization", "rag"})
OPEN = frozenset({"qa", "math_reasoning", "writing", "roleplay", "reasoning", "math", "coding", "extraction",
                  "stem", "humanities", "conversation"})

HUMAN = frozenset({"human", "user"})
ASSISTANT = frozenset({"gpt", "assistant", "chatgpt", "bard", "bing", "model"})
SYSTEM = frozenset({"system"})

_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]+:/")  # scheme:/ (two letters or more: C:/ is a path)
_HUB_NAME = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_TEXT_SUFFIXES = (".json", ".jsonl", ".ndjson", ".txt")


def grounding_of(category: str) -> Literal["input-grounded", "open"] | None:
    """Input-grounded for translation, summarization and rag; open for Spec-Bench's other categories."""
    name = category.lower()
    if name in INPUT_GROUNDED:
        return "input-grounded"
    if name in OPEN:
        return "open"
    return None


# --- where and what -----------------------------------------------------------------------------
def local_path(value: str | Path) -> Path:
    """``value`` as an existing local path; URLs and hub names are refused in one line."""
    text = str(value)
    if _URL.match(text):
        raise UsageError(f"--dataset {text}: not a local path; specadapt reads local files only "
                         "(download the dataset first and give the file or folder)")
    path = Path(text).expanduser()
    if not path.exists():
        if _HUB_NAME.match(text) and not path.suffix:
            raise UsageError(f"--dataset {text}: no such local file or folder (hub names are not fetched; "
                             "download the dataset first and give its local path)")
        raise UsageError(f"prompt file {text} does not exist")
    return path


def detect_format(path: Path) -> str:
    """The format of ``path`` from its suffix and, for text files, its first record."""
    if path.is_dir():
        if any((path / name).is_file() for name in ("dataset_info.json", "dataset_dict.json", "state.json")):
            return "hf-disk"
        raise UsageError(f"{path} is a folder but no datasets save_to_disk folder (no dataset_info.json or "
                         "dataset_dict.json in it): give a file, or a folder written by save_to_disk")
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        return "parquet"
    if suffix in (".arrow", ".feather", ".ipc"):
        return "arrow"
    head = _read_head(path)
    if head.startswith(b"PAR1"):
        return "parquet"
    if head.startswith(b"ARROW1") or head[:4] == b"\xff\xff\xff\xff":
        return "arrow"
    start = head.lstrip()[:1]
    if start == b"[":
        first = _first_list_item(path)
        if not isinstance(first, dict):
            return "jsonl"  # its parser says the line is no JSON object
        fmt = _record_format(first)
        return "sharegpt" if fmt == "jsonl" else fmt  # a JSON list of chats: the messages variant
    if start == b"{":
        record = head.lstrip()
        if len(record.splitlines()) == 1:  # the head may end inside the first record (ShareGPT's run past 64 KiB)
            record = _read_head(path, MAX_LINE_BYTES + 1, start=len(head) - len(record))
        try:
            first = orjson.loads(record.splitlines()[0])
        except orjson.JSONDecodeError:
            return "jsonl"  # its parser names the line
        return _record_format(first)
    if suffix in _TEXT_SUFFIXES:
        return "jsonl"  # empty, or not JSON: its parser says which line
    raise UsageError(f"cannot tell the format of {path}: give --dataset-format "
                     f"({', '.join(f for f in FORMATS if f != 'auto')})")


def _record_format(record: dict[str, Any]) -> str:
    if "conversations" in record:
        return "sharegpt"
    if "question_id" in record or ("turns" in record and "messages" not in record and "prompt" not in record):
        return "spec-bench"
    messages = record.get("messages")
    if isinstance(messages, list) and any(isinstance(m, dict) and ("from" in m or "value" in m) for m in messages):
        return "sharegpt"
    if set(record) - set(Prompt.model_fields) and "messages" in record:
        return "sharegpt"
    return "jsonl"


def _read_head(path: Path, size: int = 65536, start: int = 0) -> bytes:
    try:
        with path.open("rb") as f:
            f.seek(start)
            return f.read(size)
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from exc


def _first_list_item(path: Path) -> Any:
    items = _json_document(path)
    return items[0] if isinstance(items, list) and items else None


def _read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from exc


def _json_document(path: Path) -> Any:
    try:
        stat = path.stat()
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from exc
    return _parsed(path, stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=1)
def _parsed(path: Path, mtime_ns: int, size: int) -> Any:
    """A JSON document, parsed once for detection and reading (ShareGPT files run to hundreds of MB)."""
    data = _read_bytes(path)
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise UsageError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg})") from exc


def _json_records(path: Path) -> list[tuple[str, Any]]:
    """(location, record) for a JSON list or for JSON lines; locations name the line or the record."""
    if _read_head(path).lstrip()[:1] == b"[":
        items = _json_document(path)
        return [(f"{path}: record {i}", item) for i, item in enumerate(items, start=1)]
    data = _read_bytes(path)
    records = []
    for lineno, line in enumerate(data.splitlines(), start=1):
        if not line.strip():
            continue
        if len(line) > MAX_LINE_BYTES:
            raise UsageError(f"{path}:{lineno}: line is longer than {MAX_LINE_BYTES} bytes")
        try:
            records.append((f"{path}:{lineno}", orjson.loads(line)))
        except orjson.JSONDecodeError as exc:
            raise UsageError(f"{path}:{lineno}: not valid JSON ({exc.msg}); each line must be one JSON object") \
                from exc
    return records


# --- records to prompts -------------------------------------------------------------------------
def _text(value: Any, loc: str, what: str) -> str:
    """A message's text: a string, or OpenAI-style content parts (their text parts joined)."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(p, dict) for p in value):
        return "".join(str(p.get("text", "")) for p in value if p.get("type", "text") == "text")
    raise UsageError(f"{loc}: {what} is {type(value).__name__}; expected text")


def _category(record: dict[str, Any], default: str) -> str:
    value = record.get("category")
    return value.strip() if isinstance(value, str) and value.strip() else default


def _make(record: dict[str, Any], rid: str, category: str, first: list[ChatMessage],
          later: list[str]) -> Prompt:
    grounding = record.get("grounding")
    if grounding not in ("input-grounded", "open"):
        grounding = grounding_of(category)
    return Prompt(id=rid, category=category, messages=first, turns=later or None, grounding=grounding)


def _record_id(record: dict[str, Any], fallback: str) -> str:
    for key in ("id", "question_id", "conversation_id"):
        value = record.get(key)
        if value is not None and str(value).strip():
            return str(value)
    return fallback


def from_conversation(record: dict[str, Any], loc: str, fallback_id: str, *, key: str | None = None) -> Prompt | None:
    """A ShareGPT-style record as a prompt; None when it has no user message."""
    conv = record.get(key) if key else record.get("conversations", record.get("messages"))
    if not isinstance(conv, list):
        raise UsageError(f"{loc}: '{key or 'conversations'}' must be a list of messages "
                         "({\"from\": \"human\", \"value\": ...} or {\"role\": \"user\", \"content\": ...})")
    system: str | None = None
    users: list[str] = []
    for i, msg in enumerate(conv, start=1):
        if not isinstance(msg, dict):
            raise UsageError(f"{loc}: message {i} is {type(msg).__name__}; expected an object with from/value "
                             "or role/content")
        role = msg.get("from", msg.get("role"))
        if not isinstance(role, str):
            raise UsageError(f"{loc}: message {i} has no 'from' (or 'role')")
        text = _text(msg.get("value", msg.get("content")), loc, f"message {i}'s value")
        role = role.lower()
        if role in HUMAN:
            if text.strip():
                users.append(text)
        elif role in SYSTEM:
            if not users and system is None and text.strip():
                system = text
        elif role not in ASSISTANT:
            raise UsageError(f"{loc}: message {i} comes from {role!r}; expected human/user, gpt/assistant or system")
    if not users:
        return None
    first = ([ChatMessage(role="system", content=system)] if system else []) + [ChatMessage(role="user",
                                                                                            content=users[0])]
    return _make(record, _record_id(record, fallback_id), _category(record, "conversation"), first, users[1:])


def from_turns(record: dict[str, Any], loc: str, fallback_id: str, *, key: str = "turns") -> Prompt | None:
    """A Spec-Bench-style record (a list of user turns) as a prompt; None when every turn is empty."""
    turns = record.get(key)
    if isinstance(turns, str):
        turns = [turns]
    if not isinstance(turns, list) or not all(isinstance(t, str) for t in turns):
        raise UsageError(f"{loc}: '{key}' must be a list of strings (the user's turns)")
    turns = [t for t in turns if t.strip()]
    if not turns:
        return None
    return _make(record, _record_id(record, fallback_id), _category(record, "default"),
                 [ChatMessage(role="user", content=turns[0])], turns[1:])


def _from_cell(row: dict[str, Any], column: str, loc: str, fallback_id: str) -> Prompt | None:
    """One table row: its prompt column holds text, a list of texts (turns) or a list of messages."""
    cell = row.get(column)
    if cell is None:
        return None
    if isinstance(cell, str):
        return from_turns({**row, column: [cell]}, loc, fallback_id, key=column)
    if isinstance(cell, list) and all(isinstance(x, str) for x in cell):
        return from_turns(row, loc, fallback_id, key=column)
    if isinstance(cell, list) and all(isinstance(x, dict) for x in cell):
        return from_conversation(row, loc, fallback_id, key=column)
    raise UsageError(f"{loc}: column '{column}' holds {type(cell).__name__}; expected text, a list of texts "
                     "or a list of messages")


def _collect(items: list[tuple[str, Any]], convert, source: str) -> tuple[list[Prompt], int, list[str]]:
    prompts: list[Prompt] = []
    unusable: list[str] = []
    for n, (loc, record) in enumerate(items, start=1):
        if not isinstance(record, dict):
            raise UsageError(f"{loc}: expected a JSON object, got {type(record).__name__}")
        prompt = convert(record, loc, f"record{n}")
        if prompt is None:
            unusable.append(loc)
        else:
            prompts.append(prompt)
    notes = []
    if unusable:
        notes.append(f"{unusable[0]}: no user message to send; skipped "
                     f"({len(unusable)} such record{'s' if len(unusable) > 1 else ''})")
    if not prompts:
        where = f" (first: {unusable[0]})" if unusable else ""
        raise UsageError(f"{source}: no record with a usable prompt (a non-empty user message){where}")
    return _unique_ids(prompts), len(unusable), notes


def _unique_ids(prompts: list[Prompt]) -> list[Prompt]:
    seen: Counter[str] = Counter()
    out = []
    for p in prompts:
        seen[p.id] += 1
        out.append(p if seen[p.id] == 1 else p.model_copy(update={"id": f"{p.id}#{seen[p.id]}"}))
    return out


# --- tables (pyarrow / datasets) ----------------------------------------------------------------
def _pyarrow():
    try:
        import pyarrow  # noqa: F401
        import pyarrow.ipc  # noqa: F401
        import pyarrow.parquet  # noqa: F401
    except ImportError as exc:
        raise MissingDependency("pyarrow", "datasets", "Reading Parquet and Arrow files") from exc
    return pyarrow


def _table_rows(path: Path, fmt: str) -> tuple[list[str], Any]:
    """(column names, a function that reads the given columns as a list of row dicts)."""
    if fmt == "hf-disk":
        try:
            import datasets
        except ImportError as exc:
            raise MissingDependency("datasets", "datasets", "Reading save_to_disk folders") from exc
        try:
            ds = datasets.load_from_disk(str(path))
        except Exception as exc:  # noqa: BLE001 - any failure of the library is a bad folder to the user
            raise UsageError(f"cannot read {path} as a save_to_disk folder ({type(exc).__name__}: {exc})") from exc
        if isinstance(ds, datasets.DatasetDict):
            splits = list(ds)
            if len(splits) != 1:
                raise UsageError(f"{path} holds the splits {', '.join(splits)}: give one split's folder, "
                                 f"e.g. {path / splits[0]}")
            ds = ds[splits[0]]
        return list(ds.column_names), lambda cols: ds.select_columns(cols).to_list()
    pa = _pyarrow()
    try:
        if fmt == "parquet":
            table = pa.parquet.read_table(path)
        else:
            try:
                with pa.memory_map(str(path)) as src:
                    table = pa.ipc.open_file(src).read_all()
            except pa.ArrowInvalid:
                with pa.memory_map(str(path)) as src:
                    table = pa.ipc.open_stream(src).read_all()
    except (pa.ArrowException, OSError) as exc:
        kind = "Parquet" if fmt == "parquet" else "Arrow"
        raise UsageError(f"cannot read {path} as {kind} ({exc})") from exc
    return list(table.column_names), lambda cols: table.select(cols).to_pylist()


def _read_table(path: Path, fmt: str, column: str | None) -> tuple[list[Prompt], int, list[str], str]:
    names, read = _table_rows(path, fmt)
    if column is None:
        column = next((c for c in PROMPT_COLUMNS if c in names), None)
        if column is None:
            raise UsageError(f"{path} has no prompt column ({', '.join(PROMPT_COLUMNS)}); its columns: "
                             f"{', '.join(names)}; choose one with --dataset-column")
    elif column not in names:
        raise UsageError(f"--dataset-column {column}: no such column in {path}; its columns: {', '.join(names)}")
    extra = [c for c in ("id", "question_id", "conversation_id", "category", "grounding") if c in names and c != column]
    rows = read([column, *extra])
    items = [(f"{path}: row {i}", row) for i, row in enumerate(rows, start=1)]
    prompts, unusable, notes = _collect(items, lambda r, loc, fid: _from_cell(r, column, loc, fid), str(path))
    return prompts, unusable, notes, column


# --- reading ------------------------------------------------------------------------------------
def read_dataset(path: str | Path, fmt: str = "auto", column: str | None = None) -> tuple[list[Prompt], WorkloadInfo]:
    """Every usable prompt in the local file or folder ``path``, in file order."""
    if fmt not in FORMATS:
        raise UsageError(f"--dataset-format {fmt}: unknown format; give one of {', '.join(FORMATS)}")
    path = local_path(path)
    if fmt == "auto":
        fmt = detect_format(path)
    if column is not None and fmt not in TABLE_FORMATS:
        raise UsageError(f"--dataset-column applies to Parquet, Arrow and save_to_disk data, not to {fmt} ({path})")
    if path.is_dir() and fmt not in ("hf-disk",):
        raise UsageError(f"{path} is a folder: give a file for --dataset-format {fmt}")
    unusable, notes = 0, []
    if fmt in TABLE_FORMATS:
        prompts, unusable, notes, column = _read_table(path, fmt, column)
    elif fmt == "jsonl":
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise UsageError(f"{path} is not UTF-8 text") from exc
        except OSError as exc:
            raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from exc
        prompts = parse_prompt_lines(text.splitlines(), str(path))
    else:
        convert = from_conversation if fmt == "sharegpt" else from_turns
        try:
            prompts, unusable, notes = _collect(_json_records(path), convert, str(path))
        finally:
            _parsed.cache_clear()
    info = WorkloadInfo(source=str(path), format=fmt, column=column, read=len(prompts), unusable=unusable,
                        notes=notes)
    return prompts, info


def read_builtin(name: str) -> tuple[list[Prompt], WorkloadInfo]:
    prompts = load_builtin(name)
    return prompts, WorkloadInfo(source="built-in" if name == "default" else f"built-in:{name}", format="jsonl",
                                 read=len(prompts))


# --- selection ----------------------------------------------------------------------------------
def input_chars(prompt: Prompt) -> int:
    """The length of the first request's input: the completion prompt, or the first messages."""
    return len(prompt.text())


def cap_turns(prompts: list[Prompt], max_turns: int | None) -> list[Prompt]:
    """At most ``max_turns`` user turns per conversation (the first message counts as one)."""
    if max_turns is None:
        return prompts
    if max_turns < 1:
        raise UsageError(f"--max-turns {max_turns}: give 1 or more (1 sends the first user message only)")
    return [p.model_copy(update={"turns": p.turns[:max_turns - 1] or None}) if p.turns else p for p in prompts]


def parse_categories(value: str | None) -> list[str] | None:
    if value is None:
        return None
    names = list(dict.fromkeys(c.strip() for c in value.split(",") if c.strip()))
    if not names:
        raise UsageError(f"--category {value!r}: give comma-separated category names, e.g. qa,rag")
    return names


def select(prompts: list[Prompt], info: WorkloadInfo, *, categories: list[str] | None = None,
           min_input_chars: int | None = None, max_input_chars: int | None = None,
           num_prompts: int | None = None, seed: int = 0, max_turns: int | None = None) -> list[Prompt]:
    """Apply --max-turns, --category, the length bounds and --num-prompts (in that order), counting
    what each step drops into ``info``."""
    where = "the file" if info.source not in ("built-in",) and not info.source.startswith("built-in:") \
        else "the workload"
    if min_input_chars is not None and max_input_chars is not None and min_input_chars > max_input_chars:
        raise UsageError(f"--min-input-chars {min_input_chars} is above --max-input-chars {max_input_chars}")
    if num_prompts is not None and num_prompts < 1:
        raise UsageError(f"--num-prompts {num_prompts}: give 1 or more")
    kept = cap_turns(prompts, max_turns)
    info.max_turns = max_turns
    present = sorted({p.category for p in kept})
    if categories:
        info.category_filter = list(categories)
        wanted = set(categories)
        after = [p for p in kept if p.category in wanted]
        info.filtered_category = len(kept) - len(after)
        if not after:
            raise UsageError(f"{info.source}: no prompt left after --category {','.join(categories)}; "
                             f"categories in {where}: {', '.join(present)}")
        missing = [c for c in categories if c not in present]
        if missing:
            info.notes.append(f"--category: {', '.join(missing)} not in {info.source} "
                              f"(categories there: {', '.join(present)})")
        kept = after
    if min_input_chars is not None or max_input_chars is not None:
        info.min_input_chars, info.max_input_chars = min_input_chars, max_input_chars
        lo = min_input_chars if min_input_chars is not None else 0
        hi = max_input_chars if max_input_chars is not None else float("inf")
        after = [p for p in kept if lo <= input_chars(p) <= hi]
        info.filtered_length = len(kept) - len(after)
        if not after:
            lengths = [input_chars(p) for p in kept]
            raise UsageError(f"{info.source}: no prompt left after --min-input-chars/--max-input-chars; the input "
                             f"lengths there run from {min(lengths)} to {max(lengths)} characters")
        kept = after
    if num_prompts is not None:
        info.num_prompts = num_prompts
        if num_prompts > len(kept):
            info.notes.append(f"--num-prompts {num_prompts}: only {len(kept)} prompt"
                              f"{'s' if len(kept) > 1 else ''} left after filtering; using all of them")
        else:
            import numpy as np

            info.seed = seed
            order = np.random.default_rng(seed).permutation(len(kept))[:num_prompts]
            info.sampled_out = len(kept) - num_prompts
            kept = [kept[int(i)] for i in order]
    info.selected = len(kept)
    info.categories = dict(sorted(Counter(p.category for p in kept).items()))
    info.multi_turn = sum(1 for p in kept if p.turns)
    return kept


def load(*, dataset: str | Path | None = None, workload: str | None = None, dataset_format: str = "auto",
         dataset_column: str | None = None, max_turns: int | None = None, num_prompts: int | None = None,
         dataset_seed: int = 0, min_input_chars: int | None = None, max_input_chars: int | None = None,
         category: str | None = None) -> tuple[list[Prompt], WorkloadInfo]:
    """The prompts of a run and where they came from: a local dataset, or a built-in workload."""
    if dataset is not None and workload is not None:
        raise UsageError("give --dataset (or --prompts) or --workload, not both")
    if dataset is None:
        if dataset_format != "auto" or dataset_column is not None:
            raise UsageError("--dataset-format and --dataset-column need --dataset PATH")
        name = workload or "default"
        if name not in WORKLOADS:
            raise UsageError(f"--workload {name}: unknown; the built-in workloads are {', '.join(WORKLOADS)}")
        prompts, info = read_builtin(name)
    else:
        prompts, info = read_dataset(dataset, dataset_format, dataset_column)
    selected = select(prompts, info, categories=parse_categories(category), min_input_chars=min_input_chars,
                      max_input_chars=max_input_chars, num_prompts=num_prompts, seed=dataset_seed,
                      max_turns=max_turns)
    return selected, info


def summary_line(info: WorkloadInfo) -> str:
    """One line for the console: what was read and what each step dropped."""
    parts = [f"{info.read} read from {info.source} ({info.format}"
             + (f", column {info.column}" if info.column else "") + ")"]
    if info.unusable:
        parts.append(f"{info.unusable} without a user message")
    if info.filtered_category:
        parts.append(f"{info.filtered_category} dropped by --category")
    if info.filtered_length:
        parts.append(f"{info.filtered_length} dropped by input length")
    if info.sampled_out:
        parts.append(f"{info.selected} sampled with seed {info.seed}")
    cats = ", ".join(f"{k} {v}" for k, v in info.categories.items())
    multi = f"; {info.multi_turn} multi-turn" if info.multi_turn else ""
    return f"prompts: {info.selected} sent ({cats}{multi}); " + "; ".join(parts)

"""The request-feature matrix of `equiv --features`: which features there are, what each cell sends,
the invariants that hold whatever the text, and the verdict of a cell (pure: no I/O; the
derivations ask the servers only through the ``Ask`` they are given).

Each cell is one ``Feature`` in ``FEATURES``, whole: its request, the function that derives its
parameters from the servers' own answers, how often it is sent, its invariant and the planted
faults it catches. A cell is one request feature (stop strings, penalties, logprobs, structured output, top-p, seeds,
...) sent alike to the spec-on server and its baseline. Three kinds:

- deterministic: greedy; the two sides' texts must be identical (the first divergence and its
  near-tie triage are analysis/identity.py's, as in ``equiv``), and each answer must keep the feature's own invariant (a stop string absent from the
  text, length limits kept, JSON valid against its schema, ...);
- distribution: sampled with the feature's settings; every sampled token is scored against the
  *exact* distribution of that setting (temperature, min_p, top_k, top_p applied in vLLM's order
  to the target's log-probabilities, ``processed_logprobs``) and the statistics of
  analysis/sampling_stats.py decide;
- seed: the same seed twice gives the same text, different seeds do not all agree.

Around each cell the spec-on server's counters are read: a cell in which no draft was proposed is
"inactive" (the server turned speculation off for that feature), never a pass of speculation.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from specadapt.analysis.identity import TOP_LOGPROBS, first_divergence, triage_at
from specadapt.analysis.sampling_stats import TokenDraw
from specadapt.errors import UsageError
from specadapt.records.features import GATE_EFFECT, Activity, CellCheck, FeatureGate
from specadapt.records.identity import Divergence
from specadapt.records.metrics import AcceptanceSummary
from specadapt.records.requests import RequestRecord

# --- the prompts the cells send ----------------------------------------------------------------
REPEAT = "a b c d e f g h a b c d e f g h a b c d e f g h a b c d e f g h a b"
CODE = ("def add(x, y):\n    return x + y\n\ndef sub(x, y):\n    return x - y\n\ndef mul(x, y):\n"
        "    return x * y\n\n# The same three functions again, each with a docstring:\n")
COUNT = "1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2,"
STORY = "Once upon a time, in a small village by the sea, there lived an old fisherman who"
SHORT_ANSWER = [{"role": "user", "content": "What is the capital of France? Answer with one word."}]
JSON_ASK = [{"role": "user", "content": "Describe a person named Ada, aged 36, who lives in London, as a JSON "
                                        "object with the keys name, age and city."}]
MULTI_TURN = [{"role": "user", "content": "Repeat this line twice: The quick brown fox jumps over the lazy dog."},
              {"role": "assistant", "content": "The quick brown fox jumps over the lazy dog.\n"
                                               "The quick brown fox jumps over the lazy dog."},
              {"role": "user", "content": "Now repeat it three more times, numbered."}]
YES_NO = [{"role": "user", "content": "Is the sky blue on a clear day? Answer yes or no."}]
PHONE = "Call our office at the number "
PERSON_SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                                  "city": {"type": "string"}},
                 "required": ["name", "age", "city"], "additionalProperties": False}
PHONE_REGEX = r"[0-9]{3}-[0-9]{4}"
CHOICES = ["yes", "no"]
LONG_TEXT = ("The Rhine begins in the Swiss Alps, flows along the German-French border and through Germany, "
             "and empties into the North Sea in the Netherlands. ")


# --- answers and invariants ----------------------------------------------------------------------
@dataclass(frozen=True)
class Answer:
    """One non-streamed answer, as the cells read it."""

    text: str
    finish_reason: str | None = None
    token_ids: tuple[int, ...] | None = None
    completion_tokens: int | None = None
    prompt_tokens: int | None = None
    stop_reason: str | int | None = None
    logprobs: tuple[float, ...] | None = None
    top_logprobs: tuple[tuple[tuple[str, float], ...], ...] | None = None

    @property
    def n_tokens(self) -> int | None:
        if self.token_ids is not None:
            return len(self.token_ids)
        return self.completion_tokens


def invariant_problems(answer: Answer, params: Mapping[str, Any], max_model_len: int | None = None) -> list[str]:
    """What the answer breaks of the rules its request set, whatever its text (empty: none)."""
    out: list[str] = []
    stops = params.get("stop") or []
    stops = [stops] if isinstance(stops, str) else list(stops)
    kept = bool(params.get("include_stop_str_in_output"))
    for s in stops:
        body = answer.text[:-len(s)] if kept and answer.text.endswith(s) else answer.text
        if s in body:
            out.append(f"the stop string {s!r} is in the output at character {body.index(s)}")
    if kept and stops and answer.finish_reason == "stop" and isinstance(answer.stop_reason, str) \
            and not answer.text.endswith(answer.stop_reason):
        out.append(f"include_stop_str_in_output: the output does not end with the stop string {answer.stop_reason!r}")
    n = answer.n_tokens
    limit = params.get("max_tokens")
    if limit is not None and n is not None and n > limit:
        out.append(f"{n} tokens generated, max_tokens is {limit}")
    if params.get("ignore_eos") and limit is not None and n is not None and n < limit \
            and answer.finish_reason != "length":
        out.append(f"ignore_eos: the answer ended after {n} of {limit} tokens ({answer.finish_reason})")
    least = params.get("min_tokens")
    if least and n is not None and n < least:
        out.append(f"{n} tokens generated, min_tokens is {least}")
    ids = answer.token_ids
    stop_ids = set(params.get("stop_token_ids") or [])
    if ids is not None and stop_ids and any(t in stop_ids for t in ids[:-1]):
        first = next(i for i, t in enumerate(ids[:-1]) if t in stop_ids)
        out.append(f"stop token {ids[first]} at token {first}, yet the answer went on")
    banned = {int(t) for t, b in (params.get("logit_bias") or {}).items() if b <= -100}
    if ids is not None and banned & set(ids):
        out.append(f"token(s) {sorted(banned & set(ids))} appear although logit_bias is -100")
    if max_model_len and answer.prompt_tokens is not None and n is not None \
            and answer.prompt_tokens + n > max_model_len:
        out.append(f"prompt {answer.prompt_tokens} + {n} tokens exceed max_model_len {max_model_len}")
    if answer.finish_reason != "length":  # a structure cut by max_tokens cannot be complete
        out += _structure_problems(answer.text, params)
    if params.get("logprobs") is not None and answer.logprobs is not None:
        out += _logprob_problems(answer)
    return out


def _structure_problems(text: str, params: Mapping[str, Any]) -> list[str]:
    fmt = params.get("response_format") or {}
    schema = (fmt.get("json_schema") or {}).get("schema") if fmt.get("type") == "json_schema" else None
    structured = params.get("structured_outputs") or {}
    if schema is not None:
        import jsonschema

        try:
            jsonschema.validate(json.loads(text), schema)
        except json.JSONDecodeError as exc:
            return [f"the output is not JSON ({exc.msg} at character {exc.pos})"]
        except jsonschema.ValidationError as exc:
            return [f"the JSON breaks its schema: {exc.message}"]
    if "regex" in structured and re.fullmatch(structured["regex"], text) is None:
        return [f"the output {text[:40]!r} does not match the regex {structured['regex']}"]
    if "choice" in structured and text not in structured["choice"]:
        return [f"the output {text[:40]!r} is not one of {structured['choice']}"]
    return []


def _logprob_problems(answer: Answer) -> list[str]:
    lps = answer.logprobs or ()
    out = []
    n = answer.n_tokens
    if n is not None and len(lps) != n:
        out.append(f"{len(lps)} logprobs for {n} tokens")
    bad = [i for i, v in enumerate(lps) if v is None or v > 1e-6]
    if bad:
        out.append(f"logprob above 0 at token {bad[0]}")
    for i, top in enumerate(answer.top_logprobs or ()):
        values = [v for _, v in top]
        if any(b > a + 1e-9 for a, b in zip(values, values[1:])):
            out.append(f"top logprobs not in descending order at token {i}")
            break
    return out


# --- identity, logprobs and near-ties -------------------------------------------------------------
def answer_record(answer: Answer) -> RequestRecord:
    """An answer as the record analysis/identity.py compares (token ids as "token_id:N")."""
    return RequestRecord(prompt_id="cell", category="features", api="completions", ok=True, text=answer.text,
                         tokens=[f"token_id:{t}" for t in answer.token_ids or ()], output_tokens=answer.n_tokens or 0)


def divergence(off: Answer, on: Answer) -> Divergence | None:
    """The first divergence of two answers (analysis/identity.py ``first_divergence``: on token ids
    where both sides gave them, else on the texts); None: identical."""
    return first_divergence(answer_record(off), answer_record(on))


def difference_text(off: Answer, on: Answer, div: Divergence) -> str:
    char = div.char_index
    at = f"token {div.token_index}, " if div.token_index >= 0 else ""
    return (f"spec on differs from spec off at {at}character {char}: off {off.text[char:char + 20]!r} vs on "
            f"{on.text[char:char + 20]!r}")


def identity_check(off: Answer, on: Answer, div: Divergence, top: Sequence[tuple[str, float]],
                   threshold: float) -> tuple[CellCheck, bool]:
    """(the identity check, near-tie) of a divergence from the spec-off server's top logprobs at the
    first differing token (``top``), triaged by analysis/identity.py ``triage_at``: a near-tie passes,
    anything else (suspect, or a margin the top cannot show) fails."""
    text = difference_text(off, on, div)
    triage = triage_at(dict(top), None, div, threshold)
    if triage.verdict == "near-tie":
        return CellCheck(name="identity", ok=True, detail=f"{text}: a numerical near-tie (margin {triage.margin:.3g} "
                                                          f"< {threshold:g} nats)"), True
    said = (f"margin {triage.margin:.3g} nats" if triage.margin is not None and not triage.margin_is_lower_bound
            else f"the spec-on token is not in the top {TOP_LOGPROBS}")
    return CellCheck(name="identity", ok=False, detail=f"{text}: suspect ({said}, threshold {threshold:g})"), False


def logprob_differences(off: Answer, on: Answer, tolerance: float) -> list[str]:
    """Logprob values within ``tolerance`` nats token by token, and the same top ranking (two
    entries may swap only when their values are within ``tolerance`` of each other)."""
    out = []
    for i, (a, b) in enumerate(zip(off.logprobs or (), on.logprobs or ())):
        if abs(a - b) > tolerance:
            out.append(f"token {i}: logprob {b:.4f} on vs {a:.4f} off (|diff| {abs(a - b):.3g} > {tolerance:g})")
            break
    for i, (a, b) in enumerate(zip(off.top_logprobs or (), on.top_logprobs or ())):
        bad = _ranking_problem(a, b, tolerance)
        if bad:
            out.append(f"token {i}: {bad}")
            break
    return out


def _ranking_problem(off: Sequence[tuple[str, float]], on: Sequence[tuple[str, float]], tolerance: float) -> str | None:
    off_ids, on_ids = [t for t, _ in off], [t for t, _ in on]
    if off_ids == on_ids:
        for (t, a), (_, b) in zip(off, on):
            if abs(a - b) > tolerance:
                return f"top logprob of {t!r} {b:.4f} on vs {a:.4f} off"
        return None
    values = dict(off)
    for j, (x, y) in enumerate(zip(off_ids, on_ids)):
        if x != y and not (y in values and abs(values[x] - values[y]) <= tolerance):
            return f"top logprobs ranked differently at rank {j + 1}: {y!r} on vs {x!r} off"
    return None


# --- derived parameters ----------------------------------------------------------------------------
def mid_chunk_positions(chunks: Sequence[Sequence[int]]) -> list[int]:
    """Token positions (0-based over the whole answer) that are followed by another token of the same
    streamed chunk: where a stop or a length limit falls *inside* an accepted chunk."""
    out, pos = [], 0
    for c in chunks:
        out += [pos + j for j in range(len(c) - 1)]
        pos += len(c)
    return out


def pick_stop_string(prefix_texts: Mapping[int, str], full_text: str, max_chars: int = 12) -> tuple[str, int] | None:
    """A stop string whose first occurrence in ``full_text`` ends exactly where the text of tokens
    0..j ends, for a candidate j (``prefix_texts``: j -> that text, earliest first): (string, j).
    The longest such suffix up to ``max_chars`` characters with a non-space character."""
    for j, prefix in sorted(prefix_texts.items()):
        if not full_text.startswith(prefix) or not prefix.strip():
            continue
        for size in range(min(max_chars, len(prefix)), 0, -1):
            s = prefix[-size:]
            if s.strip() and full_text.find(s) + len(s) == len(prefix):
                return s, j
    return None


def pick_stop_id(ids: Sequence[int], candidates: Sequence[int]) -> tuple[int, int] | None:
    """(token id, position): the first candidate position whose token does not occur earlier."""
    for j in candidates:
        if j < len(ids) and ids[j] not in ids[:j]:
            return ids[j], j
    return None


def most_frequent(ids: Sequence[int]) -> int | None:
    """The id that occurs most often (the lowest id among equals), or None for no ids."""
    if not ids:
        return None
    counts: dict[int, int] = {}
    for t in ids:
        counts[t] = counts.get(t, 0) + 1
    return min(counts, key=lambda t: (-counts[t], t))


# --- how a cell's parameters are derived from the servers' own answers ----------------------------
class Ask(Protocol):
    """What a derivation may ask the servers (orchestration/features.py answers): the spec-on server's
    streamed greedy answer and its detokenizer, the spec-off server's greedy answer and tokenizer."""

    max_tokens: int  # tokens of a greedy request of the run
    max_model_len: int | None  # the servers' context length, where they say it

    async def stream_chunks(self, prompt: Any, max_tokens: int) -> list[list[int]]:
        """The spec-on server's streamed greedy answer: its token ids, one list per streamed chunk."""

    async def detokenize(self, ids: Sequence[int]) -> str:
        """The spec-on server's text of ``ids``."""

    async def baseline(self, prompt: Any, max_tokens: int) -> Answer:
        """The spec-off server's greedy answer."""

    async def tokenize(self, text: str) -> list[int]:
        """The spec-off server's ids of ``text``."""


@dataclass
class Derived:
    """A cell's request before it is sent: the prompt, the parameters, and notes on how they were chosen."""

    prompt: Any
    params: dict[str, Any]
    notes: list[str] = field(default_factory=list)


class NotExercised(Exception):
    """Speculation gave no accepted chunk to place the cell's parameter in: the cell is inactive."""


class CannotDerive(Exception):
    """The cell's request cannot be sized (no max_model_len known): it cannot be checked exactly."""


Derive = Callable[[Ask, Derived], Awaitable[Derived]]


async def _chunked(ask: Ask, cell: Derived) -> tuple[list[int], list[int]]:
    """(the spec-on answer's ids, the positions from 2 on that are followed by a token of their chunk)."""
    chunks = await ask.stream_chunks(cell.prompt, ask.max_tokens)
    ids = [t for c in chunks for t in c]
    return ids, [j for j in mid_chunk_positions(chunks) if j >= 2]


def _inside_a_chunk(ids: Sequence[int], mid: Sequence[int]) -> None:
    if not mid:
        raise NotExercised(f"the spec-on server's greedy answer came one token per step ({len(ids)} tokens): no "
                           "accepted chunk to place the limit in")


async def stop_string_in_chunk(ask: Ask, cell: Derived) -> Derived:
    """A stop string that completes inside an accepted chunk of the spec-on answer."""
    ids, mid = await _chunked(ask, cell)
    _inside_a_chunk(ids, mid)
    full = await ask.detokenize(ids)
    prefixes = {j: await ask.detokenize(ids[:j + 1]) for j in mid[:8]}
    picked = pick_stop_string(prefixes, full)
    if picked is None:
        raise NotExercised("no stop string completes inside an accepted chunk of the spec-on answer")
    cell.params["stop"] = [picked[0]]
    cell.notes.append(f"stop string {picked[0]!r} completes at token {picked[1]}, inside a streamed chunk")
    return cell


async def stop_token_in_chunk(ask: Ask, cell: Derived) -> Derived:
    """A stop token id from the middle of an accepted chunk, its first occurrence in the answer."""
    ids, mid = await _chunked(ask, cell)
    _inside_a_chunk(ids, mid)
    picked = pick_stop_id(ids, mid)
    if picked is None:
        raise NotExercised("every token inside an accepted chunk occurs earlier in the answer")
    cell.params["stop_token_ids"] = [picked[0]]
    cell.notes.append(f"stop token {picked[0]} first comes at token {picked[1]}, inside a streamed chunk")
    return cell


async def max_tokens_in_chunk(ask: Ask, cell: Derived) -> Derived:
    """max_tokens that ends inside an accepted chunk."""
    ids, mid = await _chunked(ask, cell)
    _inside_a_chunk(ids, mid)
    cell.params["max_tokens"] = mid[0] + 1
    cell.notes.append(f"max_tokens {mid[0] + 1} ends inside a streamed chunk of the spec-on answer")
    return cell


async def ban_most_frequent(ask: Ask, cell: Derived) -> Derived:
    """logit_bias -100 on the spec-on answer's most frequent token."""
    ids, _ = await _chunked(ask, cell)
    cell.params["logit_bias"] = {str(most_frequent(ids)): -100}
    return cell


async def min_tokens_past_eos(ask: Ask, cell: Derived) -> Derived:
    """min_tokens 8 past the end of the spec-off server's own answer."""
    natural = await ask.baseline(cell.prompt, ask.max_tokens)
    n = natural.n_tokens or 1
    cell.params.update(min_tokens=n + 8, max_tokens=n + 16)
    cell.notes.append(f"the spec-off answer ends by itself after {n} tokens ({natural.finish_reason})")
    return cell


def long_prompt(size: Callable[[int], int], max_tokens: int | None = None) -> Derive:
    """A derivation of a prompt of ``size(max_model_len)`` tokens of LONG_TEXT (and ``max_tokens``)."""
    async def derive(ask: Ask, cell: Derived) -> Derived:
        if not ask.max_model_len:
            raise CannotDerive("the servers do not say their max_model_len, so no prompt can be sized to it")
        unit = await ask.tokenize(LONG_TEXT)
        want = size(ask.max_model_len)
        cell.prompt = (unit * (want // len(unit) + 1))[:want]
        if max_tokens is not None:
            cell.params["max_tokens"] = max_tokens
        cell.notes.append(f"prompt of {len(cell.prompt)} tokens, max_model_len {ask.max_model_len}")
        return cell

    return derive


# --- the cells -------------------------------------------------------------------------------------
Invariant = Callable[[Answer, Mapping[str, Any], int | None], list[str]]  # (answer, params, max_model_len) -> problems


@dataclass(frozen=True)
class Feature:
    """One cell of the matrix, whole: what it sends, how its parameters are derived, how often it is
    sent, how it is judged, and the planted fault it catches.

    ``prompt``: a completion prompt (str) or chat messages (list); ``params``: the request's own
    parameters; ``derive``: parameters chosen from the servers' own answers before the cell runs (a
    stop string that completes inside a multi-token chunk, ...; None: ``params`` as they are);
    ``sends``: requests of the cell to each side (2: the spec-on server's second answer, a
    prefix-cache hit, must agree with its first); ``invariant``: what each answer must keep whatever
    its text; ``raw_logits``: the server's logprobs are the logits the greedy choice was made from
    (no penalty, bias or grammar), so a divergence can be triaged as a near-tie; ``sampling``: the
    distribution and seed cells' settings; ``catches``: the reference engine's planted faults
    (``specadapt reference serve --fault``) this cell must catch."""

    name: str
    kind: str
    title: str
    prompt: str | list[dict[str, str]] = REPEAT
    params: Mapping[str, Any] = field(default_factory=dict)
    derive: Derive | None = None
    sends: int = 1
    invariant: Invariant = invariant_problems
    raw_logits: bool = True
    sampling: Mapping[str, float] = field(default_factory=dict)
    catches: tuple[str, ...] = ()


# The order the cells run in: the sampled cells with top_k last, since one server build is known to crash on
# them and the cells after a crash cannot run.
FEATURES: tuple[Feature, ...] = (
    Feature("stop-string", "deterministic", "a stop string that completes inside a multi-token accepted chunk",
            derive=stop_string_in_chunk, catches=("stop-in-chunk",)),
    Feature("stop-string-kept", "deterministic", "the same stop string with include_stop_str_in_output",
            params={"include_stop_str_in_output": True}, derive=stop_string_in_chunk, catches=("stop-in-chunk",)),
    Feature("stop-token-ids", "deterministic", "stop_token_ids: a token in the middle of an accepted chunk",
            derive=stop_token_in_chunk),
    Feature("max-tokens", "deterministic", "max_tokens that ends inside an accepted chunk",
            derive=max_tokens_in_chunk, catches=("overrun-max-tokens",)),
    Feature("min-tokens", "deterministic", "min_tokens past the answer's own EOS", prompt=SHORT_ANSWER,
            derive=min_tokens_past_eos, raw_logits=False),
    Feature("ignore-eos", "deterministic", "ignore_eos: generation runs to max_tokens", prompt=SHORT_ANSWER,
            params={"ignore_eos": True}),
    # prompts on which drafts are accepted and the penalty still changes the greedy choice
    Feature("repetition-penalty", "deterministic", "repetition_penalty 1.1", prompt=CODE,
            params={"repetition_penalty": 1.1}, raw_logits=False),
    Feature("frequency-penalty", "deterministic", "frequency_penalty 0.5", prompt=COUNT,
            params={"frequency_penalty": 0.5}, raw_logits=False, catches=("draft-penalties-skipped",)),
    Feature("presence-penalty", "deterministic", "presence_penalty 1.0", prompt=COUNT,
            params={"presence_penalty": 1.0}, raw_logits=False),
    Feature("logit-bias", "deterministic", "logit_bias -100 on the answer's most frequent token",
            derive=ban_most_frequent, raw_logits=False, catches=("draft-penalties-skipped",)),
    Feature("logprobs", "deterministic", "logprobs 5: values and ranking", params={"logprobs": 5},
            catches=("logprobs-shifted",)),
    Feature("json-schema", "deterministic", "structured output: response_format json_schema", prompt=JSON_ASK,
            params={"response_format": {"type": "json_schema",
                                        "json_schema": {"name": "person", "schema": PERSON_SCHEMA}},
                    "max_tokens": 96},
            raw_logits=False),
    Feature("regex", "deterministic", f"structured output: regex {PHONE_REGEX}", prompt=PHONE,
            params={"structured_outputs": {"regex": PHONE_REGEX}}, raw_logits=False),
    Feature("choice", "deterministic", "structured output: choice yes/no", prompt=YES_NO,
            params={"structured_outputs": {"choice": CHOICES}}, raw_logits=False),
    Feature("prefix-cache", "deterministic", "the same prompt twice: the second is a prefix-cache hit",
            prompt=CODE, sends=2),
    Feature("model-length", "deterministic", "a prompt 8 tokens short of max_model_len, EOS ignored: drafts "
            "must stop at the limit", params={"ignore_eos": True},
            derive=long_prompt(lambda max_model_len: max_model_len - 8, max_tokens=8)),
    Feature("chunked-prefill", "deterministic", "a prompt of about 3/4 of max_model_len (chunked prefill where "
            "it exceeds the server's tokens per step)",
            derive=long_prompt(lambda max_model_len: (max_model_len * 3) // 4)),
    Feature("multi-turn", "deterministic", "a three-message conversation", prompt=MULTI_TURN),
    Feature("seed", "seed", "the same seed twice gives the same text; different seeds differ",
            sampling={"temperature": 1.0}, catches=("seed-ignored",)),
    Feature("temperature-0.7", "distribution", "temperature 0.7", sampling={"temperature": 0.7}),
    Feature("temperature-1.3", "distribution", "temperature 1.3", sampling={"temperature": 1.3}),
    Feature("top-p-0.9", "distribution", "top_p 0.9", sampling={"temperature": 1.0, "top_p": 0.9}),
    Feature("min-p-0.05", "distribution", "min_p 0.05", sampling={"temperature": 1.0, "min_p": 0.05}),
    Feature("top-k-20", "distribution", "top_k 20", sampling={"temperature": 1.0, "top_k": 20},
            catches=("draft-filters-skipped",)),
    Feature("combined", "distribution", "temperature 0.8, top_k 20, top_p 0.9, min_p 0.05",
            sampling={"temperature": 0.8, "top_k": 20, "top_p": 0.9, "min_p": 0.05},
            catches=("draft-filters-skipped",)),
)
BY_NAME = {f.name: f for f in FEATURES}
GROUPS = {"all": [f.name for f in FEATURES],
          "deterministic": [f.name for f in FEATURES if f.kind == "deterministic"],
          "distribution": [f.name for f in FEATURES if f.kind == "distribution"],
          "structured": ["json-schema", "regex", "choice"]}
DISTRIBUTION_PROMPTS = (REPEAT, COUNT, STORY)  # repetitive ones, so that n-gram drafts are proposed


def parse_features(text: str) -> list[str]:
    """``--features all`` / ``deterministic,top-k-20`` -> cell names in the matrix's order."""
    asked: set[str] = set()
    for word in (w.strip() for w in text.split(",")):
        if not word:
            continue
        if word in GROUPS:
            asked.update(GROUPS[word])
        elif word in BY_NAME:
            asked.add(word)
        else:
            raise UsageError(f"unknown feature {word!r}: use all, deterministic, distribution, structured or names "
                             f"from `specadapt equiv --list-features`")
    if not asked:
        raise UsageError("--features names no feature: give all, or a comma-separated list")
    return [f.name for f in FEATURES if f.name in asked]


# --- the exact distribution of a sampling setting ---------------------------------------------------
@dataclass(frozen=True)
class Setting:
    """temperature, then min_p, then top_k, then top_p, as vLLM's sampler applies them."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0

    @classmethod
    def of(cls, values: Mapping[str, float]) -> Setting:
        return cls(float(values.get("temperature", 1.0)), int(values.get("top_k", 0)), float(values.get("top_p", 1.0)),
                   float(values.get("min_p", 0.0)))

    @property
    def raw(self) -> bool:
        """Temperature 1 and nothing cut: the model's own distribution, the one prompt logprobs give."""
        return self.temperature == 1.0 and self.top_k == 0 and self.top_p == 1.0 and self.min_p == 0.0

    def body(self) -> dict[str, float]:
        out: dict[str, float] = {"temperature": self.temperature, "top_p": self.top_p}
        if self.top_k > 0:
            out["top_k"] = self.top_k
        if self.min_p > 0:
            out["min_p"] = self.min_p
        return out


def processed_logprobs(raw: np.ndarray, s: Setting) -> np.ndarray:
    """The log-probabilities the sampler draws from, ``[..., V]`` from the raw ones (float64):
    tempered; min_p drops tokens whose tempered probability is below min_p times the largest;
    top_k keeps the k largest (ties at the k-th kept); top_p keeps the smallest head, in
    descending order, whose mass reaches top_p (renormalised after top_k). -inf outside."""
    x = np.asarray(raw, dtype=np.float64) / s.temperature
    x = x - _logsumexp(x)
    if s.min_p > 0:
        x = np.where(x < x.max(axis=-1, keepdims=True) + math.log(s.min_p), -np.inf, x)
    if 0 < s.top_k < x.shape[-1]:
        kth = -np.sort(-x, axis=-1)[..., s.top_k - 1:s.top_k]
        x = np.where(x < kth, -np.inf, x)
    x = x - _logsumexp(x)
    if s.top_p < 1.0:
        order = np.argsort(-x, axis=-1, kind="stable")
        p_sorted = np.exp(np.take_along_axis(x, order, axis=-1))
        before = np.cumsum(p_sorted, axis=-1) - p_sorted
        drop = np.zeros_like(x, dtype=bool)
        np.put_along_axis(drop, order, before >= s.top_p, axis=-1)
        x = np.where(drop, -np.inf, x)
        x = x - _logsumexp(x)
    return x


def _logsumexp(x: np.ndarray) -> np.ndarray:
    m = np.max(x, axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    with np.errstate(divide="ignore"):
        return m + np.log(np.sum(np.exp(x - m), axis=-1, keepdims=True))


def exactness_problem(s: Setting, k: int, source: str) -> str | None:
    """Why a distribution cell cannot be scored exactly from a source's top K (None: it can).
    The whole vocabulary (``source`` "reference") is always exact; so is a server's top K for the
    raw setting (``Setting.raw``: its prompt logprobs are that distribution, the rest lumped, as
    `equiv --sampling` scores it); otherwise a server's top K is exact only when top_k <= K
    restricts the support to it (the tempered normaliser and the min_p/top_p cut then need no
    token outside it)."""
    if source == "reference" or s.raw:  # the raw distribution is the server's prompt logprobs: top K, rest lumped
        return None
    if 0 < s.top_k <= k:
        return None
    return (f"the exact distribution of {s.body()} needs the whole vocabulary, and the server returns the top {k} "
            "only: give --reference DIR (the target recomputed in float64), or a cell with top_k <= K")


def draw_from_vocab(raw: np.ndarray, token: int, s: Setting, k: int, position: int, prompt_id: str) -> TokenDraw:
    """A TokenDraw of ``token`` under the exact distribution of ``s`` from the whole raw row ``[V]``: the
    top K of that distribution (the whole support when it has at most K tokens)."""
    lp = processed_logprobs(raw, s)
    support = np.flatnonzero(np.isfinite(lp))
    top = support[np.argsort(-lp[support], kind="stable")][:k]
    return TokenDraw(top={int(t): float(lp[t]) for t in top}, token=int(token), logprob=float(lp[token]),
                     position=position, prompt_id=prompt_id, full_vocab=support.size <= k)


def draw_from_top(top_raw: Mapping[int, float], token: int, s: Setting, position: int, prompt_id: str) -> TokenDraw:
    """A TokenDraw from a server's raw top K where ``exactness_problem`` is None (top_k <= K): the
    support is within the top K, so the distribution is exact and whole."""
    ids = sorted(top_raw, key=lambda t: (-top_raw[t], t))[:s.top_k]
    lp = processed_logprobs(np.array([top_raw[t] for t in ids]), Setting(s.temperature, 0, s.top_p, s.min_p))
    table = {t: float(v) for t, v in zip(ids, lp) if np.isfinite(v)}
    return TokenDraw(top=table, token=int(token), logprob=table.get(int(token), -math.inf), position=position,
                     prompt_id=prompt_id, full_vocab=True)


# --- activity, lossy configurations, verdicts, the gate --------------------------------------------
def activity_of(acceptance: AcceptanceSummary | None) -> Activity:
    """active: drafts were proposed during the cell; inactive: none (counters read, no draft); unknown:
    the counters could not tell."""
    if acceptance is not None and acceptance.draft_tokens == 0 and acceptance.drafts is not None:
        return Activity(state="inactive", acceptance=acceptance)
    if acceptance is None or not acceptance.known or acceptance.draft_tokens is None:
        return Activity(state="unknown", acceptance=acceptance)
    return Activity(state="active" if acceptance.draft_tokens > 0 else "inactive", acceptance=acceptance)


def cell_verdict(checks: Sequence[CellCheck], activity: Activity | None, near_tie: bool = False,
                 lossy: str | None = None) -> tuple[str, str]:
    """(verdict, reason) of a cell from its checks: a failed check is a fault ("lossy" when the
    configuration is lossy by design); otherwise no draft proposed is "inactive", a divergence
    triaged as a numerical near-tie is "near-tie", and the rest passes."""
    failed = [c for c in checks if not c.ok]
    if failed:
        first = f"{failed[0].name}: {failed[0].detail}"
        names = {c.name for c in failed}
        if {"invariant (spec-on)", "invariant (spec-off)"} <= names:
            first = f"the server breaks the feature with speculation off too (not a speculation fault): {first}"
        if lossy:
            return "lossy", f"lossy by configuration ({lossy}); {first}"
        return "fail", first
    if activity is not None and activity.state == "inactive":
        return "inactive", ("the spec-on server proposed no draft during this cell (speculation was off for this "
                            "feature, or the answer too short to draft), so the result says nothing about speculation")
    if near_tie:
        return "near-tie", next((c.detail for c in checks if c.name == "identity"), "numerical near-tie")
    if not checks:
        return "error", "nothing was checked"
    return "pass", "; ".join(c.detail for c in checks if c.detail) or "all checks passed"


def feature_gate(verdicts: Sequence[tuple[str, str]], require_active: bool = False) -> FeatureGate:
    """Fails on any failed cell (or errored), and on inactive ones with ``require_active``;
    with no cell that passed, nothing was shown, so that fails too."""
    reasons = [f"{name}: {verdict}" for name, verdict in verdicts if GATE_EFFECT.get(verdict) is False]
    if require_active:
        reasons += [f"{name}: speculation inactive" for name, verdict in verdicts if verdict == "inactive"]
    if not any(GATE_EFFECT.get(v) for _, v in verdicts):
        reasons.append("no cell passed: nothing about speculation was shown")
    return FeatureGate(passed=not reasons, reasons=reasons)

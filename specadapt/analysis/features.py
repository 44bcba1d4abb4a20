"""The request-feature matrix of `equiv --features`: which features there are, what each cell sends,
the invariants that hold whatever the text, and the verdict of a cell (pure: no I/O).

A cell is one request feature (stop strings, penalties, logprobs, structured output, top-p, seeds,
...) sent alike to the spec-on server and its baseline. Three kinds:

- deterministic: greedy; the two sides' texts must be identical (a divergence is triaged as in
  ``equiv``), and each answer must keep the feature's own invariant (a stop string absent from the
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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from specadapt.analysis.sampling_stats import TokenDraw
from specadapt.errors import UsageError
from specadapt.records.features import GATE_EFFECT, Activity, CellCheck, FeatureGate
from specadapt.records.metrics import AcceptanceSummary

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


@dataclass(frozen=True)
class Feature:
    """One cell of the matrix: what it sends and how it is judged.

    ``prompt``: a completion prompt (str) or chat messages (list); ``derive``: request parameters
    chosen from the spec-on server's own greedy answer before the cell runs (a stop string that
    completes inside a multi-token chunk, ...); ``raw_logits``: the server's logprobs are the
    logits the greedy choice was made from (no penalty, bias or grammar), so a divergence can be
    triaged as a near-tie; ``sampling``: the distribution cells' settings."""

    name: str
    kind: str
    title: str
    prompt: str | list[dict[str, str]] = REPEAT
    params: Mapping[str, Any] = field(default_factory=dict)
    derive: str | None = None
    raw_logits: bool = True
    sampling: Mapping[str, float] = field(default_factory=dict)


# The order the cells run in: the sampled cells with top_k last, since one server build is known to crash on
# them and the cells after a crash cannot run.
FEATURES: tuple[Feature, ...] = (
    Feature("stop-string", "deterministic", "a stop string that completes inside a multi-token accepted chunk",
            derive="stop"),
    Feature("stop-string-kept", "deterministic", "the same stop string with include_stop_str_in_output",
            params={"include_stop_str_in_output": True}, derive="stop"),
    Feature("stop-token-ids", "deterministic", "stop_token_ids: a token in the middle of an accepted chunk",
            derive="stop-id"),
    Feature("max-tokens", "deterministic", "max_tokens that ends inside an accepted chunk", derive="max-tokens"),
    Feature("min-tokens", "deterministic", "min_tokens past the answer's own EOS", prompt=SHORT_ANSWER,
            derive="min-tokens", raw_logits=False),
    Feature("ignore-eos", "deterministic", "ignore_eos: generation runs to max_tokens", prompt=SHORT_ANSWER,
            params={"ignore_eos": True}),
    # prompts on which drafts are accepted and the penalty still changes the greedy choice
    Feature("repetition-penalty", "deterministic", "repetition_penalty 1.1", prompt=CODE,
            params={"repetition_penalty": 1.1}, raw_logits=False),
    Feature("frequency-penalty", "deterministic", "frequency_penalty 0.5", prompt=COUNT,
            params={"frequency_penalty": 0.5}, raw_logits=False),
    Feature("presence-penalty", "deterministic", "presence_penalty 1.0", prompt=COUNT,
            params={"presence_penalty": 1.0}, raw_logits=False),
    Feature("logit-bias", "deterministic", "logit_bias -100 on the answer's most frequent token", derive="ban",
            raw_logits=False),
    Feature("logprobs", "deterministic", "logprobs 5: values and ranking", params={"logprobs": 5}),
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
            prompt=CODE),
    Feature("model-length", "deterministic", "a prompt 8 tokens short of max_model_len, EOS ignored: drafts "
            "must stop at the limit", params={"ignore_eos": True}, derive="model-length"),
    Feature("chunked-prefill", "deterministic", "a prompt of about 3/4 of max_model_len (chunked prefill where "
            "it exceeds the server's tokens per step)", derive="chunked-prefill"),
    Feature("multi-turn", "deterministic", "a three-message conversation", prompt=MULTI_TURN),
    Feature("seed", "seed", "the same seed twice gives the same text; different seeds differ",
            sampling={"temperature": 1.0}),
    Feature("temperature-0.7", "distribution", "temperature 0.7", sampling={"temperature": 0.7}),
    Feature("temperature-1.3", "distribution", "temperature 1.3", sampling={"temperature": 1.3}),
    Feature("top-p-0.9", "distribution", "top_p 0.9", sampling={"temperature": 1.0, "top_p": 0.9}),
    Feature("min-p-0.05", "distribution", "min_p 0.05", sampling={"temperature": 1.0, "min_p": 0.05}),
    Feature("top-k-20", "distribution", "top_k 20", sampling={"temperature": 1.0, "top_k": 20}),
    Feature("combined", "distribution", "temperature 0.8, top_k 20, top_p 0.9, min_p 0.05",
            sampling={"temperature": 0.8, "top_k": 20, "top_p": 0.9, "min_p": 0.05}),
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
def first_difference(off: Answer, on: Answer) -> tuple[int, int | None] | None:
    """(character index, token index or None) of the first difference of two answers; None: identical."""
    if off.text == on.text and (off.token_ids is None or on.token_ids is None or off.token_ids == on.token_ids):
        return None
    char = next((i for i, (a, b) in enumerate(zip(off.text, on.text)) if a != b), min(len(off.text), len(on.text)))
    tok = None
    if off.token_ids is not None and on.token_ids is not None:
        a, b = off.token_ids, on.token_ids
        tok = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return char, tok


def difference_text(off: Answer, on: Answer, where: tuple[int, int | None]) -> str:
    char, tok = where
    at = f"token {tok}, " if tok is not None else ""
    return (f"spec on differs from spec off at {at}character {char}: off {off.text[char:char + 20]!r} vs on "
            f"{on.text[char:char + 20]!r}")


def near_tie_margin(top: Sequence[tuple[str, float]], off_token: str, on_token: str) -> float | None:
    """logp(off) - logp(on) at a divergence from the baseline's top logprobs there; None when the
    on token is not among them (the margin is then larger than the list can show)."""
    table = dict(top)
    if off_token not in table or on_token not in table:
        return None
    return table[off_token] - table[on_token]


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
    The whole vocabulary (``source`` "reference") is always exact; a server's top K is exact only
    when top_k <= K restricts the support to it (the tempered normaliser and the min_p/top_p cut
    then need no token outside it)."""
    if source == "reference":
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

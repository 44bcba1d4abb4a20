"""The OpenAI-compatible shapes every caller shares (pure: no transport): the first choice of an
answer, the body and the answer of vLLM's ``/tokenize``, the server's own error sentence."""

from __future__ import annotations

import json
from typing import Any

from specadapt.errors import NotAServer
from specadapt.records import Prompt


def first_choice(data: Any, who: str = "the server") -> dict[str, Any]:
    """``data["choices"][0]`` of a (streamed chunk or whole) completion or chat completion, or
    NotAServer with one line saying what is missing."""
    choices = data.get("choices") if isinstance(data, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise NotAServer(f"{who} answered without a choice (no 'choices[0]' object): not an OpenAI-compatible "
                         "completion")
    return choices[0]


def tokenize_body(prompt: Prompt, model: str) -> dict[str, Any]:
    """vLLM's POST /tokenize body: chat messages with the chat template and the generation prompt."""
    if prompt.api == "chat":
        return {"model": model, "messages": [m.model_dump() for m in prompt.messages or []],
                "add_generation_prompt": True}
    return {"model": model, "prompt": prompt.prompt}


def parse_tokenize(data: Any) -> list[int]:
    """The ``tokens`` (ints) of a /tokenize answer, or NotAServer."""
    tokens = data.get("tokens") if isinstance(data, dict) else None
    if not isinstance(tokens, list) or not tokens or not all(isinstance(t, int) for t in tokens):
        raise NotAServer("the server's /tokenize answer has no list of token ids ('tokens')")
    return list(tokens)


def detokenize_body(model: str, tokens: list[int]) -> dict[str, Any]:
    """vLLM's POST /detokenize body."""
    return {"model": model, "tokens": list(tokens)}


def parse_detokenize(data: Any) -> str | None:
    """The text (``prompt``) of a /detokenize answer, or None."""
    text = data.get("prompt") if isinstance(data, dict) else None
    return text if isinstance(text, str) else None


def error_message(body: bytes | str) -> str:
    """The server's own error sentence in a non-2xx body (vLLM: {"error": {"message"}}; also
    {"error": "..."}, {"message"}, {"detail"}), else the body itself; on one line, at most 300
    characters, "no detail" for an empty body."""
    text = body.decode(errors="replace") if isinstance(body, bytes) else body
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    msg = None
    if isinstance(data, dict):
        err = data.get("error")
        msg = err.get("message") if isinstance(err, dict) else (err if isinstance(err, str) else None)
        msg = msg or data.get("message") or data.get("detail")
    text = str(msg) if msg else text
    return " ".join(text.split())[:300] or "no detail"


__all__ = ["detokenize_body", "error_message", "first_choice", "parse_detokenize", "parse_tokenize",
           "tokenize_body"]

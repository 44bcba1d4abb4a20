"""Stop strings, checked on the output text after every engine step, as vLLM's output
processor checks them (vLLM 0.32, ``vllm/v1/engine/detokenizer.py``).

A step may append several tokens (an accepted draft chunk). Their text is appended and
only the new part is searched (from the end of the old text minus the longest stop
string's length plus one, so a stop string that straddles the boundary is found). Of the
stop strings found, the one that *ends* earliest wins (ties: the order of the list), so a
chunk gives the same result as one token at a time. At a match the text is cut before
the stop string (after it with ``include_stop_str_in_output``) and the tokens after the
one that completed the stop string are dropped: vLLM reports those kept tokens, the
completing one included, in ``completion_tokens``. ``min_tokens``: the first
``min_tokens`` tokens' text cannot complete a stop string (vLLM searches only text that
ends after them). A step that ended on a stop token (EOS or a stop token id) does not add
that token's text unless ``include_stop_str_in_output``.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from specadapt.native_reference.detok import IncrementalDetokenizer


class StopStrings:
    """One request's output text and its stop-string check."""

    def __init__(self, tokenizer, stop: Sequence[str], include_in_output: bool = False, min_tokens: int = 0,
                 skip_special_tokens: bool = True):
        self.stop = tuple(stop)
        self.include = include_in_output
        self.min_tokens = min_tokens
        self.detok = IncrementalDetokenizer(tokenizer, skip_special_tokens)
        self.text = ""  # the output text so far, cut at a matched stop string
        self.tokens = 0  # output tokens counted so far (a skipped stop token included)
        self.matched: str | None = None

    @property
    def hold_back(self) -> int:
        """Characters a stream holds back while the request runs (vLLM's stop buffer): the
        end of the text may be the start of a stop string that will be cut."""
        if not self.stop or self.include:
            return 0
        return max(len(s) for s in self.stop) - 1

    def update(self, new: Sequence[int], stop_terminated: bool = False) -> tuple[int, str | None]:
        """Add one step's tokens; returns (how many of them to keep, the stop string matched
        or None). ``stop_terminated``: the last token is a stop token (its text is left
        out unless include_stop_str_in_output)."""
        if not new:
            return 0, None
        before = self.tokens
        offsets = self.append(new, stop_terminated)
        found = self.first_stop(before, offsets)
        if found is None:
            return len(new), None
        stop, start, kept = found
        self.cut(stop, start, before + kept)
        return kept, stop

    def append(self, new: Sequence[int], stop_terminated: bool = False) -> list[int]:
        """Append the text of ``new`` (not empty) and count its tokens; returns the text's
        length before each of them and after the last (the end of a skipped stop token's
        text is the end of the text)."""
        texted = list(new[:-1]) if stop_terminated and not self.include else list(new)
        offsets = [len(self.text)]
        for tid in texted:
            self.text += self.detok.add([tid])
            offsets.append(len(self.text))
        if len(texted) < len(new):
            offsets.append(len(self.text))
        self.tokens += len(new)
        return offsets

    def first_stop(self, before: int, offsets: list[int]) -> tuple[str, int, int] | None:
        """After ``append`` (``before``: the tokens counted before it, ``offsets``: what it
        returned): the stop string that ends earliest in the new text, its start, and how
        many of the appended tokens it takes to complete it; None if none is found (or the
        text is still within min_tokens)."""
        if not self.stop or self.tokens <= self.min_tokens:
            return None
        match = self._search(offsets[max(self.min_tokens - before, 0)])
        if match is None:
            return None
        stop, start = match
        return stop, start, bisect.bisect_left(offsets, start + len(stop), lo=1)

    def cut(self, stop: str, start: int, tokens: int) -> None:
        """End the output at the stop string found at ``start``: the text cut before it
        (after it with include_stop_str_in_output), ``tokens`` output tokens counted."""
        self.matched = stop
        self.text = self.text[:start + len(stop)] if self.include else self.text[:start]
        self.tokens = tokens

    def _search(self, checked: int) -> tuple[str, int] | None:
        """The stop string that ends earliest in the text after ``checked`` (a character
        offset: text before it was searched already), with its start."""
        best: tuple[str, int] | None = None
        for stop in self.stop:
            start = self.text.find(stop, max(0, checked - len(stop) + 1))
            if start != -1 and (best is None or start + len(stop) < best[1] + len(best[0])):
                best = (stop, start)
        return best

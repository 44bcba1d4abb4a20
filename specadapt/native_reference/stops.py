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

    def update(self, new: Sequence[int], stop_terminated: bool = False,
               keep_chunk: bool = False) -> tuple[int, str | None]:
        """Add one step's tokens; returns (how many of them to keep, the stop string matched
        or None). ``stop_terminated``: the last token is a stop token (its text is left
        out unless include_stop_str_in_output). ``keep_chunk`` (the stop-in-chunk fault):
        a stop string completed before the chunk's last token neither cuts the text nor
        drops the tokens after it."""
        if not new:
            return 0, None
        texted = list(new[:-1]) if stop_terminated and not self.include else list(new)
        offsets = [len(self.text)]
        for tid in texted:
            self.text += self.detok.add([tid])
            offsets.append(len(self.text))
        if len(texted) < len(new):
            offsets.append(len(self.text))
        before = self.tokens
        self.tokens += len(new)
        if not self.stop or self.tokens <= self.min_tokens:
            return len(new), None
        match = self._search(offsets[max(self.min_tokens - before, 0)])
        if match is None:
            return len(new), None
        stop, start = match
        end = start + len(stop)
        kept = bisect.bisect_left(offsets, end, lo=1)
        self.matched = stop
        if keep_chunk and kept < len(new):
            return len(new), stop  # the bug: the chunk is kept whole, stop string and all
        self.text = self.text[:end] if self.include else self.text[:start]
        self.tokens = before + kept
        return kept, stop

    def _search(self, checked: int) -> tuple[str, int] | None:
        """The stop string that ends earliest in the text after ``checked`` (a character
        offset: text before it was searched already), with its start."""
        best: tuple[str, int] | None = None
        for stop in self.stop:
            start = self.text.find(stop, max(0, checked - len(stop) + 1))
            if start != -1 and (best is None or start + len(stop) < best[1] + len(best[0])):
                best = (stop, start)
        return best

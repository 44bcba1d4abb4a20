"""Incremental detokenization: the text of a growing list of token ids, as deltas.

Decoding the whole completion again for every streamed chunk costs O(n) per chunk and
O(n^2) per request. The technique vLLM and TGI use instead decodes a short window: the
ids from ``prefix`` on, where ``prefix .. read`` are the ids of the previous delta (kept
as context, since some decoders render a token differently at the start of a text, e.g.
SentencePiece drops the leading space) and ``read ..`` the ids not emitted yet. The delta
is the window's text after the text of the context ids alone. Text that ends in U+FFFD
may end in the first bytes of a multi-byte character: it is not emitted. Unlike vLLM and
TGI, which then hold back the whole chunk, the window is also decoded without its last
1, 2 and 3 ids (an unfinished character is at most 3 bytes, so it began in one of the
last 3 ids that carry bytes) and the longest of those texts that ends clean is emitted;
with CJK or emoji text and chunks of several ids this keeps both the latency and the
window short. Once a delta is emitted, ``prefix`` moves to the old ``read`` and ``read``
to the end of what was emitted.

Why the deltas add up to ``tokenizer.decode(all_ids)``: a window starts only where the
text before it ended in a complete character. For byte-level BPE decoders (GPT-2,
LLaMA-3, SmolLM2, Qwen2) decoding is "concatenate the tokens' bytes, skipping special
tokens when asked, then UTF-8 with replacement", and a UTF-8 decoder that has just ended
a character decodes the rest exactly as it would alone; so the text of the whole
sequence is the text up to the window plus the window's text. A decoder with non-local
post-processing (``clean_up_tokenization_spaces``: " ." -> ".") can differ at a delta
boundary; ``flush`` then still returns what is left of the window, not a correction.

Held back text is emitted by a later ``add`` once the text ends clean, or by ``flush``.
Where it never ends clean (a stream of invalid bytes, each one U+FFFD for good, or only
skipped special tokens), the window grows until it does: correct, but each ``add`` then
decodes the whole held-back part again.
"""

from __future__ import annotations

REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    """Streaming text for one completion: ``add`` ids, get the new text; ``flush`` at the end."""

    def __init__(self, tokenizer, skip_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids: list[int] = []
        self._prefix = 0  # window start: the ids of the previous delta, kept as context
        self._read = 0  # ids before this are emitted
        self._prefix_text = ""  # the text of ids[prefix:read] alone
        self._pieces: list[str] = []

    @property
    def text(self) -> str:
        """Everything emitted so far (deltas and flushes)."""
        if len(self._pieces) > 1:
            self._pieces = ["".join(self._pieces)]
        return self._pieces[0] if self._pieces else ""

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def _emit(self, delta: str) -> str:
        if delta:
            self._pieces.append(delta)
        return delta

    def add(self, ids: list[int]) -> str:
        """Append ``ids``; return the text they complete ("" while a character is unfinished
        or the ids decode to nothing, such as skipped special tokens)."""
        self.ids.extend(int(i) for i in ids)
        if len(self.ids) == self._read:
            return ""
        end = len(self.ids)
        window = self._decode(self.ids[self._prefix:end])
        if window.endswith(REPLACEMENT):
            # An unfinished character has at most 3 bytes, so without special tokens in
            # between it began in one of the last 3 ids: cut before each of them, latest
            # first, and emit up to the first cut whose text ends clean.
            for cut in range(end - 1, max(self._read, end - 4), -1):
                window = self._decode(self.ids[self._prefix:cut])
                if not window.endswith(REPLACEMENT):
                    end = cut
                    break
            else:
                return ""  # wait for the ids that finish it
        if len(window) <= len(self._prefix_text):
            return ""  # nothing new yet (only skipped special tokens)
        delta = window[len(self._prefix_text):]
        self._prefix, self._read = self._read, end
        self._prefix_text = self._decode(self.ids[self._prefix:self._read])
        return self._emit(delta)

    def flush(self) -> str:
        """The text still held back (an unfinished or invalid last character decodes to
        U+FFFD, as a full decode renders it); afterwards everything added is emitted."""
        if len(self.ids) == self._read:
            return ""
        window = self._decode(self.ids[self._prefix:])
        delta = window[len(self._prefix_text):]
        self._prefix, self._read = self._read, len(self.ids)
        self._prefix_text = self._decode(self.ids[self._prefix:self._read])
        return self._emit(delta)

"""Incremental prompt lookup over one growing token sequence.

``proposers.ngram_lookup`` rescans the whole sequence for every proposal: O(length * n)
per call, so a long generation pays O(length^2) in total. ``NgramIndex`` keeps, for every
n in the window, a dict from each n-gram seen so far to the start of its earliest
occurrence. Appending a token adds at most one entry per n (``setdefault``: the earliest
start stays), and a proposal is one dict lookup per n, independent of the length.

The answer is the same as ``ngram_lookup`` on the whole sequence: the up to k tokens after
the earliest earlier occurrence of the longest suffix n-gram (n from max_n down to min_n).
The suffix itself is always in its dict; when its earliest start is the suffix's own
position (``len - n``) it has no earlier occurrence and the next shorter n is tried.
"""

from __future__ import annotations

from specadapt.errors import UsageError


class NgramIndex:
    """Prompt lookup for a sequence that only ever grows (``extend``), one dict per n."""

    def __init__(self, min_n: int = 1, max_n: int = 4):
        if not 1 <= min_n <= max_n:
            raise UsageError(f"n-gram window {min_n}..{max_n} is empty: need 1 <= min <= max")
        self.min_n, self.max_n = min_n, max_n
        self.tokens: list[int] = []
        # first[n - min_n]: n-gram tuple -> start of its earliest occurrence
        self._first: list[dict[tuple[int, ...], int]] = [{} for _ in range(min_n, max_n + 1)]

    def __len__(self) -> int:
        return len(self.tokens)

    def extend(self, tokens: list[int]) -> None:
        """Append ``tokens``: O(max_n) dict updates per token, whatever the length so far."""
        seq = self.tokens
        for tok in tokens:
            seq.append(tok)
            end = len(seq)
            for n in range(self.min_n, min(self.max_n, end) + 1):
                self._first[n - self.min_n].setdefault(tuple(seq[end - n:]), end - n)

    def propose(self, k: int) -> list[int]:
        """What ``ngram_lookup(self.tokens, k, min_n, max_n)`` returns, in O(max_n) lookups."""
        seq = self.tokens
        size = len(seq)
        for n in range(min(self.max_n, size - 1), self.min_n - 1, -1):
            start = self._first[n - self.min_n][tuple(seq[size - n:])]
            if start < size - n:  # an occurrence before the suffix itself (it may overlap it)
                return seq[start + n:start + n + k]
        return []

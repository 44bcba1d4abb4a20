"""NgramIndex answers exactly what ngram_lookup answers, for every prefix fed in any chunks."""

from __future__ import annotations

import random

import pytest

from specadapt.errors import UsageError
from specadapt.native_reference.ngram import NgramIndex
from specadapt.native_reference.proposers import ngram_lookup

WINDOWS = [(1, 1), (1, 4), (2, 4), (3, 3)]


def chunks(rng: random.Random, seq: list[int]):
    i = 0
    while i < len(seq):
        size = rng.randint(1, 7)
        yield seq[i:i + size]
        i += size


@pytest.mark.parametrize("min_n,max_n", WINDOWS)
def test_matches_ngram_lookup_on_random_sequences(min_n, max_n):
    rng = random.Random(1000 * min_n + max_n)
    checked = hits = 0
    for _ in range(300):
        alphabet = rng.randint(2, 5)
        seq = [rng.randrange(alphabet) for _ in range(rng.randint(0, 60))]
        index = NgramIndex(min_n, max_n)
        for k in range(1, 6):  # the empty sequence too, before any chunk
            assert index.propose(k) == ngram_lookup([], k, min_n, max_n) == []
        for part in chunks(rng, seq):
            index.extend(part)
            prefix = seq[:len(index)]
            assert index.tokens == prefix
            for k in range(1, 6):
                want = ngram_lookup(prefix, k, min_n, max_n)
                assert index.propose(k) == want, (prefix, k)
                checked += 1
                hits += bool(want)
    assert hits > checked // 3  # small alphabets: many prefixes have a match


def test_empty_chunks_change_nothing():
    index = NgramIndex(1, 3)
    index.extend([])
    assert index.propose(3) == [] and len(index) == 0
    index.extend([5, 6, 5])
    index.extend([])
    assert index.propose(3) == [6, 5] == ngram_lookup([5, 6, 5], 3, 1, 3)


def test_overlapping_match():
    # [1,1,1,1]: the suffix 1,1,1 first occurs at 0, overlapping the suffix at 1
    index = NgramIndex(1, 4)
    index.extend([1, 1, 1, 1])
    assert index.propose(1) == [1]
    assert index.propose(5) == [1] == ngram_lookup([1, 1, 1, 1], 5, 1, 4)


def test_no_match():
    index = NgramIndex(1, 4)
    index.extend([1, 2, 3, 4])
    assert index.propose(4) == [] == ngram_lookup([1, 2, 3, 4], 4, 1, 4)
    index = NgramIndex(2, 2)
    index.extend([1, 2, 1, 3])  # "1" recurs, but min_n is 2 and "1 3" does not
    assert index.propose(4) == []


def test_match_at_the_very_start():
    seq = [7, 8, 9, 1, 2, 7, 8]
    index = NgramIndex(1, 4)
    index.extend(seq)
    assert index.propose(3) == [9, 1, 2] == ngram_lookup(seq, 3, 1, 4)


def test_earliest_occurrence_and_longest_n_win():
    # the suffix "2 3" occurs at 1, 4 and 7 (no longer suffix recurs): the earliest, 1, is used
    seq = [1, 2, 3, 4, 2, 3, 5, 2, 3]
    index = NgramIndex(1, 4)
    index.extend(seq[:4])
    index.extend(seq[4:])
    assert index.propose(2) == [4, 2] == ngram_lookup(seq, 2, 1, 4)
    # a longer n that matches later beats a shorter one that matches earlier
    seq = [2, 7, 5, 1, 2, 8, 5, 1, 2]  # "5 1 2" at 2 is followed by 8, "2" at 0 by 7
    index = NgramIndex(1, 3)
    index.extend(seq)
    assert index.propose(1) == [8] == ngram_lookup(seq, 1, 1, 3)


def test_only_the_suffix_itself_is_no_match():
    index = NgramIndex(3, 3)
    index.extend([4, 5, 6])
    assert index.propose(2) == []  # the only occurrence of 4 5 6 is the suffix
    index.extend([4, 5, 6])
    assert index.propose(2) == [4, 5]


@pytest.mark.parametrize("min_n,max_n", [(0, 3), (3, 2), (-1, 1)])
def test_empty_window_refused(min_n, max_n):
    with pytest.raises(UsageError, match="is empty"):
        NgramIndex(min_n, max_n)

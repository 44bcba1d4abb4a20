"""Time per n-gram proposal: the rescanning ngram_lookup against the incremental NgramIndex.

    .venv/bin/python benchmarks/ngram_lookup.py [--lengths 256 1024 4096] [--k 4]

At each sequence length L, a seeded token sequence of length L is built over two alphabets:
"text-like" (200 symbols: short suffixes recur, the lookup stops at the first few starts)
and "no match" (32000 symbols: nothing recurs, the old lookup scans every start for
every n). "old" is one ``ngram_lookup(seq, k, 1, 4)`` on the whole sequence; "new" is one
decode step of ``NgramIndex``: ``extend`` by one token, then ``propose(k)`` (the index
already holds the L tokens before it; building it is reported once, per token).
Not a test: it prints a table and asserts only that both give the same answer.
"""

from __future__ import annotations

import argparse
import platform
import random
import time

from specadapt.native_reference.ngram import NgramIndex
from specadapt.native_reference.proposers import ngram_lookup

MIN_N, MAX_N = 1, 4


def per_call(fn, budget_s: float = 0.3) -> float:
    """Seconds per call of ``fn``: repeat until ``budget_s`` has passed, best of 3 rounds."""
    best = float("inf")
    for _ in range(3):
        calls, start = 0, time.perf_counter()
        while True:
            fn()
            calls += 1
            spent = time.perf_counter() - start
            if spent >= budget_s / 3:
                break
        best = min(best, spent / calls)
    return best


def measure(alphabet: int, length: int, k: int) -> tuple[float, float, float]:
    """(old s/proposal, new s/decode step, index build s/token) at ``length`` + 1 tokens."""
    rng = random.Random(length * 7 + alphabet)
    seq = [rng.randrange(alphabet) for _ in range(length + 1)]
    head, last = seq[:length], seq[length]

    build = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        index = NgramIndex(MIN_N, MAX_N)
        index.extend(head)
        build = min(build, (time.perf_counter() - start) / length)

    def step() -> list[int]:
        # one decode step: append a token and propose. The token is popped again so that
        # every call sees length + 1; the dict entries it added stay, and re-adding them
        # is what the first call did (setdefault keeps the same starts).
        index.extend([last])
        out = index.propose(k)
        index.tokens.pop()
        return out

    assert step() == ngram_lookup(seq, k, MIN_N, MAX_N)
    return per_call(lambda: ngram_lookup(seq, k, MIN_N, MAX_N)), per_call(step), build


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lengths", type=int, nargs="+", default=[256, 1024, 4096])
    ap.add_argument("--k", type=int, default=4)
    args = ap.parse_args()
    print(f"# python {platform.python_version()} on {platform.machine()}; window {MIN_N}..{MAX_N}, k={args.k}")
    print(f"{'sequence':>10} {'length':>7} {'old us/prop':>12} {'new us/prop':>12} {'speedup':>8} "
          f"{'index build us/token':>21}")
    for name, alphabet in (("text-like", 200), ("no match", 32000)):
        for length in args.lengths:
            old, new, build = measure(alphabet, length, args.k)
            print(f"{name:>10} {length + 1:>7} {old * 1e6:>12.1f} {new * 1e6:>12.2f} {old / new:>7.0f}x "
                  f"{build * 1e6:>21.2f}")


if __name__ == "__main__":
    main()

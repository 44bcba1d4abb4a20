"""`equiv --sampling --until-decided` against the fixed design, by simulation (not a test).

Tokens are drawn at each position from one of 8 fixed 40-token distributions p (chosen at random
per position), or, for a faulty sampler, from p^(1/T) renormalised (the wrong temperature T); the
source gives the top K = 20 of p. A run is N tokens (the fixed design), tested once at alpha; the
same tokens in 4 looks of N/4 (cumulative) are tested at alpha/6 at looks 1-3, stopping at the
first rejection, and at alpha/2 at look 4 (analysis/sampling_stats.py ``look_alphas``). Both use
the real verdict (``verdict_from_arrays``: the three tests, each at a third of the look's alpha).
Printed per T: how often each design rejects (false alarms at T = 1, power otherwise) with a 95%
Clopper-Pearson interval, and the mean share of the fixed design's tokens the looks used.

    .venv/bin/python benchmarks/sampling_looks.py [--runs 400] [--tokens 1024] [--alpha 0.01]
"""

from __future__ import annotations

import argparse
import datetime
import platform

import numpy as np
from scipy.stats import binomtest

from specadapt.analysis.sampling_stats import DrawArrays, look_alphas, verdict_from_arrays

VOCAB, K, LOOKS = 40, 20, 4


def distributions(seed: int = 0) -> np.ndarray:
    logits = np.random.default_rng(seed).normal(size=(8, VOCAB)) * 2.0
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    return p / p.sum(axis=1, keepdims=True)


def run_tokens(rng: np.random.Generator, dists: np.ndarray, n: int, temperature: float) -> DrawArrays:
    which = rng.integers(0, len(dists), n)
    p = dists[which]
    q = p ** (1 / temperature)
    q /= q.sum(axis=1, keepdims=True)
    tokens = np.minimum((q.cumsum(axis=1) < rng.random((n, 1))).sum(axis=1), VOCAB - 1)
    order = np.argsort(-p, axis=1, kind="stable")
    probs = np.take_along_axis(p, order, axis=1)[:, :K]
    ranks = np.argmax(order == tokens[:, None], axis=1)
    rank = np.where(ranks < K, ranks, -1)
    return DrawArrays(probs, rank, np.zeros(n, dtype=bool))


def part(arrays: DrawArrays, n: int) -> DrawArrays:
    return DrawArrays(arrays.probs[:n], arrays.rank[:n], arrays.zero_probability[:n])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=400)
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--alpha", type=float, default=0.01)
    ap.add_argument("--temperatures", default="1.0,0.95,0.9,0.85,0.8,0.7")
    args = ap.parse_args()
    dists = distributions()
    alphas = look_alphas(args.alpha, LOOKS)
    cuts = [args.tokens * (i + 1) // LOOKS for i in range(LOOKS)]
    print(f"# {datetime.date.today()} {platform.machine()} {platform.processor() or ''}; runs {args.runs}, "
          f"{args.tokens} tokens, alpha {args.alpha:g}, looks {LOOKS} at {', '.join(f'{a:.3g}' for a in alphas)}")
    print("| T | fixed design rejects | 4 looks reject | looks' mean share of the tokens |")
    print("| --- | --- | --- | --- |")
    for t in (float(x) for x in args.temperatures.split(",")):
        rng = np.random.default_rng(int(t * 1000))
        fixed = seq = 0
        used = []
        for r in range(args.runs):
            arrays = run_tokens(rng, dists, args.tokens, t)
            fixed += verdict_from_arrays(arrays, alpha=args.alpha, seed=r).status == "inconsistent"
            for look, (n, a) in enumerate(zip(cuts, alphas, strict=True), start=1):
                if verdict_from_arrays(part(arrays, n), alpha=a, seed=r).status == "inconsistent":
                    seq += 1
                    break
            used.append(n / args.tokens)

        def ci(x: int) -> str:
            lo, hi = binomtest(x, args.runs).proportion_ci(0.95)
            return f"{x / args.runs:.3f} [{lo:.3f}, {hi:.3f}]"

        print(f"| {t:g} | {ci(fixed)} | {ci(seq)} | {np.mean(used):.2f} |")


if __name__ == "__main__":
    main()

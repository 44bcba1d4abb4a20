"""A/A through the whole analysis: two identical sides on a machine whose state is shared by
the requests of a block (and by the two requests of a back-to-back pair), simulated.

This is the situation in which compare once called two identical servers 1.02x [1.01, 1.04]
"faster" at concurrency 16: the requests inside a block are not independent, so intervals
over request pairs are far too narrow. Over blocks, an interval misses 1.0 in about 5% of
A/A runs, as a 95% interval should. Also the A/A benchmark's subset evaluation
(benchmarks/aa_check.py), on synthetic reports.
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import numpy as np
import pytest

from specadapt.probes.compare import analyse, pair_records
from specadapt.probes.stats import MIN_UNITS, log_rate_ratio, ratio_ci
from specadapt.records import CompareReport, CompareSettings, RatioCI, RequestRecord, ServerInfo

MS = 1_000_000
PROMPTS = 4
TOKENS = 24


def request(side, pid, repeat, level, replica, tpot_ms, sent_ms=0.0) -> RequestRecord:
    ttft = 30.0
    chunk = [int((ttft + i * tpot_ms) * MS) for i in range(TOKENS)]
    return RequestRecord(prompt_id=pid, category="c", api="completions", side=side, repeat=repeat,
                         concurrency=level, replica=replica, ok=True, sent_at_ns=int(sent_ms * MS), chunk_ns=chunk,
                         chunk_tokens=[1] * TOKENS, output_tokens=TOKENS, e2e_ns=chunk[-1] + MS)


def aa_report(rng, repeats: int, level: int = 8, copies: int = 4, block_sd: float = 0.05,
              pair_sd: float = 0.05, request_sd: float = 0.01) -> CompareReport:
    """Identical sides. Concurrency 1: each back-to-back pair shares a state (sd ``pair_sd``).
    Concurrency ``level``: each block (one side, one repeat) has its own state (sd
    ``block_sd``) shared by all its requests; each request adds its own noise."""
    base = {f"p{k}": 10.0 * (1 + k) for k in range(PROMPTS)}  # prompts differ 4x in speed
    recs = []
    for r in range(repeats):
        for pid, b in base.items():
            state = rng.normal(0, pair_sd)
            for side in ("off", "on"):
                recs.append(request(side, pid, r, 1, 0, b * math.exp(state + rng.normal(0, request_sd))))
        for side in ("off", "on"):
            state = rng.normal(0, block_sd)
            for cp in range(copies):
                for pid, b in base.items():
                    recs.append(request(side, pid, r, level, cp, b * math.exp(state + rng.normal(0, request_sd))))
    info = ServerInfo(backend="fake", base_url="http://x", model_id="m", spec_enabled=True)
    report = CompareReport(settings=CompareSettings(concurrency=[1, level], repeat=repeats), off_server=info,
                           on_server=info, requests=recs)
    analyse(report)
    return report


def misses(r: RatioCI) -> bool:
    return r.low is not None and not (r.low <= 1.0 <= r.high)


def test_block_intervals_miss_1_in_about_5_percent_of_aa_runs_and_pair_intervals_far_more():
    rng = np.random.default_rng(2026)
    runs, repeats = 100, MIN_UNITS + 1
    block_miss = pair_miss = one_miss = 0
    for _ in range(runs):
        report = aa_report(rng, repeats)
        one, eight = report.levels
        assert (eight.speed.throughput.unit, eight.speed.throughput.n) == ("blocks", repeats)
        assert (one.speed.throughput.unit, one.speed.throughput.n) == ("pairs", repeats * PROMPTS)
        block_miss += misses(eight.speed.throughput)
        one_miss += misses(one.speed.throughput)
        # what the old analysis did: every request pair at concurrency 8 one unit
        pairs = pair_records(report.requests, 8)
        per_pair = ratio_ci([log_rate_ratio(a.output_tokens, a.e2e_ns, b.output_tokens, b.e2e_ns) for a, b in pairs],
                            "pairs")
        pair_miss += misses(per_pair)
    # binomial sd of a 5% rate over 100 runs: 2.2% (seeded: the same runs every time)
    assert block_miss / runs <= 0.10, block_miss
    assert one_miss / runs <= 0.10, one_miss
    assert pair_miss / runs >= 0.5, pair_miss


def test_no_faster_verdict_in_aa_with_too_few_blocks():
    """--repeat 3: three blocks per side at concurrency 8 give no interval and no verdict there."""
    report = aa_report(np.random.default_rng(1), repeats=3)
    eight = report.levels[1]
    assert eight.speed.throughput.too_few and eight.speed.throughput.n == 3
    assert report.crossover.verdicts[8] == "no clear difference"


@pytest.fixture(scope="module")
def aa_check():
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "aa_check.py"
    if not path.exists():  # mutation testing copies the package and the tests, not benchmarks/
        pytest.skip(f"{path} is not in this copy of the repository")
    spec = importlib.util.spec_from_file_location("aa_check", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_aa_check_cuts_disjoint_runs_of_repeats(aa_check):
    assert aa_check.subsets(7, 2) == [[0, 1], [2, 3], [4, 5]]
    assert aa_check.subsets(6, 3) == [[0, 1, 2], [3, 4, 5]]
    assert aa_check.subsets(4, 5) == []


def test_aa_check_analyses_each_subset_like_a_run_of_its_repeats(aa_check):
    report = aa_report(np.random.default_rng(3), repeats=10)
    sub = aa_check.sub_report(report, [5, 6, 7, 8, 9])
    assert sub.settings.repeat == 5 and {r.repeat for r in sub.requests} == {5, 6, 7, 8, 9}
    one, eight = sub.levels
    assert (one.speed.tpot.n, eight.speed.tpot.n) == (5 * PROMPTS, 5)
    assert report.settings.repeat == 10 and len(report.levels[1].by_prompt) == PROMPTS  # the long run is untouched
    rows = {(row["level"], row["scope"]): row for row in aa_check.evaluate(report, 5)}
    level8 = rows[(8, "level")]
    assert level8["subsets"] == {0, 1} and level8["given"] == 2 * 3 and level8["too_few"] == 0
    assert rows[(1, "per prompt")]["given"] == 2 * PROMPTS * 3 and rows[(1, "per prompt")]["subsets"] == {0, 1}
    few = {(row["level"], row["scope"]): row for row in aa_check.evaluate(report, 2)}
    assert few[(8, "level")]["given"] == 0 and few[(8, "level")]["too_few"] == 5 * 3
    assert few[(8, "level")]["old_given"] == 5 * 3  # the old bootstrap gave an interval from 2 blocks


def test_the_old_bootstrap_is_the_range_of_two_pairs(aa_check):
    """The figure that problem 2 was about: with two pairs, the old interval spans their two ratios."""
    a = [request("off", "p", 0, 1, 0, 10.0), request("on", "p", 0, 1, 0, 9.0)]
    b = [request("off", "p", 1, 1, 0, 10.0), request("on", "p", 1, 1, 0, 11.0)]
    low, high = aa_check.old_bootstrap([tuple(a), tuple(b)], "tpot")
    r1, r2 = 10.0 / 9.0, 10.0 / 11.0  # tpot_ns uses (E2E - TTFT) / (tokens - 1): the scripted TPOT
    assert low == pytest.approx(r2, rel=0.01) and high == pytest.approx(r1, rel=0.01)

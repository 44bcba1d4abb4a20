"""compare's intervals pinned against an independent computation.

The expected interval of every ratio is computed here from the raw request records by other
means than the code under test: per-unit log ratios written out from the definitions in
docs/compare.md (TPOT = (E2E - first chunk) / (tokens - 1), a block's rate = its tokens over
first send to last end, a prompt's share of a block = its tokens over the sum of its E2E), the
95% interval by scipy.stats.t.interval over them, exponentiated. compare's ``low``/``high``
must equal it to rounding, at concurrency 1 (one unit per pair) and at N > 1 (one unit per
repeat's off block + on block), for the level and for each prompt. An interval two or three
times too wide, or too narrow, or over the wrong units fails here.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as sps

from specadapt.analysis.speed import analyse
from specadapt.records import CompareReport, CompareSettings, RequestRecord, ServerInfo

MS = 1_000_000
PROMPTS = ("p0", "p1", "p2")
LEVEL = 4
COPIES = 3  # copies of the prompt set per block (compare would send 3 for N=4 and 3 prompts)


def record(rng, side, pid, repeat, level, copy, sent_ms) -> RequestRecord:
    tokens = int(rng.integers(8, 40))
    ttft = rng.uniform(20, 60)
    gaps = rng.uniform(5, 25, size=tokens - 1)
    chunk = [int(ttft * MS)] + [int((ttft + g) * MS) for g in np.cumsum(gaps)]
    return RequestRecord(prompt_id=pid, category="open" if pid != "p2" else "grounded", api="completions",
                         side=side, repeat=repeat, concurrency=level, replica=copy, ok=True,
                         sent_at_ns=int(sent_ms * MS), chunk_ns=chunk, chunk_tokens=[1] * tokens,
                         output_tokens=tokens, e2e_ns=chunk[-1] + int(rng.uniform(0.1, 2) * MS))


def report_of(seed: int, repeats: int) -> CompareReport:
    rng = np.random.default_rng(seed)
    recs = []
    for r in range(repeats):
        for pid in PROMPTS:
            for side in ("off", "on"):
                recs.append(record(rng, side, pid, r, 1, 0, rng.uniform(0, 1000)))
        for side in ("off", "on"):
            start = rng.uniform(0, 5000)
            for cp in range(COPIES):
                for pid in PROMPTS:
                    recs.append(record(rng, side, pid, r, LEVEL, cp, start + rng.uniform(0, 300)))
    info = ServerInfo(backend="fake", base_url="http://x", model_id="m", spec_enabled=True)
    report = CompareReport(settings=CompareSettings(concurrency=[1, LEVEL], repeat=repeats), off_server=info,
                           on_server=info, requests=recs)
    analyse(report)
    return report


def tpot(r: RequestRecord) -> float:
    return (r.e2e_ns - r.chunk_ns[0]) / (r.output_tokens - 1)


def t_interval(d: list[float]) -> tuple[float, float, float]:
    """exp of the mean and of scipy's 95% t interval for the mean of the log ratios ``d``."""
    d = np.asarray(d, dtype=float)
    low, high = sps.t.interval(0.95, df=d.size - 1, loc=d.mean(), scale=sps.sem(d))
    return math.exp(d.mean()), math.exp(low), math.exp(high)


def side(recs, s):
    return [r for r in recs if r.side == s]


def latency_log(recs, f) -> float:
    off, on = side(recs, "off"), side(recs, "on")
    return math.log(np.mean([f(r) for r in off]) / np.mean([f(r) for r in on]))


def wall_rate(recs) -> float:
    return sum(r.output_tokens for r in recs) / (max(r.sent_at_ns + r.e2e_ns for r in recs)
                                                 - min(r.sent_at_ns for r in recs))


def share_rate(recs) -> float:
    return sum(r.output_tokens for r in recs) / sum(r.e2e_ns for r in recs)


def expected_units(report: CompareReport, level: int, pid: str | None) -> dict[str, list[float]]:
    """Per metric the units' log ratios, computed from the records alone."""
    recs = [r for r in report.requests if r.concurrency == level and (pid is None or r.prompt_id == pid)]
    if level == 1:  # one unit per (prompt, repeat) pair
        units = [[r for r in recs if (r.prompt_id, r.repeat) == key]
                 for key in sorted({(r.prompt_id, r.repeat) for r in recs})]
        rate = share_rate  # a pair's rate: its tokens over its E2E
    else:  # one unit per repeat: its off block + on block
        units = [[r for r in recs if r.repeat == rep] for rep in sorted({r.repeat for r in recs})]
        rate = wall_rate if pid is None else share_rate
    return {"tpot": [latency_log(u, tpot) for u in units],
            "e2e": [latency_log(u, lambda r: r.e2e_ns) for u in units],
            "throughput": [math.log(rate(side(u, "on")) / rate(side(u, "off"))) for u in units]}


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("repeats", [5, 8])
def test_every_interval_is_the_t_interval_over_independently_computed_unit_log_ratios(seed, repeats):
    report = report_of(seed, repeats)
    checked = 0
    for lv in report.levels:
        scopes = [(None, lv.speed)] + [(p.prompt_id, p.ratios) for p in lv.by_prompt]
        assert [pid for pid, _ in scopes[1:]] == list(PROMPTS)
        for pid, ratios in scopes:
            units = expected_units(report, lv.concurrency, pid)
            for metric, d in units.items():
                got = getattr(ratios, metric)
                point, low, high = t_interval(d)
                assert got.n == len(d) and got.unit == ("pairs" if lv.concurrency == 1 else "blocks")
                assert (got.point, got.low, got.high) == pytest.approx((point, low, high), rel=1e-9), (
                    lv.concurrency, pid, metric)
                checked += 1
    assert checked == 2 * (1 + len(PROMPTS)) * 3


def test_the_pinning_tells_a_widened_or_narrowed_interval_apart():
    """The tolerance is far tighter than any error worth catching: an interval 1% wider on the
    log scale is already outside it."""
    report = report_of(4, 6)
    d = expected_units(report, LEVEL, None)["throughput"]
    point, low, high = t_interval(d)
    got = report.levels[1].speed.throughput
    for factor in (0.99, 1.01, 3.0):
        wide_low = math.exp(math.log(point) - factor * (math.log(point) - math.log(low)))
        assert got.low != pytest.approx(wide_low, rel=1e-9)

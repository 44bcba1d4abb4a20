import random

import numpy as np
import pytest

from specadapt.analysis.latency import (
    itl_values_ns,
    latency_summary,
    percentile,
    summarize,
    tpot_ns,
)
from specadapt.records import RequestRecord
from builders import request


@pytest.mark.parametrize("q", [0, 1, 50, 90, 99, 100])
def test_percentile_matches_numpy(q):
    rng = random.Random(q)
    values = sorted(rng.uniform(0, 1000) for _ in range(rng.randint(1, 300)))
    assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))


def test_summarize_is_in_ms_and_empty_is_none():
    d = summarize([1_000_000, 3_000_000])
    assert (d.count, d.mean, d.min, d.max) == (2, 2.0, 1.0, 3.0)
    assert summarize([]).mean is None


def rec(chunk_ns, chunk_tokens, e2e, **kw):
    return request(chunk_ns=chunk_ns, chunk_tokens=chunk_tokens, e2e_ns=e2e, output_tokens=sum(chunk_tokens), **kw)


def test_itl_is_per_token_when_chunks_carry_several():
    r = rec([100, 200, 500], [1, 1, 3], 600)
    # gap 100 over 1 token, gap 300 over 3 tokens -> 100 each
    assert itl_values_ns(r) == [100, 100, 100, 100]
    assert r.ttft_ns == 100
    assert tpot_ns(r) == (600 - 100) / (5 - 1)


def test_tpot_undefined_for_one_token():
    assert tpot_ns(rec([100], [1], 120)) is None


def test_summary_counts_failures_and_rate():
    ok1 = rec([10**6], [10], 10**9, sent_at_ns=0)
    ok2 = rec([10**6], [30], 10**9, sent_at_ns=10**9)
    bad = RequestRecord(prompt_id="x", category="c", api="chat", ok=False, error="HTTP 500")
    s = latency_summary([ok1, ok2, bad])
    assert (s.requests, s.succeeded, s.failed, s.output_tokens) == (3, 2, 1, 40)
    assert s.duration_s == 2.0 and s.output_tokens_per_s == 20.0


def test_per_token_values_are_exact_for_every_token_source():
    # Times in ns from the send; chunks as a speculative server sends them (k=3: up to 4 tokens).
    r = rec([40_000_000, 52_000_000, 52_000_000, 100_000_000, 103_000_000], [2, 4, 1, 3, 1], 110_000_000)
    assert r.ttft_ns == 40_000_000 and r.output_tokens == 11
    assert itl_values_ns(r) == [3_000_000.0] * 4 + [0.0] + [16_000_000.0] * 3 + [3_000_000.0]
    assert sum(itl_values_ns(r)) == r.chunk_ns[-1] - r.ttft_ns  # the ITLs tile first -> last chunk
    assert tpot_ns(r) == (110_000_000 - 40_000_000) / 10 == 7_000_000.0
    s = latency_summary([r])
    assert (s.itl_ms.count, s.itl_ms.min, s.itl_ms.p50, s.itl_ms.max) == (9, 0.0, 3.0, 16.0)
    assert (s.ttft_ms.p50, s.tpot_ms.p50, s.e2e_ms.p50, s.tokens_per_chunk_mean) == (40.0, 7.0, 110.0, 11 / 5)


def test_a_gap_that_does_not_divide_is_split_evenly():
    r = rec([10, 110], [1, 3], 120)
    assert itl_values_ns(r) == [100 / 3] * 3 and tpot_ns(r) == (120 - 10) / 3


def test_percentile_of_nothing_is_an_error_that_says_so():
    with pytest.raises(ValueError, match="^percentile of no values$"):
        percentile([], 50)


def test_summarize_reports_each_percentile_at_its_own_rank():
    values_ns = [i * 1_000_000 for i in range(1, 102)]  # 1..101 ms: the q-th percentile is 1 + q ms
    d = summarize(reversed(values_ns))
    assert (d.count, d.p50, d.p90, d.p99, d.min, d.max, d.mean) == (101, 51.0, 91.0, 100.0, 1.0, 101.0, 51.0)


def test_tpot_is_defined_from_two_tokens_and_needs_both_times():
    assert tpot_ns(rec([100], [2], 300)) == 200.0
    assert tpot_ns(rec([100], [3], 300)) == 100.0
    no_first_token = RequestRecord(prompt_id="p", category="c", api="chat", ok=True, e2e_ns=300, output_tokens=5)
    assert tpot_ns(no_first_token) is None
    assert tpot_ns(rec([100], [3], None)) is None


def test_a_request_without_e2e_counts_no_time_and_zero_duration_has_no_rate():
    unfinished = RequestRecord(prompt_id="p", category="c", api="chat", ok=True, chunk_ns=[5], chunk_tokens=[1],
                               output_tokens=1, sent_at_ns=10**9)
    finished = rec([10**6], [4], 10**9, sent_at_ns=0)
    s = latency_summary([finished, unfinished])
    assert s.duration_s == 1.0 and s.output_tokens_per_s == 5.0
    only = latency_summary([unfinished])
    assert (only.duration_s, only.output_tokens_per_s) == (0.0, None)
    short = latency_summary([rec([10**5], [3], 5 * 10**8, sent_at_ns=0)])  # half a second: 6 tokens/s
    assert (short.duration_s, short.output_tokens_per_s) == (0.5, 6.0)


def test_no_successful_request_gives_empty_figures():
    bad = RequestRecord(prompt_id="x", category="c", api="chat", ok=False, error="HTTP 500")
    s = latency_summary([bad])
    assert (s.duration_s, s.output_tokens_per_s, s.tokens_per_chunk_mean, s.ttft_ms.count) == (0.0, None, None, 0)
    assert latency_summary([rec([10, 20], [2, 4], 30)]).tokens_per_chunk_mean == 3.0

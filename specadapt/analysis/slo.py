"""Service-level objectives per request, and goodput.

``--slo ttft=200ms,tpot=40ms,itl=50ms,e2e=2s``: limits in ms or s. A request meets an SLO
when it succeeded and its figure is within the limit (<=); it is *good* when it meets
every SLO given. No percentiles: each request is judged on its own.

- ttft, tpot, e2e: as ``vllm bench serve --goodput`` judges them (``vllm/benchmarks/serve.py``
  ``calculate_metrics``): the request's TTFT, TPOT = (E2E - TTFT) / (tokens - 1), E2E,
  each <= the limit; a request of one output token has TPOT 0. (vLLM calls E2E ``e2el``.)
- itl: vLLM has no ITL objective. specadapt's: *every* inter-token gap of the request
  (per token, as analysis/latency.py counts them) is within the limit, i.e. its largest ITL;
  a request without gaps (one chunk) meets it.

Goodput = good requests / the run's wall time (first scheduled or sent request to the last
one finished), in requests/s, as vLLM divides by its benchmark duration. Failed requests
are never good but count in the shares' denominators.

A/B: per unit (one off block + one on block) d = log(goodput_on / goodput_off); the ratio
is exp(mean d) with the t interval of analysis/stats.py. A unit where a side had no good
request has no finite d and is left out (the report counts such units). The share
difference on - off gets a t interval over the same units.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

from specadapt.analysis.latency import itl_values_ns, tpot_ns
from specadapt.analysis.stats import LEVEL, MIN_UNITS, log_rate_ratio, ratio_ci, t_bounds
from specadapt.errors import UsageError
from specadapt.records import RequestRecord
from specadapt.records.load import DiffCI, Goodput, GoodputComparison

METRICS = ("ttft", "tpot", "itl", "e2e")
_UNITS_MS = {"ms": 1.0, "s": 1000.0}
_VALUE = re.compile(r"^([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([a-z]*)$")


def parse_slo(value: str | None) -> dict[str, float]:
    """``ttft=200ms,e2e=2s`` -> {"ttft": 200.0, "e2e": 2000.0} (milliseconds); None/'' -> {}."""
    if value is None or not value.strip():
        return {}
    out: dict[str, float] = {}
    for part in value.split(","):
        part = part.strip()
        if not part:
            continue
        name, eq, raw = part.partition("=")
        name, raw = name.strip().lower(), raw.strip()
        if not eq:
            raise UsageError(f"--slo: {part!r} is not METRIC=LIMIT; write e.g. ttft=200ms,e2e=2s")
        if name not in METRICS:
            raise UsageError(f"--slo: unknown metric {name!r}; use {', '.join(METRICS)}")
        m = _VALUE.match(raw.lower())
        if not m:
            raise UsageError(f"--slo: {name}={raw!r} is not a number with a unit; write e.g. {name}=200ms")
        number, unit = float(m.group(1)), m.group(2)
        if not unit:
            raise UsageError(f"--slo: {name}={raw} needs a unit: {raw}ms or {raw}s")
        if unit not in _UNITS_MS:
            raise UsageError(f"--slo: {name}={raw}: unknown unit {unit!r}; use ms or s")
        if name in out:
            raise UsageError(f"--slo: {name} is given twice")
        out[name] = number * _UNITS_MS[unit]
    return out


def slo_text(slo_ms: dict[str, float]) -> str:
    """{"ttft": 200, "e2e": 2000} -> 'ttft<=200ms, e2e<=2000ms'."""
    return ", ".join(f"{k}<={v:g}ms" for k, v in slo_ms.items())


def request_value_ms(rec: RequestRecord, metric: str) -> float | None:
    """The request's figure for ``metric`` in ms (None: the request failed or has no such figure)."""
    if not rec.ok:
        return None
    if metric == "ttft":
        return rec.ttft_ns / 1e6 if rec.ttft_ns is not None else None
    if metric == "e2e":
        return rec.e2e_ns / 1e6 if rec.e2e_ns is not None else None
    if metric == "tpot":
        t = tpot_ns(rec)
        if t is None:
            return 0.0 if rec.output_tokens <= 1 else None  # one token: TPOT 0, as vLLM counts it
        return t / 1e6
    if metric == "itl":
        gaps = itl_values_ns(rec)
        return max(gaps) / 1e6 if gaps else 0.0
    raise ValueError(f"unknown metric {metric}")


def meets(rec: RequestRecord, slo_ms: dict[str, float]) -> dict[str, bool]:
    """Per SLO metric: whether the request met it (a failed request meets none)."""
    out = {}
    for metric, limit in slo_ms.items():
        v = request_value_ms(rec, metric)
        out[metric] = v is not None and v <= limit
    return out


def is_good(rec: RequestRecord, slo_ms: dict[str, float]) -> bool:
    return rec.ok and all(meets(rec, slo_ms).values())


def run_duration_s(records: Sequence[RequestRecord]) -> float:
    """Wall time of a run: its first scheduled (or sent) request to the end of its last one."""
    if not records:
        return 0.0
    start = min(r.scheduled_at_ns if r.scheduled_at_ns is not None else r.sent_at_ns for r in records)
    end = max(r.sent_at_ns + (r.e2e_ns or 0) for r in records)
    return max(0, end - start) / 1e9


def goodput_summary(records: Sequence[RequestRecord], slo_ms: dict[str, float],
                    duration_s: float | None = None) -> Goodput:
    """Goodput of ``records`` (one run, warm-up excluded by the caller)."""
    n = len(records)
    dur = run_duration_s(records) if duration_s is None else duration_s
    good = sum(1 for r in records if is_good(r, slo_ms))
    per = {m: sum(1 for r in records if meets(r, {m: lim})[m]) / n for m, lim in slo_ms.items()} if n else {}
    return Goodput(slo_ms=dict(slo_ms), requests=n, good=good, duration_s=dur,
                   goodput=good / dur if dur > 0 else None, share_good=good / n if n else None, share_per_slo=per)


def diff_ci(diffs: Sequence[float | None], level: float = LEVEL, min_units: int = MIN_UNITS) -> DiffCI:
    x = [d for d in diffs if d is not None and math.isfinite(d)]
    n = len(x)
    if n == 0:
        return DiffCI(point=None, too_few=True)
    if n < min_units:
        return DiffCI(point=sum(x) / n, n=n, too_few=True)
    low, mean, high = t_bounds(x, level)
    return DiffCI(point=float(mean), low=float(low), high=float(high), n=n)


def busy_duration_s(records: Sequence[RequestRecord]) -> float:
    """The time a side spent on ``records`` sent one at a time: the sum of their E2E."""
    return sum(r.e2e_ns or 0 for r in records) / 1e9


def compare_goodput(units: Sequence[tuple[Sequence[RequestRecord], Sequence[RequestRecord]]],
                    slo_ms: dict[str, float], busy_time: bool = False) -> GoodputComparison:
    """``units``: (off records, on records) of each unit. Totals over all units per side, the
    ratio and share difference over the units. A side's time in a unit is its block's wall
    time, or with ``busy_time`` (concurrency 1, the sides alternating request by request) the
    sum of its requests' E2E."""
    duration = busy_duration_s if busy_time else run_duration_s
    logs: list[float | None] = []
    diffs: list[float | None] = []
    empty = 0
    for off, on in units:
        g_off, g_on = goodput_summary(off, slo_ms, duration(off)), goodput_summary(on, slo_ms, duration(on))
        d = log_rate_ratio(g_off.good, g_off.duration_s, g_on.good, g_on.duration_s)
        if d is None:
            empty += 1
        logs.append(d)
        if g_off.share_good is not None and g_on.share_good is not None:
            diffs.append(g_on.share_good - g_off.share_good)
    all_off = [r for off, _ in units for r in off]
    all_on = [r for _, on in units for r in on]
    dur_off = sum(duration(off) for off, _ in units)
    dur_on = sum(duration(on) for _, on in units)
    return GoodputComparison(off=goodput_summary(all_off, slo_ms, dur_off), on=goodput_summary(all_on, slo_ms, dur_on),
                             ratio=ratio_ci(logs, "blocks"), share_difference=diff_ci(diffs), units_without_good=empty)

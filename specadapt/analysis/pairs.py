"""The records of one A/B level and their (off, on) pairs: the unit every ratio is built from.

Pure functions over request records (no I/O); compare's speed ratios and the diagnosis's TTFT
ratio both pair requests here.
"""

from __future__ import annotations

from specadapt.records import RequestRecord

Pair = tuple[RequestRecord, RequestRecord]


def pair_records(records: list[RequestRecord], level: int, rate: float | None = None) -> list[Pair]:
    """(off, on) pairs of the same prompt, repeat, copy and turn at one level (a concurrency, or
    with ``rate`` an arrival rate, whose records have concurrency 0); both must have succeeded."""
    keyed: dict[tuple, dict[str, RequestRecord]] = {}
    for r in level_records(records, level, rate):
        keyed.setdefault((r.prompt_id, r.repeat, r.replica, r.turn), {})[r.side] = r
    return [(v["off"], v["on"]) for v in keyed.values() if "off" in v and "on" in v and v["off"].ok and v["on"].ok]


def level_records(records: list[RequestRecord], level: int, rate: float | None = None) -> list[RequestRecord]:
    """The measured (not warm-up) records of one level."""
    if rate is not None:
        level = 0
    return [r for r in records if r.concurrency == level and r.request_rate == rate and not r.warmup]


def pair_key(r: RequestRecord) -> tuple:
    """What an off and an on record of one pair share, at any level: prompt, level, repeat, copy and turn."""
    return r.prompt_id, r.concurrency, r.request_rate, r.repeat, r.replica, r.turn


def sides_by_pair(records: list[RequestRecord]) -> dict[tuple, dict[str, RequestRecord]]:
    """The measured records that succeeded, by ``pair_key`` and then by side ("off", "on")."""
    keyed: dict[tuple, dict[str, RequestRecord]] = {}
    for r in records:
        if not r.warmup and r.ok:
            keyed.setdefault(pair_key(r), {})[r.side] = r
    return keyed

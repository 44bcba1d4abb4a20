"""The A/A check: two sides that are the same server must get no speed verdict.

Shared by the live A/A (tests/integration/test_aa_live.py, one spec-ON server given as both
sides, so speculation is present and a speed verdict is computed) and by the unit test that
proves the check fails when the interval code is broken (tests/unit/analysis/test_speed_aa.py), so both run
the very same assertions over the JSON report that ``specadapt compare --json`` writes.

Chance. Each interval that is given misses 1.0x in 5% of A/A runs by design. The check looks
at the intervals that verdicts are made on: each level's tokens/s, TPOT and E2E (strongly
correlated within a level), so a run with a miss comes in roughly 1 run of 10 per level. Each
prompt's intervals are in the report too, but with three prompts they would triple the chances
of a miss while adding no verdict, so they are not held to it. A run with a miss is run again,
up to ``ATTEMPTS`` runs: ``ATTEMPTS`` runs in a row with a miss (about 1 in 100 to 1 in 1000
for correct intervals on a machine whose load does not change from block to block) fail the
check. An interval made too narrow misses in almost every run, and fails it.

What it cannot tell apart: a neighbour whose load changes from one block to the next on a
shared machine. The intervals assume that the units' noise is independent; load that comes
and goes with the blocks breaks that, and then even an A/A misses (the intervals rightly say
the two blocks ran differently).
"""

from __future__ import annotations

from collections.abc import Callable

ATTEMPTS = 3
METRICS = ("throughput", "tpot", "e2e")


def intervals(report: dict, by_prompt: bool = False):
    """(where, metric, interval) for every level (and with ``by_prompt`` every prompt of every level)."""
    for lv in report["levels"]:
        scopes = [(f"concurrency {lv['concurrency']}", lv["speed"])] + [
            (f"concurrency {lv['concurrency']} {p['prompt_id']}", p["ratios"]) for p in lv["by_prompt"] if by_prompt]
        for where, ratios in scopes:
            for metric in METRICS:
                yield where, metric, ratios[metric]


def misses(report: dict, by_prompt: bool = False) -> list[str]:
    """The given intervals that do not cover 1.0x, each as a readable line."""
    return [f"{where} {metric}: {r['point']:.3f}x [{r['low']:.3f}, {r['high']:.3f}] over {r['n']} {r['unit']}"
            for where, metric, r in intervals(report, by_prompt)
            if not r["too_few"] and not r["low"] <= 1.0 <= r["high"]]


def check_aa(run: Callable[[int], dict], levels: list[int], units: dict[int, tuple[str, int]]) -> dict:
    """Run ``run(attempt)`` (a compare of one server against itself, as its JSON report) until a
    run has no interval that misses 1.0x, at most ATTEMPTS times; then check that speculation was
    seen (so a speed verdict was computed, not withheld), that every level got an interval over the
    expected units (``units[level] = (unit, n)``) and that no level was called faster or slower.
    Returns the report that passed."""
    seen = []
    for attempt in range(1, ATTEMPTS + 1):
        report = run(attempt)
        missed = misses(report)
        if not missed:
            break
        seen.append(missed)
    else:
        raise AssertionError(f"A/A intervals missed 1.0x in {ATTEMPTS} runs in a row: {seen}")
    by_level = {lv["concurrency"]: lv for lv in report["levels"]}
    assert sorted(by_level) == sorted(levels), sorted(by_level)
    for level, (unit, n) in units.items():
        for metric in METRICS:
            r = by_level[level]["speed"][metric]
            assert (r["unit"], r["n"], r["too_few"]) == (unit, n, False), (level, metric, r)
            assert r["verdict"] == "no clear difference", (level, metric, r)
    crossover = report["crossover"]
    assert crossover["status"] == "no-clear-difference", crossover
    assert set(crossover["verdicts"].values()) == {"no clear difference"}, crossover
    return report

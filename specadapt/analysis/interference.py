"""Interference between the sides: did the two servers of a compare stall each other's first token?

Two servers on one machine (the same cores, the same GPU) can hold each other up: a request that
comes right after the other server's request waits while that server still holds the hardware.
The first token takes the wait; the decode steps after it do not. A pure analysis of records: a
compare run's (the report's ``interference`` section) or the short check before it
(orchestration/interference_check.py), always the same rule.

Per side, over its measured requests with a first token (TTFT t_i, integer ns; n of them):
- typical      b = the median of the faster half (the ceil(n / 2) smallest t_i): it, and the MAD
               below, stand while more than half of the faster half (about a quarter of all the
               requests) did not stall
- margin       max(FLOOR, SPREAD x MAD), MAD = the median |t_i - b| over the faster half
- stall        t_i > b + margin, from MIN_SIDE requests on (fewer: no typical to stand on); its
               excess t_i - b; the side's stall size is the median excess of its stalls
- bimodal      at least MIN_CLUSTER stalls: a cluster of first tokens far above typical

Order (concurrency 1 with the sides interleaved): every request of both sides at concurrency 1 in
the order sent, warm-ups and failed requests too where the records hold them (turns never sent
left out). A measured request comes "after other" when the one sent just before it went to the
other side, "after same" when to its own side (the first one: neither, nothing is known before it).
If stalls have nothing to do with the order, a side's K_s stalls among its N_s classified requests
fall on the M_s after other at random: X_s, its stalls after other, is hypergeometric(N_s, K_s,
M_s). The statistic is T = X_off + X_on, its p-value P(T >= t) under the convolution of the two
(an exact test conditional on each side's counts, stratified by side):
- detected     p <= ALPHA. Its false-alarm rate is at most ALPHA when stalls come regardless of
               the order, and zero when nothing stalls.
- too few      fewer than MIN_ORDER classified requests after other or after same; or stalls so
               few that even all of them after other would give p > ALPHA (the least p-value)
- same size    both sides stall, their stall sizes within a factor SIMILAR of each other
- stall size   the median excess over every stall of both sides

Levels whose requests overlap (concurrency > 1, arrival rates) have no order to judge; each
side's stalls and bimodality are given per level. Sides run one after the other, Ray actors
(each block timed from its own start) and records without send times: order not judged.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from urllib.parse import urlsplit

from specadapt.adapters.hardware import is_loopback
from specadapt.records import CompareReport, RequestRecord
from specadapt.records.interference import InterferenceFinding, LevelStalls, OrderStatus, SideStalls, Source

FLOOR_NS = 100_000_000
"""A stall is at least this much later than the side's typical first token (100 ms)."""
SPREAD = 20
"""... and at least this many MADs of the side's faster half later."""
MIN_SIDE = 4
"""Measured first tokens a side needs before any of them can be called a stall."""
MIN_CLUSTER = 2
"""Stalls that make a side's first tokens bimodal."""
MIN_ORDER = 4
"""Classified requests needed after the other side and after the same side (both sides together)."""
ALPHA = 0.05
"""The order test's false-alarm rate (one-sided)."""
SIMILAR = 2.0
"""Both sides' stall sizes within this factor of each other: the same stall on both."""

SIDES = ("off", "on")
Item = tuple[RequestRecord, str | None]
"""A measured request and what ran just before it: 'other', 'same' or None (nothing, or not known)."""


# --- one side's first tokens ----------------------------------------------------------------------
def median_ns(values: Sequence[int]) -> int:
    """The median in integer ns (of two middle values, their mean rounded down)."""
    s = sorted(values)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) // 2


def typical_and_margin(ttfts: Sequence[int]) -> tuple[int, int]:
    """(b, margin): the median of the faster half and max(FLOOR, SPREAD x its MAD)."""
    faster = sorted(ttfts)[:(len(ttfts) + 1) // 2]
    b = median_ns(faster)
    return b, max(FLOOR_NS, SPREAD * median_ns([abs(t - b) for t in faster]))


def measured(r: RequestRecord) -> bool:
    return r.ok and not r.warmup and r.ttft_ns is not None


def stalled(mine: Sequence[tuple[int, str | None]]) -> list[tuple[int, str | None]]:
    """Of (TTFT, what ran before) pairs, each stall's excess over typical with what ran before it;
    none below MIN_SIDE first tokens."""
    if len(mine) < MIN_SIDE:
        return []
    b, margin = typical_and_margin([t for t, _ in mine])
    return [(t - b, before) for t, before in mine if t - b > margin]


def ms(ns: int) -> float:
    return ns / 1e6


def side_items(side: str, items: Sequence[Item]) -> list[tuple[int, str | None]]:
    """(TTFT, what ran before) of the side's measured requests."""
    return [(r.ttft_ns, before) for r, before in items if r.side == side and measured(r)]


def side_stalls(side: str, items: Sequence[Item]) -> SideStalls:
    """One side's figures over ``items`` (the measured requests of both sides, each with what ran before)."""
    mine = side_items(side, items)
    if not mine:
        return SideStalls(side=side, n=0)
    b, margin = typical_and_margin([t for t, _ in mine])
    stalls = stalled(mine)
    before = [x for _, x in stalls]
    return SideStalls(side=side, n=len(mine), after_other=sum(x == "other" for _, x in mine),
                      after_same=sum(x == "same" for _, x in mine), stalls=len(stalls),
                      stalls_after_other=before.count("other"), stalls_after_same=before.count("same"),
                      typical_ms=ms(b), margin_ms=ms(margin),
                      stall_ms=ms(median_ns([e for e, _ in stalls])) if stalls else None,
                      bimodal=len(stalls) >= MIN_CLUSTER)


# --- the order --------------------------------------------------------------------------------------
def in_send_order(records: Sequence[RequestRecord]) -> list[RequestRecord]:
    """The requests of both sides at concurrency 1 (warm-ups too; turns never sent left out), by send time."""
    return sorted((r for r in records if r.concurrency == 1 and r.request_rate is None and r.side in SIDES
                   and r.error_kind != "not_sent"), key=lambda r: r.sent_at_ns)


def what_ran_before(ordered: Sequence[RequestRecord]) -> list[Item]:
    """Each measured request (warm-ups only ran before) with 'other' / 'same' for the side of the
    request sent just before it; None for the first."""
    out: list[Item] = []
    for i, r in enumerate(ordered):
        if not r.warmup:
            prev = ordered[i - 1] if i else None
            out.append((r, None if prev is None else ("same" if prev.side == r.side else "other")))
    return out


def hypergeometric(n: int, k: int, m: int) -> list[float]:
    """P(X = x) for x = 0 .. min(k, m): x of k stalls among the m of n requests after the other side."""
    total = math.comb(n, k)
    return [math.comb(m, x) * math.comb(n - m, k - x) / total for x in range(min(k, m) + 1)]


def convolve(a: Sequence[float], b: Sequence[float]) -> list[float]:
    """The distribution of the sum of two independent counts."""
    out = [0.0] * (len(a) + len(b) - 1)
    for i, pa in enumerate(a):
        for j, pb in enumerate(b):
            out[i + j] += pa * pb
    return out


def order_distribution(sides: Sequence[SideStalls]) -> list[float]:
    """The distribution of T = the stalls after other, both sides, when the order plays no part."""
    dist = [1.0]
    for s in sides:
        classified = s.after_other + s.after_same
        dist = convolve(dist, hypergeometric(classified, s.stalls_after_other + s.stalls_after_same, s.after_other))
    return dist


def upper_tail(dist: Sequence[float], t: int) -> float:
    """P(T >= t)."""
    return min(1.0, sum(dist[t:]))


# --- the finding ------------------------------------------------------------------------------------
def duration(ms_: float) -> str:
    """'1.0 s' from 950 ms up (one decimal), else '350 ms'."""
    return f"{ms_ / 1000:.1f} s" if ms_ >= 950 else f"{ms_:.0f} ms"


def p_text(p: float) -> str:
    return f"p = {p:.2g}" if p >= 0.001 else "p < 0.001"


def shared_host(off_url: str, on_url: str) -> str | None:
    """Whether the URLs put both servers on one machine: one server for both, both on loopback,
    or one host name; None when they do not, or do not tell."""
    a, b = urlsplit(off_url).hostname, urlsplit(on_url).hostname
    if a is None or b is None:
        return None
    if off_url.rstrip("/") == on_url.rstrip("/"):
        return f"both sides are one server ({off_url})"
    if is_loopback(off_url) and is_loopback(on_url):
        return f"both servers are on this machine ({a if a == b else a + ' and ' + b})"
    if a == b:
        return f"both servers are on the host {a}"
    return None


def similar_size(sides: Sequence[SideStalls]) -> bool | None:
    """Both sides stall by about the same amount (within SIMILAR); None unless both stall."""
    sizes = [s.stall_ms for s in sides]
    if any(x is None for x in sizes) or len(sizes) < 2:
        return None
    return max(sizes) <= SIMILAR * min(sizes)


def stall_counts(sides: Sequence[SideStalls]) -> str:
    """'off 2, on 4'."""
    return ", ".join(f"{s.side} {s.stalls}" for s in sides)


def where_text(after_other: int, stalls: int) -> str:
    """'all right after the other side's request' / '3 of them ...'."""
    lead = "all" if after_other == stalls else ("none" if after_other == 0 else f"{after_other} of them")
    return f"{lead} right after the other side's request"


def stalls_text(f: InterferenceFinding) -> str:
    """'6 of 16 first tokens waited about 1.0 s longer (off 2, on 4)'."""
    size = "; about as long on both sides" if f.similar_size else ""
    return (f"{f.stalls} of {sum(s.n for s in f.sides)} first tokens waited about {duration(f.stall_ms)} longer "
            f"({stall_counts(f.sides)}{size})")


def finding_text(f: InterferenceFinding) -> str:
    """The finding in one sentence (module docstring for the rule)."""
    if f.detected:
        return (f"interference between the sides: {stalls_text(f)}, {where_text(f.stalls_after_other, f.stalls)} "
                f"({p_text(f.p_value)}); the servers stall each other (shared cores or GPU): TTFT, E2E and "
                "tokens/s include the stalls, TPOT does not")
    if f.order != "judged":
        head = f"the order of the sides cannot show interference here: {f.reason}"
        return head + (f"; {stalls_text(f)}" if f.stalls else "") + _levels_text(f.levels)
    if not f.stalls:
        return (f"no interference between the sides seen: none of {sum(s.n for s in f.sides)} first tokens "
                f"stalled ({sum(s.after_other for s in f.sides)} right after the other side's request)"
                + _levels_text(f.levels))
    if f.p_value is None:  # every stall came first, after nothing known: nothing to test
        return (f"no interference between the sides seen: {stalls_text(f)}, none of them after a known request"
                + _levels_text(f.levels))
    return (f"no clear interference between the sides: {stalls_text(f)}, {f.stalls_after_other} of them right "
            f"after the other side's request, which chance explains ({p_text(f.p_value)} > {ALPHA:g})"
            + _levels_text(f.levels))


def _levels_text(levels: Sequence[LevelStalls]) -> str:
    """'; bimodal first tokens where the order is not judged (concurrency 4: on 3 of 8 about 1.0 s later)'."""
    parts = [f"{lv.level}: {s.side} {s.stalls} of {s.n} about {duration(s.stall_ms)} later"
             for lv in levels for s in lv.sides if s.bimodal]
    return f"; bimodal first tokens where the order is not judged ({'; '.join(parts)})" if parts else ""


def not_judged(ordered: Sequence[RequestRecord], interleaved: bool, timed: bool) -> str | None:
    """Why the order at concurrency 1 cannot be judged; None when it can."""
    if not interleaved:
        return "the servers ran one after the other"
    if not timed:
        return "each block was timed from its own start (Ray actors)"
    if not any(not r.warmup for r in ordered):
        return "no requests at concurrency 1"
    if len({r.sent_at_ns for r in ordered}) < len(ordered):
        return "the requests carry no send times"
    return None


def too_few(sides: Sequence[SideStalls], dist: Sequence[float]) -> str | None:
    """Why the order test cannot show anything with these counts; None when it can."""
    other, same = sum(s.after_other for s in sides), sum(s.after_same for s in sides)
    if other < MIN_ORDER or same < MIN_ORDER:
        return (f"too few requests to tell ({other} right after the other side's request, {same} after their own "
                f"side's; {MIN_ORDER} of each needed)")
    least = upper_tail(dist, len(dist) - 1)
    stalls = sum(s.stalls_after_other + s.stalls_after_same for s in sides)
    if stalls and least > ALPHA:
        return (f"too few stalls to tell ({stalls}: even all of them right after the other side's request "
                f"would give p = {least:.2g} > {ALPHA:g})")
    return None


def rate_name(rate: float) -> str:
    """'2 req/s'; 'all at once' for inf."""
    return "all at once" if math.isinf(rate) else f"{rate:g} req/s"


def overlapping_levels(records: Sequence[RequestRecord]) -> list[tuple[str, list[RequestRecord]]]:
    """(name, records) of each level whose requests overlap: concurrencies above 1, then arrival rates."""
    levels = sorted({r.concurrency for r in records if r.request_rate is None and r.concurrency != 1})
    rates = sorted({r.request_rate for r in records if r.request_rate is not None})
    return ([(f"concurrency {c}", [r for r in records if r.request_rate is None and r.concurrency == c])
             for c in levels]
            + [(rate_name(rate), [r for r in records if r.request_rate == rate]) for rate in rates])


def level_stalls(records: Sequence[RequestRecord]) -> list[LevelStalls]:
    """Each level whose requests overlap: its sides' stalls (no order)."""
    return [LevelStalls(level=name, sides=[side_stalls(side, [(r, None) for r in recs]) for side in SIDES])
            for name, recs in overlapping_levels(records)]


def judge(sides: Sequence[SideStalls], reason: str | None) -> tuple[OrderStatus, str | None, float | None]:
    """(order, reason, p-value) of the order test (module docstring); ``reason``: why the order
    cannot be judged at all (None: it can)."""
    if reason is not None:
        return "not judged", reason, None
    dist = order_distribution(sides)
    reason = too_few(sides, dist)
    if reason is not None:
        return "too few", reason, None
    if not sum(s.stalls_after_other + s.stalls_after_same for s in sides):
        return "judged", None, None
    return "judged", None, upper_tail(dist, sum(s.stalls_after_other for s in sides))


def interference(records: Sequence[RequestRecord], *, interleaved: bool = True, timed: bool = True,
                 urls: tuple[str, str] | None = None, source: Source = "run") -> InterferenceFinding:
    """The finding over ``records`` (module docstring): ``interleaved``: the sides took turns;
    ``timed``: send times on one clock for the whole run; ``urls``: the spec-off and spec-on
    servers' base URLs."""
    ordered = in_send_order(records)
    items = what_ran_before(ordered)
    sides = [side_stalls(side, items) for side in SIDES]
    excess = [e for side in SIDES for e, _ in stalled(side_items(side, items))]
    order, reason, p = judge(sides, not_judged(ordered, interleaved, timed))
    f = InterferenceFinding(
        source=source, detected=p is not None and p <= ALPHA, order=order, reason=reason, p_value=p, alpha=ALPHA,
        requests=sum(1 for r, b in items if b is not None and measured(r)), stalls=sum(s.stalls for s in sides),
        stalls_after_other=sum(s.stalls_after_other for s in sides),
        stall_ms=ms(median_ns(excess)) if excess else None, similar_size=similar_size(sides), sides=sides,
        levels=[lv for lv in level_stalls(records) if any(s.n for s in lv.sides)],
        host=shared_host(*urls) if urls else None)
    return f.model_copy(update={"text": finding_text(f)})


def report_interference(report: CompareReport) -> InterferenceFinding | None:
    """The ``interference`` section of a compare report: its records' finding (None without records)."""
    if not report.requests:
        return None
    s = report.settings
    return interference(report.requests, interleaved=s.interleaved, timed=not s.ray_address,
                        urls=(report.off_server.base_url, report.on_server.base_url))


def saved_interference(report: CompareReport) -> InterferenceFinding | None:
    """The report's ``interference`` section read back (None when it has none)."""
    data = report.sections.get("interference")
    return None if data is None else InterferenceFinding.model_validate(data)


def detected_interference(report: CompareReport) -> InterferenceFinding | None:
    """The finding that shows interference: the run's own; else the check's before it, where the run's
    records could not judge the order (a run that judged it and saw none outweighs the short check);
    None if neither."""
    run, check = saved_interference(report), report.interference_check
    if run is not None and run.detected:
        return run
    if check is not None and check.detected and (run is None or run.order != "judged"):
        return check
    return None

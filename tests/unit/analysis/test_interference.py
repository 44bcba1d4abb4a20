"""Interference between the sides (analysis/interference.py) on constructed records: stalls planted
right after the other side's request are found with their counts and size; the same stalls where
the order plays no part are bimodal but not interference; clean runs, too few requests and a real
TTFT overhead of speculation are not called interference; the diagnosis and the notes follow the
finding, and every report form shows it."""

from __future__ import annotations

import math
import random

import pytest
from rich.console import Console

from specadapt.analysis import diagnosis as dg
from specadapt.analysis import interference as itf
from specadapt.analysis import sections as analyses
from specadapt.analysis.speed import compare_notes
from specadapt.records import CompareReport, CompareSettings, Crossover, RequestRecord, ServerInfo
from specadapt.records.interference import InterferenceFinding, SideStalls
from specadapt.report import sections as views
from specadapt.report.compare_render import LOAD_STALLS, render_console, to_markdown
from tests.unit.analysis.test_diagnosis import level, ratio

MS = 1_000_000
OFF = ServerInfo(backend="vllm", base_url="http://127.0.0.1:8001", model_id="m", spec_enabled=False)
ON = ServerInfo(backend="vllm", base_url="http://127.0.0.1:8002", model_id="m", spec_enabled=True,
                num_speculative_tokens=4)


def compare_order(pairs: int) -> list[tuple[str, str, int]]:
    """(side, prompt id, repeat) in compare's order at concurrency 1: pair i off-on for even i, on-off
    for odd, so the first request of each pair follows its own side and the second the other side."""
    prompts = 8
    out = []
    for i in range(pairs):
        order = ("off", "on") if i % 2 == 0 else ("on", "off")
        out += [(side, f"p{i % prompts}", i // prompts) for side in order]
    return out


def records(ttfts: list[tuple[str, float]], warmup: tuple[str, ...] = ("off", "on"), order=None,
            concurrency: int = 1) -> list[RequestRecord]:
    """Records sent one after the other (warm-ups first, the ``ttfts`` (side, ms) after them), each
    20 ms after the one before ended; 8 output tokens 10 ms apart after the first."""
    out, t = [], 0
    order = order or [(side, f"p{i}", 0) for i, (side, _) in enumerate(ttfts)]
    for i, (side, ttft) in enumerate([(s, 100.0) for s in warmup] + list(ttfts)):
        warm = i < len(warmup)
        _, pid, rep = ("", "w", 0) if warm else order[i - len(warmup)]
        first = int(ttft * MS)
        chunks = [first + j * 10 * MS for j in range(8)]
        out.append(RequestRecord(prompt_id=pid, category="c", api="completions", side=side, warmup=warm, repeat=rep,
                                 concurrency=concurrency, ok=True, sent_at_ns=t, chunk_ns=chunks,
                                 chunk_tokens=[1] * 8, e2e_ns=chunks[-1] + MS, output_tokens=8))
        t += chunks[-1] + 21 * MS
    return out


def jitter(i: int) -> float:
    """A natural TTFT around 120 ms: 110 .. 134 ms."""
    return 110.0 + (i * 7) % 25


def planted(pairs: int = 16, stall_ms: float = 1000.0, every: int = 2, sides=("off", "on")) -> list[RequestRecord]:
    """Compare's order; every ``every``-th request right after the other side's (counted per side)
    waits ``stall_ms`` more on the ``sides`` given."""
    order = compare_order(pairs)
    seen = {"off": 0, "on": 0}
    ttfts, prev = [], "on"  # the warm-up ends with the spec-on side
    for i, (side, _, _) in enumerate(order):
        t = jitter(i)
        if prev != side and side in sides:
            seen[side] += 1
            if seen[side] % every == 1 or every == 1:
                t += stall_ms
        ttfts.append((side, t))
        prev = side
    return records(ttfts, order=order)


def side(f: InterferenceFinding, name: str):
    return next(s for s in f.sides if s.side == name)


# --- the rule on records ------------------------------------------------------------------------------
def test_a_planted_stall_after_the_other_side_on_both_sides_is_interference_with_counts_and_size():
    f = itf.interference(planted(), urls=(OFF.base_url, ON.base_url))
    assert f.detected and f.order == "judged" and f.p_value < itf.ALPHA
    # 16 pairs: each side sends 16 requests, 8 of them right after the other side (the spec-off side 9: its first
    # follows the spec-on warm-up); the 1st, 3rd, ... of those stall
    off, on = side(f, "off"), side(f, "on")
    assert (off.n, off.after_other, off.after_same, off.stalls, off.stalls_after_other) == (16, 9, 7, 5, 5)
    assert (on.n, on.after_other, on.after_same, on.stalls, on.stalls_after_other) == (16, 8, 8, 4, 4)
    assert off.bimodal and on.bimodal and f.similar_size
    assert f.stall_ms == pytest.approx(1000, abs=30) and 110 <= off.typical_ms <= 135
    assert (f.requests, f.stalls, f.stalls_after_other) == (32, 9, 9)
    assert f.host == "both servers are on this machine (127.0.0.1)"
    assert f.text.startswith("interference between the sides: 9 of 32 first tokens waited about 1.0 s longer "
                             "(off 5, on 4; about as long on both sides), all right after the other side's "
                             "request (p = 0.0011); the servers stall each other (shared cores or GPU): TTFT, E2E and "
                             "tokens/s include the stalls, TPOT does not")


def test_the_p_value_is_the_exact_stratified_tail():
    """On one side 4 stalls among 8 requests, 4 of them after the other side, all stalls there: 1 / C(8, 4);
    the other side without stalls adds nothing."""
    assert itf.hypergeometric(8, 4, 4)[4] == pytest.approx(1 / 70)
    assert sum(itf.hypergeometric(10, 3, 4)) == pytest.approx(1.0)
    assert itf.convolve([0.5, 0.5], [0.25, 0.75]) == [0.125, 0.5, 0.375]
    assert itf.upper_tail([0.2, 0.3, 0.5], 1) == pytest.approx(0.8)
    f = itf.interference(planted(pairs=8, every=1, sides=("on",)))
    assert side(f, "on").stalls == side(f, "on").stalls_after_other == 4 and side(f, "off").stalls == 0
    assert f.p_value == pytest.approx(1 / 70) and f.detected


def test_the_reported_case_spec_on_stalls_half_its_first_tokens_and_is_not_blamed_on_speculation():
    """8 pairs; the spec-on side's 4 first tokens right after the spec-off side wait 1.0 s; the spec-off
    side never stalls: interference, and the diagnosis does not give the TTFT overhead."""
    recs = planted(pairs=8, every=1, sides=("on",))
    report = diagnosed(recs)
    f = itf.saved_interference(report)
    assert f.detected and (side(f, "on").stalls, side(f, "off").stalls) == (4, 0) and f.similar_size is None
    d = report.diagnosis
    codes = [c.code for c in d.causes]
    assert "interference" in codes and "overhead" not in codes
    cause = next(c for c in d.causes if c.code == "interference")
    assert cause.text.startswith("the servers stall each other, not speculation: 4 of 16 first tokens waited about "
                                 "1.0 s longer (off 0, on 4), all right after the other side's request; the TTFT "
                                 "ratio on/off ")
    assert cause.text.endswith("is theirs, not speculation's; TTFT, E2E and tokens/s include the stalls, TPOT does not")
    assert cause.figures == {"stalls": 4.0, "stall_ms": pytest.approx(993, abs=10), "p_value": pytest.approx(1 / 70)}
    assert d.advice[0].code == "interference" and "`--launch sequential`" in d.advice[0].text
    assert d.headline.endswith(dg.STALLS_NOTE)


def test_stalls_that_come_regardless_of_the_order_are_bimodal_but_not_interference():
    """The same 1 s stalls, half of them right after the side's own request: bimodal, order judged, no
    interference."""
    order = compare_order(16)
    ttfts, prev, k = [], "on", {"off": {"other": 0, "same": 0}, "on": {"other": 0, "same": 0}}
    for i, (s, _, _) in enumerate(order):
        where = "other" if prev != s else "same"
        k[s][where] += 1
        ttfts.append((s, jitter(i) + (1000 if k[s][where] % 4 == 1 else 0)))
        prev = s
    f = itf.interference(records(ttfts, order=order))
    assert not f.detected and f.order == "judged" and f.p_value > itf.ALPHA
    assert [(s.stalls, s.stalls_after_other, s.stalls_after_same, s.bimodal) for s in f.sides] == [
        (5, 3, 2, True), (4, 2, 2, True)]
    assert f.text == ("no clear interference between the sides: 9 of 32 first tokens waited about 1.0 s longer (off 5, "
                      "on 4; about as long on both sides), 5 of them right after the other side's request, "
                      "which chance explains (p = 0.6 > 0.05)")


@pytest.mark.parametrize("seed", range(5))
def test_clean_a_a_records_with_natural_jitter_show_no_interference(seed):
    rnd = random.Random(seed)
    order = compare_order(16)
    f = itf.interference(records([(s, 120 * math.exp(rnd.gauss(0, 0.15))) for s, _, _ in order], order=order))
    assert not f.detected and f.stalls == 0 and f.order == "judged" and f.p_value is None
    assert not any(s.bimodal for s in f.sides)
    assert f.text == ("no interference between the sides seen: none of 32 first tokens stalled (17 right after the "
                      "other side's request)")


def test_too_few_requests_or_stalls_are_said_and_never_called_interference():
    few = itf.interference(planted(pairs=3, every=1))
    assert not few.detected and few.order == "too few" and few.p_value is None
    assert few.reason == ("too few requests to tell (4 right after the other side's request, 2 after their own "
                          "side's; 4 of each needed)")
    one = itf.interference(planted(pairs=16, every=8, sides=("on",)))
    assert (one.stalls, one.order, one.detected) == (1, "too few", False)
    assert one.reason.startswith("too few stalls to tell (1: even all of them right after the other side's request "
                                 "would give p = 0.5 > 0.05)")
    tiny = itf.interference(records([("off", 120), ("on", 1500), ("off", 118)]))
    assert tiny.stalls == 0 and not tiny.detected  # 2 first tokens a side: no typical to call a stall against


def test_a_real_ttft_overhead_of_speculation_is_not_interference_and_keeps_its_cause():
    """Every spec-on first token 2.5 x the spec-off one (jitter alike): unimodal, no order, the overhead."""
    order = compare_order(16)
    recs = records([(s, jitter(i) * (2.5 if s == "on" else 1.0)) for i, (s, _, _) in enumerate(order)], order=order)
    report = diagnosed(recs)
    f = itf.saved_interference(report)
    assert not f.detected and f.stalls == 0
    codes = [c.code for c in report.diagnosis.causes]
    assert "overhead" in codes and "interference" not in codes
    assert not any(a.code == "interference" for a in report.diagnosis.advice)
    assert itf.detected_interference(report) is None
    assert not any("stalled each other" in n for n in compare_notes(report))


def test_the_order_is_not_judged_without_interleaving_send_times_or_at_higher_concurrency():
    recs = planted()
    apart = itf.interference(recs, interleaved=False)
    assert (apart.order, apart.reason, apart.detected) == ("not judged", "the servers ran one after the other", False)
    assert apart.text == ("the order of the sides cannot show interference here: the servers ran one after the other; "
                          "9 of 32 first tokens waited about 1.0 s longer (off 5, on 4; about as long on both sides)")
    assert itf.interference(recs, timed=False).reason == "each block was timed from its own start (Ray actors)"
    untimed = [r.model_copy(update={"sent_at_ns": 0}) for r in recs]
    assert itf.interference(untimed).reason == "the requests carry no send times"
    # a level at concurrency 4: stalls per side, no order; 3 of 8 spec-on first tokens 1 s late
    busy = records([("on", 120 + (1000 if i % 3 == 0 else 0)) for i in range(8)] + [("off", 120)] * 8, warmup=(),
                   concurrency=4)
    f = itf.interference(busy)
    assert f.order == "not judged" and f.reason == "no requests at concurrency 1" and not f.detected
    (lv,) = f.levels
    assert lv.level == "concurrency 4" and side(lv, "on").bimodal and side(lv, "on").stalls == 3
    assert not side(lv, "off").bimodal
    assert f.text == ("the order of the sides cannot show interference here: no requests at concurrency 1; bimodal "
                      "first tokens where the order is not judged (concurrency 4: on 3 of 8 about 1.0 s later)")


def test_levels_whose_requests_overlap_come_in_order_each_with_its_stalls():
    """Concurrencies above 1 in order, then arrival rates in order (all at once last)."""
    def level_records(conc: int, rate: float | None, stall_every: int) -> list[RequestRecord]:
        recs = records([("off", 120 + (800 if i % stall_every == 0 else 0)) for i in range(6)], warmup=(),
                       concurrency=conc)
        return [r.model_copy(update={"request_rate": rate}) for r in recs]

    recs = (level_records(0, math.inf, 3) + level_records(8, None, 3) + level_records(0, 2.0, 99)
            + level_records(2, None, 2))
    f = itf.interference(recs)
    assert [lv.level for lv in f.levels] == ["concurrency 2", "concurrency 8", "2 req/s", "all at once"]
    assert [side(lv, "off").stalls for lv in f.levels] == [3, 2, 1, 2]
    assert [side(lv, "on").n for lv in f.levels] == [0, 0, 0, 0]
    assert f.text.endswith("(concurrency 2: off 3 of 6 about 800 ms later; concurrency 8: off 2 of 6 about 800 ms "
                           "later; all at once: off 2 of 6 about 800 ms later)")


def test_the_stall_margin_is_the_floor_or_twenty_mads_of_the_faster_half():
    assert itf.typical_and_margin([100 * MS, 110 * MS, 120 * MS, 5000 * MS]) == (105 * MS, itf.FLOOR_NS)
    wide = [1000 * MS, 1100 * MS, 1200 * MS, 1300 * MS, 9000 * MS]
    assert itf.typical_and_margin(wide) == (1100 * MS, itf.SPREAD * 100 * MS)
    assert itf.median_ns([1, 2, 4, 10]) == 3 and itf.median_ns([5, 1, 3]) == 3
    assert itf.median_ns([1, 2]) == 1 and isinstance(itf.median_ns([1, 2]), int)  # integer ns


def test_a_stall_is_strictly_beyond_the_margin_from_four_first_tokens_on():
    def one_side(*ttfts_ms: float):
        return side(itf.interference(records([("off", t) for t in ttfts_ms], warmup=())), "off")

    edge = one_side(100, 100, 100, 100, 200)  # typical 100 ms, margin 100 ms: 200 ms is not beyond it
    assert (edge.n, edge.typical_ms, edge.margin_ms, edge.stalls) == (5, 100.0, 100.0, 0)
    four = one_side(100, 110, 120, 1200)
    assert (four.stalls, four.stall_ms, four.typical_ms, four.bimodal) == (1, 1095.0, 105.0, False)
    assert one_side(100, 110, 1200).stalls == 0  # three first tokens: no typical to stand on
    two = one_side(100, 110, 120, 100, 1200, 1300)
    assert (two.stalls, two.bimodal, two.stall_ms) == (2, True, 1150.0)
    nothing = side(itf.interference(records([("on", 100.0)] * 4, warmup=())), "off")
    assert (nothing.n, nothing.typical_ms, nothing.stalls) == (0, None, 0)


def test_what_ran_before_skips_turns_never_sent_and_failed_requests_are_not_measured():
    recs = records([("off", 100), ("on", 100), ("off", 100), ("off", 100)], warmup=())
    never = recs[1].model_copy(update={"ok": False, "error_kind": "not_sent", "chunk_ns": []})
    failed = recs[3].model_copy(update={"ok": False, "error_kind": "disconnect"})  # a first token, then cut off
    items = itf.what_ran_before(itf.in_send_order([recs[0], never, recs[2], failed]))
    assert [(r.side, before) for r, before in items] == [("off", None), ("off", "same"), ("off", "same")]
    off = side(itf.interference([recs[0], never, recs[2], failed]), "off")
    assert (off.n, off.after_same) == (2, 1)
    f = itf.interference(recs)
    assert f.requests == 3  # the first request has nothing known before it


def test_the_order_test_at_its_edges():
    """Exactly MIN_ORDER requests after the other side is enough; p exactly ALPHA is interference."""
    seq = ["off", "on", "on", "on", "off", "off", "off", "on", "on", "off"]  # 4 after the other side, 5 after their own
    f = itf.interference(records([(s, 100) for s in seq], warmup=()))
    assert (f.order, f.p_value, f.detected) == ("judged", None, False)
    # the spec-off side: 3 stalls, all of its 3 requests after the other side, 3 after its own: p = 1 / C(6, 3)
    seq = [("off", 100), ("on", 100), ("off", 900), ("on", 100), ("off", 900), ("on", 100), ("off", 900),
           ("off", 100), ("off", 100), ("off", 100), ("on", 100), ("on", 100), ("on", 100), ("on", 100)]
    f = itf.interference(records(seq, warmup=()))
    assert side(f, "off").stalls_after_other == 3 and f.p_value == pytest.approx(0.05)
    assert f.p_value <= itf.ALPHA and f.detected and f.order == "judged"


def test_judge_counts_stalls_after_either_side():
    quiet = SideStalls(side="on", n=8, after_other=4, after_same=4)
    one_each = SideStalls(side="off", n=40, after_other=4, after_same=36, stalls=2, stalls_after_other=1,
                          stalls_after_same=1)
    order, reason, p = itf.judge([one_each, quiet], None)
    assert (order, reason) == ("judged", None) and p == pytest.approx(1 - math.comb(36, 2) / math.comb(40, 2))
    few = SideStalls(side="off", n=12, after_other=6, after_same=6, stalls=2, stalls_after_other=1,
                     stalls_after_same=1)
    assert itf.judge([few, quiet], None)[:2] == ("too few", "too few stalls to tell (2: even all of them right "
                                                           "after the other side's request would give p = 0.23 > 0.05)")
    assert itf.judge([few, quiet], "the servers ran one after the other") == (
        "not judged", "the servers ran one after the other", None)


def test_the_report_passes_how_the_run_went():
    report = report_of(planted())
    report.settings.interleaved = False
    assert itf.report_interference(report).reason == "the servers ran one after the other"
    report.settings.interleaved, report.settings.ray_address = True, "ray://head:10001"
    assert itf.report_interference(report).reason == "each block was timed from its own start (Ray actors)"
    assert itf.report_interference(report_of([])) is None


@pytest.mark.parametrize("off_url, on_url, expected", [
    ("http://127.0.0.1:8001", "http://127.0.0.1:8002", "both servers are on this machine (127.0.0.1)"),
    ("http://localhost:1", "http://[::1]:2", "both servers are on this machine (localhost and ::1)"),
    ("http://gpu1:8000", "http://gpu1:8001/", "both servers are on the host gpu1"),
    ("http://gpu1:8000/", "http://gpu1:8000", "both sides are one server (http://gpu1:8000/)"),
    ("http://gpu1:8000", "http://gpu1:8000/", "both sides are one server (http://gpu1:8000)"),
    ("http://h:1/X/", "http://h:1/X", "both sides are one server (http://h:1/X/)"),
    ("http://h:1/X", "http://h:1/X/", "both sides are one server (http://h:1/X)"),
    ("http://gpu1:8000", "http://gpu2:8000", None),
    ("http://10.0.0.1:8000", "http://127.0.0.1:8000", None),
    ("", "http://x", None),
    ("/v1", "/v1", None),
])
def test_the_urls_say_when_both_servers_share_a_machine(off_url, on_url, expected):
    assert itf.shared_host(off_url, on_url) == expected


def test_duration_p_text_where_text_and_similar_size():
    assert (itf.duration(1040.0), itf.duration(350.4), itf.duration(949.0), itf.duration(950.0),
            itf.duration(1951.0)) == ("1.0 s", "350 ms", "949 ms", "0.9 s", "2.0 s")
    assert (itf.p_text(0.0143), itf.p_text(0.0004), itf.p_text(0.001)) == ("p = 0.014", "p < 0.001", "p = 0.001")
    assert [itf.where_text(a, 3) for a in (3, 0, 1)] == [
        "all right after the other side's request", "none right after the other side's request",
        "1 of them right after the other side's request"]
    assert itf.upper_tail([0.6, 0.6], 0) == 1.0  # rounding never takes a p-value past 1

    def sides(a: float | None, b: float | None) -> list[SideStalls]:
        return [SideStalls(side="off", n=4, stall_ms=a), SideStalls(side="on", n=4, stall_ms=b)]

    assert [itf.similar_size(sides(*ab)) for ab in ((500.0, 1000.0), (500.0, 1000.1), (500.0, None))] == [
        True, False, None]


# --- the report: section, notes, diagnosis, renderers ----------------------------------------------------
def report_of(recs: list[RequestRecord]) -> CompareReport:
    """A compare report of ``recs`` whose concurrency-1 level says TPOT 2.45x faster but tokens/s no
    clear difference, with the spec-on server's counters read."""
    report = CompareReport(settings=CompareSettings(concurrency=[1], repeat=2), off_server=OFF, on_server=ON,
                           requests=recs)
    lv = level(ratio(2.45, 2.2, 2.7), drafts=300.0, accepted=600.0)
    lv.speed.throughput = ratio(1.39, 0.96, 2.02)
    report.levels = [lv]
    report.crossover = Crossover(status="no-clear-difference", text="no clear difference at any tested concurrency")
    return report


def diagnosed(recs: list[RequestRecord]) -> CompareReport:
    """As finish_compare: the sections marked before_diagnosis, the notes, the diagnosis, the rest."""
    report = report_of(recs)
    analyses.analyse_sections(report, before_diagnosis=True)
    report.notes += compare_notes(report)
    report.diagnosis = dg.diagnose_compare(report)
    return analyses.analyse_sections(report, before_diagnosis=False)


def test_interference_is_the_first_section_analysed_before_the_diagnosis_and_shown_before_it():
    assert analyses.SECTIONS[0].name == "interference" and analyses.SECTIONS[0].before_diagnosis
    assert [v.name for v in views.VIEWS] == ["interference", "speculation", "diagnosis"]
    report = report_of(planted())
    analyses.analyse_sections(report, before_diagnosis=False)
    assert "interference" not in report.sections  # the later pass leaves it alone
    analyses.analyse_sections(report, before_diagnosis=True)
    assert InterferenceFinding.model_validate(report.sections["interference"]).detected


def test_the_notes_say_e2e_and_tokens_per_s_carry_the_stalls_and_which_verdict_to_read():
    report = diagnosed(planted())
    (note,) = [n for n in report.notes if "stalled each other" in n]
    assert note == ("the servers stalled each other's first token (9 stalls of about 1.0 s): at concurrency 1 E2E "
                    "and tokens/s include the stalls, TPOT does not; where they disagree (here TPOT: faster, "
                    "tokens/s: no clear difference), the stalls make the difference: read TPOT")
    report.levels[0].speed.throughput = ratio(2.0, 1.5, 2.5)
    assert compare_notes(report)[-1].endswith("TPOT does not")


def test_a_check_that_saw_interference_speaks_where_the_run_could_not_judge_the_order():
    """Three pairs (too few to judge), every spec-on first token 2.5 x: with a check before the run that saw
    the sides stall each other, the diagnosis names the interference, not the overhead; a run that judged
    the order and saw nothing outweighs the check."""
    order = compare_order(3)
    few = records([(s, jitter(i) * (2.5 if s == "on" else 1.0)) for i, (s, _, _) in enumerate(order)], order=order)
    report = report_of(few)
    report.interference_check = itf.interference(planted(), source="check")
    analyses.analyse_sections(report, before_diagnosis=True)
    assert itf.saved_interference(report).order == "too few"
    d = dg.diagnose_compare(report)
    cause = next(c for c in d.causes if c.code == "interference")
    assert cause.text.startswith("the servers stall each other, not speculation: in the check before the run 9 of 32")
    assert "overhead" not in [c.code for c in d.causes]
    assert "in the check before the run" in compare_notes(report)[-1]
    order = compare_order(16)
    judged = report_of(records([(s, jitter(i) * (2.5 if s == "on" else 1.0)) for i, (s, _, _) in enumerate(order)],
                               order=order))
    judged.interference_check = report.interference_check
    analyses.analyse_sections(judged, before_diagnosis=True)
    assert itf.detected_interference(judged) is None
    assert "overhead" in [c.code for c in dg.diagnose_compare(judged).causes]


def console_text(report: CompareReport) -> str:
    console = Console(record=True, width=400)
    render_console(report, console)
    return console.export_text()


def test_every_form_shows_the_finding_with_each_sides_figures():
    report = diagnosed(planted())
    report.interference_check = itf.interference(planted(pairs=5, every=1), urls=(OFF.base_url, ON.base_url),
                                                 source="check")
    f = itf.saved_interference(report)
    side_on = ("on: typical 118 ms; 4 of 16 first tokens stalled, about 1.0 s (4 right after the other side's "
               "request, 0 after its own)")
    assert views.side_line(side(f, "on")) == side_on
    text = console_text(report)
    assert f"interference, the run: {f.text}; both servers are on this machine (127.0.0.1)" in text
    assert f"  {side_on}" in text
    assert "interference, the check before the run: interference between the sides: 6 of 10" in text
    assert text.index("interference, the check") < text.index("interference, the run") < text.index("why: ")
    assert f"load: no clear difference at any tested concurrency ({LOAD_STALLS})" in text
    md = to_markdown(report)
    assert "### Interference between the sides" in md and f"- the run: {f.text}" in md and f"  - {side_on}" in md
    assert md.index("### Interference") < md.index("### Why")
    assert f"Load: no clear difference at any tested concurrency ({LOAD_STALLS})." in md
    page = str(views.sections_html(report, 2))  # the page's plots need figures these records do not carry
    assert "<h2>Interference between the sides</h2>" in page and "<li>on: typical 118 ms; 4 of 16" in page


def test_a_clean_run_shows_one_line_and_a_run_without_concurrency_1_none():
    order = compare_order(16)
    report = diagnosed(records([(s, jitter(i)) for i, (s, _, _) in enumerate(order)], order=order))
    assert "interference, the run: no interference between the sides seen: none of 32 first tokens stalled" in (
        console_text(report))
    assert "load: no clear difference at any tested concurrency\n" in console_text(report)
    busy = report_of(records([("on", 120)] * 8 + [("off", 120)] * 8, warmup=(), concurrency=4))
    analyses.analyse_sections(busy)
    assert "interference" in busy.sections and "interference" not in console_text(busy)
    assert "Interference" not in to_markdown(busy)


def test_a_stall_only_where_nothing_ran_before_is_said_without_a_p_value():
    """The first request (nothing known before it) stalls, nothing else does: judged, nothing to test."""
    order = compare_order(16)
    ttfts = [(side, 1200.0 if i == 0 else jitter(i)) for i, (side, _, _) in enumerate(order)]
    f = itf.interference(records(ttfts, warmup=(), order=order))
    assert (f.detected, f.order, f.p_value, f.stalls, f.stalls_after_other) == (False, "judged", None, 1, 0)
    assert f.text.startswith("no interference between the sides seen: 1 of 32 first tokens waited about")
    assert f.text.endswith("none of them after a known request")

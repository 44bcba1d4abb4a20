"""`specadapt tune`'s arithmetic: the cost model fitted per level, the k chosen per level and how
sure it is, the batch-size schedule, the fixed-k fallback, and the verification verdicts.

Pure functions over records (no I/O, no servers): everything that decides a figure or a
verdict of ``tune`` lives here, so that mutation testing covers it.

The model (theory.py, Leviathan et al. 2023, with a measured cost): at one level (batch
size), a verify pass with k draft tokens costs v + c k plain decode steps and yields
L(k) = 1 + sum_{i<k} p_i tokens, p_i the accepted-per-draft rate of position i; the
predicted TPOT ratio off/on is L(k) / (v + c k). At k = 0 (speculation off) it is 1.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Literal

import numpy as np

from specadapt.analysis.sequential import cs_ratio, requests_text
from specadapt.analysis.text import k_text
from specadapt.records import AcceptanceSummary, LevelResult, RatioCI, SequentialDesign, SequentialOutcome
from specadapt.records.tune import (
    CellOutcome,
    FitPoint,
    HonourCheck,
    LevelChoice,
    LevelFit,
    LevelVerify,
    Objective,
    Recommendation,
)

HONOURED_BELOW = 0.5
"""A schedule is honoured at a level when the accepted count above the scheduled k, per generated
token, is below this share of the fixed-k run's (ramp-up and drain of a closed-loop block run at
smaller batch sizes, where the schedule allows more drafts, so it is not 0)."""
MIN_FIXED_COUNT = 20
"""Fewer accepted tokens than this above the scheduled k in the fixed-k run: undetermined."""


_CERTAINTY_ORDER = ("no interval", "leaning", "clear")
"""Least to most certain: the summary names the level whose choice comes first here."""


def _has_interval(r: RatioCI) -> bool:
    return r.low is not None and r.high is not None


def _ratio_text(r: RatioCI) -> str:
    if r.point is None:
        return "unknown"
    if not _has_interval(r):
        return f"{r.point:.2f}x"
    return f"{r.point:.2f}x [{r.low:.2f}, {r.high:.2f}]"


def _sizes(start: int, end: int) -> str:
    return f"{start}" if start == end else f"{start}-{end}"


def ranges_text(schedule: Sequence[Sequence[int]], form: Literal["given", "report", "summary"] = "given") -> str:
    """A schedule's (first batch size, last batch size, k) ranges in words, in one of three forms:

    - "given" (a schedule as written with --schedule): '1-3: k=4, 4-4: k=2', every range as
      first-last and k as a number (k=0, not off)
    - "report" (the tune report's Schedule line): 'batch sizes 1-3: k=4; 4: k=2; 16: off', '-'
      without ranges
    - "summary" (inside the recommendation's sentence): 'batch sizes 1-3 k=4, 4 k=2, 16 off'
    """
    if form == "given":
        return ", ".join(f"{a}-{b}: k={k}" for a, b, k in schedule)
    if not schedule:
        return "-"
    sep, colon = ("; ", ": ") if form == "report" else (", ", " ")
    return "batch sizes " + sep.join(f"{_sizes(a, b)}{colon}{k_text(k)}" for a, b, k in schedule)


def _and_list(items: Sequence[object]) -> str:
    words = [str(x) for x in items]
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def objective_ratio(level: LevelResult, objective: Objective) -> RatioCI:
    """The level's ratio that judges candidates: speed.tpot, speed.e2e or speed.throughput."""
    return {"tpot": level.speed.tpot, "e2e": level.speed.e2e, "throughput": level.speed.throughput}[objective]


def predict_ratio(rates: Sequence[float], v: float, c: float, k: int) -> float | None:
    """(1 + sum of the first k rates) / (v + c k); None where the model says nothing: fewer
    per-position rates than k, or a cost v + c k that is not positive (a fit that went wrong)."""
    if k == 0:
        return 1.0
    cost = v + c * k
    if k > len(rates) or cost <= 0:
        return None
    return (1.0 + sum(rates[:k])) / cost


def fit_level(concurrency: int, points: Sequence[tuple[int, LevelResult]], variant: str = "") -> LevelFit:
    """Fit v and c at one level from the measured candidates ``points`` = [(k, its LevelResult at
    this level)], k > 0 (any order). Uses each point's speed.tpot.point (measured TPOT ratio S_k)
    and acceptance.mean_acceptance_length (L_k); points without either are left out.

    y_k = L_k / S_k is the cost of a pass with k drafts. With 3+ points: least squares y = v + c k
    (form 'v + c k'); with 1-2 points: v = 1, c = sum k (y_k - 1) / sum k^2 (form '1 + c k');
    none: form 'none'. c and v are not clamped (a negative c is shown as measured).
    per_position_rate: acceptance.per_position_rate of the largest k measured. predicted[k] for
    k in 0..max k: 1.0 at k = 0, else (1 + sum of the first k rates) / (v + c k). FitPoint per
    point: measured S_k with tpot low/high, own L_k, predicted[k], inside = low <= predicted <= high
    (None without an interval). max_rel_error over the points; r2 = 1 - SS_res / SS_tot of the
    measured S_k against predicted (3+ points and SS_tot > 0, else None). model_best_k: argmax of
    predicted (ties: the smaller k)."""
    kept = sorted({k: lv for k, lv in points
                   if lv.speed.tpot.point is not None and lv.acceptance.mean_acceptance_length is not None}.items())
    if not kept:
        return LevelFit(concurrency=concurrency, variant=variant, form="none")
    ks = np.array([k for k, _ in kept])
    y = np.array([lv.acceptance.mean_acceptance_length / lv.speed.tpot.point for _, lv in kept])
    if len(kept) >= 3:
        c, v = np.polyfit(ks, y, 1)
        form = "v + c k"
    else:
        v, c = 1.0, np.sum(ks * (y - 1.0)) / np.sum(ks * ks)
        form = "1 + c k"
    v, c = float(v), float(c)
    rates = list(kept[-1][1].acceptance.per_position_rate)
    predicted = {}
    for k in range(kept[-1][0] + 1):
        pred = predict_ratio(rates, v, c, k)
        if pred is not None:
            predicted[k] = pred
    fit_points = []
    for k, lv in kept:
        if k not in predicted:
            continue  # no prediction to set beside it (see predict_ratio)
        r = lv.speed.tpot
        inside = r.low <= predicted[k] <= r.high if _has_interval(r) else None
        fit_points.append(FitPoint(k=k, measured=r.point, low=r.low, high=r.high,
                                   tokens_per_pass=lv.acceptance.mean_acceptance_length,
                                   predicted=predicted[k], inside=inside))
    max_rel = max((abs(p.predicted - p.measured) / p.measured for p in fit_points), default=None)
    r2 = None
    if len(fit_points) >= 3:
        measured = np.array([p.measured for p in fit_points])
        ss_tot = float(np.sum((measured - measured.mean()) ** 2))
        ss_res = float(np.sum((measured - np.array([p.predicted for p in fit_points])) ** 2))
        if ss_tot > 0:
            r2 = 1.0 - ss_res / ss_tot
    best = max(predicted, key=lambda k: (predicted[k], -k))
    return LevelFit(concurrency=concurrency, variant=variant, form=form, v=v, c=c, per_position_rate=rates,
                    points=fit_points, max_rel_error=max_rel, r2=r2, predicted=predicted, model_best_k=best)


def choose_level(concurrency: int, options: Mapping[int, RatioCI | None], excluded: Mapping[int, str],
                 fit: LevelFit | None = None, labels: Mapping[int, str] | None = None) -> LevelChoice:
    """The k to run at this level among k = 0 (off: ratio exactly 1, always eligible) and the
    measured candidates ``options`` = {k: objective ratio vs off} (k > 0; a None ratio or a None
    point means not measured at this level: left out and listed in ``excluded`` with a reason).
    ``excluded`` = {k: reason} are candidates that may not be chosen (e.g. suspect divergences).

    Best = highest point (ties: the smaller k). Runner-up = the next best (off counts, at 1.0).
    Certainty: 'no interval' when the best is k > 0 without low/high; for k > 0 'clear' when its
    low > max(1, runner-up point), else 'leaning'; for off 'clear' when every eligible k > 0 has a
    high < 1, 'leaning' otherwise (a candidate without interval makes it 'leaning').
    reason: one sentence with the figures (e.g. "k=4: TPOT 1.42x [1.30, 1.55] vs off; ahead of k=2
    (1.21x) beyond its interval"). model_best_k from ``fit``; model_note when the model's best k is
    not among the measured ks ("the model predicts k=3 at 1.50x; it was not measured: add it to
    --k to test it"). label: labels[k] if given, else 'k=K', 'off' for 0."""
    labels = labels or {}

    def name(k: int) -> str:
        return labels.get(k, k_text(k))

    out_excluded = dict(excluded)
    measured = {0}
    ranked: list[tuple[int, float, RatioCI | None]] = [(0, 1.0, None)]
    for k, r in options.items():
        if r is None or r.point is None:
            out_excluded.setdefault(k, "not measured at this level")
            continue
        measured.add(k)
        if k not in excluded:
            ranked.append((k, r.point, r))
    ranked.sort(key=lambda e: (-e[1], e[0]))
    best_k, _, best_r = ranked[0]
    runner = ranked[1] if len(ranked) > 1 else None
    if best_r is not None:  # k > 0; the runner-up is at least off, at 1.0: max(1, its point) is its point
        head = f"{name(best_k)}: {_ratio_text(best_r)} vs off"
        ru = f"{name(runner[0])} ({runner[1]:.2f}x)"
        if not _has_interval(best_r):
            certainty, reason = "no interval", f"{head}, without an interval to judge it by; runner-up {ru}"
        elif best_r.low > runner[1]:
            certainty, reason = "clear", f"{head}; ahead of {ru} beyond its interval"
        else:
            certainty, reason = "leaning", f"{head}; leaning: its interval reaches {ru}"
    else:
        blocker = next((e for e in ranked[1:] if not (e[2].high is not None and e[2].high < 1.0)), None)
        if runner is None:
            certainty, reason = "clear", "off: no candidate could be chosen at this level"
        elif blocker is None:
            certainty = "clear"
            reason = (f"off: every candidate is slower beyond its interval; the best, {name(runner[0])}, "
                      f"gives {_ratio_text(runner[2])}")
        else:
            certainty = "leaning"
            reason = (f"off: no candidate is faster, but {name(blocker[0])} at {_ratio_text(blocker[2])} "
                      f"is not clearly slower")
    model_best = fit.model_best_k if fit is not None else None
    note = None
    if model_best is not None and model_best not in measured:
        missing = "it was not measured at this level" if model_best in options else \
            "it was not measured: add it to --k to test it"
        note = f"the model predicts {k_text(model_best)} at {fit.predicted[model_best]:.2f}x; {missing}"
    return LevelChoice(concurrency=concurrency, k=best_k, label=name(best_k), ratio=best_r,
                       runner_up_k=runner[0] if runner else None, runner_up_ratio=runner[1] if runner else None,
                       certainty=certainty, reason=reason, excluded=out_excluded, model_best_k=model_best,
                       model_note=note)


def build_schedule(choices: Sequence[LevelChoice], max_batch_size: int | None = None
                   ) -> tuple[list[tuple[int, int, int]], str]:
    """Batch-size ranges [start, end, k] from the per-level choices (levels ascending, at least
    one): level i covers batch sizes from its concurrency up to the next level's - 1; the first
    range starts at 1; the last ends at max(its level, max_batch_size or its level). Adjacent
    ranges with the same k are merged. Returns (ranges, note): the note says plainly which batch
    sizes were not measured and took the k of the level below (and that the engines carry the last
    range's k to larger batch sizes), e.g. "batch sizes 2-3 were not measured: they take k=4 of
    batch size 1; ..."."""
    levels = sorted(choices, key=lambda ch: ch.concurrency)
    if not levels:
        raise ValueError("a schedule needs at least one level")
    ranges: list[tuple[int, int, int]] = []
    notes: list[str] = []

    def unmeasured(start: int, end: int, ch: LevelChoice) -> None:
        if start > end:
            return
        what = f"batch size {start} was not measured: it takes" if start == end else \
            f"batch sizes {start}-{end} were not measured: they take"
        notes.append(f"{what} k={ch.k} of batch size {ch.concurrency}")

    for i, ch in enumerate(levels):
        last = i == len(levels) - 1
        start = 1 if i == 0 else ch.concurrency
        end = max(ch.concurrency, max_batch_size or ch.concurrency) if last else levels[i + 1].concurrency - 1
        unmeasured(start, ch.concurrency - 1, ch)
        unmeasured(ch.concurrency + 1, end, ch)
        if ranges and ranges[-1][2] == ch.k:
            ranges[-1] = (ranges[-1][0], end, ch.k)
        else:
            ranges.append((start, end, ch.k))
    if not notes:
        notes.append(f"every batch size from 1 to {ranges[-1][1]} was measured")
    notes.append(f"the engines carry the last range's k={ranges[-1][2]} to batch sizes above "
                 f"{ranges[-1][1]}")
    note = "; ".join(notes) + "."
    return ranges, note[0].upper() + note[1:]


def fixed_fallback(per_level: Mapping[int, Mapping[int, RatioCI | None]], eligible: Sequence[int]) -> int:
    """The best single k (0 included) for every level: per_level = {concurrency: {k: ratio}}.
    Score of k: mean over levels of log(point) (k = 0: log 1 = 0; a k without a point at some
    level cannot be the fallback); highest score wins, ties the smaller k. ``eligible``: the ks
    allowed (0 is always allowed)."""
    # Every k that can win has a point at every level, so ranking by the sum of the logs ranks by
    # their mean; off (absent from per_level, or there at 1.0) scores 0.
    best_k, best_score = 0, 0.0
    for k in sorted(set(eligible)):
        ratios = [level.get(k) for level in per_level.values()]
        if any(r is None or r.point is None for r in ratios):
            continue
        score = sum(math.log(r.point) for r in ratios)
        if score > best_score:
            best_k, best_score = k, score
    return best_k


def recommendation(schedule: Sequence[tuple[int, int, int]], choices: Sequence[LevelChoice],
                   fallback_k: int, variant: str = "") -> Recommendation:
    """Form 'off' when every range has k = 0; 'fixed' when every range has the same k > 0; else
    'schedule' (k = the largest k of the ranges). summary: one paragraph naming the form, the
    ranges, the least certain level's certainty, and the fixed-k fallback. verified False."""
    ranges = [(int(s), int(e), int(k)) for s, e, k in schedule]
    if not ranges:
        return Recommendation(form="none", variant=variant, fixed_fallback_k=fallback_k,
                              summary="Nothing was measured: there is no recommendation.")
    ks = {k for _, _, k in ranges}
    top = max(ks)
    shown = ranges_text(ranges, "summary")
    of_variant = f" ({variant})" if variant else ""
    if top == 0:
        form, first = "off", f"Speculation off{of_variant}: {shown}."
    elif len(ks) == 1:
        form, first = "fixed", f"Fixed k={top}{of_variant}: {shown}."
    else:
        form, first = "schedule", f"Schedule{of_variant}: {shown}; the engine's k is {top}."
    parts = [first]
    if choices:
        worst = min(choices, key=lambda ch: _CERTAINTY_ORDER.index(ch.certainty))
        parts.append("Every level's choice is clear." if worst.certainty == "clear" else
                     f"Least certain: concurrency {worst.concurrency}, {worst.label} ({worst.certainty}).")
    parts.append(f"Fixed-k fallback for engines that do not honour schedules: {k_text(fallback_k)}.")
    return Recommendation(form=form, variant=variant, k=top, schedule=ranges, fixed_fallback_k=fallback_k,
                          summary=" ".join(parts))


def _above(acc: AcceptanceSummary | None, k: int, run: str) -> tuple[float | None, float | None, str | None]:
    """(accepted count at positions >= k, that per generated token, problem) of one run."""
    if acc is None or not acc.known:
        return None, None, f"the {run} run's acceptance counts are unknown"
    if not acc.drafts or not acc.generation_tokens or len(acc.per_position_rate) <= k:
        return None, None, f"the {run} run lacks draft, generated-token or per-position counts above k={k}"
    count = sum(acc.per_position_rate[k:]) * acc.drafts
    return count, count / acc.generation_tokens, None


def honour_check(concurrency: int, scheduled_k: int, engine_k: int, verify: AcceptanceSummary,
                 fixed: AcceptanceSummary | None) -> HonourCheck:
    """Compare accepted counts at positions >= scheduled_k (0-based; i.e. above the scheduled k)
    per generated token: schedule_rate from ``verify`` (the emitted config's run at this level),
    fixed_rate from ``fixed`` (the sweep's run at k = engine_k, same level); counts =
    per_position_rate[i] * drafts, per generated token = sum / generation_tokens.
    'not applicable' when scheduled_k >= engine_k; 'undetermined' when a summary is unknown, lacks
    drafts/generation_tokens, or the fixed count < MIN_FIXED_COUNT; else ratio = schedule / fixed
    and 'honoured' when ratio < HONOURED_BELOW, 'not honoured' otherwise. reason: one sentence with
    the figures."""
    at = f"At concurrency {concurrency}"
    if scheduled_k >= engine_k:
        return HonourCheck(concurrency=concurrency, scheduled_k=scheduled_k, engine_k=engine_k,
                           verdict="not applicable",
                           reason=f"{at} the schedule's k={scheduled_k} is not below the engine's k={engine_k}: "
                                  f"there are no fewer drafts to check.")
    _, schedule_rate, problem = _above(verify, scheduled_k, "verification")
    fixed_count, fixed_rate, fixed_problem = _above(fixed, scheduled_k, f"fixed k={engine_k}")
    problem = problem or fixed_problem
    if problem is None and fixed_count < MIN_FIXED_COUNT:
        problem = (f"only {fixed_count:g} tokens were accepted above k={scheduled_k} in the fixed k={engine_k} run, "
                   f"fewer than {MIN_FIXED_COUNT}")
    if problem is not None:
        return HonourCheck(concurrency=concurrency, scheduled_k=scheduled_k, engine_k=engine_k,
                           schedule_rate=schedule_rate, fixed_rate=fixed_rate, fixed_count=fixed_count,
                           verdict="undetermined",
                           reason=f"{at} whether k={scheduled_k} is honoured cannot be told: {problem}.")
    ratio = schedule_rate / fixed_rate
    honoured = ratio < HONOURED_BELOW
    reason = (f"{at} {schedule_rate:.4f} tokens per generated token were accepted above k={scheduled_k} in the "
              f"verification run against {fixed_rate:.4f} in the fixed k={engine_k} run (ratio {ratio:.2f}, "
              + (f"below {HONOURED_BELOW:g}): the server drafted fewer tokens as scheduled." if honoured else
                 f"not below {HONOURED_BELOW:g}): the server kept drafting beyond the scheduled k."))
    return HonourCheck(concurrency=concurrency, scheduled_k=scheduled_k, engine_k=engine_k,
                       schedule_rate=schedule_rate, fixed_rate=fixed_rate, fixed_count=fixed_count, ratio=ratio,
                       verdict="honoured" if honoured else "not honoured", reason=reason)


def verify_level(concurrency: int, scheduled_k: int, ratio: RatioCI, best_fixed_k: int,
                 best_fixed_ratio: RatioCI | None, honour: HonourCheck | None = None) -> LevelVerify:
    """as_good: the emitted config's interval reaches the best fixed-k's: ratio.high >=
    best_fixed_ratio.low (off best, i.e. None: ratio.high >= 1); None when an interval is missing."""
    reach = 1.0 if best_fixed_ratio is None else best_fixed_ratio.low
    as_good = None if ratio.high is None or reach is None else ratio.high >= reach
    return LevelVerify(concurrency=concurrency, scheduled_k=scheduled_k, ratio=ratio, best_fixed_k=best_fixed_k,
                       best_fixed_ratio=best_fixed_ratio, as_good=as_good, honour=honour)


def overall_honour(checks: Sequence[HonourCheck]) -> str:
    """'not honoured' if any level is; else 'honoured' if any is; else 'undetermined' if any is;
    else 'not applicable'."""
    verdicts = {c.verdict for c in checks}
    for verdict in ("not honoured", "honoured", "undetermined"):
        if verdict in verdicts:
            return verdict
    return "not applicable"


def verification_reasons(levels: Sequence[LevelVerify], suspect: int) -> list[str]:
    """Why a verification fails, one line each: a level whose as_good is False (with both
    ratios), a level whose as_good is None (no interval to tell), suspect > 0 divergences. []:
    it passed (honouring is judged separately)."""
    reasons = []
    for lv in levels:
        best = k_text(lv.best_fixed_k)
        best_ratio = "1.00x" if lv.best_fixed_ratio is None else _ratio_text(lv.best_fixed_ratio)
        if lv.as_good is False:
            reasons.append(f"At concurrency {lv.concurrency} the emitted config's {_ratio_text(lv.ratio)} falls "
                           f"short of {best}'s {best_ratio}: its interval does not reach the other's.")
        elif lv.as_good is None:
            reasons.append(f"At concurrency {lv.concurrency} there is no interval to tell whether the emitted "
                           f"config's {_ratio_text(lv.ratio)} is as good as {best}'s {best_ratio}.")
    if suspect > 0:
        reasons.append(f"{suspect} prompt{'s' if suspect > 1 else ''} diverged from the spec-off output "
                       f"beyond a near-tie (suspect).")
    return reasons


def variant_score(choices: Sequence[LevelChoice]) -> float:
    """Mean over levels of log(chosen point) (off: 0): how good a variant's schedule is, to pick
    among variants (higher is better)."""
    if not choices:
        return 0.0
    return sum(0.0 if ch.ratio is None else math.log(ch.ratio.point) for ch in choices) / len(choices)


def units_problem(concurrency: Sequence[int], requests_per_set: int, repeat: int, min_units: int) -> str | None:
    """None when every level gives at least ``min_units`` independent units, else one sentence
    saying which level falls short, how many units it gives and what to change. Units: at
    concurrency 1 one per request of the set per repeat (requests_per_set * repeat); at N > 1 one
    per repeat. E.g. "--concurrency 4 gives 3 units (one per --repeat); intervals need 5: give
    --repeat 5"; at 1: "... gives 4 units (prompts x --repeat); intervals need 5: give --repeat 2
    or more prompts"."""
    levels = sorted(set(concurrency))
    batched = [c for c in levels if c > 1]
    if batched and repeat < min_units:
        gives = "gives" if len(batched) == 1 else "give"
        each = "" if len(batched) == 1 else " each"
        return (f"--concurrency {_and_list(batched)} {gives} {repeat} unit{'' if repeat == 1 else 's'}{each} "
                f"(one per --repeat); intervals need {min_units}: give --repeat {min_units}.")
    units = requests_per_set * repeat
    if 1 in levels and units < min_units:
        fix = f"give --repeat {-(-min_units // requests_per_set)} or more prompts" if requests_per_set > 0 \
            else "give prompts"
        return (f"--concurrency 1 gives {units} unit{'' if units == 1 else 's'} (prompts x --repeat); "
                f"intervals need {min_units}: {fix}.")
    return None


# --- run until decided: the sweep's cells ---------------------------------------------------------
RATIO_NAMES = {"tpot": "TPOT", "e2e": "E2E", "throughput": "tokens/s"}


def best_cell(cells: Sequence[tuple[str, RatioCI | None]]) -> tuple[str, RatioCI] | None:
    """The (label, interval) whose low end is highest among ``cells`` (earlier cells of one batch
    size); those without an interval are left out; ties: the first. None: no interval yet."""
    best: tuple[str, RatioCI] | None = None
    for label, r in cells:
        if r is None or r.low is None or r.high is None:
            continue
        if best is None or r.low > best[1].low:
            best = (label, r)
    return best


def drop_interval(log_ratios: Sequence[float | None], design: SequentialDesign, unit: str,
                  best: RatioCI | None) -> RatioCI | None:
    """The cell's interval (the design's confidence sequence over its units' log ratios) when it
    cannot beat ``best``: from the rule's first look and floor on, its high end below best's low
    end. None: go on (no best, no interval yet, before the first look, or the intervals overlap)."""
    if best is None or best.low is None:
        return None
    interval = cs_ratio(log_ratios, unit, design)
    if interval.n < max(design.first_look, design.min_units) or interval.high is None:
        return None
    return interval if interval.high < best.low else None


def _cs_text(r: RatioCI) -> str:
    if r.point is None:
        return "no unit measured"
    if r.low is None or r.high is None:
        return f"{r.point:.2f}x (no interval yet)"
    return f"{r.point:.2f}x [{r.low:.2f}, {r.high:.2f}]"


def cell_outcome(concurrency: int, outcome: SequentialOutcome, objective: Objective,
                 dropped_by: tuple[str, RatioCI] | None = None) -> CellOutcome:
    """One cell's outcome from its level's ``outcome`` (compare's rule), and, when the sweep dropped
    it, the (label, interval) of the cell it could not beat: then stopped 'dropped' and verdict 'no
    clear difference' (against spec-off nothing was decided), the text naming both intervals."""
    name, ci = RATIO_NAMES[objective], outcome.interval
    spent = requests_text(outcome.requests, outcome.fixed_requests)
    common = dict(concurrency=concurrency, units=outcome.units, requests=outcome.requests,
                  fixed_requests=outcome.fixed_requests, interval=ci)
    if dropped_by is None:
        return CellOutcome(stopped=outcome.stopped, verdict=outcome.verdict, text=outcome.text, **common)
    label, best = dropped_by
    text = (f"dropped after {outcome.units} {ci.unit}: {name} {_cs_text(ci)} lies below {label}'s {_cs_text(best)} "
            f"at this batch size, so it cannot beat it; {spent}")
    return CellOutcome(stopped="dropped", verdict="no clear difference", best_label=label, best_interval=best,
                       text=text, **common)


def sweep_requests(cells: Sequence[CellOutcome]) -> tuple[int, int | None]:
    """(requests the cells sent, what the fixed design would have sent there; None when a cell's
    fixed count is unknown)."""
    sent = sum(c.requests for c in cells)
    fixed = None if any(c.fixed_requests is None for c in cells) else sum(c.fixed_requests for c in cells)
    return sent, fixed

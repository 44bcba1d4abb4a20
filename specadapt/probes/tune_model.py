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

from collections.abc import Mapping, Sequence

from specadapt.records import AcceptanceSummary, LevelResult, RatioCI
from specadapt.records.tune import (
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


def objective_ratio(level: LevelResult, objective: Objective) -> RatioCI:
    """The level's ratio that judges candidates: speed.tpot, speed.e2e or speed.throughput."""
    raise NotImplementedError


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
    raise NotImplementedError


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
    raise NotImplementedError


def build_schedule(choices: Sequence[LevelChoice], max_batch_size: int | None = None
                   ) -> tuple[list[tuple[int, int, int]], str]:
    """Batch-size ranges [start, end, k] from the per-level choices (levels ascending, at least
    one): level i covers batch sizes from its concurrency up to the next level's - 1; the first
    range starts at 1; the last ends at max(its level, max_batch_size or its level). Adjacent
    ranges with the same k are merged. Returns (ranges, note): the note says plainly which batch
    sizes were not measured and took the k of the level below (and that the engines carry the last
    range's k to larger batch sizes), e.g. "batch sizes 2-3 were not measured: they take k=4 of
    batch size 1; ..."."""
    raise NotImplementedError


def fixed_fallback(per_level: Mapping[int, Mapping[int, RatioCI | None]], eligible: Sequence[int]) -> int:
    """The best single k (0 included) for every level: per_level = {concurrency: {k: ratio}}.
    Score of k: mean over levels of log(point) (k = 0: log 1 = 0; a k without a point at some
    level cannot be the fallback); highest score wins, ties the smaller k. ``eligible``: the ks
    allowed (0 is always allowed)."""
    raise NotImplementedError


def recommendation(schedule: Sequence[tuple[int, int, int]], choices: Sequence[LevelChoice],
                   fallback_k: int, variant: str = "") -> Recommendation:
    """Form 'off' when every range has k = 0; 'fixed' when every range has the same k > 0; else
    'schedule' (k = the largest k of the ranges). summary: one paragraph naming the form, the
    ranges, the least certain level's certainty, and the fixed-k fallback. verified False."""
    raise NotImplementedError


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
    raise NotImplementedError


def verify_level(concurrency: int, scheduled_k: int, ratio: RatioCI, best_fixed_k: int,
                 best_fixed_ratio: RatioCI | None, honour: HonourCheck | None = None) -> LevelVerify:
    """as_good: the emitted config's interval reaches the best fixed-k's: ratio.high >=
    best_fixed_ratio.low (off best, i.e. None: ratio.high >= 1); None when an interval is missing."""
    raise NotImplementedError


def overall_honour(checks: Sequence[HonourCheck]) -> str:
    """'not honoured' if any level is; else 'honoured' if any is; else 'undetermined' if any is;
    else 'not applicable'."""
    raise NotImplementedError


def verification_reasons(levels: Sequence[LevelVerify], suspect: int) -> list[str]:
    """Why a verification fails, one line each: a level whose as_good is False (with both
    ratios), a level whose as_good is None (no interval to tell), suspect > 0 divergences. []:
    it passed (honouring is judged separately)."""
    raise NotImplementedError


def variant_score(choices: Sequence[LevelChoice]) -> float:
    """Mean over levels of log(chosen point) (off: 0): how good a variant's schedule is, to pick
    among variants (higher is better)."""
    raise NotImplementedError


def units_problem(concurrency: Sequence[int], requests_per_set: int, repeat: int, min_units: int) -> str | None:
    """None when every level gives at least ``min_units`` independent units, else one sentence
    saying which level falls short, how many units it gives and what to change. Units: at
    concurrency 1 one per request of the set per repeat (requests_per_set * repeat); at N > 1 one
    per repeat. E.g. "--concurrency 4 gives 3 units (one per --repeat); intervals need 5: give
    --repeat 5"; at 1: "... gives 4 units (prompts x --repeat); intervals need 5: give --repeat 2
    or more prompts"."""
    raise NotImplementedError

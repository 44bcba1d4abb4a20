"""`specadapt tune`: sweep draft lengths against the spec-off server, choose k per batch size,
then verify the emitted configuration.

The sweep. The spec-off server stays up for the whole run. Each candidate (the base config
with one k, and for n-gram one lookup window) runs beside it, one candidate at a time, as a
full A/B (orchestration.compare.run_compare: interleaved requests, ratios with intervals per
concurrency level, per-position acceptance from the candidate's counters, identity with
triage). A candidate whose server fails or dies is recorded with the reason and the sweep goes
on; if the spec-off server dies the sweep stops and what was measured is kept (partial).

Run until decided (``settings.sequential``). Each candidate's A/B runs under compare's rule, so
each (k, batch size) cell stops as soon as its objective ratio against spec-off is decided
(faster, slower, equivalent) or at the cap; besides, a cell stops ("dropped") once its interval's
high end lies below the best low end found so far at the same batch size among the earlier
candidates of its variant (no suspect divergence): it cannot beat that cell. Both intervals are
anytime-valid, so the drop holds whenever it is made. The verification keeps the fixed design.

The choice (analysis/tune_model.py). Per level, a cost model fitted to the candidates (shown
with its fit quality), and the best *measured* k (0 = off included), with how sure that is.
Candidates with suspect divergences cannot be chosen. With several variants (lookup windows),
the variant whose choices score best gives the schedule. Levels become batch-size ranges.

The verification. The emitted configuration runs beside the spec-off server on the same
workload: at each level its ratio must reach the best fixed-k's (within the intervals),
identity must hold (no suspect divergence), and the per-position counters must show that the
server drafted fewer tokens where the schedule says so (tune_model.honour_check).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import ContextManager

from specadapt.adapters.base import Server
from specadapt.analysis import tune_model as tm
from specadapt.analysis.diagnosis import diagnose_tune
from specadapt.analysis.speed import level_design, unit_logs, unit_name
from specadapt.analysis.tune_model import ranges_text
from specadapt.configs.spec import SpecConfig
from specadapt.errors import ServerError
from specadapt.load.progress import Progress, ProgressBars
from specadapt.orchestration.compare import ABRunner, run_compare
from specadapt.orchestration.probe import exit_reason
from specadapt.records import CompareReport, CompareSettings, LevelResult, Prompt, RatioCI
from specadapt.records.schedule import k_for_batch
from specadapt.records.tune import Candidate, CellOutcome, LevelChoice, LevelVerify, Recommendation, TuneReport, Verification

OpenServer = Callable[["SweepCandidate"], ContextManager[Server]]


@dataclass(frozen=True)
class SweepCandidate:
    """One configuration to measure: k = 0 is the spec-off server itself."""

    label: str
    variant: str
    k: int
    spec: SpecConfig | None = None
    url: str | None = None  # a running server given with --on; None: started


def candidates_for(base: SpecConfig, ks: Sequence[int], ngram_max: Sequence[int] = ()) -> list[SweepCandidate]:
    """The sweep's candidates: the base config with each k (schedules and on/off limits of the
    base dropped: every candidate is one fixed k), for n-gram once per lookup window."""
    fixed = base.model_copy(update={"k_per_batch_size": None, "draft_len_schedule": None, "max_concurrency": None})
    windows: list[int | None] = list(ngram_max) or [None]
    out = [SweepCandidate(label="off", variant="", k=0)] if 0 in ks else []
    for window in windows:
        variant = f"ngram_max={window}" if window is not None else ""
        for k in sorted(k for k in set(ks) if k > 0):
            update: dict = {"k": k}
            if window is not None:
                update["ngram_max"] = window
                update["ngram_min"] = min(fixed.ngram_min or 1, window)
            label = f"k={k}" + (f" {variant}" if variant else "")
            out.append(SweepCandidate(label=label, variant=variant, k=k, spec=fixed.model_copy(update=update)))
    return out


def died(server: Server | None) -> bool:
    """A server specadapt started whose process has exited (a given server never counts)."""
    process = getattr(server, "process", None)
    return process is not None and not process.alive()


def _copy(settings: CompareSettings) -> CompareSettings:
    return settings.model_copy(deep=True)


Best = tuple[str, RatioCI]
"""(label, objective interval) of the best cell so far at one batch size."""


class CellRunner(ABRunner):
    """compare's runner (its order, its rule) with the sweep's drop: after a unit that the rule
    does not stop on, the level stops too when its interval cannot beat ``bests[level]``
    (tune_model.drop_interval); ``dropped`` records {level: the cell it could not beat}."""

    def __init__(self, *args, bests: Mapping[int, Best], **kwargs):
        super().__init__(*args, **kwargs)
        self.bests, self.dropped = bests, {}

    def _unit_done(self, level_out, unit, level, rate=None) -> bool:
        if super()._unit_done(level_out, unit, level, rate):
            return True
        design, best = self.settings.sequential, self.bests.get(level)
        if design is None or best is None or rate is not None:
            return False
        d = level_design(design, level, rate)
        logs = unit_logs(level_out, level, rate)[d.primary]
        if tm.drop_interval(logs, d, unit_name(level, rate), best[1]) is None:
            return False
        self.dropped[level] = best
        return True


def run_cells(off: Server, on: Server, prompts: list[Prompt], settings: CompareSettings, progress: Progress | None,
              bests: Mapping[int, Best]) -> tuple[CompareReport, dict[int, Best]]:
    """One candidate's A/B, run_compare with CellRunner: (its report, {level: the cell each dropped
    level could not beat})."""
    runners: list[CellRunner] = []

    def runner_for(*args) -> CellRunner:
        runners.append(CellRunner(*args, bests=bests))
        return runners[-1]

    report = run_compare(off, on, prompts, settings, progress, runner_for=runner_for)
    return report, runners[-1].dropped


def bests_so_far(report: TuneReport, variant: str) -> dict[int, Best]:
    """{level: the best cell so far} among the variant's measured candidates without a suspect
    divergence (the ones that may be chosen): the highest low end of the objective ratio."""
    out = {}
    for level in report.settings.concurrency:
        cells = [(c.label, tm.objective_ratio(lv, report.settings.objective))
                 for c in _measured(report, variant) if not c.suspect and (lv := level_of(c.compare, level))]
        best = tm.best_cell(cells)
        if best is not None:
            out[level] = best
    return out


def cell_outcomes(compare: CompareReport, dropped: Mapping[int, Best], objective: str) -> list[CellOutcome]:
    """Each level's outcome as a cell of the sweep; a dropped level's compare outcome says so too."""
    cells = []
    for lv in compare.levels:
        if lv.sequential is None:
            continue
        cell = tm.cell_outcome(lv.concurrency, lv.sequential, objective, dropped.get(lv.concurrency))
        if cell.stopped == "dropped":
            lv.sequential = lv.sequential.model_copy(update={"stopped": "dropped", "text": cell.text})
        cells.append(cell)
    return cells


def run_sweep(report: TuneReport, off: Server, candidates: Sequence[SweepCandidate], open_candidate: OpenServer,
              prompts: list[Prompt], settings: CompareSettings, bars: ProgressBars,
              requests_per_side: int) -> None:
    """Measure every candidate beside ``off`` (one bar each), appending to ``report.candidates`` as each
    ends (so an interrupted run keeps what it measured). Marks the report partial when ``off`` dies.
    With ``settings.sequential`` each cell runs until decided, or until dropped (CellRunner)."""
    for i, cand in enumerate(candidates):
        if cand.k == 0:
            report.candidates.append(Candidate(label="off", variant=cand.variant, k=0, status="baseline",
                                               url=report.off_server.base_url if report.off_server else None))
            continue
        entry = Candidate(label=cand.label, variant=cand.variant, k=cand.k, url=cand.url,
                          spec=cand.spec.model_dump(exclude_defaults=True) if cand.spec else None)
        try:
            with open_candidate(cand) as server:
                tick = bars(f"{cand.label} vs off", 2 * requests_per_side)
                entry.url = server.base_url
                if settings.sequential is None:
                    compare = run_compare(off, server, prompts, _copy(settings), tick)
                else:
                    compare, dropped = run_cells(off, server, prompts, _copy(settings), tick,
                                                 bests_so_far(report, cand.variant))
                    entry.cells = cell_outcomes(compare, dropped, report.settings.objective)
                if died(server):
                    raise ServerError(exit_reason(server, cand.label))
        except ServerError as err:
            entry.status, entry.error = "failed", str(err)
        else:
            entry.compare = compare
            entry.suspect = compare.counts.get("suspect", 0)
        report.candidates.append(entry)
        if died(off):
            _stop(report, candidates[i + 1:], exit_reason(off, "spec-off"))
            return


def _stop(report: TuneReport, rest: Sequence[SweepCandidate], reason: str) -> None:
    report.partial, report.partial_reason = True, reason
    for cand in rest:
        report.candidates.append(Candidate(label=cand.label, variant=cand.variant, k=cand.k, status="not run",
                                           error="the sweep stopped before it"))


# --- analysis -----------------------------------------------------------------------------------
def level_of(compare: CompareReport | None, concurrency: int) -> LevelResult | None:
    if compare is None:
        return None
    return next((lv for lv in compare.levels if lv.concurrency == concurrency), None)


def _variants(report: TuneReport) -> list[str]:
    return list(dict.fromkeys(c.variant for c in report.candidates if c.k > 0))


def _measured(report: TuneReport, variant: str) -> list[Candidate]:
    return [c for c in report.candidates if c.variant == variant and c.compare is not None]  # k = 0 has none


def _excluded(report: TuneReport, variant: str) -> dict[int, str]:
    out = {}
    for c in report.candidates:
        if c.k > 0 and c.variant == variant:
            if c.compare is None:  # failed or not run
                out[c.k] = f"not measured: {c.error or c.status}"
            elif c.suspect:
                out[c.k] = f"{c.suspect} prompt(s) with a suspect divergence: output changed beyond a near-tie"
    return out


def _options(report: TuneReport, variant: str, concurrency: int, keep_excluded: bool = False
             ) -> dict[int, RatioCI | None]:
    """{k: objective ratio at this level} of the variant's eligible measured candidates (with
    ``keep_excluded``, of all its measured ones: choose_level leaves the excluded out itself, and
    needs them to tell a measured but excluded k from one that was not measured)."""
    excluded = {} if keep_excluded else _excluded(report, variant)
    out: dict[int, RatioCI | None] = {}
    for c in _measured(report, variant):
        if c.k in excluded:
            continue
        lv = level_of(c.compare, concurrency)
        out[c.k] = tm.objective_ratio(lv, report.settings.objective) if lv else None
    return out


def analyse(report: TuneReport, given_schedule: Sequence[tuple[int, int, int]] | None = None) -> None:
    """Fits, per-level choices, the schedule and the recommendation, from the measured candidates.
    ``given_schedule`` (--schedule): recommend that schedule instead of the chosen one (the choices
    are still made: they are what the verification compares against)."""
    s = report.settings
    best: tuple[float, str, list[LevelChoice]] | None = None
    report.fits = []
    for variant in _variants(report):
        measured = _measured(report, variant)
        if not measured:
            continue
        labels = {c.k: c.label for c in measured}
        choices = []
        for level in s.concurrency:
            points = [(c.k, lv) for c in measured if (lv := level_of(c.compare, level)) is not None]
            fit = tm.fit_level(level, points, variant)
            report.fits.append(fit)
            choices.append(tm.choose_level(level, _options(report, variant, level, keep_excluded=True),
                                           _excluded(report, variant), fit, labels))
        score = tm.variant_score(choices)
        if best is None or score > best[0]:
            best = (score, variant, choices)
    if best is None:
        report.choices = []
        report.recommendation.summary = "nothing was measured: no candidate ran to the end"
        return
    _, variant, choices = best
    report.choices = choices
    schedule, note = tm.build_schedule(choices, s.max_batch_size)
    report.schedule_ranges_note = note
    per_level = {lv: _options(report, variant, lv) for lv in s.concurrency}
    eligible = sorted({k for opts in per_level.values() for k in opts})
    fallback = tm.fixed_fallback(per_level, eligible)
    report.recommendation = tm.recommendation(schedule, choices, fallback, variant)
    if given_schedule is not None:
        ranges = [tuple(r) for r in given_schedule]
        report.recommendation = Recommendation(
            form="schedule", variant=variant, k=max(k for _, _, k in ranges), schedule=ranges,
            fixed_fallback_k=fallback,
            summary=f"The schedule given with --schedule ({ranges_text(ranges)}), verified against the best "
                    f"fixed k at each level; the sweep alone would choose {ranges_text(schedule)}.")
        report.schedule_ranges_note = "the schedule was given with --schedule"
    report.diagnosis = diagnose_tune(report)
    if len(_variants(report)) > 1:
        report.notes.append(f"the schedule uses the variant {variant or 'of the base config'}, whose choices "
                            f"scored best over the levels")


def fixed_candidate(report: TuneReport, k: int, variant: str) -> Candidate | None:
    return next((c for c in _measured(report, variant) if c.k == k), None)


# --- verification -------------------------------------------------------------------------------
def recommended_spec(report: TuneReport, base: SpecConfig) -> SpecConfig:
    """The speculative config of the recommended variant (its candidates differ in k alone; the
    caller sets k), or ``base`` when none of them has one."""
    spec = next((c.spec for c in report.candidates if c.variant == report.recommendation.variant and c.spec), None)
    return SpecConfig.model_validate(spec) if spec else base


def verification_spec(report: TuneReport, base: SpecConfig) -> SpecConfig | None:
    """The speculative config the verification runs: the recommendation's (None for off/none)."""
    rec = report.recommendation
    if rec.form in ("off", "none"):
        return None
    spec = recommended_spec(report, base)
    schedule = [tuple(r) for r in rec.schedule] if rec.form == "schedule" else None
    return spec.model_copy(update={"k": rec.k, "k_per_batch_size": schedule})


def judge_verification(report: TuneReport, compare: CompareReport) -> Verification:
    """The verification run's figures against the sweep's best fixed k at each level."""
    rec, s = report.recommendation, report.settings
    engine_fixed = fixed_candidate(report, rec.k, rec.variant)
    levels: list[LevelVerify] = []
    checks = []
    for choice in report.choices:
        level = choice.concurrency
        scheduled = k_for_batch(rec.schedule, level, rec.k)  # a fixed form's ranges all have k
        lv = level_of(compare, level)
        if lv is None:
            continue
        honour = None
        if rec.form == "schedule":
            fixed_lv = level_of(engine_fixed.compare if engine_fixed else None, level)
            honour = tm.honour_check(level, scheduled, rec.k, lv.acceptance, fixed_lv.acceptance if fixed_lv else None)
            checks.append(honour)
        levels.append(tm.verify_level(level, scheduled, tm.objective_ratio(lv, s.objective), choice.k, choice.ratio,
                                      honour))
    suspect = compare.counts.get("suspect", 0)
    reasons = tm.verification_reasons(levels, suspect)
    return Verification(status="failed" if reasons else "passed", compare=compare, levels=levels,
                        honoured=tm.overall_honour(checks),
                        suspect=suspect, near_tie=compare.counts.get("near-tie", 0), reasons=reasons,
                        url=compare.on_server.base_url)


def settle_recommendation(report: TuneReport) -> None:
    """After verification: whether the recommendation stands as verified, and what to deploy on a
    server that did not honour the schedule."""
    rec, ver = report.recommendation, report.verification
    if ver.status == "not run":
        if rec.form in ("schedule", "fixed"):
            rec.summary += f" Not verified: {ver.reason}."
        return
    if ver.honoured == "not honoured":
        k = rec.fixed_fallback_k
        fallback = "speculation off" if not k else f"the fixed k={k} (measured in the sweep)"
        rec.summary += (f" This server did not honour the schedule (its counters show drafts above the scheduled k "
                        f"at larger batch sizes): on this build deploy {fallback}; keep the schedule for a build "
                        f"that applies it.")
        rec.verified = False
        return
    rec.verified = ver.status == "passed"
    if ver.status == "passed":
        rec.summary += " Verified: the emitted configuration ran as fast as the best fixed k at every level " \
                       "(within the intervals), with no suspect divergence."
        if ver.honoured == "undetermined":
            rec.summary += " Whether the server applied the schedule could not be told from its counters."
    else:
        rec.summary += " Verification FAILED: " + "; ".join(ver.reasons) + "."


def run_verification(report: TuneReport, off: Server, open_verify: Callable[[SpecConfig], ContextManager[Server]],
                     spec: SpecConfig, prompts: list[Prompt], settings: CompareSettings, bars: ProgressBars,
                     requests_per_side: int) -> None:
    """Run the emitted config beside ``off`` (one bar) and judge it; a server failure makes the
    verification 'failed' with the reason (the sweep's results stay)."""
    try:
        with open_verify(spec) as server:
            tick = bars("verifying", 2 * requests_per_side)
            compare = run_compare(off, server, prompts, _copy(settings), tick)
            if died(server):
                raise ServerError(exit_reason(server, "verification"))
    except ServerError as err:
        report.verification = Verification(status="failed", reason=str(err), reasons=[str(err)])
        return
    report.verification = judge_verification(report, compare)


def exit_code(report: TuneReport) -> int:
    """0: a recommendation stands; 1: the verification failed on speed (on a server that honoured
    the schedule) or found a suspect divergence, or nothing could be recommended."""
    ver = report.verification
    if report.recommendation.form == "none":
        return 1
    if ver.suspect:
        return 1
    if ver.status == "failed" and ver.honoured != "not honoured":
        return 1
    return 0

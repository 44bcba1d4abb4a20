"""A/B: the same prompts against a spec-off and a spec-on server, interleaved.

Interleaving. At concurrency 1 every (prompt, repeat) goes to both servers back to back,
the order alternating from one prompt to the next and, for each prompt, from one repeat
to the next (off-on, on-off, ...), so slow drift of the machine and any advantage of
going first or second hit both sides alike. At concurrency N > 1 a block of at least 2N
requests (the prompt set, copied as often as needed) runs against one server at a time,
and the blocks alternate off/on, on/off with the repeats; repeat r starts the prompt set at
prompt r, so a prompt is batched with other partners, at other positions, from one repeat to
the next. Warm-up requests go to both
servers first and are discarded. The spec-on server's counters are read before and after
each concurrency level, so acceptance is known per level.

With ``settings.interference_check``, a run at concurrency 1 with the sides interleaved and
fewer pairs there than the check sends continues, after the warm-up, with the interference
check (orchestration/interference_check.py): a few short requests that tell whether the
servers stall each other's first token; its finding goes into the report
(``interference_check``), its requests do not. A run with as many pairs or more shows the order
by its own records, judged by the same rule; one server given as both sides is not checked.

Run until decided (``settings.sequential``): the same order, but a level has no fixed number of
repeats. At concurrency 1 the pairs go prompt by prompt as above, cycling through the prompt set
(repeat 0, 1, ...), and after each pair (a conversation's turns back to back) the rule decides on
the level's units so far (analysis/speed.py ``should_stop``: the anytime-valid confidence sequence
of the primary ratio, analysis/sequential.py); above 1 and at arrival rates it decides after each
repeat's off block + on block. A level stops at a verdict (with at least ``min_units`` pairs at
concurrency 1) or at ``max_units`` units. With ``fail_divergences``, the whole run stops, every
level, once that many prompts have diverged (the gate can no longer pass); the report says so in a
note. The rule needs both servers up at once (``ONE_AFTER_THE_OTHER``).

The figures and verdicts from the records: analysis/speed.py (ratios, crossovers, theory),
analysis/identity.py (identity), analysis/diagnosis.py (why).
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Iterable

from specadapt.adapters.base import Server, TokenRequests
from specadapt.adapters.registry import get_backend
from specadapt.analysis.activity import spec_activity
from specadapt.analysis.lossy import lossy_reasons_of
from specadapt.analysis.pairs import pair_key, sides_by_pair
from specadapt.analysis.diagnosis import DraftCost, diagnose_compare, draft_cost_from_configs
from specadapt.analysis.identity import default_threshold, first_divergence, identity_report
from specadapt.analysis.sections import analyse_sections
from specadapt.analysis.speed import analyse, compare_notes, should_stop
from specadapt.configs.checks import load_model_config
from specadapt.errors import SpecadaptError, UsageError
from specadapt.load.arrivals import arrivals_for_duration
from specadapt.load.client import run as run_loop
from specadapt.load.engine import Job, turn_prompt, turns_of
from specadapt.load.executors import executor_for
from specadapt.load.plan import Stamp, closed_jobs, rate_jobs, split
from specadapt.load.progress import Progress
from specadapt.load.spread import Executor, InProcess, WorkerStopped, target_of
from specadapt.orchestration.interference_check import check_sides, needs_check
from specadapt.orchestration.counters import CounterWindow, counting, settle_counters
from specadapt.orchestration.probe import exit_reason, with_spec_extras
from specadapt.orchestration.readable import readable_answers
from specadapt.orchestration.reference_check import ReferenceScorer
from specadapt.orchestration.triage import path_triage, readable_token, readable_tokens, server_triage
from specadapt.records import (
    CompareReport,
    CompareSettings,
    CounterPair,
    Prompt,
    RequestRecord,
    RequestSettings,
)
from specadapt.records.interference import InterferenceFinding
from specadapt.records.load import rate_label


def side_settings(server: Server, base: RequestSettings, temperature: float | None = None) -> RequestSettings:
    """Request settings for one side: the server's speculation and identity extras (its answers' own
    speculation counts; token ids) merged in."""
    extras = {**with_spec_extras(base, server).extra_body, **server.identity_extras}
    update: dict = {"extra_body": extras}
    if temperature is not None:
        update["temperature"] = temperature
    return base.model_copy(update=update)


def rotated(prompts: list[Prompt], r: int) -> list[Prompt]:
    """The prompt set started at prompt r (mod its size): repeat r of a concurrent block sends the
    same prompts in another order, so a prompt meets other partners in its batches, at other
    positions, from one repeat to the next (both sides get the same order)."""
    if not prompts:
        return prompts
    i = r % len(prompts)
    return prompts[i:] + prompts[:i]


def copies_for(concurrency: int, n_prompts: int) -> int:
    """Copies of the prompt set in one block: blocks at concurrency N hold at least 2N requests."""
    return 1 if concurrency == 1 else max(1, math.ceil(2 * concurrency / n_prompts))


ONE_AFTER_THE_OTHER = ("--until-decided needs both servers up at once: started one after the other (--launch "
                       "sequential) there are no off/on pairs to look at as they come; use --launch parallel or "
                       "shared")
"""Why the run-until-decided rule is refused with the servers started one after the other."""


def _per_set(n_prompts: int, prompts: list[Prompt] | None) -> int:
    """Requests per side of one pass over the prompt set (a conversation counts its turns)."""
    return sum(turns_of(p) for p in prompts) if prompts else n_prompts


def _block_requests(settings: CompareSettings, n_prompts: int, per_set: int, passes: int, concurrency: int,
                    rate: float | None) -> int:
    """Both sides' requests of ``passes`` repeats at one level (--duration at a concurrency not foreseen)."""
    if rate is None:
        return 2 * passes * per_set * copies_for(concurrency, n_prompts)
    load = settings.load
    n = arrivals_for_duration(rate, load.duration_s) if load.duration_s and not math.isinf(rate) else n_prompts
    return 2 * passes * n * per_set // max(1, n_prompts)


def _capped_pairs_requests(n_prompts: int, prompts: list[Prompt] | None, max_units: int) -> int:
    """Both sides' requests at concurrency 1 when the rule runs to its cap: pairs prompt by prompt,
    cycling through the set, a conversation's turns back to back, until ``max_units`` pairs are in."""
    turns = [turns_of(p) for p in prompts] if prompts else [1] * n_prompts
    units, sent = 0, 0
    while turns and units < max_units:  # max_units >= 2 (SequentialDesign): at least one prompt's turns
        units += turns[sent % len(turns)]
        sent += 1
    return 2 * units


def total_requests(n_prompts: int, settings: CompareSettings, prompts: list[Prompt] | None = None) -> int:
    """Requests of a whole A/B run, both sides and the warm-up included (for progress bars; with
    ``prompts``, a conversation counts its turns; --duration at a concurrency is not foreseen).
    With the run-until-decided rule, the most it can send: every level at its cap."""
    per_set = _per_set(n_prompts, prompts)
    design = settings.sequential
    total = 2 * settings.warmup
    for c in settings.concurrency:
        if design is not None and c == 1:
            total += _capped_pairs_requests(n_prompts, prompts, design.max_units)
        else:
            passes = settings.repeat if design is None else design.max_units
            total += _block_requests(settings, n_prompts, per_set, passes, c, None)
    load = settings.load
    for rate in (load.request_rates if load else []):
        passes = settings.repeat if design is None else design.max_units
        total += _block_requests(settings, n_prompts, per_set, passes, 0, rate)
    return total


def fixed_requests(settings: CompareSettings, prompts: list[Prompt]) -> dict[tuple[int, float | None], int | None]:
    """What today's fixed design (--repeat passes, copies at N > 1) sends per level, both sides, by
    (concurrency, None) and (0, request rate): the run-until-decided rule's requests are set against
    it. None at a concurrency N > 1 with --duration (the time, not the count, sets a block there)."""
    n, per_set, load = len(prompts), _per_set(len(prompts), prompts), settings.load
    out: dict[tuple[int, float | None], int | None] = {}
    for c in settings.concurrency:
        timed = c > 1 and load is not None and load.duration_s is not None
        out[(c, None)] = None if timed else _block_requests(settings, n, per_set, settings.repeat, c, None)
    for rate in (load.request_rates if load else []):
        out[(0, rate)] = _block_requests(settings, n, per_set, settings.repeat, 0, rate)
    return out


class ABRunner:
    """Runs the interleaved A/B workload and returns the raw records and counter deltas; every block
    goes through ``executor`` (this process, worker processes or Ray actors)."""

    def __init__(self, off: Server, on: Server, prompts: list[Prompt], settings: CompareSettings,
                 progress: Progress | None = None, executor: Executor | None = None):
        self.off, self.on, self.prompts, self.settings, self.progress = off, on, prompts, settings, progress
        self.req_off = side_settings(off, settings.request)
        self.req_on = side_settings(on, settings.request, settings.on_temperature)
        self.rate_counters: dict[str, dict[str, CounterPair]] = {"off": {}, "on": {}}
        self.executor = executor or InProcess()
        self.targets = {"off": [target_of(off)], "on": [target_of(on)]}
        self.interference_check: InterferenceFinding | None = None
        self.diverged: list[str] = []  # with the rule: prompts whose pairs diverged so far, in order
        self.identity_stop: str | None = None  # with the rule: why the whole run stopped early to fail

    def _request(self, side: str) -> RequestSettings:
        return self.req_on if side == "on" else self.req_off

    async def _block(self, side: str, jobs: list[Job], concurrency: int | None, stamp: Stamp, t0: int | None = None,
                     duration_s: float | None = None) -> list[RequestRecord]:
        """One side's block: ``jobs`` split over the executor's workers, its records in job order."""
        shares = split(jobs, self._request(side), concurrency, self.settings.workers, duration_s=duration_s,
                       cycle="copy_index", stamp=stamp)
        result = await self.executor.run(shares, self.targets[side], self.progress, t0_ns=t0)
        if result.partial_reason is not None:
            raise WorkerStopped(result.partial_reason)
        return result.records

    async def run(self, sides: tuple[str, ...] = ("off", "on")
                  ) -> tuple[list[RequestRecord], dict[int, CounterPair], dict[int, CounterPair]]:
        """Records, and for each level the (before, after) counters of the on and off servers.

        ``sides`` restricts the run to one server (servers started one after the other)."""
        s = self.settings
        if s.sequential is not None and len(sides) != 2:
            raise UsageError(ONE_AFTER_THE_OTHER)
        self._sides = sides
        servers = {"off": self.off, "on": self.on}
        records: list[RequestRecord] = []
        on_counters: dict[int, CounterPair] = {}
        off_counters: dict[int, CounterPair] = {}
        counters = {"off": off_counters, "on": on_counters}
        t0 = time.perf_counter_ns()
        try:
            for i in range(s.warmup):
                for side in sides:
                    job = Job(index=i, prompt=self.prompts[i % len(self.prompts)])
                    await self._block(side, [job], 1, Stamp(side=side, concurrency=1, warmup=True), t0)
            if self._checks_interference(sides):  # after the warm-up: a cold server's first request is no stall
                self.interference_check = await check_sides(
                    self.off, self.on, self.prompts[0], {"off": self.req_off, "on": self.req_on}, self.executor, t0,
                    warm=s.warmup == 0)
            for level in s.concurrency:
                if self.identity_stop is not None:  # the rule stopped the run to fail: no further level
                    break
                windows = {side: await CounterWindow(servers[side], settle_counters).open() for side in sides}
                records += await self._level(level, t0)
                for side in sides:
                    counters[side][level] = (await windows[side].close()).pair
            for rate in (s.load.request_rates if s.load else []):
                if self.identity_stop is not None:
                    break
                windows = {side: await CounterWindow(servers[side], settle_counters).open() for side in sides}
                records += await self._rate_level(rate)
                for side in sides:
                    self.rate_counters[side][rate_label(rate)] = (await windows[side].close()).pair
        finally:
            await self.executor.aclose()
        return records, on_counters, off_counters

    def _checks_interference(self, sides: tuple[str, ...]) -> bool:
        """The check runs when asked, at concurrency 1, with both sides interleaved on one clock, on two
        servers (one server given as both sides cannot stall "the other"), and only where the run's own
        pairs at concurrency 1 are fewer than the check's (``needs_check``): more of them show the order
        by themselves, judged by the same rule (analysis/interference.py)."""
        s = self.settings
        return (s.interference_check and 1 in s.concurrency and len(sides) == 2 and bool(self.prompts)
                and self.executor.shared_clock and self.off.base_url != self.on.base_url
                and needs_check(len(self.prompts) * s.repeat))

    def _order(self, n: int) -> tuple[str, ...]:
        """The sides in alternating order (off/on for even ``n``), those of this run only."""
        order = ("off", "on") if n % 2 == 0 else ("on", "off")
        return tuple(x for x in order if x in self._sides)

    def _repeats(self) -> Iterable[int]:
        """The repeats of a level: --repeat of them; with the rule as many as it takes (it stops the level)."""
        return range(self.settings.repeat) if self.settings.sequential is None else itertools.count()

    def _unit_done(self, level_out: list[RequestRecord], unit: list[RequestRecord], level: int,
                   rate: float | None = None) -> bool:
        """After a unit (``unit``: its records, ``level_out``: the level's so far): whether the level
        stops here. Never early in the fixed design; with the rule, at its verdict or cap, or when
        the run stops on identity."""
        design = self.settings.sequential
        if design is None:
            return False
        if design.fail_divergences is not None:
            self._judge_identity(unit, design.fail_divergences)
        return self.identity_stop is not None or should_stop(level_out, level, rate, design)

    def _judge_identity(self, unit: list[RequestRecord], fail_at: int) -> None:
        """Count the prompts whose pairs in ``unit`` diverged (tokens or text differ, as identity
        judges a pair); at ``fail_at`` of them the run stops: the gate can no longer pass."""
        for pair in sides_by_pair(unit).values():
            off, on = pair.get("off"), pair.get("on")
            if off is None or on is None or off.prompt_id in self.diverged:
                continue
            if first_divergence(off, on) is not None:
                self.diverged.append(off.prompt_id)
        if self.identity_stop is None and len(self.diverged) >= fail_at:
            shown = ", ".join(self.diverged[:10]) + (", ..." if len(self.diverged) > 10 else "")
            self.identity_stop = (f"the run stopped early to fail: {len(self.diverged)} prompt(s) diverged ({shown}), "
                                  f"more than the gate's limits on suspect and near-tie divergences allow together "
                                  f"({fail_at - 1}), so no further request could make it pass")

    async def _rate_level(self, rate: float) -> list[RequestRecord]:
        """Per repeat an off block and an on block on the same arrival schedule (seed + repeat),
        the order alternating off/on, on/off; each block timed from its own start."""
        s = self.settings
        out: list[RequestRecord] = []
        for r in self._repeats():
            jobs = rate_jobs(self.prompts, rate, s.load, block=r)
            unit: list[RequestRecord] = []
            for side in self._order(r):
                unit += await self._block(side, jobs, None, Stamp(side=side, concurrency=0, request_rate=rate))
            out += unit
            if self._unit_done(out, unit, 0, rate):
                break
        return out

    async def _level(self, level: int, t0: int) -> list[RequestRecord]:
        s = self.settings
        out: list[RequestRecord] = []
        if level == 1:
            for r in self._repeats():
                for i, p in enumerate(self.prompts):
                    unit: list[RequestRecord] = []
                    for side in self._order(r + i):  # a conversation's turns: back to back
                        unit += await self._block(side, [Job(index=i, prompt=p, repeat=r)], 1,
                                                  Stamp(side=side, concurrency=1), t0)
                    out += unit
                    if self._unit_done(out, unit, level):
                        return out
            return out
        copies = copies_for(level, len(self.prompts))
        duration = s.load.duration_s if s.load else None
        for r in self._repeats():
            prompts = rotated(self.prompts, r)  # each repeat batches a prompt with other partners, in another place
            unit = []
            for side in self._order(r):
                stamp = Stamp(side=side, concurrency=level)
                if duration is None:
                    jobs = closed_jobs(prompts, copies=copies, first_repeat=r)
                    unit += await self._block(side, jobs, level, stamp, t0)
                else:  # the block keeps N streams busy for the duration, cycling the prompts
                    unit += await self._block(side, closed_jobs(prompts, first_repeat=r), level, stamp,
                                              duration_s=duration)
            out += unit
            if self._unit_done(out, unit, level):
                break
        return out


def run_compare(off: Server, on: Server, prompts: list[Prompt], settings: CompareSettings,
                progress: Progress | None = None,
                runner_for: Callable[..., ABRunner] = ABRunner) -> CompareReport:
    """The whole A/B with both servers up: interleaved runs, then analysis and identity.
    ``runner_for``: makes the runner from (off, on, prompts, settings, progress, executor); tune's
    runner also drops cells that cannot beat the best."""
    settings.concurrency = sorted(set(settings.concurrency))
    off_info, on_info = off.describe(), on.describe()
    with counting(off, on), executor_for(settings.workers, settings.ray_address) as executor:
        runner = runner_for(off, on, prompts, settings, progress, executor)
        records, on_counters, off_counters = run_loop(runner.run())
    done = sum(1 for r in records if r.ok)
    exits = [exit_reason(server, label, f"{done} of {len(records)} requests had succeeded")
             for label, server in (("spec-off", off), ("spec-on", on))
             if server.process is not None and not server.process.alive()]
    report = CompareReport(settings=settings, off_server=off_info, on_server=on_info, requests=records,
                           counters_on=on_counters, counters_off=off_counters,
                           counters_on_rate=runner.rate_counters["on"], counters_off_rate=runner.rate_counters["off"],
                           interference_check=runner.interference_check, server_exits=exits,
                           notes=[runner.identity_stop] if runner.identity_stop else [])
    return finish_compare(report, off, prompts, runner.req_off)


def run_one_side(server: Server, side: str, prompts: list[Prompt], settings: CompareSettings,
                 progress: Progress | None = None):
    """One side only (servers started one after the other): (info, records, counters). The
    run-until-decided rule cannot run so (``ONE_AFTER_THE_OTHER``): UsageError before any request."""
    if settings.sequential is not None:
        raise UsageError(ONE_AFTER_THE_OTHER)
    settings.concurrency = sorted(set(settings.concurrency))
    info = server.describe()
    off, on = (server, server)
    with counting(server), executor_for(settings.workers, settings.ray_address) as executor:
        runner = ABRunner(off, on, prompts, settings, progress, executor)
        records, on_c, off_c = run_loop(runner.run(sides=(side,)))
    return info, records, (on_c if side == "on" else off_c)


def finish_compare(report: CompareReport, off: Server, prompts: list[Prompt],
                   off_request: RequestSettings) -> CompareReport:
    """Analysis, identity and triage (the spec-off server must still be up for triage)."""
    settings = report.settings
    records = report.requests
    analyse(report, fixed_requests(settings, prompts))
    threshold = settings.near_tie_threshold if settings.near_tie_threshold is not None \
        else default_threshold(settings.dtype)
    settings.near_tie_threshold = threshold
    scorer = None
    if settings.reference:
        scorer = ReferenceScorer(settings.reference)

    requests = token_requests_of(off)

    def triage(prompt: Prompt, div, off_rec: RequestRecord):
        asked = turn_request(records, prompt, off_rec)
        t = server_triage(off, asked, off_request, div, off_rec.tokens, threshold) if settings.triage else None
        if scorer is not None:
            t = scorer.triage(off, asked, div, off_rec, threshold, t)
        on_rec = partner(records, off_rec)
        if settings.triage and on_rec is not None:  # the spec-on answer on its own path, from its own history
            t = path_triage(off, turn_request(records, prompt, on_rec), on_rec, div, t, threshold, requests)
        return t

    report.identity = identity_report(records, prompts, triage)
    readable_tokens(off, [p.divergence for p in report.identity if p.divergence])
    for p in report.identity:
        if p.divergence and p.divergence.triage and p.divergence.triage.path_token:
            p.divergence.triage.path_token = readable_token(off, p.divergence.triage.path_token)
    report.counts = {v: sum(1 for p in report.identity if p.verdict == v)
                     for v in ("identical", "near-tie", "suspect", "unknown")}
    report.activity = spec_activity(report)
    report.lossy = lossy_reasons_of(report.on_server)
    analyse_sections(report, before_diagnosis=True)  # interference: the notes and the diagnosis read it
    report.notes += compare_notes(report)
    report.diagnosis = diagnose_compare(report, draft_cost_of(report))
    analyse_sections(report, before_diagnosis=False)
    readable_answers(off, report, settings.draw_prompts)  # the drawn answers in words where their tokens are ids
    return report


def partner(records: list[RequestRecord], off_rec: RequestRecord) -> RequestRecord | None:
    """The spec-on answer paired with ``off_rec`` (same prompt, level, repeat, copy and turn)."""
    return sides_by_pair(records).get(pair_key(off_rec), {}).get("on")


def token_requests_of(server: Server) -> TokenRequests:
    """How the server's backend asks for token ids and prompt logprobs; a backend that cannot be
    loaded asks for none (the path check is then skipped, and says so)."""
    try:
        return get_backend(server.backend).token_requests
    except SpecadaptError:
        return TokenRequests(sampled_ids=None, prompt_logprobs=None, output_ids=None)


def draft_cost_of(report: CompareReport) -> DraftCost | None:
    """The draft's own cost per draft token: --draft-cost, else for a draft model its parameters over
    the target's, where both are local HF directories (their config.json); None otherwise."""
    if report.settings.draft_cost is not None:
        return DraftCost(per_token=report.settings.draft_cost, source="--draft-cost")
    on = report.on_server
    target = on.model_root or on.model_id
    if not on.spec_draft or not target:
        return None
    try:  # the run is done: a config that cannot be read leaves the cost unknown, it fails nothing
        draft, target_cfg = load_model_config(on.spec_draft), load_model_config(target)
    except UsageError:
        return None
    if draft is None or target_cfg is None:
        return None
    return draft_cost_from_configs(draft, target_cfg)


def turn_request(records: list[RequestRecord], prompt: Prompt, rec: RequestRecord) -> Prompt:
    """The request ``rec`` was: for a later turn of a conversation, the prompt's messages with
    the same side's earlier answers and user turns (what was sent, so triage asks the same)."""
    if rec.turn == 0:
        return prompt
    earlier = {r.turn: r.text for r in records
               if (r.prompt_id, r.side, r.concurrency, r.request_rate, r.repeat, r.replica, r.warmup)
               == (rec.prompt_id, rec.side, rec.concurrency, rec.request_rate, rec.repeat, rec.replica, False)
               and r.turn < rec.turn}
    return turn_prompt(prompt, rec.turn, [earlier.get(i, "") for i in range(rec.turn)])

"""A/B: the same prompts against a spec-off and a spec-on server, interleaved.

Interleaving. At concurrency 1 every (prompt, repeat) goes to both servers back to back,
the order alternating from one prompt to the next and, for each prompt, from one repeat
to the next (off-on, on-off, ...), so slow drift of the machine and any advantage of
going first or second hit both sides alike. At concurrency N > 1 a block of at least 2N
requests (the prompt set, copied as often as needed) runs against one server at a time,
and the blocks alternate off/on, on/off with the repeats. Warm-up requests go to both
servers first and are discarded. The spec-on server's counters are read before and after
each concurrency level, so acceptance is known per level.

Analysis (formulas in probes/stats.py). The unit of independence at concurrency 1 is one
off/on pair; at concurrency N > 1 it is one repeat's off block + on block, whose requests
share the machine's state (never the single request pairs inside it). Per prompt the
units are its pairs at concurrency 1 and its copies in each repeat's blocks at N > 1.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from typing import Callable

from specadapt.adapters.base import Server
from specadapt.configs.checks import load_model_config
from specadapt.errors import UsageError
from specadapt.native_reference import theory
from specadapt.probes.acceptance import acceptance_summary
from specadapt.probes.arrivals import arrivals_for_duration, rate_label, schedule_ns, send_lag_blocks
from specadapt.probes.client import run as run_loop
from specadapt.probes.client import stream_request
from specadapt.probes.diagnosis import DraftCost, diagnose_compare, draft_cost_from_configs
from specadapt.probes.equivalence import default_threshold, identity_report, readable_tokens, server_triage
from specadapt.probes.latency import latency_summary, tpot_ns
from specadapt.probes.load import Job, LoadEngine, cycle_jobs, turn_prompt, turns_of
from specadapt.probes.pairs import Pair, level_records, pair_records
from specadapt.probes.reference_check import ReferenceScorer
from specadapt.probes.runner import counting, server_client, settle_counters
from specadapt.probes.sides import side_differences
from specadapt.probes.slo import compare_goodput
from specadapt.probes.stats import find_crossover, log_latency_ratio, log_rate_ratio, ratio_ci
from specadapt.records import (
    CompareReport,
    CompareSettings,
    CounterPair,
    CounterSnapshot,
    LevelResult,
    Prompt,
    PromptSpeed,
    RequestRecord,
    RequestSettings,
    SpeedRatios,
    TheoryCheck,
)
from specadapt.records.load import GoodputComparison, LoadSettings, SendLag

Progress = Callable[[RequestRecord], None]


def side_settings(server: Server, base: RequestSettings, temperature: float | None = None) -> RequestSettings:
    """Request settings for one side: the server's identity extras (e.g. token ids) merged in."""
    extras = {**base.extra_body, **server.identity_extras}
    update: dict = {"extra_body": extras}
    if temperature is not None:
        update["temperature"] = temperature
    return base.model_copy(update=update)


def rate_jobs(prompts: list[Prompt], rate: float, load: LoadSettings, repeat: int) -> list[Job]:
    """One block at an arrival rate: ceil(rate * duration) arrivals with --duration (else, and at
    rate inf, the prompt set once), prompts cycled, on the schedule of seed + repeat."""
    n = len(prompts)
    if load.duration_s is not None and not math.isinf(rate):
        n = arrivals_for_duration(rate, load.duration_s)
    offsets = schedule_ns(rate, n, load.burstiness, load.seed + repeat)
    return [Job(prompt=prompts[i % len(prompts)], repeat=repeat, copy_index=i // len(prompts), offset_ns=off)
            for i, off in enumerate(offsets)]


def copies_for(concurrency: int, n_prompts: int) -> int:
    """Copies of the prompt set in one block: blocks at concurrency N hold at least 2N requests."""
    return 1 if concurrency == 1 else max(1, math.ceil(2 * concurrency / n_prompts))


def total_requests(n_prompts: int, settings: CompareSettings, prompts: list[Prompt] | None = None) -> int:
    """Requests of a whole A/B run, both sides and the warm-up included (for progress bars; with
    ``prompts``, a conversation counts its turns; --duration at a concurrency is not foreseen)."""
    per_set = sum(turns_of(p) for p in prompts) if prompts else n_prompts
    total = 2 * settings.warmup + sum(2 * settings.repeat * per_set * copies_for(c, n_prompts)
                                      for c in settings.concurrency)
    load = settings.load
    for rate in (load.request_rates if load else []):
        n = arrivals_for_duration(rate, load.duration_s) if load.duration_s and not math.isinf(rate) else n_prompts
        total += 2 * settings.repeat * n * per_set // max(1, n_prompts)
    return total


class ABRunner:
    """Runs the interleaved A/B workload and returns the raw records and counter deltas."""

    def __init__(self, off: Server, on: Server, prompts: list[Prompt], settings: CompareSettings,
                 progress: Progress | None = None):
        self.off, self.on, self.prompts, self.settings, self.progress = off, on, prompts, settings, progress
        self.req_off = side_settings(off, settings.request)
        self.req_on = side_settings(on, settings.request, settings.on_temperature)
        self.rate_counters: dict[str, dict[str, CounterPair]] = {"off": {}, "on": {}}

    async def _send(self, client, side: str, prompt: Prompt, t0: int, level: int, repeat: int, copy: int,
                    warmup: bool = False, rate: float | None = None) -> RequestRecord:
        req = self.req_on if side == "on" else self.req_off
        rec = await stream_request(client, prompt, self._model[side], req, t0, repeat=repeat, warmup=warmup)
        rec.side, rec.concurrency, rec.replica = side, level, copy  # type: ignore[assignment]
        rec.request_rate = rate
        if self.progress:
            self.progress(rec)
        return rec

    def _engine(self, client, side: str, t0: int, level: int, rate: float | None = None) -> LoadEngine:
        """The load engine of one side at one level, every request timed from ``t0``."""
        async def send(prompt: Prompt, job: Job, turn: int) -> RequestRecord:
            return await self._send(client, side, prompt, t0, level, job.repeat, job.copy_index, rate=rate)
        return LoadEngine(send)

    async def run(self, sides: tuple[str, ...] = ("off", "on")
                  ) -> tuple[list[RequestRecord], dict[int, CounterPair], dict[int, CounterPair]]:
        """Records, and for each level the (before, after) counters of the on and off servers.

        ``sides`` restricts the run to one server (servers started one after the other)."""
        s = self.settings
        self._sides = sides
        servers = {"off": self.off, "on": self.on}
        records: list[RequestRecord] = []
        on_counters: dict[int, CounterPair] = {}
        off_counters: dict[int, CounterPair] = {}
        self._model = {side: servers[side].model_id for side in sides}
        counters = {"off": off_counters, "on": on_counters}
        t0 = time.perf_counter_ns()
        async with contextlib.AsyncExitStack() as stack:
            clients = {side: await stack.enter_async_context(server_client(servers[side], s.request, max(s.concurrency)))
                       for side in sides}
            for i in range(s.warmup):
                for side in sides:
                    await self._send(clients[side], side, self.prompts[i % len(self.prompts)], t0, 1, 0, 0, True)
            for level in s.concurrency:
                before = {side: await asyncio.to_thread(settle_counters, servers[side]) for side in sides}
                records += await self._level(clients, level, t0)
                for side in sides:
                    counters[side][level] = CounterPair(
                        before=before[side], after=await asyncio.to_thread(settle_counters, servers[side]))
            for rate in (s.load.request_rates if s.load else []):
                before = {side: await asyncio.to_thread(settle_counters, servers[side]) for side in sides}
                records += await self._rate_level(clients, rate)
                for side in sides:
                    self.rate_counters[side][rate_label(rate)] = CounterPair(
                        before=before[side], after=await asyncio.to_thread(settle_counters, servers[side]))
        return records, on_counters, off_counters

    async def _rate_level(self, clients, rate: float) -> list[RequestRecord]:
        """Per repeat an off block and an on block on the same arrival schedule (seed + repeat),
        the order alternating off/on, on/off; each block timed from its own start."""
        s = self.settings
        out: list[RequestRecord] = []
        for r in range(s.repeat):
            jobs = rate_jobs(self.prompts, rate, s.load, r)
            order = ("off", "on") if r % 2 == 0 else ("on", "off")
            for side in (x for x in order if x in self._sides):
                t0 = time.perf_counter_ns()
                out += await self._engine(clients[side], side, t0, 0, rate).open_loop(jobs, t0)
        return out

    async def _level(self, clients, level: int, t0: int) -> list[RequestRecord]:
        s = self.settings
        out: list[RequestRecord] = []
        engines = {side: self._engine(clients[side], side, t0, level) for side in self._sides}
        if level == 1:
            for r in range(s.repeat):
                for i, p in enumerate(self.prompts):
                    order = ("off", "on") if (r + i) % 2 == 0 else ("on", "off")
                    for side in (x for x in order if x in self._sides):  # a conversation's turns: back to back
                        out += await engines[side].conversation(Job(prompt=p, repeat=r), t0) or []
            return out
        copies = copies_for(level, len(self.prompts))
        for r in range(s.repeat):
            order = ("off", "on") if r % 2 == 0 else ("on", "off")
            for side in (x for x in order if x in self._sides):
                duration = s.load.duration_s if s.load else None
                if duration is None:
                    jobs = [Job(prompt=p, repeat=r, copy_index=cp) for cp in range(copies) for p in self.prompts]
                    out += await engines[side].closed_loop(jobs, t0, level)
                else:  # the block keeps N streams busy for the duration, cycling the prompts
                    jobs = (Job(prompt=j.prompt, repeat=r, copy_index=j.repeat) for j in cycle_jobs(self.prompts))
                    out += await engines[side].closed_loop(jobs, time.perf_counter_ns(), level, duration)
        return out


def _latency_logs(units: list[list[Pair]]) -> tuple[list[float | None], list[float | None]]:
    """Per unit: log(mean TPOT off / mean TPOT on) over the pairs with a TPOT on both sides,
    and log(mean E2E off / mean E2E on)."""
    tpot, e2e = [], []
    for unit in units:
        tp = [(a, b) for a, b in ((tpot_ns(x), tpot_ns(y)) for x, y in unit) if a is not None and b is not None]
        tpot.append(log_latency_ratio([a for a, _ in tp], [b for _, b in tp]))
        e2e.append(log_latency_ratio([x.e2e_ns for x, _ in unit], [y.e2e_ns for _, y in unit]))
    return tpot, e2e


def _request_rate_log(unit: list[Pair]) -> float | None:
    """log(rate_on / rate_off), each side's rate = its output tokens / the sum of its E2E."""
    return log_rate_ratio(sum(x.output_tokens for x, _ in unit), sum(x.e2e_ns for x, _ in unit),
                          sum(y.output_tokens for _, y in unit), sum(y.e2e_ns for _, y in unit))


def block_rate(records: list[RequestRecord]) -> tuple[int, int]:
    """(output tokens, wall ns) of one block: its succeeded requests' tokens over the time from
    the first request sent to the last request finished."""
    ok = [r for r in records if r.ok and r.e2e_ns is not None]
    if not ok:
        return 0, 0
    return sum(r.output_tokens for r in ok), max(r.sent_at_ns + r.e2e_ns for r in ok) - min(r.sent_at_ns for r in ok)


def speed_ratios(pairs: list[Pair]) -> SpeedRatios:
    """Ratios with each pair one unit (concurrency 1: the pairs are sent back to back, one at a time)."""
    units = [[p] for p in pairs]
    tpot, e2e = _latency_logs(units)
    return SpeedRatios(tpot=ratio_ci(tpot, "pairs"), e2e=ratio_ci(e2e, "pairs"),
                       throughput=ratio_ci([_request_rate_log(u) for u in units], "pairs"))


def block_units(pairs: list[Pair]) -> list[tuple[int, list[Pair]]]:
    """The pairs of one concurrency level N > 1 grouped by repeat: (repeat, its pairs), one
    group per off block + on block."""
    groups: dict[int, list[Pair]] = {}
    for a, b in pairs:
        groups.setdefault(a.repeat, []).append((a, b))
    return sorted(groups.items())


def block_speed_ratios(units: list[tuple[int, list[Pair]]], throughput_logs: list[float | None]) -> SpeedRatios:
    """Ratios with each repeat's off block + on block one unit (concurrency N > 1): TPOT and
    E2E from the block's mean over its pairs, throughput from the given per-block log ratios."""
    tpot, e2e = _latency_logs([u for _, u in units])
    return SpeedRatios(tpot=ratio_ci(tpot, "blocks"), e2e=ratio_ci(e2e, "blocks"),
                       throughput=ratio_ci(throughput_logs, "blocks"))


def _block_rate_log(records: list[RequestRecord], level: int, repeat: int, rate: float | None = None) -> float | None:
    """log(rate_on / rate_off) of one repeat's blocks, each rate its block's tokens over its wall time
    (every succeeded request of the block, paired or not)."""
    recs = level_records(records, level, rate)
    (tok_off, t_off), (tok_on, t_on) = (
        block_rate([x for x in recs if x.repeat == repeat and x.side == side]) for side in ("off", "on"))
    return log_rate_ratio(tok_off, t_off, tok_on, t_on)


def _subset_ratios(level: int, pp: list[Pair]) -> SpeedRatios:
    """A prompt's or a category's ratios: its pairs at concurrency 1; at N > 1 and at rates its
    share of each block (its requests' tokens over their E2E), one unit per block pair."""
    if level == 1:
        return speed_ratios(pp)
    units = block_units(pp)
    return block_speed_ratios(units, [_request_rate_log(u) for _, u in units])


def level_speed(records: list[RequestRecord], level: int, pairs: list[Pair],
                rate: float | None = None) -> tuple[SpeedRatios, list[PromptSpeed]]:
    """The level's ratios and each prompt's, on the level's unit of independence. Per prompt at
    N > 1 the throughput is its requests' tokens over their E2E (its share of each block)."""
    if level == 1 and rate is None:
        speed = speed_ratios(pairs)
    else:
        units = block_units(pairs)
        speed = block_speed_ratios(units, [_block_rate_log(records, level, r, rate) for r, _ in units])
    by_prompt = []
    for pid in dict.fromkeys(p.prompt_id for p, _ in pairs):
        pp = [(a, b) for a, b in pairs if a.prompt_id == pid]
        by_prompt.append(PromptSpeed(prompt_id=pid, category=pp[0][0].category,
                                     ratios=_subset_ratios(0 if rate is not None else level, pp)))
    return speed, by_prompt


def category_speed(pairs: list[Pair], level: int, rate: float | None = None) -> dict[str, SpeedRatios]:
    """Per prompt category: its ratios on the level's units (see _subset_ratios)."""
    cats = sorted({a.category for a, _ in pairs})
    return {c: _subset_ratios(0 if rate is not None else level, [(a, b) for a, b in pairs if a.category == c])
            for c in cats}


def level_goodput(records: list[RequestRecord], level: int, slo_ms: dict[str, float],
                  rate: float | None = None) -> GoodputComparison:
    """Goodput per side and the on/off ratio: one unit per repeat (its off block + on block; at
    concurrency 1 its pairs, each side's time the sum of its requests' E2E, as the sides alternate)."""
    recs = level_records(records, level, rate)
    units = [([r for r in recs if r.repeat == rep and r.side == "off"],
              [r for r in recs if r.repeat == rep and r.side == "on"]) for rep in sorted({r.repeat for r in recs})]
    return compare_goodput(units, slo_ms, busy_time=(level == 1 and rate is None))


def level_lag(records: list[RequestRecord], rate: float, side: str) -> SendLag:
    """Send lag of one side at an arrival rate, over its blocks (each timed from its own start)."""
    recs = [r for r in level_records(records, 0, rate) if r.side == side and r.scheduled_at_ns is not None]
    return send_lag_blocks([([r.scheduled_at_ns for r in recs if r.repeat == rep],
                             [r.sent_at_ns for r in recs if r.repeat == rep])
                            for rep in sorted({r.repeat for r in recs})])


def theory_check(level: LevelResult, tpot_off_ms: float | None, tpot_on_ms: float | None,
                 draft_cost: float | None) -> TheoryCheck | None:
    """Theory beside measurement: ideal speedup from acceptance, the implied draft cost c, best k."""
    acc = level.acceptance
    if not acc.known or not acc.drafts or not acc.per_position_rate:
        return None
    k = len(acc.per_position_rate)
    tokens_per_pass = acc.mean_acceptance_length
    c = draft_cost if draft_cost is not None else 0.0
    per_pos = [acc.per_position_rate[i] * acc.drafts for i in range(k)]
    predicted = theory.predicted_speedup_per_position(per_pos, int(acc.drafts), c)
    measured = level.speed.tpot.point
    implied_c = None
    if tpot_off_ms and tpot_on_ms:
        # one verify pass costs tpot_on * L; relative to a decode step: k*c + 1
        implied_c = max(0.0, (tpot_on_ms * tokens_per_pass / tpot_off_ms - 1.0) / k)
    a = theory.acceptance_from_mean_length(tokens_per_pass, k) if 1 < tokens_per_pass < k + 1 else None
    # 1 < L < k + 1 puts a strictly inside (0, 1)
    best = theory.best_k(a, implied_c if implied_c is not None else c) if a is not None else None
    best_measured = max(range(1, k + 1), key=lambda kk: theory.predicted_speedup_per_position(
        per_pos[:kk], int(acc.drafts), implied_c if implied_c is not None else c))
    return TheoryCheck(k=k, tokens_per_pass=tokens_per_pass, draft_cost_assumed=c, predicted_speedup=predicted,
                       measured_speedup=measured,
                       measured_over_predicted=(measured / predicted) if measured and predicted else None,
                       implied_draft_cost=implied_c, iid_acceptance=a,
                       best_k_iid=best[0] if best else None, best_k_measured_positions=best_measured)


def _level_result(report: CompareReport, level: int, rate: float | None, counters: CounterPair | None) -> LevelResult:
    s = report.settings
    pairs = pair_records(report.requests, level, rate)
    speed, by_prompt = level_speed(report.requests, level, pairs, rate)
    recs = level_records(report.requests, level, rate)
    off_lat = latency_summary([r for r in recs if r.side == "off"])
    on_lat = latency_summary([r for r in recs if r.side == "on"])
    counters = counters or CounterPair(before=CounterSnapshot(), after=CounterSnapshot())
    acc = acceptance_summary(counters.before, counters.after)
    lr = LevelResult(concurrency=level if rate is None else 0, request_rate=rate, pairs=len(pairs), speed=speed,
                     by_prompt=by_prompt, by_category=category_speed(pairs, level, rate),
                     off=off_lat, on=on_lat, acceptance=acc)
    if rate is not None:
        lr.send_lag_off, lr.send_lag_on = level_lag(report.requests, rate, "off"), level_lag(report.requests, rate, "on")
    slo = s.load.slo_ms if s.load else {}
    if slo:
        lr.goodput = level_goodput(report.requests, level, slo, rate)
    lr.theory = theory_check(lr, off_lat.tpot_ms.mean, on_lat.tpot_ms.mean, s.draft_cost)
    return lr


def analyse(report: CompareReport) -> None:
    """Fill per-level speed, acceptance, theory, goodput and the crossovers from the raw records."""
    s = report.settings
    report.levels = [_level_result(report, level, None, report.counters_on.get(level)) for level in s.concurrency]
    report.crossover = find_crossover([lv.concurrency for lv in report.levels],
                                      [lv.speed.throughput for lv in report.levels], report.on_server.spec_enabled)
    rates = s.load.request_rates if s.load else []
    report.rate_levels = [_level_result(report, 0, rate, report.counters_on_rate.get(rate_label(rate)))
                          for rate in rates]
    if rates:
        report.rate_crossover = find_crossover(rates, [lv.speed.throughput for lv in report.rate_levels],
                                               report.on_server.spec_enabled, what="request rate")


def run_compare(off: Server, on: Server, prompts: list[Prompt], settings: CompareSettings,
                progress: Progress | None = None) -> CompareReport:
    """The whole A/B with both servers up: interleaved runs, then analysis and identity."""
    settings.concurrency = sorted(set(settings.concurrency))
    off_info, on_info = off.describe(), on.describe()
    runner = ABRunner(off, on, prompts, settings, progress)
    with counting(off, on):
        records, on_counters, off_counters = run_loop(runner.run())
    report = CompareReport(settings=settings, off_server=off_info, on_server=on_info, requests=records,
                           counters_on=on_counters, counters_off=off_counters,
                           counters_on_rate=runner.rate_counters["on"], counters_off_rate=runner.rate_counters["off"])
    return finish_compare(report, off, prompts, runner.req_off)


def run_one_side(server: Server, side: str, prompts: list[Prompt], settings: CompareSettings,
                 progress: Progress | None = None):
    """One side only (servers started one after the other): (info, records, counters)."""
    settings.concurrency = sorted(set(settings.concurrency))
    info = server.describe()
    off, on = (server, server)
    runner = ABRunner(off, on, prompts, settings, progress)
    with counting(server):
        records, on_c, off_c = run_loop(runner.run(sides=(side,)))
    return info, records, (on_c if side == "on" else off_c)


def finish_compare(report: CompareReport, off: Server, prompts: list[Prompt],
                   off_request: RequestSettings) -> CompareReport:
    """Analysis, identity and triage (the spec-off server must still be up for triage)."""
    settings = report.settings
    records = report.requests
    analyse(report)
    threshold = settings.near_tie_threshold if settings.near_tie_threshold is not None \
        else default_threshold(settings.dtype)
    settings.near_tie_threshold = threshold
    scorer = None
    if settings.reference:
        scorer = ReferenceScorer(settings.reference)

    def triage(prompt: Prompt, div, off_rec: RequestRecord):
        prompt = turn_request(records, prompt, off_rec)
        t = server_triage(off, prompt, off_request, div, off_rec.tokens, threshold) if settings.triage else None
        if scorer is not None:
            t = scorer.triage(off, prompt, div, off_rec, threshold, t)
        return t

    report.identity = identity_report(records, prompts, triage)
    readable_tokens(off, [p.divergence for p in report.identity if p.divergence])
    report.counts = {v: sum(1 for p in report.identity if p.verdict == v)
                     for v in ("identical", "near-tie", "suspect", "unknown")}
    report.notes += _compare_notes(report)
    report.diagnosis = diagnose_compare(report, draft_cost_of(report))
    return report


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


def _compare_notes(report: CompareReport) -> list[str]:
    notes = []
    if report.off_server.spec_enabled:
        notes.append("the 'off' server has spec-decode counters: speculation looks ON there")
    if report.on_server.spec_enabled is False:
        notes.append("the 'on' server has no spec-decode counters: speculation looks OFF there")
    if report.off_server.model_id != report.on_server.model_id:
        notes.append(f"the servers serve different model ids ({report.off_server.model_id} vs "
                     f"{report.on_server.model_id})")
    notes += [f"the sides differ in more than speculation: {line}"
              for line in side_differences(report.off_server, report.on_server)]
    if report.settings.on_temperature not in (None, report.settings.request.temperature):
        notes.append(f"drill: the spec-on side ran at temperature {report.settings.on_temperature}")
    failed = [r for r in report.requests if not r.ok and not r.warmup]
    if failed:
        notes.append(f"{len(failed)} request(s) failed and were left out of the pairs")
    if not report.settings.interleaved:
        notes.append("the servers ran one after the other (not interleaved): machine drift can bias the ratios")
    for lv in report.rate_levels:
        for side, lag in (("spec-off", lv.send_lag_off), ("spec-on", lv.send_lag_on)):
            if lag is not None and lag.client_limited:
                notes.append(f"request rate {rate_label(lv.request_rate or 0)}, {side}: {lag.reason}; the ratios at "
                             "this rate describe the client's pace, not the servers'")
    later = sum(p.different_history_pairs for p in report.identity)
    if later:
        notes.append(f"{later} pair(s) of later conversation turns followed a diverged turn: the sides' "
                     "histories differ there, so those pairs are not identity verdicts of their own")
    return notes

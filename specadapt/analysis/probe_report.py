"""The probe report from its records and counter window: every figure computed from them (one
process and one server, records gathered by workers, replicas or saved runs)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from specadapt.analysis.acceptance import acceptance_summary
from specadapt.analysis.client_load import client_limited
from specadapt.analysis.latency import latency_summary
from specadapt.analysis.pass_notes import findings_notes
from specadapt.analysis.passes import probe_speculation
from specadapt.analysis.send_lag import send_lag
from specadapt.analysis.slo import goodput_summary
from specadapt.records import (
    ClientLoad,
    CounterSnapshot,
    ProbeReport,
    ProbeSettings,
    RequestRecord,
    ScaleLayout,
    ServerInfo,
)
from specadapt.records.load import RateLevel, rate_label


def build_probe_report(server: ServerInfo, settings: ProbeSettings, records: list[RequestRecord],
                       before: CounterSnapshot, after: CounterSnapshot, scale: ScaleLayout | None = None,
                       partial_reason: str | None = None, log_tail: str = "", extra_notes: Sequence[str] = (),
                       client: ClientLoad | None = None) -> ProbeReport:
    """A probe report from its records and counter window, every figure computed from them: one
    process and one server (run_probe), or records gathered by workers, replicas or saved runs."""
    by_cat: dict[str, list[RequestRecord]] = {}
    for rec in records:
        by_cat.setdefault(rec.category, []).append(rec)
    retried = [r for r in records if r.attempts > 1]
    report = ProbeReport(
        server=server, settings=settings, partial=partial_reason is not None, partial_reason=partial_reason,
        latency=latency_summary([r for r in records if r.attempts == 1]),
        latency_retried=latency_summary(retried) if retried else None,
        failures=dict(sorted(Counter(_failure_key(r) for r in records if not r.ok).items())),
        by_category={cat: latency_summary(recs) for cat, recs in sorted(by_cat.items())},
        acceptance=acceptance_summary(before, after),
        counters_before=before, counters_after=after,
        token_sources=dict(Counter(r.token_source or "none" for r in records if r.ok)),
        client=client, scale=scale, requests=records,
    )
    load = settings.load
    slo = load.slo_ms if load else {}
    if slo:
        report.goodput = goodput_summary([r for r in records if not r.warmup], slo)
    for rate in (load.request_rates if load else []):
        recs = [r for r in records if r.request_rate == rate and not r.warmup]
        first = [r for r in recs if r.scheduled_at_ns is not None]
        report.rates.append(RateLevel(
            request_rate=rate, latency=latency_summary(recs),
            send_lag=send_lag([r.scheduled_at_ns for r in first], [r.sent_at_ns for r in first]),
            goodput=goodput_summary(recs, slo) if slo else None))
    report.speculation = probe_speculation(report)
    report.notes += _notes(report)
    report.notes += list(extra_notes)
    if log_tail:
        report.notes.append(LOG_NOTE + log_tail)
    return report


LOG_NOTE = "last lines of the server log:\n"


def server_log_tail(report: ProbeReport) -> str:
    """The server log lines a partial report carries in its notes ('' if none)."""
    return next((n[len(LOG_NOTE):] for n in report.notes if n.startswith(LOG_NOTE)), "")


def _failure_key(rec: RequestRecord) -> str:
    """The error kind; HTTP errors by status (http_429, http_503, ...)."""
    if rec.error_kind == "http_status" and rec.status_code:
        return f"http_{rec.status_code}"
    return rec.error_kind or "other"


def failed_count(report: ProbeReport) -> int:
    """Failed requests, whether sent once or retried."""
    return sum(1 for r in report.requests if not r.ok)


def _notes(report: ProbeReport) -> list[str]:
    notes = list(report.server.notes)
    if report.token_sources.get("chunks"):
        notes.append("some requests had neither continuous usage nor logprobs: their tokens were counted "
                     "one per chunk, which understates tokens and overstates ITL under speculation")
    gen = report.acceptance.generation_tokens
    if gen is not None and gen != report.latency.output_tokens:
        notes.append(f"the server counted {gen:.0f} generated tokens during the run, the probe "
                     f"{report.latency.output_tokens}: other clients may be using the server")
    failed = failed_count(report)
    if failed:
        kinds = ", ".join(f"{k} {n}" for k, n in report.failures.items())
        notes.append(f"{failed} request(s) failed ({kinds}); see the requests list for reasons")
    for lv in report.rates:
        if lv.send_lag.client_limited:
            notes.append(f"request rate {rate_label(lv.request_rate)}: {lv.send_lag.reason}; its figures describe "
                         "the client's pace, not the server's")
    limited = client_limited(report.client) if report.client is not None else None
    if limited:
        notes.append(limited)
    if report.latency_retried is not None:
        notes.append(f"{report.latency_retried.requests} request(s) were sent more than once (--retries): "
                     "their latency is reported apart, not in the main figures")
    notes += findings_notes(report.speculation, "the server")
    return notes

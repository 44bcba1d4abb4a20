"""Rich tables for a probe report (renders from the saved model, so `report show` reuses it)."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from specadapt.analysis.slo import slo_text
from specadapt.analysis.text import pct
from specadapt.records import Distribution, ProbeReport
from specadapt.records.load import Goodput, SendLag
from specadapt.report.hardware import hardware_source_text
from specadapt.report.passes_render import render_passes


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:,.1f}"


def rate_text(rate: float | None) -> str:
    return "-" if rate is None else ("inf" if rate == float("inf") else f"{rate:g}")


def lag_text(lag: SendLag | None) -> str:
    """'p50 0.4 / p99 2.1 / max 3.0 ms' with CLIENT-LIMITED when the client could not keep the schedule."""
    if lag is None or not lag.requests:
        return "-"
    text = f"p50 {lag.p50_ms:.1f} / p99 {lag.p99_ms:.1f} / max {lag.max_ms:.1f} ms"
    return text + (" CLIENT-LIMITED" if lag.client_limited else "")


def goodput_text(g: Goodput | None) -> str:
    """'1.20 req/s (75.0% good; ttft 80.0%, e2e 90.0%)'."""
    if g is None:
        return "-"
    rate = "-" if g.goodput is None else f"{g.goodput:.2f} req/s"
    per = ", ".join(f"{m} {pct(v)}" for m, v in g.share_per_slo.items())
    return f"{rate} ({pct(g.share_good)} good; {per})"


def render_rates(report: ProbeReport, console: Console) -> None:
    """One row per arrival rate: latency, send lag (flagged when the client limited the run), goodput."""
    table = Table(title="by request rate (open loop)")
    for col in ("rate req/s", "sent req/s", "ok", "tokens/s", "TTFT p50", "TPOT p50", "E2E p50", "send lag",
                "goodput"):
        table.add_column(col, justify="right", overflow="fold")
    for lv in report.rates:
        lat = lv.latency
        table.add_row(rate_text(lv.request_rate),
                      "-" if lv.send_lag.achieved_rate is None else f"{lv.send_lag.achieved_rate:.2f}",
                      f"{lat.succeeded}/{lat.requests}",
                      "-" if lat.output_tokens_per_s is None else f"{lat.output_tokens_per_s:.1f}",
                      _ms(lat.ttft_ms.p50), _ms(lat.tpot_ms.p50), _ms(lat.e2e_ms.p50), lag_text(lv.send_lag),
                      goodput_text(lv.goodput))
    console.print(table)
    for lv in report.rates:
        if lv.send_lag.client_limited:
            console.print(f"[red]rate {rate_text(lv.request_rate)}[/]: {lv.send_lag.reason}")


def render_probe(report: ProbeReport, console: Console) -> None:
    s = report.server
    spec = {True: "ON", False: "off", None: "unknown"}[s.spec_enabled]
    details = []
    if s.spec_method:
        details.append(f"method {s.spec_method}")
    if s.num_speculative_tokens:
        details.append(f"k={s.num_speculative_tokens}")
    console.print(f"[bold]{s.backend}[/] {s.version or '?'} at {s.base_url}  model [bold]{s.model_id}[/]"
                  f"  max_model_len {s.max_model_len or '?'}")
    console.print(f"speculative decoding: [bold]{spec}[/]" + (f" ({', '.join(details)})" if details else ""))
    console.print(f"hardware: {escape(hardware_source_text(s.hardware))}", highlight=False, soft_wrap=True)
    wl = report.settings.workload
    if wl is not None:
        cats = ", ".join(f"{name} {n}" for name, n in wl.categories.items())
        console.print(f"prompts: {wl.selected} from {escape(wl.source)} ({wl.format}): {cats}"
                      + (f"; {wl.multi_turn} multi-turn" if wl.multi_turn else ""), highlight=False, soft_wrap=True)

    lat = report.latency
    load = report.settings.load
    level = (f"request rates {', '.join(rate_text(r) for r in load.request_rates)} req/s, all together"
             if load and load.request_rates else f"concurrency {report.settings.concurrency}")
    table = Table(title=f"latency, ms  ({level}, "
                        f"{lat.succeeded}/{lat.requests} requests ok)")
    table.add_column("metric")
    for col in ("mean", "p50", "p90", "p99", "n"):
        table.add_column(col, justify="right")
    rows: list[tuple[str, Distribution]] = [("TTFT", lat.ttft_ms), ("ITL (per token)", lat.itl_ms),
                                            ("TPOT", lat.tpot_ms), ("E2E", lat.e2e_ms)]
    for name, d in rows:
        table.add_row(name, _ms(d.mean), _ms(d.p50), _ms(d.p90), _ms(d.p99), str(d.count))
    console.print(table)
    tps = "-" if lat.output_tokens_per_s is None else f"{lat.output_tokens_per_s:,.1f}"
    tpc = "-" if lat.tokens_per_chunk_mean is None else f"{lat.tokens_per_chunk_mean:.2f}"
    console.print(f"output tokens {lat.output_tokens} in {lat.duration_s:.2f} s: [bold]{tps} tokens/s[/]; "
                  f"tokens per chunk {tpc}; token counts from {', '.join(report.token_sources) or '-'}")

    if report.rates:
        render_rates(report, console)
    if report.goodput is not None:
        console.print(f"goodput ({slo_text(report.goodput.slo_ms)}): [bold]{goodput_text(report.goodput)}[/]")
    if len(report.by_category) > 1:
        cat = Table(title="by prompt category")
        for col in ("category", "requests", "tokens/s", "TPOT mean", "E2E mean"):
            cat.add_column(col, justify="right" if col != "category" else "left")
        for name, c in report.by_category.items():
            cat.add_row(name, str(c.requests), "-" if c.output_tokens_per_s is None else f"{c.output_tokens_per_s:.1f}",
                        _ms(c.tpot_ms.mean), _ms(c.e2e_ms.mean))
        console.print(cat)

    acc = report.acceptance
    if acc.known:
        console.print(f"acceptance rate [bold]{pct(acc.acceptance_rate)}[/] "
                      f"({acc.accepted_tokens:.0f} of {acc.draft_tokens:.0f} draft tokens, {acc.drafts:.0f} drafts); "
                      f"mean acceptance length [bold]{acc.mean_acceptance_length:.2f}[/]")
        pos = Table(title="acceptance per position")
        pos.add_column("position", justify="right")
        pos.add_column("rate (of drafts)", justify="right")
        pos.add_column("conditional", justify="right")
        for i, (r, c) in enumerate(zip(acc.per_position_rate, acc.per_position_conditional)):
            pos.add_row(str(i), pct(r), pct(c))
        console.print(pos)
    else:
        console.print(f"acceptance: unknown ({acc.reason})")
    if report.speculation is not None:
        render_passes(report.speculation, report.requests, console)
    if report.partial:
        console.print(f"[red]PARTIAL RUN[/]: {report.partial_reason}")
    if report.failures:
        console.print("failed requests by kind: " + ", ".join(f"{k} {n}" for k, n in report.failures.items()))
    if report.latency_retried is not None:
        r = report.latency_retried
        console.print(f"retried requests (apart from the figures above): {r.succeeded}/{r.requests} ok, "
                      f"E2E mean {_ms(r.e2e_ms.mean)} ms")
    failed = [r for r in report.requests if not r.ok]
    for rec in failed[:10]:
        console.print(f"[red]failed[/] {rec.prompt_id} (repeat {rec.repeat}): {rec.error}")
    for note in report.notes:
        console.print(f"note: {note}")

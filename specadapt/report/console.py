"""Rich tables for a probe report (renders from the saved model, so `report show` reuses it)."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from specadapt.records import Distribution, ProbeReport


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:,.1f}"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


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
    wl = report.settings.workload
    if wl is not None:
        cats = ", ".join(f"{name} {n}" for name, n in wl.categories.items())
        console.print(f"prompts: {wl.selected} from {escape(wl.source)} ({wl.format}): {cats}"
                      + (f"; {wl.multi_turn} multi-turn" if wl.multi_turn else ""), highlight=False, soft_wrap=True)

    lat = report.latency
    table = Table(title=f"latency, ms  (concurrency {report.settings.concurrency}, "
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
        console.print(f"acceptance rate [bold]{_pct(acc.acceptance_rate)}[/] "
                      f"({acc.accepted_tokens:.0f} of {acc.draft_tokens:.0f} draft tokens, {acc.drafts:.0f} drafts); "
                      f"mean acceptance length [bold]{acc.mean_acceptance_length:.2f}[/]")
        pos = Table(title="acceptance per position")
        pos.add_column("position", justify="right")
        pos.add_column("rate (of drafts)", justify="right")
        pos.add_column("conditional", justify="right")
        for i, (r, c) in enumerate(zip(acc.per_position_rate, acc.per_position_conditional)):
            pos.add_row(str(i), _pct(r), _pct(c))
        console.print(pos)
    else:
        console.print(f"acceptance: unknown ({acc.reason})")
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

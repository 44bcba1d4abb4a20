"""Rich tables for how a probe's load was spread (workers, Ray actors, replicas, merged sources)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from specadapt.analysis.text import pct
from specadapt.records import ScaleLayout


def _f(v: float | None, fmt: str = "{:,.1f}") -> str:
    return "-" if v is None else fmt.format(v)


def render_scale(layout: ScaleLayout, console: Console) -> None:
    """The layout of a spread or merged probe: one table each for workers, replicas, sources."""
    if layout.workers and layout.executor != "process":
        where = f" at {layout.ray_address}" if layout.ray_address else ""
        table = Table(title=f"workers ({layout.executor}{where}: {len(layout.workers)} of "
                            f"{layout.workers_requested} asked for)")
        ray = layout.executor == "ray"
        errors = any(w.error for w in layout.workers)
        cols = ["worker", "node", "pid", "requests", "done", "streams",
                *(["start lag ms", "clock offset ms"] if ray else []), *(["error"] if errors else [])]
        for col in cols:
            table.add_column(col, justify="left" if col in ("node", "error") else "right")
        for w in layout.workers:
            offset = "-" if w.clock_offset_ms is None else f"{w.clock_offset_ms:+.2f} ± {w.clock_uncertainty_ms:.2f}"
            row = [str(w.worker), w.node or "-", str(w.pid or "-"), str(w.jobs), str(w.finished), str(w.concurrency)]
            row += [_f(w.start_lag_ms, "{:.2f}"), offset] if ray else []
            row += [w.error or ""] if errors else []
            table.add_row(*row)
        console.print(table)
    if layout.replicas:
        table = Table(title="per replica")
        for col in ("replica", "ok", "TTFT p50", "ITL p50", "TPOT mean", "E2E p99", "tok/s", "accept"):
            table.add_column(col, justify="left" if col == "replica" else "right")
        for r in layout.replicas:
            lat, acc = r.latency, r.acceptance
            accept = pct(acc.acceptance_rate) if acc.known else "-"
            table.add_row(r.target, f"{lat.succeeded}/{lat.requests}", _f(lat.ttft_ms.p50), _f(lat.itl_ms.p50),
                          _f(lat.tpot_ms.mean), _f(lat.e2e_ms.p99), _f(lat.output_tokens_per_s), accept)
        console.print(table)
    if layout.sources:
        table = Table(title=f"merged from {len(layout.sources)} reports")
        for col in ("report", "created", "server", "requests", "partial"):
            table.add_column(col, justify="right" if col == "requests" else "left")
        for s in layout.sources:
            table.add_row(s.path, s.created_at, ", ".join(s.replicas) or s.server.base_url, str(s.requests),
                          "yes" if s.partial else "")
        console.print(table)

"""Timing truth: the probe client's TTFT/ITL/TPOT/E2E against the scripted server's own log.

The scripted server logs, with the machine's monotonic clock, when it handed each chunk
and the final ``[DONE]`` to the socket. The client's send time is on the same clock, so
for every request the true values are known and the probe's error is exact:

- TTFT  Formula: probe TTFT - (server's first token chunk - client send)
- ITL   Formula: per token, probe ITL - (gap between the server's chunks / tokens in chunk)
- TPOT  Formula: probe TPOT - (server's [DONE] - server's first chunk) / (tokens - 1)
- E2E   Formula: probe E2E - (server's [DONE] - client send)

``vs_schedule`` is the same against the script (received + ttft + i * itl) instead of the
log: it adds the server's own scheduling jitter, which is no error of the probe.
"""

from __future__ import annotations

import asyncio
from typing import Any

from specadapt.analysis.latency import itl_values_ns, percentile, tpot_ns
from specadapt.load.client import stream_request
from specadapt.wire.stream import connect
from specadapt.records import Prompt, RequestRecord, RequestSettings
from specadapt.testing import script

METRICS = ("ttft", "itl", "tpot", "e2e")


async def drive(base_url: str, n: int, concurrency: int, tag: str, settings: RequestSettings | None = None,
                stagger: bool = True, **script_fields: Any) -> tuple[list[RequestRecord], dict[str, Any]]:
    """Send ``n`` scripted requests at ``concurrency`` the way the runner does (one shared
    client, a semaphore); return the records (``sent_at_ns`` absolute) and the server log.

    ``stagger``: request i's TTFT is longer by (i mod concurrency) / concurrency of an ITL,
    so the streams' chunks interleave instead of arriving in one burst (as they would
    from a server whose requests are not all in one batch). Without it every stream's
    chunk lands at the same instant, the worst case for a single-threaded client."""
    settings = settings or RequestSettings(max_tokens=script_fields.get("tokens", 16), request_timeout_s=60)
    async with connect(base_url, concurrency=concurrency, request_timeout_s=settings.request_timeout_s) as client:
        sem = asyncio.Semaphore(concurrency)

        async def one(i: int) -> RequestRecord:
            fields = dict(script_fields)
            if stagger and "itl_ms" in fields:
                fields["ttft_ms"] = fields.get("ttft_ms", 20.0) + (i % concurrency) * fields["itl_ms"] / concurrency
            prompt = Prompt(id=f"{tag}-{i}", prompt=script(id=f"{tag}-{i}", **fields))
            async with sem:
                return await stream_request(client, prompt, "scripted", settings, run_t0_ns=0)

        records = list(await asyncio.gather(*(one(i) for i in range(n))))
        log = await client.get_json("/_script/log")
    return records, log


def timing_errors(records: list[RequestRecord], log: dict[str, Any]) -> dict[str, list[float]]:
    """Per-metric errors in ms (probe - truth) over the successful requests, and
    ``ttft_vs_schedule``/``itl_vs_schedule`` against the script's own numbers."""
    out: dict[str, list[float]] = {m: [] for m in (*METRICS, "ttft_vs_schedule", "itl_vs_schedule")}
    for rec in records:
        if not rec.ok:
            continue
        srv = log[rec.prompt_id]
        send, chunks, done = rec.sent_at_ns, srv["chunk_ns"], srv["done_ns"]
        n = rec.output_tokens
        out["ttft"].append((rec.ttft_ns - (chunks[0] - send)) / 1e6)
        out["e2e"].append((rec.e2e_ns - (done - send)) / 1e6)
        out["tpot"].append((tpot_ns(rec) - (done - chunks[0]) / (n - 1)) / 1e6)
        true_itl = [(chunks[i] - chunks[i - 1]) / rec.chunk_tokens[i] for i in range(1, len(chunks))
                    for _ in range(rec.chunk_tokens[i])]
        out["itl"] += [(a - b) / 1e6 for a, b in zip(itl_values_ns(rec), true_itl, strict=True)]
        out["ttft_vs_schedule"].append((rec.ttft_ns - (srv["recv_ns"] - send)) / 1e6 - srv["ttft_ms"])
        out["itl_vs_schedule"] += [v / 1e6 - srv["itl_ms"] for v in itl_values_ns(rec)
                                   ] if set(rec.chunk_tokens) == {1} else []
    return out


def p99_abs(values: list[float]) -> float:
    return percentile(sorted(abs(v) for v in values), 99)


def summary(errors: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    """{metric: {n, p50_abs_ms, p99_abs_ms, max_abs_ms}}."""
    return {m: {"n": len(v), "p50_abs_ms": percentile(sorted(abs(x) for x in v), 50), "p99_abs_ms": p99_abs(v),
                "max_abs_ms": max(abs(x) for x in v)} for m, v in errors.items() if v}


def brief(errors: dict[str, list[float]]) -> str:
    """One line for a test's output: ``ttft 0.41/3.8 itl ...`` (|error| p50/p99, ms)."""
    return ", ".join(f"{m} {s['p50_abs_ms']:.2f}/{s['p99_abs_ms']:.1f}" for m, s in summary(errors).items()) + \
        " (|error| p50/p99 ms)"

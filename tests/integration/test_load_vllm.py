"""compare and probe at request rates with an SLO, spread over worker processes (compare: a two-turn
conversation; probe: two URLs of one server as replicas), against the real vLLM CPU servers of the
session (spec off, ngram k=4): goodput, send lag and per-turn identity must agree with the report's
own records (no figures fixed in advance)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from specadapt.analysis.slo import is_good
from specadapt.records import CompareReport, read_compare_report, read_report

pytestmark = pytest.mark.integration

PROMPTS = [
    {"id": "chat-2-turns", "category": "conversation",
     "messages": [{"role": "user", "content": "Name a fruit."}], "turns": ["Now name a colour."]},
    {"id": "copy", "category": "grounded", "prompt": "Repeat: one two three four five six seven eight"},
]
SLO = "ttft=2s,e2e=5s"


def run_compare(off_url: str, on_url: str, tmp_path: Path) -> tuple[subprocess.CompletedProcess, CompareReport]:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    out = tmp_path / "report.json"
    proc = subprocess.run([sys.executable, "-m", "specadapt", "compare", "--off", off_url, "--on", on_url,
                           "--prompts", str(prompts), "--repeat", "1", "--warmup", "1", "--max-tokens", "8",
                           "--request-rate", "2,inf", "--duration", "1", "--slo", SLO, "--no-triage", "--workers", "2",
                           "--json", str(out)], capture_output=True, text=True, timeout=600)
    return proc, read_compare_report(out)


def check_report(report: CompareReport) -> None:
    """Every figure of the rate levels recomputed from the records."""
    slo = report.settings.load.slo_ms
    assert slo == {"ttft": 2000.0, "e2e": 5000.0}
    assert [lv.request_rate for lv in report.rate_levels] == [2.0, math.inf]
    for lv in report.rate_levels:
        recs = [r for r in report.requests if r.request_rate == lv.request_rate and not r.warmup]
        for side, lag, g in (("off", lv.send_lag_off, lv.goodput.off), ("on", lv.send_lag_on, lv.goodput.on)):
            mine = [r for r in recs if r.side == side]
            first = [r for r in mine if r.scheduled_at_ns is not None]
            assert all(r.turn == 0 for r in first) and all(r.scheduled_at_ns is None for r in mine if r.turn > 0)
            assert lag.requests == len(first)
            assert lag.max_ms == pytest.approx(max(r.sent_at_ns - r.scheduled_at_ns for r in first) / 1e6)
            assert g.requests == len(mine) and g.good == sum(1 for r in mine if is_good(r, slo))
            limited = lag.p99_ms > 10 or (lag.achieved_rate is not None
                                          and lag.achieved_rate < 0.95 * lag.scheduled_rate)
            assert lag.client_limited == limited
        # each conversation: its turns in order, the later one sent after the first answered
        for side in ("off", "on"):
            conv = [r for r in recs if r.side == side and r.prompt_id == "chat-2-turns"]
            for key in {(r.repeat, r.replica) for r in conv}:
                t0, t1 = sorted((r for r in conv if (r.repeat, r.replica) == key), key=lambda r: r.turn)
                assert (t0.turn, t1.turn) == (0, 1) and t1.sent_at_ns >= t0.sent_at_ns + t0.e2e_ns
    n = math.ceil(2 * 1)  # rate 2 for 1 s
    assert len([r for r in report.requests if r.request_rate == 2.0 and r.turn == 0]) == 2 * n
    # identity per turn: pairs are counted per turn; later turns after a divergence counted apart
    (chat,) = [p for p in report.identity if p.prompt_id == "chat-2-turns"]
    ok_pairs = {(r.concurrency, r.request_rate, r.repeat, r.replica, r.turn)
                for r in report.requests if r.prompt_id == "chat-2-turns" and r.ok and not r.warmup and r.side == "on"}
    assert chat.pairs + chat.different_history_pairs <= len(ok_pairs)
    if chat.divergence is None:
        assert chat.different_history_pairs == 0 and chat.identical_pairs == chat.pairs
    assert any(r.turn == 1 for r in report.requests if r.prompt_id == "chat-2-turns")


def test_compare_at_rates_with_an_slo_and_a_conversation(tmp_path, vllm_off, vllm_ngram):
    proc, report = run_compare(vllm_off.base_url, vllm_ngram.base_url, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    check_report(report)
    assert "send lag" in proc.stdout and "goodput" in proc.stdout
    assert report.settings.workers == 2 and any("worker processes" in n for n in report.notes)


def test_probe_at_a_rate_with_an_slo_over_two_workers_and_two_replicas(tmp_path, vllm_off):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    out = tmp_path / "probe.json"
    other = vllm_off.base_url.replace("127.0.0.1", "localhost")
    proc = subprocess.run([sys.executable, "-m", "specadapt", "probe", "--url", vllm_off.base_url, "--url", other,
                           "--workers", "2", "--prompts", str(prompts), "--warmup", "1", "--max-tokens", "8",
                           "--request-rate", "4", "--duration", "1", "--slo", SLO, "--json", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = read_report(out)
    recs = report.requests
    assert len([r for r in recs if r.turn == 0]) == 4  # ceil(4 req/s x 1 s) arrivals
    assert report.scale.executor == "workers" and sum(w.finished for w in report.scale.workers) == len(recs)
    assert sorted(rep.target for rep in report.scale.replicas) == sorted([vllm_off.base_url, other])
    (level,) = report.rates
    first = [r for r in recs if r.scheduled_at_ns is not None]
    assert level.send_lag.requests == len(first) == 4
    slo = report.settings.load.slo_ms
    assert level.goodput.requests == len(recs) and level.goodput.good == sum(1 for r in recs if is_good(r, slo))
    assert "goodput" in proc.stdout

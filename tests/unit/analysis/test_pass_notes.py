"""The speculation section's findings as notes about the server, in compare and probe reports."""

from __future__ import annotations

from specadapt.analysis import pass_notes as pn
from specadapt.analysis import passes as ps
from specadapt.analysis.probe_report import build_probe_report
from specadapt.analysis.speed import compare_notes
from specadapt.records import (
    CompareReport,
    CompareSettings,
    CounterPair,
    CounterSnapshot,
    ProbeSettings,
    RequestRecord,
    ServerInfo,
)
from specadapt.records.passes import SpeculationSeen
from specadapt.records.requests import RequestSettings


def contradicting_server(label: str) -> SpeculationSeen:
    """One answer whose chunks show 4 accepted draft tokens (chunks 1, 5, 1) where it counts 2 itself,
    over a counter window that counts 3 accepted: both kinds of finding, worded by analysis/passes.py."""
    rec = RequestRecord(prompt_id="p1", category="qa", api="chat", side="on", ok=True, output_tokens=7,
                        chunk_tokens=[1, 5, 1], chunk_ns=[1, 2, 3], e2e_ns=4, token_source="usage", spec_accepted=2,
                        spec_drafted=8, spec_steps=2)
    window = CounterPair(before=CounterSnapshot(drafts=0, draft_tokens=0, accepted_tokens=0),
                         after=CounterSnapshot(drafts=2, draft_tokens=8, accepted_tokens=3))
    return ps.seen([ps.Group(label, [(0, rec)], window)], k=4)


CHUNKS = "its chunks show 4 accepted draft tokens, its own count 2: a chunk carried several engine steps"
COUNTS = ("the 1 answers say 8 drafted, 2 accepted, 2 passes with a draft; the counters over the same requests 8 "
          "drafted, 3 accepted, 2 passes with a draft")


def test_each_finding_becomes_a_sentence_about_the_server():
    seen = contradicting_server("concurrency 1")
    assert len(seen.findings) == 2
    assert pn.findings_notes(seen, "the spec-on server") == [
        f"the spec-on server's answer to p1 (concurrency 1) disagrees with itself: {CHUNKS}",
        f"the spec-on server's per-request counts and its counters disagree at concurrency 1: {COUNTS}"]
    run = contradicting_server("the run")
    assert pn.findings_notes(run, "the server") == [
        f"the server's answer to p1 disagrees with itself: {CHUNKS}",
        f"the server's per-request counts and its counters disagree over the run: {COUNTS}"]


def test_a_finding_of_another_form_is_kept_whole_and_none_without_a_section():
    assert pn.finding_note("p1: something else", "the server") == \
        "the server's speculation counts disagree: p1: something else"
    assert pn.finding_note("p (x) (concurrency 1): its chunks", "S") == \
        "S's answer to p (x) (concurrency 1) disagrees with itself: its chunks"
    assert pn.findings_notes(None, "the server") == []
    assert pn.findings_notes(SpeculationSeen(available=False, findings=[]), "the server") == []


def compare_report(sections: dict) -> CompareReport:
    on = ServerInfo(backend="vllm", base_url="http://on", spec_enabled=True)
    return CompareReport(settings=CompareSettings(concurrency=[1]), off_server=on, on_server=on, requests=[],
                         sections=sections)


def test_the_compare_section_reads_back_or_says_why_not():
    seen = contradicting_server("concurrency 1")
    back, why = pn.speculation_of(compare_report({"speculation": seen.model_dump(mode="json")}))
    assert back == seen and why == ""
    assert pn.speculation_of(compare_report({})) == (None, "")
    back, why = pn.speculation_of(compare_report({"speculation": {"available": "maybe", "k": "four"}}))
    assert back is None and why == ("the speculation section does not read back (available: Input should be a valid "
                                    "boolean, unable to interpret input)")
    back, why = pn.speculation_of(compare_report({"speculation": {"available": True, "requests": [{"index": 0}]}}))
    assert back is None and why == "the speculation section does not read back (requests.0.prompt_id: Field required)"


def test_compare_and_probe_notes_carry_the_findings():
    seen = contradicting_server("concurrency 1")
    notes = compare_notes(compare_report({"speculation": seen.model_dump(mode="json")}))
    assert notes[-2:] == pn.findings_notes(seen, "the spec-on server")
    assert not any("disagree" in n for n in compare_notes(compare_report({})))
    rec = RequestRecord(prompt_id="p1", category="qa", api="chat", ok=True, output_tokens=7, chunk_tokens=[1, 5, 1],
                        chunk_ns=[1, 2, 3], ttft_ns=1, e2e_ns=4, token_source="usage", spec_accepted=2,
                        spec_drafted=8, spec_steps=2)
    settings = ProbeSettings(concurrency=1, repeat=1, warmup=0, prompts_source="x", request=RequestSettings())
    server = ServerInfo(backend="vllm", base_url="http://x", spec_enabled=True, num_speculative_tokens=4)
    probe = build_probe_report(server, settings, [rec], CounterSnapshot(drafts=0, draft_tokens=0, accepted_tokens=0),
                               CounterSnapshot(drafts=2, draft_tokens=8, accepted_tokens=3))
    assert [n for n in probe.notes if "disagree" in n] == [
        f"the server's answer to p1 disagrees with itself: {CHUNKS}",
        f"the server's per-request counts and its counters disagree over the run: {COUNTS}"]
    agreeing = build_probe_report(server, settings, [rec], CounterSnapshot(drafts=0, draft_tokens=0, accepted_tokens=0),
                                  CounterSnapshot(drafts=2, draft_tokens=8, accepted_tokens=2))
    assert [n for n in agreeing.notes if "disagree" in n] == [
        f"the server's answer to p1 disagrees with itself: {CHUNKS}"]

"""The speculation section read back from a compare report, and its findings as report notes.

The findings of ``SpeculationSeen`` (analysis/passes.py) are disagreements between a server's
own counts: its per-request counts against its counters over the same requests, or an answer's
streamed chunks against the answer's own counts. A report says each as a finding about the
server: "the spec-on server's per-request counts and its counters disagree at concurrency 1: ..."
or "the spec-on server's answer to p1 (concurrency 1) disagrees with itself: its chunks show ...".
"""

from __future__ import annotations

import re

from pydantic import ValidationError

from specadapt.records import CompareReport
from specadapt.records.passes import SpeculationSeen

SECTION = "speculation"

_COUNTERS = re.compile(r"^(?P<label>.+?): the server's per-request counts and its counters disagree: (?P<rest>.+)$",
                       re.S)
_ANSWER = re.compile(r"^(?P<prompt>.+) \((?P<label>[^()]+)\): (?P<rest>its .+)$", re.S)
WHOLE_RUN = "the run"


def speculation_of(report: CompareReport) -> tuple[SpeculationSeen | None, str]:
    """The report's speculation section as its model: (the section, "") or (None, why not); ("" where
    the report has no such section)."""
    data = report.sections.get(SECTION)
    if data is None:
        return None, ""
    try:
        return SpeculationSeen.model_validate(data), ""
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(x) for x in first["loc"])
        return None, f"the {SECTION} section does not read back ({where}: {first['msg']})"


def _where(label: str) -> str:
    return "over the run" if label == WHOLE_RUN else f"at {label}"


def finding_note(finding: str, server: str) -> str:
    """One finding as a note about ``server`` ("the spec-on server", "the server")."""
    m = _COUNTERS.match(finding)
    if m:
        return f"{server}'s per-request counts and its counters disagree {_where(m['label'])}: {m['rest']}"
    m = _ANSWER.match(finding)
    if m:
        where = "" if m["label"] == WHOLE_RUN else f" ({m['label']})"
        return f"{server}'s answer to {m['prompt']}{where} disagrees with itself: {m['rest']}"
    return f"{server}'s speculation counts disagree: {finding}"


def findings_notes(seen: SpeculationSeen | None, server: str) -> list[str]:
    """The section's findings as notes about ``server``; none without a section."""
    return [finding_note(f, server) for f in seen.findings] if seen is not None else []


def compare_findings_notes(report: CompareReport) -> list[str]:
    """The findings of a compare report's speculation section, about its spec-on server."""
    return findings_notes(speculation_of(report)[0], "the spec-on server")

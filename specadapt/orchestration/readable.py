"""The drawn answers in words: where an answer's token strings are token ids ("token_id:N", what
identity runs ask vLLM for), the text of each token is read back from the server's POST
/detokenize, one request per distinct id, for the answers a report draws pass by pass
(analysis/passes.py ``drawn``) and for those alone. A server that cannot say leaves the ids as
they are; the report then draws the ids.
"""

from __future__ import annotations

from collections.abc import Sequence

from specadapt.adapters.base import Server
from specadapt.analysis.passes import drawn
from specadapt.analysis.sections import section_data
from specadapt.orchestration.triage import token_texts
from specadapt.records import CompareReport
from specadapt.records.passes import SpeculationSeen

def readable_answers(server: Server, report: CompareReport, prompt_ids: Sequence[str] = ()) -> int:
    """Give the drawn spec-on answers of ``report`` (its ``shown``, then the first of each of
    ``prompt_ids``) their token texts where their tokens are ids; the speculation section is saved
    back. Returns how many answers got them."""
    seen = section_data(report, "speculation")
    if not isinstance(seen, SpeculationSeen) or not seen.available:
        return 0
    known: dict[int, str] = {}
    done = 0
    for a in drawn(seen, prompt_ids):
        rec = report.requests[a.index] if 0 <= a.index < len(report.requests) else None
        if rec is None or a.texts is not None:
            continue
        texts = token_texts(server, rec.tokens, known)
        if texts is not None:
            a.texts = texts
            done += 1
    if done:
        report.sections["speculation"] = seen.model_dump(mode="json")
    return done

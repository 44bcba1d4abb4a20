"""The headline of a comparison: what a user asks first (was the response faster, by how much;
was the text the same), and whether the speed figures agree with each other.

Pure functions over a finished compare report, at its first level.

- Response time: E2E off/on (> 1: the answer came sooner with speculation), its interval's
  verdict; "less time per answer" = 1 - 1 / E2E.
- Decode: TPOT off/on and tokens/s on/off, each with its verdict.
- Agreement: the E2E, TPOT and tokens/s verdicts (faster / slower / no clear difference) agree, or
  one line says why not, the first that applies:
  1. interference between the sides (the run's interference section, or the check before it, found
     first-token stalls tied to the order of the sides: analysis/interference.py):
     E2E and tokens/s include the stalls, TPOT does not;
  2. the first token: TTFT is a share ``s`` of the spec-off answer (mean TTFT / mean E2E) that
     speculation does not shorten, so E2E moves less than TPOT: at most 1 / (s + (1 - s) / TPOT);
  3. an interval over few units is wide: the verdict that is not "faster"/"slower" is named as
     the one without a clear answer yet (more --repeat narrows it).
- Text: identical / near-tie / suspect / unknown counts over the prompts.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from specadapt.analysis.diagnosis import ratio_text
from specadapt.analysis.interference import detected_interference
from specadapt.records import CompareReport, LevelResult, RatioCI

class Headline(BaseModel):
    """The lead of a comparison (first level), in sentences."""

    response: str = Field(description="Was the response faster, and by how much (E2E).")
    text: str = Field(description="Was the text identical (the identity counts).")
    figures: str = Field(description="TPOT, E2E and tokens/s with their intervals and verdicts.")
    agree: bool = Field(description="The three speed verdicts are the same.")
    why_not: str | None = Field(None, description="When they are not: the reason, in one line.")


def response_sentence(e2e: RatioCI) -> str:
    """'the response came 1.92x faster (48% less time per answer)', or slower, or no clear difference."""
    if e2e.point is None:
        return "no response time measured"
    saved = 1 - 1 / e2e.point
    if e2e.verdict == "faster":
        return f"the response came {e2e.point:.2f}x faster with speculation ({saved:.0%} less time per answer)"
    if e2e.verdict == "slower":
        return f"the response came {1 / e2e.point:.2f}x slower with speculation ({-saved:.0%} more time per answer)"
    return f"no clear difference in response time ({e2e.point:.2f}x, the interval includes 1)"


def text_sentence(counts: dict[str, int], prompts: int) -> str:
    same = counts.get("identical", 0)
    rest = [f"{counts[v]} {v}" for v in ("near-tie", "suspect", "unknown") if counts.get(v)]
    head = "the text was identical for every prompt" if same == prompts and prompts else \
        f"the text was identical for {same} of {prompts} prompts"
    return head + (f" ({', '.join(rest)})" if rest else "")


def ttft_share(lv: LevelResult) -> float | None:
    """Mean TTFT / mean E2E on the spec-off side: the part of an answer decoding does not cover."""
    t, e = lv.off.ttft_ms.mean, lv.off.e2e_ms.mean
    return t / e if t is not None and e else None


def why_disagree(report: CompareReport, lv: LevelResult) -> str:
    s = lv.speed
    if detected_interference(report) is not None:
        return ("the two sides stalled each other's first token (interference, see its section): E2E and "
                "tokens/s include the stalls, TPOT does not; start the servers on separate CPUs or machines")
    share = ttft_share(lv)
    if share is not None and s.tpot.point and share > 0.05:
        bound = 1 / (share + (1 - share) / s.tpot.point)
        return (f"the first token is {share:.0%} of a spec-off answer here and speculation does not shorten it, "
                f"so at TPOT {s.tpot.point:.2f}x the response can be at most {bound:.2f}x faster")
    unclear = [name for name, r in (("E2E", s.e2e), ("tokens/s", s.throughput), ("TPOT", s.tpot))
               if r.verdict == "no clear difference"]
    if not unclear:
        return f"the intervals point different ways over {s.e2e.n} {s.e2e.unit}: more --repeat settles them"
    return (f"the {' and '.join(unclear)} interval{'s are' if len(unclear) > 1 else ' is'} too wide "
            f"to decide over {s.e2e.n} {s.e2e.unit}: more --repeat narrows {'them' if len(unclear) > 1 else 'it'}")


def headline(report: CompareReport) -> Headline | None:
    """The lead of ``report`` at its first level; None when nothing was measured."""
    if not report.levels:
        return None
    lv = report.levels[0]
    s = lv.speed
    verdicts = {s.e2e.verdict, s.tpot.verdict, s.throughput.verdict}
    agree = len(verdicts) == 1
    figures = (f"TPOT {ratio_text(s.tpot)} {s.tpot.verdict}, E2E {ratio_text(s.e2e)} {s.e2e.verdict}, "
               f"tokens/s {ratio_text(s.throughput)} {s.throughput.verdict}")
    return Headline(response=response_sentence(s.e2e), text=text_sentence(report.counts, len(report.identity)),
                    figures=figures, agree=agree, why_not=None if agree else why_disagree(report, lv))

"""The sequential design and its outcome as saved (records/sequential.py)."""

import pytest
from pydantic import ValidationError

from specadapt.records import RatioCI, SequentialDesign, SequentialOutcome


def test_the_outcome_reads_back_as_written():
    outcome = SequentialOutcome(
        verdict="faster", stopped="decided", units=7, requests=14, fixed_requests=72,
        interval=RatioCI(point=1.5, low=1.2, high=1.9, n=7, method="cs", level=0.95, min_n=3),
        text="spec on is faster (1.50x, 95% confidence sequence 1.20-1.90x) after 7 pairs")
    again = SequentialOutcome.model_validate_json(outcome.model_dump_json())
    assert again == outcome
    assert again.interval.verdict == "faster"


def test_the_outcome_knows_only_its_verdicts_and_stops():
    interval = RatioCI(point=1.0, n=2)
    with pytest.raises(ValidationError):
        SequentialOutcome(verdict="better", stopped="decided", units=2, requests=4, interval=interval, text="")
    with pytest.raises(ValidationError):
        SequentialOutcome(verdict="faster", stopped="early", units=2, requests=4, interval=interval, text="")


def test_the_rule_in_words_names_the_design():
    text = SequentialDesign(alpha=0.01, margin=0.05, max_units=30, primary="e2e", min_units=12).rule
    assert "99%" in text and "e2e ratio" in text and "equivalent within +-5%" in text
    assert "at most 30 units" in text and "at least 12 units" in text and "error rate 0.01" in text
    plain = SequentialDesign(first_look=6).rule
    assert "equivalent" not in plain and "at least 6 units" in plain


def test_the_design_reads_back_as_written():
    design = SequentialDesign(alpha=0.1, phi=0.5, primary="throughput", margin=0.1, max_units=20, min_units=4,
                              fail_divergences=2, first_look=8)
    assert SequentialDesign.model_validate_json(design.model_dump_json()) == design

"""configs/ holds the generated examples; this fails when they are out of date."""

from __future__ import annotations

from specadapt.configs.examples import EXAMPLES, stale_examples


def test_examples_are_up_to_date(repo_root):
    stale = stale_examples(repo_root / "configs")
    assert stale == [], ("out of date: " + ", ".join(stale) +
                         " -- regenerate with: python -m specadapt.configs.examples configs")


def test_examples_cover_the_required_set():
    assert set(EXAMPLES) == {"vllm-ngram", "vllm-eagle3", "vllm-draft-model", "trtllm-eagle3",
                             "trtllm-mtp", "trtllm-ngram"}

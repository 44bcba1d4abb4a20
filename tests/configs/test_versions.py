"""Version parsing and the per-version method tables."""

from __future__ import annotations

import pytest

from specadapt.configs import versions as V
from specadapt.errors import UsageError


@pytest.mark.parametrize("text,want", [("0.8.5", (0, 8, 5)), ("v0.10.1.post1", (0, 10, 1)),
                                       ("1.2.0rc3", (1, 2, 0)), ("1.1", (1, 1, 0)),
                                       ("0.32.0+cpu", (0, 32, 0))])
def test_parse_version(text, want):
    assert V.parse_version(text) == want


def test_parse_version_refuses_words():
    with pytest.raises(UsageError, match="write it like 0.8.5"):
        V.parse_version("latest")


@pytest.mark.parametrize("version,methods", [
    ((0, 7, 3), ["draft_model", "eagle", "medusa", "ngram", "off"]),
    ((0, 8, 0), ["draft_model", "eagle", "medusa", "mtp", "ngram", "off"]),
    ((0, 8, 5), ["draft_model", "eagle", "eagle3", "medusa", "mtp", "ngram", "off"]),
    ((0, 12, 0), ["eagle", "eagle3", "medusa", "mtp", "ngram", "suffix", "off"]),
    ((0, 32, 0), ["draft_model", "eagle", "eagle3", "medusa", "mtp", "ngram", "suffix", "off"]),
])
def test_vllm_methods(version, methods):
    assert V.vllm_methods(version) == methods


def test_trtllm_methods():
    assert V.trtllm_methods("pytorch") == ["draft_model", "eagle3", "mtp", "ngram", "off"]
    assert V.trtllm_methods("tensorrt") == ["draft_model", "eagle", "medusa", "off"]


def test_defaults_are_the_checked_versions():
    assert V.resolve_version("vllm", None) == (0, 32, 0)
    assert V.resolve_version("trtllm", None) == (1, 2, 1)

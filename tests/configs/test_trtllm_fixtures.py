"""TensorRT-LLM YAML examples from its own docs (see fixtures/trtllm/*, origin in each file):
what specadapt and the published JSON schema say about them."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from specadapt.adapters.spec_config import load_spec_config
from specadapt.configs import trtllm
from specadapt.configs.files import validate_file

FIX = Path(__file__).parent / "fixtures" / "trtllm"
# file -> (specadapt accepts, schema at 20e20312 accepts)
EXPECT = {
    "eagle3-hub.yaml": (True, True),
    "eagle3-local.yaml": (True, True),
    "eagle3-model-dir-alias.yaml": (True, True),
    "ngram-quickstart.yaml": (True, True),
    "mtp-quickstart.yaml": (True, True),
    "deepseek-r1-mtp-serve.yaml": (True, True),
    # docs keys the schema does not know; specadapt warns (unknown key), schema refuses
    "eagle3-dynamic-tree.yaml": (True, False),
    "eagle3-sa.yaml": (True, False),
    "draft-target-docs-spelling.yaml": (False, False),
}


def test_every_fixture_has_an_expectation_and_an_origin():
    files = sorted(p.name for p in FIX.glob("*.yaml"))
    assert files == sorted(EXPECT)
    for name in files:
        assert (FIX / name).read_text().startswith("# origin: NVIDIA/TensorRT-LLM "), name


@pytest.mark.parametrize("name", sorted(EXPECT))
def test_specadapt_verdict(name):
    ours, _ = EXPECT[name]
    assert validate_file(FIX / name).ok is ours


@pytest.mark.parametrize("name", sorted(EXPECT))
def test_schema_verdict(name, schema):
    _, by_schema = EXPECT[name]
    doc = yaml.safe_load((FIX / name).read_text())
    assert (trtllm.schema_problems(doc, schema) == []) is by_schema


@pytest.mark.parametrize("name", sorted(EXPECT))
def test_unknown_keys_are_flagged_without_schema(name):
    """What the schema refuses, specadapt at least warns about."""
    _, by_schema = EXPECT[name]
    report = validate_file(FIX / name)
    flagged = [p for p in report.problems if "enable_iter_perf_stats" not in p.message
               and "num_nextn_predict_layers" not in p.message]
    assert bool(flagged) is (not by_schema)


def test_docs_examples_read_back_as_spec_configs():
    """A whole trtllm-serve config file given to --spec-config reads as its speculative_config."""
    read = {name: load_spec_config(str(FIX / name), "trtllm")
            for name in ("eagle3-hub.yaml", "ngram-quickstart.yaml", "deepseek-r1-mtp-serve.yaml")}
    assert {name: (s.method, s.k) for name, s in read.items()} == {
        "eagle3-hub.yaml": ("eagle3", 4), "ngram-quickstart.yaml": ("ngram", 3), "deepseek-r1-mtp-serve.yaml": ("mtp", 1)}

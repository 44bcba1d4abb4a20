"""Shared fixtures for the configs tests: paths to the repo, the TRT-LLM schema and a
local HF model directory."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from specadapt.models import embedded_model_dir

REPO_ROOT = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).parent / "fixtures"
# TensorRT-LLM's speculative_config JSON schema (origin: tests/fixtures/trtllm/README.md)
SCHEMA = REPO_ROOT / "tests" / "fixtures" / "trtllm" / "trtllm-speculative.schema.json"
SMOL = embedded_model_dir()  # the product's own path: honours SPECADAPT_CACHE_DIR and XDG_CACHE_HOME


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(scope="session")
def schema_path() -> Path:
    # part of the repository: a missing file is a failure, never a skip
    assert SCHEMA.is_file(), f"TensorRT-LLM schema fixture missing: {SCHEMA}"
    return SCHEMA


@pytest.fixture(scope="session")
def schema(schema_path: Path) -> dict:
    return json.loads(schema_path.read_text())


@pytest.fixture(scope="session")
def smol_dir() -> Path:
    if not (SMOL / "config.json").is_file():
        pytest.skip(f"embedded model not fetched at {SMOL}: run 'specadapt models fetch'")
    return SMOL


@pytest.fixture
def smol_copy(tmp_path: Path, smol_dir: Path):
    """Copy of the embedded model's config/tokenizer (weights linked) with config edits."""

    def make(name: str, **config_edits) -> Path:
        d = tmp_path / name
        d.mkdir()
        for f in smol_dir.iterdir():
            if f.suffix == ".safetensors":
                (d / f.name).symlink_to(f)
            elif f.is_file():
                shutil.copy(f, d / f.name)
        cfg = json.loads((d / "config.json").read_text())
        cfg.update(config_edits)
        (d / "config.json").write_text(json.dumps(cfg))
        return d

    return make

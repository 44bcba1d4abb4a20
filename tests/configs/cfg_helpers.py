"""Helpers for the configs tests (a unique module name, unlike conftest)."""

from __future__ import annotations

import json
from pathlib import Path


def make_model_dir(root: Path, name: str, config: dict, vocab: dict[str, int] | None = None,
                   ) -> Path:
    """A fake HF model dir: config.json and, optionally, a tokenizer.json vocabulary."""
    d = root / name
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps(config))
    if vocab is not None:
        (d / "tokenizer.json").write_text(json.dumps({"model": {"vocab": vocab},
                                                      "added_tokens": []}))
    return d

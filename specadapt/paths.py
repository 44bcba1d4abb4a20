"""Where specadapt keeps caches and run logs (outside the repository)."""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "SPECADAPT_CACHE_DIR"


def cache_dir() -> Path:
    """``$SPECADAPT_CACHE_DIR``, else ``$XDG_CACHE_HOME/specadapt``, else ``~/.cache/specadapt``."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "specadapt"


def models_dir() -> Path:
    return cache_dir() / "models"


def runs_dir() -> Path:
    """Server logs of managed processes, one file per start."""
    path = cache_dir() / "runs"
    path.mkdir(parents=True, exist_ok=True)
    return path

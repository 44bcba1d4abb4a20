"""Backends by name, through the ``specadapt.backends`` entry-point group.

The built-ins register there exactly as a third-party plugin would; when specadapt runs
from a source tree without being installed, the built-ins are still found.
"""

from __future__ import annotations

import importlib
from importlib import metadata
from typing import Any

from specadapt.errors import UsageError

GROUP = "specadapt.backends"
BUILTIN = {"vllm": "specadapt.adapters.vllm:VLLMBackend"}


def _load(ref: str) -> Any:
    module, _, attr = ref.partition(":")
    return getattr(importlib.import_module(module), attr)


def available() -> dict[str, str]:
    """``{name: "module:attr"}`` of every registered backend."""
    found = dict(BUILTIN)
    for ep in metadata.entry_points(group=GROUP):
        found[ep.name] = ep.value
    return found


def get_backend(name: str) -> Any:
    refs = available()
    if name not in refs:
        raise UsageError(f"unknown backend {name!r}: choose one of {', '.join(sorted(refs))}")
    return _load(refs[name])

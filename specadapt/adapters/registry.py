"""Backends by name, through the ``specadapt.backends`` entry-point group.

The built-ins register there exactly as a third-party plugin would; when specadapt runs
from a source tree without being installed (or from an install older than the source),
the built-ins are still found. A backend object has ``name``, ``capabilities`` (a subset
of CAPABILITIES), ``connect(url, api_key=, verify=)``, and, for ``launch``,
``launch_options`` and ``launched``; ``version()`` is optional.

A plugin that fails to load never crashes the CLI: ``installed()`` reports it with the
reason, and ``get_backend`` names it in the error.
"""

from __future__ import annotations

import importlib
import warnings
from importlib import metadata
from typing import Any

from pydantic import BaseModel, Field

from specadapt.errors import UsageError

GROUP = "specadapt.backends"
BUILTIN = {
    "vllm": "specadapt.adapters.vllm:VLLMBackend",
    "trtllm": "specadapt.adapters.trtllm:TRTLLMBackend",
    "sglang": "specadapt.adapters.sglang:SGLangBackend",
    "llamacpp": "specadapt.adapters.llamacpp:LlamaCppBackend",
    "reference": "specadapt.adapters.reference:ReferenceBackend",
}
CAPABILITIES = ("launch", "connect", "counters", "logprobs")


class BackendPluginWarning(UserWarning):
    """A registered backend could not be loaded (the message names it and says why)."""


class BackendEntry(BaseModel):
    """One registered backend as ``specadapt backends`` lists it."""

    name: str
    ref: str = Field(description="module:attribute the entry point names.")
    distribution: str | None = Field(None, description="The installed package that registered it.")
    version: str | None = Field(None, description="Version of the server software it drives, when known.")
    capabilities: list[str] = Field(default_factory=list)
    error: str | None = Field(None, description="Why it could not be loaded; None when it loaded.")


def _load(ref: str) -> Any:
    module, _, attr = ref.partition(":")
    obj = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def _entry_points() -> dict[str, tuple[str, str | None]]:
    found: dict[str, tuple[str, str | None]] = {name: (ref, "specadapt") for name, ref in BUILTIN.items()}
    for ep in metadata.entry_points(group=GROUP):
        dist = getattr(getattr(ep, "dist", None), "name", None)
        found[ep.name] = (ep.value, dist)
    return found


def available() -> dict[str, str]:
    """``{name: "module:attr"}`` of every registered backend."""
    return {name: ref for name, (ref, _dist) in _entry_points().items()}


def _describe(name: str, ref: str, dist: str | None) -> BackendEntry:
    entry = BackendEntry(name=name, ref=ref, distribution=dist)
    try:
        backend = _load(ref)
        caps = [str(c) for c in getattr(backend, "capabilities", ())]
        unknown = [c for c in caps if c not in CAPABILITIES]
        if not callable(getattr(backend, "connect", None)):
            raise TypeError("it has no connect()")
        entry.capabilities = [c for c in CAPABILITIES if c in caps] + unknown
        version = getattr(backend, "version", None)
        entry.version = version() if callable(version) else (str(version) if version else None)
    except Exception as exc:  # noqa: BLE001 - a third-party plugin may raise anything on import
        entry.error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}".rstrip(": ")
    return entry


def installed(warn: bool = True) -> list[BackendEntry]:
    """Every registered backend, loaded; broken ones carry ``error`` (and warn, naming them)."""
    out = []
    for name, (ref, dist) in sorted(_entry_points().items()):
        entry = _describe(name, ref, dist)
        if entry.error and warn:
            warnings.warn(f"backend plugin {name!r} ({ref}, from {dist or 'unknown package'}) "
                          f"could not be loaded: {entry.error}", BackendPluginWarning, stacklevel=2)
        out.append(entry)
    return out


def get_backend(name: str) -> Any:
    refs = available()
    if name not in refs:
        raise UsageError(f"unknown backend {name!r}: choose one of {', '.join(sorted(refs))} "
                         "('specadapt backends' lists them)")
    try:
        return _load(refs[name])
    except Exception as exc:  # noqa: BLE001
        raise UsageError(f"backend {name!r} ({refs[name]}) could not be loaded: {type(exc).__name__}: "
                         f"{exc}; reinstall or remove the package that registers it") from exc

"""Backends by name, through the ``specadapt.backends`` entry-point group.

The built-ins register there exactly as a third-party plugin would; when specadapt runs
from a source tree without being installed (or from an install older than the source),
the built-ins are still found. An entry point names a ``Backend`` subclass (adapters/base.py;
instantiated without arguments) or a ready instance; an object that is not a Backend is
taken only if it has every attribute of the contract, and refused naming what it lacks.
Its declarations are checked too: ``capabilities``, ``spec_support`` and ``token_requests``
of the contract's own types, valid, and consistent with each other.

A plugin that fails to load never crashes the CLI: ``installed()`` reports it with the
reason, and ``get_backend`` names it in the error.
"""

from __future__ import annotations

import importlib
import warnings
from importlib import metadata
from typing import Any

from pydantic import BaseModel, Field, ValidationError

from specadapt.adapters.base import CAPABILITIES, Backend, Capabilities, LaunchOptions, SpecSupport, TokenRequests
from specadapt.errors import UsageError

GROUP = "specadapt.backends"
BUILTIN = {
    "vllm": "specadapt.adapters.vllm:VLLMBackend",
    "trtllm": "specadapt.adapters.trtllm:TRTLLMBackend",
    "sglang": "specadapt.adapters.sglang:SGLangBackend",
    "llamacpp": "specadapt.adapters.llamacpp:LlamaCppBackend",
    "reference": "specadapt.adapters.reference:ReferenceBackend",
}
# what get_backend() promises its callers: a Backend has them all
CONTRACT = ("name", "capabilities", "launch_options", "connect", "resolve_model", "launched", "launched_many",
            "version")
# what a Backend declares besides its capabilities (the base class has defaults for them)
DECLARATIONS = {"spec_support": SpecSupport, "token_requests": TokenRequests}
__all__ = ["BUILTIN", "CAPABILITIES", "CONTRACT", "DECLARATIONS", "GROUP", "BackendEntry", "BackendPluginWarning",
           "available", "get_backend", "installed", "load"]


class BackendPluginWarning(UserWarning):
    """A registered backend could not be loaded (the message names it and says why)."""


class BackendEntry(BaseModel):
    """One registered backend as ``specadapt backends`` lists it."""

    name: str
    ref: str = Field(description="module:attribute the entry point names.")
    distribution: str | None = Field(None, description="The installed package that registered it.")
    version: str | None = Field(None, description="Version of the server software it drives, when known.")
    capabilities: list[str] = Field(default_factory=list)
    spec_support: SpecSupport | None = Field(None, description="What it takes in --spec-config; None when broken.")
    token_requests: TokenRequests | None = Field(None, description="How its completions are asked for token ids "
                                                                  "and prompt logprobs; None when broken.")
    error: str | None = Field(None, description="Why it could not be loaded; None when it loaded.")


def _import(ref: str) -> Any:
    module, _, attr = ref.partition(":")
    obj = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def _as_backend(obj: Any, name: str) -> Backend:
    """The loaded object as a Backend instance, or TypeError saying what is missing or wrong."""
    if isinstance(obj, type) and issubclass(obj, Backend):
        obj = obj()
    if not isinstance(obj, Backend):
        missing = [attr for attr in CONTRACT if not hasattr(obj, attr)]
        if missing:
            raise TypeError(f"it is not a specadapt Backend and lacks {', '.join(missing)} (subclass "
                            "specadapt.adapters.base.Backend, which has them all)")
        lacks = [attr for attr in DECLARATIONS if not hasattr(obj, attr)]
        if lacks:
            raise TypeError(f"it is not a specadapt Backend and lacks {', '.join(lacks)} (declare them, or subclass "
                            "specadapt.adapters.base.Backend, which has their defaults)")
        if isinstance(obj, type):
            obj = obj()
    if not isinstance(obj.capabilities, Capabilities):
        raise TypeError(f"capabilities must be a specadapt.adapters.base.Capabilities, not "
                        f"{type(obj.capabilities).__name__}")
    _check_declarations(obj)
    if not (isinstance(obj.launch_options, type) and issubclass(obj.launch_options, LaunchOptions)):
        raise TypeError("launch_options must be a subclass of specadapt.adapters.base.LaunchOptions")
    if obj.name != name:
        raise TypeError(f"the entry point is named {name!r} but the backend calls itself {obj.name!r}: "
                        "make them equal")
    cls = type(obj)
    if obj.capabilities.launch and isinstance(obj, Backend) and cls.launch_plan is Backend.launch_plan \
            and cls.launched_many is Backend.launched_many:
        raise TypeError("it declares the launch capability but defines no launch_plan()")
    return obj


def _check_declarations(obj: Backend) -> None:
    """TypeError naming the first declaration that is not of its type, not valid (one built
    without validation), or at odds with the capabilities."""
    for attr, model in DECLARATIONS.items():
        value = getattr(obj, attr)
        if not isinstance(value, model):
            raise TypeError(f"{attr} must be a specadapt.adapters.base.{model.__name__}, not {type(value).__name__}")
        try:
            model.model_validate(value.model_dump())
        except ValidationError as exc:
            raise TypeError(f"{attr}: {_invalid(exc)}") from None
    if obj.spec_support.batch_schedule and not obj.capabilities.launch:
        raise TypeError("spec_support declares batch_schedule (servers it starts apply a per-batch-size draft "
                        "length) but the backend starts no servers: drop it, or declare the launch capability")


def _invalid(exc: ValidationError) -> str:
    """The first error of a declaration as ``field: what is wrong``."""
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"])
    msg = str(err["msg"]).removeprefix("Value error, ")
    return f"{where}: {msg}" if where else msg


def load(name: str, ref: str) -> Backend:
    """Import ``ref`` ("module:attr") and check it is a backend named ``name``."""
    return _as_backend(_import(ref), name)


def _entry_points() -> dict[str, tuple[str, str | None]]:
    found: dict[str, tuple[str, str | None]] = {name: (ref, "specadapt") for name, ref in BUILTIN.items()}
    for ep in metadata.entry_points(group=GROUP):
        found[ep.name] = (ep.value, ep.dist.name if ep.dist is not None else None)
    return found


def available() -> dict[str, str]:
    """``{name: "module:attr"}`` of every registered backend."""
    return {name: ref for name, (ref, _dist) in _entry_points().items()}


def _error(exc: Exception) -> str:
    if isinstance(exc, ValidationError):  # a declaration refused as the plugin built it
        return f"{type(exc).__name__}: {exc.title}: {_invalid(exc)}"
    first = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {first}".rstrip(": ")


def _describe(name: str, ref: str, dist: str | None) -> BackendEntry:
    entry = BackendEntry(name=name, ref=ref, distribution=dist)
    try:
        backend = load(name, ref)
        entry.capabilities = backend.capabilities.names()
        entry.spec_support, entry.token_requests = backend.spec_support, backend.token_requests
        entry.version = backend.version()
    except Exception as exc:  # noqa: BLE001 - a third-party plugin may raise anything on import
        entry.error = _error(exc)
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


def get_backend(name: str) -> Backend:
    """The backend registered as ``name``; UsageError naming the choices, or why it is broken."""
    refs = available()
    if name not in refs:
        raise UsageError(f"unknown backend {name!r}: choose one of {', '.join(sorted(refs))} "
                         "('specadapt backends' lists them)")
    try:
        return load(name, refs[name])
    except Exception as exc:  # noqa: BLE001
        raise UsageError(f"backend {name!r} ({refs[name]}) could not be loaded: {_error(exc)}; "
                         "reinstall or remove the package that registers it") from exc

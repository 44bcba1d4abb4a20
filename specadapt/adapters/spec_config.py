"""``--spec-config`` for a registered backend: the forms and fields its ``spec_support`` declares.

configs/spec_input.py reads every form; which of them a backend takes, and which neutral
fields its servers honour, is the backend's own declaration (adapters/base.py), found here
through the registry, so a plugin's declaration counts exactly like a built-in's. A name
nothing registers takes the defaults: the neutral form, every neutral field.
"""

from __future__ import annotations

from specadapt.adapters.base import Backend, SpecSupport
from specadapt.adapters.registry import available, get_backend
from specadapt.configs.spec import SpecConfig
from specadapt.configs.spec_input import read_spec_config

__all__ = ["forms_for", "load_spec_config", "spec_support"]


def spec_support(backend: str | Backend) -> SpecSupport:
    """What ``backend`` (a Backend or a registered name) declares it takes in ``--spec-config``."""
    if isinstance(backend, Backend):
        return backend.spec_support
    return get_backend(backend).spec_support if backend in available() else SpecSupport()


def forms_for(backend: str | Backend) -> list[str]:
    """The forms ``--backend backend`` takes: the neutral one, then its own."""
    return spec_support(backend).forms


def load_spec_config(value: str, backend: str | Backend) -> SpecConfig:
    """``--spec-config`` VALUE for ``--backend backend`` -> SpecConfig, or one UsageError line."""
    name = backend.name if isinstance(backend, Backend) else backend
    return read_spec_config(value, name, spec_support(backend))

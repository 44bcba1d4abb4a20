"""Do the two sides of a comparison differ in speculation only?

``side_differences(off, on)`` reads what both ServerInfos recorded (how specadapt started
each server, or what a running server says about itself) and gives one readable line per
difference other than speculation: launch argv, environment, interpreter, package version,
config file settings, server version, model root, max_model_len, dtype, the server's
own settings and the hardware each ran on (where both are known). An empty list means
the sides differ in speculation only (as far as they could be seen). Secret values never
appear: the records hold them as ``***`` already, and names that look secret are masked
again here.
"""

from __future__ import annotations

import shlex
from collections import Counter
from typing import Any

from specadapt.adapters.plan import RECORD_REDACTED, SECRET_NAME, record_argv
from specadapt.records.server import HardwareInfo, LaunchRecord, ServerInfo

OFF, ON = "spec-off", "spec-on"


def _show(value: Any) -> str:
    if value is None:
        return "unset"
    return shlex.quote(value) if isinstance(value, str) else repr(value)


def _differs(what: str, off: Any, on: Any) -> str:
    return f"{what}: {_show(off)} on the {OFF} side, {_show(on)} on the {ON} side"


def _masked(name: str, value: Any) -> Any:
    return RECORD_REDACTED if SECRET_NAME.search(name) and value is not None else value


def _flat(settings: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested settings as ``a.b.c`` -> value."""
    out: dict[str, Any] = {}
    for key, value in settings.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(_flat(value, name + "."))
        else:
            out[name] = value
    return out


def _mapping_differences(what: str, off: dict[str, Any], on: dict[str, Any]) -> list[str]:
    """One line per name whose value differs (or is set on one side only)."""
    return [_differs(f"{what} {name}", _masked(name, off.get(name)), _masked(name, on.get(name)))
            for name in sorted(set(off) | set(on)) if off.get(name) != on.get(name)]


def _argv_difference(off: list[str], on: list[str]) -> list[str]:
    off, on = record_argv(off), record_argv(on)
    if off == on:
        return []
    only_off = list((Counter(off) - Counter(on)).elements())
    only_on = list((Counter(on) - Counter(off)).elements())
    if not (only_off or only_on):
        return ["launch argv: the same arguments apart from speculation, in a different order"]
    return [f"launch argv differs apart from speculation: only the {OFF} side has "
            f"{shlex.join(only_off) or 'nothing more'}, only the {ON} side has {shlex.join(only_on) or 'nothing more'}"]


def _cpu_difference(off: list[int] | None, on: list[int] | None) -> list[str]:
    """The sides' CPU shares differ in size, or one is bound and the other not (which CPUs each has
    is expected to differ: that is the split)."""
    def show(cpus: list[int] | None) -> str:
        return "every CPU (not bound)" if cpus is None else f"{len(cpus)} CPU{'s' if len(cpus) != 1 else ''}"

    if (off is None) == (on is None) and (off is None or len(off) == len(on or [])):
        return []
    return [f"CPUs: {show(off)} on the {OFF} side, {show(on)} on the {ON} side"]


def launch_differences(off: LaunchRecord, on: LaunchRecord) -> list[str]:
    """What two launches differ in besides speculation (spec argv block, per-server flag values
    and the speculative part of a config file are expected to differ and are left out)."""
    lines = []
    if off.backend != on.backend:
        lines.append(_differs("launch backend", off.backend, on.backend))
    lines += _argv_difference(off.comparable_argv(), on.comparable_argv())
    lines += _mapping_differences("environment", off.comparable_env(), on.comparable_env())
    lines += _cpu_difference(off.cpus, on.cpus)
    if off.python != on.python:
        lines.append(_differs("interpreter", off.python, on.python))
    if off.package_version != on.package_version and None not in (off.package_version, on.package_version):
        lines.append(_differs("backend package version", off.package_version, on.package_version))
    lines += _mapping_differences("server config", _flat(off.config), _flat(on.config))
    return lines


def _gpus(hw: HardwareInfo) -> str:
    return "; ".join(f"{g.name} ({g.memory_mib} MiB, cc {g.compute_capability})" for g in hw.gpus) or "none"


def hardware_differences(off: HardwareInfo, on: HardwareInfo) -> list[str]:
    """What the two machines differ in (CPU model, logical CPUs, matrix flags, GPUs); where the
    facts came from is not compared: the same machine seen two ways is the same machine."""
    lines = []
    for what, a, b in (("hardware CPU", off.cpu_model, on.cpu_model), ("hardware logical CPUs", off.cores, on.cores),
                       ("hardware CPU flags", " ".join(off.cpu_flags), " ".join(on.cpu_flags)),
                       ("hardware GPUs", _gpus(off), _gpus(on))):
        if a != b:
            lines.append(_differs(what, a, b))
    return lines


def side_differences(off: ServerInfo, on: ServerInfo) -> list[str]:
    """One readable line per difference between the two sides other than speculation; [] when
    they differ in speculation only. Values one side does not expose are not compared, except
    that a launch or server settings seen on one side only are said to be."""
    lines = []
    if off.backend != on.backend:
        lines.append(_differs("backend", off.backend, on.backend))
    if off.launch is not None and on.launch is not None:
        lines += launch_differences(off.launch, on.launch)
    elif off.launch is not None or on.launch is not None:
        started = OFF if off.launch is not None else ON
        lines.append(f"only the {started} server was started by specadapt: the two launches cannot be compared")
    for what, a, b in (("server version", off.version, on.version), ("model root", off.model_root, on.model_root),
                       ("max_model_len", off.max_model_len, on.max_model_len), ("dtype", off.dtype, on.dtype)):
        if a is not None and b is not None and a != b:
            lines.append(_differs(what, a, b))
    if off.server_flags and on.server_flags:
        lines += _mapping_differences("server setting", off.server_flags, on.server_flags)
    elif off.server_flags or on.server_flags:
        shown = OFF if off.server_flags else ON
        lines.append(f"only the {shown} server exposes its settings (vLLM: /server_info with "
                     "VLLM_SERVER_DEV_MODE=1): they were started differently, and the settings cannot be compared")
    if off.hardware is not None and on.hardware is not None:
        lines += hardware_differences(off.hardware, on.hardware)
    return lines


def side_notes(off: ServerInfo | None, on: ServerInfo, *, off_name: str = f"the {OFF} server",
               on_name: str = f"the {ON} server", no_counters: str = "speculation looks OFF there",
               differences: bool = True) -> list[str]:
    """What looks wrong about the two sides themselves: spec-decode counters on the spec-off side,
    none on the spec-on side (``no_counters``: what that means for the run), different model ids,
    and (``differences``) every other difference than speculation (``side_differences``).
    ``off`` None: no spec-off server (a float64 reference instead)."""
    notes = []
    if off is not None and off.spec_enabled:
        notes.append(f"{off_name} has spec-decode counters: speculation looks ON there")
    if on.spec_enabled is False:
        notes.append(f"{on_name} has no spec-decode counters: {no_counters}")
    if off is not None and off.model_id != on.model_id:
        notes.append(f"the servers serve different model ids ({off.model_id} vs {on.model_id})")
    if off is not None and differences:
        notes += [f"the sides differ in more than speculation: {line}" for line in side_differences(off, on)]
    return notes

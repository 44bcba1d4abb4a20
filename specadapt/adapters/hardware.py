"""The machine a server runs on: CPU model, cores and matrix flags, GPUs, the dtypes it runs natively.

Pure parsers (``cpu_facts``, ``gpu_facts``) take the text they parse, so tests hand them
constructed ``/proc/cpuinfo`` and ``nvidia-smi`` output; ``local_hardware`` reads this machine
(once per process) and never raises: what it cannot read becomes a note. ``resolve_auto_dtype``
is what ``--dtype auto`` becomes when specadapt starts the server here.
"""

from __future__ import annotations

import ipaddress
import shutil
import subprocess
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from specadapt.records import GpuInfo, HardwareInfo

__all__ = ["MATRIX_FLAGS", "NVIDIA_SMI_QUERY", "cpu_facts", "gpu_facts", "is_loopback", "local_hardware",
           "native_dtypes", "resolve_auto_dtype", "server_hardware"]

# CPU flags that decide matrix speed, spelled as /proc/cpuinfo spells them (x86).
MATRIX_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_fp16", "avx_vnni",
                "avx512_vnni", "fma")
NVIDIA_SMI_QUERY = ["nvidia-smi", "--query-gpu=name,memory.total,driver_version,compute_cap",
                    "--format=csv,noheader,nounits"]
BF16_FLAGS = ("avx512_bf16", "amx_bf16")
FP16_FLAGS = ("avx512_fp16", "amx_fp16")

Run = Callable[..., Any]


def _fields(block: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in block.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            out.setdefault(key.strip().lower(), value.strip())
    return out


def cpu_facts(cpuinfo_text: str) -> tuple[str | None, int | None, list[str], list[str]]:
    """(model, logical CPUs, matrix flags present, matrix flags absent) from /proc/cpuinfo text.

    x86 names the model in ``model name`` and lists ``flags``; aarch64 lists ``Features`` and
    often names no model (None then). Cores are the ``processor`` entries (None when there are none)."""
    blocks = [_fields(b) for b in cpuinfo_text.split("\n\n") if b.strip()]
    processors = [b for b in blocks if "processor" in b]
    cores = len(processors) or None
    model = next((b[k] for b in blocks for k in ("model name", "hardware", "cpu model") if b.get(k)), None)
    flag_text = next((b["flags"] for b in blocks if "flags" in b), None)
    if flag_text is None:  # not x86 (aarch64 says "Features"): the x86 flags neither are nor are not there
        return model, cores, [], []
    have = set(flag_text.split())
    return model, cores, [f for f in MATRIX_FLAGS if f in have], [f for f in MATRIX_FLAGS if f not in have]


def _int(text: str) -> int | None:
    try:
        return int(float(text))
    except ValueError:
        return None


def _text(text: str) -> str | None:
    return text if text and text.lower() not in ("[n/a]", "n/a", "[not supported]") else None


def gpu_facts(nvidia_smi_csv: str) -> list[GpuInfo]:
    """GPUs from ``nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap
    --format=csv,noheader,nounits`` output, one line each (blank lines skipped)."""
    gpus = []
    for line in nvidia_smi_csv.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if not parts[0]:
            continue
        parts += [""] * (4 - len(parts))
        gpus.append(GpuInfo(name=parts[0], memory_mib=_int(parts[1]), driver=_text(parts[2]),
                            compute_capability=_text(parts[3])))
    return gpus


def _cc(gpu: GpuInfo) -> float | None:
    try:
        return float(gpu.compute_capability) if gpu.compute_capability else None
    except ValueError:
        return None


def native_dtypes(flags: list[str], gpus: list[GpuInfo]) -> list[str]:
    """Dtypes whose matrix products the hardware runs natively: on GPUs float32, float16 and
    bfloat16 when every GPU has compute capability 8.0 or more; on a CPU float32, bfloat16 with
    avx512_bf16/amx_bf16, float16 with avx512_fp16/amx_fp16."""
    if gpus:
        ccs = [_cc(g) for g in gpus]
        return ["float32", "float16"] + (["bfloat16"] if all(c is not None and c >= 8.0 for c in ccs) else [])
    out = ["float32"]
    if any(f in flags for f in BF16_FLAGS):
        out.append("bfloat16")
    if any(f in flags for f in FP16_FLAGS):
        out.append("float16")
    return out


@cache
def _local_facts(cpuinfo_path: str, run: Run) -> HardwareInfo:
    notes: list[str] = []
    model = cores = None
    present: list[str] = []
    missing: list[str] = []
    try:
        text = Path(cpuinfo_path).read_text(errors="replace")
    except OSError as exc:
        notes.append(f"CPU not known: {cpuinfo_path} could not be read ({exc.strerror or exc})")
    else:
        model, cores, present, missing = cpu_facts(text)
        if not present and not missing:
            notes.append(f"no x86 'flags' line in {cpuinfo_path}: the x86 matrix flags do not apply to this CPU")
    gpus: list[GpuInfo] = []
    if shutil.which("nvidia-smi"):
        try:
            done = run(NVIDIA_SMI_QUERY, capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.SubprocessError) as exc:
            notes.append(f"GPUs not known: nvidia-smi failed ({exc})")
        else:
            if done.returncode == 0:
                gpus = gpu_facts(done.stdout or "")
            else:
                last = (done.stderr or done.stdout or "").strip().splitlines()
                notes.append(f"GPUs not known: nvidia-smi exited {done.returncode}"
                             + (f" ({last[-1]})" if last else ""))
    return HardwareInfo(source="", cpu_model=model, cores=cores, cpu_flags=present, cpu_flags_missing=missing,
                        gpus=gpus, native_dtypes=native_dtypes(present, gpus), notes=notes)


def local_hardware(source: str, cpuinfo_path: str = "/proc/cpuinfo", run: Run = subprocess.run) -> HardwareInfo:
    """This machine's hardware, read once per process (per path and runner), with ``source``;
    never raises: /proc/cpuinfo missing or nvidia-smi failing becomes a note."""
    return _local_facts(str(cpuinfo_path), run).model_copy(update={"source": source}, deep=True)


def _cpu_name(hw: HardwareInfo) -> str:
    return f"this CPU ({hw.cpu_model})" if hw.cpu_model else "this CPU"


def resolve_auto_dtype(hw: HardwareInfo) -> tuple[str, str]:
    """(dtype, reason) that ``--dtype auto`` becomes on ``hw``: with GPUs bfloat16 when every one
    has compute capability 8.0 or more, else float16; on a CPU alone bfloat16 with AVX512-BF16 or
    AMX-BF16, else float32 (bfloat16 would be emulated)."""
    if hw.gpus:
        named = ", ".join(f"{g.name}, compute capability {g.compute_capability or 'unknown'}" for g in hw.gpus)
        what = "the GPU" if len(hw.gpus) == 1 else "the GPUs"
        if all((c := _cc(g)) is not None and c >= 8.0 for g in hw.gpus):
            return "bfloat16", f"{what} ({named}) runs bfloat16 natively"
        return "float16", f"{what} ({named}) lacks native bfloat16 (compute capability below 8.0), so float16"
    cpu = _cpu_name(hw)
    if "amx_bf16" in hw.cpu_flags:
        return "bfloat16", f"{cpu} has AMX-BF16: bfloat16 runs natively"
    if "avx512_bf16" in hw.cpu_flags:
        return "bfloat16", f"{cpu} has AVX512-BF16: bfloat16 runs natively"
    return "float32", f"{cpu} has no AVX512-BF16 or AMX: bfloat16 would be emulated, so float32"


STARTED_HERE = "this machine (specadapt started the server here)"
LOOPBACK = "this machine (the server's address is loopback)"
NOT_KNOWN = "hardware not known: the server does not expose it (given by URL on another host)"


def server_hardware(base_url: str, started_here: bool) -> tuple[HardwareInfo | None, str | None]:
    """(hardware, note) for a server: this machine's when specadapt started it or its address is
    loopback; else (None, a note saying it is not known)."""
    if started_here:
        return local_hardware(STARTED_HERE), None
    if is_loopback(base_url):
        return local_hardware(LOOPBACK), None
    return None, NOT_KNOWN


def is_loopback(base_url: str) -> bool:
    """Whether the URL's host is this machine: 127.0.0.0/8, ::1 or localhost."""
    host = urlsplit(base_url if "//" in base_url else f"//{base_url}").hostname or ""
    if host.lower() == "localhost" or host.lower().endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False

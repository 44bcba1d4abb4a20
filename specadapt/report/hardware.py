"""The hardware a server ran on, as one line every renderer shows the same way."""

from __future__ import annotations

from specadapt.records import GpuInfo, HardwareInfo

__all__ = ["FLAG_NAMES", "hardware_source_text", "hardware_text"]

# /proc/cpuinfo spelling -> how the line shows it
FLAG_NAMES = {"avx2": "AVX2", "avx512f": "AVX512F", "avx512_bf16": "AVX512-BF16", "avx512_fp16": "AVX512-FP16",
              "amx_tile": "AMX-TILE", "amx_bf16": "AMX-BF16", "amx_fp16": "AMX-FP16", "avx_vnni": "AVX-VNNI",
              "avx512_vnni": "AVX512-VNNI", "fma": "FMA"}
AMX = ("amx_tile", "amx_bf16", "amx_fp16")


def _gpu(gpu: GpuInfo) -> str:
    text = gpu.name
    if gpu.memory_mib:
        text += f" {gpu.memory_mib / 1024:.0f} GiB"
    if gpu.driver:
        text += f", driver {gpu.driver}"
    if gpu.compute_capability:
        text += f", cc {gpu.compute_capability}"
    return text


def _gpus(gpus: list[GpuInfo]) -> list[str]:
    """Identical GPUs once, with a count: '8x NVIDIA H200 140 GiB, driver 550.54.15, cc 9.0'."""
    counts: dict[str, int] = {}
    for gpu in gpus:
        counts[_gpu(gpu)] = counts.get(_gpu(gpu), 0) + 1
    return [text if n == 1 else f"{n}x {text}" for text, n in counts.items()]


def _cpu(hw: HardwareInfo) -> str:
    parts = [hw.cpu_model or "CPU model not known"]
    if hw.cores:
        parts.append(f"{hw.cores} CPU{'s' if hw.cores != 1 else ''}")
    text = ", ".join(parts)
    if hw.cpu_flags:
        text += ", " + " ".join(FLAG_NAMES.get(f, f) for f in hw.cpu_flags)
    lacking = []
    if "avx512_bf16" in hw.cpu_flags_missing:
        lacking.append("AVX512-BF16")
    if all(f in hw.cpu_flags_missing for f in AMX):
        lacking.append("AMX")
    if lacking:
        text += f" (no {', '.join(lacking)})"
    return text


def hardware_text(hw: HardwareInfo | None) -> str:
    """One line: the GPUs (when any), the CPU with the matrix flags it has (and the bfloat16 ones it
    lacks) and the dtypes it runs natively, e.g. 'AMD EPYC, 2 CPUs, AVX2 AVX512F AVX512-BF16 FMA
    (no AMX); native: float32, bfloat16'; 'not known' for None."""
    if hw is None:
        return "not known"
    parts = [*_gpus(hw.gpus), _cpu(hw)]
    text = "; ".join(parts)
    if hw.native_dtypes:
        text += f"; native: {', '.join(hw.native_dtypes)}"
    return text


def hardware_source_text(hw: HardwareInfo | None) -> str:
    """``hardware_text`` with where the facts come from: '...; facts from this machine (specadapt
    started the server here)'; 'not known' for None."""
    return "not known" if hw is None else f"{hardware_text(hw)}; facts from {hw.source}"

"""side_differences on hardware: every kind of machine difference is its own exact line, next to the
other differences of the two sides (these lines decide the "sides differ in more than speculation"
warning)."""

from __future__ import annotations

from specadapt.analysis.sides import hardware_differences, side_differences
from specadapt.records import GpuInfo, HardwareInfo, ServerInfo

H200 = GpuInfo(name="NVIDIA H200", memory_mib=143771, driver="550.54.15", compute_capability="9.0")
A100 = GpuInfo(name="NVIDIA A100-SXM4-80GB", memory_mib=81920, driver="550.54.15", compute_capability="8.0")


def machine(**kw) -> HardwareInfo:
    base = dict(source="constructed", cpu_model="AMD EPYC", cores=2, cpu_flags=["avx2", "fma"], gpus=[H200])
    return HardwareInfo(**{**base, **kw})


def info(**kw) -> ServerInfo:
    base = dict(backend="vllm", base_url="http://127.0.0.1:1", version="0.32.0", hardware=machine())
    return ServerInfo(**{**base, **kw})


def test_cpu_flags_that_differ_are_one_line_with_the_flags_of_each_side():
    assert hardware_differences(machine(), machine(cpu_flags=["avx2", "avx512_bf16", "fma"])) == [
        "hardware CPU flags: 'avx2 fma' on the spec-off side, 'avx2 avx512_bf16 fma' on the spec-on side"]


def test_several_gpus_are_listed_one_after_another_and_no_gpu_is_none():
    assert hardware_differences(machine(gpus=[H200, A100]), machine(gpus=[])) == [
        "hardware GPUs: 'NVIDIA H200 (143771 MiB, cc 9.0); NVIDIA A100-SXM4-80GB (81920 MiB, cc 8.0)' on the "
        "spec-off side, none on the spec-on side"]
    assert hardware_differences(machine(gpus=[]), machine(gpus=[])) == []


def test_every_hardware_difference_in_order():
    on = machine(cpu_model="Intel Xeon", cores=8, cpu_flags=[], gpus=[A100])
    assert hardware_differences(machine(), on) == [
        "hardware CPU: 'AMD EPYC' on the spec-off side, 'Intel Xeon' on the spec-on side",
        "hardware logical CPUs: 2 on the spec-off side, 8 on the spec-on side",
        "hardware CPU flags: 'avx2 fma' on the spec-off side, '' on the spec-on side",
        "hardware GPUs: 'NVIDIA H200 (143771 MiB, cc 9.0)' on the spec-off side, "
        "'NVIDIA A100-SXM4-80GB (81920 MiB, cc 8.0)' on the spec-on side"]


def test_hardware_lines_come_after_the_other_differences_and_keep_them():
    off = info()
    on = info(version="0.31.0", dtype=None, hardware=machine(gpus=[]))
    assert side_differences(off, on) == [
        "server version: 0.32.0 on the spec-off side, 0.31.0 on the spec-on side",
        "hardware GPUs: 'NVIDIA H200 (143771 MiB, cc 9.0)' on the spec-off side, none on the spec-on side"]

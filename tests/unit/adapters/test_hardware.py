"""Hardware facts: /proc/cpuinfo and nvidia-smi parsed, native dtypes, what --dtype auto becomes,
loopback addresses, the hardware in ServerInfo and its one-line rendering."""

from __future__ import annotations

import subprocess
from pathlib import Path

import httpx
import pytest

from specadapt.adapters import hardware
from specadapt.adapters.hardware import (
    cpu_facts,
    gpu_facts,
    is_loopback,
    local_hardware,
    resolve_auto_dtype,
    server_hardware,
)
from specadapt.adapters.vllm import VLLMServer, server_device
from specadapt.analysis.sides import side_differences
from specadapt.orchestration import servers
from specadapt.orchestration.servers import Messages, ServerOptions, Side
from specadapt.records import GpuInfo, HardwareInfo, ServerInfo
from specadapt.report.hardware import hardware_source_text, hardware_text
from builders import server

COMMON = ("fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx fxsr sse sse2 ht "
          "syscall nx mmxext lm constant_tsc rep_good nopl pni pclmulqdq ssse3 cx16 sse4_1 sse4_2 movbe popcnt aes "
          "xsave avx f16c rdrand")


def cpuinfo(model: str | None, flags: str | None, cpus: int = 2, features: str | None = None) -> str:
    """A constructed /proc/cpuinfo text: ``cpus`` processor blocks with the given model and flags."""
    blocks = []
    for i in range(cpus):
        lines = [f"processor\t: {i}"]
        if model:
            lines += ["vendor_id\t: AuthenticAMD" if "AMD" in model else "vendor_id\t: GenuineIntel",
                      f"model name\t: {model}"]
        if flags is not None:
            lines.append(f"flags\t\t: {flags}")
        if features is not None:
            lines += [f"Features\t: {features}", "CPU implementer\t: 0x41", "CPU part\t: 0xd0c"]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n"


# constructed /proc/cpuinfo texts (not read from real machines)
EPYC_AVX2 = cpuinfo("AMD EPYC 7B12", f"{COMMON} fma avx2 bmi1 bmi2 sha_ni", cpus=4)
EPYC_BF16 = cpuinfo("AMD EPYC", f"{COMMON} fma avx2 avx512f avx512dq avx512_bf16 avx512_vnni avx_vnni", cpus=2)
SAPPHIRE = cpuinfo("Intel(R) Xeon(R) Platinum 8480+", f"{COMMON} fma avx2 avx512f avx512_bf16 avx512_fp16 "
                   "avx512_vnni avx_vnni amx_bf16 amx_tile amx_int8", cpus=8)
AARCH64 = cpuinfo(None, None, cpus=2, features="fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp "
                  "cpuid asimdrdm lrcpc dcpop asimddp bf16 i8mm")

# constructed nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv,noheader,nounits
H200_CSV = "NVIDIA H200, 143771, 550.54.15, 9.0\n"
T4_CSV = "Tesla T4, 15360, 535.104.05, 7.5\n"
MIXED_CSV = "NVIDIA A100-SXM4-80GB, 81920, 550.54.15, 8.0\nTesla V100-SXM2-16GB, 16384, 550.54.15, 7.0\n"


def hw_from(text: str, gpus: list[GpuInfo] | None = None) -> HardwareInfo:
    model, cores, present, missing = cpu_facts(text)
    gpus = gpus or []
    return HardwareInfo(source="constructed", cpu_model=model, cores=cores, cpu_flags=present,
                        cpu_flags_missing=missing, gpus=gpus, native_dtypes=hardware.native_dtypes(present, gpus))


# --- /proc/cpuinfo ------------------------------------------------------------------------------
def test_an_avx2_only_epyc_has_avx2_and_fma_and_nothing_for_bfloat16():
    model, cores, present, missing = cpu_facts(EPYC_AVX2)
    assert (model, cores) == ("AMD EPYC 7B12", 4)
    assert present == ["avx2", "fma"]
    assert set(missing) == set(hardware.MATRIX_FLAGS) - {"avx2", "fma"}
    assert hardware.native_dtypes(present, []) == ["float32"]


def test_an_epyc_with_avx512_bf16_runs_bfloat16_natively():
    model, cores, present, missing = cpu_facts(EPYC_BF16)
    assert (model, cores) == ("AMD EPYC", 2)
    assert present == ["avx2", "avx512f", "avx512_bf16", "avx_vnni", "avx512_vnni", "fma"]
    assert "amx_bf16" in missing and "avx512_fp16" in missing
    assert hardware.native_dtypes(present, []) == ["float32", "bfloat16"]


def test_sapphire_rapids_has_amx_and_runs_bfloat16_and_float16():
    model, cores, present, missing = cpu_facts(SAPPHIRE)
    assert model == "Intel(R) Xeon(R) Platinum 8480+" and cores == 8
    assert {"amx_bf16", "amx_tile", "avx512_fp16"} <= set(present)
    assert missing == ["amx_fp16"]  # amx_int8 is not one of the flags that matter here
    assert hardware.native_dtypes(present, []) == ["float32", "bfloat16", "float16"]


def test_aarch64_has_no_model_name_and_no_x86_flags():
    model, cores, present, missing = cpu_facts(AARCH64)
    assert (model, cores, present, missing) == (None, 2, [], [])
    assert hardware.native_dtypes(present, []) == ["float32"]


# --- nvidia-smi ---------------------------------------------------------------------------------
def test_nvidia_smi_lines_become_gpus():
    (h200,) = gpu_facts(H200_CSV)
    assert h200 == GpuInfo(name="NVIDIA H200", memory_mib=143771, driver="550.54.15", compute_capability="9.0")
    gpus = gpu_facts(MIXED_CSV + "\n")
    assert [g.name for g in gpus] == ["NVIDIA A100-SXM4-80GB", "Tesla V100-SXM2-16GB"]
    assert [g.compute_capability for g in gpus] == ["8.0", "7.0"]
    (odd,) = gpu_facts("Some GPU, [N/A], [N/A], [N/A]")
    assert (odd.memory_mib, odd.driver, odd.compute_capability) == (None, None, None)


def test_gpu_native_dtypes_need_compute_capability_8_for_bfloat16():
    assert hardware.native_dtypes([], gpu_facts(H200_CSV)) == ["float32", "float16", "bfloat16"]
    assert hardware.native_dtypes([], gpu_facts(T4_CSV)) == ["float32", "float16"]
    assert hardware.native_dtypes([], gpu_facts(MIXED_CSV)) == ["float32", "float16"]


# --- --dtype auto ---------------------------------------------------------------------------------
@pytest.mark.parametrize("text, gpus, expected", [
    (EPYC_AVX2, None, ("float32", "this CPU (AMD EPYC 7B12) has no AVX512-BF16 or AMX: bfloat16 would be emulated, "
                                  "so float32")),
    (EPYC_BF16, None, ("bfloat16", "this CPU (AMD EPYC) has AVX512-BF16: bfloat16 runs natively")),
    (SAPPHIRE, None, ("bfloat16", "this CPU (Intel(R) Xeon(R) Platinum 8480+) has AMX-BF16: bfloat16 runs natively")),
    (AARCH64, None, ("float32", "this CPU has no AVX512-BF16 or AMX: bfloat16 would be emulated, so float32")),
    (EPYC_AVX2, H200_CSV, ("bfloat16", "the GPU (NVIDIA H200, compute capability 9.0) runs bfloat16 natively")),
    (EPYC_BF16, T4_CSV, ("float16", "the GPU (Tesla T4, compute capability 7.5) lacks native bfloat16 (compute "
                                    "capability below 8.0), so float16")),
], ids=["epyc-avx2", "epyc-bf16", "sapphire-rapids", "aarch64", "h200", "t4"])
def test_auto_dtype_is_what_the_hardware_runs_natively(text, gpus, expected):
    assert resolve_auto_dtype(hw_from(text, gpu_facts(gpus) if gpus else None)) == expected


def test_one_gpu_without_bfloat16_makes_it_float16():
    dtype, reason = resolve_auto_dtype(hw_from(EPYC_AVX2, gpu_facts(MIXED_CSV)))
    assert dtype == "float16" and reason.startswith("the GPUs (NVIDIA A100-SXM4-80GB, compute capability 8.0, ")


# --- this machine -----------------------------------------------------------------------------------
class Done:
    def __init__(self, returncode: int, stdout: str = "", stderr: str = ""):
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


def test_local_hardware_reads_the_file_and_nvidia_smi(tmp_path, monkeypatch):
    path = tmp_path / "cpuinfo"
    path.write_text(EPYC_BF16)
    monkeypatch.setattr(hardware.shutil, "which", lambda name: "/usr/bin/nvidia-smi")
    calls = []

    def run(argv, **kw):
        calls.append((argv, kw["timeout"]))
        return Done(0, H200_CSV)

    hw = local_hardware("here", cpuinfo_path=str(path), run=run)
    assert hw.source == "here" and hw.cpu_model == "AMD EPYC" and hw.cores == 2
    assert [g.name for g in hw.gpus] == ["NVIDIA H200"] and hw.native_dtypes == ["float32", "float16", "bfloat16"]
    assert calls == [(hardware.NVIDIA_SMI_QUERY, 10)]
    again = local_hardware("there", cpuinfo_path=str(path), run=run)
    assert again.source == "there" and len(calls) == 1  # read once per process


def test_local_hardware_never_raises(tmp_path, monkeypatch):
    monkeypatch.setattr(hardware.shutil, "which", lambda name: "/usr/bin/nvidia-smi")

    def hangs(argv, **kw):
        raise subprocess.TimeoutExpired(argv, kw["timeout"])

    hw = local_hardware("here", cpuinfo_path=str(tmp_path / "missing"), run=hangs)
    assert hw.cpu_model is None and hw.gpus == [] and hw.native_dtypes == ["float32"]
    assert hw.notes[0].startswith(f"CPU not known: {tmp_path / 'missing'} could not be read")
    assert hw.notes[1].startswith("GPUs not known: nvidia-smi failed (Command ")
    failed = local_hardware("here", cpuinfo_path=str(tmp_path / "missing"),
                            run=lambda argv, **kw: Done(9, "", "NVIDIA-SMI has failed because it couldn't "
                                                              "communicate with the NVIDIA driver"))
    assert failed.notes[1] == ("GPUs not known: nvidia-smi exited 9 (NVIDIA-SMI has failed because it couldn't "
                               "communicate with the NVIDIA driver)")


def test_no_nvidia_smi_is_not_run(tmp_path, monkeypatch):
    path = tmp_path / "cpuinfo"
    path.write_text(AARCH64)
    monkeypatch.setattr(hardware.shutil, "which", lambda name: None)

    def run(argv, **kw):
        raise AssertionError("nvidia-smi is not there")

    hw = local_hardware("here", cpuinfo_path=str(path), run=run)
    assert hw.gpus == [] and hw.cores == 2
    assert hw.notes == [f"no x86 'flags' line in {path}: the x86 matrix flags do not apply to this CPU"]


@pytest.mark.parametrize("url, loopback", [
    ("http://127.0.0.1:8000", True), ("http://127.3.4.5", True), ("http://localhost:1", True),
    ("https://LOCALHOST/v1", True), ("http://[::1]:8000", True), ("http://10.0.0.5:8000", False),
    ("http://128.0.0.1", False), ("http://example.com", False), ("http://[2001:db8::1]:80", False),
])
def test_loopback_addresses(url, loopback):
    assert is_loopback(url) is loopback


def test_server_hardware_by_where_the_server_is(monkeypatch):
    monkeypatch.setattr(hardware, "local_hardware", lambda source: HardwareInfo(source=source))
    assert server_hardware("http://10.1.2.3:8000", started_here=True)[0].source == hardware.STARTED_HERE
    assert server_hardware("http://127.0.0.1:8000", started_here=False)[0].source == hardware.LOOPBACK
    assert server_hardware("http://10.1.2.3:8000", started_here=False) == (
        None, "hardware not known: the server does not expose it (given by URL on another host)")


# --- in ServerInfo ---------------------------------------------------------------------------------
FIXTURES = Path(__file__).parents[2] / "fixtures" / "vllm"


def vllm_transport() -> httpx.MockTransport:
    answers = {"/v1/models": (FIXTURES / "models.json").read_text(), "/version": '{"version": "0.32.0"}',
               "/server_info": (FIXTURES / "server-info-off.json").read_text(),
               "/metrics": (FIXTURES / "metrics-spec-off.txt").read_text()}
    return httpx.MockTransport(lambda req: httpx.Response(200, text=answers[req.url.path]))


def test_a_remote_vllm_server_s_hardware_is_not_known_but_its_device_is_said():
    info = VLLMServer("http://10.9.8.7:8000", transport=vllm_transport()).describe()
    assert info.hardware is None
    assert "hardware not known: the server does not expose it (given by URL on another host)" in info.notes
    assert "the server says its device is cpu (/server_info device_config)" in info.notes


def test_a_loopback_vllm_server_runs_here(monkeypatch):
    monkeypatch.setattr(hardware, "local_hardware", lambda source: HardwareInfo(source=source, cpu_model="X"))
    info = VLLMServer("http://127.0.0.1:8000", transport=vllm_transport()).describe()
    assert info.hardware.source == "this machine (the server's address is loopback)"
    assert info.hardware.notes == ["the server says its device is cpu (/server_info device_config)"]
    assert not any(n.startswith("hardware not known") for n in info.notes)


def test_server_device_in_both_forms():
    assert server_device({"vllm_config": {"device_config": {"device": "cuda"}}}) == "cuda"
    assert server_device({"vllm_config": "model='m', device_config=cpu, seed=0"}) == "cpu"
    assert server_device({"vllm_config": {"model_config": {}}}) is None
    assert server_device(None) is None


# --- the two sides ------------------------------------------------------------------------------------
def info(hw: HardwareInfo | None) -> ServerInfo:
    return server(hardware=hw, model_id=None)


def test_the_same_machine_seen_two_ways_is_no_difference():
    here = hw_from(EPYC_BF16)
    seen = here.model_copy(update={"source": hardware.LOOPBACK, "notes": ["the server says its device is cpu"]})
    assert side_differences(info(here), info(seen)) == []
    assert side_differences(info(here), info(None)) == []  # unknown on one side: not compared


def test_different_machines_are_said():
    lines = side_differences(info(hw_from(EPYC_BF16)), info(hw_from(SAPPHIRE)))
    assert "hardware CPU: 'AMD EPYC' on the spec-off side, 'Intel(R) Xeon(R) Platinum 8480+' on the spec-on side" \
        in lines
    assert any(line.startswith("hardware logical CPUs: 2 on the spec-off side, 8") for line in lines)
    gpus = side_differences(info(hw_from(EPYC_BF16, gpu_facts(H200_CSV))), info(hw_from(EPYC_BF16, gpu_facts(T4_CSV))))
    assert gpus == ["hardware GPUs: 'NVIDIA H200 (143771 MiB, cc 9.0)' on the spec-off side, "
                    "'Tesla T4 (15360 MiB, cc 7.5)' on the spec-on side"]


# --- --dtype auto in plan_servers ---------------------------------------------------------------------
def options(dtype: str | None) -> ServerOptions:
    return ServerOptions(backend="vllm", api_key=None, insecure=False, ca_bundle=None, model=None, spec_config=None,
                         python="/usr/bin/python3", host="127.0.0.1", dtype=dtype, max_model_len=2048, server_args=(),
                         startup_timeout=1.0)


@pytest.fixture
def said() -> list[str]:
    return []


def plan_servers(opts: ServerOptions, sides: list[Side], said: list[str]):
    return servers.plan_servers(opts, sides, Messages(say=said.append))


@pytest.mark.parametrize("text, dtype", [(EPYC_BF16, "bfloat16"), (EPYC_AVX2, "float32")])
def test_plan_servers_resolves_auto_for_a_started_server(monkeypatch, said, text, dtype):
    monkeypatch.setattr(servers, "local_hardware", lambda source: hw_from(text))
    plan = plan_servers(options("auto"), [Side()], said)
    (launch,) = plan.launch
    assert launch.dtype == dtype and plan.dtype == dtype
    assert said == [f"dtype auto: {dtype} ({resolve_auto_dtype(hw_from(text))[1]})"]
    assert f"--dtype={dtype}" in plan.backend.launch_plan(launch).argv


def test_plan_servers_leaves_dtype_alone_unless_auto_and_started(monkeypatch, said):
    def no(source):
        raise AssertionError("the hardware is not asked")

    monkeypatch.setattr(servers, "local_hardware", no)
    unset = plan_servers(options(None), [Side()], said)
    assert unset.launch[0].dtype is None and unset.dtype is None
    given = plan_servers(options("float16"), [Side()], said)
    assert given.launch[0].dtype == "float16" and given.dtype == "float16"
    urls = plan_servers(options("auto"), [Side(url="http://127.0.0.1:1")], said)
    assert urls.launch == (None,) and urls.dtype == "auto"
    assert said == []


# --- one line ----------------------------------------------------------------------------------------
def test_hardware_text_for_a_cpu_and_for_gpus():
    assert hardware_text(None) == "not known"
    assert hardware_text(hw_from(EPYC_BF16)) == ("AMD EPYC, 2 CPUs, AVX2 AVX512F AVX512-BF16 AVX-VNNI AVX512-VNNI FMA "
                                                 "(no AMX); native: float32, bfloat16")
    assert hardware_text(hw_from(EPYC_AVX2)) == ("AMD EPYC 7B12, 4 CPUs, AVX2 FMA (no AVX512-BF16, AMX); native: "
                                                 "float32")
    assert hardware_text(hw_from(AARCH64)) == "CPU model not known, 2 CPUs; native: float32"
    eight = gpu_facts(H200_CSV * 8)
    assert hardware_text(hw_from(SAPPHIRE, eight)).startswith(
        "8x NVIDIA H200 140 GiB, driver 550.54.15, cc 9.0; Intel(R) Xeon(R) Platinum 8480+, 8 CPUs, ")
    assert hardware_source_text(hw_from(AARCH64)).endswith("; facts from constructed")


def test_the_probe_console_says_the_hardware():
    from rich.console import Console

    from specadapt.analysis.latency import latency_summary
    from specadapt.records import AcceptanceSummary, CounterSnapshot, ProbeReport, ProbeSettings, RequestSettings
    from specadapt.report.console import render_probe

    def rendered(hw: HardwareInfo | None) -> str:
        report = ProbeReport(settings=ProbeSettings(request=RequestSettings(), concurrency=1, repeat=1, warmup=0,
                                                    prompts_source="built-in"),
                             server=info(hw), latency=latency_summary([]), acceptance=AcceptanceSummary(known=False),
                             counters_before=CounterSnapshot(), counters_after=CounterSnapshot())
        console = Console(width=400, record=True)
        render_probe(report, console)
        return console.export_text()

    assert f"hardware: {hardware_text(hw_from(EPYC_BF16))}; facts from constructed\n" in rendered(hw_from(EPYC_BF16))
    assert "hardware: not known\n" in rendered(None)

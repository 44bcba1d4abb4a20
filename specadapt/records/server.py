"""What a server says about itself and its speculative-decoding counters at one moment."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, Field, field_validator

PER_SERVER = "<per-server>"
# A name is secret when KEY, TOKEN, SECRET or PASSWORD ends a word of it (HF_TOKEN, OPENAI_API_KEY,
# --api-key, APIKEY), not when more letters follow (--max-num-batched-tokens, TOKENIZERS_PARALLELISM):
# those values stay visible, so a difference in them is still seen.
SECRET_NAME = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD)(?![A-Za-z])", re.I)
STARS = "***"


def redact_settings(value: Any) -> Any:
    """Settings as records keep them: values under secret names are ***, at any depth."""
    if isinstance(value, Mapping):
        return {str(k): STARS if SECRET_NAME.search(str(k)) and v not in (None, "") else redact_settings(v)
                for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact_settings(v) for v in value]
    return value


class CounterSnapshot(BaseModel):
    """Speculative-decoding and token counters at one moment (summed over label sets).

    ``None`` means the server does not expose that counter.
    """

    drafts: float | None = None
    draft_tokens: float | None = None
    accepted_tokens: float | None = None
    accepted_per_position: dict[int, float] = Field(default_factory=dict)
    generation_tokens: float | None = None
    prompt_tokens: float | None = None
    source: str = Field("", description="Where the numbers came from, e.g. 'GET /metrics (Prometheus text)'.")

    @property
    def has_spec_counters(self) -> bool:
        return self.drafts is not None and self.draft_tokens is not None and self.accepted_tokens is not None


class LaunchRecord(BaseModel):
    """What specadapt started one server with (secrets already replaced by ``***``)."""

    backend: str
    argv: list[str] = Field(description="Program and arguments as run.")
    spec_args: list[str] = Field(default_factory=list, description="The run of argv entries that carries the "
                                                                   "speculative config (absent when off).")
    per_server_flags: list[str] = Field(default_factory=list, description="Flags whose values name this one "
                                                                          "server (host, port, its config file).")
    env: dict[str, str] = Field(default_factory=dict, description="Variables specadapt set for the server.")
    inherited_env: dict[str, str] = Field(default_factory=dict, description=(
        "Variables that affect speed (LD_PRELOAD, OMP_*, KMP_*, MKL_*, CUDA_*, VLLM_*, ...) the server inherited "
        "from specadapt's environment, where specadapt did not set them."))
    config: dict[str, Any] = Field(default_factory=dict, description="Settings the server read from a file "
                                                                     "specadapt wrote, speculation left out.")
    spec_settings: dict[str, Any] = Field(default_factory=dict, description="Settings in that file that carry "
                                                                            "the speculation.")
    python: str | None = Field(None, description="Interpreter that ran the server (None: a program on PATH).")
    package_version: str | None = Field(None, description="The backend's package version for that interpreter "
                                                          "(None when it is another interpreter or unknown).")
    cpus: list[int] | None = Field(None, description="CPUs the server's whole process tree was bound to (None: not "
                                                     "bound; it could run on every CPU specadapt could).")
    per_server_env: list[str] = Field(default_factory=list, description=(
        "Variables whose values place this one server (its CPUs, its GPUs): expected to differ between the sides."))

    def comparable_argv(self) -> list[str]:
        """argv without the speculative block, with per-server flag values as a placeholder: two
        servers that differ in speculation only have equal comparable argv."""
        argv, block = list(self.argv), self.spec_args
        starts = [i for i in range(len(argv)) if argv[i:i + len(block)] == block]  # an empty block cuts nothing
        if starts:
            del argv[starts[0]:starts[0] + len(block)]
        out: list[str] = []
        for previous, arg in zip([None, *argv], argv):
            flag, eq, _ = arg.partition("=")
            if previous in self.per_server_flags:
                out.append(PER_SERVER)
            elif eq and flag in self.per_server_flags:
                out.append(f"{flag}={PER_SERVER}")
            else:
                out.append(arg)
        return out

    def effective_env(self) -> dict[str, str]:
        """The recorded variables as the server saw them (what specadapt set wins)."""
        return {**self.inherited_env, **self.env}

    def comparable_env(self) -> dict[str, str]:
        """``effective_env`` with the values of the per-server variables as a placeholder: two servers
        placed on their own CPUs that differ in speculation only have equal comparable env."""
        return {k: PER_SERVER if k in self.per_server_env else v for k, v in self.effective_env().items()}


class GpuInfo(BaseModel):
    """One GPU as ``nvidia-smi`` names it."""

    name: str
    memory_mib: int | None = Field(None, description="Total memory in MiB.")
    driver: str | None = Field(None, description="Driver version.")
    compute_capability: str | None = Field(None, description='CUDA compute capability, e.g. "9.0".')


class HardwareInfo(BaseModel):
    """The machine a server ran on, as far as specadapt can tell."""

    source: str = Field(description="Where the facts come from, e.g. 'this machine (specadapt started the "
                                    "server here)'.")
    cpu_model: str | None = None
    cores: int | None = Field(None, description="Logical CPUs.")
    cpu_flags: list[str] = Field(default_factory=list, description=(
        "Of the CPU flags that matter for matrix speed (avx2, avx512f, avx512_bf16, avx512_fp16, amx_tile, "
        "amx_bf16, amx_fp16, avx_vnni, avx512_vnni, fma), those present, spelled as /proc/cpuinfo does."))
    cpu_flags_missing: list[str] = Field(default_factory=list, description="Of those flags, the ones absent.")
    gpus: list[GpuInfo] = Field(default_factory=list)
    native_dtypes: list[str] = Field(default_factory=list, description=(
        "Dtypes whose matrix products this hardware runs natively (CPU: float32; bfloat16 with avx512_bf16 or "
        "amx_bf16; float16 with avx512_fp16 or amx_fp16. GPU: float32, float16; bfloat16 from compute "
        "capability 8.0)."))
    notes: list[str] = Field(default_factory=list, description="What could not be told and why.")


class ServerInfo(BaseModel):
    """What a running server says about itself; ``spec_enabled`` is None when it cannot tell."""

    backend: str
    base_url: str
    version: str | None = None
    model_id: str | None = None
    model_root: str | None = None
    max_model_len: int | None = None
    spec_enabled: bool | None = None
    spec_method: str | None = None
    num_speculative_tokens: int | None = None
    spec_draft: str | None = Field(None, description="The draft model (path or id) where the server or its "
                                                     "launch tells it; None for model-free drafts or unknown.")
    spec_settings: dict[str, Any] = Field(default_factory=dict, description=(
        "The speculative config as the server exposes it (vLLM: /server_info's speculative_config) or as specadapt "
        "launched it; empty when unknown. The lossy-by-configuration check reads it."))
    spec_counters: list[str] = Field(default_factory=list, description="Spec-decode counter names found.")
    spec_signal: str | None = Field(None, description="Which server signal told whether speculation is on.")
    metrics_available: bool = False
    dtype: str | None = Field(None, description="Weights/activation dtype as the server reports it.")
    server_flags: dict[str, Any] = Field(default_factory=dict, description=(
        "Settings the server exposes about itself (vLLM: /server_info with VLLM_SERVER_DEV_MODE=1), "
        "speculation left out; secrets as ***."))
    launch: LaunchRecord | None = Field(None, description="What specadapt started it with; None when given by URL.")
    hardware: HardwareInfo | None = Field(None, description=(
        "The machine the server ran on: specadapt's own when it started the server or the address is loopback; "
        "None when given by URL on another host."))
    notes: list[str] = Field(default_factory=list, description="Plain statements of what could not be told and why.")

    @field_validator("server_flags")
    @classmethod
    def _no_secrets(cls, flags: dict[str, Any]) -> dict[str, Any]:
        return redact_settings(flags)

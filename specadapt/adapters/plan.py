"""A launch plan: the argv, environment and port of one server process, with secrets redacted
for display, and the record of it that goes into reports (``launch_record``). Backends make
plans; ManagedProcess runs them."""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, Field

from specadapt.records.server import SECRET_NAME, STARS, LaunchRecord, redact_settings

SECRET_FLAGS = ("--api-key", "--hf-token", "--token")
SECRET_ENV = re.compile(r"KEY|TOKEN|SECRET|PASSWORD", re.I)
REDACTED = "REDACTED"
RECORD_REDACTED = STARS  # how records (reports) hide a secret; SECRET_NAME says which names are secret
record_settings = redact_settings
# Inherited variables recorded with a launch: the ones that change how fast a server runs.
SPEED_ENV = re.compile(r"^(LD_PRELOAD|LD_LIBRARY_PATH|(OMP|KMP|GOMP|MKL|CUDA|NCCL|VLLM|TRTLLM|TLLM|SGLANG|PYTORCH|"
                       r"TORCHINDUCTOR)_\w+)$")
HOST_PORT_FLAGS = ("--host", "--port")


def redact_argv(argv: list[str]) -> list[str]:
    """argv with the values of secret flags (``--api-key X``, ``--api-key=X``) replaced."""
    out, hide_next = [], False
    for arg in argv:
        flag = arg.split("=", 1)[0]
        if hide_next:
            out.append(REDACTED)
        elif flag in SECRET_FLAGS and "=" in arg:
            out.append(f"{flag}={REDACTED}")
        else:
            out.append(arg)
        hide_next = arg in SECRET_FLAGS
    return out


class LaunchPlan(BaseModel):
    """Everything needed to start a server process. argv is exec'd directly, never via a shell."""

    backend: str
    argv: list[str] = Field(description="Program and arguments, exec'd without a shell.")
    env: dict[str, str] = Field(default_factory=dict, description="Variables added to the inherited environment.")
    host: str = "127.0.0.1"
    port: int
    health_path: str = Field("/v1/models", description="GET this until it answers 200.")
    spec_enabled: bool
    model: str = Field(description="Model path or id the server is started with.")
    notes: list[str] = Field(default_factory=list, description="What the plan changed or added, for the user.")
    spec_args: list[str] = Field(default_factory=list, description="The run of argv entries that carries the "
                                                                   "speculative config, exactly as in argv.")
    per_server_flags: list[str] = Field(default_factory=lambda: list(HOST_PORT_FLAGS), description=(
        "Flags whose values name this one server (host, port, a config file written for it): the only "
        "arguments besides spec_args allowed to differ between the two sides of a comparison."))
    config: dict[str, Any] = Field(default_factory=dict, description="Settings the server reads from a file "
                                                                     "specadapt writes, speculation left out.")
    spec_settings: dict[str, Any] = Field(default_factory=dict, description="Settings in that file that carry "
                                                                            "the speculation.")
    cpus: list[int] | None = Field(None, description="CPUs the server's whole process tree is bound to (None: "
                                                     "not bound, every CPU this process may use).")
    per_server_env: list[str] = Field(default_factory=list, description=(
        "Variables whose values place this one server (its CPUs, its GPUs): like per_server_flags, allowed to "
        "differ between the two sides of a comparison."))
    scratch_env: list[str] = Field(default_factory=list, description=(
        "Variables that name a directory of this one server's own (vLLM: VLLM_RPC_BASE_PATH, where its processes "
        "make their sockets): specadapt creates a fresh one when it starts the server and removes it once the "
        "server is stopped, so that nothing is left behind; a variable already set in the environment stands."))

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def secrets(self) -> list[str]:
        """Values of secret flags and variables in this plan (to scrub from logs we show)."""
        values = [v for k, v in self.env.items() if SECRET_ENV.search(k) and v]
        for i, arg in enumerate(self.argv):
            flag, eq, value = arg.partition("=")
            if flag in SECRET_FLAGS:
                values.append(value if eq else (self.argv[i + 1] if i + 1 < len(self.argv) else ""))
        return [v for v in values if len(v) >= 4]

    def printable(self) -> str:
        """The command line for humans (env first), quoted so it can be pasted into a shell;
        API keys and tokens (flags and variables) are redacted."""
        env = " ".join(f"{k}={REDACTED if SECRET_ENV.search(k) else shlex.quote(v)}"
                       for k, v in sorted(self.env.items()))
        cmd = " ".join(shlex.quote(a) for a in redact_argv(self.argv))
        return f"{env} {cmd}".strip()


def is_secret_flag(flag: str) -> bool:
    """``--api-key``, ``--hf-token``, ``--ssl-keyfile-password``...: a flag whose value is a secret."""
    return flag in SECRET_FLAGS or bool(SECRET_NAME.search(flag))


def record_argv(argv: list[str]) -> list[str]:
    """argv as reports record it: the values of secret flags (``--api-key X``, ``--api-key=X``) are ***."""
    out, hide_next = [], False
    for arg in argv:
        flag, eq, _ = arg.partition("=")
        if hide_next:
            out.append(RECORD_REDACTED)
        elif eq and flag.startswith("-") and is_secret_flag(flag):
            out.append(f"{flag}={RECORD_REDACTED}")
        else:
            out.append(arg)
        hide_next = not eq and arg.startswith("-") and is_secret_flag(arg)
    return out


def record_env(env: Mapping[str, str]) -> dict[str, str]:
    """Variables as reports record them: secret ones (by name) are ***."""
    return {k: RECORD_REDACTED if SECRET_NAME.search(k) else v for k, v in sorted(env.items())}


def launch_record(plan: LaunchPlan, python: str | None = None, package_version: str | None = None,
                  environ: Mapping[str, str] | None = None) -> LaunchRecord:
    """What ``plan`` starts, for the report: argv, the variables specadapt sets, the speed-relevant
    ones inherited from ``environ`` (default: this process's environment), secrets as ***."""
    environ = os.environ if environ is None else environ
    inherited = {k: v for k, v in environ.items() if SPEED_ENV.match(k) and k not in plan.env}
    return LaunchRecord(backend=plan.backend, argv=record_argv(plan.argv), spec_args=record_argv(plan.spec_args),
                        per_server_flags=list(plan.per_server_flags), env=record_env(plan.env),
                        inherited_env=record_env(inherited), config=record_settings(plan.config),
                        cpus=plan.cpus, per_server_env=list(plan.per_server_env),
                        spec_settings=record_settings(plan.spec_settings), python=python,
                        package_version=package_version)

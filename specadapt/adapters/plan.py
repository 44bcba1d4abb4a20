"""A launch plan: the argv, environment and port of one server process, with secrets redacted
for display. Backends make them; ManagedProcess runs them."""

from __future__ import annotations

import re
import shlex

from pydantic import BaseModel, Field

SECRET_FLAGS = ("--api-key", "--hf-token", "--token")
SECRET_ENV = re.compile(r"KEY|TOKEN|SECRET|PASSWORD", re.I)
REDACTED = "REDACTED"


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

"""The backend contract: what the rest of specadapt needs from a server and from a backend.

``Server`` is one running server as the probes see it (launched by specadapt or given by
URL): its base URL, auth headers, ``describe()``, ``read_counters()``, and the parts every
server has even when they do nothing (``identity_extras``, ``spec_extras``, ``start_run()``/``end_run()``,
``verify``, ``process``). ``ServerBase`` holds those defaults.

``Backend`` is one kind of server (vLLM, TensorRT-LLM, a plugin's): its ``name``, what it
can do as data (``Capabilities``), what it takes in ``--spec-config`` and honours when it
starts a server (``spec_support``, a ``SpecSupport``), how its completions are asked for
token ids and whole-vocabulary log-probabilities (``token_requests``, a ``TokenRequests``),
its ``launch_options`` model, ``connect()``,
``resolve_model()``, ``version()``, and ``launched()`` / ``launched_many()``, which every
backend has: a backend without the ``launch`` capability refuses them with a UsageError.
A launching backend writes ``launch_plan()`` (and, when it needs them, ``check_launch()``
and ``connect_launched()``); starting, health waits and stopping are managed.py's.

Nothing outside adapters/ looks for optional attributes: everything here is always there.
Probes import only this module and HTTP, never a concrete backend. Adding a backend is one
module (a Backend subclass) and one ``specadapt.backends`` entry point (docs/backends.md).
"""

from __future__ import annotations

import os
import ssl
import sys
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any, ClassVar, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from specadapt.adapters.managed import launched_many as start_and_connect
from specadapt.adapters.plan import REDACTED, SECRET_ENV, SECRET_FLAGS, LaunchPlan, launch_record, redact_argv
from specadapt.adapters.process import ManagedProcess
from specadapt.configs.spec import SpecConfig
from specadapt.configs.spec_input import SpecSupport
from specadapt.errors import UsageError
from specadapt.models import resolve_model_dir
from specadapt.records import CounterSnapshot, ServerInfo
from specadapt.records.server import LaunchRecord
from specadapt.records.watch import LiveSnapshot

__all__ = ["Backend", "Capabilities", "CAPABILITIES", "CounterSnapshot", "LaunchOptions", "LaunchPlan", "LaunchRecord",
           "OnPlan", "OnWait", "REDACTED", "SECRET_ENV", "SECRET_FLAGS", "Server", "ServerBase", "ServerInfo",
           "SpecSupport", "TokenRequests", "Verify", "redact_argv"]

Verify = bool | str | ssl.SSLContext  # httpx's verify: on, a CA bundle path, a context, or off
OnWait = Callable[[float, str], None]  # (seconds waited, last server log line)
OnPlan = Callable[[LaunchPlan, Path], None]  # (the plan, its log file), before the process starts


# ------------------------------------------------------------------------------ servers

@runtime_checkable
class Server(Protocol):
    """A server the probes can talk to (launched by specadapt or already running)."""

    backend: str
    identity_extras: dict[str, Any]
    """Request-body keys added on identity runs (vLLM: ``return_tokens_as_token_ids``); {} if none."""
    spec_extras: dict[str, Any]
    """Request-body keys that make each answer state its own speculation (drafted and accepted tokens,
    passes; SGLang: ``return_spec_tokens_details``), sent on every measured request; {} if none."""
    verify: Verify
    """TLS verification for every client that talks to this server."""
    process: ManagedProcess | None
    """The process specadapt started for this server; None when it was given by URL."""
    launch: LaunchRecord | None
    """What specadapt started it with (set with ``process``); ``describe()`` puts it in ServerInfo."""

    @property
    def base_url(self) -> str: ...

    @property
    def model_id(self) -> str: ...

    def headers(self) -> dict[str, str]: ...

    def describe(self) -> ServerInfo: ...

    def read_counters(self) -> CounterSnapshot: ...

    def start_run(self) -> None:
        """Called before a run's first counter snapshot (TensorRT-LLM starts polling its
        draining /metrics here, so ``read_counters()`` keeps returning running totals)."""

    def end_run(self) -> None:
        """Called after a run's last counter snapshot."""

    def read_live(self) -> LiveSnapshot:
        """The counters plus what the server says about load and latency (running batch, TTFT and
        inter-token histograms), for `specadapt watch`; ``at`` is left for the caller to set."""

    def close(self) -> None: ...


class ServerBase:
    """The defaults of a Server's optional parts; OpenAIServer and plugin servers inherit them."""

    backend: str = "unknown"
    identity_extras: dict[str, Any] = {}  # never mutated: callers merge it into a new dict
    spec_extras: dict[str, Any] = {}  # the same
    verify: Verify = True
    process: ManagedProcess | None = None
    launch: LaunchRecord | None = None

    def start_run(self) -> None:
        pass

    def end_run(self) -> None:
        pass

    def read_live(self) -> LiveSnapshot:
        """Counters only (a backend that knows its gauges and histograms says more)."""
        return LiveSnapshot(at=0.0, counters=self.read_counters())  # type: ignore[attr-defined]

    def close(self) -> None:
        pass


# ------------------------------------------------------------------------------ backends

class Capabilities(BaseModel):
    """What a backend can do, declared as data (``specadapt backends`` lists it)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    launch: bool = Field(False, description="Starts servers itself: launch_options, launched(), launched_many().")
    connect: bool = Field(True, description="Talks to a running server given by URL.")
    counters: bool = Field(False, description="read_counters() gives draft and accepted-token counters, so "
                                              "acceptance is measured; without it acceptance is unknown.")
    logprobs: bool = Field(False, description="Completions return per-token logprobs (token counts, triage).")
    token_ids: bool = Field(False, description="identity_extras makes responses carry token ids, so output "
                                               "identity is decided on ids rather than text.")
    draining_counters: bool = Field(False, description="Reading the counters consumes them (TensorRT-LLM "
                                                       "/metrics): the server polls them between start_run() "
                                                       "and end_run().")

    def names(self) -> list[str]:
        """The capabilities this backend has, in CAPABILITIES order."""
        return [name for name, on in self.model_dump().items() if on]

    def __contains__(self, name: object) -> bool:
        """``"launch" in backend.capabilities``: whether it has that capability."""
        return name in self.names()


CAPABILITIES: tuple[str, ...] = tuple(Capabilities.model_fields)


class TokenRequests(BaseModel):
    """How to ask a backend's completions for token ids and whole-vocabulary log-probabilities,
    answered in the shapes of vLLM's OpenAI-compatible API (which ``equiv --sampling`` reads):
    each field holds the request-body keys to add, or None when the server cannot answer so.
    The defaults are vLLM's own keys, which servers that copy its API take too."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    sampled_ids: dict[str, Any] | None = Field(
        default_factory=lambda: {"return_tokens_as_token_ids": True},
        description="Added to a completion request that has logprobs 0, so that its logprobs.tokens name each "
                    "sampled token as 'token_id:N'. None: the server cannot return sampled token ids.")
    output_ids: dict[str, Any] | None = Field(
        default_factory=lambda: {"return_token_ids": True},
        description="Added to a completion or chat request so that the answer holds the generated token ids "
                    "(choice 'token_ids'; per chunk when streamed). None: the server cannot return them.")
    prompt_logprobs: dict[str, Any] | None = Field(
        default_factory=lambda: {"return_token_ids": True},
        description="Added to a completion request that has prompt_logprobs K, so that the answer holds at every "
                    "prompt position the top K of the whole vocabulary and the token there ({id: {logprob, rank}}) "
                    "(and prompt_token_ids, checked when present). None: the server cannot score a prompt so.")


class LaunchOptions(BaseModel):
    """How to start one server: the fields every launching backend takes. Each backend
    subclasses it with its own extras (and may narrow a field's type or default)."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(description="Model to serve, as resolve_model() returned it.")
    spec_config: SpecConfig | None = Field(None, description="Speculative decoding (neutral form; the backend "
                                                             "renders its own); None: off.")
    python: str = Field(default_factory=lambda: sys.executable, description="Interpreter that has the server.")
    host: str = "127.0.0.1"
    port: int | None = Field(None, ge=1, le=65535, description="None: a free port.")
    dtype: str | None = Field(None, description="Weights/activation dtype (auto, bfloat16, float16, float32).")
    max_model_len: int | None = Field(None, ge=1, description="Longest sequence (prompt + output).")
    extra_args: list[str] = Field(default_factory=list, description="Passed to the server verbatim, after ours.")
    cpus: list[int] | None = Field(None, description="CPUs the server's whole process tree is bound to (None: not "
                                                     "bound); see adapters/placement.py.")
    gpus: list[int] | None = Field(None, description="GPUs the server may use, as CUDA_VISIBLE_DEVICES (None: not "
                                                     "set).")


class Backend(ABC):
    """One kind of server. Subclass it, set the class attributes, write ``connect`` (and
    ``launch_plan`` when ``capabilities.launch``), and register the class under the
    ``specadapt.backends`` entry-point group; the registry instantiates it without arguments."""

    name: ClassVar[str]
    capabilities: ClassVar[Capabilities]
    spec_support: ClassVar[SpecSupport] = SpecSupport()  # default: the neutral form, every field, no schedule
    token_requests: ClassVar[TokenRequests] = TokenRequests()  # default: vLLM's request keys
    launch_options: ClassVar[type[LaunchOptions]] = LaunchOptions
    startup_timeout_s: ClassVar[float] = 900.0  # how long launched() waits when the caller says nothing

    @abstractmethod
    def connect(self, url: str, api_key: str | None = None, verify: Verify = True) -> Server:
        """A Server for the running server at ``url`` (no request is sent yet)."""

    def resolve_model(self, model: str | None) -> str:
        """``--model`` as this backend serves it (default: a local HF directory, or the
        embedded model when None); UsageError with the fix when it cannot be served."""
        return str(resolve_model_dir(model))

    def version(self) -> str | None:
        """Version of the server software installed here; None when unknown or absent."""
        return None

    # -- launching (capabilities.launch) ------------------------------------------------
    def check_launch(self, opts: LaunchOptions) -> None:
        """Refuse ``opts`` with a UsageError before any server starts (default: nothing to check)."""
        return None

    def launch_plan(self, opts: LaunchOptions) -> LaunchPlan:
        """The argv, environment and port that start one server for ``opts``."""
        raise UsageError(self._cannot_launch())

    def placed(self, plan: LaunchPlan, opts: LaunchOptions) -> LaunchPlan:
        """``plan`` on the CPUs and GPUs of ``opts``: the process tree bound to ``opts.cpus``, as many
        OpenMP threads (OMP_NUM_THREADS, unless the user set it), CUDA_VISIBLE_DEVICES from ``opts.gpus``.
        A backend whose server picks its threads another way adds its own setting (vLLM does)."""
        env, per_server = dict(plan.env), list(plan.per_server_env)
        if opts.cpus:
            if "OMP_NUM_THREADS" not in os.environ:
                env.setdefault("OMP_NUM_THREADS", str(len(opts.cpus)))
        if opts.gpus is not None:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in opts.gpus)
            per_server.append("CUDA_VISIBLE_DEVICES")
        return plan.model_copy(update={"cpus": list(opts.cpus) if opts.cpus else None, "env": env,
                                       "per_server_env": per_server})

    def connect_launched(self, opts: LaunchOptions, url: str) -> Server:
        """The Server for a process started from ``opts`` (it may know what the server cannot say)."""
        return self.connect(url)

    def launched_version(self, opts: LaunchOptions) -> str | None:
        """The package version of the server software ``opts.python`` runs: ``version()`` when that
        is this interpreter (or none is named), else None (unknown without asking it)."""
        return self.version() if opts.python in (None, sys.executable) else None

    @contextmanager
    def launched(self, opts: LaunchOptions, startup_timeout_s: float | None = None, on_wait: OnWait | None = None,
                 on_plan: OnPlan | None = None) -> Iterator[Server]:
        """Start one server, wait until it answers, yield it; stop its process group on exit."""
        with self.launched_many([opts], startup_timeout_s, on_wait, on_plan) as (server,):
            yield server

    @contextmanager
    def launched_many(self, opts_list: Sequence[LaunchOptions], startup_timeout_s: float | None = None,
                      on_wait: OnWait | None = None, on_plan: OnPlan | None = None) -> Iterator[list[Server]]:
        """Check every ``opts`` first, then start all servers side by side, wait until all
        answer and yield them in order; stop every process group on exit (also when one of
        them fails to start)."""
        if not self.capabilities.launch:
            raise UsageError(self._cannot_launch())
        for opts in opts_list:
            if not isinstance(opts, self.launch_options):
                raise TypeError(f"backend {self.name} launches from {self.launch_options.__name__}, "
                                f"not {type(opts).__name__}")
            self.check_launch(opts)
        plans = [self.placed(self.launch_plan(opts), opts) for opts in opts_list]
        connects = [partial(self.connect_launched, opts) for opts in opts_list]
        with start_and_connect(plans, connects, startup_timeout_s or self.startup_timeout_s,
                               on_wait, on_plan) as servers:
            for server, plan, opts in zip(servers, plans, opts_list, strict=True):
                server.launch = launch_record(plan, python=opts.python, package_version=self.launched_version(opts))
            yield servers

    def _cannot_launch(self) -> str:
        return f"backend {self.name} cannot start servers: pass --url of a running one"

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"

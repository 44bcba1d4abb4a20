"""The server options probe, compare and equiv share, and the one way they open servers.

``server_options(sides)`` adds one option set to a command: the backend, TLS and API key,
what a started server runs (model, spec config, interpreter, host, dtype, ...), and how the
servers are reached: ``--url``/``--port`` for one server, ``--off``/``--on``/``--launch``
for two. The command receives the shared values as one ``ServerOptions``.

``plan_servers`` checks everything the user gave and decides, per side, where to connect or
how to start (nothing is started yet, so a bad option fails before any server runs);
``open_servers`` connects to or starts the planned servers and stops what it started.
"""

from __future__ import annotations

import contextlib
import functools
import os
import ssl
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import click
from pydantic import ValidationError

from specadapt.adapters.base import Backend, LaunchOptions, LaunchPlan, Server
from specadapt.adapters.hardware import STARTED_HERE, local_hardware, resolve_auto_dtype
from specadapt.adapters.plan import launch_record
from specadapt.adapters.registry import get_backend
from specadapt.adapters.spec_config import load_spec_config
from specadapt.analysis.sides import launch_differences
from specadapt.commands._console import say, stderr
from specadapt.configs.spec import SpecConfig
from specadapt.errors import UsageError

API_KEY_ENVS = ("SPECADAPT_API_KEY", "OPENAI_API_KEY")


@dataclass(frozen=True)
class ServerOptions:
    """The shared server options as the user gave them (one field per option)."""

    backend: str
    api_key: str | None
    insecure: bool
    ca_bundle: Path | None
    model: str | None
    spec_config: str | None
    python: str
    host: str
    dtype: str | None
    max_model_len: int
    server_args: tuple[str, ...]
    startup_timeout: float


# --- the options ------------------------------------------------------------------------------
BACKEND = click.option("--backend", default="vllm", show_default=True,
                       help="Server kind (see 'specadapt backends').")
URL = click.option("--url", "url", multiple=True,
                   help="Base URL of a running server, e.g. http://127.0.0.1:8000; repeat it for replicas of one "
                        "model (requests go round robin, the report has each replica's figures).")
OFF_URL = click.option("--off", "off_url", help="URL of the running spec-off server.")
ON_URL = click.option("--on", "on_url", help="URL of the running spec-on server.")
API_KEY = click.option("--api-key", help="Bearer token for a running server "
                                          "(default: $SPECADAPT_API_KEY, then $OPENAI_API_KEY).")
INSECURE = click.option("--insecure", is_flag=True, help="Do not verify TLS certificates (warns).")
CA_BUNDLE = click.option("--ca-bundle", type=click.Path(exists=True, dir_okay=False, path_type=Path),
                         help="CA bundle for TLS verification.")
MODEL = click.option("--model", help="Model for started servers: a local HF model directory (llamacpp: a .gguf "
                                     "file); default: the embedded model, where the backend can serve it.")
SPEC_CONFIG = click.option("--spec-config", help="Speculative config (default: off), inline or a .json/.yaml file: "
                                                 "the neutral form ({\"method\": \"ngram\", \"k\": 4}) or the "
                                                 "backend's own (vLLM JSON, TensorRT-LLM speculative_config, SGLang "
                                                 "or llama.cpp flags); compare and equiv give it to the spec-on "
                                                 "server.")
LAUNCH = click.option("--launch", type=click.Choice(["parallel", "sequential"]), default="parallel",
                      show_default=True,
                      help="Started servers side by side (requests interleaved), or one after the other.")
PYTHON = click.option("--python", default=sys.executable, show_default="this interpreter",
                      help="Interpreter that has the server installed.")
HOST = click.option("--host", default="127.0.0.1", show_default=True, help="Host a started server binds.")
PORT = click.option("--port", type=click.IntRange(1, 65535), help="Port for a started server (default: a free one).")
DTYPE = click.option("--dtype", help="Server dtype (auto: specadapt picks what this machine runs natively and says "
                                     "so; bfloat16, float16, float32).")
MAX_MODEL_LEN = click.option("--max-model-len", type=click.IntRange(16), default=2048, show_default=True,
                             help="Longest sequence (prompt + output) a started server accepts.")
SERVER_ARG = click.option("--server-arg", "server_args", multiple=True,
                          help="Extra argument for every started server, verbatim; repeat for several.")
STARTUP_TIMEOUT = click.option("--startup-timeout", type=click.FloatRange(1), default=900, show_default=True,
                               help="Seconds to wait for a started server to answer.")


def _option_list(sides: int) -> list[Callable]:
    one = sides == 1
    return [BACKEND, *([URL] if one else [OFF_URL, ON_URL]), API_KEY, INSECURE, CA_BUNDLE,
            MODEL, SPEC_CONFIG, *([] if one else [LAUNCH]), PYTHON, HOST, *([PORT] if one else []),
            DTYPE, MAX_MODEL_LEN, SERVER_ARG, STARTUP_TIMEOUT]


ON_URLS = click.option("--on", "on_urls", multiple=True,
                       help="URL of a running spec-on server to measure as a candidate (its k read from the server, "
                            "or written K=URL); repeat for several.")
VERIFY_URL = click.option("--verify-url", help="URL of a running server with the emitted configuration, to verify "
                                               "it (default: tune starts one, where the backend can).")


def sweep_server_options(command: Callable) -> Callable:
    """The shared server options for a sweep (tune): ``--off URL``, ``--on URL`` (repeatable) and
    ``--verify-url``; --model/--spec-config also with URLs (what started candidates run)."""
    @functools.wraps(command)
    def with_server_options(**kw: Any) -> Any:
        opts = ServerOptions(**{f.name: kw.pop(f.name) for f in fields(ServerOptions)})
        return command(server_opts=opts, **kw)

    options = [BACKEND, OFF_URL, ON_URLS, VERIFY_URL, API_KEY, INSECURE, CA_BUNDLE, MODEL, SPEC_CONFIG, PYTHON, HOST,
               DTYPE, MAX_MODEL_LEN, SERVER_ARG, STARTUP_TIMEOUT]
    for option in reversed(options):
        with_server_options = option(with_server_options)
    return with_server_options


def server_options(sides: int) -> Callable[[Callable], Callable]:
    """The shared server options plus ``--url``/``--port`` (``sides=1``) or ``--off``/``--on``/
    ``--launch`` (``sides=2``); the command gets the shared values as ``server_opts``."""
    if sides not in (1, 2):
        raise ValueError(f"sides must be 1 or 2, not {sides}")

    def decorate(command: Callable) -> Callable:
        @functools.wraps(command)
        def with_server_options(**kw: Any) -> Any:
            opts = ServerOptions(**{f.name: kw.pop(f.name) for f in fields(ServerOptions)})
            return command(server_opts=opts, **kw)

        for option in reversed(_option_list(sides)):
            with_server_options = option(with_server_options)
        return with_server_options

    return decorate


# --- reading them -------------------------------------------------------------------------------
def api_key_from(option: str | None) -> str | None:
    if option:
        return option
    for env in API_KEY_ENVS:
        if os.environ.get(env):
            return os.environ[env]
    return None


def tls_verify(insecure: bool, ca_bundle: Path | None) -> bool | ssl.SSLContext:
    """What httpx's ``verify`` gets: on by default, a context trusting ``ca_bundle``, or off (warned)."""
    if insecure:
        stderr.print("[yellow]warning:[/] TLS certificate verification is off (--insecure)")
        return False
    if ca_bundle:
        try:
            return ssl.create_default_context(cafile=str(ca_bundle))
        except (ssl.SSLError, OSError) as exc:
            raise UsageError(f"--ca-bundle {ca_bundle} is not a PEM CA bundle ({exc})") from exc
    return True


def replica_sides(urls: Sequence[str], port: int | None) -> list[Side]:
    """probe's sides: one started server (no --url), or each --url a running replica."""
    if not urls:
        return [Side(port=port)]
    if len(set(urls)) != len(urls):
        twice = next(u for u in urls if urls.count(u) > 1)
        raise UsageError(f"--url {twice} is given twice: give each replica once")
    if len(urls) == 1:
        return [Side(url=urls[0])]
    return [Side(url=u, label=f"replica {i}") for i, u in enumerate(urls)]


# --- planning and opening -----------------------------------------------------------------------
@dataclass(frozen=True)
class Side:
    """One server a command needs: at ``url``, or started (with --spec-config when ``spec``)."""

    url: str | None = None
    spec: bool = True
    port: int | None = None
    label: str | None = None  # "spec-on", "spec-off"; None: the command's only server
    url_flag: str = "--url"


@dataclass(frozen=True)
class ServerPlan:
    """What plan_servers decided: per side, a URL to connect to or the backend's launch options."""

    backend_name: str
    backend: Backend
    sides: tuple[Side, ...]
    launch: tuple[LaunchOptions | None, ...]  # per side; None where the side has a URL
    api_key: str | None
    verify: bool | ssl.SSLContext
    startup_timeout_s: float
    started: dict[str, LaunchPlan] = field(default_factory=dict, compare=False)
    """The launch plans of the sides started so far, by label (shared with the plans ``only()`` makes)."""
    dtype: str | None = None
    """The dtype the servers run as the reports record it: --dtype, with auto resolved when specadapt
    starts a server (see ``resolve_dtype``)."""

    def only(self, label: str) -> ServerPlan:
        """The plan of one side alone (to start the servers one after the other)."""
        i = [s.label for s in self.sides].index(label)
        return replace(self, sides=(self.sides[i],), launch=(self.launch[i],))


def resolve_dtype(opts: ServerOptions) -> ServerOptions:
    """``opts`` with ``--dtype auto`` made concrete for a server specadapt starts on this machine
    (what its hardware runs natively, said in one line); any other value, or none, as given."""
    if opts.dtype is None or opts.dtype.strip().lower() != "auto":
        return opts
    dtype, reason = resolve_auto_dtype(local_hardware(STARTED_HERE))
    say(f"dtype auto: {dtype} ({reason})")
    return replace(opts, dtype=dtype)


def plan_servers(opts: ServerOptions, sides: Sequence[Side]) -> ServerPlan:
    """Check the options against the backend and build each side's launch options; start nothing.
    ``--dtype auto`` is resolved here when a server is to be started (``plan.dtype`` has the result)."""
    verify = tls_verify(opts.insecure, opts.ca_bundle)
    backend = get_backend(opts.backend)
    one = len(sides) == 1
    flags = " and ".join(s.url_flag for s in sides)
    if any(s.url for s in sides) and (opts.model or opts.spec_config):
        running = "connects to a running server" if one else "connect to running servers"
        raise UsageError(f"{flags} {running}; --model and --spec-config are for starting "
                         f"{'one' if one else 'them'}: give one or the other")
    launch: list[LaunchOptions | None] = [None] * len(sides)
    if not all(s.url for s in sides):
        if not backend.capabilities.launch:
            hint = "--url of a running one" if one else f"{flags} URLs of running ones"
            raise UsageError(f"backend {opts.backend} cannot start servers: pass {hint}")
        opts = resolve_dtype(opts)
        model = str(backend.resolve_model(opts.model))
        spec = load_spec_config(opts.spec_config, opts.backend) if opts.spec_config else None
        for i, side in enumerate(sides):
            if not side.url:
                launch[i] = launch_options_for(backend, opts, model, spec if side.spec else None, side.port)
    return ServerPlan(backend_name=opts.backend, backend=backend, sides=tuple(sides), launch=tuple(launch),
                      api_key=api_key_from(opts.api_key), verify=verify, startup_timeout_s=opts.startup_timeout,
                      dtype=opts.dtype)


def launch_options_for(backend: Backend, opts: ServerOptions, model: str, spec: SpecConfig | None,
                    port: int | None) -> LaunchOptions:
    try:
        return backend.launch_options(model=model, spec_config=spec, python=opts.python, host=opts.host, port=port,
                                      dtype=opts.dtype, max_model_len=opts.max_model_len,
                                      extra_args=list(opts.server_args))
    except ValueError as exc:  # pydantic.ValidationError: a launch option this backend refuses
        first = exc.errors()[0] if isinstance(exc, ValidationError) else {"loc": (), "msg": str(exc)}
        where = ".".join(str(p) for p in first["loc"]) or "launch options"
        raise UsageError(f"--backend {opts.backend}: {where}: {first['msg']}") from exc


@contextlib.contextmanager
def open_servers(plan: ServerPlan) -> Iterator[list[Server]]:
    """Connect to or start every side of ``plan`` (started ones side by side) and yield the
    servers in the order of the sides; close them, and stop the started ones, on exit."""
    with contextlib.ExitStack() as stack:
        servers: list[Any] = [None] * len(plan.sides)  # filled in below, in the order of the sides
        for i, side in enumerate(plan.sides):
            if side.url:
                server = plan.backend.connect(side.url, api_key=plan.api_key, verify=plan.verify)
                stack.callback(server.close)
                servers[i] = server
        to_start = [i for i, side in enumerate(plan.sides) if not side.url]
        if to_start:
            started = stack.enter_context(_started(plan, to_start))
            for i, server in zip(to_start, started, strict=True):
                servers[i] = server
        yield servers


def plan_differences(started: dict[str, LaunchPlan]) -> list[str]:
    """Once both the spec-off and the spec-on plan are known: what they differ in besides
    speculation (one line each; [] when speculation is all, or a side is not started yet)."""
    if "spec-off" not in started or "spec-on" not in started:
        return []
    return launch_differences(launch_record(started["spec-off"]), launch_record(started["spec-on"]))


@contextlib.contextmanager
def _started(plan: ServerPlan, indices: list[int]) -> Iterator[list[Server]]:
    """Start the sides at ``indices`` together, saying what runs where; a spinner until they answer."""
    sides = iter([plan.sides[i] for i in indices])  # launched_many reports the plans in order

    def on_plan(launch_plan: LaunchPlan, log_path: Path) -> None:
        label = next(sides).label
        say(f"starting {plan.backend_name if label is None else label + ' server'}: {launch_plan.printable()}")
        say(f"server log: {log_path}")
        for note in launch_plan.notes:
            say(f"note: {note}")
        if label is not None:
            plan.started[label] = launch_plan
            for line in plan_differences(plan.started):
                say(f"warning: the two servers differ in more than speculation: {line}")

    what = "server" if len(indices) == 1 else "servers"
    with contextlib.ExitStack() as stack:
        with stderr.status(f"starting {what}...") as status:
            def on_wait(elapsed: float, last_line: str) -> None:
                status.update(f"waiting for the {what} to answer ({elapsed:.0f} s): {last_line[-90:]}")

            servers = stack.enter_context(plan.backend.launched_many(
                [plan.launch[i] for i in indices], startup_timeout_s=plan.startup_timeout_s, on_wait=on_wait,
                on_plan=on_plan))
        yield servers

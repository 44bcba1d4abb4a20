"""The servers a run needs: which to connect to, which to start and how, and opening them.

``plan_servers`` checks the options against the backend and decides, per side, where to
connect or how to start (nothing is started yet, so a bad option fails before any server
runs); ``open_servers`` connects to or starts the planned servers and stops what it started.

What planning and opening have to say (the command line of a started server, its log, the
backend's notes, warnings, the wait for the servers to answer) goes to ``Messages``: by
default the ``specadapt`` logger, so a script that calls these functions prints nothing
unless it configures logging; the command layer passes its console.
"""

from __future__ import annotations

import contextlib
import logging
import os
import ssl
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from specadapt.adapters.base import Backend, LaunchOptions, LaunchPlan, Server
from specadapt.adapters.hardware import STARTED_HERE, local_hardware, resolve_auto_dtype
from specadapt.adapters.placement import cpu_list, plan_placement, usable_cpus
from specadapt.adapters.plan import launch_record
from specadapt.adapters.registry import get_backend
from specadapt.adapters.spec_config import load_spec_config
from specadapt.analysis.sides import launch_differences
from specadapt.configs.spec import SpecConfig
from specadapt.errors import UsageError
from specadapt.load.spread import CA_BUNDLE_ATTR

API_KEY_ENVS = ("SPECADAPT_API_KEY", "OPENAI_API_KEY")

log = logging.getLogger("specadapt")

Say = Callable[[str], None]
"""One line for the user, exactly as given."""

Status = Callable[[str], contextlib.AbstractContextManager[Callable[[str], None]]]
"""A wait shown while it lasts: (first text) -> a context that yields a function updating the text."""


@contextlib.contextmanager
def _no_status(text: str) -> Iterator[Callable[[str], None]]:
    log.info(text)
    yield lambda update: None


@dataclass(frozen=True)
class Messages:
    """Where a run's messages go: lines (``say``), warnings (``warn``, the text without a
    'warning:' prefix) and waits (``status``). By default the ``specadapt`` logger."""

    say: Say = log.info
    warn: Say = log.warning
    status: Status = _no_status


LOGGED = Messages()


@dataclass(frozen=True)
class ServerOptions:
    """The shared server options as the user gave them (one field per option; the defaults are
    the command line's): the backend, how to reach running servers (API key, TLS), and what a
    started server runs."""

    backend: str = "vllm"
    api_key: str | None = None
    insecure: bool = False
    ca_bundle: Path | None = None
    model: str | None = None
    spec_config: str | None = None
    python: str = field(default_factory=lambda: sys.executable)
    host: str = "127.0.0.1"
    dtype: str | None = None
    max_model_len: int = 2048
    server_args: tuple[str, ...] = ()
    startup_timeout: float = 900


@dataclass(frozen=True)
class Side:
    """One server a run needs: at ``url``, or started (with the spec config when ``spec``)."""

    url: str | None = None
    spec: bool = True
    port: int | None = None
    label: str | None = None  # "spec-on", "spec-off"; None: the run's only server
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
    placement: list[str] = field(default_factory=list)
    """How the started servers share the machine, in words (adapters/placement.py); [] for one server."""

    def only(self, label: str) -> ServerPlan:
        """The plan of one side alone (to start the servers one after the other)."""
        i = [s.label for s in self.sides].index(label)
        return replace(self, sides=(self.sides[i],), launch=(self.launch[i],))


# --- the sides of a run --------------------------------------------------------------------------
def replica_sides(urls: Sequence[str] = (), port: int | None = None) -> list[Side]:
    """probe's sides: one started server (no --url), or each --url a running replica."""
    if not urls:
        return [Side(port=port)]
    if len(set(urls)) != len(urls):
        twice = next(u for u in urls if urls.count(u) > 1)
        raise UsageError(f"--url {twice} is given twice: give each replica once")
    if len(urls) == 1:
        return [Side(url=urls[0])]
    return [Side(url=u, label=f"replica {i}") for i, u in enumerate(urls)]


def ab_sides(off_url: str | None = None, on_url: str | None = None) -> list[Side]:
    """compare's and equiv's sides: the spec-off and the spec-on server, each at its URL or started."""
    return [Side(url=off_url, spec=False, label="spec-off", url_flag="--off"),
            Side(url=on_url, spec=True, label="spec-on", url_flag="--on")]


# --- reading the options -------------------------------------------------------------------------
def api_key_from(option: str | None) -> str | None:
    """The API key given, else $SPECADAPT_API_KEY, else $OPENAI_API_KEY (None when none is set)."""
    if option:
        return option
    for env in API_KEY_ENVS:
        if os.environ.get(env):
            return os.environ[env]
    return None


def tls_verify(insecure: bool, ca_bundle: Path | None, messages: Messages = LOGGED) -> bool | ssl.SSLContext:
    """What httpx's ``verify`` gets: on by default, a context trusting ``ca_bundle``, or off (warned)."""
    if insecure:
        messages.warn("TLS certificate verification is off (--insecure)")
        return False
    if ca_bundle:
        try:
            context = ssl.create_default_context(cafile=str(ca_bundle))
        except (ssl.SSLError, OSError) as exc:
            raise UsageError(f"--ca-bundle {ca_bundle} is not a PEM CA bundle ({exc})") from exc
        setattr(context, CA_BUNDLE_ATTR, str(ca_bundle))  # worker processes and Ray actors rebuild it from the file
        return context
    return True


def resolve_dtype(opts: ServerOptions, messages: Messages = LOGGED) -> ServerOptions:
    """``opts`` with ``--dtype auto`` made concrete for a server specadapt starts on this machine
    (what its hardware runs natively, said in one line); any other value, or none, as given."""
    if opts.dtype is None or opts.dtype.strip().lower() != "auto":
        return opts
    dtype, reason = resolve_auto_dtype(local_hardware(STARTED_HERE))
    messages.say(f"dtype auto: {dtype} ({reason})")
    return replace(opts, dtype=dtype)


# --- planning ------------------------------------------------------------------------------------
def plan_servers(opts: ServerOptions, sides: Sequence[Side], messages: Messages = LOGGED,
                 launch: str = "parallel") -> ServerPlan:
    """Check the options against the backend and build each side's launch options; start nothing.
    ``--dtype auto`` is resolved here when a server is to be started (``plan.dtype`` has the result).
    ``launch``: how started servers run (``--launch``): "parallel", side by side, each on its own
    CPUs (and GPUs); "shared", side by side on the same ones (said as a warning); "sequential",
    one after the other (each on the whole machine). Too few CPUs or GPUs for "parallel" is a
    UsageError saying what to use instead."""
    verify = tls_verify(opts.insecure, opts.ca_bundle, messages)
    backend = get_backend(opts.backend)
    one = len(sides) == 1
    flags = " and ".join(s.url_flag for s in sides)
    if any(s.url for s in sides) and (opts.model or opts.spec_config):
        running = "connects to a running server" if one else "connect to running servers"
        raise UsageError(f"{flags} {running}; --model and --spec-config are for starting "
                         f"{'one' if one else 'them'}: give one or the other")
    launch_opts: list[LaunchOptions | None] = [None] * len(sides)
    if not all(s.url for s in sides):
        if not backend.capabilities.launch:
            hint = "--url of a running one" if one else f"{flags} URLs of running ones"
            raise UsageError(f"backend {opts.backend} cannot start servers: pass {hint}")
        opts = resolve_dtype(opts, messages)
        model = str(backend.resolve_model(opts.model))
        spec = load_spec_config(opts.spec_config, opts.backend) if opts.spec_config else None
        for i, side in enumerate(sides):
            if not side.url:
                launch_opts[i] = launch_options_for(backend, opts, model, spec if side.spec else None, side.port)
    placement = place_sides(backend, sides, launch_opts, launch, messages)
    return ServerPlan(backend_name=opts.backend, backend=backend, sides=tuple(sides), launch=tuple(launch_opts),
                      api_key=api_key_from(opts.api_key), verify=verify, startup_timeout_s=opts.startup_timeout,
                      dtype=opts.dtype, placement=placement)


CPU_ONLY_BACKENDS = ("reference", "llamacpp")
"""Backends whose started servers run on the CPU here (the others use the GPUs where there are some)."""


def place_sides(backend: Backend, sides: Sequence[Side], launch_opts: list[LaunchOptions | None], launch: str,
                messages: Messages = LOGGED) -> list[str]:
    """Give each started side its own CPUs (and GPUs) in ``launch_opts`` (in place) when they run side
    by side; the placement in words (said here, too). UsageError when the machine cannot be split."""
    started = [i for i, o in enumerate(launch_opts) if o is not None]
    if launch == "sequential" or len(started) < 2:
        return []
    hw = local_hardware(STARTED_HERE)
    gpus = len(hw.gpus) if backend.name not in CPU_ONLY_BACKENDS else 0
    names = [sides[i].label or f"server {i}" for i in started]
    placement = plan_placement(names, usable_cpus(), gpus=gpus, shared=launch == "shared",
                               gpus_set_by_user="CUDA_VISIBLE_DEVICES" in os.environ)
    if placement.refused:
        raise UsageError(placement.refused)
    for i, cpus, gpu_ids in zip(started, placement.cpus, placement.gpus, strict=True):
        launch_opts[i] = launch_opts[i].model_copy(update={"cpus": cpus, "gpus": gpu_ids})
    for line in placement.lines:
        (messages.warn if placement.shared else messages.say)(line)
    return list(placement.lines)


def launch_options_for(backend: Backend, opts: ServerOptions, model: str, spec: SpecConfig | None,
                       port: int | None) -> LaunchOptions:
    """The backend's launch options for one server; a value it refuses is one UsageError line."""
    try:
        return backend.launch_options(model=model, spec_config=spec, python=opts.python, host=opts.host, port=port,
                                      dtype=opts.dtype, max_model_len=opts.max_model_len,
                                      extra_args=list(opts.server_args))
    except ValueError as exc:  # pydantic.ValidationError: a launch option this backend refuses
        first = exc.errors()[0] if isinstance(exc, ValidationError) else {"loc": (), "msg": str(exc)}
        where = ".".join(str(p) for p in first["loc"]) or "launch options"
        raise UsageError(f"--backend {opts.backend}: {where}: {first['msg']}") from exc


def off_and_on_halves(cpus: Sequence[int], on_what: str, when: str
                      ) -> tuple[list[int] | None, list[int] | None, str]:
    """(spec-off CPUs, spec-on CPUs, the placement in words) for one spec-off server beside spec-on servers
    that run one at a time (``on_what`` names them, ``when`` says how they take turns): the spec-off
    server on one half of ``cpus``, every spec-on server on the other; with a single CPU nothing is
    bound (None, None) and the words say all share it."""
    placement = plan_placement(["spec-off", "spec-on"], cpus)
    if placement.refused:
        return None, None, (f"this machine gives specadapt {len(cpus)} CPU: the servers share it, and each may "
                            "stall the other's first token (the report's interference check says whether they did)")
    off, on = placement.cpus
    return off, on, (f"the spec-off server runs on CPU{'s' if len(off) > 1 else ''} {cpu_list(off)}, {on_what} on "
                     f"CPU{'s' if len(on) > 1 else ''} {cpu_list(on)} ({when}): neither side of a comparison "
                     "disturbs the other's cores")


def plan_differences(started: dict[str, LaunchPlan]) -> list[str]:
    """Once both the spec-off and the spec-on plan are known: what they differ in besides
    speculation (one line each; [] when speculation is all, or a side is not started yet)."""
    if "spec-off" not in started or "spec-on" not in started:
        return []
    return launch_differences(launch_record(started["spec-off"]), launch_record(started["spec-on"]))


# --- opening -------------------------------------------------------------------------------------
@contextlib.contextmanager
def open_servers(plan: ServerPlan, messages: Messages = LOGGED) -> Iterator[list[Server]]:
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
            started = stack.enter_context(_started(plan, to_start, messages))
            for i, server in zip(to_start, started, strict=True):
                servers[i] = server
        yield servers


@contextlib.contextmanager
def _started(plan: ServerPlan, indices: list[int], messages: Messages) -> Iterator[list[Server]]:
    """Start the sides at ``indices`` together, saying what runs where; a wait shown until they answer."""
    sides = iter([plan.sides[i] for i in indices])  # launched_many reports the plans in order

    def on_plan(launch_plan: LaunchPlan, log_path: Path) -> None:
        label = next(sides).label
        messages.say(f"starting {plan.backend_name if label is None else label + ' server'}: "
                     f"{launch_plan.printable()}")
        messages.say(f"server log: {log_path}")
        for note in launch_plan.notes:
            messages.say(f"note: {note}")
        if label is not None:
            plan.started[label] = launch_plan
            for line in plan_differences(plan.started):
                messages.say(f"warning: the two servers differ in more than speculation: {line}")

    what = "server" if len(indices) == 1 else "servers"
    with contextlib.ExitStack() as stack:
        with messages.status(f"starting {what}...") as update:
            def on_wait(elapsed: float, last_line: str) -> None:
                update(f"waiting for the {what} to answer ({elapsed:.0f} s): {last_line[-90:]}")

            servers = stack.enter_context(plan.backend.launched_many(
                [plan.launch[i] for i in indices], startup_timeout_s=plan.startup_timeout_s, on_wait=on_wait,
                on_plan=on_plan))
        yield servers

"""The server options probe, compare, equiv and tune share, on the command line.

``server_options(sides)`` adds one option set to a command: the backend, TLS and API key,
what a started server runs (model, spec config, interpreter, host, dtype, ...), and how the
servers are reached: ``--url``/``--port`` for one server, ``--off``/``--on``/``--launch``
for two; ``sweep_server_options`` the set of a sweep (tune). The command receives the shared
values as one ``ServerOptions``.

Planning and opening the servers is orchestration.servers' work (``plan_servers``,
``open_servers``); a command passes them its console's messages.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any

import click

from specadapt.orchestration.servers import ServerOptions

__all__ = ["ServerOptions", "server_options", "sweep_server_options"]


# --- the options ------------------------------------------------------------------------------
DEFAULTS = ServerOptions()
BACKEND = click.option("--backend", default=DEFAULTS.backend, show_default=True,
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
LAUNCH = click.option("--launch", type=click.Choice(["parallel", "sequential", "shared"]), default="parallel",
                      show_default=True,
                      help="Started servers: side by side, each on its own share of the CPUs (and GPUs), requests "
                           "interleaved; one after the other, each on the whole machine; or side by side on the same "
                           "CPUs (each may stall the other's first token; said in the report).")
PYTHON = click.option("--python", default=DEFAULTS.python, show_default="this interpreter",
                      help="Interpreter that has the server installed.")
HOST = click.option("--host", default=DEFAULTS.host, show_default=True, help="Host a started server binds.")
PORT = click.option("--port", type=click.IntRange(1, 65535), help="Port for a started server (default: a free one).")
DTYPE = click.option("--dtype", help="Server dtype (auto: specadapt picks what this machine runs natively and says "
                                     "so; bfloat16, float16, float32).")
MAX_MODEL_LEN = click.option("--max-model-len", type=click.IntRange(16), default=DEFAULTS.max_model_len,
                             show_default=True,
                             help="Longest sequence (prompt + output) a started server accepts.")
SERVER_ARG = click.option("--server-arg", "server_args", multiple=True,
                          help="Extra argument for every started server, verbatim; repeat for several.")
STARTUP_TIMEOUT = click.option("--startup-timeout", type=click.FloatRange(1), default=DEFAULTS.startup_timeout,
                               show_default=True,
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


def _with_server_options(command: Callable, options: Sequence[Callable]) -> Callable:
    """``command`` with ``options`` added; the shared values reach it as one ``server_opts``."""
    @functools.wraps(command)
    def with_server_options(**kw: Any) -> Any:
        opts = ServerOptions(**{f.name: kw.pop(f.name) for f in fields(ServerOptions)})
        return command(server_opts=opts, **kw)

    for option in reversed(options):
        with_server_options = option(with_server_options)
    return with_server_options


def sweep_server_options(command: Callable) -> Callable:
    """The shared server options for a sweep (tune): ``--off URL``, ``--on URL`` (repeatable) and
    ``--verify-url``; --model/--spec-config also with URLs (what started candidates run)."""
    return _with_server_options(command, [BACKEND, OFF_URL, ON_URLS, VERIFY_URL, API_KEY, INSECURE, CA_BUNDLE, MODEL,
                                          SPEC_CONFIG, PYTHON, HOST, DTYPE, MAX_MODEL_LEN, SERVER_ARG,
                                          STARTUP_TIMEOUT])


def server_options(sides: int) -> Callable[[Callable], Callable]:
    """The shared server options plus ``--url``/``--port`` (``sides=1``) or ``--off``/``--on``/
    ``--launch`` (``sides=2``); the command gets the shared values as ``server_opts``."""
    if sides not in (1, 2):
        raise ValueError(f"sides must be 1 or 2, not {sides}")
    return functools.partial(_with_server_options, options=_option_list(sides))

"""The exception tree of specadapt.

Every error a user can cause or meet derives from ``SpecadaptError`` and carries one
sentence that says what is wrong and, where there is one, how to fix it. The CLI prints
that sentence on one line and exits with ``exit_code``; nothing else turns into a
traceback. Third-party exceptions are translated at the boundary
(``raise ServerUnreachable(...) from exc``).

    SpecadaptError                 exit 2
      UsageError                   bad arguments, configs, prompt files, model dirs
      MissingDependency            an optional extra is not installed (install hint)
      ServerError                  anything about a server
        ServerUnreachable          connection refused, DNS, TLS, timeout
        RequestRefused             the server answered 4xx to a request it considers invalid
        NotAServer                 it answers, but not as the expected server does
        ServerStartError           a managed server died or never became healthy
        ServerDied                 a managed server exited mid-run (the partial report is written)
        PortInUse                  the requested port is taken
      ModelFetchError              the embedded model could not be fetched or converted
"""

from __future__ import annotations

import importlib


class SpecadaptError(Exception):
    """Base class: ``str(err)`` is the one line the user sees."""

    exit_code = 2


class UsageError(SpecadaptError):
    """The user gave something that cannot work (argument, file, config)."""


class MissingDependency(SpecadaptError):
    """An optional dependency is missing; the message names the extra to install."""

    def __init__(self, module: str, extra: str, purpose: str):
        super().__init__(
            f"{purpose} needs the Python package '{module}', which is not installed: "
            f"pip install 'specadapt[{extra}]'"
        )
        self.module = module
        self.extra = extra


class ServerError(SpecadaptError):
    """Something went wrong with an inference server."""


class ServerUnreachable(ServerError):
    """No HTTP answer at all."""


class RequestRefused(ServerError):
    """The server answered 4xx to a request it considers invalid (not a failure of the server):
    ``status`` is the HTTP status, ``server_message`` the server's own sentence."""

    def __init__(self, message: str, status: int = 400, server_message: str = ""):
        super().__init__(message)
        self.status = status
        self.server_message = server_message


class NotAServer(ServerError):
    """An HTTP answer, but not from the kind of server expected."""


class ServerStartError(ServerError):
    """A managed server exited during start-up or did not become healthy in time."""

    def __init__(self, message: str, log_tail: str = "", exit_code: int | None = None):
        super().__init__(message)
        self.log_tail = log_tail
        self.process_exit_code = exit_code


class ServerDied(ServerError):
    """A server specadapt started exited while a run was in progress."""

    def __init__(self, message: str, log_tail: str = "", exit_code: int | None = None):
        super().__init__(message)
        self.log_tail = log_tail
        self.process_exit_code = exit_code


class PortInUse(ServerError):
    """The requested port is already bound by another process."""


class ModelFetchError(SpecadaptError):
    """The embedded default model could not be downloaded or converted."""


def require(module: str, extra: str, purpose: str):
    """Import ``module`` lazily, or raise MissingDependency with the install hint."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingDependency(module, extra, purpose) from exc

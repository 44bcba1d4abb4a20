"""Where the commands talk to the user: rich consoles, the one progress bar they share, and the
console form of the library's ``Messages`` and ``ProgressBars``."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from specadapt.load.progress import Progress as OnRequest
from specadapt.orchestration.servers import Messages

stderr = Console(stderr=True)


def say(text: str) -> None:
    """One line on stderr exactly as given: no rich markup, no colouring, no wrapping
    (command lines and paths must stay pasteable)."""
    stderr.print(text, markup=False, highlight=False, soft_wrap=True)


def warn(text: str) -> None:
    """'warning: ' and the text on stderr, the prefix in yellow."""
    stderr.print(f"[yellow]warning:[/] {escape(text)}")


@contextlib.contextmanager
def status(text: str) -> Iterator[Callable[[str], None]]:
    """A spinner with ``text`` on stderr while the block runs; yields what updates the text."""
    with stderr.status(text) as spinner:
        yield spinner.update


CONSOLE = Messages(say=say, warn=warn, status=status)
"""The library's messages on stderr."""


def progress_bar() -> Progress:
    """Requests done of the total, on stderr; gone when the run ends."""
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=stderr, transient=True)


class ConsoleRun:
    """A library run shown on stderr: ``bars`` (ProgressBars) gives each phase its own bar, and
    ``messages`` says lines, warnings and spinners. One display at a time: a phase's bar goes
    when the next phase starts, when a line is said or a spinner starts, and when the run ends
    (the ``with`` block), so lines and spinners appear as they do outside a run."""

    def __init__(self) -> None:
        self._bar: Progress | None = None
        self.messages = Messages(say=self._say, warn=self._warn, status=self._status)

    def bars(self, label: str, total: int) -> OnRequest:
        """A new bar for one phase: ``total`` requests labelled ``label``."""
        self.close()
        bar = progress_bar()
        task = bar.add_task(label, total=total)
        bar.start()
        self._bar = bar
        return lambda rec: bar.advance(task)

    def close(self) -> None:
        """End the current bar, if one is shown."""
        if self._bar is not None:
            self._bar.stop()
            self._bar = None

    def _say(self, text: str) -> None:
        self.close()
        say(text)

    def _warn(self, text: str) -> None:
        self.close()
        warn(text)

    @contextlib.contextmanager
    def _status(self, text: str) -> Iterator[Callable[[str], None]]:
        self.close()
        with status(text) as update:
            yield update

    def __enter__(self) -> ConsoleRun:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

"""Where the commands talk to the user: rich consoles and the one progress bar they share."""

from __future__ import annotations

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

stderr = Console(stderr=True)


def say(text: str) -> None:
    """One line on stderr exactly as given: no rich markup, no colouring, no wrapping
    (command lines and paths must stay pasteable)."""
    stderr.print(text, markup=False, highlight=False, soft_wrap=True)


def progress_bar() -> Progress:
    """Requests done of the total, on stderr; gone when the run ends."""
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=stderr, transient=True)

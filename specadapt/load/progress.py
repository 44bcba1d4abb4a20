"""How a run reports progress: once per finished request (warm-up included), and for runs of
several phases (servers started one after the other, a tune's candidates) one bar per phase.

The command layer passes rich progress bars; a library caller passes its own callables or none.
"""

from __future__ import annotations

from collections.abc import Callable

from specadapt.records import RequestRecord

Progress = Callable[[RequestRecord], None]
"""Called once per finished request."""

ProgressBars = Callable[[str, int], Progress]
"""A new bar for one phase: (label, total requests) -> its Progress."""


def no_progress(rec: RequestRecord) -> None:
    """A Progress that shows nothing."""


def no_bars(label: str, total: int) -> Progress:
    """ProgressBars that show nothing."""
    return no_progress

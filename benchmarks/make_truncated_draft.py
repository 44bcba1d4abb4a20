"""Make a layer-truncated draft of the embedded SmolLM2 (first N decoder layers) in the cache.

    python benchmarks/make_truncated_draft.py --layers 8

Writes ``<cache>/models/SmolLM2-135M-Instruct-first<N>`` (never committed) and prints its
path. The draft shares the target's embeddings, tokenizer and head; only depth is cut.
``specadapt demo`` makes (and reuses) the same directory.
"""

from __future__ import annotations

import os

import click

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@click.command()
@click.option("--layers", type=int, default=8, show_default=True, help="Decoder layers to keep.")
@click.option("--force", is_flag=True, help="Write again even if present.")
def main(layers: int, force: bool) -> None:
    from specadapt.models import resolve_model_dir, truncated_model_dir
    from specadapt.native_reference.models import truncated_copy

    src = resolve_model_dir(None)
    click.echo(str(truncated_copy(src, layers, truncated_model_dir(src, layers), force=force)))


if __name__ == "__main__":
    main()

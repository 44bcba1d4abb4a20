"""Make a layer-truncated draft of the embedded SmolLM2 (first N decoder layers) in the cache.

    python benchmarks/make_truncated_draft.py --layers 8

Writes ``<cache>/models/SmolLM2-135M-Instruct-first<N>`` (never committed) and prints its
path. The draft shares the target's embeddings, tokenizer and head; only depth is cut.
"""

from __future__ import annotations

import os
import shutil

import click

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@click.command()
@click.option("--layers", type=int, default=8, show_default=True, help="Decoder layers to keep.")
@click.option("--force", is_flag=True, help="Write again even if present.")
def main(layers: int, force: bool) -> None:
    import torch

    from specadapt.models import embedded_model_dir, resolve_model_dir
    from specadapt.native_reference.models import load_causal_lm, truncate_layers

    src = resolve_model_dir(None)
    dest = embedded_model_dir().parent / f"{src.name}-first{layers}"
    if (dest / "config.json").is_file() and not force:
        click.echo(str(dest))
        return
    model = truncate_layers(load_causal_lm(src, torch.float32), layers)
    tmp = dest.with_name(dest.name + ".part")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(str(tmp))
    for f in src.iterdir():
        if f.name.startswith("tokenizer") or f.name in ("chat_template.jinja", "special_tokens_map.json",
                                                       "generation_config.json"):
            shutil.copy(f, tmp / f.name)
    shutil.rmtree(dest, ignore_errors=True)
    os.replace(tmp, dest)
    click.echo(str(dest))


if __name__ == "__main__":
    main()

"""`specadapt config`: render, validate and explain speculative-decoding configs (configs/ does the work)."""

from __future__ import annotations

import json
from pathlib import Path

import click
from pydantic import ValidationError

from specadapt.configs import multinode as MN
from specadapt.configs import render as R
from specadapt.configs import versions as V
from specadapt.configs import watch as W
from specadapt.configs.examples import stale_examples, write_examples
from specadapt.configs.files import explain_file, validate_file
from specadapt.configs.spec import METHODS, SpecConfig
from specadapt.errors import UsageError

_BACKEND = click.Choice(V.BACKENDS)
_ENGINE = click.Choice(["pytorch", "tensorrt"])


def _json_option(value: str | None, what: str, example: str):
    if value is None:
        return None
    try:
        return json.loads(value)
    except ValueError as exc:
        raise UsageError(f"{what} is not valid JSON ({exc.msg}): write it like {example}.") \
            from exc


def _build_spec(**kw) -> SpecConfig:
    schedule = _json_option(kw.pop("draft_len_schedule"), "--draft-len-schedule",
                            "'{\"4\": 3, \"16\": 1}'")
    per_batch = _json_option(kw.pop("k_per_batch_size"), "--k-per-batch-size",
                             "'[[1, 16, 4], [17, 64, 2]]'")
    try:
        return SpecConfig(draft_len_schedule=schedule, k_per_batch_size=per_batch, **kw)
    except ValidationError as exc:  # -> one line
        detail = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise UsageError(f"Invalid config: {detail or exc}.") from exc


@click.group("config", invoke_without_command=True)
@click.option("--backend", type=_BACKEND, help="Server to write for.")
@click.option("--target", help="Target model (HF id or local dir).")
@click.option("--method", type=click.Choice(METHODS), help="Speculation method.")
@click.option("--draft", help="Draft model / EAGLE head / Medusa heads.")
@click.option("--k", "k", type=int, help="Draft tokens per step.")
@click.option("--tp", type=int, default=1, show_default=True, help="Target tensor parallel size.")
@click.option("--draft-tp", type=int, help="Draft tensor parallel size (1 or --tp).")
@click.option("--ngram-min", type=int, help="ngram: smallest n-gram matched.")
@click.option("--ngram-max", type=int, help="ngram: largest n-gram matched.")
@click.option("--k-per-batch-size", help="vLLM: JSON [[start, end, k], ...].")
@click.option("--max-concurrency", type=int, help="TRT-LLM: no speculation above this batch.")
@click.option("--draft-len-schedule", help='TRT-LLM: JSON {"batch_size": k, ...}.')
@click.option("--dtype", type=click.Choice(["auto", "float16", "bfloat16", "float32"]))
@click.option("--max-model-len", type=int, help="Max sequence length.")
@click.option("--backend-version", help="Server version (default: newest supported).")
@click.option("--trtllm-backend", "engine", type=_ENGINE, default="pytorch", show_default=True,
              help="TensorRT-LLM engine backend.")
@click.option("--format", "formats", multiple=True,
              type=click.Choice([*R.FORMATS, "slurm", "all"]),
              help="Output format(s); default yaml (k8s with --nodes for vLLM, slurm for "
                   "TensorRT-LLM).")
@click.option("--entry", type=click.Choice(["module", "serve"]), default="module",
              show_default=True, help="vLLM argv: python -m ... or vllm serve.")
@click.option("--port", type=int, default=8000, show_default=True)
@click.option("--image", help="Container image for k8s/compose.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path),
              help="Write files into this directory instead of printing.")
@click.option("--nodes", type=int,
              help="Spread one replica over N nodes (vLLM: LeaderWorkerSet; TensorRT-LLM: "
                   "Slurm batch script).")
@click.option("--pp", type=int, help="Pipeline parallel size (with --nodes; default 1).")
@click.option("--gpus-per-node", type=int,
              help="GPUs per node (with --nodes; default tp x pp / nodes).")
@click.option("--replicas", type=int, default=1, show_default=True,
              help="Copies of the deployment (k8s: a StatefulSet on one node, LeaderWorkerSet "
                   "groups with --nodes); prints one probe URL each.")
@click.option("--rdma-resource", help="With --nodes: RDMA device resource per pod, NAME=COUNT "
                                      "(e.g. rdma/ib=1).")
@click.option("--namespace", default="default", show_default=True,
              help="Namespace used in the printed replica URLs.")
@click.option("--watch", is_flag=True,
              help=f"k8s: run `specadapt watch` beside each server (the leader, with --nodes), "
                   f"exporting on port {W.WATCH_PORT} with the pods' Prometheus scrape "
                   "annotations.")
@click.option("--watch-image",
              help=f"Container image of the --watch sidecar (default {W.DEFAULT_IMAGE}).")
@click.pass_context
def config(ctx: click.Context, backend, backend_version, engine, formats, entry, port, image,
           out_dir, nodes, pp, gpus_per_node, replicas, rdma_resource, namespace, watch,
           watch_image, **spec_kw) -> None:
    """Write validated speculative-decoding configs for vLLM and TensorRT-LLM."""
    if ctx.invoked_subcommand is not None:
        ctx.obj = {"backend": backend, "version": backend_version, "engine": engine}
        return
    if backend is None and spec_kw["method"] is None and spec_kw["target"] is None:
        click.echo(ctx.get_help())
        return
    if backend is None:
        raise UsageError("Say which server to write for: add --backend vllm or "
                         "--backend trtllm (see 'specadapt config --help').")
    if spec_kw["method"] is None:
        raise UsageError(f"Choose a speculation method: add --method "
                         f"({', '.join(METHODS)}).")
    spec = _build_spec(**spec_kw)
    if watch_image is not None and not watch:
        raise UsageError("--watch-image sets the image of the --watch sidecar: add --watch, or "
                         "leave it out.")
    watch_image = (watch_image or W.DEFAULT_IMAGE) if watch else None
    if nodes is None:
        unused = [f for f, v in (("--pp", pp), ("--gpus-per-node", gpus_per_node),
                                 ("--rdma-resource", rdma_resource)) if v is not None]
        if unused:
            raise UsageError(f"{', '.join(unused)} only apply to a deployment across nodes: "
                             "add --nodes N (2 or more), or leave them out.")
        if replicas < 1:
            raise UsageError(f"--replicas {replicas} must be at least 1.")
        if replicas > 1 and "k8s" not in formats and "all" not in formats:
            raise UsageError("--replicas applies to the Kubernetes manifest: add --format k8s.")
    else:
        _multinode(spec, backend, backend_version, engine, formats, port, image, out_dir,
                   namespace, MN.Topology.build(spec, nodes, pp, gpus_per_node, replicas,
                                                rdma_resource), watch_image)
        return
    for warning in R.validate(spec, backend, backend_version, engine):
        click.echo(str(warning), err=True)
    fmts = (R.available_formats(spec, backend, backend_version) if "all" in formats
            else list(formats or ["yaml"]))
    _check_watch(watch_image, fmts)
    if out_dir is not None:
        for path in R.write_outputs(spec, backend, fmts, out_dir, backend_version, engine,
                                    entry=entry, port=port, image=image, replicas=replicas,
                                    namespace=namespace, watch_image=watch_image):
            click.echo(str(path))
        return
    for note in R.unread_notes(backend, fmts):
        click.echo(note, err=True)
    for fmt in fmts:
        if len(fmts) > 1:
            click.echo(f"# --- {fmt} ---")
        click.echo(R.render(spec, backend, fmt, backend_version, engine, entry=entry,
                            port=port, image=image, replicas=replicas,
                            watch_image=watch_image if fmt == "k8s" else None), nl=False)
    if replicas > 1 and "k8s" in fmts:
        click.echo(R.single_node_probe_hint(spec, backend, replicas, port=port,
                                            namespace=namespace), err=True, nl=False)


def _check_watch(watch_image: str | None, fmts: list[str], k8s: bool = True) -> None:
    """--watch needs a format with pods (k8s); among several, only k8s gets the sidecar."""
    if watch_image is not None and "k8s" not in fmts:
        fix = ("add --format k8s" if k8s else "leave out --watch and run `specadapt watch "
               "--url http://HOST:PORT` against the API the job prints")
        raise UsageError(f"--watch adds a container to the server's pods and --format "
                         f"{', '.join(fmts)} has none: {fix}.")


def _multinode(spec, backend, version, engine, formats, port, image, out_dir, namespace,
               topo, watch_image) -> None:
    for warning in R.validate_multinode(spec, backend, topo, version, engine):
        click.echo(str(warning), err=True)
    allowed = list(R.MULTINODE_FORMATS[backend])
    fmts = allowed if "all" in formats else list(formats or [allowed[-1]])
    _check_watch(watch_image, fmts, "k8s" in allowed)
    if out_dir is not None:
        for path in R.write_multinode(spec, backend, fmts, out_dir, topo, version, engine,
                                      namespace=namespace, port=port, image=image,
                                      watch_image=watch_image):
            click.echo(str(path))
        return
    texts = [(fmt, R.render_multinode(spec, backend, fmt, topo, version, engine, port=port,
                                      image=image,
                                      watch_image=watch_image if fmt == "k8s" else None))
             for fmt in fmts]
    for fmt, text in texts:
        if len(fmts) > 1:
            click.echo(f"# --- {fmt} ---")
        click.echo(text, nl=False)
    for note in R.unread_notes(backend, fmts):
        click.echo(note, err=True)
    click.echo(MN.probe_hint(spec, topo, backend, namespace=namespace, port=port), err=True,
               nl=False)


def _opts(ctx: click.Context) -> dict:
    return ctx.obj or {"backend": None, "version": None, "engine": None}


@config.command("validate")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--schema", type=click.Path(dir_okay=False, path_type=Path),
              help="TensorRT-LLM's trtllm-serve JSON schema to check TRT-LLM YAML against.")
@click.pass_context
def validate_cmd(ctx: click.Context, file: Path, schema: Path | None) -> None:
    """Check FILE (JSON, YAML, command line, k8s or compose); exit 1 when it has errors."""
    o = _opts(ctx)
    report = validate_file(file, o["backend"], o["version"], o["engine"], schema)
    for p in report.problems:
        click.echo(str(p), err=p.severity == "warning" or not report.ok)
    kinds = ", ".join(sorted({u.kind for u in report.units}))
    if not report.ok:
        click.echo(f"{file}: invalid ({kinds})", err=True)
        ctx.exit(1)
    click.echo(f"{file}: ok ({kinds})")


@config.command("explain")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@click.pass_context
def explain_cmd(ctx: click.Context, file: Path) -> None:
    """Say what each key of FILE does, and what is missing, deprecated or wrong."""
    o = _opts(ctx)
    for line in explain_file(file, o["backend"], o["version"], o["engine"]):
        click.echo(line)


@config.command("examples")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path),
              default=Path("configs"), show_default=True)
@click.option("--check", is_flag=True, help="Only report files that are out of date (exit 1).")
@click.pass_context
def examples_cmd(ctx: click.Context, out_dir: Path, check: bool) -> None:
    """Regenerate (or check) the example deployments in configs/."""
    if check:
        stale = stale_examples(out_dir)
        for name in stale:
            click.echo(f"out of date: {out_dir / name}", err=True)
        if stale:
            click.echo("run 'specadapt config examples' to regenerate them", err=True)
            ctx.exit(1)
        click.echo(f"{out_dir}: up to date")
        return
    for path in write_examples(out_dir):
        click.echo(str(path))

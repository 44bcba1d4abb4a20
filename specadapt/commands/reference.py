"""`specadapt reference ...`: the native PyTorch reference engine from the command line.

This module imports without torch; the engine (torch, transformers) is imported inside the
commands, after ``require`` has named the extra to install when they are missing.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from specadapt.errors import require
from specadapt.models import resolve_model_dir
from specadapt.records.schedule import read_schedule

_DTYPES = click.Choice(["auto", "float64", "float32", "bfloat16", "float16"])


def model_options(fn):
    """Options shared by `generate` and `serve`: models, proposer, k, precision."""
    opts = [
        click.option("--target", type=click.Path(path_type=Path), default=None,
                     help="Local HF target model directory (default: the embedded SmolLM2-135M-Instruct)."),
        click.option("--draft", type=click.Path(path_type=Path), default=None,
                     help="Local HF draft model directory with the target's vocabulary."),
        click.option("--ngram", is_flag=True, help="Propose by n-gram prompt lookup instead of a draft model."),
        click.option("--ngram-min", type=int, default=1, show_default=True, help="Shortest n-gram to match."),
        click.option("--ngram-max", type=int, default=4, show_default=True, help="Longest n-gram to match."),
        click.option("--k", "k", type=int, default=4, show_default=True, help="Draft tokens per target pass (at most)."),
        click.option("--draft-min-confidence", type=float, default=0.0, show_default=True,
                     help="Stop drafting after a token the draft gives less than this probability."),
        click.option("--dtype", type=_DTYPES, default="auto", show_default=True,
                     help="auto: bfloat16 on CUDA, float32 on CPU; float64 on CPU is the ground truth."),
        click.option("--device", default="auto", show_default=True, help="auto, cpu or cuda[:N]."),
        click.option("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)."),
        click.option("--seed", type=int, default=0, show_default=True, help="Seed of the sampling RNG."),
    ]
    for opt in reversed(opts):
        fn = opt(fn)
    return fn


def _open(target, draft, ngram, ngram_min, ngram_max, k, draft_min_confidence, dtype, device, threads, seed,
          fault=None, schedule=None, max_model_len=None):
    torch = require("torch", "reference", "the native reference engine")
    require("transformers", "reference", "the native reference engine")
    if threads:
        torch.set_num_threads(threads)
    from specadapt.native_reference.runtime import open_reference  # torch

    target_dir = resolve_model_dir(str(target) if target else None)
    draft_dir = resolve_model_dir(str(draft)) if draft else None
    return open_reference(target_dir, draft_dir, ngram, k, dtype, device, ngram_min, ngram_max, fault, seed,
                          min_confidence=draft_min_confidence, schedule=schedule, max_model_len=max_model_len)


def _schedule(value: str | None) -> list | None:
    """--num-speculative-tokens-per-batch-size: JSON text or a file holding it."""
    return read_schedule(value, "--num-speculative-tokens-per-batch-size") if value else None


@click.group("reference")
def reference() -> None:
    """Speculative decoding in PyTorch: the ground truth (generate, serve)."""


@reference.command("generate")
@model_options
@click.option("--prompt", required=True, help="The prompt text.")
@click.option("--chat", is_flag=True, help="Wrap the prompt in the tokenizer's chat template.")
@click.option("--max-tokens", type=int, default=64, show_default=True)
@click.option("--temperature", type=float, default=0.0, show_default=True, help="0: greedy.")
@click.option("--top-k", type=int, default=0, help="0: off.")
@click.option("--top-p", type=float, default=1.0, help="1.0: off.")
@click.option("--check", is_flag=True, help="Also run the target alone and compare token by token.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of text.")
def generate(target, draft, ngram, ngram_min, ngram_max, k, draft_min_confidence, dtype, device, threads, seed,
             prompt, chat, max_tokens, temperature, top_k, top_p, check, as_json) -> None:
    """Generate with speculative decoding; print the text and the statistics."""
    ref = _open(target, draft, ngram, ngram_min, ngram_max, k, draft_min_confidence, dtype, device, threads, seed)
    from specadapt.native_reference.runtime import generate as generate_text  # torch
    from specadapt.native_reference.sampling import SamplingParams

    result = generate_text(ref, prompt, chat, max_tokens, SamplingParams(temperature, top_k, top_p), check, seed)
    if as_json:
        click.echo(json.dumps(result, indent=2))
        return
    click.echo(result["text"])
    click.echo("")
    click.echo(_format_stats(result))
    if check:
        click.echo(result["check"]["summary"])


def _format_stats(result: dict) -> str:
    s = result["stats"]
    rows = [
        f"method {result['method']}  k {result['k']}  {result['dtype']} on {result['device']}",
        f"tokens: prompt {s['prompt_tokens']}  generated {s['generated_tokens']}  "
        f"({s['generated_tokens'] / s['time_total']:.1f} tokens/s)" if s["time_total"] else "",
        f"forwards: target {s['target_forwards']}  draft {s['draft_forwards']}",
        f"drafts {s['num_drafts']}  draft tokens {s['draft_tokens']}  accepted {s['accepted_tokens']}  "
        f"acceptance {s['acceptance_rate']:.3f}  mean acceptance length {s['mean_acceptance_length']:.2f}",
        f"accepted per position: {s['accepted_per_pos']} of {s['proposed_per_pos']}",
        f"time: prefill {s['time_prefill']:.3f}s  draft {s['time_draft']:.3f}s  "
        f"verify {s['time_verify']:.3f}s  other {s['time_other']:.3f}s",
    ]
    return "\n".join(r for r in rows if r)


@reference.command("serve")
@model_options
@click.option("--host", default="127.0.0.1", show_default=True, help="Loopback only unless you mean it.")
@click.option("--port", type=int, default=8000, show_default=True)
@click.option("--served-model-name", default=None, help="Model id in the API (default: the target dir name).")
@click.option("--max-num-seqs", type=click.IntRange(min=1), default=16, show_default=True,
              help="Most requests in the running batch; more wait in arrival order.")
@click.option("--max-model-len", type=click.IntRange(min=2), default=None,
              help="Longest prompt + completion (default: the model's max_position_embeddings).")
@click.option("--num-speculative-tokens-per-batch-size", "schedule", default=None, metavar="JSON",
              help="Draft length by running batch size, vLLM's form: [[1, 4, 4], [5, 16, 2], [17, 64, 0]] "
                   "(inline or a file).")
@click.option("--max-logprobs", type=click.IntRange(min=-1), default=20, show_default=True,
              help="Most logprobs / prompt_logprobs a request may ask for (-1: no cap), as vLLM's.")
@click.option("--inject-fault", "--fault", "fault", default=None,
              help="TEST AID, off by default: accept-always, drop-bonus, perturb-logits=EPS, "
                   "draft-temperature=T (draft model only), residual-p, bonus-previous, accept-later, "
                   "stop-in-chunk, overrun-max-tokens, draft-penalties-skipped, draft-filters-skipped, "
                   "seed-ignored, logprobs-shifted or batch-drop (only with two or more requests in a pass).")
def serve(target, draft, ngram, ngram_min, ngram_max, k, draft_min_confidence, dtype, device, threads, seed,
          host, port, served_model_name, max_num_seqs, max_model_len, schedule, max_logprobs, fault) -> None:
    """Serve the reference engine as an OpenAI-compatible HTTP server (concurrent requests batched)."""
    for module in ("starlette", "uvicorn"):
        require(module, "reference", "specadapt reference serve")
    ref = _open(target, draft, ngram, ngram_min, ngram_max, k, draft_min_confidence, dtype, device, threads, seed,
                fault, _schedule(schedule), max_model_len)
    from specadapt.native_reference.server import run_server  # torch, starlette

    if fault:
        click.echo(f"WARNING: fault injection '{fault}' is ON: this server is deliberately wrong", err=True)
    if host not in ("127.0.0.1", "localhost", "::1"):
        click.echo(f"WARNING: serving on {host}, not loopback: anyone who can reach it can use it", err=True)
    run_server(ref, host, port, served_model_name, max_num_seqs, max_logprobs)

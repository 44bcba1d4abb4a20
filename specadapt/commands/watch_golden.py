"""`specadapt watch record-golden`: golden answers from the spec-off server at staging, for the
watcher's canaries (orchestration/canary.py does the work)."""

from __future__ import annotations

from pathlib import Path

import click

from specadapt.commands._console import ConsoleRun, say
from specadapt.commands._server import API_KEY, BACKEND, CA_BUNDLE, INSECURE, ServerOptions
from specadapt.orchestration.canary import MAX_TOKENS
from specadapt.orchestration.canary import record_golden as record
from specadapt.orchestration.servers import open_servers, plan_servers, replica_sides
from specadapt.records import write_golden
from specadapt.workloads.prompts import CANARY_PROMPT_IDS, canary_prompts, load_prompts


@click.command("record-golden")
@click.option("--url", required=True, help="The target's spec-off server (or a `specadapt reference serve` URL), "
                                           "e.g. http://127.0.0.1:8000.")
@BACKEND
@API_KEY
@INSECURE
@CA_BUNDLE
@click.option("--prompts", "prompts_file", type=click.Path(dir_okay=False, path_type=Path),
              help="JSONL prompt file, single-turn (default: the built-in canary set: "
                   f"{', '.join(CANARY_PROMPT_IDS)}).")
@click.option("--max-tokens", type=click.IntRange(1), default=MAX_TOKENS, show_default=True,
              help="Tokens per golden answer (a prompt's own max_tokens wins).")
@click.option("--dtype", help="The server's dtype, recorded when the server does not say it (it sets the near-tie "
                              "threshold).")
@click.option("--near-tie-threshold", type=click.FloatRange(0, min_open=True),
              help="Nats (default: the one for the dtype).")
@click.option("--request-timeout", type=click.FloatRange(0.1), default=120, show_default=True,
              help="Seconds per request.")
@click.option("--out", "out_file", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="The golden file to write (JSON).")
@click.option("--allow-spec-on", is_flag=True, help="Record from a server that runs speculative decoding (its "
                                                    "answers are then trusted as the target's own).")
def record_golden(url, backend, api_key, insecure, ca_bundle, prompts_file, max_tokens, dtype, near_tie_threshold,
                  request_timeout, out_file, allow_spec_on) -> None:
    """Record golden answers for canaries: each prompt once, greedy, with its top logprobs, from
    the spec-off server of the target that production serves.

    Exit 0 when the file was written; 2 on bad input, when the server runs speculative decoding
    (without --allow-spec-on), or when it cannot be reached or gives no logprobs."""
    prompts = load_prompts(prompts_file) if prompts_file is not None else canary_prompts()
    opts = ServerOptions(backend=backend, api_key=api_key, insecure=insecure, ca_bundle=ca_bundle)
    with ConsoleRun() as console:
        plan = plan_servers(opts, replica_sides((url,)), console.messages)
        with open_servers(plan, console.messages) as (server,):
            golden = record(server, prompts, max_tokens, dtype=dtype, near_tie_threshold=near_tie_threshold,
                            allow_spec_on=allow_spec_on, timeout_s=request_timeout)
    write_golden(golden, out_file)
    info = golden.server
    spec = ("speculation on (allowed)" if golden.spec_on_allowed else "speculation off" if info.spec_enabled is False
            else "speculation state unknown")
    say(f"recorded {len(golden.answers)} golden answers from {info.base_url} (model {info.model_id}, "
        f"{golden.dtype or 'dtype unknown'}, {spec}), near-tie threshold {golden.near_tie_threshold:g} nats")
    for a in golden.answers:
        say(f"  {a.prompt_id}: {len(a.tokens)} tokens, {a.api}, finish {a.finish_reason}")
    say(f"wrote {out_file}")

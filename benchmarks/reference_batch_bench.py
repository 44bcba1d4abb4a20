"""Benchmark of the native reference engine's batches: where speculation stops paying as the
batch grows, on the embedded SmolLM2-135M-Instruct (not a test; run by hand).

    python benchmarks/make_truncated_draft.py --layers 8
    python benchmarks/reference_batch_bench.py --threads 2 --max-tokens 48 --repeats 2

Same process, same torch threads, greedy, float32 on CPU, chat-templated prompts (the three
of reference_bench.py plus five more; four input-grounded, four open). Every batch size B
decodes the same workload, all the prompts, in batches of B with generate_batch (B=1: one
prompt at a time), so the rows of the table compare like with like. Methods: the target
alone, n-gram lookup k=4 (vLLM's 2..4 window) and, when its directory exists, the 8-layer
cut made by make_truncated_draft.py with k=2. Methods are interleaved and repeated; the
fastest run of each (B, method) counts. Target passes are the engine's own count (one per
prefill, one per batched verify step, whatever the batch size); ms/target pass is the wall
time over them (prefills and draft work included). A batch steps until its last row ends,
so speculation saves passes at B>1 only where every row of the batch accepts.

At B=1 every speculative output is asserted identical to the target alone. At B>1 each row
is compared with the same prompt decoded alone by the same method and the identical rows are
counted, not asserted: float32 batched kernels may round differently from B=1 and flip a
near-tie. Prints a markdown table.
"""

from __future__ import annotations

import os
import platform
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import click

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from reference_bench import PROMPTS as SINGLE_PROMPTS  # noqa: E402

_MORE = {
    "story (free generation)": "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "fix-spelling (input-grounded)": (
        "Repeat this paragraph with the spelling mistakes fixed and nothing else changed:\n\n"
        "The comittee will meet on Wensday to discus the new buget. Every member shoud bring "
        "there notes from the last meeting, and the secretery will send the agenda tomorow."),
    "sky (free generation)": "Explain in simple terms why the sky is blue and sunsets are red.",
    "to-json (input-grounded)": (
        "Convert these records to a JSON list of objects with the keys name, age and city:\n"
        "Alice, 31, Paris\nBob, 45, Berlin\nCarol, 27, Madrid\nDave, 52, Lisbon\nEve, 38, Vienna"),
    "trip-ideas (free generation)": "Give me five ideas for a weekend trip, with one sentence on each.",
}
# interleaved, so that every batch mixes input-grounded and open prompts
_ORDER = ["copy-code (input-grounded)", "open (free generation)", "rewrite-list (input-grounded)",
          "story (free generation)", "fix-spelling (input-grounded)", "sky (free generation)",
          "to-json (input-grounded)", "trip-ideas (free generation)"]
PROMPTS = {name: {**SINGLE_PROMPTS, **_MORE}[name] for name in _ORDER}

TARGET_ALONE = "target alone"


def chunks(items: list, size: int) -> list[list]:
    return [items[i:i + size] for i in range(0, len(items), size)]


@click.command()
@click.option("--batch-sizes", default="1,4,8", show_default=True,
              help="Comma-separated batch sizes; the workload is the first max(B) prompts (at most 8).")
@click.option("--draft", "draft_dir", default=None,
              help="Draft dir (default: the 8-layer cut in the cache, skipped if it is not there).")
@click.option("--k", type=int, default=4, show_default=True, help="k for n-gram.")
@click.option("--draft-k", type=int, default=2, show_default=True, help="k for the truncated draft.")
@click.option("--max-tokens", type=int, default=48, show_default=True)
@click.option("--threads", type=int, default=2, show_default=True)
@click.option("--repeats", type=int, default=2, show_default=True, help="Runs per (B, method); the fastest counts.")
def main(batch_sizes, draft_dir, k, draft_k, max_tokens, threads, repeats):
    import torch

    from specadapt.models import embedded_model_dir, resolve_model_dir
    from specadapt.native_reference.engine import SpecEngine
    from specadapt.native_reference.models import check_draft_compatible, load_causal_lm, load_tokenizer
    from specadapt.native_reference.proposers import DraftModelProposer, NgramProposer

    sizes = sorted({int(b) for b in batch_sizes.split(",") if b.strip()})
    if not sizes or sizes[0] < 1:
        raise click.BadParameter("batch sizes must be positive integers", param_hint="--batch-sizes")
    if sizes[-1] > len(PROMPTS):
        raise click.BadParameter(f"at most {len(PROMPTS)} prompts, so B <= {len(PROMPTS)}",
                                 param_hint="--batch-sizes")
    sizes = sorted(set(sizes) | {1})  # B=1 is the reference of every row and of the ratios

    torch.set_num_threads(threads)
    target_dir = resolve_model_dir(None)
    target = load_causal_lm(target_dir, torch.float32)
    tok = load_tokenizer(target_dir)
    eos = tok.eos_token_id

    methods = {TARGET_ALONE: lambda: SpecEngine(target),
               f"ngram k={k} (2..4)": lambda: SpecEngine(target, NgramProposer(2, 4), k)}
    default_draft = embedded_model_dir().parent / f"{target_dir.name}-first8"
    if draft_dir is not None or (default_draft / "config.json").is_file():
        draft_path = resolve_model_dir(draft_dir or str(default_draft))
        draft = load_causal_lm(draft_path, torch.float32)
        check_draft_compatible(target, draft)
        methods[f"draft {draft_path.name} k={draft_k}"] = \
            lambda: SpecEngine(target, DraftModelProposer(draft), draft_k)
    else:
        print(f"# no draft at {default_draft}: run benchmarks/make_truncated_draft.py --layers 8 for it",
              file=sys.stderr)

    def encode(text):
        ids = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                      tokenize=True)
        return list(ids["input_ids"] if hasattr(ids, "keys") else ids)

    names = list(PROMPTS)[:sizes[-1]]
    prompts = [encode(PROMPTS[n]) for n in names]

    def run(make, batch_size):
        """The whole workload in batches of batch_size: (outputs, seconds, SpecStats totals)."""
        outs, secs, totals = [], 0.0, None
        for group in chunks(prompts, batch_size):
            engine = make()
            t0 = time.perf_counter()
            gens = engine.generate_batch(group, max_tokens, stop_ids=(eos,))
            secs += time.perf_counter() - t0
            outs += [g.tokens for g in gens]
            if totals is None:
                totals = engine.totals
            else:
                totals.add(engine.totals)
        return outs, secs, totals

    # warm-up (allocator, first-call overheads, padded shapes): one short batch per (B, method)
    for make in methods.values():
        for b in sizes:
            make().generate_batch(prompts[:b], 4, stop_ids=(eos,))

    runs: dict[tuple[int, str], list] = {}  # (B, method) -> [(seconds, tokens, stats, identical rows)]
    alone: dict[str, list[list[int]]] = {}  # method -> outputs at B=1
    for rep in range(repeats):  # interleaved, so slow phases of a shared machine hit all methods
        for b in sizes:
            for name, make in methods.items():
                outs, secs, st = run(make, b)
                if b == 1:
                    ref = alone.setdefault(name, outs)
                    assert outs == ref, f"{name} at B=1 differs between repeats"
                    base = alone.setdefault(TARGET_ALONE, outs)
                    for pname, got, want in zip(names, outs, base, strict=True):
                        assert got == want, f"{name} differs from the target alone on {pname!r} at B=1"
                same = sum(o == a for o, a in zip(outs, alone[name], strict=True))
                runs.setdefault((b, name), []).append((secs, sum(map(len, outs)), st, same))
            print(f"# round {rep + 1}: B={b} done", file=sys.stderr)

    best = {key: min(r, key=lambda x: x[0]) for key, r in runs.items()}
    identical = {key: min(x[3] for x in r) for key, r in runs.items()}  # the worst repeat
    tps = {key: n / secs for key, (secs, n, _, _) in best.items()}
    base_tps = tps[(1, TARGET_ALONE)]

    load = os.getloadavg()
    print(f"\nDate: {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC. Machine: {os.cpu_count()}-core "
          f"{platform.machine()} CPU ({platform.system()} {platform.release()}), no GPU, torch {torch.__version__}, "
          f"{threads} thread(s), float32, greedy, max {max_tokens} new tokens, chat template, "
          f"{len(names)} prompts decoded in batches of B, best of {repeats} interleaved runs. "
          f"Target {target_dir.name}. Load average at the end: {load[0]:.1f} (1 min), {load[2]:.1f} (15 min).\n")
    print("| B | method | tokens | target passes | ms/target pass | tokens/s | vs target alone B=1 "
          "| spec/off at this B | acceptance | mean acc. len | rows identical to B=1 |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for b in sizes:
        for name in methods:
            secs, n, st, _ = best[(b, name)]
            spec = name != TARGET_ALONE
            cells = [f"{b}", name, f"{n}", f"{st.target_forwards}", f"{1000 * secs / st.target_forwards:.1f}",
                     f"{tps[(b, name)]:.1f}", f"{tps[(b, name)] / base_tps:.2f}",
                     f"{tps[(b, name)] / tps[(b, TARGET_ALONE)]:.2f}" if spec else "",
                     f"{st.acceptance_rate:.2f}" if spec else "",
                     f"{st.mean_acceptance_length:.2f}" if spec else "",
                     f"{identical[(b, name)]}/{len(names)}" + (" (asserted)" if b == 1 else "")]
            print("| " + " | ".join(cells) + " |")
    print("\nB=1 speculative outputs identical to the target alone: yes (asserted). At B>1 rows are "
          "compared with the same prompt alone by the same method (worst repeat), not asserted.")


if __name__ == "__main__":
    main()

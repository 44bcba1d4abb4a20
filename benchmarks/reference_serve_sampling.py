"""How fast `specadapt reference serve` samples under concurrency, and what scoring the
samples with prompt_logprobs costs (not a test; run by hand, to budget sampling checks).

    python benchmarks/make_truncated_draft.py --layers 4
    python benchmarks/reference_serve_sampling.py --concurrency 8 --max-tokens 48 --threads 1

Starts one server per method on loopback (the target alone, n-gram k=4, the 4-layer cut
of the embedded SmolLM2 as draft model with k=4 when its directory exists, and the target
as its own draft with k=4: every draft accepted when healthy), each with
the same torch threads, and sends ``--concurrency`` requests at once, as a sampling check
sends them: completions with the prompt as token ids (chat-templated through the server's
/tokenize), temperature 1, top_p 1, ``ignore_eos``, a seed per request, ``logprobs: 0``,
``return_tokens_as_token_ids``. Reported: wall time of the round (first request sent to
last answer), generated tokens per second over the round, and the acceptance counters of
the round (/metrics deltas). Then the target-alone server scores every sample as the check
would (prompt + sampled tokens, ``prompt_logprobs: 0``, ``max_tokens: 1``, the same
concurrency), and the time of that round is reported too. Rounds are repeated; every round
is printed.
"""

from __future__ import annotations

import os
import platform
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path

import click
import httpx

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from reference_batch_bench import PROMPTS  # noqa: E402

COUNTERS = ("vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_draft_tokens_total",
            "vllm:spec_decode_num_accepted_tokens_total", "vllm:generation_tokens_total")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(flags: list[str], threads: int) -> tuple[subprocess.Popen, str]:
    port = free_port()
    argv = [sys.executable, "-m", "specadapt", "reference", "serve", f"--port={port}", f"--threads={threads}",
            "--max-num-seqs=16", *flags]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server {' '.join(flags)} exited with {proc.returncode}")
        try:
            if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                return proc, base
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.terminate()
    raise SystemExit("server did not start in 600 s")


def counters(base: str) -> dict[str, float]:
    out = {}
    for line in httpx.get(f"{base}/metrics", timeout=30).text.splitlines():
        name, _, value = line.rpartition(" ")
        key = name.split("{")[0]
        if key in COUNTERS:
            out[key] = out.get(key, 0.0) + float(value)
    return out


def sample_round(base: str, prompts: list[list[int]], max_tokens: int, seed0: int) -> tuple[float, list[list[int]]]:
    def one(i: int) -> list[int]:
        r = httpx.post(f"{base}/v1/completions", timeout=1800, json={
            "prompt": prompts[i], "max_tokens": max_tokens, "temperature": 1.0, "top_p": 1.0, "ignore_eos": True,
            "seed": seed0 + i, "logprobs": 0, "return_tokens_as_token_ids": True})
        r.raise_for_status()
        return [int(t.split(":")[1]) for t in r.json()["choices"][0]["logprobs"]["tokens"]]

    t0 = time.perf_counter()
    with ThreadPoolExecutor(len(prompts)) as pool:
        samples = list(pool.map(one, range(len(prompts))))
    return time.perf_counter() - t0, samples


def score_round(base: str, prompts: list[list[int]], samples: list[list[int]]) -> float:
    def one(i: int) -> None:
        r = httpx.post(f"{base}/v1/completions", timeout=1800, json={
            "prompt": prompts[i] + samples[i], "max_tokens": 1, "temperature": 1.0, "prompt_logprobs": 0})
        r.raise_for_status()
        entries = r.json()["choices"][0]["prompt_logprobs"]
        assert len(entries) == len(prompts[i]) + len(samples[i])

    t0 = time.perf_counter()
    with ThreadPoolExecutor(len(prompts)) as pool:
        list(pool.map(one, range(len(prompts))))
    return time.perf_counter() - t0


@click.command()
@click.option("--concurrency", type=int, default=8, show_default=True, help="Requests sent at once.")
@click.option("--max-tokens", type=int, default=48, show_default=True)
@click.option("--threads", type=int, default=1, show_default=True, help="torch threads of each server.")
@click.option("--rounds", type=int, default=2, show_default=True)
@click.option("--k", type=int, default=4, show_default=True, help="Draft tokens per pass (n-gram and draft).")
@click.option("--only", multiple=True, type=click.Choice(["target", "ngram", "first4", "self"]),
              help="Run only these methods (repeatable; default: all).")
def main(concurrency: int, max_tokens: int, threads: int, rounds: int, k: int, only: tuple[str, ...]) -> None:
    from specadapt.models import embedded_model_dir, resolve_model_dir

    target = resolve_model_dir(None)
    draft = embedded_model_dir().parent / f"{target.name}-first4"
    methods = {("target", "target alone"): [], ("ngram", f"ngram k={k}"): ["--ngram", f"--k={k}"]}
    if (draft / "config.json").is_file():
        methods[("first4", f"draft first4 k={k}")] = [f"--draft={draft}", f"--k={k}"]
    else:
        print(f"# no draft at {draft}: run benchmarks/make_truncated_draft.py --layers 4 for it", file=sys.stderr)
    methods[("self", f"target as draft k={k}")] = [f"--draft={target}", f"--k={k}"]
    methods = {name: flags for (key, name), flags in methods.items() if not only or key in only}
    print(f"# {datetime.now(timezone.utc):%Y-%m-%d}, {platform.machine()}, {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.2f}; torch threads {threads}; {concurrency} concurrent requests "
          f"of {max_tokens} tokens, temperature 1")
    print("| method | round | wall s | tokens | tokens/s | drafts | draft tokens | accepted | scoring wall s |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    names = list(PROMPTS)
    for method, flags in methods.items():
        proc, base = start(flags, threads)
        try:
            prompts = []
            for i in range(concurrency):
                text = PROMPTS[names[i % len(names)]]
                r = httpx.post(f"{base}/tokenize", timeout=60, json={"messages": [{"role": "user", "content": text}]})
                prompts.append(r.json()["tokens"])
            for rnd in range(rounds):
                before = counters(base)
                wall, samples = sample_round(base, prompts, max_tokens, seed0=1000 * rnd)
                after = counters(base)
                delta = {key: after.get(key, 0.0) - before.get(key, 0.0) for key in COUNTERS}
                tokens = sum(len(s) for s in samples)
                score = score_round(base, prompts, samples) if not flags else float("nan")
                print(f"| {method} | {rnd + 1} | {wall:.1f} | {tokens} | {tokens / wall:.1f} | "
                      f"{delta[COUNTERS[0]]:.0f} | {delta[COUNTERS[1]]:.0f} | {delta[COUNTERS[2]]:.0f} | "
                      f"{'' if flags else f'{score:.1f}'} |", flush=True)
        finally:
            proc.terminate()
            proc.wait(timeout=60)


if __name__ == "__main__":
    main()

"""The reference server's /tokenize, /detokenize, prompt_logprobs and their 400s next to a
real vLLM server's, on the embedded model (not a test; run by hand after a vLLM upgrade).

    python benchmarks/reference_vs_vllm_api.py

Starts a vLLM server (its OpenAI API server module, float32, max model length 2048,
VLLM_CPU_KVCACHE_SPACE=1 and Intel OpenMP preloaded when found, as specadapt's vLLM launch
does) and `specadapt reference serve` (target alone, float32) on loopback, sends both the
same requests and prints, per request, EQUAL or both answers. For prompt_logprobs it
prints the key order, ranks and decoded tokens compared position by position, and the
largest logprob difference (both servers compute in float32 with their own kernels).
Fields vLLM adds that the reference does not send (stop_reason, token_ids, routed_experts,
kv_transfer_params, ...) are listed, not compared.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import click
import httpx

MESSAGES = [{"role": "user", "content": "What is 2 + 2?"}]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait(base: str, procs: list[subprocess.Popen], limit: float = 900) -> None:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if any(p.poll() is not None for p in procs):
            raise SystemExit("a server exited before it was ready")
        try:
            if httpx.get(f"{base}/v1/models", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(2)
    raise SystemExit(f"{base} not ready in {limit:.0f} s")


def same(label: str, a: httpx.Response, b: httpx.Response) -> None:
    if a.status_code == b.status_code and a.json() == b.json():
        print(f"EQUAL  {label} ({a.status_code})")
    else:
        print(f"DIFF   {label}\n  vllm      {a.status_code} {a.text}\n  reference {b.status_code} {b.text}")


@click.command()
@click.option("--log", default=os.devnull, show_default=True, help="Where vLLM's output goes.")
def main(log: str) -> None:
    from specadapt.adapters.vllm import intel_openmp
    from specadapt.models import resolve_model_dir

    model = str(resolve_model_dir(None))
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"}
    iomp = intel_openmp(sys.executable)
    if iomp:
        env["LD_PRELOAD"] = iomp
    pv, pr = free_port(), free_port()
    with open(log, "w") as out:
        vllm = subprocess.Popen([sys.executable, "-m", "vllm.entrypoints.openai.api_server", f"--model={model}",
                                 "--host=127.0.0.1", f"--port={pv}", "--dtype=float32", "--max-model-len=2048",
                                 "--seed=0"], env=env, stdout=out, stderr=subprocess.STDOUT)
    ref = subprocess.Popen([sys.executable, "-m", "specadapt", "reference", "serve", f"--port={pr}", "--threads=1",
                            "--max-model-len=2048", "--dtype=float32"], env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    V, R = f"http://127.0.0.1:{pv}", f"http://127.0.0.1:{pr}"
    try:
        wait(V, [vllm, ref])
        wait(R, [vllm, ref])
        version = httpx.get(f"{V}/version").json().get("version")
        print(f"vLLM {version} and the reference, both float32, on {os.path.basename(model)}")
        names = {base: httpx.get(f"{base}/v1/models").json()["data"][0]["id"] for base in (V, R)}

        def both(path: str, body: dict) -> tuple[httpx.Response, httpx.Response]:
            return tuple(httpx.post(f"{base}{path}", json={**body, "model": names[base]}, timeout=600)
                         for base in (V, R))

        for body in ({"prompt": "def add(a, b):"}, {"prompt": "hi", "return_token_strs": True},
                     {"messages": MESSAGES}, {"messages": MESSAGES, "add_generation_prompt": False},
                     {"messages": MESSAGES, "continue_final_message": True}):
            same(f"/tokenize {json.dumps(body)}", *both("/tokenize", body))
        ids = httpx.post(f"{R}/tokenize", json={"messages": MESSAGES}).json()["tokens"] + [785, 3364, 314]
        same("/detokenize", *both("/detokenize", {"tokens": ids}))

        a, b = both("/v1/completions", {"prompt": ids, "max_tokens": 1, "temperature": 0, "prompt_logprobs": 3})
        ca, cb = a.json()["choices"][0], b.json()["choices"][0]
        pa, pb = ca["prompt_logprobs"], cb["prompt_logprobs"]
        order = sum(list(x) != list(y) for x, y in zip(pa[1:], pb[1:]))
        shared = [(x[key], y[key]) for x, y in zip(pa[1:], pb[1:]) for key in set(x) & set(y)]
        print(f"prompt_logprobs 3 over {len(ids)} tokens: lengths {len(pa)} / {len(pb)}, first {pa[0]} / {pb[0]}, "
              f"key order differs at {order} positions, ranks differ {sum(x['rank'] != y['rank'] for x, y in shared)}, "
              f"decoded_token differs {sum(x['decoded_token'] != y['decoded_token'] for x, y in shared)} "
              f"of {len(shared)} entries, largest |logprob difference| "
              f"{max(abs(x['logprob'] - y['logprob']) for x, y in shared):.1e}")
        print(f"  position 1, vllm:      {json.dumps(pa[1])}\n  position 1, reference: {json.dumps(pb[1])}")
        print(f"  fields vLLM adds: choice {sorted(set(ca) - set(cb))}, "
              f"response {sorted(set(a.json()) - set(b.json()))}")
        a, b = both("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 1, "temperature": 0,
                                             "prompt_logprobs": 1})
        ja, jb = a.json(), b.json()
        print(f"chat prompt_logprobs at the top: {len(ja['prompt_logprobs'])} / {len(jb['prompt_logprobs'])} entries, "
              f"in the choice: {'prompt_logprobs' in ja['choices'][0]} / {'prompt_logprobs' in jb['choices'][0]}")
        a, b = both("/v1/completions", {"prompt": ids[:5], "max_tokens": 1})
        print(f"prompt_logprobs not asked: {a.json()['choices'][0].get('prompt_logprobs', 'absent')} / "
              f"{b.json()['choices'][0].get('prompt_logprobs', 'absent')}")
        for extra in ({"prompt_logprobs": 21}, {"prompt_logprobs": -1}, {"prompt_logprobs": -2},
                      {"prompt_logprobs": "3"}, {"prompt_logprobs": 2, "stream": True}, {"logprobs": 21}):
            same(f"400 {json.dumps(extra)}", *both("/v1/completions", {"prompt": ids[:5], "max_tokens": 1, **extra}))
    finally:
        for proc in (vllm, ref):
            proc.terminate()
        for proc in (vllm, ref):
            proc.wait(timeout=120)


if __name__ == "__main__":
    main()

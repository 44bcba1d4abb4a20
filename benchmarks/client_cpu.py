"""CPU per chunk of the probe client's parsing, on a local stream (no network, no server).

Feeds N vLLM-shaped chat chunks (one token, its logprob, continuous usage), one chunk per
read, through: the SSE framing and JSON decoding alone (httpx-sse's decoder + json, as the
client had it before, against SSEParser + orjson), and the whole event handling
(SSEParser + StreamState, into a RequestRecord). Best of 5 runs, time.process_time.

    python benchmarks/client_cpu.py --chunks 20000

The httpx-sse row is the baseline only: httpx-sse is not a dependency of specadapt, so
install it beside it to get that row (pip install httpx-sse); without it the row says so.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specadapt.load.client import StreamState  # noqa: E402
from specadapt.records import RequestRecord  # noqa: E402
from specadapt.wire.sse import SSEParser  # noqa: E402


def vllm_chunk(i: int) -> bytes:
    chunk = {"id": "chatcmpl-0123456789abcdef", "object": "chat.completion.chunk", "created": 1764590000,
             "model": "Qwen/Qwen2.5-0.5B-Instruct",
             "choices": [{"index": 0, "delta": {"content": " word"}, "finish_reason": None,
                          "logprobs": {"content": [{"token": " word", "logprob": -0.0123, "bytes": [32, 119, 111],
                                                    "top_logprobs": []}]}}],
             "usage": {"prompt_tokens": 21, "total_tokens": 22 + i, "completion_tokens": 1 + i}}
    return b"data: " + orjson.dumps(chunk) + b"\n\n"


def httpx_sse_json(reads: list[bytes]) -> None:
    from httpx_sse._decoders import SSEDecoder, SSELineDecoder  # the framing httpx-sse does per line
    lines, decoder = SSELineDecoder(), SSEDecoder()
    for raw in reads:
        for line in lines.decode(raw.decode()):
            event = decoder.decode(line)
            if event is not None:
                json.loads(event.data)


def parser_orjson(reads: list[bytes]) -> None:
    parser = SSEParser()
    for raw in reads:
        for data in parser.feed(raw):
            orjson.loads(data)


def stream_state(reads: list[bytes]) -> None:
    state = StreamState(RequestRecord(prompt_id="x", category="c", api="chat"), 0, time.perf_counter_ns)
    for raw in reads:
        state.feed(raw)
    state.close()


def best_us_per_chunk(fn, reads: list[bytes]) -> float:
    best = float("inf")
    for _ in range(5):
        t = time.process_time()
        fn(reads)
        best = min(best, time.process_time() - t)
    return best * 1e6 / len(reads)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chunks", type=int, default=20000)
    args = ap.parse_args()
    reads = [vllm_chunk(i) for i in range(args.chunks)]
    print(f"{'variant':40s} CPU us per chunk")
    for name, fn in [("httpx-sse decoder + json (framing, JSON)", httpx_sse_json),
                     ("SSEParser + orjson (framing, JSON)", parser_orjson),
                     ("SSEParser + StreamState (into the record)", stream_state)]:
        try:
            print(f"{name:40s} {best_us_per_chunk(fn, reads):8.1f}")
        except ImportError:
            print(f"{name:40s}        - (httpx-sse is not installed: pip install httpx-sse)")
    print(json.dumps({"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                      "machine": f"{os.cpu_count()}-core {platform.machine()}", "chunks": args.chunks,
                      "load_avg_1m": os.getloadavg()[0]}))


if __name__ == "__main__":
    main()

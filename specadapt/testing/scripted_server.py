"""A scripted OpenAI-compatible SSE server: a TEST TOOL whose timing and faults are exactly known.

Not an inference server. It streams made-up tokens on a schedule the caller writes, and
fails exactly where told, so tests can hold the probe to the truth (real HTTP on
loopback, a separate process, nothing mocked).

What a request does is written in the request itself: the prompt text (completions) or
the last message's content (chat) is a JSON object, the *script*::

    {"id": "r1", "ttft_ms": 20, "itl_ms": 10, "tokens": 16, "tokens_per_chunk": 1}

Fields (all optional; a prompt that is not a JSON object gets the defaults):
    id                  key of the request in the timing log (default: the prompt text)
    ttft_ms             request received -> first token chunk written
    itl_ms              gap between token chunks
    tokens              output tokens; tokens_per_chunk tokens per chunk (as under
                        speculation: 1 draft of k=3 per chunk, tokens_per_chunk - 1 accepted)
    steps               the engine steps instead, as tokens per step, e.g. [1, 4, 1, 3]: the first
                        is the prefill (one token, no draft), each later one a pass of the target
                        that checked a draft of k=3 and accepted tokens - 1 of it (tokens = their sum)
    steps_per_chunk     engine steps merged into one streamed chunk (default 1: a chunk is a step), as
                        a server with a stream interval above 1 does: the first step goes alone, then
                        each chunk carries the tokens of that many steps, while the /metrics counters
                        still count every step (its draft, its accepted tokens)
    usage               true: cumulative usage on every chunk (vLLM continuous_usage_stats)
    fault               none | stall | disconnect | malformed | no_done | status | trickle | exit
    fault_after         token chunks sent before the fault (default: half)
    status              HTTP status for fault=status (default 503)
    fail_times          fault=status answers that many attempts of this id, then streams normally
    trickle_bytes, trickle_ms   fault=trickle: the whole stream in pieces of n bytes, ms apart
    exit_code           fault=exit: the server process exits with this code mid-stream

Timing truth: chunks are scheduled at absolute times (received + ttft + i * itl) and the
moment each one is handed to the socket is logged with ``time.perf_counter_ns()``
(CLOCK_MONOTONIC, the same clock in every process on the machine). ``GET /_script/log``
returns ``{id: {"recv_ns", "chunk_ns": [...], "done_ns", "attempt", "ttft_ms", "itl_ms"}}`` (chat
requests also ``"messages": [[role, content], ...]``, to check multi-turn histories);
``GET /_script/log?pop=1`` returns the finished entries and forgets them (for long runs).

``GET /metrics`` serves vLLM-named counters that follow the tokens served, one engine step at a time
(a step counts its draft of k=3 and its tokens - 1 accepted, the first ``min(tokens - 1, 3)`` positions;
with ``steps`` the prefill counts no draft); ``POST
/_script/metrics`` with ``{"mode": ...}`` switches them: ``vllm`` (spec counters),
``off`` (no spec counters), ``missing`` (404), ``malformed`` (not Prometheus text),
``reset`` (counters fall back to zero at the next completion request: a restarted server),
``timeline`` (with ``"timeline": {...}``: counters, running batch and latency histograms follow
testing/counter_series.py's simulation from the moment of the POST, whatever the requests).
``"delay_s": x`` in the same POST makes /metrics answer x seconds late (a slow server), or at
once when the next POST to ``/_script/metrics`` comes (it answers the reads held so far); a POST
without ``"mode"`` changes only the delay (the counters and their timeline go on).
``"start": "first-read"`` with a timeline starts its clock at the next /metrics read rather than at
the POST (a watcher that is slow to start still sees the whole timeline from its first read).
``GET /_script/reads`` returns ``{"metrics": n, "timeline_started": wall}``: the /metrics reads
answered so far and the wall time (``time.time()``) at which the timeline's clock started (null
before). ``POST /_script/restart``: every counter falls back to zero now (a restarted server).
``POST /_script/exit`` with ``{"after_reads": n}``: the process exits (code 0) right after it
answered n more /metrics reads (a server that disappears between two reads of a watcher).

Two servers that stall each other: ``--stall-after-other PATH,MS`` given to both, the same PATH.
Each completion request served writes the server's id (its process id) and the time it ended to
PATH; a request whose start finds another server's id there (the other server served last) gets
its first token MS later than its script says (its log entry's ``stalled_ms``). MS 0: the server
writes PATH, so the other one stalls, but never stalls itself.

Run: ``python -m specadapt.testing.scripted_server --port 8123 [--api-key K]
[--ssl-certfile C --ssl-keyfile K] [--stall-after-other PATH,MS]``. Needs uvicorn (``pip install 'specadapt[test]'``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import time
from typing import Any

from specadapt.errors import require

K = 3  # draft tokens per chunk in the counters we serve
MODEL = "scripted"
DEFAULTS: dict[str, Any] = {"ttft_ms": 20.0, "itl_ms": 10.0, "tokens": 16, "tokens_per_chunk": 1,
                            "steps_per_chunk": 1, "usage": True,
                            "fault": None, "status": 503, "fail_times": 10**9, "trickle_bytes": 3,
                            "trickle_ms": 1.0, "exit_code": 7}


class State:
    def __init__(self, api_key: str | None, stall: tuple[str, float] | None = None):
        self.api_key = api_key
        self.stall = stall  # (shared file, ms): stall after the other server's request
        self.log: dict[str, dict[str, Any]] = {}
        self.attempts: dict[str, int] = {}
        self.metrics_mode = "vllm"
        self.base = 1000.0  # counters start high, like a server that has been up a while
        self.drafts = 0  # engine steps that checked a draft
        self.tokens = 0
        self.accepted_per_pos = [0] * K
        self.sim: Any = None  # counter_series.Simulator in timeline mode
        self.sim_t0: float | None = 0.0  # None: the timeline starts at the next /metrics read
        self.sim_t0_wall: float | None = None
        self.metrics_delay_s = 0.0
        self.held: asyncio.Event | None = None  # set: the delayed /metrics reads answer now
        self.metrics_reads = 0
        self.exit_after_reads: int | None = None

    def release_held(self) -> None:
        if self.held is not None:
            self.held.set()
            self.held = None

    def restart(self) -> None:
        """Every counter falls back to zero now (those of the timeline in timeline mode)."""
        if self.metrics_mode == "timeline":
            self.sim.restart()
        else:
            self.base, self.drafts, self.tokens, self.accepted_per_pos = 0.0, 0, 0, [0] * K


def parse_script(text: str) -> dict[str, Any]:
    try:
        script = json.loads(text)
    except ValueError:
        script = None
    if not isinstance(script, dict):
        script = {}
    out = {**DEFAULTS, **script}
    out.setdefault("id", text)
    if "steps" in out:
        out["tokens"] = sum(int(n) for n in out["steps"])
    out.setdefault("fault_after", len(chunk_steps(out)) // 2)
    return out


def engine_steps(s: dict[str, Any]) -> list[tuple[int, bool]]:
    """(tokens, checked a draft) per engine step of a parsed script, in order."""
    if "steps" in s:
        return [(int(n), i > 0) for i, n in enumerate(s["steps"])]
    tokens, per = int(s["tokens"]), int(s["tokens_per_chunk"])
    return [(min(per, tokens - i), True) for i in range(0, tokens, per)]


def chunk_steps(s: dict[str, Any]) -> list[list[tuple[int, bool]]]:
    """The engine steps of each streamed chunk: the first step alone, then ``steps_per_chunk`` at a time."""
    steps, n = engine_steps(s), max(1, int(s["steps_per_chunk"]))
    return [steps[:1]] + [steps[i:i + n] for i in range(1, len(steps), n)] if steps else []


def stall_ms(st: State) -> float:
    """MS when the shared file says another server served the last request, else 0."""
    if st.stall is None:
        return 0.0
    try:
        with open(st.stall[0]) as fh:
            last = fh.read().split()
    except OSError:
        return 0.0
    return st.stall[1] if last and last[0] != str(os.getpid()) else 0.0


def mark_served(st: State) -> None:
    """This server served the last request: its id and the end time into the shared file (atomically)."""
    if st.stall is None:
        return
    tmp = f"{st.stall[0]}.{os.getpid()}.tmp"
    with open(tmp, "w") as fh:
        fh.write(f"{os.getpid()} {time.perf_counter_ns()}\n")
    os.replace(tmp, st.stall[0])


def parse_stall(value: str) -> tuple[str, float]:
    """'PATH,MS' -> (PATH, MS)."""
    path, _, ms = value.rpartition(",")
    try:
        if path:
            return path, float(ms)
    except ValueError:
        pass
    raise argparse.ArgumentTypeError(f"--stall-after-other {value!r}: give PATH,MS")


def metrics_text(st: State) -> tuple[int, str]:
    if st.metrics_mode == "timeline":
        if st.sim_t0 is None:  # "start": "first-read"
            st.sim_t0, st.sim_t0_wall = time.monotonic(), time.time()
        return 200, st.sim.metrics_text(time.monotonic() - st.sim_t0, MODEL)
    if st.metrics_mode == "missing":
        return 404, "not found"
    if st.metrics_mode == "malformed":
        return 200, "vllm:generation_tokens_total{engine=\"0\" 12 oops\n<html>not metrics</html>\n"
    lab = 'engine="0",model_name="scripted"'
    lines = ["# TYPE vllm:generation_tokens_total counter",
             f"vllm:generation_tokens_total{{{lab}}} {st.base + st.tokens}"]
    if st.metrics_mode in ("vllm", "reset"):
        lines += ["# TYPE vllm:spec_decode_num_drafts_total counter",
                  f"vllm:spec_decode_num_drafts_total{{{lab}}} {st.base + st.drafts}",
                  "# TYPE vllm:spec_decode_num_draft_tokens_total counter",
                  f"vllm:spec_decode_num_draft_tokens_total{{{lab}}} {K * (st.base + st.drafts)}",
                  "# TYPE vllm:spec_decode_num_accepted_tokens_total counter",
                  f"vllm:spec_decode_num_accepted_tokens_total{{{lab}}} "
                  f"{st.base + sum(st.accepted_per_pos)}",
                  "# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter"]
        lines += [f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{lab},position="{i}"}} '
                  f"{(st.base / K if i == 0 else 0) + n}" for i, n in enumerate(st.accepted_per_pos)]
    return 200, "\n".join(lines) + "\n"


def chunk_bytes(api: str, text: str, n_tokens: int, cumulative: int | None, finish: str | None) -> bytes:
    if api == "chat":
        choice: dict[str, Any] = {"index": 0, "delta": {"content": text}, "finish_reason": finish,
                                  "logprobs": {"content": [{"token": "t", "logprob": -0.5, "top_logprobs": []}
                                                           for _ in range(n_tokens)]}}
    else:
        choice = {"index": 0, "text": text, "finish_reason": finish,
                  "logprobs": {"tokens": ["t"] * n_tokens, "token_logprobs": [-0.5] * n_tokens,
                               "top_logprobs": None}}
    body: dict[str, Any] = {"id": "cmpl-scripted", "object": "chunk", "model": MODEL, "choices": [choice]}
    if cumulative is not None:
        body["usage"] = {"prompt_tokens": 5, "completion_tokens": cumulative, "total_tokens": 5 + cumulative}
    return b"data: " + json.dumps(body).encode() + b"\n\n"


async def _read_body(receive) -> bytes:
    body = b""
    while True:
        msg = await receive()
        body += msg.get("body", b"")
        if not msg.get("more_body"):
            return body


async def _respond(send, status: int, payload: Any, content_type: bytes = b"application/json") -> None:
    data = payload if isinstance(payload, bytes) else (
        payload.encode() if isinstance(payload, str) else json.dumps(payload).encode())
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", content_type), (b"content-length", str(len(data)).encode())]})
    await send({"type": "http.response.body", "body": data})


def make_app(st: State):
    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        path, method = scope["path"], scope["method"]
        if path in ("/v1/models", "/v1/completions", "/v1/chat/completions") and st.api_key:
            auth = dict(scope["headers"]).get(b"authorization", b"").decode()
            if auth != f"Bearer {st.api_key}":
                return await _respond(send, 401, {"error": {"message": "missing or wrong API key"}})
        if path == "/health":
            return await _respond(send, 200, "")
        if path == "/version":
            return await _respond(send, 200, {"version": "scripted-1"})
        if path == "/v1/models":
            return await _respond(send, 200, {"object": "list", "data": [
                {"id": MODEL, "object": "model", "root": MODEL, "max_model_len": 4096}]})
        if path == "/metrics":
            if st.metrics_delay_s:
                if st.held is None:
                    st.held = asyncio.Event()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(st.held.wait(), st.metrics_delay_s)
            code, text = metrics_text(st)
            await _respond(send, code, text, b"text/plain; version=0.0.4")
            st.metrics_reads += 1
            if st.exit_after_reads is not None:
                st.exit_after_reads -= 1
                if st.exit_after_reads <= 0:  # the answer is in the socket's buffer: the client gets it
                    os._exit(0)
            return None
        if path == "/_script/reads":
            return await _respond(send, 200, {"metrics": st.metrics_reads, "timeline_started": st.sim_t0_wall})
        if path == "/_script/restart" and method == "POST":
            st.restart()
            return await _respond(send, 200, {"restarted": True})
        if path == "/_script/exit" and method == "POST":
            st.exit_after_reads = int(json.loads(await _read_body(receive)).get("after_reads", 1))
            return await _respond(send, 200, {"exit_after_reads": st.exit_after_reads})
        if path == "/_script/log":
            if scope.get("query_string") == b"pop=1":  # finished entries, then forget them (long runs)
                done = {k: v for k, v in st.log.items() if v["done_ns"] is not None}
                for k in done:
                    del st.log[k]
                return await _respond(send, 200, done)
            return await _respond(send, 200, st.log)
        if path == "/_script/metrics" and method == "POST":
            body = json.loads(await _read_body(receive))
            st.metrics_delay_s = float(body.get("delay_s", 0.0))
            st.release_held()  # the reads held by the former delay answer now
            if "mode" not in body:  # only the delay changes
                return await _respond(send, 200, {"mode": st.metrics_mode})
            st.metrics_mode = body["mode"]
            if st.metrics_mode == "timeline":
                from specadapt.testing.counter_series import Simulator, Timeline

                st.sim = Simulator(Timeline.model_validate(body.get("timeline", {})))
                first_read = body.get("start") == "first-read"
                st.sim_t0 = None if first_read else time.monotonic()
                st.sim_t0_wall = None if first_read else time.time()
            return await _respond(send, 200, {"mode": st.metrics_mode})
        if path in ("/v1/completions", "/v1/chat/completions") and method == "POST":
            recv_ns = time.perf_counter_ns()
            return await _stream(st, json.loads(await _read_body(receive)), path, recv_ns, send)
        return await _respond(send, 404, {"error": "no such route"})

    return app


async def _stream(st: State, req: dict[str, Any], path: str, recv_ns: int, send) -> None:
    api = "chat" if path.endswith("chat/completions") else "completions"
    text = req["messages"][-1]["content"] if api == "chat" else req["prompt"]
    s = parse_script(text)
    key = str(s["id"])
    attempt = st.attempts.get(key, 0) + 1
    st.attempts[key] = attempt
    stalled = stall_ms(st)
    entry: dict[str, Any] = {"recv_ns": recv_ns, "chunk_ns": [], "done_ns": None, "attempt": attempt,
                             "ttft_ms": s["ttft_ms"], "itl_ms": s["itl_ms"], "stalled_ms": stalled}
    if api == "chat":  # what a multi-turn request carried: [role, content] per message
        entry["messages"] = [[m.get("role"), m.get("content")] for m in req["messages"]]
    st.log[key] = entry
    if st.metrics_mode == "reset" and st.base:
        st.base, st.drafts, st.tokens, st.accepted_per_pos = 0.0, 0, 0, [0] * K
    fault = s["fault"]
    if fault == "status" and attempt <= int(s["fail_times"]):
        mark_served(st)
        return await _respond(send, int(s["status"]), {"error": {"message": f"scripted {s['status']}"}})
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]})
    tokens = int(s["tokens"])
    chunks = chunk_steps(s)
    pieces = []  # fault=trickle sends everything at the end, in small pieces
    t_first = recv_ns / 1e9 + (s["ttft_ms"] + stalled) / 1e3
    sent = 0
    for i, steps in enumerate(chunks):
        n = sum(t for t, _ in steps)
        if fault and fault not in ("status", "trickle") and i == s["fault_after"]:
            if fault == "stall":
                await asyncio.sleep(3600)
            if fault == "disconnect":
                raise ConnectionAbortedError("scripted disconnect")  # the server drops the connection
            if fault == "malformed":
                await send({"type": "http.response.body", "body": b"data: {this is not json\n\n", "more_body": True})
                continue
            if fault == "no_done":
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                return
            if fault == "exit":
                os._exit(int(s["exit_code"]))
        delay = t_first + i * s["itl_ms"] / 1e3 - time.perf_counter_ns() / 1e9
        if delay > 0 and fault != "trickle":
            await asyncio.sleep(delay)
        sent += n
        last = i == len(chunks) - 1
        data = chunk_bytes(api, "x" * n, n, sent if s["usage"] else None, "length" if last else None)
        if fault == "trickle":
            pieces.append(data)
            continue
        entry["chunk_ns"].append(time.perf_counter_ns())  # handed to the socket now
        await send({"type": "http.response.body", "body": data, "more_body": True})
        for t, drafted in steps:  # the counters count engine steps, whatever the chunks merged
            st.drafts, st.tokens = st.drafts + drafted, st.tokens + t
            for p in range(min(t - 1, K)):
                st.accepted_per_pos[p] += 1
    tail = b"data: [DONE]\n\n"
    if fault == "trickle":
        blob, step = b"".join(pieces) + tail, int(s["trickle_bytes"])
        for j in range(0, len(blob), step):
            await send({"type": "http.response.body", "body": blob[j:j + step], "more_body": True})
            await asyncio.sleep(s["trickle_ms"] / 1e3)
        st.tokens += tokens
        tail = b""
    entry["done_ns"] = time.perf_counter_ns()
    mark_served(st)
    await send({"type": "http.response.body", "body": tail, "more_body": False})


def serve(host: str, port: int, api_key: str | None = None, ssl_certfile: str | None = None,
          ssl_keyfile: str | None = None, stall: tuple[str, float] | None = None) -> None:
    uvicorn = require("uvicorn", "test", "The scripted test server")
    config = uvicorn.Config(make_app(State(api_key, stall)), host=host, port=port, log_level="warning",
                            access_log=False, lifespan="off", ssl_certfile=ssl_certfile,
                            ssl_keyfile=ssl_keyfile, timeout_keep_alive=30, backlog=4096)
    uvicorn.Server(config).run()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Scripted OpenAI-compatible SSE server (a test tool).")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--api-key")
    ap.add_argument("--ssl-certfile")
    ap.add_argument("--ssl-keyfile")
    ap.add_argument("--stall-after-other", type=parse_stall, metavar="PATH,MS",
                    help="Stall MS ms before the first token when another server (the same PATH) served last.")
    args = ap.parse_args(argv)
    serve(args.host, args.port, args.api_key, args.ssl_certfile, args.ssl_keyfile, args.stall_after_other)


if __name__ == "__main__":
    main()

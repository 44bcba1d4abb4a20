"""`reference serve` over real HTTP (uvicorn on loopback): streaming, metrics, faults."""

from __future__ import annotations

import json
import socket
import threading
import time
from contextlib import contextmanager

import httpx
import pytest

from specadapt.native_reference.engine import SpecEngine
from specadapt.native_reference.runtime import open_reference

PROMPT = "def add(a, b):\n    return a + b\n\ndef add(a, b):\n"
MAX = 24


APPS: dict = {}  # base URL -> the app serving it (tests read its scheduler)


@contextmanager
def serving(ref, **app_options):
    import uvicorn

    from specadapt.native_reference.server import build_app

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    app = build_app(ref, **app_options)
    APPS[f"http://127.0.0.1:{port}"] = app
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started:
            assert time.monotonic() < deadline, "server did not start"
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def stream_completion(base, body, path="/v1/completions"):
    chunks = []
    with httpx.stream("POST", f"{base}{path}", json={**body, "stream": True}, timeout=60) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[6:]))
    return chunks


def chunk_ids(chunk):
    lp = chunk["choices"][0]["logprobs"] if chunk["choices"] else None
    return [int(t.split(":")[1]) for t in lp["tokens"]] if lp else []


def counters(base) -> dict:
    out = {}
    for line in httpx.get(f"{base}/metrics").text.splitlines():
        if line.startswith("vllm:"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def counter(values, name, **labels):
    hits = [v for k, v in values.items() if k.startswith(name + "{") and all(f'{a}="{b}"' in k for a, b in labels.items())]
    assert len(hits) == 1, (name, labels, values)
    return hits[0]


@pytest.fixture(scope="module")
def ref(tiny_dirs):
    target, draft, _ = tiny_dirs
    return open_reference(target, draft, k=3, dtype="float64")


def test_stream_equals_library_and_metrics_equal_stats(ref):
    ids = ref.encode(PROMPT)
    library = SpecEngine(ref.engine.target.model).generate(ids, MAX)  # the target alone
    spec = SpecEngine(ref.engine.target.model, ref.engine.proposer, 3).generate(ids, MAX)
    with serving(ref) as base:
        models = httpx.get(f"{base}/v1/models").json()
        assert models["data"][0]["id"] == ref.model_name
        before = counters(base)
        body = {"model": ref.model_name, "prompt": PROMPT, "max_tokens": MAX, "temperature": 0,
                "logprobs": 1, "return_tokens_as_token_ids": True, "ignore_eos": True,
                "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
        chunks = stream_completion(base, body)
        after = counters(base)
    streamed = [t for c in chunks for t in chunk_ids(c)]
    assert streamed == library.tokens
    # one chunk per engine step, several tokens in some, and cumulative usage on every chunk
    per_chunk = [len(chunk_ids(c)) for c in chunks if chunk_ids(c)]
    assert per_chunk == [len(s.tokens) for s in spec.steps]
    assert max(per_chunk) > 1
    usage = [c["usage"]["completion_tokens"] for c in chunks]
    assert usage == sorted(usage) and usage[-1] == MAX and chunks[-1]["choices"] == []
    assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == ref.decode(library.tokens)
    s = spec.stats
    delta = lambda name, **kw: counter(after, name, **kw) - counter(before, name, **kw)  # noqa: E731
    assert delta("vllm:spec_decode_num_drafts_total") == s.num_drafts
    assert delta("vllm:spec_decode_num_draft_tokens_total") == s.draft_tokens
    assert delta("vllm:spec_decode_num_accepted_tokens_total") == s.accepted_tokens
    for i in range(3):
        assert delta("vllm:spec_decode_num_accepted_tokens_per_pos_total", position=str(i)) == s.accepted_per_pos[i]
    assert delta("vllm:generation_tokens_total") == MAX
    assert delta("vllm:prompt_tokens_total") == len(ids)
    assert 0 < s.accepted_tokens < s.draft_tokens


def test_chat_and_non_stream_and_sampling(ref):
    with serving(ref) as base:
        r = httpx.post(f"{base}/v1/chat/completions", timeout=60, json={
            "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "temperature": 0,
            "logprobs": True, "top_logprobs": 2})
        assert r.status_code == 200
        body = r.json()
        content = body["choices"][0]["logprobs"]["content"]
        assert len(content) == body["usage"]["completion_tokens"] == 8
        assert all(len(c["top_logprobs"]) == 2 and c["top_logprobs"][0]["logprob"] >= c["logprob"] for c in content)
        sampled = [httpx.post(f"{base}/v1/completions", timeout=60, json={
            "prompt": PROMPT, "max_tokens": 8, "temperature": 1.0, "seed": s}).json()["choices"][0]["text"]
            for s in (1, 1, 2)]
        assert sampled[0] == sampled[1]
        streamed = []
        with httpx.stream("POST", f"{base}/v1/chat/completions", timeout=60, json={
                "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "temperature": 0,
                "stream": True}) as r:
            for line in r.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    streamed.append(json.loads(line[6:]))
        assert streamed[0]["choices"][0]["delta"]["role"] == "assistant"
        assert all(c["object"] == "chat.completion.chunk" for c in streamed)
        text = "".join(c["choices"][0]["delta"].get("content", "") for c in streamed)
        assert text == body["choices"][0]["message"]["content"]
        assert streamed[-1]["choices"][0]["finish_reason"] == body["choices"][0]["finish_reason"]
        bad = httpx.post(f"{base}/v1/completions", json={"model": "nope", "prompt": "x"})
        assert bad.status_code == 404 and "not served" in bad.json()["error"]["message"]
        assert httpx.get(f"{base}/version").json()["speculative_method"] == "draft_model"
        hot = httpx.post(f"{base}/v1/completions", json={"prompt": "x", "temperature": "hot"})
        assert hot.status_code == 400
        empty = httpx.post(f"{base}/v1/completions", json={"prompt": ""})
        assert empty.status_code == 400 and "empty" in empty.json()["error"]["message"]


@pytest.mark.parametrize("fault", ["accept-always", "drop-bonus", "perturb-logits=5"])
def test_faults_have_their_effect(tiny_dirs, fault):
    target, draft, _ = tiny_dirs
    ref = open_reference(target, draft if fault != "drop-bonus" else target, k=3, dtype="float64", fault=fault)
    ids = ref.encode(PROMPT)
    truth = SpecEngine(ref.engine.target.model).generate(ids, MAX).tokens
    body = {"prompt": PROMPT, "max_tokens": MAX, "temperature": 0, "logprobs": 0,
            "return_tokens_as_token_ids": True, "ignore_eos": True}
    with serving(ref) as base:
        chunks = stream_completion(base, body)
        metrics = counters(base)
    got = [t for c in chunks for t in chunk_ids(c)]
    if fault == "drop-bonus":
        assert got == truth  # output kept, throughput lost: never more than k tokens a step
        assert max(len(chunk_ids(c)) for c in chunks) == 3
        assert counter(metrics, "vllm:spec_decode_num_accepted_tokens_total") == counter(
            metrics, "vllm:spec_decode_num_draft_tokens_total")
    else:
        assert got != truth


def test_serve_cli_fault_and_max_logprobs(tiny_dirs, monkeypatch):
    """`reference serve --fault draft-temperature=0.5` (alias of --inject-fault) reaches the
    draft's sampler, --max-logprobs the server; with --ngram the fault is refused in one
    line (exit 2), as is a --max-logprobs below -1."""
    from click.testing import CliRunner

    from specadapt.cli import cli
    from specadapt.native_reference import server

    target, draft, _ = tiny_dirs
    calls = []
    monkeypatch.setattr(server, "run_server", lambda ref, *args: calls.append((ref, args)))

    def serve(*args):
        return CliRunner().invoke(cli, ["reference", "serve", "--target", str(target), *args],
                                  catch_exceptions=False)

    res = serve("--draft", str(draft), "--fault", "draft-temperature=0.5", "--max-logprobs", "7")
    assert res.exit_code == 0, res.output
    assert "fault injection 'draft-temperature=0.5' is ON" in res.output
    (ref, args), = calls
    assert ref.engine.fault.kind == "draft-temperature" and ref.engine.proposer.sample_temperature_factor == 0.5
    assert args[-1] == 7
    res = serve("--ngram", "--fault", "draft-temperature=0.5")
    assert res.exit_code == 2 and "draft-temperature fault needs a draft model" in res.output
    assert "Traceback" not in res.output
    res = serve("--ngram", "--max-logprobs", "-2")
    assert res.exit_code == 2 and "--max-logprobs" in res.output
    assert len(calls) == 1

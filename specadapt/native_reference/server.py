"""The reference engine as an OpenAI-compatible HTTP server (starlette + uvicorn).

Endpoints: /v1/models, /v1/completions, /v1/chat/completions (streaming and not,
greedy and sampling, logprobs), /version, /health and /metrics (Prometheus text with
vLLM's spec-decode counter names, so the same probes read both). Requests run one at a
time behind an asyncio lock; a streamed response sends one chunk per engine step, so a
chunk may carry several tokens, as vLLM's does.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from specadapt import __version__
from specadapt.errors import SpecadaptError
from specadapt.native_reference.engine import SpecStats, Step
from specadapt.native_reference.runtime import Reference
from specadapt.native_reference.sampling import SamplingParams

_SENTINEL = object()


class BadRequest(Exception):
    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


class Metrics:
    """Prometheus counters named as vLLM names them (labels model_name, engine)."""

    def __init__(self, model_name: str, k: int, speculative: bool):
        self.registry = CollectorRegistry(auto_describe=True)
        labels = {"model_name": model_name, "engine": "0"}
        names = ["model_name", "engine"]

        def counter(name: str, doc: str, extra: list[str] | None = None) -> Counter:
            return Counter(name, doc, names + (extra or []), registry=self.registry)

        self.prompt = counter("vllm:prompt_tokens", "Prompt tokens processed.").labels(**labels)
        self.generation = counter("vllm:generation_tokens", "Generated tokens.").labels(**labels)
        self.spec = speculative
        if speculative:
            self.drafts = counter("vllm:spec_decode_num_drafts", "Verify passes with drafts.").labels(**labels)
            self.draft_tokens = counter("vllm:spec_decode_num_draft_tokens", "Draft tokens proposed.").labels(**labels)
            self.accepted = counter("vllm:spec_decode_num_accepted_tokens", "Draft tokens accepted.").labels(**labels)
            per_pos = counter("vllm:spec_decode_num_accepted_tokens_per_pos",
                              "Draft tokens accepted at each position.", ["position"])
            self.per_pos = [per_pos.labels(**labels, position=str(i)) for i in range(k)]

    def record(self, stats: SpecStats) -> None:
        self.prompt.inc(stats.prompt_tokens)
        self.generation.inc(stats.generated_tokens)
        if self.spec:
            self.drafts.inc(stats.num_drafts)
            self.draft_tokens.inc(stats.draft_tokens)
            self.accepted.inc(stats.accepted_tokens)
            for counter, n in zip(self.per_pos, stats.accepted_per_pos):
                counter.inc(n)


@dataclass
class ServerState:
    ref: Reference
    model_name: str
    metrics: Metrics
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    totals: SpecStats = field(default_factory=SpecStats)
    max_model_len: int = 2048


@dataclass
class Job:
    """One parsed request: what to generate and how to render it."""

    prompt: list[int]
    max_tokens: int
    params: SamplingParams
    stream: bool
    include_usage: bool
    continuous_usage: bool
    logprobs: bool
    top_logprobs: int
    ids_as_tokens: bool
    seed: int | None
    ignore_eos: bool
    chat: bool


def build_app(ref: Reference, model_name: str | None = None) -> Starlette:
    name = model_name or ref.model_name
    cfg = ref.engine.target.model.config
    state = ServerState(ref, name, Metrics(name, ref.engine.k, ref.engine.proposer is not None),
                        totals=SpecStats(k=ref.engine.k),
                        max_model_len=int(getattr(cfg, "max_position_embeddings", 2048) or 2048))

    async def models(request: Request) -> JSONResponse:
        return JSONResponse({"object": "list", "data": [{
            "id": name, "object": "model", "created": int(time.time()), "owned_by": "specadapt",
            "root": str(ref.target_dir), "max_model_len": state.max_model_len}]})

    async def version(request: Request) -> JSONResponse:
        return JSONResponse({"version": __version__, "server": "specadapt-reference",
                             "speculative_method": ref.method, "num_speculative_tokens": ref.engine.k})

    async def health(request: Request) -> Response:
        return Response(status_code=200)

    async def metrics(request: Request) -> Response:
        return Response(generate_latest(state.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    async def completions(request: Request) -> Response:
        return await _handle(state, request, chat=False)

    async def chat(request: Request) -> Response:
        return await _handle(state, request, chat=True)

    routes = [Route("/v1/models", models), Route("/version", version), Route("/health", health),
              Route("/metrics", metrics), Route("/v1/completions", completions, methods=["POST"]),
              Route("/v1/chat/completions", chat, methods=["POST"])]
    app = Starlette(routes=routes)
    app.state.reference = state
    return app


def _error(message: str, status: int) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": "BadRequestError", "code": status}},
                        status_code=status)


async def _handle(state: ServerState, request: Request, chat: bool) -> Response:
    try:
        body = await request.json()
        job = _parse(state, body, chat)
    except json.JSONDecodeError:
        return _error("the request body is not JSON", 400)
    except BadRequest as err:
        return _error(str(err), err.status)
    except (SpecadaptError, TypeError, ValueError) as err:  # e.g. no chat template, "temperature": "hot"
        return _error(f"bad request: {err}", 400)
    rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
    if job.stream:
        return StreamingResponse(_stream(state, job, rid), media_type="text/event-stream")
    async with state.lock:
        steps, stats = await asyncio.to_thread(_run_all, state, job)
    tokens = [t for s in steps for t in s.tokens]
    choice = _choice(state, job, steps, state.ref.decode(tokens), _finish(state, job, tokens), final=True)
    return JSONResponse({"id": rid, "object": "chat.completion" if chat else "text_completion",
                         "created": int(time.time()), "model": state.model_name, "choices": [choice],
                         "usage": _usage(len(job.prompt), len(tokens))})


def _parse(state: ServerState, body: dict, chat: bool) -> Job:
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    model = body.get("model")
    if model not in (None, state.model_name):
        raise BadRequest(f"model {model!r} is not served here; this server serves {state.model_name!r}", 404)
    if body.get("n", 1) != 1:
        raise BadRequest("only n = 1 is supported")
    ref = state.ref
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("'messages' must be a non-empty list")
        prompt = ref.encode_messages(messages)
    else:
        raw = body.get("prompt")
        if isinstance(raw, list) and len(raw) == 1 and isinstance(raw[0], str):
            raw = raw[0]
        if isinstance(raw, str):
            prompt = ref.encode(raw)
        elif isinstance(raw, list) and raw and all(isinstance(t, int) for t in raw):
            prompt = list(raw)
        else:
            raise BadRequest("'prompt' must be a string or a list of token ids")
    if not prompt:
        raise BadRequest("the prompt is empty")
    limit = state.max_model_len - len(prompt) - ref.engine.k - 1
    max_tokens = body.get("max_completion_tokens") or body.get("max_tokens") or (limit if chat else 16)
    if not isinstance(max_tokens, int) or max_tokens < 1:
        raise BadRequest("'max_tokens' must be a positive integer")
    if max_tokens > limit:
        raise BadRequest(f"prompt ({len(prompt)} tokens) plus max_tokens ({max_tokens}) exceed "
                         f"the model length {state.max_model_len}")
    temperature = body.get("temperature")
    params = SamplingParams(float(1.0 if temperature is None else temperature),
                            int(body.get("top_k") or 0) if (body.get("top_k") or 0) > 0 else 0,
                            float(1.0 if body.get("top_p") is None else body["top_p"]))
    if chat:
        logprobs, top = bool(body.get("logprobs")), int(body.get("top_logprobs") or 0)
    else:
        lp = body.get("logprobs")
        logprobs, top = lp is not None, int(lp or 0)
    options = body.get("stream_options") or {}
    return Job(prompt, max_tokens, params, bool(body.get("stream")), bool(options.get("include_usage")),
               bool(options.get("continuous_usage_stats")), logprobs, top,
               bool(body.get("return_tokens_as_token_ids")), body.get("seed"),
               bool(body.get("ignore_eos")), chat)


def _steps(state: ServerState, job: Job, stats: SpecStats):
    engine = state.ref.engine
    if job.seed is not None:
        engine.seed(int(job.seed))
    stop = () if job.ignore_eos else state.ref.stop_ids
    return engine.stream(job.prompt, job.max_tokens, job.params, stop, job.top_logprobs, stats)


def _record(state: ServerState, stats: SpecStats) -> None:
    state.metrics.record(stats)
    state.totals.add(stats)


def _run_all(state: ServerState, job: Job) -> tuple[list[Step], SpecStats]:
    stats = SpecStats(k=state.ref.engine.k)
    steps = list(_steps(state, job, stats))
    _record(state, stats)
    return steps, stats


async def _stream(state: ServerState, job: Job, rid: str):
    created = int(time.time())
    kind = "chat.completion.chunk" if job.chat else "text_completion"

    def chunk(choices: list, usage: dict | None = None) -> str:
        body = {"id": rid, "object": kind, "created": created, "model": state.model_name, "choices": choices}
        if usage is not None:
            body["usage"] = usage
        return f"data: {json.dumps(body)}\n\n"

    async with state.lock:
        stats = SpecStats(k=state.ref.engine.k)
        it = _steps(state, job, stats)
        tokens: list[int] = []
        sent_text = ""
        if job.chat:
            yield chunk([{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                          "finish_reason": None}], _usage(len(job.prompt), 0) if job.continuous_usage else None)
        try:
            while True:
                step = await asyncio.to_thread(next, it, _SENTINEL)
                if step is _SENTINEL:
                    break
                tokens.extend(step.tokens)
                text = state.ref.decode(tokens)
                if text.endswith("\ufffd"):  # an unfinished multi-byte character: wait
                    text = sent_text
                delta, sent_text = text[len(sent_text):], text
                choice = _choice(state, job, [step], delta, None, final=False)
                usage = _usage(len(job.prompt), len(tokens)) if job.continuous_usage else None
                yield chunk([choice], usage)
        finally:
            _record(state, stats)
        text = state.ref.decode(tokens)
        last = _choice(state, job, [], text[len(sent_text):], _finish(state, job, tokens), final=False)
        yield chunk([last], _usage(len(job.prompt), len(tokens)) if job.continuous_usage else None)
        if job.include_usage:
            yield chunk([], _usage(len(job.prompt), len(tokens)))
        yield "data: [DONE]\n\n"


def _finish(state: ServerState, job: Job, tokens: list[int]) -> str:
    stop = () if job.ignore_eos else state.ref.stop_ids
    return "stop" if tokens and tokens[-1] in stop else "length"


def _usage(prompt: int, completion: int) -> dict:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _token_text(state: ServerState, job: Job, tid: int) -> str:
    return f"token_id:{tid}" if job.ids_as_tokens else state.ref.tokenizer.decode([tid])


def _choice(state: ServerState, job: Job, steps: list[Step], text: str, finish: str | None, final: bool) -> dict:
    toks = [(t, lp, top) for s in steps for t, lp, top in
            zip(s.tokens, s.logprobs, s.top_logprobs or [[]] * len(s.tokens))]
    logprobs = _logprobs(state, job, toks) if job.logprobs and (toks or final) else None
    if job.chat:
        key = "message" if final else "delta"
        content = {"role": "assistant", "content": text} if final else ({"content": text} if text else {})
        return {"index": 0, key: content, "logprobs": logprobs, "finish_reason": finish}
    return {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish}


def _logprobs(state: ServerState, job: Job, toks: list) -> dict:
    name = lambda tid: _token_text(state, job, tid)  # noqa: E731
    if job.chat:
        return {"content": [{"token": name(t), "logprob": lp, "bytes": list(name(t).encode()),
                             "top_logprobs": [{"token": name(i), "logprob": v, "bytes": list(name(i).encode())}
                                              for i, v in top]} for t, lp, top in toks]}
    return {"tokens": [name(t) for t, _, _ in toks], "token_logprobs": [lp for _, lp, _ in toks],
            "top_logprobs": [{name(i): v for i, v in top} for _, _, top in toks] if job.top_logprobs else None,
            "text_offset": []}


def run_server(ref: Reference, host: str, port: int, model_name: str | None = None) -> None:
    import uvicorn

    uvicorn.run(build_app(ref, model_name), host=host, port=port, log_level="warning")

"""The reference engine as an OpenAI-compatible HTTP server (starlette + uvicorn).

Endpoints: /v1/models, /v1/completions, /v1/chat/completions (streaming and not,
greedy and sampling, logprobs, vLLM's prompt_logprobs), /tokenize and /detokenize (vLLM's
shapes), /version, /health and /metrics (Prometheus text with
vLLM's spec-decode counter names, updated every engine step, so the same probes read
both). Concurrent requests are batched: one worker thread owns the engine; requests join
the batch and leave it between steps (continuous batching), up to ``max_num_seqs`` at a
time, the rest wait in arrival order. A streamed response sends one chunk per engine step,
so a chunk may carry several tokens, as vLLM's does. A client that goes away is taken out
of the batch before the next step; no other request ever sees its state. With speculation
(k >= 1) every answer carries the request's own counts in vLLM 0.32's
``--per-request-spec-decode-metrics detailed`` shape (``metrics.speculative_decoding``: the
summary and the accepted and proposed tokens of each verify pass, see ``SpecTally``), adding up
to the /metrics counters; a stream carries them on its final usage chunk.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import queue
import threading
import time
import uuid
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from specadapt import __version__
from specadapt.errors import SpecadaptError
from specadapt.native_reference.detok import IncrementalDetokenizer
from specadapt.native_reference.engine import Row, Step
from specadapt.native_reference.models import vocab_size
from specadapt.native_reference.runtime import Reference
from specadapt.native_reference.sampling import SamplingParams
from specadapt.native_reference.stops import StopStrings

log = logging.getLogger("specadapt.reference.server")
_DONE = object()


class BadRequest(Exception):
    def __init__(self, message: str, status: int = 400, param: str | None = None):
        super().__init__(message)
        self.status = status
        self.param = param


def _invalid(message: str, param: str, value: object = None) -> BadRequest:
    """A 400 worded as vLLM words a VLLMValidationError: the message, then the parameter
    (and the value, when there is one) in brackets; ``param`` set in the error body."""
    extras = f"parameter={param}" + ("" if value is None else f", value={value}")
    return BadRequest(f"{message} ({extras})", param=param)


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

        self.running = Gauge("vllm:num_requests_running", "Requests in the running batch.", names,
                             registry=self.registry).labels(**labels)
        self.waiting = Gauge("vllm:num_requests_waiting", "Requests waiting to join the batch.", names,
                             registry=self.registry).labels(**labels)

    def record_prompt(self, tokens: int) -> None:
        self.prompt.inc(tokens)

    def record_step(self, step: Step) -> None:
        """One row's share of one engine step (vLLM counts per request per step too)."""
        self.generation.inc(len(step.tokens))
        if self.spec and step.proposed:
            self.drafts.inc()
            self.draft_tokens.inc(len(step.proposed))
            self.accepted.inc(step.accepted)
            for counter in self.per_pos[:step.accepted]:
                counter.inc()


class SpecTally:
    """One request's speculation counts, as vLLM's ``SpeculativeDecodingMetrics`` (vLLM 0.32,
    ``--per-request-spec-decode-metrics detailed``, vllm/v1/metrics/stats.py
    ``RequestSpecDecodeMetrics``): fed the request's Steps, it counts what ``Metrics.record_step``
    counts for them, so per-request sums equal the counter deltas, and keeps each verify step's
    accepted and proposed counts in order (``per_step_accepted`` / ``per_step_drafted``, sent only
    when there is at least one, as vLLM). A step without proposed tokens is no spec step (vLLM
    observes none for it)."""

    def __init__(self, k: int):
        self.k = k
        self.histogram = [0] * (k + 1)  # index j: verify steps that accepted exactly j drafts
        self.draft_tokens = 0
        self.accepted = 0
        self.per_step_accepted: list[int] = []
        self.per_step_drafted: list[int] = []

    def add(self, step: Step) -> None:
        if not step.proposed:
            return
        if step.accepted >= len(self.histogram):  # never with k the engine's (drafts <= k)
            self.histogram += [0] * (step.accepted + 1 - len(self.histogram))
        self.histogram[step.accepted] += 1
        self.draft_tokens += len(step.proposed)
        self.accepted += step.accepted
        self.per_step_accepted.append(step.accepted)
        self.per_step_drafted.append(len(step.proposed))

    def as_dict(self) -> dict:
        steps = sum(self.histogram)
        out = {"mean_acceptance_length": 1.0 + self.accepted / steps if steps else 1.0,
               "draft_acceptance_rate": self.accepted / self.draft_tokens if self.draft_tokens else 0.0,
               "acceptance_histogram": list(self.histogram), "num_spec_steps": steps,
               "num_accepted_draft_tokens": self.accepted, "num_draft_tokens": self.draft_tokens,
               "num_spec_tokens": self.k}
        if self.per_step_accepted:
            out["per_step_accepted"] = list(self.per_step_accepted)
            out["per_step_drafted"] = list(self.per_step_drafted)
        return out


class Ticket:
    """One request's place in the batch: the worker puts its Steps (then _DONE, or an
    exception) on ``events`` through the event loop; ``cancel`` takes it out."""

    def __init__(self, job: Job, loop: asyncio.AbstractEventLoop):
        self.job = job
        self.loop = loop
        self.events: asyncio.Queue = asyncio.Queue()
        self.cancelled = False
        self.row: Row | None = None

    def put(self, item: object) -> None:
        self.loop.call_soon_threadsafe(self.events.put_nowait, item)


class Scheduler:
    """Continuous batching: one thread owns the engine; between two steps it takes new
    requests in (each prefilled alone, which gives its first token), drops finished and
    cancelled ones, then runs one step for the whole batch. Nothing else touches the
    engine, so a request that is cancelled mid-step cannot leave state behind: its row
    is removed before the next step starts."""

    def __init__(self, ref: Reference, metrics: Metrics, max_num_seqs: int = 16):
        self.ref = ref
        self.engine = ref.engine
        self.metrics = metrics
        self.max_num_seqs = max_num_seqs
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.waiting: list[Ticket] = []
        self.running: dict[int, Ticket] = {}  # id(row) -> ticket
        self.steps = 0  # engine steps run (for tests and /version)
        self.batch_sizes: dict[int, int] = {}  # batch size -> steps run at that size
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="reference-engine", daemon=True)

    def start(self) -> None:
        if not self.thread.is_alive():
            self.thread.start()

    def stop(self) -> None:
        self._stop.set()
        self.inbox.put(None)
        if self.thread.is_alive():
            self.thread.join(timeout=30)

    def submit(self, ticket: Ticket) -> None:
        self.inbox.put(ticket)

    def cancel(self, ticket: Ticket) -> None:
        ticket.cancelled = True
        self.inbox.put(None)  # wake the worker if it is idle

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._take_in(block=not self.running)
            if self._stop.is_set():
                break
            self._drop_cancelled()
            self._admit()
            if not self.engine.rows:
                continue
            try:
                results = self.engine.step()
            except Exception as exc:  # the whole batch fails; the server goes on
                log.exception("engine step failed")
                self._fail_all(exc)
                continue
            self.steps += 1
            size = len(results)
            self.batch_sizes[size] = self.batch_sizes.get(size, 0) + 1
            for row, step in results:
                ticket = self.running[id(row)]
                self.metrics.record_step(step)
                ticket.put(step)
                if row.finish_reason is not None:
                    del self.running[id(row)]
                    ticket.put(_DONE)
            self._gauges()
        self._fail_all(RuntimeError("the server is shutting down"))

    def _take_in(self, block: bool) -> None:
        try:
            item = self.inbox.get(block=block)
            while True:
                if item is not None:
                    self.waiting.append(item)
                item = self.inbox.get_nowait()
        except queue.Empty:
            pass

    def _drop_cancelled(self) -> None:
        self.waiting = [t for t in self.waiting if not t.cancelled]
        for key, ticket in list(self.running.items()):
            if ticket.cancelled:
                self.engine.remove(ticket.row)
                del self.running[key]

    def _admit(self) -> None:
        while self.waiting and len(self.engine.rows) < self.max_num_seqs:
            ticket = self.waiting.pop(0)
            job = ticket.job
            eos, stop_token_ids = self._stop_ids(job)
            stops = None
            if job.stop:
                stops = StopStrings(self.ref.tokenizer, job.stop, job.include_stop_str_in_output,
                                    job.params.min_tokens)
            try:
                row, step = self.engine.add(job.prompt, job.max_tokens, job.params, eos, logprobs=job.logprobs,
                                            top_logprobs=job.top_logprobs, seed=job.seed, tag=ticket,
                                            prompt_logprobs=job.prompt_logprobs, stop_token_ids=stop_token_ids,
                                            stops=stops)
            except Exception as exc:
                log.exception("prefill failed")
                ticket.put(exc)
                continue
            ticket.row = row
            self.metrics.record_prompt(len(job.prompt))
            self.metrics.record_step(step)
            ticket.put(step)
            if row.finish_reason is None:
                self.running[id(row)] = ticket
            else:
                ticket.put(_DONE)
        self._gauges()

    def _stop_ids(self, job: Job) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(EOS, stop token ids) as vLLM splits them: the tokenizer's EOS stops with
        stop_reason None; the generation config's other EOS ids join the request's
        stop_token_ids (stop_reason: the id); ignore_eos drops both EOS kinds."""
        eos = self.ref.tokenizer.eos_token_id
        primary = () if eos is None else (int(eos),)
        others = tuple(i for i in self.ref.stop_ids if i not in primary)
        if job.ignore_eos:
            return (), job.stop_token_ids
        return primary, tuple(dict.fromkeys(job.stop_token_ids + others))

    def _fail_all(self, exc: Exception) -> None:
        for ticket in list(self.running.values()) + self.waiting:
            if ticket.row is not None:
                self.engine.remove(ticket.row)
            ticket.put(exc)
        self.running.clear()
        self.waiting.clear()
        self._gauges()

    def _gauges(self) -> None:
        self.metrics.running.set(len(self.engine.rows))
        self.metrics.waiting.set(len(self.waiting))


@dataclass
class ServerState:
    ref: Reference
    model_name: str
    metrics: Metrics
    scheduler: Scheduler
    max_model_len: int = 2048
    max_logprobs: int = 20  # -1: no cap (vLLM's --max-logprobs)
    vocab: int = 0  # the target's vocabulary size (what -1 means in logprobs)
    spec_k: int | None = None  # k of the per-request spec metrics; None: answers carry none
    _token_texts: list[str] | None = None

    def tally(self) -> SpecTally | None:
        """A new request's SpecTally, or None when answers carry no spec metrics."""
        return None if self.spec_k is None else SpecTally(self.spec_k)

    def token_text(self, tid: int) -> str:
        """``decoded_token`` of a prompt logprob: the token decoded alone (one table for
        the whole vocabulary, built on first use)."""
        if self._token_texts is None:
            tok = self.ref.tokenizer
            self._token_texts = [tok.decode([i]) for i in range(self.vocab)]
        return self._token_texts[tid] if 0 <= tid < self.vocab else ""


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
    prompt_logprobs: int | None = None  # K, -1: the whole vocabulary; None: not asked
    token_ids: bool = False  # vLLM's return_token_ids (all ids in a non-streamed answer, each chunk's in a stream)
    stop: tuple[str, ...] = ()  # stop strings
    stop_token_ids: tuple[int, ...] = ()
    include_stop_str_in_output: bool = False


def build_app(ref: Reference, model_name: str | None = None, max_num_seqs: int = 16,
              max_logprobs: int = 20, spec_metrics: bool = True) -> Starlette:
    """``spec_metrics``: with speculation (a proposer, k >= 1), every answer carries the
    request's ``metrics.speculative_decoding`` (vLLM's --per-request-spec-decode-metrics
    detailed); a server without speculation never sends it."""
    name = model_name or ref.model_name
    speculative = ref.engine.proposer is not None
    metrics = Metrics(name, ref.engine.k, speculative)
    scheduler = Scheduler(ref, metrics, max_num_seqs)
    spec_k = ref.engine.k if spec_metrics and speculative and ref.engine.k >= 1 else None
    state = ServerState(ref, name, metrics, scheduler, max_model_len=ref.engine.max_model_len,
                        max_logprobs=max_logprobs, vocab=vocab_size(ref.engine.model), spec_k=spec_k)

    async def models(request: Request) -> JSONResponse:
        return JSONResponse({"object": "list", "data": [{
            "id": name, "object": "model", "created": int(time.time()), "owned_by": "specadapt",
            "root": str(ref.target_dir), "max_model_len": state.max_model_len}]})

    async def version(request: Request) -> JSONResponse:
        return JSONResponse({"version": __version__, "server": "specadapt-reference",
                             "speculative_method": ref.method, "num_speculative_tokens": ref.engine.k,
                             "num_speculative_tokens_per_batch_size": [list(r) for r in ref.engine.schedule],
                             "max_num_seqs": scheduler.max_num_seqs, "max_model_len": state.max_model_len})

    async def health(request: Request) -> Response:
        return Response(status_code=200)

    async def metrics(request: Request) -> Response:
        return Response(generate_latest(state.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    async def completions(request: Request) -> Response:
        return await _handle(state, request, chat=False)

    async def chat(request: Request) -> Response:
        return await _handle(state, request, chat=True)

    async def tokenize(request: Request) -> Response:
        return await _answer(request, lambda body: _tokenize(state, body))

    async def detokenize(request: Request) -> Response:
        return await _answer(request, lambda body: _detokenize(state, body))

    routes = [Route("/v1/models", models), Route("/version", version), Route("/health", health),
              Route("/metrics", metrics), Route("/v1/completions", completions, methods=["POST"]),
              Route("/v1/chat/completions", chat, methods=["POST"]),
              Route("/tokenize", tokenize, methods=["POST"]), Route("/detokenize", detokenize, methods=["POST"])]
    @contextlib.asynccontextmanager
    async def lifespan(app):
        scheduler.start()
        try:
            yield
        finally:
            await asyncio.to_thread(scheduler.stop)

    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.reference = state
    return app


def _error(message: str, status: int, param: str | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": "BadRequestError", "param": param, "code": status}},
                        status_code=status)


async def _answer(request: Request, work) -> Response:
    """A small JSON endpoint: ``work(body)`` -> the answer, its refusals as 400s."""
    try:
        body = await request.json()
        if not isinstance(body, dict):
            raise BadRequest("the request body must be a JSON object")
        return JSONResponse(work(body))
    except json.JSONDecodeError:
        return _error("the request body is not JSON", 400)
    except BadRequest as err:
        return _error(str(err), err.status, err.param)
    except (SpecadaptError, TypeError, ValueError) as err:  # no chat template; the template's own refusals
        return _error(str(err), 400)  # as vLLM passes them on


def _check_model(state: ServerState, body: dict) -> None:
    model = body.get("model")
    if model not in (None, state.model_name):
        raise BadRequest(f"model {model!r} is not served here; this server serves {state.model_name!r}", 404)


def _flag(body: dict, name: str, default: bool) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise BadRequest(f"'{name}' must be true or false, not {value!r}", param=name)
    return value


def _tokenize(state: ServerState, body: dict) -> dict:
    """vLLM's POST /tokenize: {"prompt": str} (add_special_tokens, default true) or
    {"messages": [...]} through the chat template (add_generation_prompt, default true;
    continue_final_message; add_special_tokens, default false)."""
    _check_model(state, body)
    tok = state.ref.tokenizer
    if "prompt" in body:
        prompt = body["prompt"]
        if not isinstance(prompt, str):
            raise BadRequest("'prompt' must be a string (token ids need no tokenizing)", param="prompt")
        ids = list(tok(prompt, add_special_tokens=_flag(body, "add_special_tokens", True))["input_ids"])
    elif "messages" in body:
        messages = body["messages"]
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            raise BadRequest("'messages' must be a list of {\"role\": ..., \"content\": ...} objects",
                             param="messages")
        # both add_generation_prompt and continue_final_message: transformers' refusal, as in vLLM
        ids = state.ref.encode_messages(messages, add_generation_prompt=_flag(body, "add_generation_prompt", True),
                                        continue_final_message=_flag(body, "continue_final_message", False),
                                        add_special_tokens=_flag(body, "add_special_tokens", False))
    else:
        raise BadRequest("give 'prompt' (a string) or 'messages' (a list of chat messages)")
    strs = tok.convert_ids_to_tokens(ids) if _flag(body, "return_token_strs", False) else None
    return {"count": len(ids), "max_model_len": state.max_model_len, "tokens": ids, "token_strs": strs}


def _detokenize(state: ServerState, body: dict) -> dict:
    """vLLM's POST /detokenize: {"tokens": [ids]} -> {"prompt": text} (special tokens kept)."""
    _check_model(state, body)
    ids = body.get("tokens")
    if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
        raise BadRequest("'tokens' must be a list of token ids", param="tokens")
    bad = [t for t in ids if not 0 <= t < state.vocab]
    if bad:
        raise BadRequest(f"token ids {bad[:5]} are outside the vocabulary (0..{state.vocab - 1})", param="tokens")
    return {"prompt": state.ref.tokenizer.decode(ids)}


async def _handle(state: ServerState, request: Request, chat: bool) -> Response:
    try:
        body = await request.json()
        job = _parse(state, body, chat)
    except json.JSONDecodeError:
        return _error("the request body is not JSON", 400)
    except BadRequest as err:
        return _error(str(err), err.status, err.param)
    except (SpecadaptError, TypeError, ValueError) as err:  # e.g. no chat template, "temperature": "hot"
        return _error(f"bad request: {err}", 400)
    rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
    if job.stream:
        return StreamingResponse(_stream(state, job, rid), media_type="text/event-stream")
    steps: list[Step] = []
    tally = state.tally()
    try:
        async for step in _run(state, job):
            steps.append(step)
            if tally is not None:
                tally.add(step)
    except Exception as err:  # the engine failed on this batch
        return _error(f"the reference engine failed: {err}", 500)
    tokens = [t for s in steps for t in s.tokens]
    choice = _choice(state, job, steps, _final_text(state, job, steps, tokens), _finish(steps[-1]), final=True,
                     stop_reason=steps[-1].stop_reason)
    prompt_logprobs = _prompt_logprobs(state, steps[0].prompt_logprobs)
    body = {"id": rid, "object": "chat.completion" if chat else "text_completion", "created": int(time.time()),
            "model": state.model_name, "choices": [choice], "usage": _usage(len(job.prompt), len(tokens))}
    # vLLM: prompt_logprobs and prompt_token_ids at the top of a chat response, in the choice
    # of a completion; the ids only with return_token_ids
    where = body if chat else choice
    where["prompt_logprobs"] = prompt_logprobs
    where["prompt_token_ids"] = list(job.prompt) if job.token_ids else None
    choice["token_ids"] = tokens if job.token_ids else None
    if tally is not None:  # vLLM 0.32 --per-request-spec-decode-metrics: top level, after usage
        body["metrics"] = {"speculative_decoding": tally.as_dict()}
    return JSONResponse(body)


def _parse(state: ServerState, body: dict, chat: bool) -> Job:
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    _check_model(state, body)
    if body.get("n", 1) != 1:
        raise BadRequest("only n = 1 is supported")
    _refuse_structured(body)
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
    # vLLM's rule: prompt + max_tokens <= max_model_len (drafts past it are never proposed)
    limit = state.max_model_len - len(prompt)
    if limit < 1:
        raise BadRequest(f"the prompt ({len(prompt)} tokens) leaves no room in the model length "
                         f"{state.max_model_len}: shorten it")
    max_tokens = body.get("max_completion_tokens")
    if max_tokens is None:
        max_tokens = body.get("max_tokens")
    if max_tokens is None:
        max_tokens = limit if chat else 16  # vLLM's defaults
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise BadRequest("'max_tokens' must be a positive integer")
    if max_tokens > limit:
        raise BadRequest(f"this model's maximum context length is {state.max_model_len} tokens; the prompt "
                         f"({len(prompt)} tokens) plus max_tokens ({max_tokens}) ask for {len(prompt) + max_tokens}")
    params = _sampling(body, state.vocab)
    if params.min_tokens > max_tokens:
        raise _invalid(f"min_tokens must be less than or equal to max_tokens={max_tokens}, got "
                       f"{params.min_tokens}.", "min_tokens", params.min_tokens)
    stop, stop_token_ids = _stops(body, state.vocab)
    if chat:
        top = _logprob_count(body, "top_logprobs")
        logprobs = bool(body.get("logprobs"))
        top = top or 0
    else:
        top = _logprob_count(body, "logprobs")
        logprobs = top is not None
        top = top or 0
    if logprobs and top:
        _within_max(state, top, "sample", "top_logprobs" if chat else "logprobs")
    top = state.vocab if top == -1 else top
    prompt_k = _logprob_count(body, "prompt_logprobs")
    stream = bool(body.get("stream"))
    if prompt_k is not None:
        if stream and prompt_k != 0:
            raise _invalid("`prompt_logprobs` are not available when `stream=True`.", "prompt_logprobs")
        _within_max(state, prompt_k, "prompt", "prompt_logprobs")
    options = body.get("stream_options") or {}
    return Job(prompt, max_tokens, params, stream, bool(options.get("include_usage")),
               bool(options.get("continuous_usage_stats")), logprobs, top,
               bool(body.get("return_tokens_as_token_ids")), body.get("seed"),
               bool(body.get("ignore_eos")), chat, None if stream else prompt_k, bool(body.get("return_token_ids")),
               stop, stop_token_ids, _flag(body, "include_stop_str_in_output", False))


# request fields that ask for structured output (vLLM's current and older names)
_STRUCTURED = ("structured_outputs", "guided_json", "guided_regex", "guided_choice", "guided_grammar",
               "guided_decoding_backend", "guided_whitespace_pattern")


def _refuse_structured(body: dict) -> None:
    """Structured output (a JSON schema, a regex, a grammar, a choice) is not implemented:
    a 400 naming the field, rather than an answer that silently ignores the constraint."""
    fmt = body.get("response_format")
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if fmt is not None and kind != "text":
        raise _invalid("structured output is not supported by the reference server", "response_format", kind)
    for name in _STRUCTURED:
        if body.get(name) is not None:
            raise _invalid("structured output is not supported by the reference server", name)


def _stops(body: dict, vocab: int) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """``stop`` (a string or a list of strings, none empty) and ``stop_token_ids`` (token
    ids in the vocabulary), checked as vLLM checks them."""
    stop = body.get("stop")
    if stop is None:
        stop = []
    elif isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(x, str) for x in stop):
        raise _invalid("stop must be a string or a list of strings", "stop")
    if any(not x for x in stop):
        raise _invalid("stop cannot contain an empty string.", "stop")
    ids = body.get("stop_token_ids")
    if ids is None:
        ids = []
    if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
        raise _invalid(f"stop_token_ids must contain only integers, got {ids}.", "stop_token_ids")
    bad = [t for t in ids if not 0 <= t < vocab]
    if bad:
        raise _invalid(f"token_id(s) {bad} in stop_token_ids contain out-of-vocab token ids. "
                       f"Vocabulary size: {vocab}", "stop_token_ids", bad)
    return tuple(dict.fromkeys(stop)), tuple(dict.fromkeys(ids))


def _logprob_count(body: dict, name: str) -> int | None:
    """``logprobs`` / ``top_logprobs`` / ``prompt_logprobs``, checked as vLLM's request
    validators check them: an integer, >= 0 or exactly -1 (the whole vocabulary)."""
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise _invalid(f"`{name}` must be an integer.", name, value)
    if value < 0 and value != -1:
        raise _invalid(f"`{name}` must be a positive value or -1.", name, value)
    return value


def _within_max(state: ServerState, k: int, kind: str, name: str) -> None:
    """vLLM's cap: K (-1: the vocabulary size) at most --max-logprobs (-1: the vocabulary size)."""
    k = state.vocab if k == -1 else k
    cap = state.vocab if state.max_logprobs == -1 else state.max_logprobs
    if k > cap:
        raise _invalid(f"Requested {kind} logprobs of {k}, which is greater than max allowed: {cap}", name, k)


def _sampling(body: dict, vocab: int) -> SamplingParams:
    """The request's sampling parameters, checked as vLLM checks them (BadRequest: 400,
    naming the parameter)."""
    def number(name: str, default: float) -> float:
        value = body.get(name)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _invalid(f"'{name}' must be a number, not {value!r}", name)
        return float(value)

    def integer(name: str, default: int) -> int:
        value = body.get(name)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            raise _invalid(f"'{name}' must be an integer, not {value!r}", name)
        return value

    top_k = integer("top_k", 0)
    bias = _logit_bias(body.get("logit_bias"), vocab)
    try:  # SamplingParams checks its values as vLLM does; each message starts with the name
        return SamplingParams(number("temperature", 1.0), 0 if top_k == -1 else top_k, number("top_p", 1.0),
                              min_p=number("min_p", 0.0), repetition_penalty=number("repetition_penalty", 1.0),
                              frequency_penalty=number("frequency_penalty", 0.0),
                              presence_penalty=number("presence_penalty", 0.0), logit_bias=bias,
                              min_tokens=integer("min_tokens", 0))
    except SpecadaptError as err:
        raise BadRequest(f"{err} (parameter={str(err).split()[0]})", param=str(err).split()[0]) from None


def _logit_bias(value: object, vocab: int) -> dict[int, float]:
    """``logit_bias``: {token id (a string or an int): bias}; ids must be integers in the
    vocabulary; biases are clamped to [-100, 100] (by SamplingParams), as vLLM does."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _invalid("logit_bias must be an object mapping token ids to biases", "logit_bias")
    out: dict[int, float] = {}
    bad_keys = []
    for key, bias in value.items():
        try:
            tid = int(key)
        except (TypeError, ValueError):
            bad_keys.append(key)
            continue
        if isinstance(bias, bool) or not isinstance(bias, (int, float)):
            raise _invalid(f"logit_bias values must be numbers, got {bias!r}", "logit_bias")
        out[tid] = float(bias)
    if bad_keys:
        raise _invalid(f"logit_bias contains key(s) that cannot be converted to integer token IDs: {bad_keys!r}",
                       "logit_bias", bad_keys)
    bad = [t for t in out if not 0 <= t < vocab]
    if bad:
        raise _invalid(f"token_id(s) {bad} in logit_bias contain out-of-vocab token ids. Vocabulary size: {vocab}",
                       "logit_bias", bad)
    return out


async def _run(state: ServerState, job: Job):
    """The job's Steps as the engine produces them; the row leaves the batch however this
    generator ends (finished, client gone, error)."""
    ticket = Ticket(job, asyncio.get_running_loop())
    state.scheduler.submit(ticket)
    try:
        while True:
            item = await ticket.events.get()
            if item is _DONE:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        state.scheduler.cancel(ticket)  # a no-op for a finished row


async def _stream(state: ServerState, job: Job, rid: str):
    created = int(time.time())
    kind = "chat.completion.chunk" if job.chat else "text_completion"

    def chunk(choices: list, usage: dict | None = None, metrics: dict | None = None) -> str:
        body = {"id": rid, "object": kind, "created": created, "model": state.model_name, "choices": choices}
        if usage is not None:
            body["usage"] = usage
        if metrics is not None:
            body["metrics"] = metrics
        return f"data: {json.dumps(body)}\n\n"

    text = _StreamText(state, job)
    tally = state.tally()
    tokens: list[int] = []
    if job.chat:
        yield chunk([{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                      "finish_reason": None}], _usage(len(job.prompt), 0) if job.continuous_usage else None)
    steps = _run(state, job)
    try:
        async for step in steps:
            tokens.extend(step.tokens)
            if tally is not None:
                tally.add(step)
            choice = _choice(state, job, [step], text.add(step), None, final=False)
            if job.token_ids:  # vLLM: each chunk's own token ids (the step's tokens)
                choice["token_ids"] = list(step.tokens)
            usage = _usage(len(job.prompt), len(tokens)) if job.continuous_usage else None
            yield chunk([choice], usage)
    except Exception as err:  # the engine failed mid-stream: say so in the stream, as vLLM does
        yield f"data: {json.dumps({'error': {'message': f'the reference engine failed: {err}', 'code': 500}})}\n\n"
        return
    finally:
        await steps.aclose()
    last = _choice(state, job, [], text.flush(), _finish(step), final=False, stop_reason=step.stop_reason)
    yield chunk([last], _usage(len(job.prompt), len(tokens)) if job.continuous_usage else None)
    if job.include_usage:  # vLLM 0.32: the request's spec metrics ride on the final usage chunk
        spec = None if tally is None else {"speculative_decoding": tally.as_dict()}
        yield chunk([], _usage(len(job.prompt), len(tokens)), spec)
    yield "data: [DONE]\n\n"


def _stop_token_ended(step: Step) -> bool:
    """Whether the step ended its request on a stop token (EOS or a stop token id), whose
    text vLLM leaves out unless include_stop_str_in_output."""
    return step.finish_reason == "stop" and not isinstance(step.stop_reason, str) and bool(step.tokens)


def _final_text(state: ServerState, job: Job, steps: list[Step], tokens: list[int]) -> str:
    """The completion's text: the stop-string tracker's (cut at the stop string) when the
    request has stop strings, else the tokens decoded, a final stop token left out."""
    if steps[-1].text is not None:
        return steps[-1].text
    if _stop_token_ended(steps[-1]) and not job.include_stop_str_in_output:
        tokens = tokens[:-1]
    return state.ref.decode(tokens)


class _StreamText:
    """The text deltas of a stream, adding up to ``_final_text``. With stop strings the
    engine's text is sent minus the last (longest stop string - 1) characters while the
    request runs (they may begin a stop string that will be cut), all of it at the end,
    as vLLM holds back; without, the step's tokens go through the incremental detokenizer."""

    def __init__(self, state: ServerState, job: Job):
        self.job = job
        self.detok = IncrementalDetokenizer(state.ref.tokenizer)
        self.sent = 0
        self.hold = 0 if job.include_stop_str_in_output or not job.stop else max(map(len, job.stop)) - 1

    def add(self, step: Step) -> str:
        if step.text is not None:
            end = len(step.text) if step.finish_reason else len(step.text) - self.hold
            delta = step.text[self.sent:end] if end > self.sent else ""
            self.sent = max(self.sent, end)
            return delta
        ids = step.tokens
        if _stop_token_ended(step) and not self.job.include_stop_str_in_output:
            ids = ids[:-1]
        return self.detok.add(ids)

    def flush(self) -> str:
        return self.detok.flush()


def _finish(last: Step) -> str:
    """The finish reason the engine gave the request's last step."""
    return last.finish_reason or "length"


def _prompt_logprobs(state: ServerState, entries: list | None) -> list | None:
    """vLLM's ``prompt_logprobs``: None for the first prompt token, then per token
    {"<token id>": {"logprob", "rank", "decoded_token"}}, the prompt token first, then
    the top K (a prompt token among them keeps its first place and takes the top-K
    entry's rank, as in vLLM's dict); -inf is sent as -9999.0, as vLLM clamps it."""
    if entries is None:
        return None
    out: list = []
    for entry in entries:
        if entry is None:
            out.append(None)
            continue
        out.append({str(tid): {"logprob": -9999.0 if lp == float("-inf") else lp, "rank": rank,
                               "decoded_token": state.token_text(tid)} for tid, lp, rank in entry})
    return out


def _usage(prompt: int, completion: int) -> dict:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _token_text(state: ServerState, job: Job, tid: int) -> str:
    return f"token_id:{tid}" if job.ids_as_tokens else state.ref.tokenizer.decode([tid])


def _choice(state: ServerState, job: Job, steps: list[Step], text: str, finish: str | None, final: bool,
            stop_reason: int | str | None = None) -> dict:
    """One choice; ``stop_reason`` as vLLM sends it: the stop string or stop token id that
    ended the request, else null (EOS, length, and every chunk before the last)."""
    toks = [(t, lp, top) for s in steps for t, lp, top in
            zip(s.tokens, s.logprobs, s.top_logprobs or [[]] * len(s.tokens))]
    logprobs = _logprobs(state, job, toks) if job.logprobs and (toks or final) else None
    if job.chat:
        key = "message" if final else "delta"
        content = {"role": "assistant", "content": text} if final else ({"content": text} if text else {})
        return {"index": 0, key: content, "logprobs": logprobs, "finish_reason": finish, "stop_reason": stop_reason}
    return {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish, "stop_reason": stop_reason}


def _logprobs(state: ServerState, job: Job, toks: list) -> dict:
    name = lambda tid: _token_text(state, job, tid)  # noqa: E731
    if job.chat:
        return {"content": [{"token": name(t), "logprob": lp, "bytes": list(name(t).encode()),
                             "top_logprobs": [{"token": name(i), "logprob": v, "bytes": list(name(i).encode())}
                                              for i, v in top]} for t, lp, top in toks]}
    return {"tokens": [name(t) for t, _, _ in toks], "token_logprobs": [lp for _, lp, _ in toks],
            "top_logprobs": [{name(i): v for i, v in top} for _, _, top in toks] if job.top_logprobs else None,
            "text_offset": []}


def run_server(ref: Reference, host: str, port: int, model_name: str | None = None,
               max_num_seqs: int = 16, max_logprobs: int = 20, spec_metrics: bool = True) -> None:
    import uvicorn

    uvicorn.run(build_app(ref, model_name, max_num_seqs, max_logprobs, spec_metrics), host=host, port=port,
                log_level="warning")

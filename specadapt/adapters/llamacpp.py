"""llama.cpp through llama-cpp-python's OpenAI-compatible server: launch and connect.

Speculation there is prompt-lookup drafting (``--draft_model prompt-lookup-decoding
--draft_model_num_pred_tokens K``, configs/llamacpp.py), the only drafter its server can
start from the command line. What this backend can and cannot read, plainly:

- no counters: the server has no ``/metrics`` and reports no drafts or accepted tokens,
  so acceptance is unknown (the report says so; speedup and output identity still work);
- no ``/version``: the version is the interpreter's ``llama_cpp.__version__`` when
  specadapt started the server, unknown in connect mode;
- whether speculation is on is known only from the launch plan (connect mode: unknown);
- logprobs: the completions API returns them, which the probes use to count tokens.
"""

from __future__ import annotations

import subprocess
from importlib import metadata
from pathlib import Path

from pydantic import Field

from specadapt.adapters.base import Backend, Capabilities, LaunchOptions, LaunchPlan, SpecSupport, TokenRequests, Verify
from specadapt.adapters.http import OpenAIServer
from specadapt.adapters.process import free_port
from specadapt.configs.llamacpp import llamacpp_spec_flags
from specadapt.configs.spec import SpecConfig
from specadapt.errors import UsageError
from specadapt.models import embedded_gguf_path
from specadapt.records import CounterSnapshot, ServerInfo
from specadapt.wire.http import Transport

NO_COUNTERS = "llama-cpp-python's server exposes no speculative-decoding counters (no /metrics)"


def spec_flags(spec: SpecConfig | None) -> tuple[list[str], list[str]]:
    """(the drafting flags for ``spec``, notes); UsageError for what the server cannot do."""
    if spec is None:
        return [], []
    try:
        flags = llamacpp_spec_flags(spec)
    except UsageError as exc:
        raise UsageError(f"--spec-config: {exc}") from None
    notes = []
    if spec.ngram_min is not None or spec.ngram_max is not None:
        notes.append("the n-gram window cannot be set through llama-cpp-python's server "
                     "(its prompt-lookup drafter matches n-grams of up to 2 tokens); ignored")
    return flags, notes


class LlamaCppServer(OpenAIServer):
    """A llama-cpp-python server at ``base_url``."""

    backend = "llamacpp"

    def __init__(self, base_url: str, api_key: str | None = None, verify: Verify = True,
                 num_pred_tokens: int | None = None, launched: bool = False, version: str | None = None,
                 transport: Transport | None = None):
        super().__init__(base_url, api_key, verify, launched, transport)
        self.num_pred_tokens = num_pred_tokens
        self.version = version

    def read_counters(self) -> CounterSnapshot:
        return CounterSnapshot(source=NO_COUNTERS)

    def describe(self) -> ServerInfo:
        models = self._models()
        self._model_id = str(models[0]["id"])
        info = self._server_info(version=self.version, model_id=self._model_id)
        info.notes.append(f"{NO_COUNTERS}: acceptance rate and length cannot be read")
        if self.launched:
            info.spec_enabled = self.num_pred_tokens is not None
            info.spec_signal = "the launch plan (the server itself does not say)"
            if info.spec_enabled:
                info.spec_method, info.num_speculative_tokens = "ngram (prompt lookup)", self.num_pred_tokens
        else:
            info.notes.append("cannot tell whether speculative decoding is on: llama-cpp-python's server does "
                              "not expose its draft settings; the version is unknown too (no /version)")
        return info


class LlamaCppLaunch(LaunchOptions):
    """How to start ``python -m llama_cpp.server`` on a GGUF file."""

    model: str = Field(description="GGUF file to serve.")
    dtype: str | None = Field(None, description="Ignored: a GGUF file fixes its own types.")
    max_model_len: int | None = Field(2048, ge=1, description="--n_ctx.")
    n_threads: int | None = Field(None, description="--n_threads (default: llama.cpp's choice).")
    seed: int | None = 0


def launch_plan(opts: LlamaCppLaunch) -> LaunchPlan:
    port = opts.port or free_port(opts.host)
    flags, notes = spec_flags(opts.spec_config)
    argv = [opts.python, "-m", "llama_cpp.server", "--model", opts.model, "--host", opts.host,
            "--port", str(port)]
    if opts.max_model_len:
        argv += ["--n_ctx", str(opts.max_model_len)]
    if opts.n_threads:
        argv += ["--n_threads", str(opts.n_threads)]
    if opts.seed is not None:
        argv += ["--seed", str(opts.seed)]
    argv += flags
    if opts.dtype:
        notes.append(f"--dtype {opts.dtype} ignored: the GGUF file fixes its own types")
    notes.append(NO_COUNTERS + ": acceptance will be reported as unknown")
    return LaunchPlan(backend="llamacpp", argv=argv + list(opts.extra_args), host=opts.host, port=port,
                      health_path="/v1/models", spec_enabled=bool(flags), model=opts.model, notes=notes,
                      spec_args=flags)


def interpreter_version(python: str) -> str:
    """``llama_cpp.__version__`` of ``python``, or UsageError with the install hint."""
    code = "import llama_cpp, llama_cpp.server.app; print(llama_cpp.__version__)"
    try:
        done = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UsageError(f"cannot run --python {python}: {exc}") from exc
    if done.returncode != 0:
        raise UsageError(f"llama-cpp-python's server is not installed for {python}: "
                         "pip install 'specadapt[llamacpp]' (builds llama.cpp from source, minutes), "
                         "or pass --python with an interpreter that has it")
    return done.stdout.strip()


class LlamaCppBackend(Backend):
    """llama.cpp via llama-cpp-python (registered under ``specadapt.backends``)."""

    name = "llamacpp"
    capabilities = Capabilities(launch=True, logprobs=True)
    spec_support = SpecSupport(form="llamacpp", fields=frozenset({"method", "k"}))  # prompt-lookup drafting, k
    token_requests = TokenRequests(sampled_ids=None, prompt_logprobs=None, output_ids=None)  # logprobs name tokens as text
    launch_options = LlamaCppLaunch
    startup_timeout_s = 300.0

    def __init__(self) -> None:
        self._versions: dict[str, str] = {}  # interpreter -> llama_cpp.__version__, read by check_launch

    def connect(self, url: str, api_key: str | None = None, verify: Verify = True) -> LlamaCppServer:
        return LlamaCppServer(url, api_key=api_key, verify=verify)

    def check_launch(self, opts: LlamaCppLaunch) -> None:
        self._versions[opts.python] = interpreter_version(opts.python)

    def launch_plan(self, opts: LlamaCppLaunch) -> LaunchPlan:
        return launch_plan(opts)

    def launched_version(self, opts: LlamaCppLaunch) -> str | None:
        return self._versions.get(opts.python)  # what check_launch read from that interpreter

    def connect_launched(self, opts: LlamaCppLaunch, url: str) -> LlamaCppServer:
        spec = opts.spec_config
        k = spec.k if spec is not None and spec.enabled else None
        return LlamaCppServer(url, num_pred_tokens=k, launched=True, version=self._versions.get(opts.python))

    def resolve_model(self, model: str | None) -> str:
        """--model as a GGUF file; default: the embedded SmolLM2 GGUF."""
        path = Path(model).expanduser() if model else embedded_gguf_path()
        if not path.is_file():
            hint = "run 'specadapt models fetch'" if model is None else "pass an existing .gguf file"
            raise UsageError(f"GGUF model {path} not found: {hint}")
        return str(path.resolve())

    def version(self) -> str | None:
        try:
            return metadata.version("llama_cpp_python")
        except metadata.PackageNotFoundError:
            return None

"""The native reference engine as a backend: `specadapt reference serve`, launched or connected.

It speaks the OpenAI API with vLLM's counter names on ``/metrics``, token ids through
``return_tokens_as_token_ids`` and ``/version``, so connecting reuses the vLLM adapter;
what differs is the launch plan, and that it has no ``/tokenize`` (so ``--reference``
recomputation needs a vLLM spec-off side). Speculative configs are given as vLLM JSON:
``ngram`` (prompt_lookup_min/max) and ``draft_model`` (model) map to its flags.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from specadapt import __version__
from specadapt.adapters.base import Backend, Capabilities, LaunchOptions, LaunchPlan, Verify
from specadapt.adapters.process import free_port
from specadapt.adapters.vllm import VLLMServer
from specadapt.errors import UsageError


class ReferenceServer(VLLMServer):
    backend = "reference"


class ReferenceLaunch(LaunchOptions):
    """How to start ``specadapt reference serve`` (max_model_len is accepted and unused: the
    reference uses the model's own)."""

    spec_config: dict[str, Any] | None = Field(None, description="vLLM-style JSON: ngram or draft_model; None: off.")
    dtype: str | None = Field(None, description="auto, float64, float32, bfloat16, float16.")
    seed: int | None = 0
    fault: str | None = Field(None, description="TEST AID: accept-always, drop-bonus, perturb-logits=EPS.")
    threads: int = 1


def _spec_flags(spec: dict[str, Any] | None) -> list[str]:
    if not spec:
        return []
    method = spec.get("method") or ("draft_model" if spec.get("model") else None)
    k = spec.get("num_speculative_tokens")
    if not isinstance(k, int) or k < 1:
        raise UsageError("the reference engine needs num_speculative_tokens >= 1 in the speculative config")
    if method == "ngram":
        lo = spec.get("prompt_lookup_min", spec.get("prompt_lookup_max", 1))
        hi = spec.get("prompt_lookup_max", spec.get("prompt_lookup_min", 4))
        return ["--ngram", f"--ngram-min={lo}", f"--ngram-max={hi}", f"--k={k}"]
    if method == "draft_model" and spec.get("model"):
        return [f"--draft={spec['model']}", f"--k={k}"]
    raise UsageError(f"the reference engine speculates with ngram or draft_model, not {method!r}")


def launch_plan(opts: ReferenceLaunch) -> LaunchPlan:
    port = opts.port or free_port(opts.host)
    argv = [opts.python, "-m", "specadapt", "reference", "serve", f"--target={opts.model}", f"--host={opts.host}",
            f"--port={port}", f"--threads={opts.threads}", *_spec_flags(opts.spec_config)]
    if opts.dtype:
        argv.append(f"--dtype={opts.dtype}")
    if opts.seed is not None:
        argv.append(f"--seed={opts.seed}")
    if opts.fault:
        argv.append(f"--inject-fault={opts.fault}")
    argv += opts.extra_args
    return LaunchPlan(backend="reference", argv=argv, host=opts.host, port=port, health_path="/v1/models",
                      spec_enabled=bool(opts.spec_config), model=opts.model,
                      env={"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})


class ReferenceBackend(Backend):
    """specadapt's own PyTorch engine (registered under ``specadapt.backends``)."""

    name = "reference"
    capabilities = Capabilities(launch=True, counters=True, logprobs=True, token_ids=True)
    launch_options = ReferenceLaunch
    startup_timeout_s = 600.0

    def connect(self, url: str, api_key: str | None = None, verify: Verify = True) -> ReferenceServer:
        return ReferenceServer(url, api_key=api_key, verify=verify)

    def launch_plan(self, opts: ReferenceLaunch) -> LaunchPlan:
        return launch_plan(opts)

    def connect_launched(self, opts: ReferenceLaunch, url: str) -> ReferenceServer:
        return ReferenceServer(url, spec_config=opts.spec_config, launched=True)

    def version(self) -> str | None:
        return __version__

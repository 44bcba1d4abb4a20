"""The native reference engine as a backend: `specadapt reference serve`, launched or connected.

It speaks the OpenAI API with vLLM's counter names on ``/metrics``, token ids through
``return_tokens_as_token_ids``, ``/version``, ``/tokenize`` and ``prompt_logprobs``, so
connecting reuses the vLLM adapter; what differs is the launch plan. It speculates with
``ngram`` (the n-gram window becomes --ngram-min/--ngram-max) or ``draft_model`` (a local
draft directory), k at most.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import Field

from specadapt import __version__
from specadapt.adapters.base import Backend, Capabilities, LaunchOptions, LaunchPlan, SpecSupport, TokenRequests, Verify
from specadapt.adapters.process import free_port
from specadapt.adapters.vllm import TOKEN_IDS, VLLMServer
from specadapt.configs.spec import SpecConfig
from specadapt.errors import UsageError


class ReferenceServer(VLLMServer):
    backend = "reference"

    def _settings(self, version: dict[str, Any], server_info: Any) -> tuple[str | None, dict[str, Any]]:
        """No /server_info: the engine's settings on /version, speculation left out (no dtype there)."""
        return None, {k: v for k, v in version.items() if k not in VERSION_NOT_FLAGS and "speculative" not in k}


# /version keys that are not engine settings (the version itself, max_model_len is on /v1/models)
VERSION_NOT_FLAGS = ("version", "max_model_len")


class ReferenceLaunch(LaunchOptions):
    """How to start ``specadapt reference serve`` (max_model_len is accepted and unused: the
    reference uses the model's own)."""

    dtype: str | None = Field(None, description="auto, float64, float32, bfloat16, float16.")
    seed: int | None = 0
    fault: str | None = Field(None, description="TEST AID: a planted fault of the engine (accept-always, drop-bonus, "
                                                "perturb-logits=EPS, draft-temperature=T, the sampler's and the request "
                                                "features' faults: `specadapt reference serve --help` lists them).")
    threads: int = 1


def _spec_flags(spec: SpecConfig | None) -> list[str]:
    """`specadapt reference serve` flags for ``spec``: ngram (window defaults 1..4, one bound
    mirroring the other as in vLLM) or draft_model."""
    if spec is None or not spec.enabled:
        return []
    if not spec.k:
        raise UsageError("--spec-config: the reference engine needs k >= 1")
    schedule = ([f"--num-speculative-tokens-per-batch-size={json.dumps([list(e) for e in spec.k_per_batch_size])}"]
                if spec.k_per_batch_size else [])
    if spec.method == "ngram":
        lo = spec.ngram_min or spec.ngram_max or 1
        hi = spec.ngram_max or spec.ngram_min or 4
        return ["--ngram", f"--ngram-min={lo}", f"--ngram-max={hi}", f"--k={spec.k}", *schedule]
    if spec.method == "draft_model" and spec.draft:
        return [f"--draft={spec.draft}", f"--k={spec.k}", *schedule]
    raise UsageError(f"--spec-config: the reference engine speculates with ngram or draft_model, not {spec.method!r}")


def _described(spec: SpecConfig | None) -> dict[str, Any] | None:
    """What describe() reports about the launched engine's speculation (method, k, schedule)."""
    if not (spec and spec.enabled):
        return None
    out: dict[str, Any] = {"method": spec.method, "num_speculative_tokens": spec.k}
    if spec.k_per_batch_size:
        out["num_speculative_tokens_per_batch_size"] = [list(e) for e in spec.k_per_batch_size]
    return out


def launch_plan(opts: ReferenceLaunch) -> LaunchPlan:
    port = opts.port or free_port(opts.host)
    spec_args = _spec_flags(opts.spec_config)
    argv = [opts.python, "-m", "specadapt", "reference", "serve", f"--target={opts.model}", f"--host={opts.host}",
            f"--port={port}", f"--threads={opts.threads}", *spec_args]
    if opts.dtype:
        argv.append(f"--dtype={opts.dtype}")
    if opts.seed is not None:
        argv.append(f"--seed={opts.seed}")
    if opts.fault:
        argv.append(f"--inject-fault={opts.fault}")
    argv += opts.extra_args
    return LaunchPlan(backend="reference", argv=argv, host=opts.host, port=port, health_path="/v1/models",
                      spec_enabled=bool(spec_args), model=opts.model, spec_args=spec_args,
                      env={"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})


class ReferenceBackend(Backend):
    """specadapt's own PyTorch engine (registered under ``specadapt.backends``)."""

    name = "reference"
    capabilities = Capabilities(launch=True, counters=True, logprobs=True, token_ids=True)
    # vLLM's JSON, read for ngram and draft_model (k, the n-gram window, the draft, a k per batch size);
    # vLLM's other keys are refused
    spec_support = SpecSupport(form="vllm", fields=frozenset({"method", "k", "draft", "ngram_min", "ngram_max",
                                                              "k_per_batch_size"}), batch_schedule=True)
    token_requests = TokenRequests(sampled_ids=TOKEN_IDS, prompt_logprobs={"return_token_ids": True})
    launch_options = ReferenceLaunch
    startup_timeout_s = 600.0

    def connect(self, url: str, api_key: str | None = None, verify: Verify = True) -> ReferenceServer:
        return ReferenceServer(url, api_key=api_key, verify=verify)

    def launch_plan(self, opts: ReferenceLaunch) -> LaunchPlan:
        return launch_plan(opts)

    def connect_launched(self, opts: ReferenceLaunch, url: str) -> ReferenceServer:
        return ReferenceServer(url, spec_config=_described(opts.spec_config), launched=True)

    def version(self) -> str | None:
        return __version__

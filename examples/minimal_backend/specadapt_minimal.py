"""specadapt-minimal: a backend for any OpenAI-compatible server, connect mode only.

The smallest complete specadapt backend. The Server answers ``describe()`` from
``/v1/models`` and has no speculative-decoding counters (so acceptance is reported as
unknown; speed and output identity still work). The Backend declares that as data, and
what such a server takes and answers: the neutral ``--spec-config`` with method, k and
draft only (tune's base config), no token ids and no prompt logprobs (so ``equiv
--sampling`` refuses it); and it says how to connect. Everything else (start_run/end_run,
identity_extras, verify, process, resolve_model, launched/launched_many refusing to
launch) comes from the bases.
"""

from __future__ import annotations

from specadapt.adapters.base import (
    Backend,
    Capabilities,
    CounterSnapshot,
    ServerInfo,
    SpecSupport,
    TokenRequests,
    Verify,
)
from specadapt.adapters.http import OpenAIServer

NO_COUNTERS = "unavailable: a plain OpenAI-compatible server exposes no speculative-decoding counters"


class MinimalServer(OpenAIServer):
    """One running server: base URL, bearer token and /v1/models come from OpenAIServer."""

    backend = "minimal"

    def describe(self) -> ServerInfo:
        return ServerInfo(backend=self.backend, base_url=self.base_url, model_id=self.model_id,
                          notes=["generic OpenAI-compatible server: whether it speculates is not visible"])

    def read_counters(self) -> CounterSnapshot:
        return CounterSnapshot(source=NO_COUNTERS)


class MinimalBackend(Backend):
    """Registered as ``minimal`` under the ``specadapt.backends`` entry-point group."""

    name = "minimal"
    capabilities = Capabilities(connect=True, logprobs=True)
    spec_support = SpecSupport(fields=frozenset({"method", "k", "draft"}))  # the neutral form only
    token_requests = TokenRequests(sampled_ids=None, prompt_logprobs=None)  # tokens come back as text

    def connect(self, url: str, api_key: str | None = None, verify: Verify = True) -> MinimalServer:
        return MinimalServer(url, api_key=api_key, verify=verify)

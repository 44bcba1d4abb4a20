"""run_probe calls a server's start_run()/end_run() around the counter snapshots (how
TensorRT-LLM's draining /metrics is polled); ServerBase's defaults do nothing."""

from __future__ import annotations

import httpx
from fake_openai import FakeOpenAIServer  # tests/unit is on sys.path

from specadapt.adapters.base import ServerBase
from specadapt.orchestration.probe import run_probe
from specadapt.records import CounterSnapshot, Prompt, RequestSettings, ServerInfo


class Recorder(ServerBase):
    backend = "rec"

    def __init__(self, url: str, hooks: bool):
        self.base_url, self.model_id, self.events = url, "toy-model", []
        self._http = httpx.Client(base_url=url)
        self.hooks = hooks

    def start_run(self):
        if self.hooks:
            self.events.append("start")

    def end_run(self):
        if self.hooks:
            self.events.append("end")

    def headers(self):
        return {}

    def describe(self):
        return ServerInfo(backend="rec", base_url=self.base_url)

    def read_counters(self):
        c = self._http.get("/toy/counters").json()
        self.events.append("read")
        return CounterSnapshot(drafts=c["drafts"], draft_tokens=c["draft_tokens"], accepted_tokens=c["accepted_tokens"])


def test_hooks_wrap_the_snapshots():
    prompts = [Prompt(id="a", prompt="hi")]
    with FakeOpenAIServer() as fake:
        with_hooks = Recorder(fake.url, hooks=True)
        report = run_probe(with_hooks, prompts, RequestSettings(max_tokens=4), warmup=0)
        without = Recorder(fake.url, hooks=False)
        report2 = run_probe(without, prompts, RequestSettings(max_tokens=4), warmup=0)
    ev = with_hooks.events
    assert ev[0] == "start" and ev[-1] == "end" and ev.count("start") == ev.count("end") == 1
    assert "read" in ev[1:-1] and "start" not in without.events
    assert report.acceptance.known and report.acceptance.drafts == 4
    assert report2.acceptance.known and report2.latency.output_tokens == 4


def test_server_base_defaults_are_the_optional_parts_of_the_contract():
    server = ServerBase()
    assert server.identity_extras == {} and server.verify is True and server.process is None
    assert server.start_run() is None and server.end_run() is None and server.close() is None


def test_a_servers_spec_extras_go_into_every_request_under_the_users_own_keys():
    from specadapt.orchestration.probe import with_spec_extras
    from specadapt.records import RequestSettings

    class Asks(ServerBase):
        spec_extras = {"return_spec_tokens_details": True, "top_k": 5}

    settings = RequestSettings(extra_body={"top_k": 1})
    merged = with_spec_extras(settings, Asks())
    assert merged.extra_body == {"return_spec_tokens_details": True, "top_k": 1}
    assert settings.extra_body == {"top_k": 1}  # the caller's settings are left as they were
    assert with_spec_extras(settings, ServerBase()) is settings

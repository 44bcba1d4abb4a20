"""llama.cpp (llama-cpp-python server) adapter without the server: launch plans,
what it says it cannot read, connect mode on a scripted /v1/models."""

from __future__ import annotations

import httpx
import pytest

from specadapt.adapters import llamacpp as L
from specadapt.analysis.acceptance import acceptance_summary
from specadapt.configs.spec import SpecConfig
from specadapt.errors import UsageError

MODELS = {"object": "list", "data": [{"id": "/m/smol.gguf", "object": "model", "owned_by": "me", "permissions": []}]}


def test_spec_on_plan_uses_prompt_lookup_with_k():
    plan = L.launch_plan(L.LlamaCppLaunch(model="/m/smol.gguf", python="py", port=8401,
                                          spec_config=SpecConfig(method="ngram", k=4),
                                          n_threads=2))
    assert plan.argv == ["py", "-m", "llama_cpp.server", "--model", "/m/smol.gguf", "--host", "127.0.0.1",
                         "--port", "8401", "--n_ctx", "2048", "--n_threads", "2", "--seed", "0",
                         "--draft_model", "prompt-lookup-decoding", "--draft_model_num_pred_tokens", "4"]
    assert plan.spec_enabled and plan.health_path == "/v1/models"
    assert any("no speculative-decoding counters" in n for n in plan.notes)


def test_spec_off_plan_has_no_drafter():
    plan = L.launch_plan(L.LlamaCppLaunch(model="/m/smol.gguf", port=8402, dtype="bfloat16"))
    assert "--draft_model" not in plan.argv and plan.spec_enabled is False
    assert any("--dtype bfloat16 ignored" in n for n in plan.notes)


def test_only_prompt_lookup_is_possible():
    with pytest.raises(UsageError, match="^--spec-config: llama-cpp-python's server drafts only by prompt lookup"):
        L.launch_plan(L.LlamaCppLaunch(model="x", spec_config=SpecConfig(method="eagle3", k=3, draft="/h")))
    flags, notes = L.spec_flags(SpecConfig(method="ngram", k=3, ngram_max=4))
    assert flags[-1] == "3" and "cannot be set" in notes[0]


def test_connect_mode_says_what_it_cannot_tell():
    server = L.LlamaCppServer("http://l.test:8000", transport=httpx.MockTransport(
        lambda r: httpx.Response(200, json=MODELS) if r.url.path == "/v1/models" else httpx.Response(404)))
    info = server.describe()
    assert info.model_id == "/m/smol.gguf" and info.spec_enabled is None and info.version is None
    assert any("cannot tell whether speculative decoding is on" in n for n in info.notes)
    snap = server.read_counters()
    assert not snap.has_spec_counters and acceptance_summary(snap, snap).known is False


def test_launched_server_knows_its_plan():
    server = L.LlamaCppServer("http://l.test:8000", num_pred_tokens=4, launched=True, version="0.3.36",
                              transport=httpx.MockTransport(lambda r: httpx.Response(200, json=MODELS)))
    info = server.describe()
    assert (info.spec_enabled, info.num_speculative_tokens, info.version) == (True, 4, "0.3.36")
    assert info.spec_signal.startswith("the launch plan")


def test_model_resolution_and_missing_interpreter(tmp_path):
    with pytest.raises(UsageError, match="not found"):
        L.LlamaCppBackend().resolve_model(str(tmp_path / "none.gguf"))
    gguf = tmp_path / "a.gguf"
    gguf.write_bytes(b"GGUF")
    assert L.LlamaCppBackend().resolve_model(str(gguf)) == str(gguf.resolve())
    with pytest.raises(UsageError, match="pip install 'specadapt\\[llamacpp\\]'"):
        L.interpreter_version("/bin/false")

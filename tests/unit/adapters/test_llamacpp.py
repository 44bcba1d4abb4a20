"""llama.cpp (llama-cpp-python server) adapter without the server: launch plans,
what it says it cannot read, connect mode on a scripted /v1/models."""
from __future__ import annotations
import httpx
import pytest
from specadapt.adapters import llamacpp as L
from specadapt.analysis.acceptance import acceptance_summary
from specadapt.configs.spec import SpecConfig
from specadapt.errors import UsageError
import sys
from specadapt.adapters.hardware import NOT_KNOWN

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


# llama.cpp (llama-cpp-python server) adapter edges: when specadapt says speculation is on (only from
URL = "http://l.test:8000"
NO_COUNTERS_NOTE = ("llama-cpp-python's server exposes no speculative-decoding counters (no /metrics): "
                    "acceptance rate and length cannot be read")
CANNOT_TELL = ("cannot tell whether speculative decoding is on: llama-cpp-python's server does not expose its draft "
               "settings; the version is unknown too (no /version)")
WINDOW = ("the n-gram window cannot be set through llama-cpp-python's server (its prompt-lookup drafter matches "
          "n-grams of up to 2 tokens); ignored")
NOT_INSTALLED = ("llama-cpp-python's server is not installed for {}: pip install 'specadapt[llamacpp]' (builds "
                 "llama.cpp from source, minutes), or pass --python with an interpreter that has it")


def models_only(seen: list | None = None) -> httpx.MockTransport:
    def handler(request: httpx.Request) -> httpx.Response:
        if seen is not None:
            seen.append(request)
        return httpx.Response(200, json=MODELS) if request.url.path == "/v1/models" else httpx.Response(404)
    return httpx.MockTransport(handler)


@pytest.fixture
def fake_llama_cpp(tmp_path, monkeypatch):
    """PYTHONPATH with a stand-in llama_cpp 0.3.16 (and its server.app) for child interpreters."""
    pkg = tmp_path / "site" / "llama_cpp"
    (pkg / "server").mkdir(parents=True)
    (pkg / "__init__.py").write_text('__version__ = "0.3.16"\n')
    (pkg / "server" / "__init__.py").write_text("")
    (pkg / "server" / "app.py").write_text("")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "site"))
    return pkg


# ------------------------------------------------------------------ speculation on or off

def test_connect_mode_notes_word_for_word_and_defaults():
    seen: list[httpx.Request] = []
    server = L.LlamaCppServer(URL, api_key="sk-llama", transport=models_only(seen))
    assert server.verify is True and server.launched is False
    info = server.describe()
    assert info.spec_enabled is None and info.spec_method is None and info.num_speculative_tokens is None
    assert info.notes == [NOT_KNOWN, NO_COUNTERS_NOTE, CANNOT_TELL]
    assert seen and all(r.headers["authorization"] == "Bearer sk-llama" for r in seen)


def test_launched_with_prompt_lookup_names_the_method():
    server = L.LlamaCppServer(URL, num_pred_tokens=4, launched=True, transport=models_only())
    info = server.describe()
    assert (info.spec_enabled, info.spec_method, info.num_speculative_tokens) == (True, "ngram (prompt lookup)", 4)
    assert info.spec_signal == "the launch plan (the server itself does not say)"
    assert CANNOT_TELL not in info.notes and NO_COUNTERS_NOTE in info.notes


def test_launched_without_drafter_is_off():
    info = L.LlamaCppServer(URL, launched=True, transport=models_only()).describe()
    assert (info.spec_enabled, info.spec_method, info.num_speculative_tokens) == (False, None, None)
    assert CANNOT_TELL not in info.notes


def test_connect_launched_carries_what_the_plan_started(fake_llama_cpp):
    backend = L.LlamaCppBackend()
    backend.check_launch(L.LlamaCppLaunch(model="/m/smol.gguf", python=sys.executable, port=8411))
    for spec, k in [(SpecConfig(method="ngram", k=4), 4), (None, None),
                    (SpecConfig(method="off", k=4), None)]:  # a k left in a config whose method is off drafts nothing
        opts = L.LlamaCppLaunch(model="/m/smol.gguf", python=sys.executable, port=8411, spec_config=spec)
        server = backend.connect_launched(opts, "http://127.0.0.1:8411")
        assert isinstance(server, L.LlamaCppServer) and server.base_url == "http://127.0.0.1:8411"
        assert (server.launched, server.num_pred_tokens, server.version) == (True, k, "0.3.16")
        assert backend.launch_plan(opts).spec_enabled is (k is not None)


def test_connect_launched_without_check_has_no_version():
    opts = L.LlamaCppLaunch(model="/m/smol.gguf", python="/opt/other/python", port=8412)
    server = L.LlamaCppBackend().connect_launched(opts, "http://127.0.0.1:8412")
    assert server.version is None and server.launched is True


# ------------------------------------------------------------------ the interpreter's version

def test_check_launch_reads_the_version_from_that_interpreter(fake_llama_cpp):
    backend = L.LlamaCppBackend()
    opts = L.LlamaCppLaunch(model="/m/smol.gguf", python=sys.executable, port=8413)
    assert backend.launched_version(opts) is None
    backend.check_launch(opts)
    assert backend.launched_version(opts) == "0.3.16"
    assert L.interpreter_version(sys.executable) == "0.3.16"


def test_a_llama_cpp_without_its_server_is_not_enough(fake_llama_cpp):
    (fake_llama_cpp / "server" / "app.py").unlink()  # pip install llama-cpp-python without [server]
    with pytest.raises(UsageError) as exc:
        L.interpreter_version(sys.executable)
    assert str(exc.value) == NOT_INSTALLED.format(sys.executable)


def test_not_installed_word_for_word():
    with pytest.raises(UsageError) as exc:
        L.interpreter_version("/bin/false")
    assert str(exc.value) == NOT_INSTALLED.format("/bin/false")


def test_an_interpreter_that_cannot_run(tmp_path):
    missing = str(tmp_path / "no-python")
    with pytest.raises(UsageError) as exc:
        L.interpreter_version(missing)
    assert str(exc.value).startswith(f"cannot run --python {missing}: ") and "No such file" in str(exc.value)


# ------------------------------------------------------------------ launch plan

def test_full_launch_plan_and_its_notes():
    opts = L.LlamaCppLaunch(model="/m/smol.gguf", python="py", host="0.0.0.0", port=8414, dtype="float16",
                            spec_config=SpecConfig(method="ngram", k=3, ngram_min=2), extra_args=["--verbose", "true"])
    plan = L.launch_plan(opts)
    spec = ["--draft_model", "prompt-lookup-decoding", "--draft_model_num_pred_tokens", "3"]
    assert plan.argv == ["py", "-m", "llama_cpp.server", "--model", "/m/smol.gguf", "--host", "0.0.0.0",
                         "--port", "8414", "--n_ctx", "2048", "--seed", "0", *spec, "--verbose", "true"]
    assert (plan.backend, plan.host, plan.port, plan.model, plan.health_path) == (
        "llamacpp", "0.0.0.0", 8414, "/m/smol.gguf", "/v1/models")
    assert plan.spec_enabled is True and plan.spec_args == spec
    assert plan.notes == [WINDOW, "--dtype float16 ignored: the GGUF file fixes its own types",
                          "llama-cpp-python's server exposes no speculative-decoding counters (no /metrics): "
                          "acceptance will be reported as unknown"]
    assert L.LlamaCppBackend().launch_plan(opts) == plan


@pytest.mark.parametrize("spec,notes", [
    (SpecConfig(method="ngram", k=3), []),
    (SpecConfig(method="ngram", k=3, ngram_min=1), [WINDOW]),
    (SpecConfig(method="ngram", k=3, ngram_max=2), [WINDOW]),
    (None, []),
])
def test_spec_flags_notes(spec, notes):
    flags, got = L.spec_flags(spec)
    assert got == notes
    assert flags == ([] if spec is None else ["--draft_model", "prompt-lookup-decoding",
                                              "--draft_model_num_pred_tokens", "3"])


# ------------------------------------------------------------------ the backend

def test_backend_connect_passes_key_and_verification():
    server = L.LlamaCppBackend().connect("http://l.test:8000/v1", api_key="sk-2")
    assert isinstance(server, L.LlamaCppServer) and server.base_url == URL
    assert server.headers() == {"Authorization": "Bearer sk-2"} and server.verify is True
    assert server.launched is False and server.num_pred_tokens is None and server.version is None
    assert L.LlamaCppBackend().connect(URL, verify=False).verify is False


def test_backend_default_model_is_the_embedded_gguf(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECADAPT_CACHE_DIR", str(tmp_path))
    with pytest.raises(UsageError) as exc:
        L.LlamaCppBackend().resolve_model(None)
    gguf = L.embedded_gguf_path()
    assert str(exc.value) == f"GGUF model {gguf} not found: run 'specadapt models fetch'"
    gguf.parent.mkdir(parents=True)
    gguf.write_bytes(b"GGUF")
    assert L.LlamaCppBackend().resolve_model(None) == str(gguf.resolve())


def test_backend_missing_model_file_word_for_word(tmp_path):
    missing = tmp_path / "none.gguf"
    with pytest.raises(UsageError) as exc:
        L.LlamaCppBackend().resolve_model(str(missing))
    assert str(exc.value) == f"GGUF model {missing} not found: pass an existing .gguf file"


def test_backend_version_is_the_installed_distribution(tmp_path, monkeypatch):
    dist = tmp_path / "llama_cpp_python-0.3.36.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: llama_cpp_python\nVersion: 0.3.36\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert L.LlamaCppBackend().version() == "0.3.36"


def test_backend_version_without_llama_cpp_python(monkeypatch):
    def not_installed(name):
        raise L.metadata.PackageNotFoundError(name)
    monkeypatch.setattr(L.metadata, "version", not_installed)
    assert L.LlamaCppBackend().version() is None

"""The float64 reference check (orchestration/reference_check.py): the verdict from the true margin,
its notes and fallbacks, the /tokenize request, and the margin of a real (tiny) model."""

from __future__ import annotations

import json
import sys

import httpx
import pytest

from specadapt.errors import MissingDependency, UsageError
from specadapt.orchestration.reference_check import ReferenceScorer
from specadapt.records import Divergence, Prompt, RequestRecord, Triage

CHAT = Prompt(id="p", category="open", messages=[{"role": "user", "content": "hi"}])
COMPLETION = Prompt(id="p", category="open", prompt="def f(")


class Srv:
    base_url = "http://off.test"
    model_id = "m"
    verify = "/ca.pem"

    def headers(self):
        return {"Authorization": "Bearer k"}


def scorer(tmp_path, margin=None, prompt_ids=(1, 2)):
    """A scorer whose model is replaced: ``margin`` a number, or a callable of (prefix, off, on)."""
    (tmp_path / "config.json").write_text("{}")
    s = ReferenceScorer(tmp_path)
    s.calls = []

    def fake_margin(prefix, off_id, on_id):
        s.calls.append((prefix, off_id, on_id))
        return margin(prefix, off_id, on_id) if callable(margin) else margin
    s.margin = fake_margin
    if prompt_ids is not None:
        s.prompt_ids = lambda server, prompt: list(prompt_ids)
    return s


def div(off_token="token_id:7", on_token="token_id:9", index=2) -> Divergence:
    return Divergence(prompt_id="p", category="open", concurrency=1, repeat=0, kind="token", token_index=index,
                      char_index=5, off_token=off_token, on_token=on_token, off_context="", on_context="",
                      off_tokens=4, on_tokens=4)


def off_rec(tokens=("token_id:3", "token_id:4", "token_id:7", "token_id:8")) -> RequestRecord:
    return RequestRecord(prompt_id="p", category="open", api="chat", side="off", ok=True, tokens=list(tokens))


SERVER = Triage(verdict="unknown", source="server-logprobs", margin=0.3, margin_is_lower_bound=True, threshold=0.5,
                server_margin=0.3, top_logprobs={"a": -0.1}, note="server note")


def test_the_model_sees_the_prompt_ids_then_the_off_tokens_before_the_divergence(tmp_path):
    s = scorer(tmp_path, margin=0.1, prompt_ids=(11, 12))
    s.triage(Srv(), CHAT, div(), off_rec(), 0.5, None)
    assert s.calls == [([11, 12, 3, 4], 7, 9)]


@pytest.mark.parametrize("m, verdict", [(0.5, "suspect"), (-0.5, "suspect"), (0.375, "near-tie"),
                                        (-0.375, "near-tie"), (0.0, "near-tie"), (3.0, "suspect")])
def test_the_true_margin_decides_by_its_size(tmp_path, m, verdict):
    t = scorer(tmp_path, margin=m).triage(Srv(), CHAT, div(), off_rec(), 0.5, SERVER)
    assert (t.verdict, t.source, t.margin, t.reference_margin, t.threshold) == (
        verdict, "reference-float64", m, m, 0.5)
    # the server's figures stay beside it; the margin is exact, not a bound
    assert (t.server_margin, t.top_logprobs, t.margin_is_lower_bound) == (0.3, {"a": -0.1}, False)


def test_a_negative_margin_says_the_spec_off_server_flipped(tmp_path):
    flipped = "float64 prefers the spec-on token: the spec-off server is the one that flipped"
    t = scorer(tmp_path, margin=-0.25).triage(Srv(), CHAT, div(), off_rec(), 0.5, SERVER)
    assert t.note == "server note; " + flipped
    t = scorer(tmp_path, margin=-0.25).triage(Srv(), CHAT, div(), off_rec(), 0.5, None)
    assert (t.note, t.server_margin, t.top_logprobs) == (flipped, None, {})
    for m in (0.0, 0.25):
        assert scorer(tmp_path, margin=m).triage(Srv(), CHAT, div(), off_rec(), 0.5, SERVER).note == "server note"


@pytest.mark.parametrize("d, rec", [
    (div(index=-1), off_rec()),  # no token position (no logprobs)
    (div(off_token="(in"), off_rec()),  # tokens as text, not ids
    (div(on_token="(s"), off_rec()),
    (div(on_token=None), off_rec()),  # the spec-on output ended here
    (div(), off_rec(("token_id:3", "x", "token_id:7"))),  # a text token in the prefix
])
def test_without_token_ids_the_server_triage_stands_with_a_note(tmp_path, d, rec):
    s = scorer(tmp_path, margin=0.1)
    t = s.triage(Srv(), CHAT, d, rec, 0.5, SERVER)
    assert t == SERVER.model_copy(update={"note": "server note; reference not used: the server gave no token ids"})
    assert s.calls == []
    t = s.triage(Srv(), CHAT, d, rec, 0.25, None)
    assert t == Triage(verdict="unknown", source="none", threshold=0.25,
                       note="reference not used: the server gave no token ids")


def test_a_text_token_after_the_divergence_does_not_matter(tmp_path):
    s = scorer(tmp_path, margin=0.1)
    t = s.triage(Srv(), CHAT, div(), off_rec(("token_id:3", "token_id:4", "token_id:7", "x")), 0.5, None)
    assert t.source == "reference-float64" and s.calls == [([1, 2, 3, 4], 7, 9)]


def served(handler) -> Srv:
    """The spec-off server answered by ``handler`` (the wire's transport seam)."""
    srv = Srv()
    srv.transport = httpx.MockTransport(handler)
    return srv


@pytest.mark.parametrize("answer, name", [
    (httpx.ConnectError("refused"), "ServerUnreachable"),
    (httpx.Response(500, json={"error": "x"}), "ServerError"),
    (httpx.Response(404, json={"detail": "Not Found"}), "RequestRefused"),
    (httpx.Response(200, content=b"<html>"), "NotAServer"),
    (httpx.Response(200, json={"count": 2}), "NotAServer"),
    (httpx.Response(200, json={"tokens": ["a"]}), "NotAServer"),
])
def test_a_tokenize_failure_leaves_the_server_triage_with_the_reason(tmp_path, answer, name):
    def handler(request):
        if isinstance(answer, Exception):
            raise answer
        return answer
    s = scorer(tmp_path, margin=0.1, prompt_ids=None)
    t = s.triage(served(handler), CHAT, div(), off_rec(), 0.5, SERVER)
    assert t == SERVER.model_copy(update={"note": f"server note; reference not used: /tokenize failed ({name})"})
    t = s.triage(served(handler), CHAT, div(), off_rec(), 0.5, None)
    assert t.note == f"reference not used: /tokenize failed ({name})" and t.verdict == "unknown"
    assert s.calls == []


@pytest.mark.parametrize("prompt, fields", [
    (CHAT, {"messages": [{"role": "user", "content": "hi"}], "add_generation_prompt": True}),
    (COMPLETION, {"prompt": "def f("}),
])
def test_tokenize_asks_the_spec_off_server_for_the_prompt_as_it_templates_it(tmp_path, prompt, fields):
    seen = []

    def handler(request):
        seen.append(request)
        return httpx.Response(200, json={"tokens": [5, 6], "count": 2})
    s = scorer(tmp_path, prompt_ids=None)
    assert s.prompt_ids(served(handler), prompt) == [5, 6]
    request, = seen
    assert (request.method, str(request.url)) == ("POST", "http://off.test/tokenize")
    assert json.loads(request.content) == {"model": "m", **fields}
    assert request.headers["Authorization"] == "Bearer k"
    assert request.extensions["timeout"] == {"connect": 60, "read": 60, "write": 60, "pool": 60}


def test_a_directory_without_config_json_is_refused(tmp_path):
    with pytest.raises(UsageError) as err:
        ReferenceScorer(tmp_path / "nowhere")
    assert str(err.value) == f"--reference {tmp_path / 'nowhere'} is not a local HF model directory (no config.json)"
    (tmp_path / "config.json").mkdir()  # a directory named config.json is not a config
    with pytest.raises(UsageError):
        ReferenceScorer(tmp_path)


@pytest.mark.parametrize("missing", ["torch", "transformers"])
def test_a_missing_package_names_the_extra(tmp_path, monkeypatch, missing):
    monkeypatch.setitem(sys.modules, missing, None)  # import raises ImportError
    s = scorer(tmp_path)
    with pytest.raises(MissingDependency) as err:
        ReferenceScorer._load(s)
    assert str(err.value) == (f"--reference (float64 recomputation) needs the Python package '{missing}', "
                              "which is not installed: pip install 'specadapt[reference]'")


# --- the margin itself, on a tiny real model -----------------------------------------------------

@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                                   initializer_range=0.5, tie_word_embeddings=False)
    model = transformers.LlamaForCausalLM(cfg).to(torch.float32).eval()  # saved in float32
    out = tmp_path_factory.mktemp("tiny-ref")
    model.save_pretrained(str(out))
    return out


def test_margin_is_the_float64_log_ratio_at_the_last_position(tiny_dir):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    s = ReferenceScorer(tiny_dir)
    prefix = [3, 1, 4, 1, 5]
    m = s.margin(prefix, 7, 9)
    assert next(s._load().parameters()).dtype == torch.float64  # loaded in float64 whatever it was saved in
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(tiny_dir), dtype=torch.float64)
    with torch.no_grad():
        p = torch.softmax(ref(torch.tensor([prefix])).logits[0, -1], -1)
    assert m == pytest.approx(float(torch.log(p[7] / p[9])), abs=1e-12)
    assert abs(m) > 1e-3  # a margin that tells the two tokens apart
    assert s.margin(prefix, 9, 7) == pytest.approx(-m, abs=1e-12) and s.margin(prefix, 7, 7) == 0.0
    # the last position, not an earlier one
    with torch.no_grad():
        p_before = torch.softmax(ref(torch.tensor([prefix])).logits[0, -2], -1)
    assert abs(m - float(torch.log(p_before[7] / p_before[9]))) > 1e-6
    # and float64 is not float32: the saved float32 model gives a margin that differs in the last digits
    f32 = transformers.AutoModelForCausalLM.from_pretrained(str(tiny_dir), dtype=torch.float32)
    with torch.no_grad():
        lp32 = torch.log_softmax(f32(torch.tensor([prefix])).logits[0, -1].double(), -1)
    assert abs(m - float(lp32[7] - lp32[9])) > 1e-12
    assert s._load() is s._load()  # loaded once


def test_a_divergence_at_the_first_token_is_scored_on_the_prompt_alone(tmp_path):
    s = scorer(tmp_path, margin=-0.75, prompt_ids=(11, 12))
    t = s.triage(Srv(), CHAT, div(index=0, off_token="token_id:3"), off_rec(), 0.5, None)
    assert (t.verdict, t.source, t.reference_margin) == ("suspect", "reference-float64", -0.75)
    assert s.calls == [([11, 12], 3, 9)]


def test_logits_a_model_gives_in_float32_are_taken_to_float64_before_the_softmax(tmp_path, monkeypatch):
    """Some architectures cast their logits with ``.float()`` whatever the weights (Mamba, Mamba2,
    FalconMamba, NemotronH in transformers): the log-softmax must still run in float64. Here two logits
    3 * 2**-22 apart in a vocabulary of 1000: their log-probabilities lie next to -log(1000) ~ -6.9,
    where float32 steps by 2**-21, so a float32 log-softmax cannot keep that difference."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    logits = torch.zeros(1, 2, 1000, dtype=torch.float32)
    logits[0, -1, 0] = 3 * 2.0 ** -22

    class Float32Logits:
        def eval(self):
            return self

        def __call__(self, ids):
            assert ids.tolist() == [[5, 6]]
            return type("Out", (), {"logits": logits})()

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained",
                        staticmethod(lambda path, dtype: Float32Logits()))
    (tmp_path / "config.json").write_text("{}")
    s = ReferenceScorer(tmp_path)
    assert s.margin([5, 6], 0, 1) == pytest.approx(3 * 2.0 ** -22, abs=1e-15)
    assert s.margin([5, 6], 1, 0) == pytest.approx(-3 * 2.0 ** -22, abs=1e-15)

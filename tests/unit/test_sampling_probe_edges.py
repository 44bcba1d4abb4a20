"""orchestration/sampling.py edges: the requests that succeed (path, body, timeout), the client's own
connections and TLS setting against a loopback server, the report's settings, and the float64
reference (`--reference DIR`): its tokenizer, its missing-package messages, the prompt state it
keeps per prompt and the float64 log-softmax.

vLLM's answer shapes are 0.32's (see tests/unit/test_sampling_probe.py): /tokenize answers
``{"count", "max_model_len", "tokens", "token_strs"}``; prompt_logprobs are a list with None for
the first prompt token, then ``{"<id>": {"logprob", "rank", "decoded_token"}}`` per position.
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import json
import re
import shutil
import ssl
import sys
import types

import httpx
import pytest

from specadapt.analysis import sampling_check as C
from specadapt.analysis.sampling_stats import TokenDraw
from specadapt.errors import MissingDependency, UsageError
from specadapt.models import embedded_model_dir
from specadapt.orchestration import reference_target as T
from specadapt.orchestration import sampling as S
from specadapt.records import AcceptanceSummary, ChatMessage, Prompt, ServerInfo
from specadapt.records.sampling_report import SamplingSettings
from specadapt.wire.http import Wire

CHAT = Prompt(id="chat", messages=[ChatMessage(role="user", content="Copy: a b c")])
TEXT = Prompt(id="text", prompt="1, 2, 3,", max_tokens=5)
# what every request of a client made with request timeout 7 s carries (httpx's per-request timeout)
TIMEOUT_7 = {"connect": 10.0, "read": 7, "write": 30.0, "pool": None}


class FakeServer:
    base_url = "http://fake:8000"
    model_id = "m"
    verify = True

    def headers(self) -> dict[str, str]:
        return {"Authorization": "Bearer k"}


def entry(logprob: float, rank: int) -> dict:
    return {"logprob": logprob, "rank": rank, "decoded_token": "x"}


# --- requests that succeed --------------------------------------------------------------------------------
def test_tokenize_on_server_posts_each_prompt_to_tokenize_and_returns_its_ids():
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        seen.append((request.method, request.url.path, body, request.extensions["timeout"]))
        tokens = [1, 4093, 198] if "messages" in body else [33, 28]
        return httpx.Response(200, json={"count": len(tokens), "max_model_len": 8192, "tokens": tokens,
                                         "token_strs": None})

    ids = asyncio.run(S.tokenize_on_server(FakeServer(), [CHAT, TEXT], 7, transport=httpx.MockTransport(handler)))
    assert ids == [[1, 4093, 198], [33, 28]]
    assert seen == [
        ("POST", "/tokenize", {"model": "m", "messages": [{"role": "user", "content": "Copy: a b c"}],
                               "add_generation_prompt": True}, TIMEOUT_7),
        ("POST", "/tokenize", {"model": "m", "prompt": "1, 2, 3,"}, TIMEOUT_7)]


def test_samples_are_posted_to_v1_completions_with_the_request_timeout():
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append((request.method, request.url.path, request.extensions["timeout"]))
        return httpx.Response(200, json={"choices": [{"text": "", "finish_reason": "length",
                                                      "logprobs": {"tokens": ["token_id:5", "token_id:6"]}}]})

    inputs = C.inputs_for([TEXT], [[33, 28]], max_tokens=2)
    samples = asyncio.run(S.draw_samples(FakeServer(), inputs, 2, 40, 1, 7, transport=httpx.MockTransport(handler)))
    assert seen == [("POST", "/v1/completions", TIMEOUT_7)] * 2
    assert samples == [C.Sample("text", 0, 40, (33, 28), (5, 6), "length"),
                       C.Sample("text", 1, 41, (33, 28), (5, 6), "length")]


def test_scoring_on_the_server_gives_one_draw_per_sampled_token():
    sample = C.Sample(prompt_id="p", index=3, seed=3, prompt_ids=(1,), tokens=(2, 3))
    seen, ticks = [], []

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        seen.append((request.method, request.url.path, body["prompt"], body["prompt_logprobs"],
                     request.extensions["timeout"]))
        plps = [None, {"2": entry(-0.5, 1), "4": entry(-1.2, 2)},
                {"3": entry(-2.5, 3), "5": entry(-0.1, 1), "6": entry(-2.4, 2)}]  # 3 outside the top 2
        return httpx.Response(200, json={"choices": [{"text": "", "prompt_logprobs": plps,
                                                      "prompt_token_ids": [1, 2, 3]}]})

    draws = asyncio.run(S.score_on_server(FakeServer(), [sample], 2, 1, 7,
                                          progress=lambda rec: ticks.append((rec.prompt_id, rec.ok)),
                                          transport=httpx.MockTransport(handler)))
    assert seen == [("POST", "/v1/completions", [1, 2, 3], 2, TIMEOUT_7)]
    assert draws == [[TokenDraw(top={2: -0.5, 4: -1.2}, token=2, logprob=-0.5, position=0, prompt_id="p"),
                      TokenDraw(top={5: -0.1, 6: -2.4}, token=3, logprob=-2.5, position=1, prompt_id="p")]]
    assert ticks == [("p", True)]


def test_the_client_times_out_reads_at_the_request_timeout_and_connects_at_ten_seconds():
    seen = []

    def handler(request):
        seen.append(request)
        return httpx.Response(200, json={"tokens": [1]})

    asyncio.run(S.tokenize_on_server(FakeServer(), [TEXT], 7, transport=httpx.MockTransport(handler)))
    request, = seen
    assert request.extensions["timeout"] == {"connect": 10.0, "read": 7, "write": 30.0, "pool": None}
    assert request.headers["Authorization"] == "Bearer k" and str(request.url) == "http://fake:8000/tokenize"


# --- the client's own connections, against a loopback server ----------------------------------------------
class Loopback:
    """An HTTP/1.1 server on 127.0.0.1 in the test's own event loop: answers every request with ``{}``
    on a kept-alive connection and counts the connections it accepted."""

    def __init__(self, tls: ssl.SSLContext | None = None):
        self.tls = tls
        self.connections = 0

    async def __aenter__(self) -> Loopback:
        self.server = await asyncio.start_server(self.serve, "127.0.0.1", 0, ssl=self.tls)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc) -> None:
        self.server.close()

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = re.search(rb"(?i)content-length: *(\d+)", head)
                await reader.readexactly(int(length.group(1)) if length else 0)
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
            pass
        finally:
            writer.close()


def server_at(url: str, verify=True) -> FakeServer:
    server = FakeServer()
    server.base_url, server.verify = url, verify
    return server


async def post_at_once(server: FakeServer, concurrency: int, n: int) -> list[int]:
    """``n`` POSTs started together on one client of ``concurrency`` connections: their statuses."""
    async with Wire.for_server(server, timeout_s=10, concurrency=concurrency) as client:
        answers = await asyncio.gather(*(S._post(client, "/v1/completions", {}, "source server") for _ in range(n)))
    return [status for status, _, _ in answers]


def test_a_client_opens_at_most_concurrency_connections():
    async def run():
        async with Loopback() as lo:
            statuses = await post_at_once(server_at(f"http://127.0.0.1:{lo.port}"), 2, 6)
            return statuses, lo.connections

    statuses, connections = asyncio.run(run())
    assert statuses == [200] * 6 and connections == 2  # six requests at once, over two kept-alive connections


def self_signed(tmp_path) -> ssl.SSLContext:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "specadapt test")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
            .sign(key, hashes.SHA256()))
    (tmp_path / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (tmp_path / "key.pem").write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                         serialization.NoEncryption()))
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(tmp_path / "cert.pem", tmp_path / "key.pem")
    return ctx


def test_a_client_honours_the_servers_tls_setting(tmp_path):
    pytest.importorskip("cryptography")

    async def run():
        async with Loopback(tls=self_signed(tmp_path)) as lo:
            return await post_at_once(server_at(f"https://127.0.0.1:{lo.port}", verify=False), 1, 1)

    assert asyncio.run(run()) == [200]  # --insecure: a self-signed certificate is accepted


# --- the report ---------------------------------------------------------------------------------------------
def settings(**kw) -> SamplingSettings:
    return SamplingSettings(**{"samples": 1, "max_tokens": 2, "alpha": 0.01, "top_logprobs": 2, "concurrency": 1,
                               "seed": 0, "request_timeout_s": 60, "source": "server",
                               "tokenizer": "the spec-off server's /tokenize", **kw})


def test_the_report_keeps_the_acceptance_and_states_the_tokens_needed_for_the_settings_targets():
    inputs = C.inputs_for([TEXT], [[4]], 2)
    samples = [C.Sample("text", 0, 0, (4,), (7, 8))]
    draws = [[TokenDraw(top={7: -0.1}, token=7), TokenDraw(top={8: -0.1}, token=8)]]
    on = ServerInfo(backend="vllm", base_url="http://on", model_id="m", spec_enabled=True)
    seen = AcceptanceSummary(known=True, drafts=4, draft_tokens=8, accepted_tokens=3)
    report = C.sampling_report(settings(tv_targets=[0.5, 1.0]), on, None, inputs, samples, draws, seen)
    assert report.acceptance == seen
    # lambda* of 19 dof at alpha 0.01 / 3 and power 0.8 is about 30, so TV 0.5 needs ~30 / (4 * 0.25) tokens:
    # the too-few floor of 5 * 20 tokens is what is needed
    assert [(t.tv, t.samples_needed) for t in report.stats.samples_needed] == [(0.5, 100), (1.0, 100)]
    assert C.sampling_report(settings(), on, None, inputs, samples, draws).acceptance is None


# --- the float64 reference ------------------------------------------------------------------------------------
def model_dir(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    return tmp_path


def test_a_reference_without_torch_says_which_extra_to_install(tmp_path, monkeypatch):
    ref = T.ReferenceTarget(model_dir(tmp_path))
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(MissingDependency) as err:
        ref.tokenize(TEXT)
    assert str(err.value) == ("--reference (float64 recomputation) needs the Python package 'torch', which is not "
                              "installed: pip install 'specadapt[reference]'")
    monkeypatch.setitem(sys.modules, "torch", types.ModuleType("torch"))
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(MissingDependency) as err:
        ref.tokenize(TEXT)
    assert str(err.value) == ("--reference (float64 recomputation) needs the Python package 'transformers', which is "
                              "not installed: pip install 'specadapt[reference]'")


SMOL = embedded_model_dir()


@pytest.fixture(scope="module")
def smol_tokenizer():
    pytest.importorskip("transformers")
    tokenizers = pytest.importorskip("tokenizers")
    if not (SMOL / "tokenizer.json").is_file():
        pytest.skip(f"the embedded model is not at {SMOL}")
    return tokenizers.Tokenizer.from_file(str(SMOL / "tokenizer.json"))


def test_the_reference_tokenizes_chat_with_the_template_and_the_generation_prompt(smol_tokenizer):
    # SmolLM2's chat_template.jinja rendered by hand: its default system turn, the user turn, then the
    # assistant's opening (add_generation_prompt); its tokenizer adds no special tokens to plain text
    rendered = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
                "<|im_start|>user\nCopy: a b c<|im_end|>\n<|im_start|>assistant\n")
    ref = T.ReferenceTarget(SMOL)
    assert ref.tokenize(CHAT) == smol_tokenizer.encode(rendered).ids
    assert ref.tokenize(TEXT) == smol_tokenizer.encode("1, 2, 3,").ids
    assert ref.tokenize(CHAT)[-4:] == smol_tokenizer.encode("<|im_start|>assistant\n").ids


def test_a_reference_without_a_chat_template_takes_completion_prompts_only(smol_tokenizer, tmp_path):
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):  # no chat_template.jinja
        shutil.copy(SMOL / name, tmp_path / name)
    ref = T.ReferenceTarget(tmp_path)
    with pytest.raises(UsageError) as err:
        ref.tokenize(CHAT)
    assert str(err.value) == (f"--reference {tmp_path} has no chat template: give completion prompts ('prompt') or "
                              "a model with one")
    assert ref.tokenize(TEXT) == smol_tokenizer.encode("1, 2, 3,").ids


class ListTokenizer:
    """transformers 4's answer to apply_chat_template(tokenize=True): a plain list of ids."""

    chat_template = "{{ messages }}"

    def __init__(self):
        self.calls = []

    def apply_chat_template(self, messages, add_generation_prompt=False, tokenize=True):
        self.calls.append((messages, add_generation_prompt, tokenize))
        return [5, 6, 7] if tokenize else "text"


def test_a_chat_template_answer_as_a_plain_list_is_read_too(tmp_path):
    ref = T.ReferenceTarget(model_dir(tmp_path))
    ref._tokenizer = tok = ListTokenizer()  # a loaded tokenizer is used as it is
    assert ref.tokenize(CHAT) == [5, 6, 7]
    assert tok.calls == [([{"role": "user", "content": "Copy: a b c"}], True, True)]


class Bigram:
    """A causal LM whose float32 logits at a position depend only on the token there (a model whose head
    stays in float32); counts its forward passes by the length of their input."""

    def __init__(self, torch, vocab: int = 12):
        self.torch = torch
        self.table = torch.randn(vocab, vocab, generator=torch.Generator().manual_seed(1)).float() * 3
        self.passes = []

    def eval(self):
        return self

    def __call__(self, input_ids, use_cache=None, past_key_values=None):
        self.passes.append(input_ids.shape[1])
        return types.SimpleNamespace(logits=self.table[input_ids[0]].unsqueeze(0), past_key_values=["cache"])


def test_the_reference_scores_in_float64_and_runs_each_prompt_once(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    model, loads = Bigram(torch), []

    def from_pretrained(path, dtype=None):
        loads.append((path, dtype))
        return model

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", from_pretrained)
    ref = T.ReferenceTarget(model_dir(tmp_path))
    samples = [C.Sample("p", 0, 0, (3, 4, 5), (6, 7, 8)), C.Sample("p", 1, 1, (3, 4, 5), (9, 6)),
               C.Sample("q", 2, 2, (10, 11), (1,))]
    scored = S.score_on_reference(ref, samples, k=3)
    assert loads == [(str(tmp_path), torch.float64)]
    # prompt p once, its first sample's 2 tokens before the last, the second's 1; prompt q once
    assert model.passes == [3, 2, 1, 2]
    for sample, draws in zip(samples, scored, strict=True):
        before = [sample.prompt_ids[-1], *sample.tokens[:-1]]  # the token whose logits give position j
        assert len(draws) == len(sample.tokens)
        for j, d in enumerate(draws):
            row = torch.log_softmax(model.table[before[j]].double(), -1)  # float64 of the float32 logits
            values, ids = torch.topk(row, 3)
            assert d == TokenDraw(top={int(t): float(v) for t, v in zip(ids, values, strict=True)},
                                  token=sample.tokens[j], logprob=float(row[sample.tokens[j]]), position=j, prompt_id=sample.prompt_id)


def test_the_reference_keeps_the_prompts_cache_even_when_the_config_turns_caching_off(tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(vocab_size=48, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
                                      use_cache=False)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(tmp_path)
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float64)
    sample = C.Sample("p", 0, 0, (3, 4, 5), (6, 7, 8))
    draws = T.ReferenceTarget(tmp_path).score(sample, k=4)
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([[3, 4, 5, 6, 7, 8]])).logits[0], -1)
    assert [d.logprob for d in draws] == pytest.approx([float(logp[2 + j, t]) for j, t in enumerate((6, 7, 8))],
                                                       abs=1e-9)

"""`specadapt equiv --sampling` end to end against a loopback fake of vLLM's API (no model).

The fake serves a fixed 40-token Markov chain: /tokenize, /v1/completions sampling (seeded,
``token_id:N`` logprobs) and prompt_logprobs scoring shaped as vLLM 0.32 answers them,
/v1/models, /version and vLLM's /metrics names. A healthy fake samples the chain itself; a
faulty one samples it at temperature 0.5 (what a broken sampler might do).
"""

from __future__ import annotations

import json
import math
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest
from click.testing import CliRunner
from junitparser import JUnitXml

from specadapt.cli import cli

VOCAB = 40
TABLE = np.random.default_rng(7).normal(size=(VOCAB, VOCAB)) * 2.0
MAX_LOGPROBS = 20
REFUSED = "Requested prompt logprobs of {k}, which is greater than max allowed: 20"


def probs(prev: int) -> np.ndarray:
    logits = TABLE[prev % VOCAB]
    p = np.exp(logits - logits.max())
    return p / p.sum()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def _json(self, body, status=200):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _text(self, text: str):
        data = text.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        fake = self.server.fake
        if self.path == "/v1/models":
            return self._json({"object": "list", "data": [{"id": "fake", "root": "fake", "max_model_len": 2048}]})
        if self.path == "/version":
            return self._json({"version": "0.32.0"})
        if self.path == "/metrics":
            lines = [f"vllm:generation_tokens_total {fake.generated}"]
            if fake.spec:
                lines += [f"vllm:spec_decode_num_drafts_total {fake.requests}",
                          f"vllm:spec_decode_num_draft_tokens_total {4 * fake.requests}",
                          f"vllm:spec_decode_num_accepted_tokens_total {fake.requests}"]
            return self._text("\n".join(lines) + "\n")
        return self._json({"detail": "Not Found"}, 404)

    def do_POST(self):
        fake = self.server.fake
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        with fake.lock:
            fake.bodies.append((self.path, body))
        if self.path == "/tokenize":
            return self._json({"count": 3, "tokens": [1, 2, 3] if "messages" in body else [4, 5], "max_model_len": 2048})
        if self.path != "/v1/completions":
            return self._json({"detail": "Not Found"}, 404)
        if body.get("prompt_logprobs") is not None:
            return self._score(body)
        return self._sample(body)

    def _weights(self, prev: int, body) -> np.ndarray:
        """The (unnormalised) chance of each next token after ``prev``: the chain at the fake's temperature."""
        return probs(prev) ** (1 / self.server.fake.temperature)

    def _sample(self, body):
        fake = self.server.fake
        rng = np.random.default_rng(body["seed"])
        prev, out = body["prompt"][-1], []
        for _ in range(body["max_tokens"]):
            q = self._weights(prev, body)
            prev = int(rng.choice(VOCAB, p=q / q.sum()))
            out.append(prev)
        with fake.lock:
            fake.requests += 1
            fake.generated += len(out)
        return self._json({"choices": [{"index": 0, "text": "", "finish_reason": "length", "logprobs": {
            "tokens": [f"token_id:{t}" for t in out], "token_logprobs": [0.0] * len(out)}}]})

    def _score(self, body):
        k = body["prompt_logprobs"]
        if k > MAX_LOGPROBS:
            return self._json({"error": {"message": REFUSED.format(k=k), "type": "BadRequestError",
                                         "param": "prompt_logprobs", "code": 400}}, 400)
        ids = body["prompt"]
        plps = [None]
        for prev, tok in zip(ids, ids[1:]):
            p = probs(prev)
            order = list(np.argsort(-p))
            entries = {str(int(t)): {"logprob": math.log(p[t]), "rank": r + 1, "decoded_token": "x"}
                       for r, t in enumerate(order[:k])}
            entries.setdefault(str(tok), {"logprob": math.log(p[tok]), "rank": order.index(tok) + 1,
                                          "decoded_token": "x"})
            plps.append(entries)
        return self._json({"choices": [{"index": 0, "text": "", "finish_reason": "length", "prompt_logprobs": plps,
                                         "prompt_token_ids": ids}]})


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        pass  # a client that hung up (the CLI stops at the first error): not the test's output


class FakeVLLM:
    def __init__(self, spec: bool, temperature: float = 1.0):
        self.spec, self.temperature = spec, temperature
        self.requests = self.generated = 0
        self.bodies: list[tuple[str, dict]] = []
        self.lock = threading.Lock()
        self.httpd = _QuietServer(("127.0.0.1", 0), _Handler)
        self.httpd.fake = self
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(5)


@pytest.fixture
def off():
    with FakeVLLM(spec=False) as server:
        yield server


@pytest.fixture
def prompts(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text('{"id": "chat", "messages": [{"role": "user", "content": "hi"}]}\n'
                    '{"id": "text", "prompt": "a b"}\n')
    return path


def run(*args: str):
    result = CliRunner().invoke(cli, ["equiv", "--sampling", *args])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result


def test_a_healthy_sampler_passes_and_every_output_says_so(tmp_path, off, prompts):
    with FakeVLLM(spec=True) as on:
        result = run("--off", off.url, "--on", on.url, "--prompts", str(prompts), "--samples", "8",
                     "--max-tokens", "16", "--seed", "5", "--out", str(tmp_path / "out"))
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["kind"] == "sampling" and report["gate"]["passed"] is True
    assert report["stats"]["status"] == "consistent" and report["stats"]["n_tokens"] == 2 * 8 * 16
    assert [(p["prompt_id"], p["samples"], p["tokens"]) for p in report["prompts"]] == [("chat", 8, 128),
                                                                                        ("text", 8, 128)]
    assert report["acceptance"]["known"] and report["acceptance"]["drafts"] == 16
    assert report["settings"]["temperature"] == 1.0 and report["settings"]["top_p"] == 1.0
    assert "gate: PASS" in result.output
    assert "false-alarm rate: alpha = 0.01 family-wise" in result.output
    assert "TV 0.01:" in result.output and "with 80% probability" in result.output
    cases = [c for suite in JUnitXml.fromfile(str(tmp_path / "out" / "junit.xml")) for c in suite]
    assert [c.name for c in cases] == ["pit-chi-square", "pit-ks", "rank-chi-square", "zero-probability-tokens"]
    assert not any(c.result for c in cases)
    assert "**Gate: PASS**" in (tmp_path / "out" / "summary.md").read_text()


def test_the_requests_sent(off, prompts):
    with FakeVLLM(spec=True) as on:
        result = run("--off", off.url, "--on", on.url, "--prompts", str(prompts), "--samples", "4",
                     "--max-tokens", "30", "--seed", "100", "--top-logprobs", "7")
        sent = on.bodies
    assert result.exit_code == 0, result.output
    assert len(sent) == 8 and {path for path, _ in sent} == {"/v1/completions"}
    assert sorted(b["seed"] for _, b in sent) == list(range(100, 108))
    assert all(b["temperature"] == 1.0 and b["top_p"] == 1.0 and b["ignore_eos"] is True and b["logprobs"] == 0
               and b["return_tokens_as_token_ids"] is True and b["max_tokens"] == 30 for _, b in sent)
    assert sorted(b["prompt"] for _, b in sent) == [[1, 2, 3]] * 4 + [[4, 5]] * 4  # the source's /tokenize ids
    tokenized = [b for path, b in off.bodies if path == "/tokenize"]
    assert tokenized[0]["add_generation_prompt"] is True and tokenized[1] == {"model": "fake", "prompt": "a b"}
    scored = [b for path, b in off.bodies if path == "/v1/completions"]
    assert len(scored) == 8 and all(b["prompt_logprobs"] == 7 and b["max_tokens"] == 1 for b in scored)
    assert all(len(b["prompt"]) in (33, 32) for b in scored)  # prompt ids + 30 sampled ids


def test_samples_from_another_distribution_fail_with_exit_1(tmp_path, off, prompts):
    with FakeVLLM(spec=True, temperature=0.5) as on:
        result = run("--off", off.url, "--on", on.url, "--prompts", str(prompts), "--samples", "8",
                     "--max-tokens", "16", "--junit", str(tmp_path / "j.xml"), "--json", str(tmp_path / "r.json"))
    assert result.exit_code == 1, result.output
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["stats"]["status"] == "inconsistent" and not report["gate"]["passed"]
    assert "gate: FAIL: the samples are not from the target distribution" in result.output
    cases = [c for suite in JUnitXml.fromfile(str(tmp_path / "j.xml")) for c in suite]
    rejected = {t["name"] for t in report["stats"]["tests"] if t["rejected"]}
    assert rejected and {c.name for c in cases if c.result} == rejected


def test_too_few_tokens_to_decide_is_exit_1_not_a_pass(tmp_path, off, prompts):
    with FakeVLLM(spec=True) as on:
        result = run("--off", off.url, "--on", on.url, "--prompts", str(prompts), "--samples", "1",
                     "--max-tokens", "10", "--junit", str(tmp_path / "j.xml"))
    assert result.exit_code == 1, result.output
    assert "too few tokens to decide: 20 sampled" in result.output
    cases = [c for suite in JUnitXml.fromfile(str(tmp_path / "j.xml")) for c in suite]
    assert [c.name for c in cases if c.result] == ["sample-size"]


def error_line(result) -> str:
    assert result.exit_code == 2, result.output
    lines = [ln for ln in result.output.splitlines() if ln.startswith("error: ")]
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    return lines[0]


def test_a_k_above_the_servers_max_logprobs_is_one_line_with_the_fix(off, prompts):
    with FakeVLLM(spec=True) as on:
        line = error_line(run("--off", off.url, "--on", on.url, "--prompts", str(prompts), "--samples", "1",
                              "--max-tokens", "4", "--top-logprobs", "25"))
    assert line == ("error: the source server refused prompt_logprobs=25 (Requested prompt logprobs of 25, which is "
                    "greater than max allowed: 20): lower --top-logprobs, or start vLLM with --max-logprobs 25 or more")


def test_an_unreachable_server_is_exit_2(off, prompts):
    with FakeVLLM(spec=True) as on:
        dead = on.url
    line = error_line(run("--off", off.url, "--on", dead, "--prompts", str(prompts)))
    assert dead in line


@pytest.mark.parametrize("args, message", [
    (["--on", "http://h:1"], "error: --sampling needs the target's distribution: give --off URL (its "
                             "prompt_logprobs) or --reference DIR (recomputed in float64)"),
    (["--off", "http://h:1"], "error: --sampling samples the spec-on server: give --on URL (with --off URL or "
                              "--reference DIR), or neither URL to start the servers"),
    (["--off", "http://h:1", "--on", "http://h:2", "--repeat", "2", "--html", "r.html"],
     "error: --repeat, --html do not apply to --sampling: leave them out"),
    (["--off", "http://h:1", "--on", "http://h:2", "--min-speedup", "1.2"],
     "error: --min-speedup does not apply to --sampling: leave it out"),
    (["--off", "http://h:1", "--on", "http://h:2", "--no-interference-check"],
     "error: --interference-check does not apply to --sampling: leave it out"),
    (["--off", "http://h:1", "--on", "http://h:2", "--concurrency", "1,2"],
     "error: --concurrency '1,2': with --sampling give one integer, the requests in flight (e.g. 4)"),
    (["--off", "http://h:1", "--on", "http://h:2", "--concurrency", "0"],
     "error: --concurrency '0': must be an integer >= 1"),
    ([], "error: to start the servers, give the spec-on side's --spec-config (or --on and --off URLs)"),
])
def test_usage_errors_are_one_line(args, message):
    assert error_line(run(*args)) == message


@pytest.mark.parametrize("backend", ["trtllm", "sglang", "llamacpp"])
def test_a_backend_without_token_ids_is_refused_before_any_request(off, backend):
    with FakeVLLM(spec=True) as on:
        line = error_line(run("--backend", backend, "--off", off.url, "--on", on.url))
        sent = on.bodies + off.bodies
    assert line == (f"error: --sampling needs the sampled token ids, which backend {backend} cannot return: run it "
                    "on a backend that can (specadapt backends --json lists token_requests)")
    assert sent == []


def test_sampling_options_without_sampling_are_refused():
    result = CliRunner().invoke(cli, ["equiv", "--off", "http://h:1", "--on", "http://h:2", "--samples", "3",
                                      "--alpha", "0.05"])
    assert error_line(result) == "error: --samples, --alpha belong to --sampling: add --sampling, or leave them out"


def test_reference_must_be_a_model_directory(tmp_path):
    line = error_line(run("--on", "http://h:2", "--reference", str(tmp_path)))
    assert line == f"error: --reference {tmp_path} is not a local HF model directory (no config.json)"

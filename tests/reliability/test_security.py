"""Security: API keys never leave the process, TLS is verified by default, subprocesses
take argv lists (no shell, no flag injection), and report writes are atomic."""

from __future__ import annotations

import datetime
import ipaddress
import json
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx
import pytest

from specadapt.adapters.base import LaunchPlan
from specadapt.adapters.process import ManagedProcess, free_port
from specadapt.adapters.vllm import VLLMLaunch, launch_plan
from specadapt.analysis.latency import latency_summary
from specadapt.errors import UsageError
from specadapt.records import (
    AcceptanceSummary,
    CounterSnapshot,
    ProbeReport,
    ProbeSettings,
    RequestSettings,
    ServerInfo,
    read_report,
    write_report,
)
from specadapt.testing import script, scripted_server

KEY = "sk-planted-7f3a9c1e5b2d4086"
FAST = dict(ttft_ms=2.0, itl_ms=1.0, tokens=4)


class Result:
    def __init__(self, returncode: int, stdout: str, stderr: str):
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


def specadapt(*args, env_extra=None, cwd=None, subprocess_run=False):
    """The real command: through `python -m specadapt`, or in-process via CliRunner (faster)."""
    env = {"SPECADAPT_API_KEY": None, "OPENAI_API_KEY": None, **(env_extra or {})}
    if subprocess_run:
        full = {k: v for k, v in {**os.environ, **env}.items() if v is not None}
        proc = subprocess.run([sys.executable, "-m", "specadapt", *args], capture_output=True, text=True,
                              timeout=120, env=full, cwd=cwd)
        return Result(proc.returncode, proc.stdout, proc.stderr)
    from click.testing import CliRunner

    from specadapt.cli import cli

    old = os.getcwd()
    os.chdir(cwd or old)
    try:
        res = CliRunner().invoke(cli, list(args), env=env)
    finally:
        os.chdir(old)
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    return Result(res.exit_code, res.stdout, res.stderr)


@pytest.fixture(scope="module")
def keyed_server(tmp_path_factory):
    with scripted_server(tmp_path_factory.mktemp("keyed") / "server.log", api_key=KEY) as mp:
        yield mp.plan.base_url


def prompt_file(path: Path) -> Path:
    lines = [{"id": "ok", "prompt": script(id="ok", **FAST)},
             {"id": "boom", "prompt": script(id="boom", **FAST, fault="status", status=500)},
             {"id": "cut", "prompt": script(id="cut", **FAST, fault="disconnect")}]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


@pytest.mark.parametrize("how", ["--api-key", "SPECADAPT_API_KEY", "OPENAI_API_KEY", "wrong-key"])
def test_planted_key_is_in_no_output_and_no_file(keyed_server, tmp_path, how):
    cache = tmp_path / "cache"
    env = {"SPECADAPT_CACHE_DIR": str(cache)}
    args = ["probe", "--url", keyed_server, "--prompts", str(prompt_file(tmp_path / "p.jsonl")), "--warmup", "0",
            "--json", str(tmp_path / "out" / "report.json")]
    if how == "--api-key":
        args += ["--api-key", KEY]
    elif how == "wrong-key":  # the server refuses: the error path must not echo either key
        args += ["--api-key", KEY[::-1]]
    else:
        env[how] = KEY
    proc = specadapt(*args, env_extra=env, cwd=tmp_path, subprocess_run=how == "--api-key")
    if how == "wrong-key":
        assert proc.returncode == 2 and "answered 401: the server wants an API key" in proc.stderr
        assert KEY[::-1] not in proc.stdout + proc.stderr
    else:
        assert proc.returncode == 1, proc.stderr  # two requests fail on purpose
        assert (tmp_path / "out" / "report.json").is_file()
    assert KEY not in proc.stdout + proc.stderr
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert files
    for path in files:
        assert KEY.encode() not in path.read_bytes(), path


def test_launch_plan_printout_redacts_keys_from_server_args_and_env():
    plan = LaunchPlan(backend="vllm", argv=["python", "-m", "vllm", "--api-key", KEY, f"--api-key={KEY}",
                                            f"--hf-token={KEY}", "--port=8000"],
                      env={"VLLM_API_KEY": KEY, "HF_TOKEN": KEY, "VLLM_CPU_KVCACHE_SPACE": "1"}, port=8000,
                      spec_enabled=False, model="m")
    text = plan.printable()
    assert KEY not in text
    assert "--api-key REDACTED --api-key=REDACTED --hf-token=REDACTED --port=8000" in text
    assert "VLLM_CPU_KVCACHE_SPACE=1" in text and "VLLM_API_KEY=REDACTED" in text
    assert plan.argv[4] == KEY  # only the printout is redacted; the server still gets its key


# --- TLS ---------------------------------------------------------------------------------

def self_signed(tmp: Path) -> tuple[str, str]:
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
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = tmp / "cert.pem", tmp / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return str(cert_path), str(key_path)


@pytest.fixture(scope="module")
def https_server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tls")
    cert, key = self_signed(tmp)
    with scripted_server(tmp / "server.log", ssl=(cert, key)) as mp:
        url = f"https://127.0.0.1:{mp.plan.port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(url + "/health", verify=False).status_code == 200:
                    break
            except httpx.HTTPError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        yield url, cert


def tls_probe(url, tmp_path, *extra):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": script(id=f"tls{len(extra)}", **FAST)}) + "\n")
    return specadapt("probe", "--url", url, "--prompts", str(prompts), "--warmup", "0", *extra,
                     env_extra={"SPECADAPT_CACHE_DIR": str(tmp_path)})


def test_tls_is_verified_by_default(https_server, tmp_path):
    url, _cert = https_server
    proc = tls_probe(url, tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    line = [ln for ln in proc.stderr.splitlines() if ln.startswith("error: ")]
    assert line and line[0].startswith(f"error: the TLS certificate of {url} could not be verified")
    assert "pass --ca-bundle" in line[0] and "--insecure" in line[0]


def test_ca_bundle_trusts_the_server(https_server, tmp_path):
    url, cert = https_server
    proc = tls_probe(url, tmp_path, "--ca-bundle", cert)
    assert proc.returncode == 0, proc.stderr
    assert "warning" not in proc.stderr


def test_insecure_works_and_warns(https_server, tmp_path):
    url, _cert = https_server
    proc = tls_probe(url, tmp_path, "--insecure")
    assert proc.returncode == 0, proc.stderr
    assert "warning: TLS certificate verification is off (--insecure)" in proc.stderr


# --- no shell, no flag injection ------------------------------------------------------------

HOSTILE = ["--served-model-name=evil", "x; touch PWNED", "$(touch PWNED)", "`touch PWNED`", "a b\nc", "-h"]


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_model_path_stays_one_argument(tmp_path, name):
    model = tmp_path / name.replace("/", "_")
    model.mkdir()
    plan = launch_plan(VLLMLaunch(model=str(model), python="python", port=8000, max_model_len=None, seed=None))
    assert f"--model={model}" in plan.argv
    assert not [a for a in plan.argv if a.startswith("--served-model-name") or a == "-h"]
    import shlex

    assert shlex.split(plan.printable().split(" ", 1)[1]) == plan.argv  # the printout pastes back exactly


def test_hostile_values_reach_the_program_literally_without_a_shell(tmp_path):
    port = free_port()
    code = "import json, sys; print(json.dumps(sys.argv[1:]), flush=True); import time; time.sleep(30)"
    plan = LaunchPlan(backend="t", argv=[sys.executable, "-c", code, *HOSTILE], port=port, spec_enabled=False,
                      model="none")
    with ManagedProcess(plan, log_path=tmp_path / "log", grace_s=2) as mp:
        deadline = time.monotonic() + 20
        while not (tmp_path / "log").read_text() and time.monotonic() < deadline and mp.alive():
            time.sleep(0.05)
    assert json.loads((tmp_path / "log").read_text().splitlines()[0]) == HOSTILE
    assert not list(tmp_path.rglob("PWNED")) and not Path("PWNED").exists()


@pytest.mark.parametrize("arg", ["--port=1", "--host", "--model=/etc", "--speculative-config={}"])
def test_server_args_cannot_override_what_specadapt_sets(arg):
    with pytest.raises(UsageError, match=f"--server-arg {arg.split('=')[0]} is set by specadapt itself"):
        launch_plan(VLLMLaunch(model="m", port=8000, extra_args=[arg]))
    # A hostile single argument stays one argv element (vLLM then refuses it as unknown).
    plan = launch_plan(VLLMLaunch(model="m", port=8000, extra_args=["--enforce-eager --port=1"]))
    assert plan.argv[-1] == "--enforce-eager --port=1"


def test_no_shell_anywhere_in_the_package():
    root = Path(__import__("specadapt").__file__).parent
    offenders = [f"{p}:{i}" for p in root.rglob("*.py") for i, line in enumerate(p.read_text().splitlines(), 1)
                 if re.search(r"shell\s*=\s*True|os\.system\(|os\.popen\(|create_subprocess_shell", line)]
    assert not offenders


# --- atomic report writes -------------------------------------------------------------------

def small_report(note: str) -> ProbeReport:
    return ProbeReport(server=ServerInfo(backend="vllm", base_url="http://127.0.0.1:1"),
                       settings=ProbeSettings(concurrency=1, repeat=1, warmup=0, prompts_source="t",
                                              request=RequestSettings()),
                       latency=latency_summary([]), acceptance=AcceptanceSummary(known=False),
                       counters_before=CounterSnapshot(), counters_after=CounterSnapshot(), notes=[note])


CRASH_MID_WRITE = textwrap.dedent("""
    import os, sys
    from pathlib import Path
    import specadapt.records.reports as m
    real = os.fdopen

    class HalfThenDie:
        def __init__(self, fh): self.fh = fh
        def __enter__(self): return self
        def __exit__(self, *exc): return False
        def write(self, text):
            self.fh.write(text[: len(text) // 2]); self.fh.flush(); os._exit(9)  # killed mid-write

    m.os.fdopen = lambda fd, mode: HalfThenDie(real(fd, mode))
    report = m.read_report(Path(sys.argv[1])).model_copy(update={"notes": ["new " * 5000]})
    m.write_report(report, Path(sys.argv[2]))
""")


@pytest.mark.parametrize("existing", [True, False])
def test_a_crash_mid_write_leaves_no_half_report(tmp_path, existing):
    source, target = tmp_path / "source.json", tmp_path / "report.json"
    write_report(small_report("source"), source)
    if existing:
        write_report(small_report("old and complete"), target)
    proc = subprocess.run([sys.executable, "-c", CRASH_MID_WRITE, str(source), str(target)], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 9, proc.stderr
    if existing:
        assert read_report(target).notes == ["old and complete"]
    else:
        assert not target.exists()
    assert sorted(p.name for p in tmp_path.glob("*.json")) == sorted(["source.json"] + (["report.json"] if existing else []))


# --- server logs shown to the user are scrubbed ---------------------------------------------

def test_start_up_log_tail_is_scrubbed_of_the_plans_key(tmp_path):
    from specadapt.errors import ServerStartError

    code = "import sys; print('non-default args:', sys.argv[1:], flush=True); sys.exit(3)"
    plan = LaunchPlan(backend="t", argv=[sys.executable, "-c", code, "--api-key", KEY], port=free_port(),
                      spec_enabled=False, model="none")
    with ManagedProcess(plan, log_path=tmp_path / "log") as mp, pytest.raises(ServerStartError) as err:
        mp.wait_healthy(30)
    assert KEY in (tmp_path / "log").read_text()  # the server's own log file is the server's business
    assert KEY not in err.value.log_tail and "REDACTED" in err.value.log_tail


def test_partial_report_log_tail_is_scrubbed(tmp_path):
    from specadapt.adapters.vllm import VLLMServer
    from specadapt.orchestration.probe import run_probe
    from specadapt.records import Prompt

    with scripted_server(tmp_path / "server.log", api_key=KEY) as mp:
        with open(tmp_path / "server.log", "a") as fh:
            fh.write(f"non-default args: {{'api_key': '{KEY}'}}\n")
        server = VLLMServer(mp.plan.base_url, api_key=KEY, launched=True)
        server.process = mp
        prompts = [Prompt(id="ok", prompt=script(id="ok", **FAST)),
                   Prompt(id="die", prompt=script(id="die", **FAST, fault="exit"))]
        report = run_probe(server, prompts, RequestSettings(max_tokens=4), warmup=0)
        server.close()
    assert report.partial and "non-default args" in report.notes[-1]
    assert KEY not in report.model_dump_json()

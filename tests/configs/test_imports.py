"""The configs package and the CLI import without vllm, torch, tensorrt_llm or
kubernetes_validate (the k8s extra, imported when a manifest is validated)."""

from __future__ import annotations

import subprocess
import sys


def test_configs_import_no_heavy_dependencies(repo_root):
    code = ("import sys; import specadapt.cli; "
            "import specadapt.configs.examples, specadapt.configs.files, specadapt.configs.manifest; "
            "heavy = [m for m in ('vllm', 'torch', 'tensorrt_llm', 'transformers', "
            "'kubernetes_validate') if m in sys.modules]; print(heavy); "
            "sys.exit(1 if heavy else 0)")
    out = subprocess.run([sys.executable, "-c", code], cwd=repo_root, capture_output=True,
                         text=True, timeout=60, env={"PYTHONPATH": str(repo_root)})
    assert out.returncode == 0, out.stdout + out.stderr

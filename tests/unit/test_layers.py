"""The package layering in pyproject.toml ([tool.importlinter]) holds, and would catch a break."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "specadapt"


def lint_imports(cwd: Path, pythonpath: Path) -> subprocess.CompletedProcess:
    lint = Path(sys.executable).parent / "lint-imports"
    return subprocess.run([str(lint), "--no-cache", "--no-logo"], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(pythonpath)})


def contracts() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]


def test_every_contract_is_kept():
    proc = lint_imports(ROOT, ROOT)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "0 broken" in proc.stdout


def test_every_top_level_module_has_a_layer():
    layers = next(c for c in contracts()["contracts"] if c["type"] == "layers")["layers"]
    named = {m.strip() for layer in layers for m in layer.split("|")}
    found = {f"specadapt.{p.stem}" for p in PACKAGE.iterdir()
             if (p.suffix == ".py" and p.stem not in ("__init__", "__main__"))
             or (p.is_dir() and (p / "__init__.py").is_file())}
    assert found == named


def test_an_upward_import_breaks_the_layers(tmp_path):
    """A copy of the package where the ground floor imports the command layer fails the check."""
    shutil.copytree(PACKAGE, tmp_path / "specadapt", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    records = tmp_path / "specadapt" / "records" / "metrics.py"
    records.write_text(records.read_text() + "\nimport specadapt.commands  # upward\n")
    proc = lint_imports(tmp_path, tmp_path)
    assert proc.returncode == 1, proc.stdout[-4000:]
    assert "specadapt.records is not allowed to import specadapt.commands" in proc.stdout

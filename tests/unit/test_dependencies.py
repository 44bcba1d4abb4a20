"""Every runtime dependency in pyproject.toml is imported by the package: none is left over."""

from __future__ import annotations

import ast
import importlib.metadata
import re
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[2]


def canonical(name: str) -> str:
    """A distribution name as PEP 503 normalises it (PyYAML, pyyaml and py_yaml are one)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def imported_top_level(package: Path) -> set[str]:
    """The top-level modules that some module of the package imports (lazy imports included)."""
    out: set[str] = set()
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                out |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                out.add(node.module.split(".")[0])
    return out


def unused_dependencies(requirements: list[str], imported: set[str]) -> list[str]:
    """The requirements whose installed distribution provides no module in ``imported``."""
    provides: dict[str, set[str]] = {}
    for module, dists in importlib.metadata.packages_distributions().items():
        for dist in dists:
            provides.setdefault(canonical(dist), set()).add(module)
    names = [canonical(re.split(r"[\s<>=!~;\[]", req, maxsplit=1)[0]) for req in requirements]
    return sorted(n for n in names if not provides.get(n, set()) & imported)


def test_every_runtime_dependency_is_imported_by_the_package():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert unused_dependencies(deps, imported_top_level(ROOT / "specadapt")) == []


def test_a_dependency_nothing_imports_is_named():
    imported = imported_top_level(ROOT / "specadapt")
    assert "yaml" in imported and "httpx_sse" not in imported
    assert unused_dependencies(["PyYAML>=6", "httpx-sse>=0.4", "pydantic[email]>=2.6"], imported) == ["httpx-sse"]

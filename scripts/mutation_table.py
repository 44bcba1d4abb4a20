"""The per-module table of a mutation run, from ``mutmut results --all true``.

    .venv/bin/mutmut results --all true | python scripts/mutation_table.py [--commit SHA]

One Markdown row per mutated module: mutants, killed, timeout (a hang: detected),
survived, no tests (no selected test reaches the function), and any other status mutmut
gives (suspicious, segfault, skipped, not checked, caught by type check). Reads
``[tool.mutmut] only_mutate`` from pyproject.toml so every configured module has a row,
also one without mutants (mutmut does not mutate decorated functions). Mutant names look
like ``specadapt.analysis.gate.x_apply_gate__mutmut_7``; the module is the dotted path up to
the function's ``x_`` / ``xǁClassǁ`` part.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter, defaultdict
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parents[1]
LINE = re.compile(r"^\s*(?P<name>[\w.ǁ]+__mutmut_\d+): (?P<status>.+?)\s*$")
COLUMNS = ["killed", "timeout", "survived", "no tests"]


def module_of(name: str) -> str:
    """``specadapt.analysis.gate.x_apply_gate__mutmut_7`` -> ``specadapt/analysis/gate.py``."""
    parts = name.split(".")
    for i, part in enumerate(parts):
        if part.startswith(("x_", "xǁ")):
            return "/".join(parts[:i]) + ".py"
    raise ValueError(f"not a mutant name: {name}")


def configured_modules() -> list[str]:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return list(tomllib.load(f)["tool"]["mutmut"]["only_mutate"])


def count(lines) -> dict[str, Counter]:
    by_module: dict[str, Counter] = defaultdict(Counter)
    for line in lines:
        m = LINE.match(line)
        if m:
            by_module[module_of(m["name"])][m["status"]] += 1
    return by_module


def table(by_module: dict[str, Counter], modules: list[str], commit: str | None) -> list[str]:
    others = sorted({s for c in by_module.values() for s in c} - set(COLUMNS))
    head = ["module", "mutants", *COLUMNS, *others]
    rows = ["| " + " | ".join(head) + " |", "| --- |" + " ---: |" * (len(head) - 1)]
    total: Counter = Counter()
    for path in modules:
        c = by_module.get(path, Counter())
        total += c
        name = f"`{path.removeprefix('specadapt/')}`"
        rows.append("| " + " | ".join([name, str(sum(c.values()))] + [str(c[s]) for s in COLUMNS + others]) + " |")
    rows.append("| " + " | ".join(["all", str(sum(total.values()))] + [str(total[s]) for s in COLUMNS + others]) + " |")
    if commit:
        rows.insert(0, f"Code at commit {commit}.\n")
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--commit", help="the commit the mutated code was at, written above the table")
    args = ap.parse_args(argv)
    print("\n".join(table(count(sys.stdin), configured_modules(), args.commit)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

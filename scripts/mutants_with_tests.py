"""Run chosen tests against mutants that a mutation run left alive, one mutant at a time.

    .venv/bin/mutmut results | python scripts/mutants_with_tests.py 'specadapt.analysis.stats.*' \\
        -- tests/unit/analysis/test_stats.py -m slow

``make mutate`` runs the fast selection of tests only (no ``slow`` tests: the false-alarm
and power simulations take minutes each). Where those are the only tests that can kill a
mutant, this runs them for the mutants of one module: each mutant's code is switched on
through mutmut's ``MUTANT_UNDER_TEST`` inside the ``mutants/`` copy, and the given pytest
arguments run against it. A mutant is killed when pytest fails; each line says which.
First a mutant-free run must pass, so a failure means the mutant and nothing else.

Reads mutant names (``name: status`` lines, as ``mutmut results`` prints them) from stdin
and keeps those matching the glob; ``mutants/`` must exist (after ``make mutate``).
"""

from __future__ import annotations

import argparse
import fnmatch
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NAME = re.compile(r"^\s*([\w.ǁ]+__mutmut_\d+):")


def run_tests(mutant: str, pytest_args: list[str], timeout_s: float) -> int:
    env = {**os.environ, "MUTANT_UNDER_TEST": mutant, "PYTHONDONTWRITEBYTECODE": "1"}
    try:
        return subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *pytest_args],
                              cwd=ROOT / "mutants", env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              timeout=timeout_s).returncode
    except subprocess.TimeoutExpired:
        return -1


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ours, pytest_args = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("glob", help="mutant names to take, e.g. 'specadapt.analysis.stats.*'")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per mutant (default 1800)")
    args = ap.parse_args(ours)
    if not (ROOT / "mutants").is_dir():
        print("error: no mutants/ folder: run 'make mutate' first", file=sys.stderr)
        return 2
    names = [m[1] for line in sys.stdin if (m := NAME.match(line)) and fnmatch.fnmatchcase(m[1], args.glob)]
    if not names:
        print(f"error: no mutant on stdin matches {args.glob}", file=sys.stderr)
        return 2
    clean = run_tests("", pytest_args, args.timeout)
    if clean != 0:
        print(f"error: the tests fail without any mutant (pytest exit {clean}): fix that first", file=sys.stderr)
        return 2
    alive = 0
    for name in names:
        rc = run_tests(name, pytest_args, args.timeout)
        verdict = "killed" if rc == 1 else "timeout" if rc == -1 else "survived" if rc == 0 else f"pytest exit {rc}"
        alive += verdict == "survived"
        print(f"{name}: {verdict}", flush=True)
    print(f"{len(names) - alive} of {len(names)} killed by: pytest {' '.join(pytest_args)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

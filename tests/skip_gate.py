"""Under CI, a skipped test is a failure unless the suite expects that skip there.

A skip is silent: pytest's exit code stays 0, so a test that skips because a model was not
found where the test looked, an extra did not install or a browser is missing would pass
CI without checking anything. With ``CI`` set to a true value (``true``, ``1``, ``yes``, as
CI services set it), the session's skips are held against ``EXPECTED``: each entry names a
skip that is legitimate on a CI machine and why. Any other skip turns the run's exit code
into 1 and is listed at the end of the output. Outside CI skips are only reported (``-ra``).

``tests/conftest.py`` wires the hooks; ``tests/unit/test_skip_gate.py`` runs a real inner
pytest session to show that an unexpected skip fails and an expected one does not.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

# (reason pattern, why the skip is legitimate on a CI machine)
EXPECTED: list[tuple[str, str]] = [
    (r"needs CUDA", "GPU tests: CI machines have no GPU (the gpu marker deselects most; this guards the rest)"),
]

TRUE = {"1", "true", "yes", "on"}


def ci_enabled(env: Mapping[str, str]) -> bool:
    """Whether the environment says this is a CI run (``CI=true`` and its spellings)."""
    return env.get("CI", "").strip().lower() in TRUE


@dataclass(frozen=True)
class Skip:
    nodeid: str
    reason: str


def skip_reason(longrepr) -> str:
    """The reason pytest recorded for a skip: its (path, line, reason) tuple's reason without
    pytest's ``Skipped: `` prefix, or the text of whatever else it holds."""
    reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return reason.removeprefix("Skipped: ")


def unexpected(skips: list[Skip], expected: list[tuple[str, str]] = EXPECTED) -> list[Skip]:
    """The skips that no entry of ``expected`` allows."""
    return [s for s in skips if not any(re.search(pattern, s.reason) for pattern, _ in expected)]


def summary(bad: list[Skip]) -> list[str]:
    """The lines printed at the end of a CI run with unexpected skips."""
    lines = [f"error: {len(bad)} test(s) skipped that CI does not expect to skip (CI is set; a skip checks "
             "nothing, so it fails the run here):"]
    lines += [f"  {s.nodeid}: {s.reason}" for s in bad]
    lines.append("  fix the cause, or add the skip with its reason to EXPECTED in tests/skip_gate.py")
    return lines

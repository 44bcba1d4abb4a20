"""The documentation site: it builds strictly, its CLI reference cannot drift from the
click command tree, the README stays short, and no page talks about anything but the
product."""

from __future__ import annotations

import html
import os
import re
import subprocess
import sys
from pathlib import Path

import click
import pytest

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
DOCS = REPO / "docs"
README_MAX_LINES = 260
FORBIDDEN = ("field notes", "field-notes", "issue #", "no GPU was lent", "other sessions", "../shared", "/tmp/")

@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """`mkdocs build --strict` into a temporary folder (the docs extra is part of the test extra:
    a missing mkdocs is a failure here, never a skip)."""
    out = tmp_path_factory.mktemp("site")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert proc.returncode == 0, f"mkdocs build --strict failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return out


def _text(body: str) -> str:
    """The visible text of an HTML fragment, whitespace collapsed."""
    body = re.sub(r"<(script|style)\b.*?</\1>", " ", body, flags=re.S)
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", body)))


def _section(page: str, anchor: str) -> str:
    """The HTML from the heading with id ``anchor`` to the next heading of the same or a higher level."""
    m = re.search(rf'<h([1-6])[^>]*\bid="{re.escape(anchor)}"', page)
    assert m, f"no heading #{anchor} in the CLI reference"
    level = int(m.group(1))
    end = re.compile(rf"<h[1-{level}][\s>]").search(page, m.end())
    return page[m.start():end.start() if end else len(page)]


def _tree(cmd: click.Command, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], click.Command]]:
    """Every command under ``cmd`` (itself included) with its path of names."""
    found = [(path, cmd)]
    if isinstance(cmd, click.Group):
        for name, sub in sorted(cmd.commands.items()):
            if not sub.hidden:
                found += _tree(sub, path + (name,))
    return found


def _root() -> click.Group:
    from specadapt.cli import cli

    return cli


def test_mkdocs_build_strict_succeeds(site):
    assert (site / "index.html").is_file()
    assert (site / "cli" / "index.html").is_file()


def test_cli_reference_has_every_command_and_every_probe_option(site):
    page = (site / "cli" / "index.html").read_text(encoding="utf-8")
    text = _text(page)
    commands = _tree(_root())
    assert len(commands) > 10, "the click tree looks truncated"
    missing = [" ".join(("specadapt",) + path) for path, _ in commands
               if f" {' '.join(('specadapt',) + path)} " not in f" {text} "]
    assert not missing, f"commands missing from the CLI reference: {missing}"

    probe = dict((path, cmd) for path, cmd in commands)[("probe",)]
    options = [opt for p in probe.params if isinstance(p, click.Option) and not p.hidden
               for opt in (*p.opts, *p.secondary_opts)]
    assert "--url" in options and "--spec-config" in options
    section = _text(_section(page, "specadapt-probe"))
    missing_opts = [o for o in options if not re.search(rf"(?<![\w-]){re.escape(o)}(?![\w-])", section)]
    assert not missing_opts, f"`specadapt probe` options missing from the CLI reference: {missing_opts}"


def test_readme_is_short():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines (at most {README_MAX_LINES})"


def test_documents_speak_of_the_product_only():
    pages = [README, *sorted(DOCS.rglob("*.md"))]
    assert len(pages) > 5
    hits = []
    for page in pages:
        for lineno, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            low = line.lower()
            hits += [f"{page.relative_to(REPO)}:{lineno}: {word!r}" for word in FORBIDDEN if word.lower() in low]
    assert not hits, "pages that talk about the work rather than the product:\n" + "\n".join(hits)

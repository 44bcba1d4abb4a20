"""The lists of pages agree: every page of docs/ is in the site's navigation once, under one
title; the README's table of pages names every page of the navigation, in its order and under
its title; the home page's count of questions is the length of its list."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
NUMBERS = {"two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7}


def nav_pages() -> list[tuple[str, str, str | None]]:
    """(title, page, title of the section holding it or None) of every page in mkdocs.yml's nav, in order."""
    nav = yaml.safe_load((REPO / "mkdocs.yml").read_text(encoding="utf-8"))["nav"]
    pages = []

    def walk(items, section):
        for item in items:
            ((title, target),) = item.items()
            if isinstance(target, list):
                walk(target, title)
            else:
                pages.append((title, target, section))

    walk(nav, None)
    return pages


def readme_rows() -> list[tuple[str, str]]:
    """(title, page) of each row of the README's table of pages (its first link), in order."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    table = text[text.index("## Documentation"):].split("\n## ", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("| [")]
    return [re.match(r"\| \[([^\]]+)\]\(docs/([^)#]+)\)", line).groups() for line in rows]


def test_every_page_is_in_the_navigation_once_under_one_title():
    pages = nav_pages()
    files = [page for _, page, _ in pages]
    assert sorted(files) == sorted(p.name for p in DOCS.glob("*.md"))
    assert len(set(files)) == len(files)
    titles = [title for title, _, _ in pages] + sorted({s for _, _, s in pages if s})
    assert len(set(titles)) == len(titles), f"a title is used twice: {titles}"


def test_the_readme_names_every_page_in_the_navigation_order():
    pages = nav_pages()
    rows = readme_rows()
    text = (REPO / "README.md").read_text(encoding="utf-8")
    table = text[text.index("## Documentation"):]
    for _, page, _ in pages:
        assert f"(docs/{page})" in table, f"the README's table of pages does not link {page}"
    titles = {page: {title, section} for title, page, section in pages}
    for title, page in rows:
        assert title in titles[page], f"README calls {page} {title!r}; the site: {sorted(t for t in titles[page] if t)}"
    order = [page for _, page, _ in pages]
    assert [page for _, page in rows] == [page for page in order if page in {p for _, p in rows}]


def test_the_home_page_counts_its_questions():
    text = (DOCS / "index.md").read_text(encoding="utf-8")
    said = re.search(r"answers\s+(\w+)\s+questions", text)
    assert said, "the home page says how many questions it answers"
    after = text[said.end():].split("\n## ", 1)[0]
    listed = re.findall(r"^\d+\. ", after, flags=re.M)
    assert NUMBERS[said.group(1)] == len(listed)

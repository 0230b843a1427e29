"""The README and the documentation pages: short README, links that resolve, no internal references.

``mkdocs build --strict`` (run by ``make test`` and ``make docs``) checks the links between the pages
under ``docs/``; this checks what the site does not see: the README's own links into the repository,
its length, and the wording rules every page keeps (no issue or item numbers, no machine paths).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = sorted((REPO / "docs").glob("*.md"))
TEXTS = [REPO / "README.md", REPO / "eval" / "README.md", *PAGES]
INTERNAL = re.compile(r"\bissues? \d|\bissue's\b|\bdeliverable|\bengineer [A-Z]\d|\bthis round\b", re.IGNORECASE)
MACHINE_PATH = re.compile(r"(?<![\w.])/(?:work|home|root|Users|tmp)/")
LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_readme_is_at_most_350_lines():
    assert len((REPO / "README.md").read_text().splitlines()) <= 350


def test_every_relative_link_of_the_readme_resolves():
    text = (REPO / "README.md").read_text()
    links = [m for m in LINK.findall(text) if "://" not in m and not m.startswith("#")]
    assert links, "the README links to the documentation pages"
    missing = [m for m in links if not (REPO / m.split("#")[0]).exists()]
    assert missing == []


def test_the_readme_links_every_page_and_mkdocs_lists_every_page():
    readme = (REPO / "README.md").read_text()
    nav = (REPO / "mkdocs.yml").read_text()
    for page in PAGES:
        assert page.name == "index.md" or f"docs/{page.name}" in readme, page.name
        assert f" {page.name}" in nav, page.name


@pytest.mark.parametrize("path", TEXTS, ids=lambda p: str(p.relative_to(REPO)))
def test_no_internal_references_or_machine_paths(path):
    text = path.read_text()
    assert INTERNAL.findall(text) == [], path.name
    assert MACHINE_PATH.findall(text) == [], path.name

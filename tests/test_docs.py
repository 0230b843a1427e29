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


def _hooks():
    from tests.eval_scripts import load_script

    return load_script(REPO / "mkdocs_hooks.py")


def test_the_generated_report_and_its_figures_are_pages_of_the_site():
    """The report's tables and figures (eval/report/) were not on the site: the hook adds them, the nav lists them."""
    hooks = _hooks()
    files = dict(hooks.report_files())
    report = REPO / "eval" / "report" / "report.md"
    assert files[hooks.REPORT_PAGE] == report
    figures = set(re.findall(r"!\[[^\]]*\]\(([^)]+\.png)\)", report.read_text()))
    assert figures and {f"report/{name}" for name in figures} <= set(files)
    assert f": {hooks.REPORT_PAGE}" in (REPO / "mkdocs.yml").read_text()


def test_file_paths_link_to_the_repository_where_the_site_knows_it():
    hooks = _hooks()
    text = ("see `oled_hf/offload/system.py`, `no/such/file.py` and [`eval/README.md`](x)\n"
            "```\n`oled_hf/cli/main.py`\n```\n")
    linked = hooks.source_links(text, "https://example.org/oled-hf/")
    assert "[`oled_hf/offload/system.py`](https://example.org/oled-hf/blob/main/oled_hf/offload/system.py)" in linked
    assert "`no/such/file.py`" in linked and "blob/main/no/such" not in linked  # not a file of the clone
    assert "[`eval/README.md`](x)" in linked and "\n`oled_hf/cli/main.py`\n" in linked  # links and code blocks kept
    assert hooks.source_links(text, None) == text
    assert "repo_url: !ENV [OLED_HF_REPO_URL, null]" in (REPO / "mkdocs.yml").read_text()


def test_wide_tables_and_code_comments_wrap_on_the_site():
    assert "  - stylesheets/wrap.css" in (REPO / "mkdocs.yml").read_text()
    css = (REPO / "docs" / "stylesheets" / "wrap.css").read_text()
    assert "white-space: pre-wrap" in css and "white-space: normal" in css


def test_the_greedy_tie_rule_is_a_stated_deliberate_difference():
    """model.md said ties resolve "as the official decoders do", some of which take argmax(softmax(logits))."""
    text = " ".join((REPO / "docs" / "model.md").read_text().split())
    assert "argmax(softmax(logits))" in text and "deliberate difference" in text
    assert "resolve as the official decoders do" not in text

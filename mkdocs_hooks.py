"""Hooks of ``mkdocs build`` (``hooks:`` in mkdocs.yml): the evaluation report with its figures on the site, and
repository file paths as links to the source.

Why: the report (``eval/report/report.md``, which ``oled-moe report`` writes beside its PNG figures) lives
with the scripts that make it, outside ``docs/``, so the site had neither the report's tables nor its figures;
they are added here as the page ``report/full.md`` and its images, read from where they are (nothing is
copied into ``docs/``, so the two cannot drift). And the pages name source files as inline code
(`oled_hf/offload/system.py`): where the site knows the repository (``repo_url``, set from
``OLED_HF_REPO_URL``), each such path that exists in the clone becomes a link to it.
"""

from __future__ import annotations

import re
from pathlib import Path

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parent
REPORT_DIR = ROOT / "eval" / "report"
REPORT_PAGE = "report/full.md"  # the generated report, as a page of the site
# `path/to/file.ext` in inline code, not already inside a link
CODE_PATH = re.compile(r"(?<!\[)`((?:[\w.-]+/)+[\w.-]+\.(?:py|sh|md|json|jsonl|yaml|toml|txt|png))`(?!\])")


def report_files() -> list[tuple[str, Path]]:
    """(site path, file) of the generated report and its figures; none where the report was not generated."""
    report = REPORT_DIR / "report.md"
    if not report.is_file():
        return []
    return [(REPORT_PAGE, report), *((f"report/{png.name}", png) for png in sorted(REPORT_DIR.glob("*.png")))]


def on_files(files: Files, config) -> Files:
    for uri, path in report_files():
        files.append(File.generated(config, uri, abs_src_path=str(path)))
    return files


def source_links(markdown: str, repo_url: str | None, branch: str = "main") -> str:
    """Inline-code paths of files that exist in the clone, linked to ``repo_url``'s copy (unchanged without it)."""
    if not repo_url:
        return markdown

    def link(match: re.Match) -> str:
        path = match.group(1)
        if not (ROOT / path).is_file():
            return match.group(0)
        return f"[`{path}`]({repo_url.rstrip('/')}/blob/{branch}/{path})"

    out, fenced = [], False
    for line in markdown.splitlines(keepends=True):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        out.append(line if fenced else CODE_PATH.sub(link, line))
    return "".join(out)


def on_page_markdown(markdown: str, page, config, files) -> str:
    return source_links(markdown, config.get("repo_url"))

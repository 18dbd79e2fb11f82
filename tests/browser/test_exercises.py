"""The chapters' exercises on the built website: the task and a solution folded away, nothing of the
grading (src/site-assets/exercises.py does it while the site is built).

The first tests read the built HTML; the last opens a solution in Chromium.
"""

from __future__ import annotations

import html
import json
import re

import pytest
from site_pages import SITE, notebook_for, toc_pages

from exercises import nbgrader_role  # src/site-assets, on the path through site_pages

CHAPTERS = [page for page in toc_pages() if notebook_for(page) is not None]
# What only the grading says: nbgrader's markers, the tests' calls and their stored verdicts.
GRADING = ["BEGIN SOLUTION", "END SOLUTION", "BEGIN HIDDEN TESTS", "END HIDDEN TESTS", "HIDDEN TESTS",
           "passed, ", "check(", "import check"]


def page_text(page: str) -> str:
    """The page's text as a reader gets it, without tags (highlighted code is split into spans),
    scripts or styles."""
    body = re.sub(r"<(script|style)\b.*?</\1>", "", page, flags=re.DOTALL | re.IGNORECASE)
    return html.unescape(re.sub(r"<[^>]+>", "", body))


def solution_cells(name: str) -> list[dict]:
    cells = json.loads(notebook_for(name).read_text())["cells"]
    return [c for c in cells if c["cell_type"] == "code"
            and nbgrader_role(c.get("metadata", {}), "".join(c["source"])) == "solution"]


@pytest.mark.parametrize("name", CHAPTERS)
def test_chapter_page_shows_no_grading(site, name):
    text = page_text((site / name).read_text(encoding="utf-8"))
    found = {marker: text[max(0, text.index(marker) - 60):text.index(marker) + 40].replace("\n", " ")
             for marker in GRADING if marker in text}
    assert not found, f"{name} shows the grading: {found}"


@pytest.mark.parametrize("name", CHAPTERS)
def test_every_solution_is_folded_and_prints_nothing(site, name):
    """One "Show the solution" fold per solution cell (its own prompt when it names one), and none of
    the solution cells' stored outputs on the page."""
    solutions = solution_cells(name)
    if not solutions:
        pytest.skip(f"{name}: no exercise")
    page = (site / name).read_text(encoding="utf-8")
    prompts = [c["metadata"].get("mystnb", {}).get("code_prompt_show", "Show the solution") for c in solutions]
    folded = re.findall(r'<details class="[^"]*\bhide above-input\b[^"]*">\s*<summary[^>]*>\s*'
                        r'<p class="collapsed admonition-title">([^<]*)</p>', page)
    for prompt in set(prompts):
        assert folded.count(html.escape(prompt, quote=False)) >= prompts.count(prompt), (
            f"{name}: {prompts.count(prompt)} solutions behind {prompt!r}, {folded.count(prompt)} folds")
    text = page_text(page)
    for cell in solutions:
        for output in cell.get("outputs", []):
            shown = "".join(output.get("text", [])) or "".join(output.get("data", {}).get("text/plain", []))
            for line in (line.strip() for line in shown.splitlines()):
                assert len(line) < 8 or line not in text, f"{name}: a solution's output is on the page: {line!r}"


def test_no_file_of_the_site_holds_hidden_tests(site):
    """Hidden tests are nowhere on the website, search index and copied sources included; the
    classroom appendix may describe the markers."""
    holding = sorted(
        path.relative_to(site).as_posix() for path in site.rglob("*")
        if path.is_file() and path.suffix in (".html", ".js", ".ipynb", ".txt", ".md", ".json")
        and not path.relative_to(site).parts[0] == "_static"
        and "BEGIN HIDDEN TESTS" in path.read_text(encoding="utf-8", errors="replace")
    )
    assert [p for p in holding if not p.endswith(("chapters/appendix_classroom.html", "chapters/appendix_classroom.md"))] == []


def test_a_solution_unfolds(visit):
    """In Chromium a solution is hidden until its "Show the solution" is clicked, then shows its code."""
    name = next(p for p in CHAPTERS if solution_cells(p))
    page = visit(name).page
    fold = page.locator("details.above-input", has=page.locator("summary", has_text="Show the solution")).first
    code = fold.locator(".cell_input pre").first
    assert fold.get_attribute("open") is None and not code.is_visible()
    fold.locator("summary").click()
    try:
        code.wait_for(state="visible")
        shown = code.inner_text()
        assert "def " in shown or "=" in shown, shown
        assert "BEGIN SOLUTION" not in shown and "END SOLUTION" not in shown
    finally:
        if fold.get_attribute("open") is not None:
            fold.locator("summary").click()  # folded again, as other tests expect

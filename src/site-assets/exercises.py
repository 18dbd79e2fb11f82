"""Sphinx extension: a chapter's exercises on the website, as a self-learner needs them.

The chapters keep their exercises in nbgrader's format, from which the nbgrader course and the
runnable edition are made (see chapters/appendix_classroom.md). On the website a reader gets the task (the
prose) and a solution folded behind "Show the solution", and nothing of the grading:

- a test cell (``nbgrader.grade`` true, ``solution`` false), hidden tests included, is left out,
  with its stored "... passed, 1/1";
- a read-only cell that only imports the grader (``from attnbook_classroom.grading import check``)
  is left out (one that also sets up the task, such as printing the masks to choose from, stays);
- a solution cell (``nbgrader.solution`` true) is always folded, behind "Show the solution" unless
  its metadata names its own prompt; its code is shown without nbgrader's marker lines
  (``### BEGIN SOLUTION`` ...), and its stored outputs are not shown at all, so that no answer is
  printed before the reader asks for it.

The notebooks are not changed: this acts on the page while it is read.
"""

from __future__ import annotations

import re

from docutils import nodes

SHOW, HIDE = "Show the solution", "Hide the solution"
MARKER = re.compile(r"^[ \t]*###[ \t]*(BEGIN|END)[ \t]+(SOLUTION|HIDDEN TESTS)[ \t]*$")
HIDDEN_TESTS = re.compile(r"^[ \t]*###[ \t]*BEGIN[ \t]+HIDDEN TESTS[ \t]*$.*?^[ \t]*###[ \t]*END[ \t]+HIDDEN TESTS[ \t]*$\n?",
                          re.MULTILINE | re.DOTALL)
GRADER_IMPORT = re.compile(r"^(from\s+attnbook_classroom\S*\s+import\s.+|import\s+attnbook_classroom\S*.*)$")


def nbgrader_role(metadata: dict, source: str) -> str | None:
    """What an nbgrader cell is to the website: "solution" (shown folded, without its outputs),
    "grading" (left out) or None (not nbgrader's, or a read-only cell the task needs: shown)."""
    grader = metadata.get("nbgrader")
    if not isinstance(grader, dict):
        return None
    if grader.get("solution"):
        return "solution"
    lines = [line.strip() for line in source.splitlines() if line.strip() and not line.strip().startswith("#")]
    if grader.get("grade") or (lines and all(GRADER_IMPORT.match(line) for line in lines)):
        return "grading"
    return None


def without_markers(source: str) -> str:
    """``source`` without hidden tests and without nbgrader's marker lines."""
    source = HIDDEN_TESTS.sub("", source)
    lines = [line for line in source.split("\n") if not MARKER.match(line)]
    return "\n".join(lines).strip("\n")


def _code(cell) -> nodes.literal_block | None:
    for part in cell.children:
        if part.get("nb_element") == "cell_code_source":
            return next(iter(part.findall(nodes.literal_block)), None)
    return None


def exercises_for_readers(app, doctree) -> None:
    """doctree-read: leave out the grading, fold the solutions, show no answer unasked."""
    for cell in list(doctree.findall(nodes.container)):
        if cell.get("nb_element") != "cell_code" or cell.parent is None:
            continue
        code = _code(cell)
        source = code.astext() if code is not None else ""
        role = nbgrader_role(cell.get("cell_metadata", {}), source)
        if role == "grading":
            cell.parent.remove(cell)
        elif role == "solution":
            for part in [p for p in cell.children if p.get("nb_element") == "cell_code_output"]:
                cell.remove(part)
            if code is not None:
                shown = without_markers(source)
                code.children = []
                code += nodes.Text(shown)
                code.rawsource = shown
            prompts = cell.get("cell_metadata", {}).get("mystnb", {})
            cell["hide_mode"] = "input"
            cell["prompt_show"] = prompts.get("code_prompt_show", SHOW)
            cell["prompt_hide"] = prompts.get("code_prompt_hide", HIDE)


def setup(app):
    # After myst-nb has made the cells, before its post-transform folds them (and before
    # book_pages labels the check cells, which it does on the same event).
    app.connect("doctree-read", exercises_for_readers, priority=400)
    return {"parallel_read_safe": True, "parallel_write_safe": True}

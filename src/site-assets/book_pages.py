"""Sphinx extension: figure numbers per chapter, a "Show the check" toggle on check cells, folds
named by their own prompts, and each inline script once per page.

Figures, tables and listings are numbered within their chapter, with the chapter's own number
taken from its file name: the second figure of ``chapters/03_scaled_dot_product`` is Figure 3.2,
the first of ``chapters/05b_four_scores`` Figure 5b.1 ({numref} references follow). Sphinx would
number them through the whole book, or by toctree position (which the notation page and chapter
5b would shift).

A check cell (tagged ``hide-input``, first line ``# Check: ...``; see tests/book/test_cells.py) is folded
behind "Show the check" instead of "Show code cell source", unless its metadata names its own prompt.

Every fold is announced by its own prompt: MyST-NB gives the ``<summary>`` of a folded cell the
accessible name "Toggle hidden content" (an ``aria-label``), which a screen reader says instead of
the visible "Show the check" or "Show the solution" (axe's ``label-content-name-mismatch``). The
label is removed, so the summary's name is its visible text.

Sphinx 7.4 lists an inline script that an extension adds while the documents are read (such as
sphinx-thebe's ``const THEBE_JS_URL = ...``) twice on every page: once as added, and again when the
HTML builder re-adds the registered scripts before writing (the first copy has no file name, the
second an empty one, so they are not recognised as the same script). A ``const`` declared twice is
an error in the browser. Each page gets every script once.
"""

from __future__ import annotations

import os
import re

from docutils import nodes

from bookbuild.runnable.book import chapter_number  # the runnable edition numbers figures the same way

CHECK_FIRST_LINE = re.compile(r"^\s*#\s*Check\b")


def number_per_chapter(app, env) -> list[str]:
    """env-get-updated, after Sphinx has numbered everything: renumber within each chapter."""
    changed = []
    for docname, by_type in env.toc_fignumbers.items():
        chapter = chapter_number(docname)
        if chapter is None:
            continue
        for figtype, numbers in by_type.items():
            in_order = sorted(numbers, key=lambda figure_id: numbers[figure_id])
            renumbered = {figure_id: (chapter, i) for i, figure_id in enumerate(in_order, start=1)}
            if renumbered != numbers:
                by_type[figtype] = renumbered
                changed.append(docname)
    return sorted(set(changed))


def label_check_cells(app, doctree) -> None:
    """doctree-read: a folded cell whose code starts with '# Check' is toggled by "Show the check"."""
    for cell in doctree.findall(nodes.container):
        if cell.get("nb_element") != "cell_code" or cell.get("hide_mode") != "input":
            continue
        if "code_prompt_show" in cell.get("cell_metadata", {}).get("mystnb", {}):
            continue
        code = next(iter(cell.findall(nodes.literal_block)), None)
        if code is not None and CHECK_FIRST_LINE.match(code.astext()):
            cell["prompt_show"], cell["prompt_hide"] = "Show the check", "Hide the check"


# What MyST-NB 1.4 writes for a folded cell (myst_nb.sphinx_.visit_HideCellInput).
FOLD_SUMMARY = '<summary aria-label="Toggle hidden content">'


def folds_named_by_their_prompts(app, pagename, templatename, context, doctree) -> None:
    """html-page-context: a fold's summary is named by its visible prompt, not by a fixed label."""
    body = context.get("body")
    if body and FOLD_SUMMARY in body:
        context["body"] = body.replace(FOLD_SUMMARY, "<summary>")


def one_copy_of_each_script(app, pagename, templatename, context, doctree) -> None:
    scripts = context.get("script_files")
    if not scripts:
        return
    seen, unique = set(), []
    for script in scripts:
        key = (os.fspath(script.filename or ""), script.priority, tuple(sorted(script.attributes.items())))
        if key not in seen:
            seen.add(key)
            unique.append(script)
    scripts[:] = unique


def setup(app):
    app.connect("env-get-updated", number_per_chapter, priority=900)  # after the toctree collector
    app.connect("doctree-read", label_check_cells)
    app.connect("html-page-context", one_copy_of_each_script)
    app.connect("html-page-context", folds_named_by_their_prompts)
    return {"parallel_read_safe": True, "parallel_write_safe": True}

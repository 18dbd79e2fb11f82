"""From a chapter to its exercise notebook.

A chapter ends with ``## Exercises`` (the *exercise section*). Its **exercise notebook** is what a
class receives as an assignment: a title, the chapter's Colab install cell, the chapter's cells
tagged ``exercise-setup`` (whatever the exercises need from the chapter, never its training
runs) and the exercise section, its MyST resolved as the runnable edition resolves it. The book's
notebooks are read through the build's readers (:mod:`bookbuild.notebooks`, :mod:`bookbuild.runnable`):
the table of contents, the exercise section and its student form, the glued values, the MyST.
"""

from __future__ import annotations

import copy
import functools
import os
import pathlib
import re

import nbformat

from bookbuild.notebooks import KERNELSPEC, REPO, clean_cell, exercise_section, glued_values, read_notebook, source_of

__all__ = ["REPO", "graded_cells", "exercise_notebook", "check_exercise_notebook", "SETUP_TAG"]

SETUP_TAG = "exercise-setup"  # a chapter cell the exercise notebook needs (imports, a shipped result)


def graded_cells(notebook) -> list[dict]:
    """The nbgrader metadata of every graded or solution cell of a notebook."""
    return [c["metadata"]["nbgrader"] for c in read_notebook(notebook).cells if "nbgrader" in c.get("metadata", {})]


def exercise_notebook(chapter) -> nbformat.NotebookNode:
    """The exercise notebook of a chapter, in the instructor's form (solutions and hidden tests in)."""
    nb = read_notebook(chapter)
    section = exercise_section(nb)
    if not section:
        raise ValueError(f"{getattr(chapter, 'name', 'the notebook')}: no '## Exercises' section")
    title = next((source_of(c).strip().splitlines()[0].lstrip("# ").strip() for c in nb.cells
                  if c.cell_type == "markdown" and source_of(c).lstrip().startswith("# ")), "this chapter")
    intro = nbformat.v4.new_markdown_cell(
        f"# Exercises: {title}\n\n"
        f"These are the exercises of the chapter *{title}* of the attention book. Write each answer in "
        "its cell, in place of `raise NotImplementedError()` or *YOUR ANSWER HERE*, then run the test "
        "cells under it: each checks one thing, is worth its points, and when it fails its message "
        "says what is wrong. `nbgrader validate` runs every test at once. When your work is graded, "
        "hidden tests run each function again on inputs of your own.")
    intro.id = "exercises-title"  # fixed ids: a notebook made again is the same notebook
    cells = [intro]
    first = nb.cells[0] if nb.cells else None
    if first is not None and first.cell_type == "code" and "google.colab" in source_of(first):
        cells.append(clean_cell(first))  # installs the package when the notebook is opened in Colab
    heading = section[0]
    cells += [clean_cell(c) for c in nb.cells[:nb.cells.index(heading)] if SETUP_TAG in c.metadata.get("tags", [])]
    body = source_of(heading).lstrip()[len("## Exercises"):].strip()
    if body and "solutions are folded away" not in body:
        about = nbformat.v4.new_markdown_cell(body)  # what the chapter says about its own exercises
        about.id = "exercises-about"
        cells.append(about)
    cells += [clean_cell(c) for c in section[1:]]
    if isinstance(chapter, (str, os.PathLike)):
        cells = resolve_myst(cells, nb, pathlib.Path(chapter))
    out = nbformat.v4.new_notebook(cells=cells, metadata={"kernelspec": KERNELSPEC,
                                                          "language_info": {"name": "python"}})
    return out


ROLE_OR_DIRECTIVE = re.compile(r"\{[A-Za-z][\w:+-]*\}`|^\s*(```+|:::+)\s*\{|^\([^()\s]+\)=\s*$", re.M)


@functools.lru_cache(maxsize=1)
def _book():
    """The book's pages and labels, read from the clone of the book the course is made from. (The
    runnable edition's builder, imported here, loads the tooling: kept out of this module's import,
    which nbgrader's commands make.)"""
    from bookbuild.runnable.book import Book

    return Book(REPO)


def resolve_myst(cells: list, chapter_nb, chapter: pathlib.Path) -> list:
    """The exercise notebook's Markdown as any Jupyter shows it: every MyST role and directive
    resolved as the runnable edition resolves it (glued numbers written in, figures and equations
    numbered, pages linked to their runnable notebook in the repository), and each figure an exercise
    refers to put in the notebook, as an image with its caption, before the first cell that refers to
    it."""
    from bookbuild.runnable.myst import ROLE, FigureBlock, MarkdownConverter

    book = _book()
    docname = book.docname_of(chapter, book.root)
    glued, _ = glued_values(chapter_nb)

    def link(target: str) -> str:
        path = book.path(target)
        if path is not None and path.suffix == ".ipynb":
            return book.blob_url(f"chapters/runnable/{path.name}")
        return book.blob_url(path.relative_to(book.root).as_posix() if path else target)

    converter = MarkdownConverter(book=book, docname=docname, glued=glued, link=link)
    cells = copy.deepcopy(cells)
    if cells and cells[0].get("id") == "exercises-title":  # where to read the chapter they refer to
        cells[0].source += (f"\n\nThe exercises refer to the chapter: read it in [its runnable notebook]"
                            f"({link(docname)}); the figures they name are in this notebook.")
    figures = {}  # the chapter's figures, by label
    for cell in chapter_nb.cells:
        if cell.cell_type == "markdown" and "glue:figure" in cell.source:
            for piece in converter.convert(cell.source):
                if isinstance(piece, FigureBlock) and piece.label:
                    figures[piece.label] = piece
    converter.cited.clear()
    out, shown = [], set()
    for cell in cells:
        if cell.cell_type != "markdown":
            out.append(cell)
            continue
        wanted = [m["content"].split("<")[-1].strip(" >") for m in ROLE.finditer(cell.source) if m["name"] == "numref"]
        for label in wanted:
            if label in figures and label not in shown:
                out.append(_figure_cell(figures[label], glued, label))
                shown.add(label)
        pieces = converter.convert(cell.source)
        cell = copy.deepcopy(cell)
        cell.source = "\n\n".join(p for p in pieces if isinstance(p, str))
        out.append(cell)
    if converter.cited:
        refs = "\n".join(f"- {book.bibliography[k].label}. {book.bibliography[k].reference}" for k in converter.cited)
        out.append(nbformat.v4.new_markdown_cell("## References\n\n" + refs, id="exercises-references"))
    return out


def _figure_cell(block, glued: dict, label: str) -> nbformat.NotebookNode:
    """A figure of the chapter as a Markdown cell: its image (attached) and its caption."""
    data = glued.get(block.name, {})
    image = data.get("image/png")
    if image is None:
        raise ValueError(f"the figure {label} was not glued as a PNG image")
    name = f"{label}.png"
    number = f"**Figure {block.number}.** " if block.number else ""
    text = f"![{block.alt or label}](attachment:{name})\n\n{number}{block.caption}".rstrip()
    cell = nbformat.v4.new_markdown_cell(text, id=re.sub(r"[^A-Za-z0-9_-]", "-", f"figure-{label}")[:64])
    cell.attachments = {name: {"image/png": image if isinstance(image, str) else "".join(image)}}
    return cell


def check_exercise_notebook(nb, name: str = "notebook") -> None:
    """Raise ``ValueError`` naming the cell unless the notebook is in the book's exercise format."""
    from attnbook_classroom.grading.submission import BadTestCell, parse_test_cell

    ids = [c.metadata["nbgrader"]["grade_id"] for c in nb.cells if "grade_id" in c.metadata.get("nbgrader", {})]
    duplicated = sorted({i for i in ids if ids.count(i) > 1})
    if duplicated:
        raise ValueError(f"{name}: grade ids used twice: {duplicated}")
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        source = source_of(cell)
        if meta.get("solution") and cell.cell_type == "code" and "BEGIN SOLUTION" not in source:
            raise ValueError(f"{name}: solution cell {meta.get('grade_id')} has no ### BEGIN SOLUTION region")
        if meta.get("grade") and not meta.get("solution"):
            if cell.cell_type != "code" or not meta.get("locked"):
                raise ValueError(f"{name}: test cell {meta.get('grade_id')} must be a locked code cell")
            try:
                parse_test_cell(source, meta["grade_id"])
            except BadTestCell as exc:
                raise ValueError(f"{name}: {exc}") from None

"""The runnable edition on disk: writing it, checking it is current, filled copies, a student's copy."""

from __future__ import annotations

import pathlib
import shutil

import nbformat

from bookbuild.runnable.book import Book
from bookbuild.runnable.edition import EDITION_DIR, filled_copy, runnable_notebook

__all__ = ["REPO", "FILLED_DIR", "WORKSPACE_DIR", "edition_notebooks", "build_edition", "stale_notebooks",
           "write_filled_copies", "copy_missing"]

REPO = pathlib.Path(__file__).resolve().parents[3]
FILLED_DIR = "_build/runnable-filled"  # relative to the book's root
WORKSPACE_DIR = "chapters/workspace"  # a student's own copies (git-ignored, never overwritten)


def _text(nb: nbformat.NotebookNode) -> str:
    return nbformat.writes(nb) + "\n"


def edition_notebooks(root: pathlib.Path = REPO, chapters: list[pathlib.Path] | None = None
                      ) -> dict[pathlib.Path, str]:
    """The runnable edition of each chapter (default: every notebook in ``_toc.yml``), as the text
    of its file, by the path it belongs at (``chapters/runnable/<name>.ipynb``)."""
    book = Book(root)
    edition = {book.docname_of(p, book.root) for p in book.notebooks()}
    sources = [pathlib.Path(c).resolve() for c in chapters] if chapters else book.notebooks()
    return {book.root / EDITION_DIR / s.name: _text(runnable_notebook(s, book, edition)) for s in sources}


def build_edition(root: pathlib.Path = REPO, chapters: list[pathlib.Path] | None = None) -> list[pathlib.Path]:
    """Write the runnable edition into ``chapters/runnable/``; remove the notebooks there whose
    chapter is no longer in the table of contents (when building every chapter)."""
    notebooks = edition_notebooks(root, chapters)
    folder = pathlib.Path(root).resolve() / EDITION_DIR
    folder.mkdir(parents=True, exist_ok=True)
    for path, text in notebooks.items():
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
    if not chapters:
        for old in set(folder.glob("*.ipynb")) - set(notebooks):
            old.unlink()
    return sorted(notebooks)


def stale_notebooks(root: pathlib.Path = REPO) -> list[str]:
    """The files of ``chapters/runnable/`` that differ from what their chapters generate now, are
    missing, or belong to no chapter (empty when the committed edition is current)."""
    notebooks = edition_notebooks(root)
    folder = pathlib.Path(root).resolve() / EDITION_DIR
    stale = [p.name for p, text in notebooks.items()
             if not p.is_file() or p.read_text(encoding="utf-8") != text]
    stale += [p.name for p in folder.glob("*.ipynb") if p not in notebooks]
    return sorted(stale)


def write_filled_copies(root: pathlib.Path = REPO, out: pathlib.Path | None = None) -> list[pathlib.Path]:
    """Write the filled copy of every notebook of the committed runnable edition (exercises answered
    from the chapters' solutions, stored outputs kept) into ``out`` (default ``_build/runnable-filled``);
    nbval runs these. Returns the written paths, in reading order."""
    root = pathlib.Path(root).resolve()
    out = pathlib.Path(out) if out else root / FILLED_DIR
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.ipynb"):
        old.unlink()
    written = []
    for source in Book(root).notebooks():
        edition_path = root / EDITION_DIR / source.name
        filled = filled_copy(nbformat.read(edition_path, as_version=4), nbformat.read(source, as_version=4))
        target = out / source.name
        target.write_text(_text(filled), encoding="utf-8")
        written.append(target)
    return written


def copy_missing(edition: pathlib.Path, workspace: pathlib.Path) -> list[pathlib.Path]:
    """Copy each notebook of ``edition`` that ``workspace`` does not have yet; a notebook already
    there (perhaps edited) is never touched. Returns the copied files."""
    workspace.mkdir(parents=True, exist_ok=True)
    copied = []
    for notebook in sorted(pathlib.Path(edition).glob("*.ipynb")):
        target = workspace / notebook.name
        if not target.exists():
            shutil.copyfile(notebook, target)
            copied.append(target)
    return copied

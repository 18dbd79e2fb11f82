"""The runnable edition of the book: every chapter as a notebook for plain Jupyter and Colab.

The chapters are written for the website's MyST renderer. Their runnable edition, committed in
``chapters/runnable/``, is what students open in JupyterLab, Colab and Binder: the same text,
code and outputs with every MyST construct resolved, figures shown where they are discussed, and
the exercises in student form. Generate it after re-executing a chapter:

    python -m bookbuild.runnable build          # write chapters/runnable/ (`make runnable`)
    python -m bookbuild.runnable check          # exit 1 if chapters/runnable/ is out of date
    python -m bookbuild.runnable fill [--out D] # filled copies for nbval (`make nbval-runnable`)
    python -m bookbuild.runnable lab [--dir D] [-- JUPYTER-LAB-ARGS]   # `make lab`

``lab`` copies the edition into a working folder (``chapters/workspace/``), adding only the
notebooks that are not there yet, and starts JupyterLab on it at 127.0.0.1: a notebook a student
has edited is never overwritten. Delete a notebook there to get a fresh copy at the next start.
"""

from bookbuild.runnable.book import Book, Citation, RunnableError
from bookbuild.runnable.edition import (EDITION_DIR, exercises_start, filled_copy, install_cell, runnable_notebook,
                      student_exercise_cells, website_only_output)
from bookbuild.runnable.files import (FILLED_DIR, REPO, WORKSPACE_DIR, build_edition, copy_missing, edition_notebooks,
                    stale_notebooks, write_filled_copies)
from bookbuild.runnable.myst import FigureBlock, MarkdownConverter, format_glued_text

__all__ = ["Book", "Citation", "RunnableError", "EDITION_DIR", "exercises_start", "filled_copy",
           "install_cell", "runnable_notebook", "student_exercise_cells", "website_only_output", "FILLED_DIR",
           "REPO", "WORKSPACE_DIR", "build_edition", "copy_missing", "edition_notebooks", "stale_notebooks",
           "write_filled_copies", "FigureBlock", "MarkdownConverter", "format_glued_text"]

"""The readers of the book's notebooks: the table of contents, a chapter's exercise section and its
student form, and the values a chapter glues.

A chapter ends with ``## Exercises`` (the *exercise section*). :func:`student_exercise_cells` gives
the student form of that section through nbgrader's own preprocessors: solutions replaced by stubs,
hidden tests and mark schemes removed, outputs cleared, visible tests kept. The runnable edition
(:mod:`bookbuild.runnable`) and the classroom's course (``attnbook_classroom.course``) both read the
chapters through this module.
"""

from __future__ import annotations

import copy
import os
import pathlib

import nbformat

__all__ = ["REPO", "KERNELSPEC", "toc_files", "toc_chapters", "read_notebook", "source_of", "clean_cell",
           "exercise_section", "student_exercise_cells", "python_of", "glued_values"]

REPO = pathlib.Path(__file__).resolve().parents[2]
KERNELSPEC = {"name": "python3", "display_name": "Python 3", "language": "python"}
GLUE_PREFIX = "application/papermill.record/"


def toc_files(toc_path: pathlib.Path = REPO / "_toc.yml") -> list[str]:
    """Every page of ``_toc.yml`` (the root, then each ``file:``) in reading order, without suffix."""
    import yaml

    toc = yaml.safe_load(pathlib.Path(toc_path).read_text())
    files: list[str] = [toc["root"]] if "root" in toc else []

    def walk(node):
        if isinstance(node, dict):
            if "file" in node:
                files.append(node["file"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk({key: value for key, value in toc.items() if key != "root"})
    return files


def toc_chapters(repo: pathlib.Path = REPO) -> list[pathlib.Path]:
    """The chapter notebooks listed in ``_toc.yml``, in reading order."""
    return [repo / f"{f}.ipynb" for f in toc_files(repo / "_toc.yml") if (repo / f"{f}.ipynb").exists()]


def read_notebook(notebook) -> nbformat.NotebookNode:
    """A notebook read from its path, or a copy of the notebook given."""
    if isinstance(notebook, (str, os.PathLike)):
        return nbformat.read(os.fspath(notebook), as_version=4)
    return copy.deepcopy(notebook)


def source_of(cell) -> str:
    """A cell's source as one string."""
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def clean_cell(cell) -> nbformat.NotebookNode:
    """A copy of the cell without outputs, execution count or timing."""
    cell = copy.deepcopy(cell)
    if cell.cell_type == "code":
        cell.outputs, cell.execution_count = [], None
    cell.metadata.pop("execution", None)
    return cell


def exercise_section(notebook) -> list[nbformat.NotebookNode]:
    """The cells from the chapter's ``## Exercises`` heading to its end (none if it has no section)."""
    cells = read_notebook(notebook).cells
    for i, cell in enumerate(cells):
        if cell.cell_type == "markdown" and source_of(cell).lstrip().startswith("## Exercises"):
            return cells[i:]
    return []


def student_exercise_cells(notebook) -> list[nbformat.NotebookNode]:
    """The exercises of a chapter as a student gets them, for a notebook of one's own.

    ``notebook`` is a chapter (a path or an ``nbformat`` notebook). Returns its exercise section,
    ``## Exercises`` heading first, through nbgrader's preprocessors: every solution region replaced
    by ``raise NotImplementedError()`` (a written answer by *YOUR ANSWER HERE*), hidden tests and
    mark schemes removed, outputs cleared, locked cells marked read-only; visible tests are kept.
    Returns [] for a chapter without exercises.
    """
    from nbgrader.preprocessors import ClearHiddenTests, ClearMarkScheme, ClearOutput, ClearSolutions, LockCells

    section = exercise_section(notebook)
    if not section:
        return []
    nb = nbformat.v4.new_notebook(cells=[clean_cell(c) for c in section], metadata={"kernelspec": KERNELSPEC})
    resources: dict = {}
    for preprocessor in (LockCells(), ClearSolutions(), ClearHiddenTests(), ClearMarkScheme(), ClearOutput()):
        nb, resources = preprocessor.preprocess(nb, resources)
    for cell in nb.cells:
        cell.metadata.pop("mystnb", None)  # the website's "Show the solution" toggle
        tags = [t for t in cell.metadata.get("tags", []) if t != "hide-input"]  # nothing left to hide
        if tags:
            cell.metadata["tags"] = tags
        else:
            cell.metadata.pop("tags", None)
    return list(nb.cells)


def python_of(source: str):
    """The Python syntax tree of a code cell's source (IPython's magics and ``!`` lines transformed)."""
    import ast

    from IPython.core.inputtransformer2 import TransformerManager

    return ast.parse(TransformerManager().transform_cell(source))


def glued_values(nb) -> tuple[dict[str, dict], dict[str, int]]:
    """Every value the notebook glues: name -> MIME bundle (prefix removed), and name -> cell index."""
    values, where = {}, {}
    for index, cell in enumerate(nb.cells):
        for output in cell.get("outputs", []):
            name = (output.get("metadata") or {}).get("scrapbook", {}).get("name")
            if name:
                values[name] = {k.removeprefix(GLUE_PREFIX): v for k, v in output.get("data", {}).items()}
                where[name] = index
    return values, where

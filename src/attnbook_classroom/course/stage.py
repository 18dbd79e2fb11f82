"""A submission as ``make grade`` hands it to nbgrader: what the student handed in, made gradable,
with a note for everything that was wrong with it.

nbgrader stops at the first thing it does not expect: a notebook renamed, an extra notebook, a cell
whose grade id was changed or copied, a solution cell marked as a test, a deleted answer cell. Such
a submission would get ``error`` and no score. :func:`stage` copies the submission folder (already
checked to hold no link) to ``ROOT/.grading/staged/<student>/<assignment>/``, where nbgrader reads
it, and there:

- takes the assignment's notebook, or, when it is missing, the one other notebook handed in (a
  renamed file); other notebooks are listed and not graded;
- refuses a notebook over ``max_bytes`` or ``max_cells`` (before any notebook library reads it);
- gives each cell that carries one of the assignment's grade ids the assignment's grading marks,
  runs a cell with an unknown or a repeated grade id as an ordinary cell, puts back a test cell that
  is missing, and gives a missing answer cell an empty stand-in (the student's code wherever it is
  still runs);
- clears the outputs, and puts the notes at the top of the notebook (so the feedback page shows
  them).
"""

from __future__ import annotations

import copy
import functools
import json
import pathlib
import re
import shutil

import nbformat

__all__ = ["stage", "Unreadable", "STAGED"]

STAGED = ".grading/staged"  # relative to the course folder: nbgrader's submitted_directory for make grade
NOTES_MARK = "attnbook-grading-notes"


class Unreadable(Exception):
    """A submission that cannot be graded at all; the message says why."""


def _cells_by_id(nb) -> dict[str, nbformat.NotebookNode]:
    return {c.metadata["nbgrader"]["grade_id"]: c for c in nb.cells
            if "grade_id" in c.get("metadata", {}).get("nbgrader", {})}


def _marks(meta: dict) -> dict:
    return {k: meta.get(k) for k in ("grade", "solution", "locked", "task", "points", "grade_id")
            if k in meta}


def _grade_ids(path: pathlib.Path) -> set[str]:
    """The grade ids a file that may be a notebook holds (none when it cannot be read)."""
    try:
        if path.stat().st_size > 50_000_000:
            return set()
        cells = json.loads(path.read_bytes()).get("cells", [])
        return {c["metadata"]["nbgrader"]["grade_id"] for c in cells
                if isinstance(c, dict) and "grade_id" in c.get("metadata", {}).get("nbgrader", {})}
    except Exception:
        return set()


@functools.lru_cache(maxsize=64)
def _course_notebook(path: str, mtime: int) -> nbformat.NotebookNode:
    return nbformat.read(path, as_version=4)


def _instructors(path: pathlib.Path) -> nbformat.NotebookNode:
    """A notebook of ``source/`` or ``release/`` (read once per change, a copy each time)."""
    return copy.deepcopy(_course_notebook(str(path), path.stat().st_mtime_ns))


def _read(path: pathlib.Path, max_bytes: int, max_cells: int) -> nbformat.NotebookNode:
    size = path.stat().st_size
    if size > max_bytes:
        raise Unreadable(f"{path.name} is {size / 1e6:.1f} MB, over the grading limit of {max_bytes / 1e6:.1f} MB "
                         "(clear its outputs and hand it in again)")
    try:
        data = json.loads(path.read_bytes())
    except (ValueError, UnicodeDecodeError) as exc:
        raise Unreadable(f"{path.name} is not a notebook (it is not JSON: {str(exc)[:120]})") from None
    cells = data.get("cells") if isinstance(data, dict) else None
    if not isinstance(cells, list):
        raise Unreadable(f"{path.name} is not a notebook (it has no list of cells)")
    if len(cells) > max_cells:
        raise Unreadable(f"{path.name} has {len(cells)} cells, over the grading limit of {max_cells}")
    try:
        nb = nbformat.from_dict(data)
        if nb.get("nbformat", 4) != 4:
            nb = nbformat.convert(nb, 4)
        nb.nbformat_minor = max(nb.get("nbformat_minor", 5), 5)
        for index, cell in enumerate(nb.cells):
            cell.setdefault("metadata", {})
            if not isinstance(cell.get("id"), str) or not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", cell["id"]):
                cell["id"] = f"cell-{index}"
            cell["source"] = "".join(cell.get("source", "")) if isinstance(cell.get("source"), list) else str(cell.get("source", ""))
    except Exception as exc:
        raise Unreadable(f"{path.name} is not a notebook nbgrader can read ({type(exc).__name__}: {str(exc)[:120]})") from None
    return nb


def _normalize(nb, source, release, name: str) -> tuple[nbformat.NotebookNode, list[str]]:
    """The notebook with the assignment's grading marks on its cells, and what had to change."""
    notes = []
    wanted = _cells_by_id(source)
    order = list(wanted)
    released = _cells_by_id(release)
    cells, seen = [], set()
    for cell in nb.cells:
        if cell.get("cell_type") not in ("code", "markdown", "raw"):
            continue
        if cell.metadata.get("tags") and NOTES_MARK in cell.metadata.get("tags", []):
            continue  # notes of an earlier staging
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
        meta = cell.metadata.get("nbgrader")
        if isinstance(meta, dict) and meta:
            grade_id = meta.get("grade_id")
            if grade_id not in wanted:
                del cell.metadata["nbgrader"]
                notes.append(f"A cell marked with the grade id {grade_id!r}, which {name} does not have, was run "
                             "as an ordinary cell (was a graded cell renamed or copied?).")
            elif grade_id in seen:
                del cell.metadata["nbgrader"]
                notes.append(f"A second cell marked {grade_id!r} was run as an ordinary cell.")
            else:
                seen.add(grade_id)
                original = wanted[grade_id]
                if _marks(meta) != _marks(original.metadata["nbgrader"]):
                    notes.append(f"The grading marks of cell {grade_id!r} had been changed; the assignment's "
                                 "were used.")
                cell.metadata["nbgrader"] = dict(original.metadata["nbgrader"])
                if cell.cell_type != original.cell_type:
                    notes.append(f"Cell {grade_id!r} had been turned into a {cell.cell_type} cell; it was "
                                 f"graded as the {original.cell_type} cell it is.")
                    cell.cell_type = original.cell_type
                    if original.cell_type == "code":
                        cell.outputs, cell.execution_count = [], None
                    else:
                        cell.pop("outputs", None)
                        cell.pop("execution_count", None)
        elif "nbgrader" in cell.metadata:
            del cell.metadata["nbgrader"]
        cells.append(cell)
    for grade_id in order:
        if grade_id in seen:
            continue
        original = wanted[grade_id]
        meta = original.metadata["nbgrader"]
        before = [g for g in order[:order.index(grade_id)] if g in seen]
        at = (max(i for i, c in enumerate(cells) if c.metadata.get("nbgrader", {}).get("grade_id") in before) + 1
              if before else 0)
        if meta.get("grade") and not meta.get("solution"):  # a test cell: the released one
            cell = nbformat.from_dict(json.loads(json.dumps(released.get(grade_id, original))))
            notes.append(f"The test cell {grade_id!r} was missing; it was put back.")
        else:  # an answer cell: an empty stand-in, so that nothing of the student's is overwritten
            maker = nbformat.v4.new_code_cell if original.cell_type == "code" else nbformat.v4.new_markdown_cell
            cell = maker("")
            cell.metadata["nbgrader"] = dict(meta)
            notes.append(f"The answer cell {grade_id!r} was missing (deleted, or its marks changed); the "
                         "notebook was graded on the code it holds elsewhere.")
        cell.id = re.sub(r"[^A-Za-z0-9_-]", "-", f"restored-{grade_id}")[:64]
        cells.insert(at, cell)
        seen.add(grade_id)
    nb.cells = cells
    nb.metadata["kernelspec"] = source.metadata.get("kernelspec", nb.metadata.get("kernelspec", {}))
    return nb, notes


def stage(folder: pathlib.Path, source: pathlib.Path, release: pathlib.Path, target: pathlib.Path, *,
          max_bytes: int, max_cells: int) -> list[str]:
    """Copy ``folder`` (a submission, holding no link) to ``target`` as nbgrader is to grade it;
    return the notes for the student. Raises :class:`Unreadable` when nothing can be graded."""
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True, mode=0o700)
    expected = sorted(p.stem for p in source.glob("*.ipynb"))
    handed = {p.stem: p for p in folder.iterdir() if p.suffix == ".ipynb" and p.is_file() and not p.is_symlink()}
    for path in folder.iterdir():
        if path.suffix == ".ipynb" or path.is_symlink():
            continue
        if path.is_dir():
            shutil.copytree(path, target / path.name, symlinks=True)
        elif path.is_file():
            shutil.copy(path, target / path.name)
    notes, used = [], set()
    for name in expected:
        path = handed.get(name)
        if path is None:  # a renamed notebook: the other one that holds most of the assignment's cells
            ids = set(_cells_by_id(_instructors(source / f"{name}.ipynb")))
            others = sorted((p for stem, p in handed.items() if stem not in expected and stem not in used),
                            key=lambda p: (len(ids & _grade_ids(p)), p.stat().st_mtime), reverse=True)
            if not others:
                notes.append(f"No notebook {name}.ipynb was handed in.")
                continue
            path = others[0]
            notes.append(f"Your notebook {path.name} was graded as {name}.ipynb, the assignment's notebook.")
        used.add(path.stem)
        nb = _read(path, max_bytes, max_cells)
        src = _instructors(source / f"{name}.ipynb")
        rel_path = release / f"{name}.ipynb"
        rel = _instructors(rel_path) if rel_path.exists() else src
        nb, changed = _normalize(nb, src, rel, f"{name}.ipynb")
        notes += changed
        (target / f"{name}.ipynb").write_text(nbformat.writes(nb))
    for stem in sorted(set(handed) - used - set(expected)):
        notes.append(f"{handed[stem].name} is not part of the assignment and was not graded.")
    if notes:
        for name in expected:
            path = target / f"{name}.ipynb"
            if path.exists():
                nb = nbformat.read(str(path), as_version=4)
                text = "**Notes from grading** (what had to be changed before your notebook could be graded):\n\n"
                cell = nbformat.v4.new_markdown_cell(text + "\n".join(f"- {n}" for n in notes))
                cell.metadata["tags"] = [NOTES_MARK]
                cell.id = "attnbook-grading-notes"
                nb.cells.insert(0, cell)
                path.write_text(nbformat.writes(nb))
    return notes

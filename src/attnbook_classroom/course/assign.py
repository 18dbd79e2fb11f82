"""``make assignments``: set up the course folder and release each chapter's exercise notebook."""

from __future__ import annotations

import json
import os
import pathlib
import sys

import nbformat

from attnbook_classroom.course.folder import (COURSE_ID, DEFAULT_ROOT, api, due_dates, ensure_secret, make_private,
                                              private_files, roster, use_venv_bin, write_config)
from attnbook_classroom.course.notebooks import check_exercise_notebook, exercise_notebook
from bookbuild.notebooks import exercise_section, toc_chapters

__all__ = ["build_assignments", "nbgrader_failed", "prepare_exchange"]


def nbgrader_failed(result: dict, what: str) -> str | None:
    """None when an NbGraderAPI call succeeded, else what went wrong (the end of its log)."""
    if result.get("success"):
        return None
    log = (result.get("log", "") + "\n" + result.get("error", "")).strip()
    return f"nbgrader failed: {what}\n{log[-2000:]}"


def _exercises(path: pathlib.Path) -> nbformat.NotebookNode | None:
    """A chapter's exercise notebook; a notebook without a section but with nbgrader cells is one already."""
    if exercise_section(path):
        return exercise_notebook(path)
    raw = json.loads(pathlib.Path(path).read_text())
    for index, cell in enumerate(raw.get("cells", [])):
        cell.setdefault("id", f"cell-{index}")  # fixed ids: a notebook made again is the same notebook
    raw["nbformat_minor"] = max(raw.get("nbformat_minor", 5), 5)
    nb = nbformat.from_dict(raw)
    return nb if any("nbgrader" in c.get("metadata", {}) for c in nb.cells) else None


def prepare_exchange(exchange: pathlib.Path) -> None:
    """nbgrader's exchange for the course, when it is ours to make: the root (every student can
    write there; the sticky bit keeps each one's entries theirs), and the course's ``outbound``
    (readable by all), ``inbound`` (students can add a folder, not list nor, with the sticky bit,
    remove or rename another's) and ``feedback`` (reachable by a name only its student knows)."""
    if not exchange.exists():
        exchange.mkdir(parents=True)
        exchange.chmod(0o1777)
    if exchange.stat().st_uid != os.geteuid():
        return  # an exchange set up by the server's administrator
    course = exchange / COURSE_ID
    for folder, mode in ((course, 0o755), (course / "outbound", 0o755), (course / "inbound", 0o1733),
                         (course / "feedback", 0o711)):
        if not folder.exists():
            folder.mkdir()
        if folder.stat().st_uid == os.geteuid() and not folder.is_symlink():
            folder.chmod(mode)


def build_assignments(root: pathlib.Path = DEFAULT_ROOT, notebooks: list[pathlib.Path] | None = None,
                      exchange: pathlib.Path | None = None) -> list[pathlib.Path]:
    """Set the course up in ``root`` (readable by you only) and release the exercise notebook of
    every chapter.

    Returns the released notebooks (``root/release/<chapter>/<chapter>.ipynb``)."""
    use_venv_bin()
    root = pathlib.Path(root).resolve()
    exchange = pathlib.Path(exchange or root.parent / "exchange").resolve()
    make_private(root)
    prepare_exchange(exchange)
    with private_files():
        return _build(root, notebooks, exchange)


def _build(root, notebooks, exchange):
    from nbgrader.api import Gradebook

    write_config(root, exchange)
    ensure_secret(root)
    from attnbook_classroom.course.guide import write_instructor_folder

    # The discussion questions' model answers: for the instructor, outside source/ and release/.
    print(f"wrote {write_instructor_folder(root).relative_to(root)} (the discussion questions, with model answers)")
    nbgrader = api(root)
    dates, students = due_dates(root), roster(root)
    released = []
    for path in [pathlib.Path(n).resolve() for n in (notebooks or toc_chapters())]:
        name = path.stem
        nb = _exercises(path)
        if nb is None:
            print(f"note: {path.name} has no exercises; not released")
            continue
        check_exercise_notebook(nb, path.name)
        source = root / "source" / name
        source.mkdir(parents=True, exist_ok=True)
        text, path_ = nbformat.writes(nb), source / f"{name}.ipynb"
        for old in source.glob("*.ipynb"):
            if old != path_:
                old.unlink()
        if not path_.exists() or path_.read_text() != text:  # unchanged: nothing to grade again
            path_.write_text(text)
        error = nbgrader_failed(nbgrader.generate_assignment(name, force=True), f"generate_assignment {name}")
        if error:
            sys.stderr.write(error + "\n")
            raise SystemExit(f"nbgrader failed: generate_assignment {name}")
        released.append(root / "release" / name / f"{name}.ipynb")
        print(f"released {released[-1].relative_to(root)}")
    with Gradebook(f"sqlite:///{root / 'gradebook.db'}", course_id=COURSE_ID) as gradebook:
        for name, date in dates.items():
            gradebook.update_or_create_assignment(name, duedate=date)
        for student in students or []:
            fields = {k: student[k] for k in ("first_name", "last_name", "email") if student.get(k)}
            gradebook.update_or_create_student(student["id"], **fields)
    return released

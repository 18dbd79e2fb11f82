"""The gradebook's side of ``make grade`` (:mod:`attnbook_classroom.course.grade`): the assignments
handed out, nbgrader's gradebook kept in step with the roster and the due dates, and the exports:
``grades.csv`` (every roster student x every released assignment, with a status) and
``grades-lms.csv`` (for Canvas and Moodle).
"""

from __future__ import annotations

import csv
import os
import pathlib

from attnbook_classroom.course.folder import COURSE_ID, config, due_dates, load_state, roster

__all__ = ["export_csv", "released_assignments", "sync_gradebook"]

COLUMNS = ["student_id", "last_name", "first_name", "email", "assignment", "status", "score", "max_score",
           "timestamp", "duedate", "seconds_late", "needs_manual_grade", "note"]


def released_assignments(root: pathlib.Path) -> list[str]:
    """The assignments handed out: released through the exchange (``make release``), given a due
    date in ``due_dates.csv``, or handed in by someone (placed in ``submitted/`` by hand, say)."""
    root = pathlib.Path(root)
    generated = sorted(p.name for p in (root / "source").iterdir() if p.is_dir()) if (root / "source").is_dir() else []
    exchange = config(root).Exchange.get("root")
    outbound = pathlib.Path(exchange) / COURSE_ID / "outbound" if exchange else None
    submitted = root / "submitted"
    handed = {p.name for s in submitted.iterdir() if not s.name.startswith(".") and s.is_dir()
              and not s.is_symlink() for p in s.iterdir()} if submitted.is_dir() else set()
    dates = due_dates(root)
    return [name for name in generated if name in dates or name in handed
            or (outbound is not None and (outbound / name).is_dir())]


def sync_gradebook(root: pathlib.Path) -> None:
    """Put the roster (``students.csv``) and the due dates (``due_dates.csv``) in the gradebook as
    they are now: no notebook is generated again, no submission graded again."""
    from nbgrader.api import Gradebook, MissingEntry

    with Gradebook(f"sqlite:///{pathlib.Path(root) / 'gradebook.db'}", course_id=COURSE_ID) as gb:
        for name, date in due_dates(root).items():
            try:
                gb.find_assignment(name)
            except MissingEntry:
                continue
            gb.update_or_create_assignment(name, duedate=date)
        for student in roster(root) or []:
            fields = {k: student[k] for k in ("first_name", "last_name", "email") if student.get(k)}
            gb.update_or_create_student(student["id"], **fields)


LMS_COLUMNS = ["Student", "ID", "SIS User ID", "SIS Login ID", "Section"]


def export_csv(root: pathlib.Path, state: dict | None = None, csv_path: pathlib.Path | None = None) -> pathlib.Path:
    """Write ``grades.csv`` (every roster student x every released assignment, with a status) and
    ``grades-lms.csv`` (one row per student, one column per released assignment, for Canvas and
    Moodle)."""
    from nbgrader.api import Gradebook, MissingEntry

    root = pathlib.Path(root)
    state = load_state(root) if state is None else state
    csv_path = csv_path or root / "grades.csv"
    sync_gradebook(root)
    people = roster(root)
    released = released_assignments(root)
    with Gradebook(f"sqlite:///{root / 'gradebook.db'}", course_id=COURSE_ID) as gb:
        if people is None:
            folders = sorted(p.name for p in (root / "submitted").iterdir() if not p.name.startswith(".")) \
                if (root / "submitted").is_dir() else []
            people = [{"id": s} for s in folders]
        rows = []
        for assignment in sorted((a for a in gb.assignments if a.name in released), key=lambda a: a.name):
            for person in people:
                sid, entry = person["id"], state.get(f"{person['id']}/{assignment.name}", {})
                row = {"student_id": sid, "last_name": person.get("last_name", ""),
                       "first_name": person.get("first_name", ""), "email": person.get("email", ""),
                       "assignment": assignment.name, "max_score": f"{assignment.max_score:g}",
                       "duedate": assignment.duedate or "", "note": entry.get("note", "")}
                try:
                    sub = gb.find_submission(assignment.name, sid)
                except MissingEntry:
                    sub = None
                present = os.path.lexists(root / "submitted" / sid / assignment.name) or \
                    os.path.islink(root / "submitted" / sid)
                if not present:
                    row.update(status="missing", score="", timestamp="", seconds_late="", needs_manual_grade="")
                elif sub is None or entry.get("status") == "error":  # never an older score
                    row.update(status="error", score="", timestamp="", seconds_late="", needs_manual_grade="",
                               note=entry.get("note") or "not in the gradebook: run make grade")
                else:
                    row.update(status=entry.get("status", "graded"), score=f"{sub.score:g}",
                               timestamp=sub.timestamp or "", seconds_late=f"{sub.total_seconds_late:g}",
                               needs_manual_grade=str(bool(sub.needs_manual_grade)))
                rows.append(row)
    with open(csv_path, "w", newline="") as f:
        writer = csv.DictWriter(f, COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    _export_lms(root, people, released, rows)
    return csv_path


def _export_lms(root: pathlib.Path, people: list[dict], released: list[str], rows: list[dict]) -> None:
    """``grades-lms.csv``: Canvas's gradebook columns (Student, ID, SIS User ID, SIS Login ID,
    Section), then one column per released assignment holding the score (empty when missing or not
    graded). The student id is the SIS user and login id; Moodle maps it as the username."""
    scores = {(r["student_id"], r["assignment"]): r["score"] for r in rows}
    with open(root / "grades-lms.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(LMS_COLUMNS + released)
        for person in people:
            name = ", ".join(n for n in (person.get("last_name", ""), person.get("first_name", "")) if n) or person["id"]
            writer.writerow([name, "", person["id"], person["id"], ""]
                            + [scores.get((person["id"], a), "") for a in released])

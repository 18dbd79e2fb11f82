"""``make grade``: grade every new or changed submission, write ``grades.csv`` and a summary.

1. Each submission folder ``submitted/<student>/<assignment>/`` is fingerprinted (its files, the
   assignment's source, the grader's code); those already graded with the same fingerprint are
   skipped (``force`` regrades them; ``students`` / ``assignments`` restrict the run).
2. One sandbox per student (:func:`attnbook_classroom.grading.submission.grade_in_sandbox`), several students
   at a time in worker processes, computes the verdicts of that student's submissions (the
   comparisons run in the worker, outside the sandbox); they are cached by content.
3. The same worker then has nbgrader's own ``autograde`` record them (its ``SandboxedGrading``
   step finds the cached verdicts) and ``generate_feedback`` write the feedback pages; workers
   that meet the gradebook locked by another retry.
4. ``grades.csv`` lists every student of the roster (``students.csv``, or the folders in
   ``submitted/``) for every released assignment, with a status: ``graded``, ``missing`` (no
   submission) or ``error`` (it could not be graded: why is in ``note``). ``summary.txt`` lists what
   failed and why. Nothing one submission does stops the others from being graded.
"""

from __future__ import annotations

import csv
import datetime
import functools
import hashlib
import json
import os
import pathlib
import time
import traceback
import warnings
import multiprocessing
from concurrent.futures import ProcessPoolExecutor, as_completed

import nbformat

from attnbook_classroom.course.assign import nbgrader_failed
from attnbook_classroom.course.folder import (DEFAULT_ROOT, api, due_dates, limits, link_problem, load_state,
                                              private_files, read_secret, roster, save_state, use_venv_bin,
                                              verdict_cache)
from attnbook_classroom.course.exchange import load_refused
from attnbook_classroom.course.gradebook import export_csv, sync_gradebook
from attnbook_classroom.course.stage import STAGED, Unreadable, stage

__all__ = ["grade"]


def _fingerprint(folder: pathlib.Path, source: pathlib.Path, duedate: str = "") -> str:
    """A digest of what a grade depends on: the submission's files, what grades in the assignment's
    source (each cell's type, source and grading marks, not its id) and its due date, and the grader."""
    from attnbook_classroom.grading.submission import grader_version

    h = hashlib.sha256(grader_version().encode() + b"\0" + duedate.encode())
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        h.update(str(path.relative_to(path.parents[1])).encode() + b"\0")
        with open(path, "rb") as f:  # in chunks: a bloated notebook is not held in memory
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    for path in sorted(source.glob("*.ipynb")):
        h.update(path.name.encode() + _graded_content(str(path), path.stat().st_mtime_ns))
    return h.hexdigest()


@functools.lru_cache(maxsize=64)
def _graded_content(path: str, mtime: int) -> bytes:
    nb = nbformat.read(path, as_version=4)
    return json.dumps([[c.cell_type, c.source, c.metadata.get("nbgrader", {}), c.metadata.get("tags", [])]
                       for c in nb.cells]).encode()


def _ensure_timestamp(folder: pathlib.Path) -> None:
    """A submission placed by hand (not through the exchange) gets its notebook's modification
    time as its timestamp, so that due dates apply and nbgrader can hand feedback back."""
    stamp = folder / "timestamp.txt"
    notebooks = list(folder.glob("*.ipynb"))
    if not stamp.exists() and notebooks:
        when = max(p.stat().st_mtime for p in notebooks)
        stamp.write_text(datetime.datetime.fromtimestamp(when, datetime.timezone.utc)
                         .strftime("%Y-%m-%d %H:%M:%S.%f UTC"))


_ENGINES: dict[tuple, object] = {}


def _one_engine_per_gradebook() -> None:
    """Make nbgrader reuse one SQLAlchemy engine per database in this process.

    nbgrader opens a gradebook several times for every notebook it records, and each time creates
    a new engine, whose empty statement cache makes SQLAlchemy compile every query again (a third
    of the time of recording a notebook, measured). The shared engine changes nothing else: nbgrader
    still opens and disposes of its connections around each use, so the gradebook file is locked
    as briefly as before."""
    import nbgrader.api
    import sqlalchemy

    if getattr(nbgrader.api.create_engine, "shares_engines", False):
        return

    def create_engine(url, **kwargs):
        key = (os.getpid(), str(url), tuple(sorted(kwargs.items())))
        if key not in _ENGINES:
            _ENGINES[key] = sqlalchemy.create_engine(url, **kwargs)
        return _ENGINES[key]

    create_engine.shares_engines = True
    nbgrader.api.create_engine = create_engine


def _start_worker() -> None:
    """A grading worker computes its references on one thread: the workers already use every core,
    and torch's extra threads, on a core another worker holds, spin while they wait for it (measured
    on 2 cores: 14-21 s of CPU for some students' references with torch's default threads, under
    1.3 s for every student with one)."""
    import torch

    torch.set_num_threads(1)
    _one_engine_per_gradebook()


def _grade_student(root, student, assignments, feedback) -> dict[str, dict]:
    """Stage, then the verdicts of one student's submissions, then nbgrader's records:
    assignment -> state entry (``status``, ``note``, ``stopped``, ``seconds``: the wall time its
    notebooks ran in the sandbox and nbgrader took to record it, and the student's whole grading)."""
    started = time.monotonic()
    settings = limits(root)
    problems, notes = {}, {}
    for assignment in assignments:
        try:
            notes[assignment] = stage(root / "submitted" / student / assignment, root / "source" / assignment,
                                      root / "release" / assignment, root / STAGED / student / assignment,
                                      max_bytes=settings.notebook_bytes, max_cells=settings.cells)
        except Unreadable as exc:
            problems[assignment] = f"not graded: {exc}"
        except Exception as exc:
            problems[assignment] = f"not graded: the submission could not be read ({type(exc).__name__}: {exc})"
    gradable = [a for a in assignments if a not in problems]
    ran: dict[str, float] = {}
    failed, stopped = _prepare_student(root, student, gradable, settings, ran)
    nbgrader = api(root, staged=True)
    entries = {}
    for assignment in assignments:
        if assignment in problems:
            entries[assignment] = {"status": "error", "note": problems[assignment], "stopped": []}
            continue
        start = time.monotonic()
        entry = _record(nbgrader, root, student, assignment, feedback, failed.get(assignment) or failed.get("*"))
        entry["note"] = " ".join([entry.get("note", "")] + notes.get(assignment, [])).strip()
        entry["stopped"] = stopped.get(assignment, [])
        entry["seconds"] = {"sandbox": round(ran.get(assignment, 0.0), 2),
                            "record": round(time.monotonic() - start, 2)}
        entries[assignment] = entry
    whole = round(time.monotonic() - started, 2)
    for entry in entries.values():
        entry.setdefault("seconds", {}).update(student=whole, sandbox_start=round(ran.get("*", 0.0), 2))
    return entries


def _prepare_student(root, student, assignments, settings, ran=None):
    """Verdicts for one student's staged submissions (cached), in one sandbox, within the student's
    time budget. Never raises but SandboxUnavailable. Returns {assignment: a problem},
    {assignment: tests the student's code stopped}; adds to ``ran`` (assignment -> seconds) the wall
    time each assignment's notebooks took in the sandbox, and under ``"*"`` the sandbox's start."""
    ran = {} if ran is None else ran
    from attnbook_classroom.course.plugins import submission_for
    from attnbook_classroom.grading.sandbox import Sandbox, SandboxUnavailable

    cache, subs, problems, stopped = verdict_cache(root), [], {}, {}
    for assignment in assignments:
        for path in sorted((root / STAGED / student / assignment).glob("*.ipynb")):
            try:
                nb = nbformat.read(str(path), as_version=4)
                sub = submission_for(nb, root, student, assignment, path.stem, settings.cell, settings.notebook)
            except Exception as exc:  # a broken cell format, a missing source
                problems[assignment] = f"{path.name} could not be read: {type(exc).__name__}: {str(exc)[:300]}"
                continue
            cached = cache.get(sub.key())
            if cached is None:
                subs.append((assignment, sub))
            else:
                stopped.setdefault(assignment, []).extend(cached.failures())
    if subs:
        try:
            with Sandbox([root]) as sandbox:
                start = time.monotonic()
                sandbox.start()  # the grader's own time (importing torch): not the student's budget
                ran["*"] = time.monotonic() - start
                end = time.monotonic() + settings.student
                for assignment, sub in subs:
                    start = time.monotonic()
                    frames = sub.run(sandbox, budget=end - time.monotonic())
                    ran[assignment] = ran.get(assignment, 0.0) + time.monotonic() - start
                    verdicts = sub.judge(frames)
                    cache.put(sub.key(), verdicts)
                    stopped.setdefault(assignment, []).extend(verdicts.failures())
        except SandboxUnavailable:
            raise
        except Exception as exc:
            problems["*"] = f"the sandbox failed: {type(exc).__name__}: {exc}"
    return problems, stopped


def _submissions(submitted: pathlib.Path):
    """(student, assignment, folder, problem) for every submission folder, found without following
    a link: ``problem`` says why one is not graded (a link or a special file in it), else None."""
    for student_dir in sorted(submitted.iterdir()):
        if student_dir.name.startswith("."):
            continue
        problem = link_problem(student_dir, f"submitted/{student_dir.name}") if (
            student_dir.is_symlink() or not student_dir.is_dir()) else None
        if problem:
            yield student_dir.name, None, student_dir, problem
            continue
        for folder in sorted(student_dir.iterdir()):
            if folder.name.startswith("."):  # collection's staging folders
                continue
            yield (student_dir.name, folder.name, folder,
                   link_problem(folder, f"submitted/{student_dir.name}/{folder.name}"))


def grade(root: pathlib.Path = DEFAULT_ROOT, *, students: list[str] | None = None,
          assignments: list[str] | None = None, force: bool = False, feedback: bool = True,
          workers: int | None = None) -> pathlib.Path:
    """Grade new and changed submissions under ``root/submitted``; return the path of grades.csv.
    Nothing is followed: a submission that is, or holds, a symbolic link or a special file is not
    graded (status ``error``, with the reason)."""
    use_venv_bin()
    root = pathlib.Path(root).resolve()
    submitted = root / "submitted"
    from attnbook_classroom.grading.sandbox import SandboxUnavailable, check_available

    if submitted.is_symlink() or not submitted.is_dir():
        raise SystemExit(f"no submissions: put them in {submitted}/<student>/<assignment>/<assignment>.ipynb "
                         "(nbgrader collect does)")
    try:
        check_available([root])
    except SandboxUnavailable as exc:
        raise SystemExit(f"Not grading: {exc}") from None
    read_secret(root)  # a clear error now rather than one per submission
    with private_files():
        return _grade(root, submitted, students, assignments, force, feedback, workers)


def _grade(root, submitted, students, assignments, force, feedback, workers):
    from attnbook_classroom.grading.sandbox import SandboxUnavailable

    sync_gradebook(root)  # the roster and the due dates as they are now
    released = sorted(p.name for p in (root / "source").iterdir() if p.is_dir())
    names = {r["id"] for r in roster(root) or []}
    dates = due_dates(root)
    state, started = load_state(root), time.monotonic()
    todo: dict[str, list[str]] = {}
    skipped: list[str] = []
    for student, assignment, folder, problem in _submissions(submitted):
        if (students and student not in students) or (assignments and assignment and assignment not in assignments):
            continue
        if assignment is not None and assignment not in released:
            skipped.append(f"{student}/{assignment}: no such assignment in source/")
            continue
        if names and student not in names:
            skipped.append(f"{student}/{assignment or '*'}: {student} is not on the roster (students.csv)")
            continue
        if problem:
            for name in ([assignment] if assignment else released):
                state[f"{student}/{name}"] = {"fingerprint": None, "status": "error", "stopped": [],
                                              "note": f"not graded: {problem}"}
            continue
        _ensure_timestamp(folder)
        fingerprint = _fingerprint(folder, root / "source" / assignment, dates.get(assignment, ""))
        if force or state.get(f"{student}/{assignment}", {}).get("fingerprint") != fingerprint:
            todo.setdefault(student, []).append(assignment)
            state[f"{student}/{assignment}"] = {"fingerprint": fingerprint}
    count = sum(len(a) for a in todo.values())
    print(f"grading {count} new or changed submissions of {len(todo)} students")
    # Workers forked before any nbgrader work here inherit the imported torch (no second import).
    context = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn")
    with ProcessPoolExecutor(max_workers=workers or os.cpu_count() or 2, mp_context=context,
                             initializer=_start_worker) as pool:
        futures = {pool.submit(_grade_student, root, s, a, feedback): s for s, a in todo.items()}
        for future in as_completed(futures):
            student = futures[future]
            try:
                entries = future.result()
            except SandboxUnavailable as exc:
                raise SystemExit(f"Not grading: {exc}") from None
            except Exception as exc:
                where = _keep_log(root, student, "all", "grading", traceback.format_exc())
                note = f"grading failed: {type(exc).__name__}: {str(exc)[:200]} (the traceback: {where})"
                entries = {a: {"status": "error", "note": note, "stopped": []} for a in todo[student]}
            for assignment, entry in entries.items():
                state[f"{student}/{assignment}"].update(entry)
                print(f"graded {student}/{assignment}: {entry['status']}")
            save_state(root, state)
    save_state(root, state)
    csv_path = export_csv(root, state)
    _summary(root, state, skipped, count, time.monotonic() - started)
    return csv_path


def _record(nbgrader, root, student, assignment, feedback, problem) -> dict:
    """Autograde (from the cached verdicts) and write feedback; the state entry's status."""
    if problem:
        return {"status": "error", "note": problem}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*not in session.*")  # SQLAlchemy, inside nbgrader
        return _autograde(nbgrader, root, student, assignment, feedback)


def _retrying(call, what: str) -> tuple[str | None, str]:
    """Run an NbGraderAPI call; retry while another worker holds the gradebook's lock. Returns
    (what failed or None, nbgrader's whole log)."""
    for attempt in range(8):
        result = call()
        error = nbgrader_failed(result, what)
        if error is None or "database is locked" not in error:
            return error, (result.get("log", "") + "\n" + result.get("error", "")).strip()
        time.sleep(0.2 * (attempt + 1))
    return error, (result.get("log", "") + "\n" + result.get("error", "")).strip()


def _keep_log(root, student, assignment, what: str, log: str) -> str:
    """Write nbgrader's log where the instructor finds it; return its path, relative to ``root``."""
    path = root / ".grading" / "logs" / student / f"{assignment}.{what}.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(log + "\n")
    return str(path.relative_to(root))


def _autograde(nbgrader, root, student, assignment, feedback) -> dict:
    error, log = _retrying(lambda: nbgrader.autograde(assignment, student, force=True), "autograde")
    if error:
        where = _keep_log(root, student, assignment, "autograde", log)
        last = next((line for line in reversed(error.splitlines()) if line.strip()), "")
        return {"status": "error", "note": f"nbgrader's autograde failed: {last[:300]} (its log: {where})"}
    if feedback:
        error, log = _retrying(lambda: nbgrader.generate_feedback(assignment, student, force=True),
                               "generate_feedback")
        if error:
            where = _keep_log(root, student, assignment, "feedback", log)
            return {"status": "graded", "note": f"no feedback page: nbgrader's generate_feedback failed (its log: {where})"}
    return {"status": "graded", "note": ""}


def _summary(root: pathlib.Path, state: dict, skipped: list[str], count: int, seconds: float) -> None:
    with open(root / "grades.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    lines = [f"Graded {count} new or changed submissions in {seconds:.0f} s; grades.csv has {len(rows)} rows."]
    sections = [
        ("Could not be graded (status error)", [f"{r['student_id']}/{r['assignment']}: {r['note']}"
                                                 for r in rows if r["status"] == "error"]),
        ("Tests stopped by the student's code (timeouts, crashes)",
         [f"{key}: {m}" for key, e in sorted(state.items()) for m in e.get("stopped", [])]),
        ("Not graded", skipped),
        ("Refused when collected (nothing of these folders was copied)",
         [f"{r['student']}/{r['assignment']}: {r['folder']}: {r['reason']}" for r in load_refused(root)]),
        ("Missing (no submission)", [f"{r['student_id']}/{r['assignment']}" for r in rows if r["status"] == "missing"]),
        ("Late", [f"{r['student_id']}/{r['assignment']}: {float(r['seconds_late']):.0f} s late"
                  for r in rows if r["seconds_late"] not in ("", "0")]),
        ("Waiting for manual grading (formgrader)",
         [f"{r['student_id']}/{r['assignment']}" for r in rows if r["needs_manual_grade"] == "True"]),
    ]
    for title, items in sections:
        lines += [f"\n{title}: {len(items)}"] + [f"  {item}" for item in items]
    text = "\n".join(lines) + "\n"
    (root / "summary.txt").write_text(text)
    print(text)

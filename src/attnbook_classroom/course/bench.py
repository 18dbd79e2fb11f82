"""``make grade-bench``: the time to grade a class of every chapter, and what a hostile student costs it.

    python -m attnbook_classroom.course.bench [--students 100] [--hostile 10] [--chapters NAME ...]
        [--root _build/grade-bench] [--workers N] [--record] [--table]

Releases every chapter's exercise notebook into a fresh course (or only the chapters named), then
grades two classes with ``make grade``'s own code (:func:`attnbook_classroom.course.grade.grade`:
nbgrader's autograde of the released assignments, each student's code in the bubblewrap sandbox),
each student handing in every chapter:

- the **honest** class (``--students``): most students answer with the instructor's solutions, every
  tenth hands the notebook in unanswered, every fifth leaves one exercise unfinished (its solution
  raises). Every score must be exactly right: full marks, zero, or full marks less the points of the
  unfinished exercise's test cells (the exercise is picked among those no other cell uses, so that
  nothing else can fail with it).
- the **hostile** class (``--hostile``), whose students use up their limits, one kind each in turn
  (:data:`HOSTILE`): an endless loop in every cell or in every answer, a sleep in every cell or in
  every answer, memory taken up to the limit in every cell, results far over the size the grader
  accepts, processes started (a fork bomb, a shell, ``subprocess``), threads that compute on every
  core, output without end, and notebooks too big to read. None may get full marks, each must show
  its own failure in its feedback, and none may cost the class more than its own limits: each
  notebook at most ``notebook_timeout`` + :data:`NOTEBOOK_OVERHEAD` seconds in the sandbox, each
  student at most ``student_timeout`` + :data:`STUDENT_OVERHEAD` seconds in all (the sandbox's start
  and nbgrader's recording of every notebook included).

The times (each class's wall time, each submission's and each student's, the machine's cores and
its load average sampled while grading: it may be shared) are printed and written to
``ROOT/result.json``; the run fails when a check does not hold. With ``--record`` the result is also
written to ``data/grade_bench.json`` (listed in ``data/manifest.json``), from which the instructors'
page shows :func:`table` (checked by tests/classroom/test_instructors.py); ``--table`` prints that table from
the recorded file.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import pathlib
import platform
import shutil
import statistics
import threading
import time

from attnbook_tools.datafiles import DATA_DIR, record, verified
from attnbook_classroom.course.assign import build_assignments
from attnbook_classroom.course.bench_class import HOSTILE, class_kinds, simulate
from attnbook_classroom.course.folder import REPO, Limits, limits, load_state
from attnbook_classroom.course.grade import grade

RECORD = DATA_DIR / "grade_bench.json"
TARGET_MINUTES = 10  # the honest class of 100 students x every chapter, on 2 cores
NOTEBOOK_OVERHEAD = 15.0  # seconds a notebook may take beyond notebook_timeout (a sandbox's start, nbgrader)
STUDENT_OVERHEAD = 60.0  # seconds a student may take beyond student_timeout (staging, nbgrader for each notebook)


def _cpu_name() -> str:
    """The CPU's model name (Linux), or the platform's processor string."""
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _feedback_text(course: pathlib.Path, student: str, chapter: str) -> str:
    path = course / "autograded" / student / chapter / f"{chapter}.ipynb"
    return path.read_text(errors="replace") if path.exists() else ""


def verify(course: pathlib.Path, roster: dict[str, dict], settings: Limits) -> list[str]:
    """What is wrong with the grades and the times of a graded class (empty: nothing)."""
    with open(course / "grades.csv") as f:
        rows = {(r["student_id"], r["assignment"]): r for r in csv.DictReader(f)}
    state, problems = load_state(course), []
    for student, info in roster.items():
        kind, shown = info["kind"], False
        for chapter, expected in info["expected"].items():
            row = rows.get((student, chapter))
            if row is None:
                problems.append(f"{student}/{chapter}: no row in grades.csv")
                continue
            seconds = state.get(f"{student}/{chapter}", {}).get("seconds", {})
            if kind == "bloat":
                if row["status"] != "error" or row["score"] != "" or HOSTILE["bloat"][1] not in row["note"]:
                    problems.append(f"{student}/{chapter} ({kind}): a bloated notebook was read: {row}")
                shown = True
                continue
            if row["status"] != "graded":
                problems.append(f"{student}/{chapter} ({kind}): not graded: {row['note']}")
                continue
            score, full = float(row["score"]), float(row["max_score"])
            if expected is None:
                if score >= full:
                    problems.append(f"{student}/{chapter} ({kind}): full marks for a hostile submission")
                shown = shown or HOSTILE[kind][1] in _feedback_text(course, student, chapter)
                if seconds.get("sandbox", 0.0) > settings.notebook + NOTEBOOK_OVERHEAD:
                    problems.append(f"{student}/{chapter} ({kind}): {seconds['sandbox']} s in the sandbox, over "
                                    f"its {settings.notebook:g} s + {NOTEBOOK_OVERHEAD:g} s")
            elif abs(score - expected) > 1e-9:
                problems.append(f"{student}/{chapter} ({kind}): scored {score:g}; expected {expected:g} of {full:g}")
        if kind in HOSTILE and not shown:
            problems.append(f"{student} ({kind}): no feedback names it ({HOSTILE[kind][1]!r})")
        whole = max((state.get(f"{student}/{c}", {}).get("seconds", {}).get("student", 0.0) for c in info["expected"]),
                    default=0.0)
        if kind in HOSTILE and whole > settings.student + STUDENT_OVERHEAD:
            problems.append(f"{student} ({kind}): {whole} s in all, over {settings.student:g} s + {STUDENT_OVERHEAD:g} s")
    return problems


def _clear(course: pathlib.Path) -> None:
    """No submission, grade, feedback or cached verdict left (the gradebook's records are graded again)."""
    for name in ("submitted", "autograded", "feedback", ".grading"):
        shutil.rmtree(course / name, ignore_errors=True)
    for name in ("grades.csv", "grades-lms.csv", "summary.txt"):
        (course / name).unlink(missing_ok=True)


class _Load:
    """The 1-minute load average, sampled every 5 s while a class is graded."""

    def __init__(self):
        self.samples, self._stop = [], threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while True:
            self.samples.append(os.getloadavg()[0])
            if self._stop.wait(5.0):
                return

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def _spread(values: list[float]) -> dict:
    values = sorted(values)
    return {"median": round(statistics.median(values), 2), "max": round(values[-1], 2)} if values else {}


def run_class(course: pathlib.Path, kinds: list[str], workers: int | None = None) -> dict:
    """Grade a class of students of ``kinds`` (see :func:`simulate`) with ``make grade``'s code; its
    times and what :func:`verify` found."""
    _clear(course)
    students = len(kinds)
    roster = simulate(course, kinds)
    chapters = len(next(iter(roster.values()))["expected"])
    with _Load() as load:
        start = time.monotonic()
        grade(course, workers=workers)
        seconds = time.monotonic() - start
    settings = limits(course)
    problems = verify(course, roster, settings)
    state = load_state(course)
    entries = [(s, c, state.get(f"{s}/{c}", {})) for s, info in roster.items() for c in info["expected"]]
    per_student = {s: max((e.get("seconds", {}).get("student", 0.0) for t, _, e in entries if t == s), default=0.0)
                   for s in roster}
    kinds = sorted({info["kind"] for info in roster.values()}, key=lambda k: (k not in HOSTILE, k))
    result = {
        "students": students, "chapters": chapters, "notebooks": students * chapters,
        "workers": workers or os.cpu_count(), "grade_seconds": round(seconds, 1),
        "seconds_per_notebook": round(seconds / (students * chapters), 3),
        "load_average": {"mean": round(statistics.fmean(load.samples), 1), "max": round(max(load.samples), 1)},
        "notebook_seconds": _spread([e.get("seconds", {}).get("sandbox", 0.0) + e.get("seconds", {}).get("record", 0.0)
                                     for _, _, e in entries]),
        "student_seconds": _spread(list(per_student.values())),
        "sandbox_start_seconds": _spread([max(e.get("seconds", {}).get("sandbox_start", 0.0)
                                              for t, _, e in entries if t == s) for s in roster]),
        # where the grading workers' time went, summed over the class: starting sandboxes, running
        # notebooks in them, and nbgrader's autograde and feedback; the rest of each student's time
        # is staging and the grader's comparisons with the references
        "seconds_in": {"sandbox_start": round(sum(max(e.get("seconds", {}).get("sandbox_start", 0.0)
                                                      for t, _, e in entries if t == s) for s in roster), 1),
                       "sandbox": round(sum(e.get("seconds", {}).get("sandbox", 0.0) for _, _, e in entries), 1),
                       "record": round(sum(e.get("seconds", {}).get("record", 0.0) for _, _, e in entries), 1),
                       "students": round(sum(per_student.values()), 1)},
        "kinds": {k: {"students": sum(i["kind"] == k for i in roster.values()),
                      "student_seconds_max": round(max(per_student[s] for s, i in roster.items() if i["kind"] == k), 1),
                      "notebook_sandbox_seconds_max": round(max(e.get("seconds", {}).get("sandbox", 0.0)
                                                                for s, _, e in entries if roster[s]["kind"] == k), 1)}
                  for k in kinds},
        "problems": problems,
    }
    return result


def table(result: dict) -> str:
    """The classroom appendix's table of a recorded run (markdown), and the sentence that dates it."""
    if not {"honest", "hostile", "limits"} <= set(result) or "kinds" not in result["hostile"]:
        raise ValueError(f"result: got a record with {sorted(result)}; expected one written by this version of "
                         "`make grade-bench RECORD=1` (honest and hostile classes, limits, each hostile kind): run it again")
    honest, hostile, lim = result["honest"], result["hostile"], result["limits"]
    lines = [
        f"Measured on {result['date']} with {result['cores']} cores ({result['cpu']}, PyTorch {result['torch']}), "
        f"one grading worker per core. The machine may have been shared with other work: its load average, "
        f"sampled every 5 s while each class was graded, is in the table (grading itself accounts for "
        f"about {result['cores']} of it; the rest is other work that competed for the same cores).",
        "",
        "| class | students × chapters | graded in | a notebook (median, slowest) | a student (median, slowest) | load average (mean, max) |",
        "|---|---|---|---|---|---|",
    ]
    for name, r in (("honest", honest), ("hostile", hostile)):
        lines.append(
            f"| {name} | {r['students']} × {r['chapters']} | {r['grade_seconds'] / 60:.1f} min | "
            f"{r['notebook_seconds']['median']:.2f} s, {r['notebook_seconds']['max']:.1f} s | "
            f"{r['student_seconds']['median']:.1f} s, {r['student_seconds']['max']:.1f} s | "
            f"{r['load_average']['mean']:.1f}, {r['load_average']['max']:.1f} |")
    lines += [
        "",
        f"What each hostile student cost, against their limits ({lim['notebook']:g} s a notebook in the sandbox, "
        f"{lim['student']:g} s a student; the bench allows {NOTEBOOK_OVERHEAD:g} s and {STUDENT_OVERHEAD:g} s more "
        "for starting the sandbox and nbgrader's recording):",
        "",
        "| hostile student | students | slowest notebook in the sandbox | slowest student in all |",
        "|---|---|---|---|",
    ]
    for kind, k in hostile["kinds"].items():
        lines.append(f"| {HOSTILE[kind][0]} | {k['students']} | {k['notebook_sandbox_seconds_max']:.1f} s | "
                     f"{k['student_seconds_max']:.1f} s |")
    verdict = "within" if honest["grade_seconds"] <= TARGET_MINUTES * 60 else "over"
    lines += ["", f"The honest class took {honest['grade_seconds'] / 60:.1f} minutes: {verdict} the book's target of "
                  f"{TARGET_MINUTES} minutes for {honest['students']} students × every chapter on 2 cores."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m attnbook_classroom.course.bench",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--students", type=int, default=100, help="the honest class's size")
    parser.add_argument("--hostile", type=int, default=len(HOSTILE), help="the hostile class's size")
    parser.add_argument("--chapters", nargs="*", default=None, help="only these chapters (file stems)")
    parser.add_argument("--root", type=pathlib.Path, default=REPO / "_build" / "grade-bench")
    parser.add_argument("--workers", type=int, default=None)
    parser.add_argument("--limits", type=float, nargs=3, metavar=("CELL", "NOTEBOOK", "STUDENT"), default=None,
                        help="grade with these time limits (seconds) instead of the course's (a quick trial)")
    parser.add_argument("--record", action="store_true",
                        help=f"also write the result to {RECORD.relative_to(REPO)} (the classroom appendix's table)")
    parser.add_argument("--table", action="store_true", help=f"print the page's table from {RECORD.relative_to(REPO)}")
    args = parser.parse_args(argv)
    if args.table:
        print(table(json.loads(verified(RECORD).read_text())), end="")
        return
    if args.students < 1 or args.hostile < 0:
        raise SystemExit(f"--students must be at least 1 and --hostile at least 0; got {args.students} and {args.hostile}")
    root = args.root.resolve()
    shutil.rmtree(root, ignore_errors=True)
    course = root / "course"
    notebooks = None
    if args.chapters:
        from bookbuild.notebooks import toc_chapters

        notebooks = [p for p in toc_chapters() if p.stem in args.chapters]
        if len(notebooks) != len(set(args.chapters)):
            raise SystemExit(f"--chapters: got {args.chapters}; expected chapter file stems such as 07_masking")
    start = time.monotonic()
    build_assignments(course, notebooks=notebooks, exchange=root / "exchange")
    built = round(time.monotonic() - start, 1)
    if args.limits:
        cell, notebook, student = args.limits
        (course / "nbgrader_config_local.py").write_text(
            f"c.SandboxedGrading.cell_timeout = {cell}\nc.SandboxedGrading.notebook_timeout = {notebook}\n"
            f"c.SandboxedGrading.student_timeout = {student}\n")
    lim = limits(course)
    result = {}
    result.update(build_seconds=built, cores=os.cpu_count(), machine=platform.machine(), cpu=_cpu_name(),
                  torch=__import__("torch").__version__, date=time.strftime("%Y-%m-%d", time.gmtime()),
                  limits={"cell": lim.cell, "notebook": lim.notebook, "student": lim.student},
                  overheads={"notebook": NOTEBOOK_OVERHEAD, "student": STUDENT_OVERHEAD})
    # the hostile class first: each class's result is written as soon as it is graded
    for name, kinds in (("hostile", class_kinds(args.hostile, True)), ("honest", class_kinds(args.students, False))):
        if kinds:
            result[name] = run_class(course, kinds, args.workers)
            (root / "result.json").write_text(json.dumps(result, indent=1))
    result = {name: result[name] for name in ("honest", "hostile") if name in result} | {
        k: v for k, v in result.items() if k not in ("honest", "hostile")}
    (root / "result.json").write_text(json.dumps(result, indent=1))
    for name in ("honest", "hostile"):
        if name not in result:
            continue
        r = result[name]
        print(f"grade-bench, {name} class: {r['notebooks']} notebooks ({r['students']} students x {r['chapters']} "
              f"chapters) graded in {r['grade_seconds'] / 60:.1f} min with {r['workers']} workers on "
              f"{os.cpu_count()} cores ({r['seconds_per_notebook']} s a notebook; load average {r['load_average']})")
        for kind, k in r["kinds"].items():
            print(f"  {kind}: {k['students']} students, slowest {k['student_seconds_max']} s, "
                  f"slowest notebook in the sandbox {k['notebook_sandbox_seconds_max']} s")
    print(f"The assignments took {result['build_seconds']:.0f} s to build. {root / 'result.json'}")
    problems = [p for name in ("honest", "hostile") for p in result.get(name, {}).get("problems", [])]
    if problems:
        raise SystemExit("grade-bench found problems:\n  " + "\n  ".join(problems[:50]))
    if args.record:
        if "hostile" not in result or args.chapters or args.limits:
            raise SystemExit("--record needs every chapter, a hostile class and the course's own limits")
        RECORD.write_text(json.dumps(result, indent=1) + "\n")
        record([RECORD])
        print(f"recorded {RECORD.relative_to(REPO)}")


if __name__ == "__main__":
    main()

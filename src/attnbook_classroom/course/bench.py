"""``make grade-bench``: the time to grade a simulated class of every chapter.

    python -m attnbook_classroom.course.bench [--students 100] [--root _build/grade-bench] [--workers N] [--record]

Releases every chapter's exercise notebook into a fresh course, then submits for each student
every chapter: most answer with the instructor's solutions, some hand in the notebook unanswered,
some get one exercise wrong, and a few are hostile (a cell that ends the process, a function that
never returns, one that reads the course folder and patches the grader). ``make grade`` then grades
them all; the time of that run, the number of notebooks and the machine's cores are printed and
written to ``ROOT/result.json``. The run fails if a correct submission does not get full marks, a
wrong or hostile one does, or ``grades.csv`` misses a row. With ``--record`` the result is also
written to ``data/grade_bench.json`` (listed in ``data/manifest.json``): the measurement the
instructors' page reports, and tests/test_instructors.py checks that the page says what it holds.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import pathlib
import platform
import random
import re
import shutil
import time

import nbformat
import torch

from attnbook_tools.datafiles import DATA_DIR, record
from attnbook_classroom.course.assign import build_assignments
from attnbook_classroom.course.folder import REPO
from attnbook_classroom.course.grade import grade

RECORD = DATA_DIR / "grade_bench.json"


def _cpu_name() -> str:
    """The CPU's model name (Linux), or the platform's processor string."""
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


HOSTILE = {
    "exit": "import os\nos._exit(1)",
    "loop": "while True:\n    pass",
    "snoop": "import attnbook_classroom.grading.compare as c\nc.same = lambda *a, **k: True\n"
             "open('/etc/../{course}/course_secret').read()",
}


def _replace_solution(source: str, body: str) -> str:
    """``source`` with its solution region replaced by ``body`` (indented like the region)."""
    match = re.search(r"^([ \t]*)### BEGIN SOLUTION\n.*?^[ \t]*### END SOLUTION", source, re.S | re.M)
    indent = match.group(1)
    return source[:match.start()] + "\n".join(indent + line for line in body.split("\n")) + source[match.end():]


def _answers(source_nb, release_nb, kind: str, rng: random.Random, course: pathlib.Path):
    """A submission of ``kind`` ("correct", "blank", "wrong", or a HOSTILE key)."""
    if kind == "blank":
        return release_nb
    nb = nbformat.from_dict(json.loads(json.dumps(release_nb)))
    solutions = {c.metadata["nbgrader"]["grade_id"]: c.source for c in source_nb.cells
                 if c.metadata.get("nbgrader", {}).get("solution")}
    for cell in nb.cells:
        gid = cell.metadata.get("nbgrader", {}).get("grade_id")
        if gid in solutions:
            cell.source = solutions[gid]
    if kind == "correct":
        return nb
    code = [c for c in nb.cells if c.cell_type == "code" and "BEGIN SOLUTION" in c.source]
    target = rng.choice(code)
    body = "raise ValueError('not finished')" if kind == "wrong" else HOSTILE[kind].format(course=course)
    target.source = _replace_solution(target.source, body)
    return nb


def simulate(course: pathlib.Path, students: int, seed: int = 0) -> dict[str, str]:
    """Write every student's submissions; return student -> kind."""
    rng = random.Random(seed)
    chapters = sorted(p.name for p in (course / "release").iterdir())
    sources = {c: nbformat.read(str(course / "source" / c / f"{c}.ipynb"), as_version=4) for c in chapters}
    releases = {c: nbformat.read(str(course / "release" / c / f"{c}.ipynb"), as_version=4) for c in chapters}
    kinds = {}
    for i in range(students):
        student = f"s{i:03d}"
        kind = (["exit", "loop", "snoop"][i] if i < 3 else "blank" if i % 10 == 3
                else "wrong" if i % 5 == 4 else "correct")
        kinds[student] = kind
        for chapter in chapters:
            # a hostile student is hostile in one chapter, and correct elsewhere
            this = kind if kind in ("correct", "blank", "wrong") or chapter == chapters[i % len(chapters)] else "correct"
            folder = course / "submitted" / student / chapter
            folder.mkdir(parents=True)
            nbformat.write(_answers(sources[chapter], releases[chapter], this, rng, course),
                           str(folder / f"{chapter}.ipynb"))
    with open(course / "students.csv", "w") as f:
        f.write("id,first_name,last_name,email\n" + "".join(f"{s},,,\n" for s in kinds))
    return kinds


def _verify(course: pathlib.Path, kinds: dict[str, str], chapters: int) -> None:
    with open(course / "grades.csv") as f:
        rows = list(csv.DictReader(f))
    if len(rows) != len(kinds) * chapters:
        raise SystemExit(f"grades.csv has {len(rows)} rows; expected {len(kinds) * chapters}")
    for row in rows:
        kind, full = kinds[row["student_id"]], row["score"] == row["max_score"]
        if row["status"] != "graded" or (kind == "correct") != full and kind in ("correct", "blank", "wrong"):
            raise SystemExit(f"unexpected grade for a {kind} submission: {row}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m attnbook_classroom.course.bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--students", type=int, default=100)
    parser.add_argument("--root", type=pathlib.Path, default=REPO / "_build" / "grade-bench")
    parser.add_argument("--workers", type=int, default=None)
    parser.add_argument("--record", action="store_true",
                        help=f"also write the result to {RECORD.relative_to(REPO)} (the instructors' page's number)")
    args = parser.parse_args(argv)
    root = args.root.resolve()
    shutil.rmtree(root, ignore_errors=True)
    course = root / "course"
    start = time.monotonic()
    build_assignments(course, exchange=root / "exchange")
    built = time.monotonic() - start
    kinds = simulate(course, args.students)
    chapters = len(list((course / "release").iterdir()))
    start = time.monotonic()
    grade(course, workers=args.workers)
    seconds = time.monotonic() - start
    _verify(course, kinds, chapters)
    result = {"students": args.students, "chapters": chapters, "notebooks": args.students * chapters,
              "grade_seconds": round(seconds, 1), "build_seconds": round(built, 1), "cores": os.cpu_count(),
              "workers": args.workers, "seconds_per_notebook": round(seconds / (args.students * chapters), 3)}
    result.update(machine=platform.machine(), cpu=_cpu_name(), torch=torch.__version__,
                  date=time.strftime("%Y-%m-%d", time.gmtime()))
    (root / "result.json").write_text(json.dumps(result, indent=1))
    if args.record:
        RECORD.write_text(json.dumps(result, indent=1) + "\n")
        record([RECORD])
    print(f"grade-bench: {result['notebooks']} notebooks ({args.students} students x {chapters} chapters) "
          f"graded in {seconds / 60:.1f} min on {os.cpu_count()} cores ({result['seconds_per_notebook']} s each); "
          f"the assignments took {built:.0f} s to build. {root / 'result.json'}")


if __name__ == "__main__":
    main()

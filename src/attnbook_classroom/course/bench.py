"""``make grade-bench``: the time to grade a simulated class of every chapter, honest and hostile.

    python -m attnbook_classroom.course.bench [--students 100] [--root _build/grade-bench] [--workers N] [--record]

Releases every chapter's exercise notebook into a fresh course, then grades two classes of the same
size, each handing in every chapter:

- the **honest** class: most students answer with the instructor's solutions, some hand in the
  notebook unanswered, some get one exercise wrong;
- the **hostile** class: the same, but for a tenth of the students (at least one of each kind), who
  loop (every code cell of every notebook never ends), flood (every cell prints without end and every
  function returns a result far over the cap), bloat (one notebook of 200 MB, one of 100,000 cells),
  or snoop (a cell that ends the process, then one that reads the course folder and patches the
  grader).

``make grade`` grades each; the time of each run, the number of notebooks and the machine's cores
are printed and written to ``ROOT/result.json``. The run fails if a correct submission does not get
full marks, a wrong or hostile one does, a bloated notebook is graded, or ``grades.csv`` misses a
row. With ``--record`` the result is also written to ``data/grade_bench.json`` (listed in
``data/manifest.json``): the measurement the classroom appendix reports, and tests/classroom/test_instructors.py
checks that the page says what it holds.
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
HONEST = ("correct", "blank", "wrong")
HOSTILE = ("loop", "flood", "bloat", "snoop")


def _cpu_name() -> str:
    """The CPU's model name (Linux), or the platform's processor string."""
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _replace_solution(source: str, body: str) -> str:
    """``source`` with its solution region replaced by ``body`` (indented like the region)."""
    match = re.search(r"^([ \t]*)### BEGIN SOLUTION\n.*?^[ \t]*### END SOLUTION", source, re.S | re.M)
    indent = match.group(1)
    return source[:match.start()] + "\n".join(indent + line for line in body.split("\n")) + source[match.end():]


LOOP = "while True:\n    pass"
FLOOD_CELL = "import sys\nwhile True:\n    print('x' * 100_000)\n    sys.stderr.write('y' * 100_000)"
FLOOD_RESULT = "import torch\nreturn torch.zeros(50_000_000)"


def _answers(source_nb, release_nb, kind: str, rng: random.Random, course: pathlib.Path, bloat: str | None):
    """A submission of ``kind`` (see the module's docstring) as a notebook (dict), or, for a bloated
    one, the text of the file."""
    if kind == "blank":
        return release_nb
    nb = nbformat.from_dict(json.loads(json.dumps(release_nb)))
    solutions = {c.metadata["nbgrader"]["grade_id"]: c.source for c in source_nb.cells
                 if c.metadata.get("nbgrader", {}).get("solution")}
    for cell in nb.cells:
        gid = cell.metadata.get("nbgrader", {}).get("grade_id")
        if gid in solutions:
            cell.source = solutions[gid]
    code = [c for c in nb.cells if c.cell_type == "code" and "BEGIN SOLUTION" in c.source]
    if kind == "wrong":
        target = rng.choice(code)
        target.source = _replace_solution(target.source, "raise ValueError('not finished')")
    elif kind == "snoop":
        code[0].source = _replace_solution(code[0].source, "import os\nos._exit(1)")
        code[-1].source = _replace_solution(code[-1].source, (
            "import attnbook_classroom.grading.compare as c\nc.same = lambda *a, **k: True\n"
            f"open('/etc/../{course}/course_secret').read()"))
    elif kind == "loop":
        for cell in nb.cells:
            if cell.cell_type == "code" and not cell.metadata.get("nbgrader", {}).get("grade"):
                cell.source = LOOP
    elif kind == "flood":
        for cell in nb.cells:
            if cell.cell_type == "code" and "BEGIN SOLUTION" in cell.source and "def " in cell.source:
                cell.source = _replace_solution(cell.source, FLOOD_RESULT)
            elif cell.cell_type == "code" and not cell.metadata.get("nbgrader", {}).get("grade"):
                cell.source = FLOOD_CELL
    if bloat == "bytes":  # one output of 200 MB
        nb.cells[-1].outputs = [nbformat.v4.new_output("stream", name="stdout", text="x" * 200_000_000)]
    elif bloat == "cells":
        nb.cells += [nbformat.v4.new_code_cell("", id=f"bloat-{i}") for i in range(100_000)]
    return nb


def _kinds(students: int, hostile: bool) -> dict[str, str]:
    """student -> kind; in the hostile class, a tenth of the students (at least one of each kind)
    are hostile, spread over the class."""
    kinds = {f"s{i:03d}": "blank" if i % 10 == 3 else "wrong" if i % 5 == 4 else "correct" for i in range(students)}
    if hostile:
        count = min(students, max(len(HOSTILE), students // 10))
        for n in range(count):
            kinds[f"s{n * students // count:03d}"] = HOSTILE[n % len(HOSTILE)]
    return kinds


def simulate(course: pathlib.Path, students: int, hostile: bool, seed: int = 0) -> dict[str, str]:
    """Write every student's submissions; return student -> kind."""
    rng = random.Random(seed)
    chapters = sorted(p.name for p in (course / "release").iterdir())
    sources = {c: nbformat.read(str(course / "source" / c / f"{c}.ipynb"), as_version=4) for c in chapters}
    releases = {c: nbformat.read(str(course / "release" / c / f"{c}.ipynb"), as_version=4) for c in chapters}
    kinds = _kinds(students, hostile)
    bloats = iter(("bytes", "cells") * students)
    for i, (student, kind) in enumerate(kinds.items()):
        bloated = {chapters[i % len(chapters)]: next(bloats)} if kind == "bloat" else {}
        for chapter in chapters:
            # a snooping or bloating student does so in one chapter and answers the others rightly
            this = kind if kind not in ("snoop", "bloat") or chapter == chapters[i % len(chapters)] else "correct"
            folder = course / "submitted" / student / chapter
            folder.mkdir(parents=True)
            nb = _answers(sources[chapter], releases[chapter], "correct" if this == "bloat" else this, rng,
                          course, bloated.get(chapter))
            (folder / f"{chapter}.ipynb").write_text(json.dumps(nb))
    with open(course / "students.csv", "w") as f:
        f.write("id,first_name,last_name,email\n" + "".join(f"{s},,,\n" for s in kinds))
    with open(course / "due_dates.csv", "w") as f:  # every chapter handed out
        f.write("assignment,duedate\n" + "".join(f"{c},2099-01-01 00:00:00 UTC\n" for c in chapters))
    return kinds


def _verify(course: pathlib.Path, kinds: dict[str, str], chapters: int) -> dict[str, int]:
    with open(course / "grades.csv") as f:
        rows = list(csv.DictReader(f))
    if len(rows) != len(kinds) * chapters:
        raise SystemExit(f"grades.csv has {len(rows)} rows; expected {len(kinds) * chapters}")
    counts: dict[str, int] = {}
    for row in rows:
        kind, full = kinds[row["student_id"]], row["score"] == row["max_score"]
        counts[row["status"]] = counts.get(row["status"], 0) + 1
        bloated = kind == "bloat" and "over the grading limit" in row["note"]
        if bloated:
            if row["status"] != "error" or row["score"] != "":
                raise SystemExit(f"a bloated notebook was graded: {row}")
            continue
        if row["status"] != "graded":
            raise SystemExit(f"a {kind} submission was not graded: {row}")
        if kind in ("correct", "bloat") and not full:  # (a bloating student's other chapters are right)
            raise SystemExit(f"a correct submission lost points: {row}")
        if kind in ("blank", "wrong", "loop", "flood") and full:
            raise SystemExit(f"a {kind} submission got full marks: {row}")
    return counts


def _clear(course: pathlib.Path) -> None:
    """No submission, feedback or cached verdict left (the gradebook's records are graded again)."""
    for name in ("submitted", "autograded", "feedback", ".grading"):
        shutil.rmtree(course / name, ignore_errors=True)
    for name in ("grades.csv", "grades-lms.csv", "summary.txt"):
        (course / name).unlink(missing_ok=True)


def run_class(course: pathlib.Path, students: int, hostile: bool, workers: int | None) -> dict:
    _clear(course)
    kinds = simulate(course, students, hostile)
    chapters = len(list((course / "release").iterdir()))
    start = time.monotonic()
    grade(course, workers=workers)
    seconds = time.monotonic() - start
    statuses = _verify(course, kinds, chapters)
    hostiles = {k: sum(v == k for v in kinds.values()) for k in HOSTILE if hostile}
    return {"students": students, "chapters": chapters, "notebooks": students * chapters,
            "grade_seconds": round(seconds, 1), "seconds_per_notebook": round(seconds / (students * chapters), 3),
            "statuses": statuses, "hostile_students": hostiles}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m attnbook_classroom.course.bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--students", type=int, default=100)
    parser.add_argument("--root", type=pathlib.Path, default=REPO / "_build" / "grade-bench")
    parser.add_argument("--workers", type=int, default=None)
    parser.add_argument("--record", action="store_true",
                        help=f"also write the result to {RECORD.relative_to(REPO)} (the classroom appendix's number)")
    args = parser.parse_args(argv)
    root = args.root.resolve()
    shutil.rmtree(root, ignore_errors=True)
    course = root / "course"
    start = time.monotonic()
    build_assignments(course, exchange=root / "exchange")
    built = round(time.monotonic() - start, 1)
    result = {"honest": run_class(course, args.students, False, args.workers),
              "hostile": run_class(course, args.students, True, args.workers)}
    result.update(build_seconds=built, cores=os.cpu_count(), workers=args.workers, machine=platform.machine(), cpu=_cpu_name(),
                  torch=torch.__version__, date=time.strftime("%Y-%m-%d", time.gmtime()))
    (root / "result.json").write_text(json.dumps(result, indent=1))
    if args.record:
        RECORD.write_text(json.dumps(result, indent=1) + "\n")
        record([RECORD])
    for name in ("honest", "hostile"):
        r = result[name]
        print(f"grade-bench, {name} class: {r['notebooks']} notebooks ({r['students']} students x {r['chapters']} "
              f"chapters) graded in {r['grade_seconds'] / 60:.1f} min on {os.cpu_count()} cores "
              f"({r['seconds_per_notebook']} s each); statuses {r['statuses']}")
    print(f"The assignments took {result['build_seconds']:.0f} s to build. {root / 'result.json'}")


if __name__ == "__main__":
    main()

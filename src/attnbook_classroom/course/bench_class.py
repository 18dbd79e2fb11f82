"""The classes ``make grade-bench`` grades (:mod:`attnbook_classroom.course.bench`): each student's
kind (:func:`class_kinds`) and the submissions :func:`simulate` writes for them, into a course
released by ``make grade``'s own code. An honest student hands in the instructor's solutions, a
notebook left unanswered, or one exercise left unfinished (:func:`exercises`, which picks among
those no other cell uses); a hostile one does one of the :data:`HOSTILE` things in every chapter.
"""

from __future__ import annotations

import ast
import json
import pathlib
import random
import re

import nbformat

# The hostile kinds, in the order the students of the hostile class take them: what each does, and
# a phrase its feedback must show (the grader saw and named it).
HOSTILE = {
    "loop": ("an endless loop in every cell", "did not finish within"),
    "loop-answers": ("an endless loop in every answer", "did not finish within"),
    "sleep": ("a sleep without end in every cell", "did not finish within"),
    "sleep-answers": ("a sleep without end in every answer", "did not finish within"),
    "memory": ("memory taken up to the limit in every cell", "MemoryError"),
    "huge": ("answers far over the size the grader accepts", "more than the 32.0 MiB the grader accepts"),
    "fork": ("a fork bomb, a shell and subprocess in every cell", "Operation not permitted"),
    "threads": ("threads computing on every core in every cell", "did not finish within"),
    "flood": ("output without end in every cell", "did not finish within"),
    "bloat": ("notebooks too big to read (200 MB, 100,000 cells, or just over the limits)", "over the grading limit"),
}

LOOP = "while True:\n    pass"
SLEEP = "import time\ntime.sleep(10 ** 6)"
MEMORY = "hoard = []\nwhile True:\n    hoard.append(bytearray(b'x') * (256 << 20))  # 256 MiB, every page written"
HUGE = "import torch\nreturn torch.zeros(50_000_000)  # 200 MB"
FORK = ("import os, subprocess\n"
        "for start in (lambda: subprocess.Popen(['/bin/sh', '-c', 'yes > /dev/null']), "
        "lambda: os.system('yes > /dev/null')):\n"
        "    try:\n        start()\n    except OSError:\n        pass\n"
        "while True:\n    os.fork()")
THREADS = ("import threading, torch\ntorch.set_num_threads(8)\n"
           "def spin():\n    a = torch.randn(300, 300)\n    while True:\n        a @ a\n"
           "for _ in range(8):\n    threading.Thread(target=spin, daemon=True).start()\n"
           "b = torch.randn(600, 600)\nwhile True:\n    b @ b")
FLOOD = "import sys\nwhile True:\n    print('x' * 100_000)\n    sys.stderr.write('y' * 100_000)"


def _replace_solution(source: str, body: str) -> str:
    """``source`` with its solution region replaced by ``body`` (indented like the region)."""
    match = re.search(r"^([ \t]*)### BEGIN SOLUTION\n.*?^[ \t]*### END SOLUTION", source, re.S | re.M)
    indent = match.group(1)
    return source[:match.start()] + "\n".join(indent + line for line in body.split("\n")) + source[match.end():]


def _meta(cell) -> dict:
    return cell.metadata.get("nbgrader", {})


def _defined(node) -> set[str]:
    """The names a top-level statement binds."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return {(a.asname or a.name).split(".")[0] for a in node.names}
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}


def _names(source: str) -> tuple[set[str], set[str]]:
    """(the names a cell no longer binds rightly when its solution region raises: those bound from
    the region on, or the function or class that holds it; every name the cell uses). Both empty if
    the cell is not Python."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set(), set()
    line = next((n for n, text in enumerate(source.split("\n"), 1) if "### BEGIN SOLUTION" in text), 0)
    lost = set()
    for node in tree.body:
        if node.lineno >= line or node.end_lineno >= line:
            lost |= _defined(node)
    return lost, {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}


def exercises(source_nb) -> list[dict]:
    """The exercises of an instructor's notebook that can be left unfinished alone: for each solution
    cell whose names no other cell uses but its own test cells (those that follow it, up to the next
    solution cell), its grade id, its test cells' grade ids and their points."""
    cells = [c for c in source_nb.cells if c.cell_type == "code"]
    found = []
    for i, cell in enumerate(cells):
        if not _meta(cell).get("solution"):
            continue
        tests, j = [], i + 1
        while j < len(cells) and not _meta(cells[j]).get("solution"):
            if _meta(cells[j]).get("grade"):
                tests.append(j)
            j += 1
        defined = _names(cell.source)[0]
        others = [c for k, c in enumerate(cells) if k != i and k not in tests]
        if tests and defined and not any(defined & _names(c.source)[1] for c in others):
            found.append({"solution": _meta(cell)["grade_id"], "tests": [_meta(cells[k])["grade_id"] for k in tests],
                          "points": sum(float(_meta(cells[k]).get("points", 0)) for k in tests)})
    return found


def _answered(source_nb, release_nb):
    """The released notebook with every solution cell as the instructor wrote it."""
    nb = nbformat.from_dict(json.loads(json.dumps(release_nb)))
    solutions = {_meta(c)["grade_id"]: c.source for c in source_nb.cells if _meta(c).get("solution")}
    for cell in nb.cells:
        if _meta(cell).get("grade_id") in solutions:
            cell.source = solutions[_meta(cell)["grade_id"]]
    return nb


def _hostile(nb, kind: str, chapter_index: int) -> nbformat.NotebookNode | None:
    """``nb`` (answered) turned into a hostile submission of ``kind`` (None: the bloated file is written
    by the caller)."""
    plain = [c for c in nb.cells if c.cell_type == "code" and not _meta(c).get("grade")]
    answers = [c for c in nb.cells if c.cell_type == "code" and "BEGIN SOLUTION" in c.source]
    every_cell = {"loop": LOOP, "sleep": SLEEP, "memory": MEMORY, "fork": FORK, "threads": THREADS, "flood": FLOOD}
    every_answer = {"loop-answers": LOOP, "sleep-answers": SLEEP}
    if kind in every_cell:
        for cell in plain:
            cell.source = every_cell[kind]
    elif kind in every_answer:
        for cell in answers:
            cell.source = _replace_solution(cell.source, every_answer[kind])
    elif kind == "huge":  # every function answers with 200 MB; every other answer is wrong
        for cell in answers:
            inside = re.search(r"^[ \t]+### BEGIN SOLUTION", cell.source, re.M)
            cell.source = _replace_solution(cell.source, HUGE if inside else "raise ValueError('no answer')")
    elif kind == "bloat":  # the first two chapters far over the limits, the others just over them
        if chapter_index % 2:
            count = 100_000 if chapter_index == 1 else 1_001 - len(nb.cells)
            nb.cells += [nbformat.v4.new_code_cell("", id=f"bloat-{i}") for i in range(count)]
        else:
            cell = nbformat.v4.new_code_cell("", id="bloat")
            size = 200_000_000 if chapter_index == 0 else 16_000_001
            cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="x" * size)]
            nb.cells.append(cell)
    else:
        raise ValueError(f"kind: got {kind!r}; expected one of {sorted(HOSTILE)}")
    return nb


def class_kinds(students: int, hostile: bool) -> list[str]:
    """Each student's kind: the hostile kinds in turn, or mostly correct, every tenth blank, every
    fifth unfinished."""
    if hostile:
        return [list(HOSTILE)[i % len(HOSTILE)] for i in range(students)]
    return ["blank" if i % 10 == 3 else "unfinished" if i % 5 == 4 else "correct" for i in range(students)]


def simulate(course: pathlib.Path, kinds: list[str], seed: int = 0) -> dict[str, dict]:
    """Write the submissions of a class of students of ``kinds`` (into a course holding no other);
    return student -> {"kind", "expected": {chapter: score, or None for a hostile one: anything but
    full marks}}."""
    rng = random.Random(seed)
    chapters = sorted(p.name for p in (course / "release").iterdir())
    sources = {c: nbformat.read(str(course / "source" / c / f"{c}.ipynb"), as_version=4) for c in chapters}
    releases = {c: nbformat.read(str(course / "release" / c / f"{c}.ipynb"), as_version=4) for c in chapters}
    maxima = {c: sum(float(_meta(cell).get("points", 0)) for cell in sources[c].cells if _meta(cell).get("grade"))
              for c in chapters}
    roster = {}
    for i, kind in enumerate(kinds):
        if kind not in HOSTILE and kind not in ("correct", "blank", "unfinished"):
            raise ValueError(f"kinds: got {kind!r}; expected correct, blank, unfinished or one of {list(HOSTILE)}")
        hostile = kind in HOSTILE
        student = f"{'h' if hostile else 's'}{i:03d}"
        roster[student] = {"kind": kind, "expected": {}}
        for n, chapter in enumerate(chapters):
            folder = course / "submitted" / student / chapter
            folder.mkdir(parents=True)
            nb, expected = _answered(sources[chapter], releases[chapter]), maxima[chapter]
            if kind == "blank":
                nb, expected = releases[chapter], 0.0
            elif kind == "unfinished":
                options = exercises(sources[chapter])
                if options:
                    pick = rng.choice(options)
                    cell = next(c for c in nb.cells if _meta(c).get("grade_id") == pick["solution"])
                    cell.source = _replace_solution(cell.source, "raise ValueError('not finished yet')")
                    expected -= pick["points"]
            elif hostile:
                nb, expected = _hostile(nb, kind, n), None
            (folder / f"{chapter}.ipynb").write_text(json.dumps(nb))
            roster[student]["expected"][chapter] = expected
    with open(course / "students.csv", "w") as f:
        f.write("id,first_name,last_name,email\n" + "".join(f"{s},,,\n" for s in roster))
    with open(course / "due_dates.csv", "w") as f:  # every chapter handed out
        f.write("assignment,duedate\n" + "".join(f"{c},2099-01-01 00:00:00 UTC\n" for c in chapters))
    return roster

"""A submitted notebook as the sandbox runs it, and the verdict on each of its test cells.

:class:`Submission` reads a notebook in the book's exercise format: its code cells are the
student's code (locked cells in the instructor's version, when given), and each test cell is a
list of ``check(exercise_id, fn, part=...)`` calls, some inside ``### BEGIN HIDDEN TESTS`` /
``### END HIDDEN TESTS``. A hidden check runs on inputs seeded for that student from the course's
secret (:func:`student_seed`), so they differ from the visible ones and from every other student's.

:meth:`Submission.job` is what the sandbox's runner executes; :meth:`Submission.judge` turns the
runner's frames into :class:`Verdicts`: for every test cell, passed or not and the messages that
name the mistakes; for every code cell that raised or stopped the process, what happened. The
comparison with the references runs here, in the grader, never in the sandbox.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import os
import hmac
import json
import pathlib
import time
from dataclasses import dataclass, field

import nbformat

from attnbook_classroom.grading import wire
from attnbook_classroom.grading.harness import PendingPart, get_exercise
from attnbook_classroom.grading.sandbox import Sandbox, parse_info

__all__ = ["CheckCall", "Submission", "Verdicts", "BadTestCell", "parse_test_cell", "student_seed",
           "grader_version", "grade_in_sandbox", "SKIP_TAG"]

HIDDEN_BEGIN, HIDDEN_END = "BEGIN HIDDEN TESTS", "END HIDDEN TESTS"
SKIP_TAG = "skip-in-grading"  # a provided cell the grader does not run (a live experiment)
CELL_LIMIT = 10.0  # seconds for a cell or a test cell (the exercises' take under 2)
TOTAL_LIMIT = 60.0  # seconds for all of one notebook's cells and tests


class BadTestCell(ValueError):
    """A test cell that is not in the book's format (a list of ``check(...)`` calls)."""


@dataclass(frozen=True)
class CheckCall:
    exercise_id: str
    fn: str
    part: str
    seed: int
    hidden: bool


def _literal(node, what: str, kinds):
    if isinstance(node, ast.Constant) and isinstance(node.value, kinds) and not (
            kinds is int and isinstance(node.value, bool)):
        return node.value
    raise BadTestCell(f"{what} must be written as a literal")


def parse_test_cell(source: str, grade_id: str = "?") -> list[CheckCall]:
    """The ``check(...)`` calls of a test cell, in order, with ``hidden`` set for those inside the
    hidden-test region (their ``seed`` is replaced per student when graded)."""
    lines, hidden_lines, inside = source.split("\n"), set(), False
    for number, line in enumerate(lines, 1):
        if HIDDEN_BEGIN in line:
            inside = True
        elif HIDDEN_END in line:
            inside = False
        elif inside:
            hidden_lines.add(number)
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        raise BadTestCell(f"test cell {grade_id}: {exc}") from None
    calls = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and (getattr(node.func, "id", None) == "check"
                                                or getattr(node.func, "attr", None) == "check")):
            continue
        try:
            if len(node.args) < 2:
                raise BadTestCell("check needs an exercise id and the student's answer")
            exercise_id = _literal(node.args[0], "the exercise id", str)
            keywords = {k.arg: k.value for k in node.keywords}
            part_node = node.args[2] if len(node.args) > 2 else keywords.get("part")
            part = None if part_node is None else _literal(part_node, "part", (str, type(None)))
            seed = _literal(keywords["seed"], "seed", int) if "seed" in keywords else 0
            hidden = _literal(keywords["hidden"], "hidden", bool) if "hidden" in keywords else False
            ex = get_exercise(exercise_id, where=f"test cell {grade_id}")
        except (BadTestCell, ValueError) as exc:
            raise BadTestCell(f"test cell {grade_id}: {exc}") from None
        names = list(ex.parts) if part is None else [part]
        if any(name not in ex.parts for name in names):
            raise BadTestCell(f"test cell {grade_id}: {part!r} is not a part of {exercise_id!r}")
        fn = ast.get_source_segment(source, node.args[1])
        hidden = hidden or node.lineno in hidden_lines
        calls += [((node.lineno, node.col_offset), CheckCall(exercise_id, fn, name, seed, hidden))
                  for name in names]
    if not calls:
        raise BadTestCell(f"test cell {grade_id}: it calls no check(...); every test cell of an "
                            "exercise notebook is a list of check(exercise_id, answer, part=...) calls")
    return [c for _, c in sorted(calls, key=lambda pair: pair[0])]


def student_seed(secret: bytes, student: str, assignment: str, check: CheckCall, n: int) -> int:
    """The seed of a hidden check for one student: an HMAC of the course's secret."""
    message = "\0".join([student, assignment, check.exercise_id, check.part, str(n)]).encode()
    return int.from_bytes(hmac.new(secret, message, hashlib.sha256).digest()[:4], "big") % (2**31 - 3) + 2


@functools.lru_cache(maxsize=1)
def grader_version() -> str:
    """A digest of the grading code and of the library it compares with: a change to either makes
    every cached verdict stale."""
    import attnbook
    import attnbook_tools

    h = hashlib.sha256()
    folders = [pathlib.Path(__file__).parent] + [pathlib.Path(m.__file__).parent for m in (attnbook, attnbook_tools)]
    for folder in folders:
        for path in sorted(folder.rglob("*.py")):
            h.update(str(path.relative_to(folder)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


def _transform(source: str) -> str:
    """A cell's source as plain Python (IPython's magics become calls that do nothing when graded)."""
    if "%" not in source and "!" not in source:
        return source
    try:
        from IPython.core.inputtransformer2 import TransformerManager
        return TransformerManager().transform_cell(source)
    except Exception:
        return source


@dataclass
class Verdicts:
    """Per test cell (grade id): passed and the messages; per code cell index: what went wrong."""

    tests: dict[str, dict] = field(default_factory=dict)
    cells: dict[int, str] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps({"tests": self.tests, "cells": {str(k): v for k, v in self.cells.items()}})

    @classmethod
    def from_json(cls, text: str) -> "Verdicts":
        data = json.loads(text)
        return cls(data["tests"], {int(k): v for k, v in data["cells"].items()})

    def failures(self) -> list[str]:
        """Why some test cells could not run to the end (timeouts, crashes), for a summary."""
        return sorted({m for t in self.tests.values() for m in t.get("stopped", [])})

    def apply(self, nb, scrub: list[str] = ()) -> None:
        """Write the verdicts into the notebook's outputs, as nbgrader reads them: a failed test
        cell gets an error (no points), a passed one a line saying so; a code cell that raised or
        stopped the process gets an error that says so. Paths in ``scrub`` are blanked out."""
        def clean(text: str) -> str:
            for path in scrub:
                text = text.replace(str(path), "…")
            return text

        for index, cell in enumerate(nb["cells"]):
            if cell["cell_type"] != "code":
                continue
            grade_id = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
            test = self.tests.get(grade_id) if grade_id else None
            if test is not None:
                if test["passed"]:
                    lines = "".join(f"{label}: passed\n" for label in test["labels"])
                    cell["outputs"] = [nbformat.v4.new_output("stream", name="stdout", text=lines)]
                else:
                    text = clean("\n\n".join(test["messages"]))
                    cell["outputs"] = [nbformat.v4.new_output("error", ename="AssertionError", evalue=text,
                                                              traceback=text.split("\n"))]
            elif index in self.cells:
                name, _, message = clean(self.cells[index]).partition(": ")
                cell["outputs"] = [nbformat.v4.new_output("error", ename=name, evalue=message,
                                                          traceback=[f"{name}: {message}"])]


class Submission:
    """One submitted notebook: the code to run, the checks of each test cell, and their judges.

    ``source_cells`` (grade id -> ``{"source", "locked", "tags", "test"}`` from the instructor's
    version) restores locked cells and gives the test cells; without it, the notebook's own test
    cells are used. All the code cells run first, in order, then every check.
    """

    def __init__(self, nb, *, secret: bytes, student: str, assignment: str,
                 source_cells: dict[str, dict] | None = None, cell_limit: float = CELL_LIMIT,
                 total_limit: float = TOTAL_LIMIT):
        self.cell_limit, self.total_limit = cell_limit, total_limit
        self.cells: list[tuple[int, str]] = []  # (index in the notebook, source to run)
        self.tests: list[tuple[str, list[CheckCall]]] = []
        source_cells = source_cells or {}
        for index, cell in enumerate(nb["cells"]):
            meta = cell.get("metadata", {}).get("nbgrader", {})
            original = source_cells.get(meta.get("grade_id", ""), None)
            is_test = meta.get("grade") and not meta.get("solution") or (original or {}).get("test")
            if cell["cell_type"] != "code":
                continue
            if is_test:
                if not source_cells:  # no instructor's version: the notebook's own test cells
                    self.tests.append((meta["grade_id"], parse_test_cell(_text(cell["source"]), meta["grade_id"])))
                continue
            if original is not None and (meta.get("locked") or original.get("locked")):
                source, tags = original["source"], original.get("tags", [])
            else:
                source, tags = _text(cell["source"]), cell.get("metadata", {}).get("tags", [])
            if SKIP_TAG not in tags:
                self.cells.append((index, _transform(source)))
        # the instructor's test cells, even those a student deleted or changed
        self.tests += [(grade_id, parse_test_cell(c["source"], grade_id))
                       for grade_id, c in source_cells.items() if c.get("test")]
        self.checks: list[tuple[str, CheckCall]] = []
        counts: dict[tuple, int] = {}
        for grade_id, calls in self.tests:
            for c in calls:
                if c.hidden:
                    n = counts[(c.exercise_id, c.part)] = counts.get((c.exercise_id, c.part), 0) + 1
                    c = CheckCall(c.exercise_id, c.fn, c.part, student_seed(secret, student, assignment, c, n), True)
                self.checks.append((grade_id, c))
        self._pending: list[PendingPart] | None = None
        self.cut_short = False  # whether the student's time budget cut this notebook's limit short

    @property
    def pending(self) -> list[PendingPart]:
        """One part per check, its inputs built (made when first needed: a cached verdict needs none)."""
        if self._pending is None:
            self._pending = [PendingPart(c.exercise_id, c.part, c.seed) for _, c in self.checks]
        return self._pending

    def blocks(self, kind: str = "blocks") -> list[str]:
        """The names blocked for the whole notebook (``kind="blocks"``) or while the tests run
        (``"check_blocks"``)."""
        names = []
        for _, c in self.checks:
            names += [b for b in getattr(get_exercise(c.exercise_id), kind) if b not in names]
        return names

    def passes(self) -> list[dict]:
        """The runs of this notebook in the sandbox. Without ``check_blocks`` in the notebook, one
        run: every cell, then every check, with the notebook's ``blocks`` removed from the library.
        With them, the first run's checks are those of values the cells computed (an experiment
        may need such a name, e.g. chapter 0's uses the package's ``attention``); a second run, in a
        new process whose view has those names removed too, runs the cells again and then every
        check that calls the student's functions: a function the student wrote (or saved) while the
        names were there never meets them in its tests. Each: ``blocked`` (names), ``checks``
        (indices into :attr:`checks`), ``report`` (whether its cells' errors are the notebook's)."""
        blocks, later = self.blocks(), self.blocks("check_blocks")
        if not later:
            return [{"blocked": blocks, "checks": list(range(len(self.checks))), "report": True}]
        values = [k for k, p in enumerate(self.pending) if all(spec["op"] == "answer" for spec in p.specs)]
        return [{"blocked": blocks, "checks": values, "report": True},
                {"blocked": blocks + [b for b in later if b not in blocks],
                 "checks": [k for k in range(len(self.checks)) if k not in values], "report": False}]

    def job(self, run: dict | None = None, skip=(), total_limit: float | None = None) -> dict:
        """What the sandbox's runner executes for one of :meth:`passes` (plain data)."""
        run = run or {"checks": list(range(len(self.checks)))}
        groups = {grade_id: g for g, (grade_id, _) in enumerate(self.tests)}
        text = "\n".join(source for _, source in self.cells)
        preload = [m for m in ("matplotlib.pyplot", "seaborn", "pandas") if m.split(".")[0] in text
                   or (m == "matplotlib.pyplot" and "attnbook_tools.notebook" in text)]
        checks = [(self.checks[k], self.pending[k]) for k in run["checks"]]
        return {"cells": [source for _, source in self.cells], "skip": sorted(skip),
                "checks": [{"fn": c.fn, "specs": p.specs, "group": groups[grade_id]}
                           for (grade_id, c), p in checks],
                "cell_limit": self.cell_limit,
                "total_limit": self.total_limit if total_limit is None else total_limit,
                "preload": preload}

    def run(self, sandbox: Sandbox, budget: float | None = None) -> list[tuple[bytes, int, bytes]]:
        """Run :meth:`passes` in ``sandbox``; return the frames for :meth:`judge` (check frames
        numbered by :attr:`checks`, cell frames from the first pass only). ``budget`` (seconds left of
        the student's time) may cut the notebook's own limit short."""
        frames: list[tuple[bytes, int, bytes]] = []
        start, skip = time.monotonic(), set()
        total = self.total_limit if budget is None else max(0.0, min(self.total_limit, budget))
        self.cut_short = total < self.total_limit
        for n, run in enumerate(self.passes()):
            left = total - (time.monotonic() - start)
            if not run["checks"] and not run["report"]:
                continue
            if left < 1:
                frames += [(b"X", k, b'{"reason": "budget"}') for k in run["checks"]]
                continue
            got = sandbox.run(self.job(run, skip, left), timeout=left + 60, blocked=run["blocked"])
            for kind, index, payload in got:
                if kind in b"eE" and len(kind) == 1:
                    if run["report"]:
                        frames.append((kind, index, payload))
                        if kind == b"E":
                            skip.add(index)  # a cell that timed out or ended its process is not run again
                elif kind in (b"r", b"X") and index < len(run["checks"]):
                    frames.append((kind, run["checks"][index], payload))
        return frames

    def key(self) -> str:
        """A digest of everything the verdicts depend on (code, checks with their seeds, limits, grader)."""
        h = hashlib.sha256(grader_version().encode())
        h.update(json.dumps([self.cells, [(g, c.__dict__) for g, c in self.checks],
                             self.cell_limit, self.total_limit]).encode())
        return h.hexdigest()

    def judge(self, frames: list[tuple[bytes, int, bytes]]) -> Verdicts:
        """The verdicts from the runner's frames (a missing result counts as a failure)."""
        results: dict[int, list[str]] = {}
        stopped: dict[int, str] = {}
        cells: dict[int, str] = {}
        for kind, index, payload in frames:
            if kind == b"e" and index < len(self.cells) and index not in cells:
                error = parse_info(payload).get("error")
                if isinstance(error, dict):
                    cells[index] = f"{str(error.get('type', 'Error'))[:100]}: {str(error.get('message', ''))[:500]}"
            elif kind == b"E" and index < len(self.cells):
                reason = str(parse_info(payload).get("reason", "crash"))
                cells[index] = self._cell_stopped(reason)
            elif kind == b"r" and index < len(self.checks) and index not in results:
                try:
                    results[index] = self.pending[index].finish(wire.loads(payload))
                except Exception as exc:
                    results[index] = [f"The grader could not read your function's results ({exc})."]
            elif kind == b"X" and index < len(self.checks) and index not in results:
                stopped[index] = str(parse_info(payload).get("reason", "crash"))
                results[index] = [self._check_stopped(stopped[index])]
        verdicts = Verdicts(cells={self.cells[i][0]: text for i, text in cells.items()})
        for grade_id, _ in self.tests:
            verdicts.tests[grade_id] = {"passed": True, "messages": [], "stopped": [], "labels": []}
        for k, (grade_id, c) in enumerate(self.checks):
            verdicts.tests[grade_id]["labels"].append(
                f"{c.exercise_id} (part {c.part!r}" + (", hidden test)" if c.hidden else ")"))
            messages = results.get(k, [self._check_stopped("lost")])
            if k not in results:
                stopped[k] = "lost"
            if not messages:
                continue
            test = verdicts.tests[grade_id]
            test["passed"] = False
            where = f"part {c.part!r}" + (", a hidden test on inputs of your own" if c.hidden else "")
            test["messages"].append("\n".join([f"{c.exercise_id} ({where}): not yet"]
                                              + [f"  - {m}" for m in messages]))
            if k in stopped:
                test["stopped"].append(f"{grade_id}: {stopped[k]}")
        return verdicts

    def _cell_stopped(self, reason: str) -> str:
        if reason == "timeout":
            return (f"CellTimeoutError: this cell did not finish within {self.cell_limit:g} s when graded; "
                    "it was skipped and the cells after it ran without it.")
        if reason == "budget" and self.cut_short:
            return "CellTimeoutError: your notebooks used up the grading time a student gets in one run here."
        if reason == "budget":
            return f"CellTimeoutError: your notebook used up its {self.total_limit:g} s of grading time here."
        return (f"ProcessEnded: this cell ended the process that ran it ({reason}); it was skipped and "
                "the cells after it ran without it.")

    def _check_stopped(self, reason: str) -> str:
        if reason == "timeout":
            return (f"Too slow: this test cell did not finish within {self.cell_limit:g} s, so it was "
                    "stopped. Look for a loop that never ends or for work far bigger than the inputs need.")
        if reason == "budget" and self.cut_short:
            return ("Not run: your notebooks used up the grading time a student gets in one run (the "
                    "cells that were too slow are marked in each).")
        if reason == "budget":
            return (f"Not run: your notebook used up its {self.total_limit:g} s of grading time before "
                    "this test (see the cells that were too slow).")
        if reason == "garbled":
            return "Your code wrote into the grader's channel, so this test's result was lost."
        if reason == "lost":
            return "The process that graded your notebook stopped before this test ran (your code ended it)."
        return f"Your code ended the process that ran it ({reason})."


def grade_in_sandbox(submissions: list[Submission], forbidden: list[str | os.PathLike] = (),
                     sandbox: Sandbox | None = None) -> list[Verdicts]:
    """Run each submission (all of one student's, in order) in one sandbox and judge it.

    A submission that stops the sandbox itself loses the tests it had not run; the sandbox is
    started again for the next one. Raises :class:`.sandbox.SandboxUnavailable` when no sandbox
    can start.
    """
    own = sandbox is None
    sandbox = sandbox or Sandbox(forbidden)
    try:
        verdicts = []
        for sub in submissions:
            verdicts.append(sub.judge(sub.run(sandbox)))
        return verdicts
    finally:
        if own:
            sandbox.close()


def _text(source) -> str:
    return "".join(source) if isinstance(source, list) else source

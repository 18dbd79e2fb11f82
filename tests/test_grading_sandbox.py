"""The sandbox that records scores: real bubblewrap, hostile submissions, no mocks.

Each submission is a small notebook in the book's exercise format (code cells, then test cells of
``check(...)`` calls); :func:`grade_in_sandbox` runs it in a bubblewrap sandbox and judges the
results outside. The hostile cells try what a student could try: read or write the course folder,
the network, fork, patch the grader or PyTorch's comparisons, use the package's own answer, loop
forever, exhaust memory, flood the grader, exit, kill the grading process.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pathlib

import nbformat
import pytest

from attnbook_classroom.grading.sandbox import Sandbox, SandboxUnavailable, bwrap_command
from attnbook_classroom.grading.submission import Submission, BadTestCell, grade_in_sandbox, parse_test_cell

SECRET = bytes(range(32))
REPO = pathlib.Path(__file__).resolve().parents[1]


def notebook(cells: list[str], tests: dict[str, str]) -> nbformat.NotebookNode:
    """Code cells, then one locked test cell per (grade id, source)."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in cells]
    for grade_id, src in tests.items():
        cell = nbformat.v4.new_code_cell(src)
        cell.metadata["nbgrader"] = {"grade": True, "grade_id": grade_id, "locked": True, "points": 1,
                                     "schema_version": 3, "solution": False, "task": False}
        nb.cells.append(cell)
    return nb


def submission(nb, student="alice", **limits) -> Submission:
    return Submission(nb, secret=SECRET, student=student, assignment="hw", **{"cell_limit": 3.0,
                                                                                 "total_limit": 40.0, **limits})


def cell_errors(verdicts, nb) -> dict[str, str]:
    """First line of each cell's source -> what went wrong in it."""
    return {nb.cells[i].source.splitlines()[0]: text for i, text in verdicts.cells.items()}


@pytest.fixture(scope="module")
def course_folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("course")
    (root / "course_secret").write_text("00" * 32)
    (root / "source").mkdir()
    (root / "source" / "answers.txt").write_text("the instructor's solutions")
    return root


TOKEN = "attnbook-test-token-5c1e"  # in the grading process's environment while the hostile run is graded

# What a cell reads of the grading process (every /proc/<pid>/environ, the supervisor's pipes) or
# writes outside the private /tmp; each raises with what it saw, so the verdict carries it.
SNOOPING = [
    "import glob\nseen = b''\nfor p in glob.glob('/proc/[0-9]*/environ'):\n    try:\n        seen += open(p, 'rb').read()\n"
    "    except OSError as exc:\n        seen += str(exc).encode()\nraise RuntimeError(repr(seen))",
    "import os\nopened = []\nfor fd in os.listdir('/proc/1/fd'):\n    try:\n        os.open('/proc/1/fd/' + fd, os.O_WRONLY)\n"
    "        opened.append(fd)\n    except OSError:\n        pass\nraise RuntimeError(f'opened {opened}')",
    "open('/dev/shm/x', 'wb').write(b'x')",
    "open('/dev/x', 'wb').write(b'x')",
    "open('/x', 'wb').write(b'x')",
    "for i in range(6):\n    open(f'/tmp/fill{i}', 'wb').write(b'x' * (15 << 20))",
    "import os\nos.memfd_create('hidden')",
    "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
    "raise RuntimeError(f'shmget {libc.shmget(0, 1 << 30, 0o1777)} errno {ctypes.get_errno()}')",
    "import os, signal\nos.kill(1, signal.SIGINT)\nos.kill(1, signal.SIGKILL)",
    "import os\nos.execv('/bin/sh', ['sh', '-c', 'true'])",
]


@pytest.fixture(scope="module")
def hostile_run(course_folder):
    root = str(course_folder)
    cells = SNOOPING + [
        "import os, socket, torch",
        f"secret = open({root + '/course_secret'!r}).read()",
        f"open({root + '/pwned.txt'!r}, 'w').write('x')",
        "open('/tmp/scratch.txt', 'w').write('a private /tmp works')",
        f"seen = os.listdir({str(REPO)!r})\nassert not {{'chapters', 'tests', '_build', 'README.md'}} & set(seen), seen",
        "os.fork()",
        "socket.create_connection(('1.1.1.1', 53), timeout=2)",
        # patching the comparisons, the grader and its feedback
        "torch.allclose = lambda *a, **k: True\ntorch.equal = lambda *a, **k: True\n"
        "import attnbook_classroom.grading as g, attnbook_classroom.grading.compare as c\n"
        "g.Feedback.assert_passed = lambda self: self\nc.same = lambda *a, **k: True",
        "def wrong_mask(L, S):\n    return torch.zeros(L, S, dtype=torch.bool)",
        "def sneaky(L, S):\n    import attnbook_classroom.grading.harness as h\n"
        "    h.PendingPart.finish = lambda self, raws: []\n    return torch.zeros(L, S, dtype=torch.bool)",
        "from attnbook.masks import causal_mask\nborrowed = causal_mask",
        "def good(L, S):\n    return torch.ones(L, S, dtype=torch.bool).tril(S - L)",
        "def table(L, S):  # right on the visible sizes only\n"
        "    if (L, S) in ((5, 5), (3, 7), (1, 6), (5, 3)):\n        return good(L, S)\n"
        "    return torch.ones(L, S, dtype=torch.bool)",
        "os._exit(3)",
        "def looping(L, S):\n    while True:\n        pass",
        "def huge(L, S):\n    return torch.zeros(20_000_000)",
        "def hog(L, S):\n    return torch.empty(10**10)",
        "while True:\n    pass",
    ]
    tests = {
        "t-wrong": 'check("causal_mask", wrong_mask, part="square")',
        "t-sneaky": 'check("causal_mask", sneaky, part="square")',
        "t-borrowed": 'check("causal_mask", borrowed, part="square")',
        "t-good": 'check("causal_mask", good, part="square")\n### BEGIN HIDDEN TESTS\n'
                  'check("causal_mask", good, part="square", seed=1)\n### END HIDDEN TESTS',
        "t-table": 'check("causal_mask", table, part="more_keys")\n### BEGIN HIDDEN TESTS\n'
                   'check("causal_mask", table, part="more_keys", seed=1)\n### END HIDDEN TESTS',
        "t-looping": 'check("causal_mask", looping, part="square")\ncheck("causal_mask", looping, part="one_query")',
        "t-huge": 'check("causal_mask", huge, part="square")',
        "t-hog": 'check("causal_mask", hog, part="square")',
        "t-after": 'check("causal_mask", good, part="fewer_keys")',
    }
    hostile = notebook(cells, tests)
    killer = notebook(["import os, torch", "def killer(L, S):\n    os.kill(os.getppid(), 9)",
                       "def good(L, S):\n    return torch.ones(L, S, dtype=torch.bool).tril(S - L)"],
                      {"k1": 'check("causal_mask", killer, part="square")',
                       "k2": 'check("causal_mask", good, part="square")'})
    after = notebook(["import torch\ndef good(L, S):\n    return torch.ones(L, S, dtype=torch.bool).tril(S - L)"],
                     {"a1": 'check("causal_mask", good, part="square")'})
    subs = [submission(hostile), submission(killer), submission(after)]
    os.environ["ATTNBOOK_TEST_TOKEN"] = TOKEN
    try:
        with Sandbox([course_folder]) as sandbox:
            verdicts = grade_in_sandbox(subs, sandbox=sandbox)
    finally:
        del os.environ["ATTNBOOK_TEST_TOKEN"]
    return hostile, verdicts


def test_nothing_of_the_grading_process_is_reachable_and_only_tmp_is_writable(hostile_run):
    """The environment of the grading process (and of bubblewrap) never reaches the sandbox; the
    sandbox's process 1 is the runner, whose pipes a worker cannot open and which ignores its
    signals; /dev/shm, /dev and / are read-only; /tmp is capped; memory no limit counts (memfd,
    System V shared memory) and exec are refused."""
    nb, (verdicts, _, _) = hostile_run
    errors = [verdicts.cells.get(i) for i in range(len(SNOOPING))]
    environ, pipes, shm, dev, root, fill, memfd, shmget, signals, execv = errors
    assert TOKEN not in environ and "PATH=/usr/bin:/bin" in environ, environ  # the runner's own, set here
    assert "Permission denied: '/proc/1/environ'" in environ  # process 1 is the runner, not dumpable
    assert pipes == "RuntimeError: opened []", pipes
    for error in (shm, dev, root):
        assert error.startswith("OSError") and "Read-only file system" in error, error
    assert "No space left on device" in fill, fill
    assert memfd.startswith("PermissionError") and execv.startswith("PermissionError"), (memfd, execv)
    assert shmget == "RuntimeError: shmget -1 errno 1", shmget
    assert signals is None or "ProcessEnded" not in signals  # the runner survived SIGINT and SIGKILL
    assert not any(TOKEN in text for text in verdicts.cells.values())


def test_hostile_cells_cannot_reach_the_course_the_network_or_new_processes(hostile_run, course_folder):
    nb, (verdicts, _, _) = hostile_run
    errors = cell_errors(verdicts, nb)
    assert errors["secret = open(" + repr(str(course_folder) + "/course_secret") + ").read()"].startswith(
        "FileNotFoundError")
    assert errors[f"open({str(course_folder) + '/pwned.txt'!r}, 'w').write('x')"].startswith(
        ("FileNotFoundError", "OSError"))
    assert not (course_folder / "pwned.txt").exists()
    assert "open('/tmp/scratch.txt', 'w').write('a private /tmp works')" not in errors
    assert f"seen = os.listdir({str(REPO)!r})" not in errors  # only Python, the package and data/ are there
    assert errors["os.fork()"].startswith("PermissionError")
    assert errors["socket.create_connection(('1.1.1.1', 53), timeout=2)"].startswith("OSError")
    assert "ProcessEnded" in errors["os._exit(3)"] and "exited with code 3" in errors["os._exit(3)"]
    assert "CellTimeoutError" in errors["while True:"]


def test_patching_the_grader_or_torch_changes_no_verdict(hostile_run):
    _, (verdicts, _, _) = hostile_run
    assert not verdicts.tests["t-wrong"]["passed"]
    assert "differs from the expected one" in verdicts.tests["t-wrong"]["messages"][0]
    assert not verdicts.tests["t-sneaky"]["passed"]


def test_the_package_answer_is_unavailable_and_a_table_of_visible_answers_fails(hostile_run):
    _, (verdicts, _, _) = hostile_run
    borrowed = verdicts.tests["t-borrowed"]
    assert not borrowed["passed"] and "not available while this exercise is graded" in borrowed["messages"][0]
    table = verdicts.tests["t-table"]
    assert not table["passed"] and len(table["messages"]) == 1 and "hidden test" in table["messages"][0]
    assert verdicts.tests["t-good"]["passed"] and verdicts.tests["t-after"]["passed"]


def test_endless_loops_huge_results_and_memory_bombs_lose_only_their_own_tests(hostile_run):
    _, (verdicts, _, _) = hostile_run
    looping = verdicts.tests["t-looping"]
    assert not looping["passed"] and "Too slow" in looping["messages"][0] and len(looping["messages"]) == 2
    assert not verdicts.tests["t-huge"]["passed"]
    hog = verdicts.tests["t-hog"]
    assert not hog["passed"] and "allocate" in hog["messages"][0]
    assert any("timeout" in m for m in verdicts.failures())


def test_killing_the_grading_process_changes_nothing(hostile_run):
    """The runner is the sandbox's process 1: a signal from a worker is ignored."""
    _, (_, killed, after) = hostile_run
    assert not killed.tests["k1"]["passed"] and killed.tests["k2"]["passed"]
    assert after.tests["a1"]["passed"]


def test_hidden_checks_are_seeded_per_student():
    nb = notebook(["def f(L, S):\n    pass"], {"t": 'check("causal_mask", f, part="square")\n'
                                                    '### BEGIN HIDDEN TESTS\ncheck("causal_mask", f, '
                                                    'part="square", seed=1)\n### END HIDDEN TESTS'})
    seeds = {s: [c.seed for _, c in submission(nb, student=s).checks] for s in ("alice", "bob")}
    assert seeds["alice"][0] == seeds["bob"][0] == 0
    assert seeds["alice"][1] not in (0, 1) and seeds["alice"][1] != seeds["bob"][1]
    alice, bob = (submission(nb, student=s).pending[1].specs for s in ("alice", "bob"))
    assert alice != bob  # different sizes, not only different values


def test_test_cells_must_be_lists_of_checks():
    assert [c.part for c in parse_test_cell('check("causal_mask", f, part=None)')] == [
        "square", "more_keys", "one_query", "fewer_keys"]
    for bad in ("assert f(2) == 4", 'check(name, f, part="square")', 'check("causal_mask", f, part="nope")'):
        with pytest.raises(BadTestCell):
            parse_test_cell(bad, "cell-1")


def test_a_course_folder_the_sandbox_could_read_is_refused():
    with pytest.raises(SandboxUnavailable, match="lies inside"):
        bwrap_command([os.path.join(sys.prefix, "course")])


def test_grading_refuses_without_bubblewrap(tmp_path):
    (tmp_path / "submitted").mkdir()
    env = {**os.environ, "PATH": os.path.dirname(sys.executable)}  # no /usr/bin: no bwrap
    result = subprocess.run([sys.executable, "-m", "attnbook_classroom.course", "grade", "--root", str(tmp_path)],
                            capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode != 0
    assert "Not grading" in result.stderr and "bubblewrap" in result.stderr
    assert not (tmp_path / "grades.csv").exists()


def test_every_chapters_solutions_pass_every_test_in_the_sandbox():
    """Each chapter's exercise notebook, answered with its own solutions (hidden tests in), graded
    as a class's would be: every test cell passes and no cell fails. (An exercise that blocks a
    name another exercise's experiment needs, or a solution too slow for the cell limit, fails here.)"""
    from attnbook_classroom.course.notebooks import exercise_notebook, toc_chapters

    chapters = toc_chapters()
    subs = [Submission(exercise_notebook(chapter), secret=SECRET, student="solver", assignment=chapter.stem)
            for chapter in chapters]
    with Sandbox([]) as sandbox:
        verdicts = grade_in_sandbox(subs, sandbox=sandbox)
    failed = {(chapter.stem, grade_id): test["messages"] for chapter, v in zip(chapters, verdicts)
              for grade_id, test in v.tests.items() if not test["passed"]}
    broken = {(chapter.stem, index): text for chapter, v in zip(chapters, verdicts) for index, text in v.cells.items()}
    assert not failed and not broken, (failed, broken)
    assert all(v.tests for v in verdicts)

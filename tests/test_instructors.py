"""The instructors' page reports the grading benchmark as `make grade-bench RECORD=1` measured it,
and the workflow's commands as the Makefile runs them.

The benchmark's table is generated from data/grade_bench.json (written by the benchmark, listed in
data/manifest.json) by :func:`attnbook_classroom.course.bench.table`, and must stand on the page
word for word between its markers, so the page cannot drift from the measurement; the verdict on the
target (the honest class of 100 students x every chapter within 10 minutes on 2 cores) is part of it.
"""

from __future__ import annotations

import json
import pathlib

from attnbook_tools.datafiles import verified

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGE = ROOT / "chapters" / "instructors.md"
RECORD = ROOT / "data" / "grade_bench.json"
BLOCK = ("<!-- grade-bench -->", "<!-- /grade-bench -->")
TABLE = ("<!-- grade-bench table: generated from data/grade_bench.json by "
         "`python -m attnbook_classroom.course.bench --table`; do not edit by hand -->\n", "<!-- grade-bench table: end -->")


def test_the_page_shows_the_recorded_grading_benchmark():
    from attnbook_classroom.course.bench import HOSTILE, table

    result = json.loads(verified(RECORD).read_text())
    honest, hostile = result["honest"], result["hostile"]
    assert honest["students"] >= 100 and hostile["students"] == len(HOSTILE) and result["cores"] <= 2, (
        "the benchmark must be the full one: re-run `make grade-bench RECORD=1`")
    assert honest["chapters"] == hostile["chapters"] == len(list((ROOT / "src/attnbook_classroom/grading").glob("ch*.py"))), (
        "the benchmark must cover every chapter's exercises; re-run `make grade-bench RECORD=1`")
    assert set(hostile["kinds"]) == set(HOSTILE) and not honest["problems"] and not hostile["problems"]
    page = PAGE.read_text(encoding="utf-8")
    assert page.count(BLOCK[0]) == 1 and page.count(BLOCK[1]) == 1, "the grade-bench block's markers are missing"
    block = page.split(BLOCK[0], 1)[1].split(BLOCK[1], 1)[0]
    assert TABLE[0] in block and TABLE[1] in block, "the grade-bench table's markers are missing"
    shown = block.split(TABLE[0], 1)[1].split(TABLE[1], 1)[0]
    assert shown == table(result), (
        "chapters/instructors.md's grade-bench table differs from data/grade_bench.json: paste the output of "
        "`python -m attnbook_classroom.course.bench --table` between its markers")


def test_every_make_command_of_the_workflow_exists_and_runs_the_course():
    """The workflow's commands, as the page writes them: each `make` line is a target of the
    Makefile that runs the course's command line (which sets nbgrader's PATH itself), so none
    needs an activated environment. The workflow tests run those command lines for real."""
    import shlex
    import subprocess

    blocks = [part.split("```", 1)[0] for part in PAGE.read_text().split("```console")[1:]]
    commands = [[line.strip()[2:].split("#")[0].strip() for line in block.splitlines()
                 if line.strip().startswith("$ make")] for block in blocks]
    assert [c.split()[1] for c in commands[0]] == ["assignments", "release", "collect", "grade", "formgrader", "feedback"]
    assert any(c.startswith("make student-env PREFIX=") for block in commands for c in block)
    for command in [c for block in commands for c in block]:
        dry = subprocess.run(shlex.split(command) + ["-n", "-C", str(ROOT)], capture_output=True, text=True, timeout=60)
        assert dry.returncode == 0, (command, dry.stderr)
        assert "-m attnbook_classroom.course" in dry.stdout, (command, dry.stdout)


def test_the_page_lists_the_classic_bugs_as_the_grader_names_them():
    from attnbook_classroom.grading.museum import misconceptions_table

    page = (ROOT / "chapters" / "instructors.md").read_text(encoding="utf-8")
    begin = "<!-- misconceptions: generated from attnbook_classroom.grading.museum; do not edit by hand -->\n"
    assert begin in page and "<!-- misconceptions: end -->" in page, "the generated table's markers are missing"
    shown = page.split(begin, 1)[1].split("<!-- misconceptions: end -->", 1)[0]
    assert shown == misconceptions_table(), (
        "chapters/instructors.md's table of classic bugs differs from what the grader names: paste the "
        "output of `python -m attnbook_classroom.grading.museum` between its markers")

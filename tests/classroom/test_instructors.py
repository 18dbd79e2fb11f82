"""The instructors' page reports the grading benchmark as `make grade-bench RECORD=1` measured it,
and the workflow's commands as the Makefile runs them.

The sentence with the numbers is generated here from data/grade_bench.json (written by the
benchmark, listed in data/manifest.json), so the page cannot drift from the measurement, and
what the page says of the target (100 students x every chapter in under 15 minutes on 2 cores)
is checked against the recorded time: "within" only if it was, "over" if it was not.
"""

from __future__ import annotations

import json
import pathlib
import re

from attnbook_tools.datafiles import verified

ROOT = pathlib.Path(__file__).resolve().parents[2]
PAGE = ROOT / "chapters" / "instructors.md"
RECORD = ROOT / "data" / "grade_bench.json"
TARGET_MINUTES = 15


def bench_sentence(result: dict) -> str:
    """The sentence the page must contain, from the recorded result (both classes)."""
    honest, hostile = result["honest"], result["hostile"]
    kinds = ", ".join(f"{n} who {k}" for k, n in hostile["hostile_students"].items())
    return (f"On {result['date']}, `make grade-bench` graded {honest['students']} students × "
            f"{honest['chapters']} chapters ({honest['notebooks']} notebooks) on {result['cores']} cores "
            f"({result['cpu']}, PyTorch {result['torch']}) in {honest['grade_seconds'] / 60:.1f} minutes "
            f"({honest['seconds_per_notebook']:.2f} s a notebook) for an honest class, and in "
            f"{hostile['grade_seconds'] / 60:.1f} minutes ({hostile['seconds_per_notebook']:.2f} s a notebook) "
            f"for a class with {sum(hostile['hostile_students'].values())} hostile students ({kinds}).")


def _page_text() -> str:
    return re.sub(r"\s+", " ", PAGE.read_text())


def test_the_page_reports_the_recorded_grading_benchmark():
    result = json.loads(verified(RECORD).read_text())
    assert bench_sentence(result) in _page_text(), (
        f"chapters/instructors.md must say, word for word:\n{bench_sentence(result)}")


def target_sentence(result: dict) -> str:
    """What the page must say of the target, given the recorded time of the honest class."""
    verdict = "within" if result["honest"]["grade_seconds"] < TARGET_MINUTES * 60 else "over"
    return f"The honest class is {verdict} the book's target of {TARGET_MINUTES} minutes for 100 students on 2 cores."


def test_the_page_says_whether_the_recorded_benchmark_meets_the_target():
    result = json.loads(verified(RECORD).read_text())
    assert result["honest"]["students"] >= 100 and result["cores"] <= 2
    assert result["hostile"]["students"] == result["honest"]["students"]
    assert result["honest"]["chapters"] == len(list((ROOT / "src/attnbook_classroom/grading").glob("ch*.py"))), (
        "the benchmark must cover every chapter's exercises; re-run `make grade-bench RECORD=1`")
    assert target_sentence(result) in _page_text(), (
        f"chapters/instructors.md must say, word for word:\n{target_sentence(result)}")


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

"""`make grade-bench`'s own code on a tiny class: one chapter, three honest students and two hostile
ones, graded through `make grade`'s path (nbgrader's autograde, the bubblewrap sandbox), with short
limits. The full bench (100 students x every chapter, 10 hostile students) is not part of `make test`.
"""

from __future__ import annotations

import dataclasses

import pytest

from attnbook_classroom.course import build_assignments
from attnbook_classroom.course.bench import HOSTILE, NOTEBOOK_OVERHEAD, run_class, verify
from attnbook_classroom.course.bench_class import exercises
from attnbook_classroom.course.folder import limits
from bookbuild.notebooks import toc_chapters

CHAPTER = "03_scaled_dot_product"


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    root = tmp_path_factory.mktemp("bench")
    course = root / "course"
    build_assignments(course, notebooks=[p for p in toc_chapters() if p.stem == CHAPTER], exchange=root / "exchange")
    (course / "nbgrader_config_local.py").write_text(
        "c.SandboxedGrading.cell_timeout = 2.0\nc.SandboxedGrading.notebook_timeout = 4.0\n"
        "c.SandboxedGrading.student_timeout = 6.0\n")
    return course


def test_a_tiny_class_gets_exactly_its_scores_and_the_bench_sees_a_wrong_one(course):
    result = run_class(course, ["correct", "unfinished", "blank"])
    assert result["problems"] == [], result["problems"]
    assert result["notebooks"] == 3 and result["notebook_seconds"]["max"] > 0
    # the check that passed can fail: a correct student expected to score nothing
    wrong = verify(course, {"s000": {"kind": "correct", "expected": {CHAPTER: 0.0}}}, limits(course))
    assert len(wrong) == 1 and "expected 0 of" in wrong[0], wrong


def test_hostile_students_cost_no_more_than_their_limits_and_the_bench_sees_one_over(course):
    result = run_class(course, ["loop", "fork"])
    assert result["problems"] == [], result["problems"]
    loop = result["kinds"]["loop"]  # it used up its notebook's 4 s, and no more
    assert 4.0 <= loop["notebook_sandbox_seconds_max"] <= 4.0 + NOTEBOOK_OVERHEAD, loop
    assert result["kinds"]["fork"]["student_seconds_max"] < loop["student_seconds_max"]
    roster = {"h000": {"kind": "loop", "expected": {CHAPTER: None}}}
    tight = dataclasses.replace(limits(course), notebook=-20.0, student=-60.0)
    over = verify(course, roster, tight)
    assert any("in the sandbox, over" in p for p in over) and any("in all, over" in p for p in over), over


def test_the_unfinished_exercise_is_one_nothing_else_uses():
    import nbformat

    from attnbook_classroom.course.notebooks import exercise_notebook

    nb = exercise_notebook(next(p for p in toc_chapters() if p.stem == "07_masking"))
    picks = {e["solution"]: e for e in exercises(nb)}
    # chapter 7's masked softmax is used by nothing else in its notebook; its five test cells follow it
    assert picks["ch07-masked-softmax-solution"]["points"] == 5
    assert len(HOSTILE) == 10 and isinstance(nb, nbformat.NotebookNode)


def _put_many(folder: str, key: str, times: int) -> None:
    from attnbook_classroom.course.folder import verdict_cache
    from attnbook_classroom.grading.submission import Verdicts

    cache, verdicts = verdict_cache(folder), Verdicts({"a-test": {"passed": True, "messages": []}})
    for _ in range(times):
        cache.put(key, verdicts)


def test_two_workers_may_cache_the_same_verdicts_at_once(tmp_path):
    """Two students who hand in the same notebook have the same submission key: the two workers
    grading them may write its verdicts at the same moment, and both must succeed (the bench's
    class of identical solutions met this)."""
    import multiprocessing

    from attnbook_classroom.course.folder import verdict_cache

    context = multiprocessing.get_context("fork")
    writers = [context.Process(target=_put_many, args=(str(tmp_path), "k" * 64, 300)) for _ in range(3)]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join(60)
    assert [w.exitcode for w in writers] == [0, 0, 0]
    assert verdict_cache(tmp_path).get("k" * 64) is not None
    assert [p.name for p in (tmp_path / ".grading" / "verdicts").iterdir()] == ["k" * 64 + ".json"]

"""The teaching guide (chapters/instructors.md), its discussion questions (chapters/discussion.md)
and the classroom appendix (chapters/appendix_classroom.md) say what the book and the grader do.

The appendix reports the grading benchmark as `make grade-bench RECORD=1` measured it, and the
workflow's commands as the Makefile runs them.

The sentence with the numbers is generated here from data/grade_bench.json (written by the
benchmark, listed in data/manifest.json), so the page cannot drift from the measurement, and
what the page says of the target (100 students x every chapter in under 15 minutes on 2 cores)
is checked against the recorded time: "within" only if it was, "over" if it was not.
"""

from __future__ import annotations

import json
import pathlib
import re

import pytest

from attnbook_tools.datafiles import verified

ROOT = pathlib.Path(__file__).resolve().parents[2]
PAGE = ROOT / "chapters" / "appendix_classroom.md"  # the workflow, the sandbox, the threat model
GUIDE = ROOT / "chapters" / "instructors.md"  # the teaching guide
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
        "chapters/appendix_classroom.md's grade-bench table differs from data/grade_bench.json: paste the output of "
        "`python -m attnbook_classroom.course.bench --table` between its markers")


def _page_text(page: pathlib.Path = PAGE) -> str:
    return re.sub(r"\s+", " ", page.read_text())


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


def test_the_guide_states_the_recorded_grading_time():
    result = json.loads(verified(RECORD).read_text())
    minutes = f"graded in {result['honest']['grade_seconds'] / 60:.1f} minutes on {result['cores']} cores"
    assert minutes in _page_text(GUIDE), f"chapters/instructors.md must say {minutes!r}, as recorded"
    load = f"load average {result['honest']['load_average']['mean']:.1f} on average"
    assert load in _page_text(GUIDE), f"chapters/instructors.md must say {load!r}, as recorded"
    hostile = f"took {result['hostile']['grade_seconds'] / 60:.1f} minutes"
    assert hostile in _page_text(GUIDE), f"chapters/instructors.md must say the hostile class {hostile!r}, as recorded"


# --- the outcomes map ----------------------------------------------------------------------------

def test_every_exercise_of_every_chapter_is_mapped_to_an_outcome():
    from attnbook_classroom import grading
    from attnbook_classroom.course.guide import OUTCOMES, chapter_exercises

    exercises = chapter_exercises()
    in_chapters = {e.id for e in exercises}
    assert in_chapters == set(grading.exercise_ids()), "the chapters' test cells and the grader disagree"
    for chapter in dict.fromkeys(e.chapter for e in exercises):
        mapped = {i for _, ids in OUTCOMES.get(chapter, []) for i in ids}
        its = {e.id for e in exercises if e.chapter == chapter}
        assert mapped == its, (
            f"{chapter}: every exercise id must be mapped to an outcome in attnbook_classroom/course/guide.py's "
            f"OUTCOMES, and only its own: missing {sorted(its - mapped)}, unknown {sorted(mapped - its)}")
    assert set(OUTCOMES) <= {e.chapter for e in exercises}, "OUTCOMES names a chapter without exercises"


def test_the_guide_counts_the_exercises():
    from attnbook_classroom.course.guide import chapter_exercises

    count = f"{len(chapter_exercises())} in all"
    assert count in _page_text(GUIDE), f"chapters/instructors.md must count the exercises: {count!r}"


def test_the_appendix_says_what_each_exercise_asks_for():
    from attnbook_classroom import grading

    table = PAGE.read_text(encoding="utf-8").split("## The exercises and what each asks for", 1)[1].split("\n## ", 1)[0]
    missing = [e for e in grading.exercise_ids() if f"| `{e}` |" not in table]
    assert not missing, f"chapters/appendix_classroom.md's table of exercises does not list {missing}"


def test_the_guide_shows_the_outcomes_map_as_generated():
    from attnbook_classroom.course.guide import BEGIN, END, outcomes_markdown

    page = GUIDE.read_text(encoding="utf-8")
    assert BEGIN in page and END in page, "the outcomes map's markers are missing"
    shown = BEGIN + page.split(BEGIN, 1)[1].split(END, 1)[0] + END + "\n"
    assert shown == outcomes_markdown(), (
        "chapters/instructors.md's outcomes map differs from the chapters' exercises: paste the output of "
        "`python -m attnbook_classroom.course.guide` in its place")


# --- the course plans ----------------------------------------------------------------------------

def _intro_times() -> dict[str, tuple[int, int]]:
    rows = re.findall(r"^\|\s*\{doc\}`([^`]+)`\s*\|[^|]*\|\s*(\d+) min\s*\|\s*(\d+) s\s*\|",
                      (ROOT / "chapters" / "intro.md").read_text(), re.M)
    return {doc: (int(minutes), int(seconds)) for doc, minutes, seconds in rows}


def _plan(title: str) -> list[dict]:
    text = GUIDE.read_text(encoding="utf-8").split(f"### {title}\n", 1)[1].split("\n#", 1)[0]
    rows = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 6 and cells[0].isdigit():
            rows.append({"week": int(cells[0]), "docs": re.findall(r"\{doc\}`([^`]+)`", cells[1]),
                         "reading": cells[2], "running": cells[3],
                         "core": [n.strip() for n in cells[4].split(",") if n.strip()],
                         "stretch": [n.strip() for n in cells[5].split(",") if n.strip()]})
    return rows


@pytest.mark.parametrize("title", ["A 4-week module", "A 12-week course"])
def test_each_week_of_a_course_plan_states_the_intros_times_and_real_exercises(title):
    from attnbook_classroom.course.guide import chapter_exercises

    times, rows = _intro_times(), _plan(title)
    assert [r["week"] for r in rows] == list(range(1, len(rows) + 1)) and rows, f"{title}: no table of weeks"
    numbers = {}
    for e in chapter_exercises():
        numbers.setdefault(e.number, e.chapter)
    seen = []
    for row in rows:
        reading = sum(times[d][0] for d in row["docs"])
        running = sum(times[d][1] for d in row["docs"])
        assert row["reading"] == f"{reading} min", (title, row["week"], "the intro's reading times add up to", reading)
        assert row["running"] == f"{running} s", (title, row["week"], "the intro's running times add up to", running)
        for number in row["core"] + row["stretch"]:
            assert numbers.get(number) in row["docs"], f"{title}, week {row['week']}: no exercise {number} in its chapters"
        seen += row["core"] + row["stretch"]
    assert len(seen) == len(set(seen)), f"{title}: an exercise is planned twice"
    if title == "A 12-week course":  # every exercise of the chapters it plans, once
        planned = {d for row in rows for d in row["docs"]}
        assert sorted(seen) == sorted(n for n, chapter in numbers.items() if chapter in planned)


# --- the discussion questions --------------------------------------------------------------------

def test_every_chapter_has_two_or_three_discussion_questions_with_a_folded_model_answer():
    from attnbook_classroom.course.guide import DISCUSSION, chapter_exercises, discussion_by_chapter

    questions = discussion_by_chapter()
    for chapter in dict.fromkeys(e.chapter for e in chapter_exercises()):
        pairs = questions.get(chapter, [])
        assert 2 <= len(pairs) <= 3, (
            f"chapters/discussion.md: {chapter} has {len(pairs)} questions; give each chapter a '## Chapter N' "
            "section with two or three, each followed by its folded model answer")
        for question, answer in pairs:
            assert question.endswith("?") and len(answer.split()) >= 20, (chapter, question, answer)
    text = DISCUSSION.read_text(encoding="utf-8")
    assert text.count(":class: dropdown") == sum(len(p) for p in questions.values()), (
        "every model answer is folded (an admonition 'A model answer' with :class: dropdown)")


def test_the_course_seals_the_model_answers(tmp_path):
    """`make assignments` gives the instructor the model answers in the course folder, readable by
    them only, and puts none in what students receive: nbgrader's release/ and the exchange."""
    import stat

    from attnbook_classroom.course import build_assignments
    from attnbook_classroom.course.guide import model_answers

    course, exchange = tmp_path / "course", tmp_path / "exchange"
    build_assignments(course, [ROOT / "chapters" / "07_masking.ipynb"], exchange)
    answers = [" ".join(a.split()) for a in model_answers()]
    copy = course / "instructor" / "discussion.md"
    assert all(a[:80] in " ".join(copy.read_text().split()) for a in answers)
    assert stat.S_IMODE(copy.parent.stat().st_mode) == 0o700 and stat.S_IMODE(course.stat().st_mode) == 0o700
    received = [p for folder in (course / "release", course / "source", exchange) for p in folder.rglob("*") if p.is_file()]
    assert any(p.suffix == ".ipynb" for p in received)
    for path in received:
        text = path.read_text(encoding="utf-8", errors="replace")
        if path.suffix == ".ipynb":  # the cells' text, not its JSON escapes
            text = "\n".join("".join(c["source"]) for c in json.loads(text)["cells"])
        text = " ".join(text.split())
        leaked = [a[:60] for a in answers if a[:60] in text]
        assert not leaked, f"{path.relative_to(tmp_path)} holds model answers: {leaked[:2]}"

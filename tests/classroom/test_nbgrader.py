"""The classroom workflow with the real nbgrader, real bubblewrap and real submissions (no mocks).

A small assignment written here (exercise cells in the book's format, a hand-graded written answer)
and the real exercise notebook of chapter 7 are released; a handful of students submit: the
instructor's solutions, an unanswered copy, typical mistakes, hostile code, a late submission, one
through nbgrader's exchange; ``python -m attnbook_classroom.course grade`` grades them; nbgrader's own commands
then regrade, give feedback and hand it back. Then every chapter is released and checked.
"""

from __future__ import annotations

import csv
import re
import json
import os
import pathlib
import subprocess
import sys

import nbformat
import pytest

from attnbook_classroom.course import build_assignments, export_csv, grade, graded_cells
from bookbuild.notebooks import student_exercise_cells, toc_chapters
from attnbook_classroom.course.folder import api

ROOT = pathlib.Path(__file__).resolve().parents[2]
PY = sys.executable
ENV = {**os.environ, "PATH": str(pathlib.Path(PY).parent) + os.pathsep + os.environ.get("PATH", ""),
       "OMP_NUM_THREADS": "1"}
NAME, CHAPTER = "tiny", "07_masking"


def _cell(cell_type, source, nbgrader=None, tags=None):
    meta = {}
    if nbgrader:
        meta["nbgrader"] = {"schema_version": 3, "task": False, **nbgrader}
    if tags:
        meta["tags"] = tags
    cell = {"cell_type": cell_type, "metadata": meta, "source": source}
    if cell_type == "code":
        cell.update(execution_count=None, outputs=[])
    return cell


# The instructor's solutions; each mistake below replaces one of them.
SOLUTIONS = {
    "softmax": """
def my_softmax(scores, mask):
    ### BEGIN SOLUTION
    filled = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    return torch.softmax(filled, dim=-1).masked_fill(~mask, 0.0)
    ### END SOLUTION""",
    "attention": """
def my_attention(q, k, v, mask=None):
    ### BEGIN SOLUTION
    return masked_softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), mask) @ v
    ### END SOLUTION""",
    "selfatt": """
def my_self_attention(x, W_q, W_k, W_v, mask=None):
    ### BEGIN SOLUTION
    q, k, v = x @ W_q.T, x @ W_k.T, x @ W_v.T
    return masked_softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), mask) @ v
    ### END SOLUTION""",
    "step": """
def my_step(decoder_state, encoder_states, key_mask):
    ### BEGIN SOLUTION
    weights = masked_softmax((encoder_states @ decoder_state[:, :, None])[..., 0], key_mask)
    return (weights[:, :, None] * encoder_states).sum(1), weights
    ### END SOLUTION""",
    "causal": """
def my_causal(L, S):
    ### BEGIN SOLUTION
    return torch.ones(L, S, dtype=torch.bool).tril(S - L)
    ### END SOLUTION""",
    "pick": """
picks = {}
### BEGIN SOLUTION
picks = {"square": "AC", "cache": "C"}
### END SOLUTION""",
    "split": """
def my_split(x, num_heads):
    ### BEGIN SOLUTION
    B, L, E = x.shape
    return x.reshape(B, L, num_heads, E // num_heads).transpose(1, 2)
    ### END SOLUTION""",
    "module": """
from torch import nn

class MyMHA(nn.Module):
    def __init__(self, embed_dim, num_heads):
        super().__init__()
        self.h = num_heads
        ### BEGIN SOLUTION
        self.layers = nn.ModuleList(nn.Linear(embed_dim, embed_dim, bias=False) for _ in range(4))
        ### END SOLUTION

    def forward(self, query, key, value, mask=None):
        ### BEGIN SOLUTION
        B, L, E = query.shape
        q, k, v = (p(t).reshape(B, -1, self.h, E // self.h).transpose(1, 2)
                   for p, t in zip(self.layers, (query, key, value)))
        o = masked_softmax(q @ k.transpose(-2, -1) / math.sqrt(E // self.h),
                           None if mask is None else mask[:, None]) @ v
        return self.layers[3](o.transpose(1, 2).reshape(B, L, E))
        ### END SOLUTION""",
}

TESTS = {  # exercise key -> (exercise id, the student's name, parts, the part with a hidden test)
    "softmax": ("masked_softmax", "my_softmax", ["values", "fully_masked", "fp16"], "values"),
    "attention": ("scaled_dot_product_attention", "my_attention", ["no_mask", "heads", "fp16"], "heads"),
    "selfatt": ("self_attention", "my_self_attention", ["values", "mask"], None),
    "step": ("seq2seq_attention_step", "my_step", ["values", "empty_source"], None),
    "causal": ("causal_mask", "my_causal", ["square", "more_keys"], "more_keys"),
    "pick": ("pick_causal_mask", "picks", ["square", "cache"], None),
    "split": ("split_heads", "my_split", ["values", "one_head"], None),
    "module": ("multi_head_forward", "MyMHA", ["structure", "values"], None),
}
HIDDEN_MARK = "seed=7"
# A given cell. This notebook asks for a masked softmax, so the package's own is unavailable to the
# students' code while it is graded: the other exercises use this one.
GIVEN = """import math

import torch
from attnbook_classroom.grading import check


def masked_softmax(scores, mask=None):
    if mask is None:
        return torch.softmax(scores, dim=-1)
    filled = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    return torch.softmax(filled, dim=-1).masked_fill(~mask, 0.0)"""
AUTOGRADED_POINTS = sum(len(t[2]) for t in TESTS.values())
WRITTEN = ("Why must a causal mask let a token see itself?\n\n<!-- BEGIN SOLUTION -->\n"
           "Its own token is the last input it has: without it the first position sees nothing at all.\n"
           "<!-- END SOLUTION -->")


def tiny_notebook() -> dict:
    cells = [_cell("markdown", "# A tiny assignment"),
             _cell("code", GIVEN, {"grade": False, "grade_id": "imports", "locked": True, "solution": False})]
    for key, solution in SOLUTIONS.items():
        ex_id, name, parts, hidden = TESTS[key]
        cells.append(_cell("markdown", f"## {ex_id}"))
        cells.append(_cell("code", solution.strip("\n"),
                           {"grade": False, "grade_id": f"{key}-solution", "locked": False, "solution": True},
                           tags=["hide-input"]))
        for part in parts:
            src = f'check("{ex_id}", {name}, part="{part}").assert_passed()'
            if part == hidden:
                src += (f'\n### BEGIN HIDDEN TESTS\ncheck("{ex_id}", {name}, part="{part}", {HIDDEN_MARK})'
                        '.assert_passed()\n### END HIDDEN TESTS')
            cells.append(_cell("code", src, {"grade": True, "grade_id": f"{key}-{part}", "locked": True,
                                             "points": 1, "solution": False}))
    cells.append(_cell("markdown", WRITTEN.split("\n\n")[0]))
    cells.append(_cell("markdown", WRITTEN.split("\n\n", 1)[1], {"grade": True, "grade_id": "written-causal",
                                                                  "locked": False, "points": 2, "solution": True}))
    for index, cell in enumerate(cells):
        cell["id"] = f"tiny-{index}"
    return {"cells": cells, "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                         "language": "python"}},
            "nbformat": 4, "nbformat_minor": 5}


# Submissions: each replaces some solutions with typical mistakes (or hostile code); the phrases the
# feedback in the autograded notebook must show.
MISTAKES = {
    "student_a": {
        "softmax": ("torch.softmax(scores.masked_fill(~mask, -1e9), dim=-2)",
                    ["instead of over the keys", "does not fit in float16"]),
        "attention": ("masked_softmax(q @ k.transpose(-2, -1), mask) @ v", ["not scaled"]),
        "selfatt": ("masked_softmax((x @ W_q.T) @ (x @ W_k.T).transpose(-2, -1) / math.sqrt(W_q.shape[0]), "
                    "None if mask is None else ~mask) @ (x @ W_v.T)", ["polarity is inverted"]),
        "step": ("(lambda w: ((w[:, :, None] * encoder_states).sum(1), w))(torch.softmax("
                 "(encoder_states @ decoder_state[:, :, None])[..., 0].masked_fill(~key_mask, float('-inf')), -1))",
                 ["NaN"]),
        "causal": ("torch.ones(L, S, dtype=torch.bool).tril(S - L - 1)", ["excludes the diagonal"]),
        "split": ("x.view(x.shape[0], num_heads, x.shape[1], -1)", ["without a transpose"]),
        "module": ("self.layers = [nn.Linear(embed_dim, embed_dim, bias=False) for _ in range(4)]",
                   ["plain Python list"]),
    },
    "student_b": {
        "softmax": ("torch.softmax(scores, dim=-1) * mask", ["mask after the softmax"]),
        "attention": ("masked_softmax(q @ k.T / math.sqrt(q.shape[-1]), mask) @ v", ["LAST TWO axes"]),
        "selfatt": ("masked_softmax((x @ W_q.T) @ (x @ W_k.T).transpose(-2, -1) / W_q.shape[0], mask) @ (x @ W_v.T)",
                    ["divided the scores by D"]),
        "step": ("{}['boom']", ["KeyError"]),
        "causal": ("torch.ones(L, S, dtype=torch.bool).tril()", ["aligned to the top left"]),
        "pick": ('{"square": "ACD", "cache": "AC"}', ["future", "top left"]),
        "split": ("[0 for _ in iter(int, 1)]", ["Too slow"]),
        "module": ("self.layers = nn.ModuleList(nn.Linear(embed_dim, embed_dim, bias=False) for _ in range(3))",
                   ["output projection"]),
    },
}


def hostile_bodies(course: pathlib.Path) -> dict[str, tuple[str, str]]:
    """What the issue saw fake full marks or stop grading; each replaces one solution's body.
    Key -> (body, a phrase its feedback shows)."""
    return {
        # patch the grader's verdict and PyTorch's comparisons, then answer wrongly
        "softmax": ("__import__('attnbook_classroom.grading', fromlist=['x']).Feedback.assert_passed = lambda self: self\n"
                    "    torch.allclose = lambda *a, **k: True\n    torch.equal = lambda *a, **k: True\n"
                    "    return scores", "differs from the reference"),
        # patch the grader from inside the student's own function (it is not in the sandbox)
        "attention": ("import attnbook_classroom.grading.compare as c\n    c.same = lambda *a, **k: True\n"
                      "    return q", "No module named 'attnbook_classroom.grading.compare'"),
        # read the instructor's source (solutions and hidden tests) into the feedback
        "selfatt": (f"raise RuntimeError(open({str(course / 'source' / NAME / (NAME + '.ipynb'))!r}).read())",
                    "FileNotFoundError"),
        # write into the course folder
        "step": (f"open({str(course / 'pwned.txt')!r}, 'w').write('x')", "FileNotFoundError"),
        # the package's answer, and a table of the visible answers
        "causal": ("from attnbook.masks import causal_mask\n    return causal_mask(L, S)", "not available"),
        # end the process that runs the code; kill the sandbox's process 1 (ignored: the module,
        # left without its layers, is graded as it is)
        "split": ("import os\n    os._exit(1)", "ended the process"),
        "module": ("import os; os.kill(os.getppid(), 9)", "registered parameters"),
    }


def _solve(released: dict, student: dict) -> dict:
    """The released notebook answered with the instructor's solutions, except the student's mistakes."""
    nb = json.loads(json.dumps(released))
    source = tiny_notebook()
    solutions = {c["metadata"]["nbgrader"]["grade_id"]: "".join(c["source"]) for c in source["cells"]
                 if c["metadata"].get("nbgrader", {}).get("solution")}
    for cell in nb["cells"]:
        gid = cell["metadata"].get("nbgrader", {}).get("grade_id", "")
        key = gid.removesuffix("-solution")
        if gid in solutions and key in student:
            body = student[key][0]
            src = solutions[gid]
            if key == "module":
                good = "self.layers = nn.ModuleList(nn.Linear(embed_dim, embed_dim, bias=False) for _ in range(4))"
                src = src.replace(good, body)
                if "range(3)" in body:  # no output projection: return the merged heads
                    src = src.replace("return self.layers[3](o.transpose(1, 2).reshape(B, L, E))",
                                      "return o.transpose(1, 2).reshape(B, L, E)")
            elif key == "pick":
                src = f"picks = {body}"
            else:
                start = src.index("### BEGIN SOLUTION")
                end = src.index("### END SOLUTION")
                indent = " " * (len(src[:start]) - len(src[:start].rstrip(" ")))
                body = body if body.split("\n")[0].startswith(("raise", "open", "import", "__import__", "from")) \
                    else f"return {body}"
                src = src[:start] + body + "\n" + indent + src[end:]
            cell["source"] = src
        elif gid in solutions:
            cell["source"] = solutions[gid]
    return nb


def _course(*args, check=True):
    result = subprocess.run([PY, "-m", "attnbook_classroom.course", *args], cwd=ROOT, env=ENV,
                            capture_output=True, text=True, timeout=900)
    assert not check or result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def _nbgrader(*args, cwd, env=None):
    result = subprocess.run([str(pathlib.Path(PY).parent / "nbgrader"), *args], cwd=cwd, env=env or ENV,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout + result.stderr


def _validate_output(path: pathlib.Path, cwd, env) -> str:
    result = subprocess.run([str(pathlib.Path(PY).parent / "nbgrader"), "validate", str(path)], cwd=cwd, env=env,
                            capture_output=True, text=True, timeout=600)
    return result.stdout + result.stderr


def _check_feedback_pages(pages: dict[pathlib.Path, bool]) -> None:
    """Feedback pages in a real browser with no network: their maths is drawn (MathML, no TeX left;
    the value says whether the page has maths), and no message runs off the page."""
    pytest.importorskip("playwright")
    from playwright.sync_api import sync_playwright

    chromium = pathlib.Path(os.environ.get("CHROMIUM", "/usr/bin/chromium"))
    if not chromium.is_file():
        pytest.skip("no Chromium")
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"]
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(chromium), args=flags)
        page = browser.new_page(viewport={"width": 900, "height": 800})
        page.route("**/*", lambda route: route.continue_() if route.request.url.startswith("file:") else route.abort())
        for path, maths in pages.items():
            page.goto(f"file://{path}", wait_until="load")
            found = page.evaluate(r"""() => {
                const text = [...document.querySelectorAll('.jp-MarkdownCell, .text_cell_render')].map(e => e.innerText).join(' ');
                const maths = [...document.querySelectorAll('math')];
                const wide = [...document.querySelectorAll('.output_subarea pre, .jp-OutputArea-output pre')]
                    .filter(e => e.scrollWidth > e.clientWidth + 2).length;
                return {dollars: (text.match(/\$/g) || []).length, maths: maths.length,
                        drawn: maths.filter(m => m.getBoundingClientRect().width > 0).length, wide,
                        pageWide: document.documentElement.scrollWidth > window.innerWidth + 2};
            }""")
            assert (found["maths"] > 0) == maths and found["drawn"] == found["maths"] and found["dollars"] == 0, (path, found)
            assert found["wide"] == 0 and not found["pageWide"], (path, found)
        browser.close()


def _text(nb: dict) -> str:
    return "\n".join("".join(c["source"]) for c in nb["cells"])


def _outputs(cell: dict) -> str:
    parts = []
    for out in cell.get("outputs", []):
        parts += [out.get("text", ""), out.get("evalue", ""), "\n".join(out.get("traceback", [])),
                  json.dumps(out.get("data", {}))]
    return "\n".join(p if isinstance(p, str) else "".join(p) for p in parts)


def _grades(course: pathlib.Path) -> dict[tuple[str, str], dict]:
    with open(course / "grades.csv") as f:
        return {(r["student_id"], r["assignment"]): r for r in csv.DictReader(f)}


def _submit(course: pathlib.Path, student: str, assignment: str, nb: dict, timestamp: str | None = None):
    folder = course / "submitted" / student / assignment
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{assignment}.ipynb").write_text(json.dumps(nb))
    if timestamp:
        (folder / "timestamp.txt").write_text(timestamp)


def _student_env(home: pathlib.Path, student: str, exchange: pathlib.Path) -> dict:
    (home / ".jupyter").mkdir(parents=True, exist_ok=True)
    (home / ".jupyter" / "nbgrader_config.py").write_text(
        f"c = get_config()\nc.CourseDirectory.course_id = 'attention-book'\nc.Exchange.root = {str(exchange)!r}\n"
        f"c.CourseDirectory.student_id = {student!r}\n")  # the login name, as on a shared server
    return {**ENV, "HOME": str(home), "USER": student, "LOGNAME": student, "JUPYTER_CONFIG_DIR": str(home / ".jupyter")}


@pytest.mark.filterwarnings("ignore:Passing unrecognized arguments:DeprecationWarning")  # nbgrader's own
def test_classroom_workflow_with_nbgrader(tmp_path, capsys):
    """One course, one grading run and the commands around it, then every check on them (a single
    test, so that pytest-xdist never builds the course twice)."""
    course, exchange, src = tmp_path / "course", tmp_path / "exchange", tmp_path / "src"
    course.mkdir()
    src.mkdir()
    (src / f"{NAME}.ipynb").write_text(json.dumps(tiny_notebook()))
    students = ["teacher", "blank", "student_a", "student_b", "hostile", "ghost", "remote", "renamer",
                "mallory", "carol"]
    (course / "students.csv").write_text("id,first_name,last_name,email\n" + "".join(
        f"{s},{s.title()},Student,{s}@example.org\n" for s in students))
    (course / "due_dates.csv").write_text(f"assignment,duedate\n{CHAPTER},2026-01-01 00:00:00 UTC\n")
    (course / "nbgrader_config_local.py").write_text(  # one account plays every student here
        "c = get_config()\nc.SandboxedGrading.cell_timeout = 3.0\nc.SandboxedGrading.notebook_timeout = 40.0\n"
        "c.SafeCollect.check_owner = False\n")
    _course("assignments", "--root", str(course), "--exchange", str(exchange), str(src / f"{NAME}.ipynb"),
            str(ROOT / "chapters" / f"{CHAPTER}.ipynb"))
    released = json.loads((course / "release" / NAME / f"{NAME}.ipynb").read_text())
    chapter_source = json.loads((course / "source" / CHAPTER / f"{CHAPTER}.ipynb").read_text())
    chapter_release = json.loads((course / "release" / CHAPTER / f"{CHAPTER}.ipynb").read_text())
    hostile = {k: (body, [phrase]) for k, (body, phrase) in hostile_bodies(course).items()}

    # the release: no solution, no hidden test; the student form of chapter 7 is its release
    text = _text(released)
    assert "BEGIN SOLUTION" not in text and "HIDDEN TESTS" not in text and HIDDEN_MARK not in text
    assert "Its own token is the last input" not in text and "YOUR ANSWER HERE" in text
    assert text.count(".assert_passed()") == AUTOGRADED_POINTS
    student_form = ["".join(c.source) for c in student_exercise_cells(ROOT / "chapters" / f"{CHAPTER}.ipynb")]
    assert all(s in _text(chapter_release) for s in student_form[1:])

    # submissions on disk, and one through nbgrader's exchange
    _submit(course, "teacher", NAME, tiny_notebook())
    _submit(course, "teacher", CHAPTER, chapter_source, timestamp="2026-01-02 00:00:00 UTC")  # a day late
    _submit(course, "blank", NAME, released)
    _submit(course, "blank", CHAPTER, chapter_release)
    for student, mistakes in MISTAKES.items():
        _submit(course, student, NAME, _solve(released, mistakes))
    _submit(course, "hostile", NAME, _solve(released, hostile))
    renamed = _solve(released, {})  # saved under another name, a test cell relabelled
    next(c for c in renamed["cells"] if c["metadata"].get("nbgrader", {}).get("grade_id") == "pick-square")[
        "metadata"]["nbgrader"]["grade_id"] = "pick-square-mine"
    (course / "submitted" / "renamer" / NAME).mkdir(parents=True)
    (course / "submitted" / "renamer" / NAME / f"{NAME}-Copy1.ipynb").write_text(json.dumps(renamed))
    instructor = api(course)  # nbgrader's API: what its commands call
    assert instructor.release_assignment(NAME)["success"]
    home = tmp_path / "remote"
    env = _student_env(home, "remote", exchange)
    _nbgrader("fetch_assignment", NAME, cwd=home, env=env)
    fetched = home / NAME / f"{NAME}.ipynb"
    fetched.write_text(json.dumps(_solve(json.loads(fetched.read_text()), {})))
    assert "Success" in _nbgrader("validate", str(fetched), cwd=home, env=env)
    wrong = home / "wrong.ipynb"  # nbgrader validate shows every line of a mistake, none cut
    wrong.write_text(json.dumps(_solve(json.loads(fetched.read_text()), {"causal": MISTAKES["student_b"]["causal"]})))
    shown = _validate_output(wrong, cwd=home, env=env)
    assert "Your mask is aligned to the top left" in shown and "Align to the bottom right" in " ".join(shown.split())
    message = shown[shown.rindex("AssertionError:"):].split("=" * 20)[0]  # the error's own lines
    assert not [line for line in message.splitlines() if line.endswith("...")], message
    _nbgrader("submit", NAME, cwd=home, env=env)
    assert instructor.collect(NAME)["success"]
    assert (course / "submitted" / "remote" / NAME / f"{NAME}.ipynb").exists()

    (course / "submitted" / "mallory").symlink_to(course / "submitted" / "teacher")  # links placed by hand
    (course / "submitted" / "carol" / NAME).mkdir(parents=True)
    (course / "submitted" / "carol" / NAME / f"{NAME}.ipynb").symlink_to(course / "source" / NAME / f"{NAME}.ipynb")
    graded = _course("grade", "--root", str(course))
    assert "nbgrader failed" not in graded.stdout + graded.stderr
    grades = _grades(course)
    for who in ("mallory", "carol"):  # not followed: error, no score, nothing graded or fed back
        row = grades[who, NAME]
        assert (row["status"], row["score"]) == ("error", "") and "symbolic link" in row["note"], row
        assert not (course / "feedback" / who).exists() and not (course / "autograded" / who).exists()
    full = AUTOGRADED_POINTS + 2
    assert {k: (r["status"], r["score"]) for k, r in grades.items() if k[1] == NAME and k[0] in (
        "blank", "ghost")} == {("blank", NAME): ("graded", "0"), ("ghost", NAME): ("missing", "")}
    assert float(grades["teacher", NAME]["score"]) == AUTOGRADED_POINTS  # the written answer awaits formgrader
    assert grades["teacher", NAME]["needs_manual_grade"] == "True"
    assert float(grades["remote", NAME]["score"]) == AUTOGRADED_POINTS
    chapter_points = sum(m.get("points", 0) for m in graded_cells(ROOT / "chapters" / f"{CHAPTER}.ipynb")
                         if m.get("grade") and not m.get("solution"))  # the chapter's test cells
    assert float(grades["teacher", CHAPTER]["score"]) == float(grades["teacher", CHAPTER]["max_score"]) \
        == chapter_points > 0
    assert grades["teacher", CHAPTER]["seconds_late"] == "86400" and grades["teacher", CHAPTER]["status"] == "graded"
    assert float(grades["hostile", NAME]["score"]) == AUTOGRADED_POINTS - sum(len(TESTS[k][2]) for k in hostile)
    assert grades["renamer", NAME]["status"] == "graded" and float(grades["renamer", NAME]["score"]) == AUTOGRADED_POINTS
    assert "tiny-Copy1.ipynb was graded as tiny.ipynb" in grades["renamer", NAME]["note"]
    assert "'pick-square-mine', which tiny.ipynb does not have" in grades["renamer", NAME]["note"]
    assert "Notes from grading" in (course / "feedback" / "renamer" / NAME / f"{NAME}.html").read_text()
    with open(course / "grades-lms.csv", newline="") as f:
        lms = list(csv.reader(f))
    assert lms[0] == ["Student", "ID", "SIS User ID", "SIS Login ID", "Section", CHAPTER, NAME]
    assert len(lms) == 1 + len(students)
    row = next(r for r in lms if r[2] == "teacher")
    assert row[0] == "Student, Teacher" and row[6] == grades["teacher", NAME]["score"] and row[5] == grades["teacher", CHAPTER]["score"]
    _check_feedback_pages({course / "feedback" / "teacher" / CHAPTER / f"{CHAPTER}.html": True,  # maths in it
                           course / "feedback" / "student_a" / NAME / f"{NAME}.html": False})  # long messages
    summary = (course / "summary.txt").read_text()
    assert "ghost/tiny" in summary and "teacher/07_masking: 86400 s late" in summary
    assert "hostile/tiny" in summary and "student_b/tiny" in summary  # os._exit and the endless loop

    # every mistake (and every hostile attempt) is named; the other exercises keep their points
    for student, mistakes in {**MISTAKES, "hostile": hostile}.items():
        nb = json.loads((course / "autograded" / student / NAME / f"{NAME}.ipynb").read_text())
        by_key: dict[str, str] = {}
        for cell in nb["cells"]:
            meta = cell["metadata"].get("nbgrader", {})
            if meta.get("grade") and cell["cell_type"] == "code":
                key = meta["grade_id"].split("-")[0]
                by_key[key] = by_key.get(key, "") + _outputs(cell)
        for key, (_, phrases) in mistakes.items():
            for phrase in phrases:
                assert phrase.lower() in by_key[key].lower(), f"{student}/{key}: {phrase!r} not in {by_key[key]}"
        for key in set(TESTS) - set(mistakes):
            assert "AssertionError" not in by_key[key] and "passed" in by_key[key], f"{student}/{key}"

    # the hostile student read nothing, wrote nothing, and the feedback shows no hidden test or path
    assert not (course / "pwned.txt").exists()
    for page in (course / "feedback").glob("*/*/*.html"):
        html = page.read_text()
        assert "HIDDEN TESTS" not in html and HIDDEN_MARK not in html, page
        assert str(course) not in html or page.parent.parent.name == "hostile", page  # its code has the path
    outputs = [_outputs(c) for c in json.loads((course / "autograded" / "hostile" / NAME / f"{NAME}.ipynb")
                                               .read_text())["cells"]]
    assert not any(str(course) in o for o in outputs) and any("No such file" in o for o in outputs)
    assert "Its own token is the last input" not in (course / "feedback" / "blank" / NAME / f"{NAME}.html").read_text()
    assert "filled = scores.masked_fill" not in (course / "feedback" / "hostile" / NAME / f"{NAME}.html").read_text()

    # nbgrader's own autograde regrades one student, with no warning on correct or hidden-test cells
    log = _nbgrader("autograde", NAME, "--student", "teacher", "--force", cwd=course)
    warnings = [line for line in log.splitlines() if "WARNING" in line and "Removing existing" not in line]
    assert not warnings, warnings

    # formgrader's manual grade for the written answer counts in grades.csv
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{course / 'gradebook.db'}", course_id="attention-book") as gb:
        gb.find_grade("written-causal", NAME, NAME, "teacher").manual_score = 2
        gb.db.commit()
    export_csv(course)
    assert float(_grades(course)["teacher", NAME]["score"]) == full

    # feedback back through the exchange: every student it can be (the others, placed by hand, have
    # no submission_secret.txt; release_feedback lists them and goes on)
    released_log = _nbgrader("release_feedback", NAME, cwd=course)
    assert "not released" in released_log and "Released feedback for 'remote'" in released_log
    _nbgrader("fetch_feedback", NAME, cwd=home, env=env)
    assert list((home / NAME / "feedback").glob("*/tiny.html"))

    # only new or changed submissions are graded again; removed students leave grades.csv
    _submit(course, "student_a", NAME, _solve(released, {k: v for k, v in MISTAKES["student_a"].items()
                                                          if k != "causal"}))
    for path in (course / "submitted" / "blank" / NAME).iterdir():
        path.unlink()
    (course / "submitted" / "blank" / NAME).rmdir()
    (course / "students.csv").write_text("".join(line + "\n" for line in
                                                 (course / "students.csv").read_text().splitlines()
                                                 if not line.startswith("ghost,")))
    before = (course / "source" / NAME / f"{NAME}.ipynb").stat().st_mtime_ns
    build_assignments(course, [src / f"{NAME}.ipynb", ROOT / "chapters" / f"{CHAPTER}.ipynb"], exchange)  # again
    assert (course / "source" / NAME / f"{NAME}.ipynb").stat().st_mtime_ns == before
    (course / "submitted" / "student_b" / NAME / f"{NAME}.ipynb").write_text("{broken")
    grade(course)
    assert "grading 2 new or changed submissions of 2 students" in capsys.readouterr().out
    grades = _grades(course)
    assert grades["blank", NAME]["status"] == "missing" and ("ghost", NAME) not in grades
    assert float(grades["student_a", NAME]["score"]) > 0
    assert (grades["student_b", NAME]["status"], grades["student_b", NAME]["score"]) == ("error", "")
    assert "is not a notebook" in grades["student_b", NAME]["note"]
    with open(course / "students.csv", "a") as f:  # a new student and a due date, no regeneration
        f.write("newcomer,New,Comer,newcomer@example.org\n")
    with open(course / "due_dates.csv", "a") as f:
        f.write(f"{NAME},2026-01-01 00:00:00 UTC\n")
    export_csv(course)
    grades = _grades(course)
    assert grades["newcomer", NAME]["status"] == "missing"
    assert grades["teacher", NAME]["duedate"].startswith("2026-01-01") and float(grades["teacher", NAME]["seconds_late"]) > 0


def test_every_chapter_releases_its_exercise_notebook(tmp_path):
    """Every chapter's exercise notebook is released (no training run, no solution, no hidden test),
    and every test cell of the release fails while its answers are not written."""
    course = tmp_path / "course"
    _course("assignments", "--root", str(course), "--exchange", str(tmp_path / "exchange"))
    chapters = [c for c in toc_chapters() if any(m.get("grade") for m in graded_cells(c))]
    released = sorted((course / "release").glob("*/*.ipynb"))
    (course / "submitted").mkdir()
    with open(export_csv(course)) as f:  # generated, not handed out: grades.csv lists none of them
        assert len(f.read().strip().splitlines()) == 1
    assert [p.stem for p in released] == sorted(c.stem for c in chapters)
    for chapter, path in zip(sorted(chapters), released):
        nb = json.loads(path.read_text())
        text = _text(nb)
        assert "BEGIN SOLUTION" not in text and "HIDDEN TESTS" not in text
        assert len(nb["cells"]) < len(json.loads(chapter.read_text())["cells"])  # the exercises only
        for cell in nbformat.read(str(chapter), as_version=4).cells:
            if cell.metadata.get("nbgrader", {}).get("solution"):
                body = cell.source.split("BEGIN SOLUTION")[1].split("END SOLUTION")[0]
                for line in body.splitlines():
                    if len(line.strip()) > 12:
                        assert line.strip() not in text, f"{chapter.name}: solution line leaked: {line.strip()}"
        check_unanswered_exercises_fail(path)
        check_plain_markdown_with_its_figures(nb, chapter)


def check_plain_markdown_with_its_figures(nb: dict, chapter: pathlib.Path) -> None:
    """A released notebook shows no MyST (roles, directives, targets), and holds, as an image with
    its caption, every figure of the chapter its exercises name."""
    from attnbook_classroom.course.notebooks import ROLE_OR_DIRECTIVE

    markdown = [c for c in nb["cells"] if c["cell_type"] == "markdown"]
    raw = [m.group(0) for c in markdown for m in ROLE_OR_DIRECTIVE.finditer("".join(c["source"]))]
    assert not raw, f"{chapter.name}: MyST left in the released notebook: {raw}"
    section = "".join("".join(c.source) for c in nbformat.read(str(chapter), as_version=4).cells
                      if c.cell_type == "markdown" and "Exercise" in c.source)
    for label in re.findall(r"\{numref\}`(?:[^`<]*<)?([^`>]+)>?`", section):
        figure = [c for c in markdown if label + ".png" in c.get("attachments", {})]
        assert figure and "image/png" in figure[0]["attachments"][label + ".png"], f"{chapter.name}: {label} missing"


def check_unanswered_exercises_fail(released: pathlib.Path):
    """Run a released exercise notebook as it is: every autograded cell must fail."""
    nb = json.loads(released.read_text())
    namespace: dict = {"__name__": "__main__"}
    graded = failed = 0
    for cell in nb["cells"]:
        if cell["cell_type"] != "code":
            continue
        is_test = cell["metadata"].get("nbgrader", {}).get("grade", False)
        try:
            exec(compile("".join(cell["source"]), f"<{released.stem}>", "exec"), namespace)
        except Exception:
            failed += is_test
        else:
            assert not is_test, f"{released.name}: an unanswered test cell passes:\n{cell['source']}"
        graded += is_test
    assert graded >= 4 and failed == graded


def test_chapter_exercises_are_well_formed():
    """Static checks of every chapter's Exercises section (no nbgrader run)."""
    from attnbook_classroom import grading
    from attnbook_classroom.grading.submission import parse_test_cell

    with_exercises = 0
    for chapter in toc_chapters():
        nb = json.loads(chapter.read_text())
        sources = ["".join(c["source"]) for c in nb["cells"]]
        starts = [i for i, s in enumerate(sources) if s.startswith("## Exercises")]
        if not starts:
            continue
        with_exercises += 1
        summary = [i for i, s in enumerate(sources) if "## Summary" in s and nb["cells"][i]["cell_type"] == "markdown"]
        assert summary and summary[-1] < starts[0], f"{chapter.name}: Exercises must follow the Summary"
        ids = [m["grade_id"] for m in graded_cells(chapter)]
        assert len(ids) == len(set(ids)), f"{chapter.name}: duplicate grade ids"
        tests_per_solution = []
        for cell in nb["cells"][starts[0]:]:
            meta = cell["metadata"].get("nbgrader", {})
            src = "".join(cell["source"])
            if meta.get("solution") and cell["cell_type"] == "code":
                assert "hide-input" in cell["metadata"].get("tags", []), f"{chapter.name}: solution not folded"
                assert "### BEGIN SOLUTION" in src and "### END SOLUTION" in src
                tests_per_solution.append(0)
            elif meta.get("grade") and not meta.get("solution"):
                assert meta.get("locked") and meta.get("points", 0) > 0, f"{chapter.name}: {meta}"
                calls = parse_test_cell(src, meta.get("grade_id", "?"))  # what the grader reads
                assert calls, f"{chapter.name}: test cell without a check(...) call"
                for call in calls:
                    assert call.part in grading.parts(call.exercise_id), \
                        f"{chapter.name}: {call.exercise_id}/{call.part}"
                tests_per_solution[-1] += 1
        assert len(tests_per_solution) >= 3, f"{chapter.name}: fewer than three exercises"
        assert all(n >= 1 for n in tests_per_solution), f"{chapter.name}: an exercise without a test cell"
    assert with_exercises >= 1


# ----------------------------------------------------------------------------------------------
# What make grade hands nbgrader: the submission made gradable, with notes (no nbgrader run here)
# ----------------------------------------------------------------------------------------------

def _stage_case(tmp_path, files: dict[str, dict | str], **limits):
    from attnbook_classroom.course.stage import stage

    source, folder, target = tmp_path / "source", tmp_path / "submitted", tmp_path / "staged"
    for path in (source, folder):
        path.mkdir()
    (source / f"{NAME}.ipynb").write_text(json.dumps(tiny_notebook()))
    for name, content in files.items():
        (folder / name).write_text(content if isinstance(content, str) else json.dumps(content))
    notes = stage(folder, source, source, target, **{"max_bytes": 1_000_000, "max_cells": 500, **limits})
    staged = nbformat.read(str(target / f"{NAME}.ipynb"), as_version=4) if (target / f"{NAME}.ipynb").exists() else None
    return notes, staged


def _ids(nb) -> list[str]:
    return [c.metadata["nbgrader"]["grade_id"] for c in nb.cells if "nbgrader" in c.metadata]


def test_a_renamed_notebook_and_an_extra_one_are_graded_as_the_assignment(tmp_path):
    answered = tiny_notebook()
    scratch = {"cells": [_cell("code", "x = 1")], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    notes, staged = _stage_case(tmp_path, {"scratch.ipynb": scratch, f"{NAME}-Copy1.ipynb": answered})
    assert any(f"{NAME}-Copy1.ipynb was graded as {NAME}.ipynb" in n for n in notes), notes
    assert any("scratch.ipynb is not part of the assignment" in n for n in notes), notes
    assert _ids(staged) == _ids(nbformat.from_dict(answered))
    assert "Notes from grading" in staged.cells[0].source  # the feedback page shows them


def test_changed_grade_cells_are_graded_on_what_is_there(tmp_path):
    """A renamed test cell, a solution cell marked as a test, a copied cell, a deleted answer cell
    whose code the student moved to a new cell: the assignment's marks, the student's code."""
    nb = tiny_notebook()
    by_id = {c["metadata"].get("nbgrader", {}).get("grade_id"): c for c in nb["cells"]}
    by_id["softmax-values"]["metadata"]["nbgrader"]["grade_id"] = "my-own-name"  # renamed test cell
    by_id["causal-solution"]["metadata"]["nbgrader"].update(grade=True, points=5)  # a solution as a test
    nb["cells"].append(json.loads(json.dumps(by_id["step-values"])))  # a copied test cell
    moved = json.loads(json.dumps(by_id["split-solution"]))
    del moved["metadata"]["nbgrader"]  # its code, in a cell of its own
    index = nb["cells"].index(by_id["split-solution"])
    nb["cells"][index] = moved  # the answer cell itself deleted
    notes, staged = _stage_case(tmp_path, {f"{NAME}.ipynb": nb})
    text = "\n".join(notes)
    assert "'my-own-name', which tiny.ipynb does not have, was run as an ordinary cell" in text, text
    assert "The grading marks of cell 'causal-solution' had been changed" in text
    assert "A second cell marked 'step-values'" in text
    assert "The test cell 'softmax-values' was missing; it was put back." in text
    assert "The answer cell 'split-solution' was missing" in text
    assert sorted(_ids(staged)) == sorted(_ids(nbformat.from_dict(tiny_notebook())))
    marks = {c.metadata["nbgrader"]["grade_id"]: c.metadata["nbgrader"] for c in staged.cells if "nbgrader" in c.metadata}
    assert marks["causal-solution"]["grade"] is False and "points" not in marks["causal-solution"]
    split = [c for c in staged.cells if "def my_split" in c.source]
    assert split and "nbgrader" not in split[0].metadata  # the student's code runs where it is
    order = _ids(staged)
    assert order.index("softmax-solution") < order.index("softmax-values") < order.index("softmax-fully_masked")


@pytest.mark.parametrize("case, phrase", [("bytes", "over the grading limit of 0.1 MB"),
                                          ("cells", "has 600 cells, over the grading limit of 500"),
                                          ("json", "is not a notebook (it is not JSON")])
def test_notebooks_over_the_limits_are_not_read(tmp_path, case, phrase):
    from attnbook_classroom.course.stage import Unreadable

    nb = tiny_notebook()
    if case == "bytes":
        nb["cells"][0]["source"] = "x" * 150_000
    elif case == "cells":
        nb["cells"] += [_cell("code", "") for _ in range(600 - len(nb["cells"]))]
    content = "{not json" if case == "json" else nb
    with pytest.raises(Unreadable, match=re.escape(phrase)):
        _stage_case(tmp_path, {f"{NAME}.ipynb": content}, max_bytes=100_000)

"""The classroom workflow with the real nbgrader (no mocks).

A small assignment written here (exercise cells in nbgrader's format calling attnbook.grading) is
released and autograded for an instructor's copy, an unanswered copy and submissions that each
contain typical mistakes; then the real chapters are released and checked for leaked solutions.
"""

from __future__ import annotations

import csv
import json
import os
import pathlib
import subprocess
import sys


from attnbook.course import graded_cells, toc_chapters

ROOT = pathlib.Path(__file__).resolve().parents[1]
PY = sys.executable
ENV = {**os.environ, "PATH": str(pathlib.Path(PY).parent) + os.pathsep + os.environ.get("PATH", ""),
       "OMP_NUM_THREADS": "1"}
NAME = "tiny"


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
import math

import torch
from attnbook.functional import masked_softmax

def my_softmax(scores, mask):
    ### BEGIN SOLUTION
    filled = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    return torch.softmax(filled, dim=-1).masked_fill(~mask, 0.0)
    ### END SOLUTION""",
    "attention": """
import math

import torch
from attnbook.functional import masked_softmax

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
def my_step(decoder_state, encoder_states, source_mask):
    ### BEGIN SOLUTION
    weights = masked_softmax((encoder_states @ decoder_state[:, :, None])[..., 0], source_mask)
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
import math

from torch import nn
from attnbook.functional import masked_softmax

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
    "attention": ("scaled_dot_product_attention", "my_attention", ["no_mask", "mask", "heads"], "mask"),
    "selfatt": ("self_attention", "my_self_attention", ["values", "mask"], None),
    "step": ("seq2seq_attention_step", "my_step", ["values", "empty_source"], None),
    "causal": ("causal_mask", "my_causal", ["square", "more_keys"], "more_keys"),
    "pick": ("pick_causal_mask", "picks", ["square", "cache"], None),
    "split": ("split_heads", "my_split", ["values", "one_head"], None),
    "module": ("multi_head_forward", "MyMHA", ["structure", "values"], None),
}
HIDDEN_MARK = "seed=7"


def tiny_notebook() -> dict:
    cells = [_cell("markdown", "# A tiny assignment"),
             _cell("code", "from attnbook.grading import check",
                   {"grade": False, "grade_id": "imports", "locked": True, "solution": False})]
    for key, solution in SOLUTIONS.items():
        ex_id, name, parts, hidden = TESTS[key]
        cells.append(_cell("markdown", f"## {ex_id}"))
        cells.append(_cell("code", solution.strip("\n"),
                           {"grade": False, "grade_id": f"{key}-solution", "locked": False, "solution": True},
                           tags=["hide-input"]))
        for part in parts:
            limit = ", timeout=2" if key == "split" else ""  # split holds the endless loop below
            src = f'check("{ex_id}", {name}, part="{part}"{limit}).assert_passed()'
            if part == hidden:
                src += (f'\n### BEGIN HIDDEN TESTS\ncheck("{ex_id}", {name}, part="{part}", {HIDDEN_MARK})'
                        '.assert_passed()\n### END HIDDEN TESTS')
            cells.append(_cell("code", src, {"grade": True, "grade_id": f"{key}-{part}", "locked": True,
                                             "points": 1, "solution": False}))
    return {"cells": cells, "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                         "language": "python"}},
            "nbformat": 4, "nbformat_minor": 5}


# Submissions: each replaces some solutions with typical mistakes (or hostile code); the phrases the
# feedback in the autograded notebook must show. Together they cover every mistake the grader names
# in the book's list.
MISTAKES = {
    "student_a": {
        "softmax": ("torch.softmax(scores.masked_fill(~mask, -1e9), dim=-2)",
                    ["instead of over the keys", "does not fit in float16"]),
        "attention": ("masked_softmax(q @ k.transpose(-2, -1), mask) @ v", ["not scaled"]),
        "selfatt": ("masked_softmax((x @ W_q.T) @ (x @ W_k.T).transpose(-2, -1) / math.sqrt(W_q.shape[0]), "
                    "None if mask is None else ~mask) @ (x @ W_v.T)", ["polarity is inverted"]),
        "step": ("(lambda w: ((w[:, :, None] * encoder_states).sum(1), w))(torch.softmax("
                 "(encoder_states @ decoder_state[:, :, None])[..., 0].masked_fill(~source_mask, float('-inf')), -1))",
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
                    ["divided the scores by E"]),
        "step": ("{}['boom']", ["KeyError"]),
        "causal": ("torch.ones(L, S, dtype=torch.bool).tril()", ["aligned to the top left"]),
        "pick": ('{"square": "ACD", "cache": "AC"}', ["future", "top left"]),
        "split": ("[0 for _ in iter(int, 1)]", ["Too slow"]),
        "module": ("self.layers = nn.ModuleList(nn.Linear(embed_dim, embed_dim, bias=False) for _ in range(3))",
                   ["output projection"]),
    },
}


def _solve(released: dict, student: dict) -> dict:
    """The released notebook answered with the instructor's solutions, except the student's mistakes."""
    nb = json.loads(json.dumps(released))
    source = tiny_notebook()
    solutions = {c["metadata"]["nbgrader"]["grade_id"]: c["source"] for c in source["cells"]
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
                src = src[:start] + f"return {body}\n" + indent + src[end:]
            cell["source"] = src
        elif gid in solutions:
            cell["source"] = solutions[gid]
    return nb


def _run(*args):
    result = subprocess.run([PY, "-m", "attnbook.course", *args], cwd=ROOT, env=ENV,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def _text(nb: dict) -> str:
    return "\n".join("".join(c["source"]) if isinstance(c["source"], list) else c["source"]
                     for c in nb["cells"])


def _outputs(cell: dict) -> str:
    parts = []
    for out in cell.get("outputs", []):
        parts += [out.get("text", ""), out.get("evalue", ""), "\n".join(out.get("traceback", [])),
                  json.dumps(out.get("data", {}))]
    return "\n".join(p if isinstance(p, str) else "".join(p) for p in parts)


def build_and_grade(tmp_path):
    root = tmp_path / "course"
    (tmp_path / "src").mkdir()
    src = tmp_path / "src" / f"{NAME}.ipynb"
    src.write_text(json.dumps(tiny_notebook()))
    # the tiny assignment and every chapter of the book, released in one run
    _run("assignments", "--root", str(root), str(src), *(str(c) for c in toc_chapters()))
    released = json.loads((root / "release" / NAME / f"{NAME}.ipynb").read_text())
    students = {"teacher": tiny_notebook(), "blank": released}
    students.update({name: _solve(released, mistakes) for name, mistakes in MISTAKES.items()})
    for student, nb in students.items():
        folder = root / "submitted" / student / NAME
        folder.mkdir(parents=True)
        (folder / f"{NAME}.ipynb").write_text(json.dumps(nb))
    _run("grade", "--root", str(root), "--no-feedback")
    with open(root / "grades.csv") as f:
        scores = {row["student_id"]: (float(row["score"]), float(row["max_score"])) for row in csv.DictReader(f)}
    return root, released, scores


def check_release_has_no_solution_and_no_hidden_test(course):
    root, released, _ = course
    text = _text(released)
    assert "BEGIN SOLUTION" not in text and "END SOLUTION" not in text
    assert "HIDDEN TESTS" not in text and HIDDEN_MARK not in text
    for key, solution in SOLUTIONS.items():
        for line in solution.split("### BEGIN SOLUTION")[1].split("### END SOLUTION")[0].splitlines():
            if line.strip():
                assert line.strip() not in text, f"solution line leaked: {line.strip()}"
    stubs = [c for c in released["cells"] if c["metadata"].get("nbgrader", {}).get("solution")]
    assert len(stubs) == len(SOLUTIONS)
    assert all("raise NotImplementedError()" in "".join(c["source"]) for c in stubs)
    assert all(not c.get("outputs") for c in released["cells"] if c["cell_type"] == "code")
    # the test cells are all there, visible part included
    assert text.count(".assert_passed()") == sum(len(t[2]) for t in TESTS.values())


def check_unanswered_scores_zero_and_instructor_full(course):
    _, _, scores = course
    total = sum(len(t[2]) for t in TESTS.values())
    assert scores["blank"] == (0.0, total)
    assert scores["teacher"] == (total, total)


def check_named_mistakes_lose_marks_and_are_named(course, student):
    root, _, scores = course
    score, total = scores[student]
    assert score < total
    nb = json.loads((root / "autograded" / student / NAME / f"{NAME}.ipynb").read_text())
    by_key: dict[str, str] = {}
    for cell in nb["cells"]:
        gid = cell["metadata"].get("nbgrader", {}).get("grade_id", "")
        if cell["metadata"].get("nbgrader", {}).get("grade"):
            key = gid.split("-")[0]
            by_key[key] = by_key.get(key, "") + _outputs(cell)
    for key, (_, phrases) in MISTAKES[student].items():
        for phrase in phrases:
            assert phrase.lower() in by_key[key].lower(), f"{student}/{key}: {phrase!r} not in feedback"
    # exercises without a mistake keep their points
    for key, (ex_id, name, parts, _) in TESTS.items():
        if key not in MISTAKES[student]:
            assert "AssertionError" not in by_key[key] and "Error" not in by_key[key]


def check_real_chapters_release_one_notebook_each_without_solutions(course):
    root = course[0]
    chapters = toc_chapters()
    assert chapters, "no chapter notebook in _toc.yml"
    released = sorted(p for p in (root / "release").glob("*/*.ipynb") if p.parent.name != NAME)
    assert [p.parent.name for p in released] == sorted(c.stem for c in chapters)
    for chapter, path in zip(sorted(chapters), released):
        assert path.name == chapter.name
        text = _text(json.loads(path.read_text()))
        assert "BEGIN SOLUTION" not in text and "HIDDEN TESTS" not in text
        source = json.loads(chapter.read_text())
        for cell in source["cells"]:
            if cell["metadata"].get("nbgrader", {}).get("solution"):
                body = "".join(cell["source"]).split("### BEGIN SOLUTION")[1].split("### END SOLUTION")[0]
                for line in body.splitlines():
                    if len(line.strip()) > 12:
                        assert line.strip() not in text, f"{chapter.name}: solution line leaked: {line.strip()}"
        if any(c.get("grade") for c in graded_cells(chapter)):
            assert "raise NotImplementedError()" in text
            check_unanswered_exercises_fail(path)


def check_unanswered_exercises_fail(released: pathlib.Path):
    """Run a released chapter's Exercises section as it is: every autograded cell must fail."""
    nb = json.loads(released.read_text())
    sources = ["".join(c["source"]) for c in nb["cells"]]
    start = next(i for i, s in enumerate(sources) if s.startswith("## Exercises"))
    namespace: dict = {"__name__": "__main__"}
    graded = failed = 0
    for cell, src in zip(nb["cells"][start:], sources[start:]):
        if cell["cell_type"] != "code":
            continue
        is_test = cell["metadata"].get("nbgrader", {}).get("grade", False)
        try:
            exec(compile(src, f"<{released.stem}>", "exec"), namespace)
        except Exception:
            failed += is_test
        else:
            assert not is_test, f"{released.name}: an unanswered test cell passes:\n{src}"
        graded += is_test
    assert graded >= 4 and failed == graded


def test_classroom_workflow_with_nbgrader(tmp_path):
    """One build and one grading run (nbgrader is slow to start), then every check on them.

    A single test, so that pytest-xdist never runs the build twice on two workers.
    """
    course = build_and_grade(tmp_path)
    check_release_has_no_solution_and_no_hidden_test(course)
    check_unanswered_scores_zero_and_instructor_full(course)
    for student in sorted(MISTAKES):
        check_named_mistakes_lose_marks_and_are_named(course, student)
    check_real_chapters_release_one_notebook_each_without_solutions(course)


def test_chapter_exercises_are_well_formed():
    """Static checks of every chapter's Exercises section (no nbgrader run)."""
    import re

    from attnbook import grading

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
        tests_per_solution, current = [], None
        for cell in nb["cells"][starts[0]:]:
            meta = cell["metadata"].get("nbgrader", {})
            src = "".join(cell["source"])
            if meta.get("solution"):
                assert "hide-input" in cell["metadata"].get("tags", []), f"{chapter.name}: solution not folded"
                assert "### BEGIN SOLUTION" in src and "### END SOLUTION" in src
                tests_per_solution.append(0)
            elif meta.get("grade"):
                assert meta.get("locked") and meta.get("points", 0) > 0, f"{chapter.name}: {meta}"
                calls = re.findall(r'check\("(\w+)", \w+, part="(\w+)"', src)
                assert calls, f"{chapter.name}: test cell without a check(...) call"
                for exercise_id, part in calls:
                    assert part in grading.parts(exercise_id), f"{chapter.name}: {exercise_id}/{part}"
                tests_per_solution[-1] += 1
        assert len(tests_per_solution) >= 2, f"{chapter.name}: fewer than two exercises"
        assert all(n >= 2 for n in tests_per_solution), f"{chapter.name}: an exercise with one test cell"
    assert with_exercises >= 1

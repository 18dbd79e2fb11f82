"""What a student hands in is data in every page the classroom shows: a hostile submission through the
real course workflow (``python -m attnbook_classroom.course assignments`` and ``grade``: nbgrader's
own autograde and generate_feedback), then its feedback page and nbgrader's real formgrader (a Jupyter
server with nbgrader's extension, on 127.0.0.1 with a token) in headless Chromium.

The submission carries what a student could write: raw HTML with event handlers, a script and an SVG
in its markdown (the written answer and a cell of its own), a raw cell, a ``javascript:`` link, a
remote image, and code cells with stored HTML, JavaScript, SVG and widget outputs and widget state in
the notebook, plus an error whose message is HTML; and what got through before: a ``mermaid`` code
block (nbconvert copies it as it is), markdown that the feedback pipeline's later steps used to make
live (hidden-test markers around a code fence, maths inside a code span) and a heading named after
a test cell's grade id (it took that cell's score box in formgrader). Every script would raise
``window.pwned`` and retitle the page. Neither page runs one, formgrader's score box is its own, the
instructor still reads what the student wrote (as text), and the feedback page requests nothing at all.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import sys
import urllib.request

import pytest
from jupyter_serving import free_port, serving
from site_pages import ROOT

PY = sys.executable
ENV = {**os.environ, "PATH": os.path.dirname(PY) + os.pathsep + os.environ.get("PATH", ""),
       "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
NAME, STUDENT = "tiny", "mallory"
RUN = "window.pwned = (window.pwned || 0) + 1; document.title = 'pwned'"
MARKDOWN = (f'My answer <img src=x onerror="{RUN}"> and <script>{RUN}</script>\n\n'
            f'<svg onload="{RUN}"><circle r="4"/></svg>\n\n<details open ontoggle="{RUN}">more</details>\n\n'
            "[a link](javascript:window.pwned=1) and a picture ![seen](http://203.0.113.9/seen.png)")
SHOWN = "onerror="  # what the instructor reads of it, as text


def _cell(cell_type, source, nbgrader=None, **extra):
    meta = {"nbgrader": {"schema_version": 3, "task": False, **nbgrader}} if nbgrader else {}
    cell = {"cell_type": cell_type, "metadata": meta, "source": source, **extra}
    if cell_type == "code":
        cell.setdefault("outputs", [])
        cell.setdefault("execution_count", None)
    return cell


def assignment() -> dict:
    cells = [
        _cell("markdown", "# A tiny assignment"),
        _cell("code", "import torch\nfrom attnbook_classroom.grading import check",
              {"grade": False, "grade_id": "imports", "locked": True, "solution": False}),
        _cell("code", "def my_causal(L, S):\n    ### BEGIN SOLUTION\n"
                      "    return torch.ones(L, S, dtype=torch.bool).tril(S - L)\n    ### END SOLUTION",
              {"grade": False, "grade_id": "causal-solution", "locked": False, "solution": True}),
        _cell("code", 'check("causal_mask", my_causal, part="square").assert_passed()',
              {"grade": True, "grade_id": "causal-square", "locked": True, "points": 1, "solution": False}),
        _cell("markdown", "Why must a causal mask let a token see itself?"),
        _cell("markdown", "<!-- BEGIN SOLUTION -->\nIts own token is the last input it has.\n<!-- END SOLUTION -->",
              {"grade": True, "grade_id": "written", "locked": False, "points": 1, "solution": True}),
    ]
    for index, cell in enumerate(cells):
        cell["id"] = f"tiny-{index}"
    return {"cells": cells, "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                         "language": "python"}}, "nbformat": 4, "nbformat_minor": 5}


def hostile(released: dict) -> dict:
    nb = json.loads(json.dumps(released))
    for cell in nb["cells"]:
        grade_id = cell["metadata"].get("nbgrader", {}).get("grade_id")
        if grade_id == "causal-solution":
            cell["source"] = "def my_causal(L, S):\n    return torch.ones(L, S, dtype=torch.bool).tril(S - L)"
        elif grade_id == "written":
            cell["source"] = MARKDOWN
    html_outputs = [
        {"output_type": "display_data", "metadata": {}, "data": {
            "text/html": f'<img src=x onerror="{RUN}">', "application/javascript": RUN,
            "image/svg+xml": f'<svg xmlns="http://www.w3.org/2000/svg" onload="{RUN}"/>',
            "text/plain": "<b>plain</b>"}},
        {"output_type": "display_data", "metadata": {}, "data": {
            "application/vnd.jupyter.widget-view+json": {"model_id": "w", "version_major": 2, "version_minor": 0},
            "text/plain": "a widget"}}]
    nb["cells"] += [
        _cell("markdown", f"<script>{RUN}</script>\n\nA cell of my own <img src=x onerror=\"{RUN}\">", id="own-md"),
        _cell("raw", f"<script>{RUN}</script><img src=x onerror=\"{RUN}\">", id="own-raw",
              **{"metadata": {"raw_mimetype": "text/html"}}),
        _cell("code", "raise ValueError(" + repr(f'<img src=x onerror="{RUN}">') + ")", id="own-error",
              outputs=html_outputs, execution_count=3),
        _cell("markdown", f'```mermaid\n<img src=x onerror="{RUN}">\n```', id="own-mermaid"),
        _cell("markdown", f'BEGIN HIDDEN TESTS\n```\nEND HIDDEN TESTS\n<img src=x onerror="{RUN}">\n```',
              id="own-fence"),
        _cell("markdown", f'`x\n$\\grave{{a}}$ <img src=x onerror="{RUN}">`', id="own-span"),
        _cell("markdown", "# causal-square\n\nMy heading.", id="own-heading"),
    ]
    nb["metadata"]["widgets"] = {"application/vnd.jupyter.widget-state+json": {
        "state": {}, "version_major": 2, "version_minor": 0}}
    nb["metadata"]["title"] = f'<img src=x onerror="{RUN}">'
    return nb


def _course(*args):
    result = subprocess.run([PY, "-m", "attnbook_classroom.course", *args], cwd=ROOT, env=ENV,
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """A course with one assignment, graded with a hostile submission: the course folder."""
    if not os.path.exists("/usr/bin/bwrap"):
        pytest.skip("grading needs bubblewrap (apt-get install -y bubblewrap)")
    base = tmp_path_factory.mktemp("classroom")
    course, source = base / "course", base / f"{NAME}.ipynb"
    source.write_text(json.dumps(assignment()))
    _course("assignments", "--root", str(course), "--exchange", str(base / "exchange"), str(source))
    released = json.loads((course / "release" / NAME / f"{NAME}.ipynb").read_text())
    folder = course / "submitted" / STUDENT / NAME
    folder.mkdir(parents=True)
    (folder / f"{NAME}.ipynb").write_text(json.dumps(hostile(released)))
    _course("grade", "--root", str(course))
    return course


def _watch(page) -> list[str]:
    """Record and block every request to anything but 127.0.0.1 or a local file."""
    outside = []

    def route(route):
        url = route.request.url
        if url.startswith(("file:", "data:", "about:", "http://127.0.0.1:")):
            route.continue_()
        else:
            outside.append(url)
            route.abort("blockedbyclient")

    page.route("**/*", route)
    return outside


def _ran(page) -> dict:
    page.wait_for_timeout(500)  # an image's onerror, a toggle event
    return page.evaluate("""() => ({pwned: window.pwned || 0, title: document.title, text: document.body.innerText,
                                     box: [...document.querySelectorAll('[id="causal-square"]')].map(e => e.tagName)})""")


def test_the_feedback_page_runs_nothing_of_the_student_and_requests_nothing(browser, graded):
    path = graded / "feedback" / STUDENT / NAME / f"{NAME}.html"
    html = path.read_text()
    assert "<script" not in html.lower() and "<link" not in html.lower()  # nbgrader's page loads MathJax from a CDN
    assert "<img src=x" not in html and "<div class=\"jp-Mermaid\"" not in html  # no tag of the student's
    assert not re.search(r"""\b(src|srcset|data)\s*=\s*["']?(https?:)?//|url\(\s*["']?(https?:)?//""", html, re.I)
    page = browser.new_page()
    requests = []
    page.on("request", lambda request: requests.append(request.url))
    outside = _watch(page)
    page.goto(f"file://{path}", wait_until="load")
    found = _ran(page)
    page.close()
    assert found["pwned"] == 0 and found["title"] != "pwned", found
    assert SHOWN in found["text"] and "javascript:" in found["text"], found["text"][:2000]
    assert outside == [] and [url for url in requests if not url.startswith(("file:", "data:"))] == [], requests


@pytest.fixture(scope="module")
def formgrader(graded, tmp_path_factory):
    """nbgrader's formgrader: a Jupyter server in the course folder with nbgrader's extension, on
    127.0.0.1 with a token: its base URL and token."""
    state = tmp_path_factory.mktemp("jupyter-state")
    port, token = free_port(), secrets.token_hex(16)
    args = [PY, "-m", "jupyter", "server", f"--port={port}", "--ip=127.0.0.1", "--no-browser",
            f"--IdentityProvider.token={token}",
            "--ServerApp.jpserver_extensions", "nbgrader.server_extensions.formgrader=True"]
    if os.geteuid() == 0:
        args.append("--allow-root")
    env = dict(ENV, JUPYTER_RUNTIME_DIR=str(state / "runtime"), JUPYTER_CONFIG_DIR=str(state / "config"),
               JUPYTER_DATA_DIR=str(state / "data"))
    with serving(args, port=port, token=token, log=state / "server.log", what="formgrader", cwd=graded,
                 env=env) as base:
        yield base, token


def test_formgrader_shows_the_submission_as_data(browser, graded, formgrader):
    """The instructor's view of the autograded notebook in formgrader: the student's text is there,
    none of it runs (formgrader itself loads MathJax from a CDN: blocked here, and not the student's)."""
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{graded / 'gradebook.db'}", course_id="attention-book") as gb:
        submission = gb.find_submission_notebook(NAME, NAME, STUDENT).id
    base, token = formgrader
    page = browser.new_page()
    _watch(page)
    response = page.goto(f"{base}/formgrader/submissions/{submission}/?token={token}", wait_until="load")
    assert response is not None and response.ok, response and response.status
    found = _ran(page)
    page.close()
    assert found["pwned"] == 0 and found["title"] != "pwned", found
    assert found["box"] == ["INPUT"], found["box"]  # the test cell's score box, not the student's heading
    assert SHOWN in found["text"] and "A cell of my own" in found["text"], found["text"][:3000]
    assert "ValueError" in found["text"], found["text"][:3000]  # the error of its code cell, as text

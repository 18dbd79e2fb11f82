"""The book's Sphinx extensions (src/site-assets/) on a small known site (tests/build/site_fixture.py),
and the patch the website's widget manager gets (src/site-assets/vendor.py)."""

from __future__ import annotations

import html
import json
import re
import sys
from pathlib import Path

import matplotlib
import pytest

matplotlib.use("Agg")

from site_fixture import CONTROL_ID, PROGRESS_MODEL, ROOT, SLIDER_MODEL, build_demo_site, demo_explorer  # noqa: E402

sys.path.insert(0, str(ROOT / "src" / "site-assets"))
import book_pages  # noqa: E402
import vendor  # noqa: E402


@pytest.fixture(scope="module")
def page(tmp_path_factory) -> str:
    site = build_demo_site(tmp_path_factory.mktemp("demo"))
    return (site / "chapters" / "03_demo.html").read_text()


def _block(page: str) -> str:
    start = page.index(f'id="{CONTROL_ID}"')
    return page[start:page.index("</section>", start)]


def test_the_control_has_labelled_inputs(page):
    block = _block(page)
    assert re.search(r'<label for="ctl-demo-D">width D</label>', block)
    assert re.search(r'<input type="range" id="ctl-demo-D" data-control="0" min="0" max="2" step="1" value="1" '
                     r'aria-valuetext="4">', block)
    assert '<label for="ctl-demo-kind">score</label>' in block
    assert re.search(r'<select id="ctl-demo-kind" data-control="1"><option value="0" selected>unscaled</option>'
                     r'<option value="1">scaled</option></select>', block)


def test_every_setting_is_an_image_with_its_alt_text_in_order(page):
    block = _block(page)
    explorer = demo_explorer()
    alts = [html.unescape(a) for a in re.findall(r'<img alt="([^"]*)"', block)]
    assert alts == [explorer.alt_text(**s) for s in explorer.settings]
    states = json.loads(re.search(r'class="attnbook-control-states">(.*?)</script>', block).group(1))
    assert states["states"] == [explorer.indices(s) for s in explorer.settings]
    assert states["labels"] == [["1", "4", "16"], ["unscaled", "scaled"]]
    shown = re.findall(r'<div class="attnbook-control-state( attnbook-state-hidden)? [^"]*"', block)
    assert [hidden == "" for hidden in shown] == [s == explorer.initial for s in explorer.settings]


def test_a_stored_ipywidgets_control_is_left_out_and_a_progress_bar_kept(page):
    views = re.findall(r'widget-view\+json">(.*?)</script>', page)
    assert [json.loads(v)["model_id"] for v in views] == [PROGRESS_MODEL]
    assert SLIDER_MODEL not in "".join(views)


def test_figures_are_numbered_within_the_chapter(page):
    assert re.findall(r'caption-number">Figure ([\d.]+) ', page) == ["3.1", "3.2"]


def test_check_cells_fold_behind_show_the_check(page):
    assert page.count("Show the check") == 1
    check = page.index("Show the check")
    assert "# Check: the line falls" in page[check:check + 2000]


def test_each_fold_is_named_by_its_visible_prompt(page):
    """No fold carries MyST-NB's fixed name "Toggle hidden content": its summary is named by the
    prompt it shows (the browser tests check the accessible names in Chromium)."""
    assert "Toggle hidden content" not in page
    summary = page[page.rindex("<summary", 0, page.index("Show the check")):page.index("Show the check")]
    assert summary.startswith("<summary>"), summary


@pytest.mark.parametrize("docname,number", [
    ("chapters/03_scaled_dot_product", "3"), ("chapters/05b_four_scores", "5b"),
    ("chapters/00_attention_at_a_glance", "0"), ("chapters/notation", None), ("chapters/intro", None),
])
def test_chapter_number_from_the_file_name(docname, number):
    assert book_pages.chapter_number(docname) == number


def test_each_inline_script_once():
    from sphinx.builders.html._assets import _JavaScript

    body = {"body": "const THEBE_JS_URL = 1"}
    scripts = [_JavaScript(None, **body), _JavaScript("a.js"), _JavaScript("", **body), _JavaScript("a.js")]
    context = {"script_files": scripts}
    book_pages.one_copy_of_each_script(None, "p", "page.html", context, None)
    assert [(s.filename, s.attributes) for s in context["script_files"]] == [(None, body), ("a.js", {})]


def test_widget_manager_patch_calls_mathjax_3():
    call = 'void 0!==window.MathJax&&MathJax.Hub.Queue(["Typeset",MathJax.Hub,e])'
    source = ";".join([call, call.replace(",e]", ",t]"), call.replace(",e]", ",n]")])
    patched = vendor.patch_widget_manager(source)
    assert "MathJax.typesetPromise([e])" in patched and "MathJax.typesetPromise([n])" in patched
    assert patched.count('MathJax.Hub?MathJax.Hub.Queue(["Typeset"') == 3
    with pytest.raises(SystemExit, match="found 1"):
        vendor.patch_widget_manager(call)


def test_served_widget_manager_is_patched():
    served = ROOT / "_vendor" / "widgets" / "embed-amd.js"
    if not served.is_file():
        pytest.skip("_vendor/ is not built here (make vendor)")
    text = served.read_text(encoding="utf-8")
    calls = text.count('MathJax.Hub.Queue(["Typeset"')
    guarded = text.count('MathJax.Hub?MathJax.Hub.Queue(["Typeset"')
    assert calls == guarded == vendor.MATHJAX2_TYPESET_COPIES  # MathJax 2's call only where MathJax.Hub exists
    assert text.count("MathJax.typesetPromise&&MathJax.typesetPromise(") == vendor.MATHJAX2_TYPESET_COPIES


def test_config_loads_the_extensions():
    import yaml

    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    assert {"controls", "book_pages"} <= set(config["sphinx"]["local_extensions"])
    assert config["sphinx"]["config"]["html_context"]["default_mode"] == "auto"
    assert Path(ROOT / "src" / "site-assets" / "web" / "attnbook-controls.js").is_file()


# --- exercises (src/site-assets/exercises.py) ----------------------------------------------------

import exercises  # noqa: E402

SOLUTION_META = {"nbgrader": {"grade": False, "grade_id": "demo-solution", "locked": False, "schema_version": 3,
                              "solution": True, "task": False}, "tags": ["hide-input"]}
TEST_META = {"nbgrader": {"grade": True, "grade_id": "demo-test", "locked": True, "points": 1, "schema_version": 3,
                          "solution": False, "task": False}}
IMPORT_META = {"nbgrader": {"grade": False, "grade_id": "demo-import", "locked": True, "schema_version": 3,
                            "solution": False, "task": False}}
TASK_DATA_META = {"nbgrader": {"grade": False, "grade_id": "demo-data", "locked": True, "schema_version": 3,
                               "solution": False, "task": False}}


def _exercise_notebook():
    import nbformat

    v4 = nbformat.v4
    stdout = lambda text: v4.new_output("stream", name="stdout", text=text)  # noqa: E731
    passed = lambda part: v4.new_output("display_data", data={  # noqa: E731
        "text/plain": f"demo (part '{part}'): passed, 1/1"})
    nb = v4.new_notebook(cells=[
        v4.new_markdown_cell("# 3. Demo\n\n## Exercises\n\n### Exercise 3.1: double\n\nWrite `my_double(x)`."),
        v4.new_code_cell("from attnbook_classroom.grading import check", metadata=IMPORT_META, execution_count=1),
        v4.new_code_cell("table = [1, 2, 3]  # the task's data", metadata=TASK_DATA_META, execution_count=2),
        v4.new_code_cell("def my_double(x):\n    \"\"\"Twice x.\"\"\"\n    ### BEGIN SOLUTION\n    answer_line = 2 * x\n"
                         "    return answer_line\n    ### END SOLUTION\n\nprint('the answer is', my_double(21))",
                         metadata=SOLUTION_META, execution_count=3, outputs=[stdout("the answer is 42\n")]),
        v4.new_code_cell('check("demo", my_double, part="values").assert_passed()\n### BEGIN HIDDEN TESTS\n'
                         'check("demo", my_double, part="values", hidden=True).assert_passed()\n'
                         '### END HIDDEN TESTS', metadata=TEST_META, execution_count=4, outputs=[passed("values")]),
        v4.new_code_cell("seen = {'x'}\n### BEGIN SOLUTION\nseen = {'y'}\n### END SOLUTION",
                         metadata={**SOLUTION_META, "tags": [],
                                   "mystnb": {"code_prompt_show": "Compare", "code_prompt_hide": "Fold"}},
                         execution_count=5, outputs=[v4.new_output("execute_result", data={"text/plain": "stored answer: y"},
                                                                   execution_count=5)]),
        v4.new_code_cell("print('an ordinary cell')", execution_count=6, outputs=[stdout("an ordinary cell\n")]),
    ])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    return nb


EXERCISE_CONF = """
import sys
sys.path.insert(0, {assets!r})
extensions = ["myst_nb", "exercises", "book_pages"]
nb_execution_mode = "off"
nb_ipywidgets_js = {{}}
html_theme = "basic"
exclude_patterns = ["_build"]
"""


@pytest.fixture(scope="module")
def exercise_page(tmp_path_factory) -> str:
    import subprocess
    import textwrap

    import nbformat

    where = tmp_path_factory.mktemp("exercises")
    source = where / "source"
    (source / "chapters").mkdir(parents=True)
    (source / "conf.py").write_text(EXERCISE_CONF.format(assets=str(ROOT / "src" / "site-assets")))
    (source / "index.md").write_text(textwrap.dedent("""\
        # Demo book

        ```{toctree}
        chapters/03_demo
        ```
        """))
    nbformat.write(_exercise_notebook(), source / "chapters" / "03_demo.ipynb")
    subprocess.run([sys.executable, "-m", "sphinx", "-b", "html", "-W", "-q", "-E", str(source), str(where / "html")],
                   check=True, cwd=where)
    return (where / "html" / "chapters" / "03_demo.html").read_text()


def _text(page: str) -> str:
    """The page's text, without tags (highlighted code is split into spans)."""
    return html.unescape(re.sub(r"<[^>]+>", "", page))


def test_exercise_page_shows_no_grading(exercise_page):
    text = _text(exercise_page)
    for gone in ("BEGIN SOLUTION", "END SOLUTION", "HIDDEN TESTS", "passed, ", "check(", "hidden=True",
                 "attnbook_classroom"):
        assert gone not in text, f"{gone!r} is on the page"
    assert "Write my_double(x)." in text  # the task stays
    assert "table = [1, 2, 3]" in text  # and a read-only cell it needs


def test_solutions_are_folded_without_markers_or_outputs(exercise_page):
    text = _text(exercise_page)
    assert "the answer is 42" not in text and "stored answer" not in text  # no answer printed unasked
    folds = re.findall(r'<details class="[^"]*\bhide above-input\b[^"]*">.*?</details>', exercise_page, re.DOTALL)
    assert len(folds) == 2, folds
    first, second = (_text(fold) for fold in folds)
    assert "Show the solution" in first and "Hide the solution" in first
    assert "def my_double(x):\n    \"\"\"Twice x.\"\"\"\n    answer_line = 2 * x\n    return answer_line\n\n" in first
    assert "Compare" in second and "seen = {'x'}\nseen = {'y'}" in second  # its own prompt
    assert "an ordinary cell" in text  # other cells keep their outputs


@pytest.mark.parametrize("source,shown", [
    ("a = 1\n### BEGIN SOLUTION\nb = 2\n### END SOLUTION\n", "a = 1\nb = 2"),
    ("def f():\n    ### BEGIN SOLUTION\n    return 1\n    ### END SOLUTION", "def f():\n    return 1"),
    ("x()\n### BEGIN HIDDEN TESTS\ny()\n### END HIDDEN TESTS\nz()", "x()\nz()"),
    ("# ### BEGIN SOLUTION is a marker\nq = 1", "# ### BEGIN SOLUTION is a marker\nq = 1"),  # not a marker line
])
def test_without_markers(source, shown):
    assert exercises.without_markers(source) == shown


@pytest.mark.parametrize("metadata,source,role", [
    (SOLUTION_META, "x = 1", "solution"),
    (TEST_META, "check('a', f)", "grading"),
    (IMPORT_META, "from attnbook_classroom.grading import check", "grading"),
    (TASK_DATA_META, "table = [1]", None),
    (TASK_DATA_META, "from attnbook_classroom.grading import choices\n\nprint(choices)", None),  # sets the task
    (IMPORT_META, "# the grader\nimport attnbook_classroom.grading", "grading"),
    ({"tags": ["hide-input"]}, "# Check: x\nassert x", None),
    ({}, "from attnbook_classroom.grading import check", None),  # not nbgrader's: not this extension's business
])
def test_nbgrader_role(metadata, source, role):
    assert exercises.nbgrader_role(metadata, source) == role

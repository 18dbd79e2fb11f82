"""The runnable edition (chapters/runnable/): current, free of MyST, figures shown, exercises unsolved.

The tests on the real files read the committed edition and its chapters; the converter's own tests
use a small book written into a temporary folder. Running the edition top to bottom (its exercises
answered from the chapters' solutions) is `make nbval-runnable`.
"""

from __future__ import annotations

import base64
import html.parser
import inspect
import json
import pathlib
import re

import nbformat
import pytest

from bookbuild.runnable import (EDITION_DIR, Book, RunnableError, copy_missing, edition_notebooks, exercises_start,
                                filled_copy, runnable_notebook, stale_notebooks, write_filled_copies)
from bookbuild.runnable.syntax import without_code

ROOT = pathlib.Path(__file__).resolve().parents[2]
BOOK = Book(ROOT)
CHAPTERS = BOOK.notebooks()
IDS = [c.stem for c in CHAPTERS]
# What must never reach a reader of the runnable edition: MyST syntax, solutions, hidden tests.
MYST_MARKERS = ["{glue", "{doc}", "{numref}", "{cite", "{eq}", "{ref}", "{literalinclude}", ":pyobject:",
                ":::", "```{"]
SOLUTION_MARKERS = ["BEGIN SOLUTION", "END SOLUTION", "BEGIN HIDDEN TESTS", "END HIDDEN TESTS"]
ROLE_OR_DIRECTIVE = re.compile(r"\{[a-z][\w:+-]*\}`|^\s*(```+|:::+)\s*\{", re.M)


def edition(chapter: pathlib.Path) -> nbformat.NotebookNode:
    return nbformat.read(ROOT / EDITION_DIR / chapter.name, as_version=4)


def source(chapter: pathlib.Path) -> nbformat.NotebookNode:
    return nbformat.read(chapter, as_version=4)


def test_the_committed_edition_is_what_the_chapters_generate():
    stale = stale_notebooks(ROOT)
    assert not stale, f"{EDITION_DIR}/ is out of date ({', '.join(stale)}): run `make runnable` and commit it"


def test_every_chapter_has_its_runnable_notebook_and_no_other():
    assert CHAPTERS, "no chapter notebook in _toc.yml"
    assert sorted(p.name for p in (ROOT / EDITION_DIR).glob("*.ipynb")) == sorted(c.name for c in CHAPTERS)


@pytest.mark.parametrize("chapter", CHAPTERS, ids=IDS)
def test_no_myst_no_solution_no_hidden_test(chapter):
    nb = edition(chapter)
    for index, cell in enumerate(nb.cells):
        found = [m for m in MYST_MARKERS + SOLUTION_MARKERS if m in cell.source]
        assert not found, f"{chapter.stem} cell {index}: {found} in\n{cell.source[:400]}"
        if cell.cell_type == "markdown":  # any other role or directive, outside code blocks
            prose = "\n".join(without_code(cell.source.splitlines()))
            assert not ROLE_OR_DIRECTIVE.search(prose), f"{chapter.stem} cell {index}: {prose[:400]}"


@pytest.mark.parametrize("chapter", CHAPTERS, ids=IDS)
def test_exercises_are_in_student_form_with_their_visible_tests(chapter):
    """Every solution is nbgrader's stub, none of the solution code is anywhere in the notebook,
    every test cell is there with its visible tests and without stored results."""
    nb, src = edition(chapter), source(chapter)
    graded = {c.metadata["nbgrader"]["grade_id"]: c for c in nb.cells if "nbgrader" in c.metadata}
    text = "\n".join(c.source for c in nb.cells)
    solutions = 0
    for cell in src.cells:
        grading = cell.metadata.get("nbgrader")
        if not grading:
            continue
        ours = graded.get(grading["grade_id"])
        assert ours is not None, f"{chapter.stem}: exercise cell {grading['grade_id']} is missing"
        if cell.cell_type == "code":
            assert not ours.outputs, f"{chapter.stem}: {grading['grade_id']} keeps the source's stored results"
        if grading.get("solution"):
            solutions += 1
            assert "raise NotImplementedError()" in ours.source or "YOUR ANSWER HERE" in ours.source
            answer = cell.source.split("### BEGIN SOLUTION", 1)[1].split("### END SOLUTION", 1)[0].strip()
            assert answer not in text, f"{chapter.stem}: the solution of {grading['grade_id']} is shown"
        if grading.get("grade"):
            visible = re.sub(r"### BEGIN HIDDEN TESTS.*?### END HIDDEN TESTS\n?", "", cell.source, flags=re.S)
            assert ours.source.strip() == visible.strip(), f"{chapter.stem}: {grading['grade_id']} differs"
            assert ours.source.strip(), f"{chapter.stem}: {grading['grade_id']} has no visible test"
    assert solutions, f"{chapter.stem} has no exercise to solve"


def _texts(output) -> list[str]:
    """What an output says in text: a stream's text, a result's or display's text/plain."""
    if output.get("output_type") == "stream":
        return [output.get("text", "")]
    if output.get("output_type") == "error":
        return [output.get("ename", "")]
    data = output.get("data", {})
    return [v for k, v in data.items() if k.endswith("text/plain") or k.endswith("text/html")]


@pytest.mark.parametrize("chapter", CHAPTERS, ids=IDS)
def test_every_cell_before_the_exercises_ran_and_keeps_the_chapters_outputs(chapter):
    """A reader opening the edition sees it as run top to bottom: every code cell before the
    exercises has an execution count (1, 2, ... in order) and the outputs its chapter stored,
    every one of them (a control's precomputed states become the still of its initial setting);
    the exercises in student form have not run (no outputs, no counts)."""
    from attnbook_tools.widgets import is_precomputed_state

    nb, src = edition(chapter), source(chapter)
    by_id = {c.id: c for c in src.cells if c.cell_type == "code"}
    start = exercises_start(nb.cells)
    assert start < len(nb.cells), f"{chapter.stem}: no exercises heading in the edition"
    code = [c for c in nb.cells[:start] if c.cell_type == "code"]
    assert [c.execution_count for c in code] == list(range(1, len(code) + 1)), (
        f"{chapter.stem}: execution counts {[c.execution_count for c in code]}")
    matched = 0
    for cell in code:
        for output in cell.outputs:
            if output.output_type == "execute_result":
                assert output.execution_count == cell.execution_count, f"{chapter.stem} {cell.id}"
        original = by_id.get(cell.id)
        if original is None:  # the install cell and the cells that show a glued figure
            assert cell.id == "install-the-book" or cell.id.endswith("-figure"), f"{chapter.stem}: {cell.id}"
            continue
        matched += 1
        assert bool(cell.outputs) == bool(original.outputs), (
            f"{chapter.stem} cell {cell.id}: the chapter stored {len(original.outputs)} output(s), "
            f"the edition {len(cell.outputs)}")
        states = [o for o in original.outputs if is_precomputed_state(o)]
        if states:
            stills = [o for o in cell.outputs if "image/png" in o.get("data", {})]
            assert len(stills) == 1 and stills[0].data["image/png"] in [o.data["image/png"] for o in states], (
                f"{chapter.stem} cell {cell.id}: a control shows the still of one of its states")
        ours = [t for o in cell.outputs for t in _texts(o)]
        theirs = [t for o in original.outputs if not is_precomputed_state(o) for t in _texts(o)]
        assert ours == theirs, f"{chapter.stem} cell {cell.id}: the outputs' text differs from the chapter's"
    assert matched == len([c for c in src.cells[:len(src.cells) - len(_exercises(src))]
                           if c.cell_type == "code" and not _is_colab_cell(c)]), f"{chapter.stem}: a code cell is missing"
    for cell in nb.cells[start:]:
        if cell.cell_type == "code":
            assert not cell.outputs and cell.execution_count is None, (
                f"{chapter.stem} cell {cell.id}: an exercise in student form carries a run")


def _exercises(nb) -> list:
    from bookbuild.notebooks import exercise_section

    return exercise_section(nb)


def _is_colab_cell(cell) -> bool:
    return "remove-cell" in cell.metadata.get("tags", []) and "google.colab" in cell.source


def _glued_figures(nb) -> dict[str, str]:
    return {o.metadata["scrapbook"]["name"]: o.data["application/papermill.record/image/png"]
            for c in nb.cells for o in c.get("outputs", [])
            if "application/papermill.record/image/png" in o.get("data", {})}


@pytest.mark.parametrize("chapter", CHAPTERS, ids=IDS)
def test_every_discussed_figure_is_an_image_output_where_the_text_shows_it(chapter):
    nb, src = edition(chapter), source(chapter)
    glued = _glued_figures(src)
    pasted = re.findall(r"\{glue:figure\}\s*(\S+)", "\n".join(c.source for c in src.cells if c.cell_type == "markdown"))
    shown = [(i, o) for i, c in enumerate(nb.cells) for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
    images = [o.data["image/png"] for _, o in shown]
    for name in pasted:
        assert glued[name] in images, f"{chapter.stem}: the figure {name} is not shown as an image"
        i = next(i for i, o in shown if o.data["image/png"] == glued[name])
        caption = nb.cells[i + 1]
        assert caption.cell_type == "markdown" and "Description of the figure" in caption.source, (
            f"{chapter.stem}: the figure {name} has no caption and description under it")
        assert base64.b64decode(glued[name])[:8] == b"\x89PNG\r\n\x1a\n"
    # Every "Figure N" the text names is a figure shown in this notebook (or a link to another one).
    numbers = {m for c in nb.cells if c.cell_type == "markdown" for m in re.findall(r"\*\*Figure (\d+[a-z]?\.\d+|\d+)\.\*\*", c.source)}
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            for number in re.findall(r"(?<!\[)Figure (\d+[a-z]?\.\d+|\d+)(?!\]\()", cell.source):
                assert number in numbers, f"{chapter.stem}: Figure {number} is named but not shown here"
    # No output is left that a plain renderer cannot show, except MyST-NB's invisible records.
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            assert not any(k.startswith("application/papermill.record/image") for k in data)


class _Text(html.parser.HTMLParser):
    """The text a reader sees on an HTML page (scripts and styles left out)."""

    def __init__(self):
        super().__init__()
        self.parts, self._skip = [], 0

    def handle_starttag(self, tag, attrs):
        self._skip += tag in ("script", "style")

    def handle_endtag(self, tag):
        self._skip -= tag in ("script", "style") and self._skip > 0

    def handle_data(self, data):
        if not self._skip:
            self.parts.append(data)


@pytest.mark.filterwarnings("ignore:Your element with mimetype")  # MyST-NB's records: not shown, as wanted
@pytest.mark.parametrize("chapter", CHAPTERS, ids=IDS)
def test_a_plain_renderer_shows_no_raw_markup(chapter):
    """nbconvert's standard HTML template, i.e. what a plain Jupyter renderer shows."""
    from nbconvert import HTMLExporter

    page, _ = HTMLExporter().from_notebook_node(edition(chapter))
    parser = _Text()
    parser.feed(page)
    text = "".join(parser.parts)
    found = [m for m in MYST_MARKERS + SOLUTION_MARKERS + [":name:", ":alt:"] if m in text]
    assert not found, f"{chapter.stem}: {found} on the rendered page"
    figures = len(re.findall(r"\{glue:figure\}", "\n".join(c.source for c in source(chapter).cells)))
    assert page.count("<img ") >= figures


# --- filled copies (what `make nbval-runnable` runs) -------------------------------------------


def test_filled_copies_answer_every_exercise_from_the_chapters(tmp_path):
    written = write_filled_copies(ROOT, tmp_path)
    assert [p.name for p in written] == [c.name for c in CHAPTERS]
    for chapter, path in zip(CHAPTERS, written):
        filled, src = nbformat.read(path, as_version=4), source(chapter)
        solutions = {c.metadata["nbgrader"]["grade_id"]: c for c in src.cells if "nbgrader" in c.metadata}
        for cell in filled.cells:
            grading = cell.metadata.get("nbgrader")
            if grading and cell.cell_type == "code":
                original = solutions[grading["grade_id"]]
                assert cell.outputs == original.outputs
                if grading.get("solution"):
                    assert cell.source == original.source
        counts = [c.execution_count for c in filled.cells if c.cell_type == "code"]
        assert counts == list(range(1, len(counts) + 1)), f"{chapter.stem}: execution counts {counts}"


# --- the converter on a small book -------------------------------------------------------------


def _small_book(tmp_path, cells, url="https://github.com/someone/small-book", extra=None) -> pathlib.Path:
    (tmp_path / "_config.yml").write_text(
        f"title: Small\nrepository:\n  url: {url}\n  branch: trunk\nbibtex_bibfiles:\n  - chapters/refs.bib\n")
    (tmp_path / "_toc.yml").write_text(
        "format: jb-book\nroot: chapters/intro\nchapters:\n  - file: chapters/one\n  - file: chapters/two\n")
    chapters = tmp_path / "chapters"
    chapters.mkdir()
    (chapters / "intro.md").write_text("# Small book\n")
    (chapters / "refs.bib").write_text(
        "@article{ada1843,\n  title={Notes},\n  author={Lovelace, Ada},\n  journal={Memoirs},\n  year={1843}\n}\n"
        "@article{two2020,\n  title={Pairs},\n  author={Alpha, Ann and Beta, Bo},\n  journal={J},\n  year={2020}\n}\n")
    two = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(
        "# Two\n\n```{glue:figure} g\n:name: fig-two\nOther.\n```\n\n(sec-two)=\n## Part two\n\n$$\nx\n$$ (eq-two)\n")])
    nbformat.write(two, chapters / "two.ipynb")
    nb = nbformat.v4.new_notebook(cells=cells)
    site_labels = "src/site-assets/bibliography_style.py"  # the website's citation labels
    for name, content in {site_labels: (ROOT / site_labels).read_text(), **(extra or {})}.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(content)
    nbformat.write(nb, chapters / "one.ipynb")
    return chapters / "one.ipynb"


def _glue_output(name, data):
    return nbformat.v4.new_output("display_data", data={f"application/papermill.record/{k}": v for k, v in data.items()},
                                  metadata={"scrapbook": {"name": name, "mime_prefix": "application/papermill.record/"}})


PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"0" * 16).decode()


def _code(source, outputs=(), tags=(), **metadata):
    cell = nbformat.v4.new_code_cell(source)
    cell.outputs, cell.execution_count = list(outputs), 1 if outputs else None
    if tags:
        cell.metadata["tags"] = list(tags)
    cell.metadata.update(metadata)
    return cell


def _convert(tmp_path, cells, **kw):
    path = _small_book(tmp_path, cells, **kw)
    book = Book(tmp_path)
    return runnable_notebook(path, book), book


def _markdown(nb) -> str:
    return "\n\n".join(c.source for c in nb.cells if c.cell_type == "markdown")


def test_roles_become_text_and_links(tmp_path):
    cells = [
        _code("glue('x', 0.123456)\nglue('n', 12345)\nglue('fig', fig)",
              [_glue_output("x", {"text/plain": "0.123456"}), _glue_output("n", {"text/plain": "12345"}),
               _glue_output("fig", {"image/png": PNG, "text/plain": "<Figure size 10x10 with 1 Axes>"})]),
        nbformat.v4.new_markdown_cell(
            "# One\n\nx is {glue:text}`x:.2f`, n is {glue:text}`n:,.0f` and {glue}`x`. See {doc}`two`, "
            "{doc}`the start <intro>`, {numref}`fig-two`, {numref}`Figure %s <fig-one>`, {ref}`sec-two`, "
            "{eq}`eq-two`, {cite}`two2020,ada1843`, {cite:t}`ada1843`, {math}`a^2` and [two](two.ipynb).\n\n"
            "% a comment\n(a-target)=\n```{glue:figure} fig\n:name: fig-one\n:alt: A square.\nThe {doc}`two` figure.\n```\n"),
    ]
    nb, book = _convert(tmp_path, cells)
    text = _markdown(nb)
    assert "x is 0.12, n is 12,345 and 0.123456." in text
    assert "See [Two](two.ipynb), [the start](https://github.com/someone/small-book/blob/trunk/chapters/intro.md)" in text
    # outside the chapters, figures are numbered through the book in reading order, as on the website
    assert "[Figure 2](two.ipynb), Figure 1, [Part two](two.ipynb), [(1)](two.ipynb)" in text
    assert "[Alpha and Beta, 2020, Lovelace, 1843], Lovelace [1843], $a^2$ and [two](two.ipynb)." in text
    assert "**Figure 1.** The [Two](two.ipynb) figure." in text and "A square." in text
    assert "## References" in text and "Ada Lovelace" in text
    assert "% a comment" not in text and "(a-target)=" not in text
    figure = next(c for c in nb.cells if c.cell_type == "code" and c.source == "fig")
    assert figure.outputs[0].data["image/png"] == PNG
    assert figure.outputs[0].data["text/plain"] == "<Figure size 10x10 with 1 Axes>"
    glue_cell = next(c for c in nb.cells if "glue('fig', fig)" in c.source)
    assert all("application/papermill.record/image/png" not in o.data for o in glue_cell.outputs)


def test_directives_become_markdown_and_code(tmp_path):
    cells = [nbformat.v4.new_markdown_cell(
        "# One\n\n```{note}\nMasks are **bool**; see {doc}`two`.\n```\n\n:::{admonition} Careful\n:class: tip\n"
        "Two lines\nof text.\n:::\n\n```{literalinclude} ../src/pkg/mod.py\n:pyobject: second\n:lines: 1-2\n```\n\n"
        "```{math}\n:label: eq-one\ny = x\n```\n\n```python\n{doc}`kept as code`\n```\n")]
    nb, _ = _convert(tmp_path, cells, extra={"src/pkg/mod.py": "def first():\n    return 1\n\n\n"
                                             "def second(a):\n    \"\"\"Doc.\"\"\"\n    return a\n"})
    text = _markdown(nb)
    assert "> **Note**\n>\n> Masks are **bool**; see [Two](two.ipynb)." in text
    assert "> **Careful**\n>\n> Two lines\n> of text." in text
    assert '```python\ndef second(a):\n    """Doc."""\n```' in text
    assert "$$\ny = x \\tag{1}\n$$" in text  # the book's first labelled equation
    assert "```python\n{doc}`kept as code`\n```" in text


def test_the_real_literalinclude_shows_the_package_code():
    """Chapter 0 includes the whole of `attention`: the edition shows exactly the code that runs."""
    from attnbook import functional

    nb = edition(ROOT / "chapters/00_attention_at_a_glance.ipynb")
    expected = inspect.getsource(functional.attention).rstrip("\n")
    # the chapter folds it in a dropdown, which the edition renders as a quote: read the quote's text
    unquoted = re.sub(r"^> ?", "", _markdown(nb), flags=re.M)
    assert f"```python\n{expected}\n```" in unquoted


@pytest.mark.parametrize("markdown, message", [
    ("```{tab-set}\nx\n```", "tab-set"),
    ("{unknownrole}`x`", "unknownrole"),
    ("{doc}`nowhere`", "names no page"),
    ("{cite}`nobody`", "not in the bibliography"),
    ("{numref}`fig-none`", "no numbered figure"),
    ("{glue:text}`missing`", "nothing was glued"),
])
def test_what_has_no_plain_form_is_an_error_that_names_it(tmp_path, markdown, message):
    with pytest.raises(RunnableError, match=message):
        _convert(tmp_path, [nbformat.v4.new_markdown_cell(markdown)])


def test_a_figure_variable_assigned_again_before_the_figure_is_an_error(tmp_path):
    cells = [_code("glue('f', fig)", [_glue_output("f", {"image/png": PNG, "text/plain": "<Figure>"})]),
             _code("fig = None"),
             nbformat.v4.new_markdown_cell("```{glue:figure} f\n:name: fig-f\nCaption.\n```")]
    with pytest.raises(RunnableError, match="assigned again"):
        _convert(tmp_path, cells)


def test_site_tags_and_website_only_outputs(tmp_path):
    widget = nbformat.v4.new_output("display_data", data={
        "application/vnd.jupyter.widget-view+json": {"model_id": "m", "version_major": 2, "version_minor": 0},
        "text/plain": "interactive(...)"})
    state = nbformat.v4.new_output("display_data", data={"image/png": PNG},
                                   metadata={"attnbook": {"control": {"id": "ctl-x", "state": 0}}})
    spec = [{"name": "t", "label": "t", "kind": "slider", "labels": ["a", "b"], "value": 1}]
    states = [nbformat.v4.new_output("display_data", data={"image/png": png}, metadata={"attnbook": {"control": {
        "id": "ctl-y", "state": i, "indices": [i], "alt": f"State {i}.", "controls": spec}}})
        for i, png in enumerate([PNG, base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"1" * 16).decode()])]
    cells = [
        _code("import sys\nif 'google.colab' in sys.modules:\n    pass", tags=["remove-cell"]),
        _code("hidden = 1", [nbformat.v4.new_output("stream", name="stdout", text="x\n")], tags=["remove-cell"]),
        nbformat.v4.new_markdown_cell("Only on the website's source.", metadata={"tags": ["remove-cell"]}),
        nbformat.v4.new_markdown_cell("Website only.", metadata={"tags": ["site-only"]}),
        nbformat.v4.new_markdown_cell("Here only.", metadata={"tags": ["remove-cell", "runnable-only"]}),
        _code("interact(...)", [widget, state], tags=["nbval-ignore-output"]),
        _code("explore(...)", states, tags=["nbval-ignore-output"]),
        _code("secret()", [nbformat.v4.new_output("stream", name="stdout", text="y\n")], tags=["remove-output"]),
        _code("quiet = 2"),
    ]
    nb, book = _convert(tmp_path, cells)
    sources = [c.source for c in nb.cells]
    assert "https://github.com/someone/small-book" in sources[0] and '"trunk"' in sources[0]
    assert "google.colab' in sys.modules:\n    pass" not in "\n".join(sources)  # the chapter's own Colab cell
    hidden = next(c for c in nb.cells if c.source == "hidden = 1")
    assert hidden.metadata["jupyter"] == {"source_hidden": True, "outputs_hidden": True} and hidden.outputs
    assert "Only on the website's source." not in sources and "Website only." not in sources
    assert "Here only." in sources
    control = next(c for c in nb.cells if c.source == "interact(...)")
    assert [list(o.data) for o in control.outputs] == [list(widget.data)]
    assert control.metadata["tags"] == ["nbval-ignore-output"]
    # a control's precomputed states: the still of its initial setting, until the live control runs
    still = next(c for c in nb.cells if c.source == "explore(...)").outputs
    assert [(o.output_type, o.data, o.metadata) for o in still] == [
        ("display_data", {"image/png": states[1].data["image/png"]}, {"image/png": {"alt": "State 1."}})]
    # the site removes these outputs; here they are folded away, not lost
    secret = next(c for c in nb.cells if c.source == "secret()")
    assert [o.text for o in secret.outputs] == ["y\n"] and secret.metadata["jupyter"] == {"outputs_hidden": True}
    # every code cell ran, in order, printing or not
    counts = [c.execution_count for c in nb.cells if c.cell_type == "code"]
    assert counts == list(range(1, len(counts) + 1))


def test_the_install_cell_runs_outside_colab():
    nb = edition(CHAPTERS[0])
    config_url = BOOK.repository_url
    assert config_url in nb.cells[0].source and "google.colab" in nb.cells[0].source
    exec(compile(nb.cells[0].source, "install-cell", "exec"), {})  # outside Colab: only checks the import


def test_filled_copy_restores_solutions_and_outputs():
    chapter = CHAPTERS[0]
    filled = filled_copy(edition(chapter), source(chapter))
    solution = next(c for c in filled.cells if c.metadata.get("nbgrader", {}).get("solution"))
    assert "### BEGIN SOLUTION" in solution.source and "raise NotImplementedError()" not in solution.source


def test_copy_missing_never_overwrites_a_students_notebook(tmp_path):
    edition_dir, workspace = tmp_path / "edition", tmp_path / "work"
    edition_dir.mkdir()
    (edition_dir / "a.ipynb").write_text("new a")
    (edition_dir / "b.ipynb").write_text("new b")
    workspace.mkdir()
    (workspace / "a.ipynb").write_text("my edits")
    assert copy_missing(edition_dir, workspace) == [workspace / "b.ipynb"]
    assert (workspace / "a.ipynb").read_text() == "my edits" and (workspace / "b.ipynb").read_text() == "new b"
    (workspace / "b.ipynb").write_text("edited b")
    assert copy_missing(edition_dir, workspace) == []
    assert (workspace / "b.ipynb").read_text() == "edited b"


def test_the_generated_files_are_deterministic_json():
    first = edition_notebooks(ROOT, CHAPTERS[:1])
    second = edition_notebooks(ROOT, CHAPTERS[:1])
    assert first == second
    for text in first.values():
        json.loads(text)


def test_binder_installs_the_cpu_build_of_torch():
    from packaging.specifiers import SpecifierSet

    binder = (ROOT / ".binder" / "requirements.txt").read_text()
    lines = [line.split("#")[0].strip() for line in binder.splitlines()]
    assert "--extra-index-url https://download.pytorch.org/whl/cpu" in lines
    pin = next(line for line in lines if line.startswith("torch=="))
    assert pin.endswith("+cpu")
    top = next(line for line in (ROOT / "requirements.txt").read_text().splitlines() if line.startswith("torch=="))
    assert SpecifierSet(top.removeprefix("torch")).contains(pin.removeprefix("torch=="))
    post = ROOT / ".binder" / "postBuild"  # then a student's environment, at the top-level pins
    assert post.stat().st_mode & 0o111 and 'pip install -c requirements.txt --no-build-isolation -e ".[lab]"' in post.read_text()


def test_the_site_ignores_the_edition_and_the_workspace():
    import yaml

    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    for folder in (EDITION_DIR, "chapters/workspace"):
        assert folder in config["exclude_patterns"] and f"{folder}/*" in config["exclude_patterns"]
    assert "chapters/workspace/" in (ROOT / ".gitignore").read_text().splitlines()


# --- a playground, not a trap: the checks of the runnable edition --------------------------------


def _checks(nb) -> list:
    return [c for c in nb.cells[:exercises_start(nb.cells)]
            if c.cell_type == "code" and "hide-input" in c.metadata.get("tags", [])
            and re.match(r"^\s*#\s*Check\b", c.source)]


@pytest.mark.parametrize("chapter", CHAPTERS, ids=IDS)
def test_every_check_runs_its_code_as_a_playground_and_the_notebook_says_so(chapter):
    from bookbuild.runnable.edition import playground_source

    checks = _checks(source(chapter))
    by_id = {c.id: c for c in edition(chapter).cells}
    for check in checks:
        assert by_id[check.id].source == playground_source(check.source), (
            f"{chapter.stem}: the check {check.source.splitlines()[0]!r} is not run by playground_check")
    notes = [c for c in edition(chapter).cells if c.cell_type == "markdown"
             and "`# Check:`" in c.source and "runs on" in c.source]
    assert len(notes) == 1 and edition(chapter).cells.index(notes[0]) == 2, (
        f"{chapter.stem}: the note on the checks is not once, under the title")


def test_playground_source_keeps_the_code_and_refuses_what_indenting_would_change():
    from bookbuild.runnable.edition import playground_source

    check = "# Check: x is three\n# (and y follows)\nassert x == 3, x\n\ny = x + 1"
    wrapped = playground_source(check)
    assert wrapped == ("# Check: x is three\n# (and y follows)\n"
                       "from attnbook_tools.playground import playground_check\n"
                       "with playground_check():\n    assert x == 3, x\n\n    y = x + 1")
    with pytest.raises(RunnableError, match="string over several lines"):
        playground_source('# Check: a\nassert x, """one\ntwo"""')
    with pytest.raises(RunnableError, match="IPython syntax"):
        playground_source("# Check: a\n%time assert x")
    # a docstring's indentation is not part of what it says
    assert "    def f():\n        \"\"\"one\n        two\"\"\"" in playground_source(
        '# Check: a\ndef f():\n    """one\n    two"""\n    return 1\nassert f() == 1')


def test_a_check_that_a_change_breaks_explains_itself_and_the_notebook_runs_on(monkeypatch):
    """A student asks about another word: the check prints what it expected and what this run gave,
    and the next cell runs; under ATTNBOOK_STRICT_CHECKS=1 (make nbval-runnable) the check fails."""
    from nbclient import NotebookClient
    from bookbuild.runnable.edition import playground_source

    monkeypatch.delenv("ATTNBOOK_STRICT_CHECKS", raising=False)
    check = playground_source('# Check: cat gets the largest weight\ntop = "sat"  # the student asked about another '
                              'word\nassert (top ==\n        "cat"), top')
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(check),
                                         nbformat.v4.new_code_cell('print("the next cell ran")'),
                                         nbformat.v4.new_code_cell('import os\nos.environ["ATTNBOOK_STRICT_CHECKS"] = "1"'),
                                         nbformat.v4.new_code_cell(check)])
    NotebookClient(nb, timeout=60, kernel_name="python3", allow_errors=True).execute()
    soft, after, strict = nb.cells[0].outputs, nb.cells[1].outputs, nb.cells[3].outputs
    note = "".join(o.get("text", "") for o in soft)
    assert all(o.output_type == "stream" for o in soft), soft
    assert note.startswith('This check does not hold for your run:\n    assert (top ==\n            "cat"), top\n'
                           'Your run gave: sat\n'), note
    words = " ".join(note.split())
    assert "no longer holds is expected" in words and "the notebook runs on" in words
    assert after[0].text == "the next cell ran\n"
    assert [(o.output_type, o.get("ename")) for o in strict] == [("error", "AssertionError")], strict


def test_the_student_environment_carries_every_package_a_chapter_imports():
    import ast
    import sys
    import tomllib

    from bookbuild.notebooks import python_of
    from bookbuild.runnable.colab import STUDENT_PACKAGES, chapter_packages

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]

    def packages(extra: str) -> set[str]:
        found = set()
        for requirement in extras[extra]:
            name = re.split(r"[<>=\[ ;]", requirement, maxsplit=1)[0].lower()
            found |= packages(requirement[len("attnbook["):-1]) if name == "attnbook" else {name}
        return found

    lab = packages("lab") | {"torch", "attnbook", "attnbook_tools", "attnbook_classroom"}
    imported = set()
    for chapter in CHAPTERS:
        for cell in edition(chapter).cells:
            if cell.cell_type == "code":
                for node in ast.walk(python_of(cell.source)):
                    if isinstance(node, ast.Import):
                        imported |= {a.name.split(".")[0] for a in node.names}
                    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                        imported.add(node.module.split(".")[0])
    missing = sorted(m for m in imported - lab if m not in sys.stdlib_module_names)
    assert not missing, f"the chapters import {missing}, which pyproject.toml's `lab` extra does not carry"
    assert set(STUDENT_PACKAGES) <= packages("lab") - packages("book")
    pins = (ROOT / "requirements.txt").read_text().splitlines()
    for chapter in CHAPTERS:  # the Colab cell installs what the chapter imports beyond `book`, pinned
        needed = chapter_packages(source(chapter))
        first = edition(chapter).cells[0].source
        for package in needed:
            pin = next(line for line in pins if line.startswith(f"{package}=="))
            assert f'"{pin}"' in first, f"{chapter.stem}: its Colab cell does not install {pin}"
    assert chapter_packages(source(BOOK.path("chapters/11_grouped_query_and_sliding_window"))) == ["transformers"]


def test_make_lab_allows_root_only_as_root_and_runs_one_thread():
    from bookbuild.runnable.__main__ import lab_command, lab_environment

    work = pathlib.Path("/tmp/work")
    assert "--allow-root" in lab_command(work, [], euid=0)
    assert "--allow-root" not in lab_command(work, [], euid=1000)
    assert lab_command(work, ["--allow-root"], euid=0).count("--allow-root") == 1
    assert lab_environment({})["OMP_NUM_THREADS"] == "1" and lab_environment({})["MKL_NUM_THREADS"] == "1"
    assert lab_environment({"OMP_NUM_THREADS": "4"})["OMP_NUM_THREADS"] == "4"  # the student's choice stays
    start = ROOT / ".binder" / "start"  # Binder: the same single thread
    assert start.stat().st_mode & 0o111 and "OMP_NUM_THREADS" in start.read_text()
    assert start.read_text().rstrip().endswith('exec "$@"')


def test_nbval_runnable_runs_the_students_environment_with_strict_checks():
    import subprocess

    dry = subprocess.run(["make", "-n", "--no-print-directory", "nbval-runnable"], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout
    run = next(line for line in dry.splitlines() if "--nbval " in line)
    assert "--nbval-kernel-name attnbook-lab" in run and "--nbval-current-env" not in run
    assert "ATTNBOOK_STRICT_CHECKS=1" in run and "test-kernel/share/jupyter" in run
    assert "ipykernel install --prefix" in dry or (ROOT / ".venv-lab" / ".installed").is_file()

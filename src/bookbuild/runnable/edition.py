"""The runnable edition: each executed chapter as a notebook that reads well in any Jupyter.

:func:`runnable_notebook` turns one chapter (an executed notebook written for the website's MyST
renderer) into its runnable edition:

- the first cell installs the book in Colab, from ``_config.yml``'s ``repository.url`` and branch
  (:func:`install_cell`); the chapter's own Colab cell is left out;
- every Markdown cell is plain Markdown (:mod:`bookbuild.runnable.myst`): glued numbers written in,
  references resolved, included package code shown, admonitions as block quotes; a chapter that
  cites ends its reading part with its references;
- each ``{glue:figure}`` becomes a code cell showing the figure (the glued variable, whose stored
  output is the glued image), then the caption and alt text in Markdown; the cell that glued it keeps
  MyST-NB's record (no renderer shows it), without the image bytes;
- the site's tags are honoured: ``remove-cell`` Markdown is left out and ``remove-cell`` code is kept
  but collapsed (later cells may need it), ``remove-input``/``hide-input`` collapse the code,
  ``remove-output``/``hide-output`` the outputs (collapsed, not dropped: they are what the cell
  printed, and nbval compares them); ``site-only`` cells are left out, ``runnable-only`` cells are
  kept though the site removes them;
- the exercises are in student form (:func:`student_exercise_cells`): solutions replaced by
  ``raise NotImplementedError()``, hidden tests removed, visible tests kept, their outputs cleared;
- outputs that only the website needs are dropped (:func:`website_only_output`): of a control's
  precomputed states only the initial setting's image stays, as a still picture until the cell
  runs and shows the live control;
- every code cell before the exercises keeps the chapter's stored outputs and gets an execution
  count, 1, 2, ... in reading order (the chapter ran them all, top to bottom); the exercises in
  student form have not run, so they have neither;
- it is a playground: each folded check cell (tagged ``hide-input``, first line ``# Check: ...``)
  runs its unchanged code inside ``with playground_check():`` (:func:`playground_source`), which
  prints a note instead of stopping the notebook when a student's change makes the check fail
  (:mod:`attnbook_tools.playground`; ``make nbval-runnable`` runs it strict), and a note under the
  title says once what these cells are (:func:`checks_note`).

:func:`filled_copy` is the other direction, for checking: the runnable edition with the source's
solutions and the source's stored outputs put back into the exercise cells, so that nbval can run
it top to bottom and compare every stored output.
"""

from __future__ import annotations

import ast
import copy
import hashlib
import io
import pathlib
import re
import tokenize

import nbformat

from attnbook_tools.widgets import is_precomputed_state
from bookbuild.notebooks import GLUE_PREFIX, exercise_section, glued_values, python_of
from bookbuild.notebooks import student_exercise_cells as student_section
from bookbuild.runnable.book import Book, RunnableError
from bookbuild.runnable.colab import STUDENT_PACKAGES, chapter_packages, install_cell
from bookbuild.runnable.myst import FigureBlock, MarkdownConverter

__all__ = ["EDITION_DIR", "install_cell", "runnable_notebook", "student_exercise_cells", "glued_values",
           "website_only_output", "exercises_start", "filled_copy", "playground_source", "checks_note",
           "STUDENT_PACKAGES", "chapter_packages"]

EDITION_DIR = "chapters/runnable"  # relative to the book's root; not in the table of contents
KERNELSPEC = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
# Tags of the website (MyST-NB) and of the runnable edition.
REMOVE_CELL, REMOVE_INPUT, REMOVE_OUTPUT = "remove-cell", "remove-input", "remove-output"
HIDE_CELL, HIDE_INPUT, HIDE_OUTPUT = "hide-cell", "hide-input", "hide-output"
SITE_ONLY, RUNNABLE_ONLY = "site-only", "runnable-only"
SITE_TAGS = {REMOVE_CELL, REMOVE_INPUT, REMOVE_OUTPUT, HIDE_CELL, HIDE_INPUT, HIDE_OUTPUT, SITE_ONLY, RUNNABLE_ONLY}
# Output metadata that marks a control's state computed for the website (an image per state).
SOLUTION_MARKERS = ("### BEGIN SOLUTION", "### END SOLUTION", "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS")
# A folded check: tagged hide-input, first line `# Check: ...` (as the website's book_pages finds it).
CHECK_FIRST_LINE = re.compile(r"^\s*#\s*Check\b")
PLAYGROUND_IMPORT = "from attnbook_tools.playground import playground_check"


# --- hooks that other parts of the book decide -------------------------------------------------


def website_only_output(output: dict) -> bool:
    """True for an output the runnable edition drops because only the website needs it.

    The website shows a control (a slider, a picker) without a kernel by storing one image per
    state, each marked in its output metadata (:func:`attnbook_tools.widgets.is_precomputed_state`). In a running
    notebook the live ipywidgets control draws those states itself, so the images are dropped and
    the control's own output (its widget view) is kept.
    """
    return is_precomputed_state(output)


def student_exercise_cells(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """The notebook with its exercise section in student form, exactly as the classroom's exercise
    notebooks have it (:func:`bookbuild.notebooks.student_exercise_cells`: every solution replaced by
    nbgrader's stub, hidden tests removed, visible tests kept, outputs cleared); the tags that fold a
    cell away on the website are dropped too (the student writes in that cell)."""

    nb = copy.deepcopy(nb)
    nb.metadata.setdefault("kernelspec", dict(KERNELSPEC))
    section = exercise_section(nb)
    if not section:
        return nb
    start = len(nb.cells) - len(section)
    cells = student_section(nb)
    for cell in cells:
        tags = [t for t in cell.metadata.get("tags", []) if t not in (HIDE_INPUT, HIDE_CELL)]
        if tags:
            cell.metadata["tags"] = tags
        else:
            cell.metadata.pop("tags", None)
    nb.cells = nb.cells[:start] + cells
    return nb


# --- the playground -----------------------------------------------------------------------------


def _multiline_strings(source: str) -> bool:
    """Whether a string other than a docstring spans several lines (indenting would change its
    value; a docstring's indentation is not part of what it says)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:  # IPython syntax: refused below, with its own message
        tree = ast.Module(body=[], type_ignores=[])
    docstrings = {node.body[0].lineno for node in ast.walk(tree)
                  if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body
                  and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)
                  and isinstance(node.body[0].value.value, str)}
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    strings = {tokenize.STRING, getattr(tokenize, "FSTRING_MIDDLE", tokenize.STRING)}  # f-strings: Python 3.12+
    return any(t.type in strings and t.start[0] != t.end[0] and t.start[0] not in docstrings for t in tokens)


def playground_source(source: str, docname: str = "") -> str:
    """A check cell's code as the runnable edition runs it: its opening comment, then the rest
    unchanged, indented under ``with playground_check():`` (:mod:`attnbook_tools.playground`)."""
    lines = source.splitlines()
    head = 0
    while head < len(lines) and lines[head].lstrip().startswith("#"):
        head += 1
    body = lines[head:]
    if not "".join(body).strip():
        return source
    where = f"{docname}: the check {lines[0].strip()!r}"
    if _multiline_strings("\n".join(body)):
        raise RunnableError(f"{where} has a string over several lines, which indenting would change: "
                            "join its lines or build it with textwrap")
    if any(line.lstrip().startswith(("%", "!")) for line in body):
        raise RunnableError(f"{where} uses IPython syntax (% or !), which cannot run inside `with`")
    wrapped = lines[:head] + [PLAYGROUND_IMPORT, "with playground_check():"]
    wrapped += [("    " + line) if line.strip() else "" for line in body]
    result = "\n".join(wrapped)
    ast.parse(result)
    return result


def checks_note(cell_id: str) -> nbformat.NotebookNode:
    """The note under a runnable notebook's title that says what its folded checks are."""
    return nbformat.v4.new_markdown_cell(
        "> **This notebook is yours to change.** The folded cells that start with `# Check:` verify "
        "what the text says about the book's own run (its numbers are in the text and in the outputs "
        "stored here). Change an input, a setting or the code and run it again: if a check no longer "
        "holds for your run, it prints a note saying what it expected and what your run gave, and the "
        "notebook runs on. The exercises at the end are different: their tests check your answer.",
        id=cell_id)


def _is_check(cell, tags: list[str]) -> bool:
    return cell.cell_type == "code" and HIDE_INPUT in tags and CHECK_FIRST_LINE.match(cell.source) is not None


def _is_colab_install(cell) -> bool:
    return cell.cell_type == "code" and REMOVE_CELL in _tags(cell) and "google.colab" in cell.source


# --- one chapter -------------------------------------------------------------------------------


def _tags(cell) -> list[str]:
    return list(cell.get("metadata", {}).get("tags", []))


def _glued_variable(cell, name: str, docname: str) -> tuple[str, int]:
    """The variable a figure was glued from, ``glue("name", fig)`` -> ("fig", line of the call)."""
    for node in ast.walk(python_of(cell.source)):
        if (isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "glue"
                and node.args and isinstance(node.args[0], ast.Constant) and node.args[0].value == name):
            if len(node.args) < 2 or not isinstance(node.args[1], ast.Name):
                raise RunnableError(f"{docname}: glue({name!r}, ...) must glue a variable (e.g. `fig`), "
                                    "so that the runnable edition can show it where the text discusses it")
            return node.args[1].id, node.end_lineno
    raise RunnableError(f"{docname}: the cell that stored the glued figure {name!r} has no glue({name!r}, ...) call")


def _assigns(tree: ast.AST, variable: str, after_line: int = 0) -> bool:
    return any(isinstance(n, ast.Name) and n.id == variable and isinstance(n.ctx, (ast.Store, ast.Del))
               and n.lineno > after_line for n in ast.walk(tree))


def _figure_cells(block: FigureBlock, variable: str, data: dict, cell_id: str) -> list:
    """A code cell showing the figure (its stored output is the glued image), then its caption."""
    code = nbformat.v4.new_code_cell(variable, id=cell_id)
    bundle = {k: v for k, v in data.items() if k.startswith("image/") or k == "text/plain"}
    if not any(k.startswith("image/") for k in bundle):
        raise RunnableError(f"the glued figure {block.name!r} has no stored image: execute its chapter")
    output = nbformat.v4.new_output("execute_result", data=bundle, execution_count=None)
    if block.alt:
        output.metadata = {mime: {"alt": block.alt} for mime in bundle if mime.startswith("image/")}
    code.outputs = [output]
    parts = []
    if block.number is not None:
        parts.append(f"**Figure {block.number}.** {block.caption}".strip())
    elif block.caption:
        parts.append(block.caption)
    if block.alt:
        parts.append(f"<details><summary>Description of the figure</summary>\n\n{block.alt}\n\n</details>")
    cells = [code]
    if parts:
        cells.append(nbformat.v4.new_markdown_cell("\n\n".join(parts), id=f"{cell_id}-caption"))
    return cells


def _link_within(edition: set[str], book: Book):
    """Links between pages: a chapter of the edition by its file name (same folder), any other
    page at the repository."""

    def link(docname: str) -> str:
        if docname in edition:
            return pathlib.PurePosixPath(docname).name + ".ipynb"
        path = book.path(docname)
        return book.blob_url(path.relative_to(book.root).as_posix()) if path else book.blob_url(docname)

    return link


def _references(book: Book, keys: list[str], cell_id: str) -> nbformat.NotebookNode:
    lines = ["## References", ""]
    lines += [f"- {book.bibliography[k].label}. {book.bibliography[k].reference}"
              for k in sorted(keys, key=lambda k: book.bibliography[k].label)]
    return nbformat.v4.new_markdown_cell("\n".join(lines), id=cell_id)


def _exercises_heading(cell) -> bool:
    return cell.cell_type == "markdown" and re.match(r"^##\s+Exercises\b", cell.source.lstrip()) is not None


def _fold(cell, source: bool = False, outputs: bool = False) -> None:
    jupyter = cell.metadata.setdefault("jupyter", {})
    if source:
        jupyter["source_hidden"] = True
    if outputs and cell.cell_type == "code":
        jupyter["outputs_hidden"] = True


def _still_of_the_control(states: list[dict]) -> list[dict]:
    """Of a control's precomputed states, the image of its initial setting as a plain picture
    (none when the states name no initial setting)."""
    for output in states:
        control = output["metadata"]["attnbook"]["control"]
        if control.get("indices") == [c.get("value") for c in control.get("controls", [])]:
            data = {k: v for k, v in output.get("data", {}).items() if k.startswith("image/")}
            metadata = {mime: {"alt": control["alt"]} for mime in data} if control.get("alt") else {}
            return [nbformat.v4.new_output("display_data", data=data, metadata=metadata)]
    return []


def _edition_outputs(outputs: list[dict]) -> list[dict]:
    """A code cell's outputs as the runnable edition stores them."""
    states = [o for o in outputs if website_only_output(o)]
    kept = [_edition_output(o) for o in outputs if not website_only_output(o)]
    if states and not any("application/vnd.jupyter.widget-view+json" in o.get("data", {}) for o in kept):
        kept += _still_of_the_control(states)  # the live control replaces it when the cell runs
    return kept


def _edition_output(output: dict) -> dict:
    """An output as the runnable edition stores it."""
    data = output.get("data", {})
    if any(k.startswith(GLUE_PREFIX + "image/") for k in data):
        # The image moves to the figure's own cell; the record stays (nbval compares it) without it.
        output = copy.deepcopy(output)
        output["data"] = {k: v for k, v in data.items() if not k.startswith(GLUE_PREFIX + "image/")}
    return output


def _code_cell(cell, tags: list[str]):
    """A code cell as the website treats its tags, with the outputs only the website needs dropped."""
    if REMOVE_CELL in tags and RUNNABLE_ONLY not in tags:
        _fold(cell, source=True, outputs=True)  # the website hides it, but later cells may need it
    if REMOVE_INPUT in tags or HIDE_INPUT in tags or HIDE_CELL in tags:
        _fold(cell, source=True)
    if REMOVE_OUTPUT in tags or HIDE_OUTPUT in tags or HIDE_CELL in tags:
        _fold(cell, outputs=True)
    cell.outputs = _edition_outputs(cell.outputs)
    return cell


def _figure(block: FigureBlock, cells: list, glue_cell_at: int | None, glued: dict, docname: str,
            cell_id: str) -> list:
    """The cells that show a glued figure where the text discusses it, after checking that the
    variable it was glued from still holds it there."""
    if glue_cell_at is None:
        raise RunnableError(f"{docname}: the figure {block.name!r} is shown before the cell that "
                            "glues it: glue it in a cell above its {glue:figure}")
    glue_cell = cells[glue_cell_at]
    variable, line = _glued_variable(glue_cell, block.name, docname)
    between = [c for c in cells[glue_cell_at + 1:] if c.cell_type == "code"]
    if _assigns(python_of(glue_cell.source), variable, line) or any(_assigns(python_of(c.source), variable)
                                                                   for c in between):
        raise RunnableError(f"{docname}: `{variable}` (glued as {block.name!r}) is assigned again "
                            "before the text shows the figure: glue it from a variable of its own")
    return _figure_cells(block, variable, glued[block.name], cell_id)


def _number_executions(cells: list, first: int = 1) -> int:
    """Execution counts ``first``, ``first + 1``, ... for the code cells, in order, as a run from top
    to bottom gives them (nbval needs them on every cell with outputs). Returns the next count."""
    count = first
    for cell in cells:
        if cell.cell_type == "code":
            cell.execution_count = count
            for output in cell.outputs:
                if output.get("output_type") == "execute_result":
                    output["execution_count"] = count
            count += 1
    return count


def exercises_start(cells: list) -> int:
    """The index of the ``## Exercises`` heading among ``cells`` (their number if there is none):
    the cells from there on are the exercises in student form, which have not run."""
    return next((i for i, c in enumerate(cells) if _exercises_heading(c)), len(cells))


def runnable_notebook(source: pathlib.Path, book: Book, edition: set[str] | None = None) -> nbformat.NotebookNode:
    """The runnable edition of one executed chapter (see the module's docstring). ``edition`` names
    the pages that have a runnable notebook beside this one (default: every chapter)."""
    source = pathlib.Path(source).resolve()
    docname = book.docname_of(source, book.root)
    nb = student_exercise_cells(nbformat.read(source, as_version=4))
    glued, glued_at = glued_values(nb)
    edition = edition if edition is not None else {book.docname_of(p, book.root) for p in book.notebooks()}
    converter = MarkdownConverter(book=book, docname=docname, glued=glued, link=_link_within(edition, book))

    cells = [install_cell(book, chapter_packages(nb))]
    noted = not any(_is_check(c, _tags(c)) for c in nb.cells)  # a note on the checks, if there are any
    origin: dict[int, int] = {}  # source cell index -> index in `cells`, for glued figures
    for index, cell in enumerate(nb.cells):
        tags = _tags(cell)
        if _is_colab_install(cell) or SITE_ONLY in tags:
            continue
        if REMOVE_CELL in tags and RUNNABLE_ONLY not in tags and cell.cell_type != "code":
            continue
        cell = copy.deepcopy(cell)
        if cell.cell_type == "markdown":
            for number, piece in enumerate(converter.convert(cell.source)):
                piece_id = cell.id if number == 0 else f"{cell.id}-{number}"
                if isinstance(piece, FigureBlock):
                    cells += _figure(piece, cells, origin.get(glued_at.get(piece.name)), glued, docname,
                                     f"{piece_id}-figure")
                else:
                    cells.append(nbformat.v4.new_markdown_cell(piece, id=piece_id))
                    if cell.get("attachments"):
                        cells[-1].attachments = cell.attachments
            if not noted:  # under the title
                cells.append(checks_note(f"about-the-checks-{_short_hash(docname)}"))
                noted = True
            continue
        if _is_check(cell, tags):
            cell.source = playground_source(cell.source, docname)
        if cell.cell_type == "code":
            cell = _code_cell(cell, tags)
        kept = [t for t in tags if t not in SITE_TAGS]
        if kept:
            cell.metadata["tags"] = kept
        else:
            cell.metadata.pop("tags", None)
        origin[index] = len(cells)
        cells.append(cell)

    if converter.cited:
        cells.insert(exercises_start(cells), _references(book, converter.cited, f"references-{_short_hash(docname)}"))
    _number_executions(cells[:exercises_start(cells)])
    for cell in cells:
        leaked = [m for m in SOLUTION_MARKERS if m in cell.source]
        if leaked:
            raise RunnableError(f"{docname}: {leaked[0]!r} outside an nbgrader cell would show a solution or "
                                "a hidden test: give the cell its nbgrader metadata")
    out = nbformat.v4.new_notebook(cells=cells)
    out.metadata = {k: v for k, v in nb.metadata.items() if k != "jupytext"}
    out.metadata["kernelspec"] = dict(KERNELSPEC)
    out.metadata["attnbook"] = {"runnable_edition_of": source.relative_to(book.root).as_posix()}
    out.nbformat, out.nbformat_minor = 4, 5
    nbformat.validate(out)
    return out


def _short_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:8]


# --- filled copies for checking ----------------------------------------------------------------


def filled_copy(edition_nb: nbformat.NotebookNode, source_nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """The runnable edition with the exercises answered from the source: each solution cell gets the
    source's code, and every code cell of the exercises gets the source's stored outputs back and
    the next execution count, so nbval can compare the whole notebook. The cells before the
    exercises are the edition's own, outputs included."""
    filled = copy.deepcopy(edition_nb)
    by_id = {c.id: c for c in source_nb.cells if c.cell_type == "code"}
    by_grade_id = {c.metadata["nbgrader"]["grade_id"]: c for c in source_nb.cells
                   if c.cell_type == "code" and "grade_id" in c.metadata.get("nbgrader", {})}
    start = exercises_start(filled.cells)
    exercises = filled.cells[start:]
    for cell in exercises:
        if cell.cell_type != "code":
            continue
        grading = cell.metadata.get("nbgrader", {})
        original = by_grade_id.get(grading.get("grade_id")) if grading else by_id.get(cell.id)
        if original is None:
            raise RunnableError(f"the exercise cell {grading.get('grade_id', cell.id)!r} of the runnable "
                                "edition is not in its chapter: run `make runnable`")
        if grading.get("solution"):
            cell.source = original.source
        cell.outputs = copy.deepcopy(original.outputs)
    counted = [c for c in filled.cells[:start] if c.cell_type == "code" and c.execution_count is not None]
    _number_executions(exercises, first=max((c.execution_count for c in counted), default=0) + 1)
    return filled

"""Structural checks over every chapter notebook listed in _toc.yml (nbval checks the outputs).

For each notebook: it is valid nbformat; it was executed top to bottom with no stored error; its
first cell is the Colab-only install cell; it imports attnbook and never redefines a public name
of the package (outside nbgrader solution cells); every glue reference has a glue() call; it has a
"## Summary"; every figure it shows is a glued, numbered figure with alt text (or a setting of a
control made by attnbook_tools.widgets.explore).

The book's other rules for the chapters have tests of their own: claims tied to figures
(test_claims.py), notation (test_notation.py), reading order (test_reading_order.py), check cells,
line widths and controls (test_cells.py), legible figures (test_figures.py).

A planned notebook that does not exist yet is skipped (named in the skip reason); once the file is
there, every check runs on it.
"""

from __future__ import annotations

import ast
import functools
import importlib
import pkgutil
import re
from pathlib import Path

import nbformat
import pytest

from toc_notebooks import ROOT, toc_files

import attnbook
import attnbook_classroom
import attnbook_tools

# --- what to check ------------------------------------------------------------------------


# Every _toc.yml entry, fixed at collection whatever files exist (pytest-xdist workers must
# collect the same tests); entries written as markdown pages are skipped in `notebook`.
ENTRIES = toc_files()


@functools.lru_cache(maxsize=None)
def _load(entry: str) -> nbformat.NotebookNode:
    return nbformat.read(ROOT / f"{entry}.ipynb", as_version=4)


def notebook(entry: str) -> nbformat.NotebookNode:
    path = ROOT / f"{entry}.ipynb"
    if not path.exists():
        page = next((p for p in path.parent.glob(f"{path.stem}.*") if p.suffix in {".md", ".rst"}), None)
        if page is not None:
            pytest.skip(f"{page.relative_to(ROOT)} is a page, not a notebook")
        pytest.skip(f"{entry}.ipynb (listed in _toc.yml) does not exist yet")
    return _load(entry)


def notebook_or_none(entry: str):
    """The notebook of a _toc.yml entry, or None when the entry is a page or does not exist yet."""
    path = ROOT / f"{entry}.ipynb"
    return _load(entry) if path.exists() else None


def first_line(cell) -> str:
    """The cell's first non-empty line, stripped: a key for the cell that survives edits elsewhere."""
    return next((line.strip() for line in cell.source.splitlines() if line.strip()), "")


def allowed(cell, rule: str) -> bool:
    """A justified exception: the cell's metadata says ``{"attnbook": {"allow": {rule: reason}}}``
    with a non-empty reason."""
    reason = cell.metadata.get("attnbook", {}).get("allow", {}).get(rule)
    return isinstance(reason, str) and bool(reason.strip())


def is_nbgrader(cell) -> bool:
    """An exercise's solution or test cell."""
    meta = cell.metadata.get("nbgrader", {})
    return bool(meta.get("solution") or meta.get("grade"))


def where(entry: str, index: int, cell) -> str:
    first = cell.source.strip().splitlines()[0][:60] if cell.source.strip() else ""
    return f"{entry}.ipynb cell {index} ({cell.cell_type}, starts {first!r})"


def tags(cell) -> set[str]:
    return set(cell.metadata.get("tags", []))


parametrize = pytest.mark.parametrize("entry", ENTRIES, ids=[Path(e).name for e in ENTRIES])


# --- helpers: code and markdown -----------------------------------------------------------


_PYTHON_CELL_MAGICS = {"time", "timeit", "capture", "prun"}  # their body is Python run in the notebook


def _python_source(source: str) -> str:
    """Cell source as plain Python: IPython magics and shell escapes become function calls; the
    body of a cell magic that runs Python (%%time, %%capture, ...) is kept as code."""
    first, _, body = source.lstrip().partition("\n")
    if first.startswith("%%") and first[2:].split(" ")[0] in _PYTHON_CELL_MAGICS:
        source = body
    try:
        from IPython.core.inputtransformer2 import TransformerManager
    except ImportError:  # pragma: no cover - IPython comes with ipykernel
        return "\n".join(
            "" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines()
        )
    return TransformerManager().transform_cell(source)


def parse_cell(cell) -> ast.Module:
    """The cell's code as an AST; a cell that does not parse counts as empty (nbval reports it)."""
    try:
        return ast.parse(_python_source(cell.source))
    except SyntaxError:
        return ast.Module(body=[], type_ignores=[])


def top_level_definitions(tree: ast.Module):
    """def/class statements at module level, also inside top-level if/for/with/try blocks."""
    stack = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            yield node
            continue
        for field in ("body", "orelse", "finalbody", "handlers", "cases"):
            stack.extend(getattr(node, field, []) or [])


@functools.lru_cache(maxsize=None)
def public_names() -> dict[str, str]:
    """Every public name of every attnbook module -> the module that has it (a private module, such
    as ``attnbook._checks``, has none)."""
    names: dict[str, str] = {}
    packages = [attnbook, attnbook_tools, attnbook_classroom]  # the library, the tooling, the classroom
    modules = [  # the modules first, so a name is reported where it is defined
        importlib.import_module(info.name)
        for package in packages
        for info in pkgutil.walk_packages(package.__path__, prefix=package.__name__ + ".")
        if not any(part.startswith("_") for part in info.name.split("."))
    ] + packages
    for module in modules:
        exported = getattr(module, "__all__", None)
        if exported is None:
            exported = [
                n
                for n, obj in vars(module).items()
                if not n.startswith("_") and getattr(obj, "__module__", None) == module.__name__
            ]
        for name in exported:
            names.setdefault(name, module.__name__)
    return names


_ROLE = re.compile(r"\{glue(?::(?:text|any|md))?\}`([^`]+)`")
_DIRECTIVE = re.compile(r"^\s*(`{3,}|:{3,})\{glue(?::(?:figure|any|md|math))?\}\s+(\S+)\s*$")


def glue_references(markdown: str) -> list[tuple[str, str]]:
    """(kind, name) for every glue role and directive in a markdown cell."""
    refs = [("text", m.group(1).split(":")[0].strip()) for m in _ROLE.finditer(markdown)]
    refs += [("directive", m.group(2)) for m in map(_DIRECTIVE.match, markdown.splitlines()) if m]
    return refs


def glue_figure_blocks(markdown: str):
    """(name, options) for each {glue:figure} directive: options are the `:key: value` lines."""
    lines = markdown.splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"^\s*(`{3,}|:{3,})\{glue:figure\}\s+(\S+)\s*$", line)
        if not m:
            continue
        options = {}
        for option in lines[i + 1 :]:
            o = re.match(r"^\s*:([\w-]+):\s*(.*)$", option)
            if not o:
                break
            options[o.group(1)] = o.group(2).strip()
        yield m.group(2), options


def glued_names(nb) -> set[str]:
    """Names given to glue(...) in the code (string literals), plus the names stored in the
    outputs by glue itself (this also covers names built at run time, e.g. f-strings)."""
    names = set()
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        for node in ast.walk(parse_cell(cell)):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
            if name != "glue":
                continue
            arg = node.args[0] if node.args else next(
                (kw.value for kw in node.keywords if kw.arg == "name"), None
            )
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                names.add(arg.value)
        for output in cell.get("outputs", []):
            scrap = output.get("metadata", {}).get("scrapbook", {})
            if "name" in scrap:
                names.add(scrap["name"])
    return names


def _is_image(mime: str) -> bool:
    return mime.split("/")[-2:-1] == ["image"]


# --- the checks: each returns a list of problems, each naming the notebook and the cell ----


def check_nbformat(entry, nb):
    if nb.get("nbformat") != 4:
        return [f"{entry}.ipynb: nbformat {nb.get('nbformat')}, expected 4"]
    try:
        nbformat.validate(nb)
    except nbformat.ValidationError as exc:
        return [f"{entry}.ipynb is not valid nbformat: {exc.message}"]
    return []


def check_executed_in_order(entry, nb):
    problems = []
    last = 0
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        if not cell.source.strip():
            if cell.get("outputs"):
                problems.append(f"{where(entry, index, cell)}: an empty cell has outputs")
            continue
        count = cell.get("execution_count")
        if count is None:
            problems.append(f"{where(entry, index, cell)}: not executed (no execution count)")
        elif count <= last:
            problems.append(
                f"{where(entry, index, cell)}: execution count {count} after {last} "
                "(not run top to bottom; re-run it with `make execute`)"
            )
        last = count if count is not None else last
        for output in cell.get("outputs", []):
            if output.get("output_type") == "error":
                problems.append(
                    f"{where(entry, index, cell)}: stored error {output.get('ename')}: {output.get('evalue')}"
                )
    return problems


COLAB_LINES = (
    'if "google.colab" in sys.modules:',
    "https://github.com/attnbook/attention-book",
    '"pip", "install"',
)


def check_colab_cell(entry, nb):
    if not nb.cells:
        return [f"{entry}.ipynb has no cells"]
    cell = nb.cells[0]
    label = where(entry, 0, cell)
    if cell.cell_type != "code":
        return [f"{label}: the first cell must be the Colab install cell"]
    problems = [f"{label}: the Colab install cell lacks {line!r}" for line in COLAB_LINES if line not in cell.source]
    if "remove-cell" not in tags(cell):
        problems.append(f"{label}: the Colab install cell must be tagged remove-cell")
    return problems


def check_imports_attnbook(entry, nb):
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        for node in ast.walk(parse_cell(cell)):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "attnbook":
                return []
            if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "attnbook" for a in node.names):
                return []
    return [f"{entry}.ipynb never imports attnbook"]


def check_no_redefinition(entry, nb):
    names = public_names()
    problems = []
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        if cell.metadata.get("nbgrader", {}).get("solution") is True:
            continue  # a student's solution may re-implement a package function
        for node in top_level_definitions(parse_cell(cell)):
            if node.name in names:
                kind = "class" if isinstance(node, ast.ClassDef) else "def"
                problems.append(
                    f"{where(entry, index, cell)}: `{kind} {node.name}` redefines "
                    f"{names[node.name]}.{node.name}; import it instead"
                )
    return problems


def check_glue_references(entry, nb):
    glued = glued_names(nb)
    problems = []
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "markdown":
            continue
        for kind, name in glue_references(cell.source):
            if "::" in name:  # a value glued in another notebook: path::name
                other, _, key = name.partition("::")
                other_entry = str((Path(entry).parent / other).with_suffix(""))
                if not (ROOT / f"{other_entry}.ipynb").exists() or key not in glued_names(_load(other_entry)):
                    problems.append(f"{where(entry, index, cell)}: {kind} `{name}` has no glue() in {other}")
            elif name not in glued:
                problems.append(f"{where(entry, index, cell)}: {kind} `{name}` has no glue() call")
    return problems


def check_summary(entry, nb):
    for cell in nb.cells:
        if cell.cell_type == "markdown" and re.search(r"^##\s+Summary\s*$", cell.source, re.M):
            return []
    return [f"{entry}.ipynb has no '## Summary' heading"]


def check_figures(entry, nb):
    blocks = {}
    for index, cell in enumerate(nb.cells):
        if cell.cell_type == "markdown":
            for name, options in glue_figure_blocks(cell.source):
                blocks[name] = (index, cell, options)
    problems = [
        f"{where(entry, index, cell)}: {{glue:figure}} {name} has no :alt: text"
        for name, (index, cell, options) in blocks.items()
        if not options.get("alt")
    ]
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code" or tags(cell) & {"remove-output", "remove-cell"}:
            continue
        for output in cell.get("outputs", []):
            images = [m for m in output.get("data", {}) if _is_image(m)]
            if not images or output.get("metadata", {}).get("attnbook", {}).get("control"):
                continue  # a setting of a precomputed control: tests/book/test_cells.py checks those
            glued = output.get("metadata", {}).get("scrapbook", {}).get("name")
            if glued is None:
                problems.append(
                    f"{where(entry, index, cell)}: shows an image ({images[0]}) directly; glue it "
                    "and show it with a {glue:figure} that has :alt: text and a caption"
                )
            elif glued not in blocks:
                problems.append(
                    f"{where(entry, index, cell)}: glued image `{glued}` is not shown by any {{glue:figure}}"
                )
    return problems


CHECKS = [
    check_nbformat,
    check_executed_in_order,
    check_colab_cell,
    check_imports_attnbook,
    check_no_redefinition,
    check_glue_references,
    check_summary,
    check_figures,
]


# --- the tests ----------------------------------------------------------------------------


@pytest.mark.parametrize("check", CHECKS, ids=[c.__name__.removeprefix("check_") for c in CHECKS])
@parametrize
def test_notebook(entry, check):
    problems = check(entry, notebook(entry))
    if problems:
        pytest.fail("\n".join(problems), pytrace=False)


def test_every_chapter_notebook_is_in_the_toc():
    listed = {ROOT / f"{entry}.ipynb" for entry in toc_files()}
    stray = sorted(p.name for p in (ROOT / "chapters").glob("*.ipynb") if p not in listed)
    assert not stray, f"notebooks in chapters/ that _toc.yml does not list (so nothing tests them): {stray}"


def test_helpers():
    """The parsers above see what they must."""
    names = public_names()
    for name in ("attention", "masked_softmax", "causal_mask", "padding_mask", "combine_masks",
                 "AdditiveScore", "Attention", "KVCache", "setup", "glue"):
        assert name in names, name
    code = "%matplotlib inline\nclass AdditiveScore:\n    def attention(self): pass\nif True:\n    def causal_mask(): pass\n"
    found = sorted(n.name for n in top_level_definitions(parse_cell(nbformat.v4.new_code_cell(code))))
    assert found == ["AdditiveScore", "causal_mask"]  # a method named like a package function is fine
    markdown = (
        "Weight {glue:text}`ch00-w:.2f` and {glue}`ch00-n`.\n"
        "```{glue:figure} fig-00-a\n:name: fig-00-a\n:alt: A heatmap.\nCaption.\n```\n"
        "```{glue:figure} fig-00-b\nCaption without alt.\n```"
    )
    assert glue_references(markdown) == [
        ("text", "ch00-w"), ("text", "ch00-n"), ("directive", "fig-00-a"), ("directive", "fig-00-b")
    ]
    assert dict(glue_figure_blocks(markdown)) == {
        "fig-00-a": {"name": "fig-00-a", "alt": "A heatmap."}, "fig-00-b": {}
    }
    assert _is_image("image/png") and _is_image("application/papermill.record/image/png")
    assert not _is_image("text/plain")


def _good_notebook():
    v4 = nbformat.v4
    colab = (
        "import sys\n"
        'if "google.colab" in sys.modules:\n'
        '    subprocess.run(["git", "clone", "https://github.com/attnbook/attention-book"])\n'
        '    subprocess.run([sys.executable, "-m", "pip", "install", "-e", "/content/attention-book"])\n'
    )
    png = "iVBORw0KGgo="
    cells = [
        v4.new_code_cell(colab, execution_count=1, metadata={"tags": ["remove-cell"]}),
        v4.new_markdown_cell("# 1. Title"),
        v4.new_code_cell("from attnbook import attention\nfrom attnbook_tools.notebook import glue", execution_count=2),
        v4.new_code_cell(
            "glue('ch01-x', 0.5)\nglue('fig-01-a', fig)",
            execution_count=3,
            outputs=[v4.new_output("display_data", data={"application/papermill.record/image/png": png},
                                   metadata={"scrapbook": {"name": "fig-01-a", "mime_prefix": "application/papermill.record/"}})],
        ),
        v4.new_markdown_cell("x is {glue:text}`ch01-x:.2f`.\n\n```{glue:figure} fig-01-a\n:alt: A picture.\nCaption.\n```"),
        v4.new_markdown_cell("## Summary\n\n- done"),
    ]
    return v4.new_notebook(cells=cells)


def test_checks_pass_a_good_notebook():
    nb = _good_notebook()
    for check in CHECKS:
        assert check("chapters/good", nb) == [], check.__name__


def test_checks_catch_a_bad_notebook():
    v4 = nbformat.v4
    nb = _good_notebook()
    nb.cells[0].metadata = {}  # no remove-cell tag
    nb.cells[2].source = "import torch"  # attnbook never imported
    nb.cells[3].execution_count = 7
    nb.cells.insert(4, v4.new_code_cell("def masked_softmax(x):\n    return x", execution_count=5))
    nb.cells.insert(5, v4.new_code_cell(
        "1 / 0", execution_count=6,
        outputs=[v4.new_output("error", ename="ZeroDivisionError", evalue="division by zero", traceback=[])],
    ))
    nb.cells.insert(6, v4.new_code_cell("%%time\nclass KVCache: pass", execution_count=None))
    nb.cells.insert(7, v4.new_code_cell(
        "plt.show()", execution_count=8, outputs=[v4.new_output("display_data", data={"image/png": "iVBORw0KGgo="})]
    ))
    nb.cells[-2].source = "{glue:text}`ch01-missing` and\n```{glue:figure} fig-01-a\nCaption.\n```"
    nb.cells[-1].source = "## Summary of nothing"
    solution = v4.new_code_cell("def attention(q, k, v):\n    return q", execution_count=9,
                                metadata={"nbgrader": {"solution": True, "grade_id": "a"}})
    nb.cells.append(solution)  # a solution cell may redefine a package name
    found = {check.__name__: "\n".join(check("chapters/bad", nb)) for check in CHECKS}
    assert "chapters/bad.ipynb cell 0" in found["check_colab_cell"] and "remove-cell" in found["check_colab_cell"]
    assert "never imports attnbook" in found["check_imports_attnbook"]
    assert "cell 4" in found["check_executed_in_order"] and "count 5 after 7" in found["check_executed_in_order"]
    assert "ZeroDivisionError" in found["check_executed_in_order"]
    assert "cell 6" in found["check_executed_in_order"] and "no execution count" in found["check_executed_in_order"]
    redefined = found["check_no_redefinition"]
    assert "cell 4" in redefined and "def masked_softmax" in redefined and "attnbook.functional" in redefined
    assert "class KVCache" in redefined and "attention" not in redefined
    assert "ch01-missing" in found["check_glue_references"] and "ch01-x" not in found["check_glue_references"]
    assert "no :alt:" in found["check_figures"] and "cell 7" in found["check_figures"]
    assert "Summary" in found["check_summary"]
    assert found["check_nbformat"] == ""
    nb.nbformat = 3
    assert "expected 4" in check_nbformat("chapters/bad", nb)[0]

"""How the chapters' code cells read on the website.

- **Checks fold away.** The assertions that keep the book true live in *check cells*: code cells
  tagged ``hide-input`` whose first line is ``# Check: <what the page claims>``. The website folds
  them behind a "Show the check" toggle, so the code a reader sees first is the teaching code. A
  visible cell holds no assertion, unless its metadata says why the assertion is the lesson
  (``{"attnbook": {"allow": {"visible-check": "the assertion that catches the bug is the exhibit"}}}``).
  Exercise cells (nbgrader's) are exempt: their tests are the student's.
- **No code scrolls sideways.** Every line of a cell's code and of its printed output fits in
  :data:`SITE_CODE_COLUMNS` characters, the width of a code block in the narrowest desktop layout
  (measured again in Chromium by tests/browser/test_layout.py); so does every line of package
  source a chapter shows with ``literalinclude``.
- **Controls work on the website.** A slider or dropdown comes from ``attnbook_tools.widgets.explore``,
  which stores its settings for the website; ipywidgets' own ``interact`` and control widgets need
  a kernel, and the website leaves them out. ``mask_editor`` is the one live-only control (its
  states cannot be precomputed): the chapter shows its static twin as a figure.
"""

from __future__ import annotations

import ast
import re

import nbformat
import pytest

from chapter_rules import rule_test
from test_claims import _call_name, is_check
from test_notebooks import allowed, first_line, is_nbgrader, parse_cell, tags
from test_reading_order import shown_objects

# Characters in one line of a code block in the narrowest desktop layout: a 1200-pixel window,
# both sidebars shown, 14-pixel DejaVu Sans Mono (588 px of text, 8.43 px a character).
SITE_CODE_COLUMNS = 69
CHECK_FIRST_LINE = re.compile(r"^#\s*Check\b")
# ipywidgets controls that only a kernel can drive
LIVE_ONLY_CALLS = {"interact", "interactive", "interact_manual", "interact_on_axes"}
WIDGET_CONTROLS = re.compile(
    r"^(?:\w*Slider|Dropdown|Select|SelectMultiple|ToggleButtons?|Checkbox|RadioButtons|Text|Textarea|Combobox|Button|Play)$"
)


def shown(cell) -> bool:
    return not tags(cell) & {"remove-cell", "remove-input"}


# --- checks fold away ------------------------------------------------------------------------


def check_violations(entry: str, nb) -> dict[str, str]:
    found = {}
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code" or not shown(cell) or is_nbgrader(cell):
            continue
        checks = sum(is_check(node) for node in ast.walk(parse_cell(cell)))
        folded = bool(tags(cell) & {"hide-input", "hide-cell"})
        key = first_line(cell)
        if not folded and checks and not allowed(cell, "visible-check"):
            found[key] = (f"cell {index} ({key[:50]!r}) shows {checks} assertion(s) to every reader: move them "
                          "to a check cell (tag hide-input, first line '# Check: ...')")
        elif folded and not CHECK_FIRST_LINE.match(key):
            found[key] = (f"cell {index} ({key[:50]!r}) is folded away but does not say what it checks: "
                          "start it with '# Check: <what the page claims>'")
        elif folded and not checks:
            found[key] = f"cell {index} ({key[:50]!r}) is a check cell with no assertion in it"
    return found


# --- no code scrolls sideways ----------------------------------------------------------------


def _output_text(output) -> str:
    if output.get("output_type") == "stream":
        return output.get("text", "")
    if output.get("output_type") in ("execute_result", "display_data"):
        data = output.get("data", {})
        if "text/html" in data or any(m.startswith("image/") for m in data):
            return ""  # a table or a figure, not a block of text
        return data.get("text/plain", "")
    return ""


def width_violations(entry: str, nb) -> dict[str, str]:
    found = {}
    for index, cell in enumerate(nb.cells):
        if cell.cell_type == "markdown":
            for path, dotted, source in shown_objects(cell.source):
                long = [line for line in source.splitlines() if len(line) > SITE_CODE_COLUMNS]
                if long:
                    found[f"literalinclude {dotted}"] = (
                        f"cell {index} shows {dotted} from {path}: {len(long)} line(s) longer than "
                        f"{SITE_CODE_COLUMNS} characters, e.g. {long[0].strip()[:60]!r}")
            continue
        if cell.cell_type != "code" or not shown(cell):
            continue
        key = first_line(cell)
        long = [line for line in cell.source.splitlines() if len(line) > SITE_CODE_COLUMNS]
        if long:
            found[f"code {key}"] = (f"cell {index} ({key[:40]!r}): {len(long)} line(s) longer than {SITE_CODE_COLUMNS} "
                                    f"characters, the longest {max(map(len, long))}")
        if "remove-output" in tags(cell):
            continue
        printed = [line for output in cell.get("outputs", []) for line in _output_text(output).splitlines()
                   if len(line) > SITE_CODE_COLUMNS]
        if printed:
            found[f"output {key}"] = (f"cell {index} ({key[:40]!r}) prints {len(printed)} line(s) longer than "
                                      f"{SITE_CODE_COLUMNS} characters, the longest {max(map(len, printed))}")
    return found


# --- controls work on the website ------------------------------------------------------------


def control_violations(entry: str, nb) -> dict[str, str]:
    # A live-only control is allowed where the cell says why ({"attnbook": {"allow": {"live-control":
    # reason}}}) and the chapter also has a precomputed control (explore) that works on the website.
    has_website_twin = any(o.get("metadata", {}).get("attnbook", {}).get("control")
                           for cell in nb.cells if cell.cell_type == "code" for o in cell.get("outputs", []))
    found = {}
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        tree = parse_cell(cell)
        for node in ast.walk(tree):
            name = _call_name(node)
            if (name in LIVE_ONLY_CALLS or (name and WIDGET_CONTROLS.match(name))) and not (
                    allowed(cell, "live-control") and has_website_twin):
                found[f"{name} in {first_line(cell)}"] = (
                    f"cell {index} makes a control with {name}(), which needs a kernel and is left out of the "
                    "website: use attnbook_tools.widgets.explore(draw, slider(...)/dropdown(...), alt=...)")
        calls_explore = any(_call_name(n) == "explore" for n in ast.walk(tree))
        stored = [o for o in cell.get("outputs", [])
                  if o.get("metadata", {}).get("attnbook", {}).get("control")]
        if calls_explore and not stored:
            found[f"unexecuted {first_line(cell)}"] = (
                f"cell {index} calls explore() but stores no precomputed setting: run `make execute`")
        for output in stored:
            control = output["metadata"]["attnbook"]["control"]
            if not control.get("alt", "").strip():
                found[f"alt {control['id']}"] = (
                    f"cell {index}: control {control['id']!r} has a setting without alt text")
    return found


RULES = {"checks": check_violations, "code-width": width_violations, "controls": control_violations}


test_checks_fold_away = rule_test("checks", check_violations, "Assertions are in folded check cells.")
test_no_code_scrolls_sideways = rule_test("code-width", width_violations, "Every line fits the code column.")
test_controls_work_on_the_website = rule_test("controls", control_violations, "Controls are made with explore().")


# --- the checks find what they must --------------------------------------------------------------


def _nb(*cells):
    return nbformat.v4.new_notebook(cells=list(cells))


def test_check_violations_on_a_small_notebook():
    v4 = nbformat.v4
    nb = _nb(
        v4.new_code_cell("y = f(x)\nassert y > 0"),  # teaching code with a visible assertion
        v4.new_code_cell("# Check: y is positive\nassert y > 0", metadata={"tags": ["hide-input"]}),
        v4.new_code_cell("z = g(y)", metadata={"tags": ["hide-input"]}),  # folded, not a check
        v4.new_code_cell("# Check: nothing\nprint(z)", metadata={"tags": ["hide-input"]}),
        v4.new_code_cell("wrong()\nassert caught", metadata={"attnbook": {"allow": {"visible-check": "the exhibit"}}}),
        v4.new_code_cell("check('x', f).assert_passed()", metadata={"nbgrader": {"grade": True}}),
    )
    found = check_violations("x", nb)
    assert set(found) == {"y = f(x)", "z = g(y)", "# Check: nothing"}


def test_width_violations_on_a_small_notebook():
    v4 = nbformat.v4
    long = "x = " + "1 + " * 20 + "1"
    nb = _nb(
        v4.new_code_cell(f"# fits\n{long}", outputs=[v4.new_output("stream", name="stdout", text="y" * 80 + "\n")]),
        v4.new_code_cell("short = 1", outputs=[v4.new_output("stream", name="stdout", text="ok\n")]),
        v4.new_code_cell(long, metadata={"tags": ["remove-cell"]}),
    )
    assert len(long) > SITE_CODE_COLUMNS
    assert set(width_violations("x", nb)) == {"code # fits", "output # fits"}


def test_control_violations_on_a_small_notebook():
    v4 = nbformat.v4
    state = v4.new_output("display_data", data={"image/png": "iVBORw0KGgo="},
                          metadata={"attnbook": {"control": {"id": "ctl-a", "alt": "A picture."}}})
    nb = _nb(
        v4.new_code_cell("widgets.interact(show, scale=slider)"),
        v4.new_code_cell("explore(draw, slider('D', [1, 2]), alt='D = {D}')"),  # not executed
        v4.new_code_cell("explore(draw, slider('D', [1, 2]), alt='D = {D}')", outputs=[state]),
        v4.new_code_cell("editor = mask_editor(scores, draw)"),
    )
    found = control_violations("x", nb)
    assert set(found) == {"interact in widgets.interact(show, scale=slider)",
                          "unexecuted explore(draw, slider('D', [1, 2]), alt='D = {D}')"}
    live = v4.new_code_cell("interact_on_axes(draw, s=Text())",
                            metadata={"attnbook": {"allow": {"live-control": "a box to type into"}}})
    assert not {k for k in control_violations("x", _nb(live, nb.cells[2])) if k.startswith(("interact", "Text"))}
    alone = control_violations("x", _nb(live))  # no website twin: still refused
    assert {"interact_on_axes in interact_on_axes(draw, s=Text())", "Text in interact_on_axes(draw, s=Text())"} <= set(alone)


@pytest.mark.parametrize("code,ok", [("a = 1", True), ("b = '" + "x" * 70 + "'", False)])
def test_limit_is_the_measured_column(code, ok):
    assert (max(map(len, code.splitlines())) <= SITE_CODE_COLUMNS) is ok

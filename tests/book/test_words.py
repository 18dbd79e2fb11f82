"""The words around the numbers: a bound is true as printed, and a shown cell prints what it measured.

1. **Bounds.** A glued number right after a bound word ("at most {glue:text}`x:.2f`", "no head scores
   above ...", "costs at least ...") must come through ``attnbook_tools.notebook.glue_bound``, which
   rounds it in the bound's safe direction and asserts every value against the printed number. Its
   stored output says so (``metadata["attnbook"]["bound"]``). Where the words leave no doubt about the
   direction ("at most", "no more than", "at least", "no less than"), the stored direction must match.
   A sentence about one result states the result itself ("reached {glue:text}`x:.3f`"), with no bound word.

2. **Measured, not typed.** A cell whose output the page shows (folded code included) never prints a comparison or a
   verdict that it did not measure: a printed phrase such as "below", "less than", "==", "for every",
   "word by word" must follow a value formatted into the same print ("largest difference 3.1e-15,
   below 1e-12" is fine; "largest difference below 1e-12" is not; neither is a phrase with no value).
"""

from __future__ import annotations

import ast
import re

import pytest

from test_notebooks import ENTRIES, notebook_or_none, parse_cell, tags

# --- 1. bounds ----------------------------------------------------------------------------

_UPPER = r"at most|no more than|not more than|less than|fewer than|below|under|up to|within"
_LOWER = r"at least|no less than|not less than|more than|greater than|above|over|exceeds?"
_BOUND = re.compile(
    rf"\b(?P<word>{_UPPER}|{_LOWER})\s*(?:(?:about|roughly|nearly|only|just|some)\s+)?\(?\s*\{{glue(?::text)?\}}`(?P<name>[^`:]+)(?::(?P<fmt>[^`]*))?`",
    re.IGNORECASE,
)
_PLAIN = {"at most": "at most", "no more than": "at most", "not more than": "at most",
          "at least": "at least", "no less than": "at least", "not less than": "at least"}
_NEGATION = re.compile(r"\b(no|not|never|none|nothing|nor)\b[^.;:]*$", re.IGNORECASE)


def bound_metadata(nb) -> dict[str, dict]:
    """Glue name -> what glue_bound stored beside it ({"bound": ..., "digits": ...}), for bounds."""
    found = {}
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            meta = output.get("metadata", {})
            name = meta.get("scrapbook", {}).get("name")
            if name and "bound" in meta.get("attnbook", {}):
                found[name] = meta["attnbook"]
    return found


def bound_problems(nb) -> list[str]:
    stored = bound_metadata(nb)
    problems = []
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "markdown":
            continue
        text = " ".join(cell.source.split())
        for m in _BOUND.finditer(text):
            word, name, fmt = m.group("word").lower(), m.group("name").strip(), m.group("fmt") or ""
            sentence = text[max(0, text.rfind(".", 0, m.start()) + 1):m.start()]
            where = f"cell {index}: '...{text[max(0, m.start() - 40):m.end()]}'"
            meta = stored.get(name)
            if meta is None:
                problems.append(f"{where}: '{name}' is printed after the bound word '{word}' but was not "
                                "glued by glue_bound (rounded in the bound's safe direction); or state the "
                                "measured result without a bound word")
                continue
            digits = re.fullmatch(r"\.(\d+)f", fmt.strip())
            if not digits or int(digits.group(1)) != meta["digits"]:
                problems.append(f"{where}: '{name}' was rounded to {meta['digits']} decimals by glue_bound; "
                                f"show it with ':.{meta['digits']}f' (got {fmt!r})")
            plain = _PLAIN.get(word)
            if plain and not _NEGATION.search(sentence) and meta["bound"] != plain:
                problems.append(f"{where}: the words say '{plain}' but '{name}' was glued as "
                                f"'{meta['bound']}'")
    return problems


per_chapter = pytest.mark.parametrize("entry", ENTRIES, ids=[e.split("/")[-1] for e in ENTRIES])


def assert_chapter_keeps(entry, rule) -> None:
    """Apply ``rule`` (notebook -> list of problems) to a _toc.yml entry; a page is skipped."""
    nb = notebook_or_none(entry)
    if nb is None:
        pytest.skip(f"{entry} is not a notebook")
    problems = rule(nb)
    assert not problems, f"{entry}:\n  " + "\n  ".join(problems)


@per_chapter
def test_bounds_are_true_as_printed(entry):
    assert_chapter_keeps(entry, bound_problems)


# --- 2. measured, not typed ---------------------------------------------------------------

_VERDICT = re.compile(r"\bbelow\b|\bunder\b|less than|smaller than|at most|==|\bfor every\b|\bfor each\b|"
                      r"\bfor all\b|word by word|\bidentical\b|\bunchanged\b|\bnever\b|\balways\b", re.IGNORECASE)
VALUE = object()  # a value formatted into the printed text


def printed_pieces(call: ast.Call) -> list:
    """What a print call shows, in order: literal text, or VALUE for each formatted value."""
    pieces: list = []
    for arg in call.args:
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            pieces.append(arg.value)
        elif isinstance(arg, ast.JoinedStr):
            for part in arg.values:
                pieces.append(part.value if isinstance(part, ast.Constant) else VALUE)
        else:
            pieces.append(VALUE)
    return pieces


def typed_verdicts(cell) -> list[str]:
    found = []
    for node in ast.walk(parse_cell(cell)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print"):
            continue
        seen_value = False
        for piece in printed_pieces(node):
            if piece is VALUE:
                seen_value = True
            elif not seen_value and (m := _VERDICT.search(piece)):
                found.append(f"print(... {piece.strip()!r} ...) states '{m.group(0)}' before any measured value")
    return found


def verdict_problems(nb) -> list[str]:
    problems = []
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code" or tags(cell) & {"remove-cell", "remove-output"}:
            continue  # a folded cell (hide-input) still shows what it prints
        problems += [f"cell {index}: {p}" for p in typed_verdicts(cell)]
    return problems


@per_chapter
def test_shown_cells_print_what_they_measured(entry):
    assert_chapter_keeps(entry, verdict_problems)


# --- the rules themselves ------------------------------------------------------------------


def _md(text):
    from nbformat import v4
    return v4.new_markdown_cell(text)


def _glued(name, bound=None, digits=2):
    from nbformat import v4
    meta = {"scrapbook": {"name": name, "mime_prefix": ""}}
    if bound:
        meta["attnbook"] = {"bound": bound, "digits": digits}
    cell = v4.new_code_cell("")
    cell.outputs = [v4.new_output("display_data", data={"text/plain": "0.02"}, metadata=meta)]
    return cell


def test_bound_rule_catches_what_it_should():
    from nbformat import v4
    nb = v4.new_notebook(cells=[
        _glued("plain"), _glued("up", "at most"), _glued("down", "at least"),
        _md("No head scores above {glue:text}`plain:.2f`."),                # not through glue_bound
        _md("No head scores above {glue:text}`up:.2f`."),                   # fine (negated 'above')
        _md("It costs at least {glue:text}`up:.2f` more."),                 # wrong direction
        _md("It costs at least {glue:text}`down:.3f` more."),               # wrong digits
        _md("It reached {glue:text}`plain:.3f`."),                          # a result: fine
        _md("It stays below about {glue:text}`plain:.2f`."),                # a filler word hides nothing
    ])
    problems = bound_problems(nb)
    assert len(problems) == 4, problems
    assert "'plain'" in problems[0] and "'at least'" in problems[1] and ":.2f" in problems[2]


def test_verdict_rule_catches_what_it_should():
    from nbformat import v4
    cells = [v4.new_code_cell(src) for src in (
        'print(f"largest difference below {rounding}")',             # typed
        'print("dog bites man == man bites dog, word by word")',     # typed
        'print(f"largest difference {d:.1e}, below {rounding}")',    # measured first: fine
        'print("largest difference", d, "below 1e-12")',             # measured first: fine
    )]
    cells.append(v4.new_code_cell('print("below 1e-12")', metadata={"tags": ["hide-input"]}))  # shown output
    cells.append(v4.new_code_cell('print("never NaN")', metadata={"tags": ["remove-cell"]}))  # not on the page
    problems = verdict_problems(v4.new_notebook(cells=cells))
    assert [p.split(":")[0] for p in problems] == ["cell 0", "cell 1", "cell 4"], problems

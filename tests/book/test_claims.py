"""Every captioned figure or table is backed by an assertion of what its caption and alt text say.

The link is the glue key. A chapter glues a figure (or a table) under a key, shows it with
``{glue:figure} key`` and a caption and ``:alt:`` text, and the cell that glues it asserts the
caption's claim under the same key, in one of three forms:

    claim("fig-00-temperature", (w.max(-1).values > 0.9).all(), "each row picks one key at scale 5")

    with claims("fig-04-learned-w"):          # for checks that are calls
        torch.testing.assert_close(toy, package)

    assert weights.argmax() == 0, "fig-02-heatmaps: ..."   # a plain assert whose message names the key

(``claim`` and ``claims`` are in attnbook_tools.notebook.) A claim whose key nothing glues is a typo and
fails too. How to state a claim is in chapters/contributing.md.
"""

from __future__ import annotations

import ast
import re

from chapter_rules import rule_test
from test_notebooks import glued_names, parse_cell

_DIRECTIVE = re.compile(r"^\s*(`{3,}|:{3,})\{glue:figure\}\s+(\S+)\s*$")


def figure_blocks(markdown: str):
    """(key, options, caption) of every {glue:figure} directive in a markdown cell."""
    lines = markdown.splitlines()
    for i, line in enumerate(lines):
        match = _DIRECTIVE.match(line)
        if not match:
            continue
        fence, key = match.groups()
        options, caption, j = {}, [], i + 1
        while j < len(lines) and (option := re.match(r"^\s*:([\w-]+):\s*(.*)$", lines[j])):
            options[option.group(1)] = option.group(2).strip()
            j += 1
        while j < len(lines) and lines[j].strip() != fence:
            caption.append(lines[j])
            j += 1
        yield key, options, " ".join(caption).strip()


def _call_name(node) -> str | None:
    if isinstance(node, ast.Call):
        func = node.func
        return func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
    return None


def _first_string(node) -> str | None:
    if node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
        return node.args[0].value
    return None


def _literal_text(node) -> str:
    """The literal parts of a string or f-string expression."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value for v in node.values if isinstance(v, ast.Constant) and isinstance(v.value, str))
    return ""


def is_check(node) -> bool:
    """An assertion: an assert statement, or a call of assert_* or claim."""
    if isinstance(node, ast.Assert):
        return True
    name = _call_name(node)
    return bool(name) and (name.startswith("assert") or name == "claim")


def claim_keys(tree: ast.AST) -> dict[str, int]:
    """Key -> number of assertions tied to it in this code."""
    keys: dict[str, int] = {}
    for node in ast.walk(tree):
        if _call_name(node) == "claim" and (key := _first_string(node)):
            keys[key] = keys.get(key, 0) + 1
        elif isinstance(node, ast.With):
            for item in node.items:
                if _call_name(item.context_expr) == "claims" and (key := _first_string(item.context_expr)):
                    checks = sum(is_check(n) for stmt in node.body for n in ast.walk(stmt))
                    keys[key] = keys.get(key, 0) + checks
        elif isinstance(node, ast.Assert) and node.msg is not None:
            text = _literal_text(node.msg)
            key = re.match(r"\s*([\w.-]+)\s*:", text)
            if key:
                keys[key.group(1)] = keys.get(key.group(1), 0) + 1
    return keys


def glue_cells(nb, key: str) -> list[int]:
    """Indices of the code cells that glue ``key`` (in their code or in their stored outputs)."""
    found = []
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        in_code = any(_call_name(n) == "glue" and _first_string(n) == key for n in ast.walk(parse_cell(cell)))
        in_outputs = any(o.get("metadata", {}).get("scrapbook", {}).get("name") == key for o in cell.get("outputs", []))
        if in_code or in_outputs:
            found.append(index)
    return found


def claim_violations(entry: str, nb) -> dict[str, str]:
    """Captioned figures and tables whose gluing cell asserts nothing under their key; claims whose
    key nothing glues."""
    found = {}
    for cell in nb.cells:
        if cell.cell_type != "markdown":
            continue
        for key, options, caption in figure_blocks(cell.source):
            if not (options.get("alt") or caption):
                continue
            cells = glue_cells(nb, key)
            if cells and not any(claim_keys(parse_cell(nb.cells[i])).get(key) for i in cells):
                found[key] = (
                    f"{key} (glued in cell {cells[0]}): its caption and alt text make claims, but that cell "
                    f'asserts nothing under the key: add claim("{key}", ...) for what they say'
                )
    glued = glued_names(nb)
    for index, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            for key in claim_keys(parse_cell(cell)):
                if key not in glued:
                    found[f"unknown:{key}"] = f"cell {index} claims {key!r}, which nothing in {entry}.ipynb glues"
    return found


RULES = {"claims": claim_violations}


test_every_captioned_figure_is_claimed_where_it_is_glued = rule_test(
    "claims", claim_violations, "Each captioned figure's gluing cell asserts its claims under its key.")


# --- the parser finds what it must ---------------------------------------------------------


def _cell(source):
    import nbformat

    return nbformat.v4.new_code_cell(source)


def test_claim_keys_reads_the_three_forms():
    code = (
        'claim("fig-a", x > 0)\n'
        'with claims("fig-b"):\n    torch.testing.assert_close(a, b)\n    assert c\n'
        'assert d, "fig-c: each row"\n'
        'assert e, f"fig-d: {e}"\n'
        'assert f, "no key here"\n'
        'with claims("fig-e"):\n    print("nothing asserted")\n'
    )
    keys = claim_keys(parse_cell(_cell(code)))
    assert keys == {"fig-a": 1, "fig-b": 2, "fig-c": 1, "fig-d": 1, "fig-e": 0}


def test_claim_violations_on_a_small_notebook():
    import nbformat

    v4 = nbformat.v4
    glued = lambda key: v4.new_output(  # noqa: E731
        "display_data", data={"application/papermill.record/image/png": "iVBORw0KGgo="},
        metadata={"scrapbook": {"name": key, "mime_prefix": "application/papermill.record/"}},
    )
    nb = v4.new_notebook(cells=[
        v4.new_code_cell('glue("fig-ok", fig)\nclaim("fig-ok", True)', outputs=[glued("fig-ok")]),
        v4.new_code_cell('glue("fig-bad", fig)\nassert True', outputs=[glued("fig-bad")]),
        v4.new_code_cell('glue("fig-silent", fig)', outputs=[glued("fig-silent")]),
        v4.new_code_cell('claim("fig-typo", True)'),
        v4.new_markdown_cell(
            "```{glue:figure} fig-ok\n:alt: A.\nCaption.\n```\n"
            "```{glue:figure} fig-bad\n:alt: B.\nCaption.\n```\n"
            "```{glue:figure} fig-silent\n:name: fig-silent\n```\n"  # no caption, no alt: nothing claimed
        ),
    ])
    found = claim_violations("chapters/x", nb)
    assert set(found) == {"fig-bad", "unknown:fig-typo"}
    assert "cell 1" in found["fig-bad"]


def test_figure_blocks_reads_options_and_caption():
    md = "```{glue:figure} fig-x\n:name: fig-x\n:alt: Alt text.\nThe caption,\non two lines.\n```"
    assert list(figure_blocks(md)) == [("fig-x", {"name": "fig-x", "alt": "Alt text."}, "The caption, on two lines.")]


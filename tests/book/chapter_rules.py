"""What today's chapters still owe the book's rules: the exact list, per rule and per chapter.

Several tests check every chapter against a rule (claims tied to figures, one notation, reading
order, foldable checks, code that fits the column, legible figures, controls that work on the
website). A chapter written before a rule existed breaks it in known places, listed here under
DEBTS[rule][chapter] by a short key per violation (a glue key, a symbol, a cell's first line).

For each rule and chapter, :func:`settle` then

- fails on any violation that is not listed (new content is born compliant);
- fails on a listed violation that is gone (delete its entry: the list stays exact);
- otherwise marks the test as an expected failure (xfail) that names every listed violation.

The chapters' owners delete entries as they fix them; nobody adds entries (a justified
exception is allowed in the chapter itself, in the cell's metadata: see each rule's test).
Run ``python tests/book/chapter_debts.py`` to print every chapter's current violations.
"""

from __future__ import annotations

import pytest

# Every chapter keeps every rule today; a rule added later lists what chapters still owe here.
DEBTS: dict[str, dict[str, list[str]]] = {
    'claims': {
    },
    'notation': {
    },
    'order': {
    },
    'checks': {
    },
    'code-width': {
    },
    'controls': {
    },
    'figures': {
    },
}


def settle(rule: str, entry: str, found: dict[str, str]) -> None:
    """Compare the violations ``found`` (key -> message) with those listed for ``rule`` and ``entry``."""
    known = set(DEBTS.get(rule, {}).get(entry, []))
    new = {key: message for key, message in found.items() if key not in known}
    fixed = sorted(known - set(found))
    problems = []
    if new:
        problems.append(f"{entry}: {len(new)} violation(s) of '{rule}' not listed in tests/book/chapter_debts.py:")
        problems += [f"  - {message}" for message in new.values()]
    if fixed:
        problems.append(f"{entry}: listed under DEBTS[{rule!r}] but fixed; delete these entries from "
                        "tests/book/chapter_debts.py:")
        problems += [f"  - {key!r}" for key in fixed]
    if problems:
        pytest.fail("\n".join(problems), pytrace=False)
    if found:
        shown = list(found.values())[:2]
        more = f" | ... {len(found) - 2} more" if len(found) > 2 else ""
        pytest.xfail(f"{len(found)} known violation(s) of '{rule}' listed in tests/book/chapter_debts.py: "
                     + " | ".join(shown) + more)


def rule_test(rule: str, check, doc: str):
    """A test, one case per chapter notebook of _toc.yml, that settles ``check(entry, nb)`` (key ->
    message) against the violations listed for ``rule``."""
    from test_notebooks import notebook, parametrize

    @parametrize
    def test(entry):
        settle(rule, entry, check(entry, notebook(entry)))

    test.__doc__ = doc
    return test


def _print_current() -> None:  # pragma: no cover - a tool for the chapters' owners
    """Print every chapter's current violations of every rule, in the registry's format."""
    import importlib
    import sys
    from pathlib import Path

    here = Path(__file__).resolve().parent
    sys.path[:0] = [str(here), str(here.parent)]  # the chapter-wide tests and tests/toc_notebooks.py
    from test_notebooks import ENTRIES, notebook_or_none

    rules = {}
    for module in ("test_claims", "test_notation", "test_reading_order", "test_cells", "test_figures"):
        rules.update(importlib.import_module(module).RULES)
    print("DEBTS = {")
    for rule, check in rules.items():
        print(f"    {rule!r}: {{")
        for entry in ENTRIES:
            nb = notebook_or_none(entry)
            if nb is None:
                continue
            found = check(entry, nb)
            if found:
                print(f"        {entry!r}: [")
                for key in found:
                    print(f"            {key!r},")
                print("        ],")
        print("    },")
    print("}")


if __name__ == "__main__":  # pragma: no cover
    _print_current()

"""One test per rule that every chapter keeps (claims tied to figures, one notation, reading order,
foldable checks, code that fits the column, legible figures, controls that work on the website).

:func:`rule_test` makes it: one case per chapter notebook of _toc.yml, failing with every violation
the rule's check finds there. A justified exception is allowed in the chapter itself, in the cell's
metadata (see each rule's test).
"""

from __future__ import annotations


def rule_test(rule: str, check, doc: str):
    """A test, one case per chapter notebook of _toc.yml, that ``check(entry, nb)`` (key -> message)
    finds no violation of ``rule``."""
    from test_notebooks import notebook, parametrize

    @parametrize
    def test(entry):
        found = check(entry, notebook(entry))
        assert not found, "\n".join([f"{entry}: {len(found)} violation(s) of '{rule}':"]
                                    + [f"  - {message}" for message in found.values()])

    test.__doc__ = doc
    return test

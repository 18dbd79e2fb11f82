"""Sphinx extension: list the bibliography under author-year labels.

The chapters cite in author-year form ("Bahdanau et al., 2015"); the bibliography page then labels
each entry the same way, sorted by author, so that a reader who follows a citation finds the
label they clicked. Use it with ``:style: author_year_labels`` on the ``bibliography`` directive.
"""

from __future__ import annotations

from pybtex.plugin import register_plugin
from pybtex.style.formatting.plain import Style as PlainStyle
from pybtex.style.labels import BaseLabelStyle

NAME = "author_year_labels"


def _surname(person) -> str:
    return " ".join(person.prelast_names + person.last_names).replace("{", "").replace("}", "")


class AuthorYearLabels(BaseLabelStyle):
    def format_labels(self, sorted_entries):
        for entry in sorted_entries:
            names = [_surname(p) for p in entry.persons.get("author") or entry.persons.get("editor") or []]
            if len(names) >= 3:
                who = f"{names[0]} et al."
            elif len(names) == 2:
                who = f"{names[0]} and {names[1]}"
            else:
                who = names[0] if names else entry.key
            yield f"{who}, {entry.fields.get('year', 'n.d.')}"


class AuthorYearStyle(PlainStyle):
    default_label_style = NAME


def setup(app):
    register_plugin("pybtex.style.labels", NAME, AuthorYearLabels)
    register_plugin("pybtex.style.formatting", NAME, AuthorYearStyle)
    return {"parallel_read_safe": True, "parallel_write_safe": True}

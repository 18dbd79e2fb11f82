"""What a chapter needs to know about the rest of the book to stand on its own.

The website resolves cross-references with Sphinx; a plain notebook has no Sphinx. :class:`Book`
reads the same sources Sphinx reads (``_config.yml``, ``_toc.yml``, the pages, ``references.bib``)
and answers the questions a reference asks: the title of a page, the number of a figure or an
equation, the heading a label points to, the author-year form of a citation.

Numbers follow the website's numbering: figures are counted within their chapter, with the
chapter's number taken from its file name (the second figure of ``chapters/03_scaled_dot_product``
is 3.2; :func:`chapter_number`, which the website's extension uses too); equations are counted
through the pages in the order of the table of contents; only a figure with a name and a caption
gets a number, as Sphinx does.
"""

from __future__ import annotations

import json
import pathlib
import posixpath
import re
from dataclasses import dataclass, field
from functools import cached_property

import yaml

from bookbuild.notebooks import toc_files
from bookbuild.runnable.syntax import EQUATION_LABEL, FENCE_OPEN, HEADING, TARGET, closing_line, directive_options, without_code

__all__ = ["Book", "RunnableError", "Citation", "markdown_cells", "chapter_number"]

CHAPTER_FILE = re.compile(r"(?:^|/)(\d+)([a-z]*)_[^/]*$")


def chapter_number(docname: str) -> str | None:
    """'chapters/03_scaled_dot_product' -> '3', 'chapters/05b_four_scores' -> '5b'; else None."""
    match = CHAPTER_FILE.search(docname)
    return f"{int(match.group(1))}{match.group(2)}" if match else None

# The website's Sphinx extension that labels bibliography entries by author and year.
SITE_LABELS = "src/site-assets/bibliography_style.py"


class RunnableError(ValueError):
    """A chapter uses something the runnable edition cannot express; the message says where."""


@dataclass(frozen=True)
class Citation:
    """One entry of the bibliography: its author-year label and its full reference in Markdown."""

    key: str
    authors: str  # "Vaswani et al.", "Luong and Pham", "Bahdanau"
    year: str
    reference: str  # the whole entry, formatted as the bibliography page formats it

    @property
    def label(self) -> str:
        return f"{self.authors}, {self.year}"


def markdown_cells(path: pathlib.Path) -> list[str]:
    """The Markdown of a page: each Markdown cell of a notebook, or the whole of a ``.md`` file
    (without its front matter)."""
    if path.suffix == ".ipynb":
        nb = json.loads(path.read_text(encoding="utf-8"))
        return ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown"]
    text = path.read_text(encoding="utf-8")
    if text.startswith("---\n"):
        end = text.find("\n---", 4)
        text = text[end + 4:] if end >= 0 else text
    return [text]


@dataclass
class Book:
    """The book's pages and everything a cross-reference between them needs."""

    root: pathlib.Path
    config: dict = field(init=False)
    pages: list[str] = field(init=False)  # docnames in reading order, e.g. "chapters/notation"

    def __post_init__(self):
        self.root = pathlib.Path(self.root).resolve()
        self.config = yaml.safe_load((self.root / "_config.yml").read_text(encoding="utf-8")) or {}
        self.pages = toc_files(self.root / "_toc.yml")

    # --- the repository --------------------------------------------------------------------------

    @property
    def repository_url(self) -> str:
        """The repository's address, from ``_config.yml``'s ``repository.url`` (no trailing slash)."""
        url = (self.config.get("repository") or {}).get("url")
        if not url:
            raise RunnableError("_config.yml has no repository.url: the runnable edition needs it")
        return url.rstrip("/")

    @property
    def branch(self) -> str:
        return str((self.config.get("repository") or {}).get("branch") or "main")

    def blob_url(self, path: str) -> str:
        """The repository's web page of one file, e.g. ``chapters/notation.md``."""
        return f"{self.repository_url}/blob/{self.branch}/{path}"

    # --- pages -----------------------------------------------------------------------------------

    def path(self, docname: str) -> pathlib.Path | None:
        for suffix in (".ipynb", ".md"):
            candidate = self.root / f"{docname}{suffix}"
            if candidate.is_file():
                return candidate
        return None

    def notebooks(self) -> list[pathlib.Path]:
        """The executed chapters: every notebook in the table of contents, in reading order."""
        return [p for p in (self.path(d) for d in self.pages) if p is not None and p.suffix == ".ipynb"]

    @staticmethod
    def docname_of(path: pathlib.Path, root: pathlib.Path) -> str:
        return pathlib.Path(path).resolve().relative_to(root).with_suffix("").as_posix()

    def resolve_doc(self, target: str, current: str) -> str:
        """A ``{doc}`` target (relative to the current page, or absolute from the book's root)."""
        target = target.strip()
        for suffix in (".ipynb", ".md"):
            target = target.removesuffix(suffix)
        if target.startswith("/"):
            docname = target.lstrip("/")
        else:
            docname = posixpath.normpath(posixpath.join(posixpath.dirname(current), target))
        if self.path(docname) is None:
            raise RunnableError(f"{current}: {{doc}}`{target}` names no page of the book")
        return docname

    @cached_property
    def _scan(self) -> dict:
        """One pass over every page: titles, figure and equation numbers, section labels."""
        titles: dict[str, str] = {}
        figures: dict[str, tuple[str, str]] = {}  # label -> (docname, number such as '3.2')
        equations: dict[str, tuple[str, int]] = {}
        sections: dict[str, tuple[str, str]] = {}  # label -> (docname, heading)
        figure_count = equation_count = 0  # through the book, as Sphinx counts
        for docname in self.pages:
            chapter, in_chapter = chapter_number(docname), 0
            path = self.path(docname)
            if path is None:
                continue
            for text in markdown_cells(path):
                lines = without_code(text.splitlines())
                for i, line in enumerate(lines):
                    heading = HEADING.match(line)
                    if heading and docname not in titles and len(heading["hashes"]) == 1:
                        titles[docname] = heading["title"]
                    target = TARGET.match(line)
                    if target:
                        following = next((h for h in lines[i + 1:] if h.strip()), "")
                        match = HEADING.match(following)
                        if match:
                            sections[target["label"]] = (docname, match["title"])
                    opening = FENCE_OPEN.match(line)
                    if opening and opening["name"] in ("glue:figure", "figure", "math"):
                        end = closing_line(lines, i, opening["fence"])
                        options, content = directive_options(lines[i + 1:end])
                        if opening["name"] == "math":
                            if "label" in options:
                                equation_count += 1
                                equations[options["label"]] = (docname, equation_count)
                        elif "name" in options and any(c.strip() for c in content):
                            # Sphinx numbers a figure that has a name and a caption
                            figure_count += 1
                            in_chapter += 1
                            figures[options["name"]] = (
                                docname, f"{chapter}.{in_chapter}" if chapter else str(figure_count))
                    for match in EQUATION_LABEL.finditer(line):
                        equation_count += 1
                        equations[match["label"]] = (docname, equation_count)
            titles.setdefault(docname, pathlib.PurePosixPath(docname).name)
        return {"titles": titles, "figures": figures, "equations": equations, "sections": sections}

    def title(self, docname: str) -> str:
        return self._scan["titles"].get(docname, pathlib.PurePosixPath(docname).name)

    def figure(self, label: str, current: str) -> tuple[str, str]:
        try:
            return self._scan["figures"][label]
        except KeyError:
            raise RunnableError(f"{current}: no numbered figure is named {label!r}") from None

    def equation(self, label: str, current: str) -> tuple[str, int]:
        try:
            return self._scan["equations"][label]
        except KeyError:
            raise RunnableError(f"{current}: no labelled equation is named {label!r}") from None

    def section(self, label: str, current: str) -> tuple[str, str]:
        try:
            return self._scan["sections"][label]
        except KeyError:
            raise RunnableError(f"{current}: no heading is labelled {label!r}") from None

    # --- the bibliography ------------------------------------------------------------------------

    @cached_property
    def bibliography(self) -> dict[str, Citation]:
        """Every entry of the ``.bib`` files named in ``_config.yml``, by key."""
        from pybtex.database import parse_file
        from pybtex.plugin import find_plugin

        style = find_plugin("pybtex.style.formatting", "plain")()
        backend = find_plugin("pybtex.backends", "markdown")()
        labels = self._site_labels()
        entries: dict[str, Citation] = {}
        for bib in self.config.get("bibtex_bibfiles") or []:
            data = parse_file(str(self.root / bib), bib_format="bibtex")
            for formatted in style.format_entries(data.entries.values()):
                authors, _, year = next(labels.format_labels([data.entries[formatted.key]])).rpartition(", ")
                entries[formatted.key] = Citation(key=formatted.key, authors=authors, year=year,
                                                  reference=formatted.text.render(backend))
        return entries

    def _site_labels(self):
        """The website's author-year labels ("Vaswani et al., 2017"), from its own Sphinx extension."""
        import importlib.util

        path = self.root / SITE_LABELS
        spec = importlib.util.spec_from_file_location("_book_bibliography_style", path)
        if spec is None or not path.is_file():
            raise RunnableError(f"{SITE_LABELS} is missing: the runnable edition labels citations as the website does")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module.AuthorYearLabels()

    def citation(self, key: str, current: str) -> Citation:
        try:
            return self.bibliography[key]
        except KeyError:
            raise RunnableError(f"{current}: {{cite}}`{key}` is not in the bibliography") from None

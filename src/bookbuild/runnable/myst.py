"""MyST Markdown to plain Markdown: what the website's renderer does, done once, ahead of time.

:class:`MarkdownConverter` turns the Markdown of one cell into a list of pieces: plain Markdown
(``str``) that any notebook renderer shows as the website does, and :class:`FigureBlock` for each
figure, which the notebook needs as a cell of its own. Roles and directives become:

- ``{glue:text}`name:.2f``` and ``{glue}`name``` - the glued value, formatted as MyST-NB formats it;
- ``{numref}``, ``{eq}``, ``{ref}``, ``{doc}`` - the figure or equation number, the heading or the page
  title, linking to the page where it has one; ``{cite}`` - the author-year label, the full entry
  going to the chapter's references;
- ``{literalinclude}`` - the included code itself, selected by ``:pyobject:``/``:lines:`` exactly as
  Sphinx selects it; ``{code-block}`` - a fenced block; ``{math}`` and labelled ``$$`` - display maths
  with ``\\tag{n}``;
- admonitions (``{note}``, ``{warning}``, ``{admonition} Title``, ...) - a block quote with a bold title;
- ``(label)=`` targets, ``%`` comments and ``+++`` breaks - nothing.

A role or directive it does not know is an error that names it, never raw text on the page.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from types import SimpleNamespace

from bookbuild.runnable.book import Book, RunnableError
from bookbuild.runnable.syntax import EQUATION_LABEL, FENCE_OPEN, PLAIN_FENCE, TARGET, closing_line, directive_options

__all__ = ["FigureBlock", "MarkdownConverter", "ROLE", "format_glued_text"]

# A Markdown link or image with a relative target: `[text](target)`, `![alt](target)`.
RELATIVE_LINK = re.compile(r"(?P<bang>!?)\[(?P<text>[^\]]*)\]\((?P<target>(?![a-z][\w+.-]*:|#|/)[^)\s]+)\)")
ROLE = re.compile(r"\{(?P<name>[A-Za-z][\w:+-]*)\}(?P<ticks>`+)(?P<content>.+?)(?P=ticks)", re.S)
EXPLICIT = re.compile(r"^(?P<text>.*?)\s*<(?P<target>[^<>]+)>$", re.S)
COMMENT = re.compile(r"^%.*$")
BLOCK_BREAK = re.compile(r"^\+\+\+.*$")

ADMONITIONS = {
    "note": "Note", "tip": "Tip", "hint": "Hint", "important": "Important", "warning": "Warning",
    "caution": "Caution", "attention": "Attention", "danger": "Danger", "error": "Error",
    "seealso": "See also", "admonition": None, "dropdown": None, "margin": None, "sidebar": None,
    "topic": None, "epigraph": None, "pull-quote": None, "highlights": None,
}
# The glue roles and directives that paste a value, and the form of it they paste.
GLUE_KINDS = {"glue": "text/plain", "glue:any": "text/plain", "glue:text": "text/plain",
              "glue:md": "text/markdown", "glue:math": "text/plain"}
CODE_BLOCKS = ("code-block", "code", "sourcecode", "code-cell")
IGNORED = ("toctree", "tableofcontents", "contents")
# The website's figure label (Sphinx's numfig_format default for figures) and equation label.
FIGURE_FORMAT = "Figure %s"
LANGUAGES = {".py": "python", ".sh": "bash", ".yml": "yaml", ".yaml": "yaml", ".json": "json",
             ".toml": "toml", ".cfg": "ini", ".txt": "text", ".md": "markdown"}


@dataclass
class FigureBlock:
    """A ``{glue:figure}`` block: the glued figure ``name`` shown with its caption and alt text."""

    name: str
    caption: str  # Markdown, references already resolved
    alt: str
    label: str | None  # the figure's own name, if it has one
    number: int | None  # as on the website, when it is numbered


def format_glued_text(data: dict, spec: str | None) -> str:
    """The text of a glued value exactly as the website's ``{glue:text}`` shows it (MyST-NB's own
    formatting of its ``text/plain``, with the format spec, default ``s``)."""
    from myst_nb.core.variables import format_plain_text

    return format_plain_text(data["text/plain"], spec if spec is not None else "s")


def _split_explicit(content: str) -> tuple[str | None, str]:
    """``text <target>`` -> (text, target); ``target`` -> (None, target)."""
    match = EXPLICIT.match(content.strip())
    if match and match["text"]:
        return match["text"].strip(), match["target"].strip()
    return None, content.strip()


@dataclass
class MarkdownConverter:
    """Converts the Markdown cells of one page of ``book``.

    ``glued`` maps each glued name to its stored MIME bundle (MyST-NB's record, with the
    ``application/papermill.record/`` prefix taken off); ``link`` gives the address of another page
    of the book. The citations met along the way are collected in ``cited``, in order.
    """

    book: Book
    docname: str
    glued: dict[str, dict]
    link: callable
    cited: list[str] = field(default_factory=list)

    # --- blocks ----------------------------------------------------------------------------------

    def convert(self, text: str) -> list[str | FigureBlock]:
        """The pieces of one Markdown cell, in order; neighbouring text is merged."""
        pieces: list[str | FigureBlock] = []
        for piece in self._blocks(text.splitlines()):
            if isinstance(piece, str) and pieces and isinstance(pieces[-1], str):
                pieces[-1] += "\n" + piece
            else:
                pieces.append(piece)
        return [p.strip("\n") if isinstance(p, str) else p for p in pieces
                if not (isinstance(p, str) and not p.strip())]

    def convert_text(self, text: str, where: str) -> str:
        """Markdown that must stay Markdown (an admonition's body, a caption): no figure inside."""
        pieces = self.convert(text)
        if any(not isinstance(p, str) for p in pieces):
            raise RunnableError(f"{self.docname}: a figure inside {where} cannot be shown in a notebook")
        return "\n\n".join(pieces)

    def _blocks(self, lines: list[str]):
        text: list[str] = []
        i = 0
        while i < len(lines):
            line = lines[i]
            plain = PLAIN_FENCE.match(line)
            opening = FENCE_OPEN.match(line)
            if plain and not opening:
                end = closing_line(lines, i, plain["fence"])
                yield self._inline("\n".join(text))
                text = []
                yield "\n".join(lines[i:end + 1])  # code is shown as it is
                i = end + 1
                continue
            if opening:
                end = closing_line(lines, i, opening["fence"])
                yield self._inline("\n".join(text))
                text = []
                yield from self._directive(opening["name"], opening["args"], lines[i + 1:end])
                i = end + 1
                continue
            if TARGET.match(line) or COMMENT.match(line) or BLOCK_BREAK.match(line):
                i += 1
                continue
            text.append(line)
            i += 1
        yield self._inline("\n".join(text))

    def _directive(self, name: str, args: str, body: list[str]):
        options, content = directive_options(body)
        where = f"{self.docname}: {{{name}}}"
        if name == "glue:figure":
            glue_name = args.strip()
            if glue_name not in self.glued:
                raise RunnableError(f"{where} {glue_name}: nothing was glued under that name")
            label = options.get("name")
            caption = self.convert_text("\n".join(content), "a caption") if content else ""
            number = self.book.figure(label, self.docname)[1] if label and caption else None
            yield FigureBlock(name=glue_name, caption=caption, alt=options.get("alt", "").strip(),
                              label=label, number=number)
        elif name in GLUE_KINDS:
            value = self._glued_text(args.strip(), where, GLUE_KINDS[name])
            yield f"$$\n{value}\n$$" if name == "glue:math" else value
        elif name == "literalinclude":
            yield self._literalinclude(args.strip(), options, where)
        elif name in CODE_BLOCKS:
            language = args.strip().split()[0] if args.strip() else ""
            yield "\n".join([f"```{language}", *content, "```"])
        elif name == "math":
            maths = "\n".join(content).strip()
            if "label" in options:
                maths += f" \\tag{{{self.book.equation(options['label'], self.docname)[1]}}}"
            yield f"$$\n{maths}\n$$"
        elif name in ADMONITIONS:
            title = ADMONITIONS[name] or args.strip()
            inner = self.convert_text("\n".join(content), f"a {{{name}}}")
            quoted = [f"**{self._inline(title)}**", ""] if title else []
            quoted += inner.splitlines()
            yield "\n".join(f"> {q}".rstrip() for q in quoted)
        elif name == "bibliography":
            entries = self.book.bibliography.values()
            yield "\n".join(f"- {c.label}. {c.reference}" for c in sorted(entries, key=lambda c: c.label))
        elif name in IGNORED:
            return
        else:
            raise RunnableError(f"{where}: this directive has no plain-Markdown form; "
                                "add one to runnable.myst or write the block in Markdown")

    def _literalinclude(self, target: str, options: dict, where: str) -> str:
        from sphinx.directives.code import LiteralIncludeReader

        path = (self.book.root / self.docname).parent / target
        if target.startswith("/"):
            path = self.book.root / target.lstrip("/")
        if not path.is_file():
            raise RunnableError(f"{where} {target}: no such file")
        known = {"pyobject", "lines", "start-after", "end-before", "start-at", "end-at", "dedent",
                 "prepend", "append", "lineno-match", "diff", "encoding", "tab-width"}
        reader_options = {k: v for k, v in options.items() if k in known}
        if "dedent" in reader_options:
            reader_options["dedent"] = int(reader_options["dedent"]) if reader_options["dedent"] else None
        try:
            code, _ = LiteralIncludeReader(str(path), reader_options,
                                           SimpleNamespace(source_encoding="utf-8-sig")).read()
        except Exception as exc:  # Sphinx's own errors: a missing object, lines out of range
            raise RunnableError(f"{where} {target}: {exc}") from None
        language = options.get("language") or LANGUAGES.get(path.suffix, "")
        fence = "````" if "```" in code else "```"
        block = f"{fence}{language}\n{code.rstrip()}\n{fence}"
        if options.get("caption"):
            block = f"*{self._inline(options['caption'])}*\n\n{block}"
        return block

    # --- roles -----------------------------------------------------------------------------------

    def _inline(self, text: str) -> str:
        """Roles, labelled equations and comments in running text (outside code)."""
        text = EQUATION_LABEL.sub(
            lambda m: f"\\tag{{{self.book.equation(m['label'], self.docname)[1]}}} $$", text)
        text = RELATIVE_LINK.sub(self._relative_link, text)
        return ROLE.sub(lambda m: self._role(m["name"], m["content"]), text)

    def _relative_link(self, match: re.Match) -> str:
        """A link relative to this page: to another page of the book, where that page is in this
        edition (or in the repository); to another file of the repository, its page there.
        Anything else (a code span that looks like a link) is left as it is."""
        target, _, anchor = match["target"].partition("#")
        path = (self.book.root / self.docname).parent / target
        if not path.exists() or self.book.root not in path.resolve().parents:
            return match.group(0)
        if match["bang"]:
            raise RunnableError(f"{self.docname}: the image {match['target']!r} is a file beside the page; "
                                "show a figure made by the code (glue) instead")
        relative = path.resolve().relative_to(self.book.root).as_posix()
        docname = relative.rsplit(".", 1)[0]
        url = self.link(docname) if self.book.path(docname) is not None else self.book.blob_url(relative)
        return f"[{match['text']}]({url}{'#' + anchor if anchor else ''})"

    def _glued_text(self, content: str, where: str, mime: str = "text/plain") -> str:
        name, spec = content.rsplit(":", 1) if ":" in content else (content, None)
        if "::" in name:
            raise RunnableError(f"{where}`{content}`: glue from another page has no plain-Markdown form")
        if name not in self.glued:
            raise RunnableError(f"{where}`{content}`: nothing was glued under the name {name!r}")
        data = self.glued[name]
        if mime not in data:
            raise RunnableError(f"{where}`{content}`: the glued value has no {mime} form")
        return data[mime] if mime != "text/plain" else format_glued_text(data, spec)

    def _role(self, name: str, content: str) -> str:
        where = f"{self.docname}: {{{name}}}"
        if name in GLUE_KINDS:
            value = self._glued_text(content.strip(), where, GLUE_KINDS[name])
            return f"${value}$" if name == "glue:math" else value
        if name == "numref":
            text, label = _split_explicit(content)
            docname, number = self.book.figure(label, self.docname)
            shown = (text or FIGURE_FORMAT).replace("%s", str(number)).replace("{number}", str(number))
            return shown if docname == self.docname else f"[{shown}]({self.link(docname)})"
        if name == "eq":
            docname, number = self.book.equation(content.strip(), self.docname)
            return f"({number})" if docname == self.docname else f"[({number})]({self.link(docname)})"
        if name == "ref":
            text, label = _split_explicit(content)
            docname, heading = self.book.section(label, self.docname)
            return f"[{text or heading}]({self.link(docname)})"
        if name == "doc":
            text, target = _split_explicit(content)
            docname = self.book.resolve_doc(target, self.docname)
            return f"[{text or self.book.title(docname)}]({self.link(docname)})"
        if name.startswith("cite"):
            return self._cite(name, content, where)
        if name == "math":
            return f"${content}$"
        if name in ("sup", "sub", "kbd"):
            return f"<{name}>{content}</{name}>"
        if name in ("abbr", "term", "dfn"):
            return _split_explicit(content)[0] or _split_explicit(content)[1]
        raise RunnableError(f"{where}`{content}`: this role has no plain-Markdown form; "
                            "add one to runnable.myst")

    def _cite(self, name: str, content: str, where: str) -> str:
        keys = [k.strip() for k in content.split(",") if k.strip()]
        # sorted by author and year, as the website lists several keys
        citations = sorted((self.book.citation(k, self.docname) for k in keys), key=lambda c: (c.authors, c.year))
        for key in keys:
            if key not in self.cited:
                self.cited.append(key)
        kind = name.partition(":")[2] or "p"
        # As the website writes them (sphinxcontrib-bibtex's author-year style).
        if kind in ("p", "ps", "alp"):
            return "[" + ", ".join(c.label for c in citations) + "]"
        if kind in ("t", "ts"):
            return ", ".join(f"{c.authors} [{c.year}]" for c in citations)
        if kind == "year":
            return "; ".join(c.year for c in citations)
        if kind == "author":
            return "; ".join(c.authors for c in citations)
        raise RunnableError(f"{where}`{content}`: this citation role has no plain-Markdown form")

"""What a student hands in, made data: nothing of it runs in the browser of whoever reads it.

nbgrader's formgrader (in the instructor's logged-in Jupyter) and the feedback pages show the
autograded notebook as HTML through nbconvert, which copies raw HTML in markdown cells, raw cells
and rich outputs into the page as it finds them. :func:`sanitize_notebook` makes the autograded
notebook itself safe to show (``autograde`` runs it last, through
:class:`attnbook_classroom.course.plugins.ShowAsData`; nothing after it may rewrite a markdown cell):

- a markdown cell stays as it is when the page nbconvert's own renderer makes of it holds nothing
  but what the renderer writes itself:

  - rendered with raw HTML escaped, it gives the same page (no HTML of the student's);
  - every tag and attribute is one the renderer makes of markdown (paragraphs, emphasis, lists,
    tables, headings, links, images, code highlighted by Pygments: :data:`RENDERER_MAKES`); a
    ``mermaid`` code block, which the renderer copies as it is, escaped or not, is not one;
  - every address is a link (``http``, ``https``, ``mailto``, in the page or relative) or an image
    embedded as PNG, JPEG or GIF data;
  - its text outside code holds no ``url(`` and none of the MathJax commands that give maths a
    style, a link, an id, a class, a font or a new macro (:data:`MATHJAX_STYLED`): formgrader's
    MathJax 2.7 typesets every ``$...$``, ``\\(...\\)``, ``\\[...\\]`` and ``\\begin{...}`` it finds
    in the page's text (not in ``pre`` or ``code``), and its Safe extension still lets a
    ``\\style{cursor:url(...)}`` fetch an address;
  - no heading's id is one formgrader looks up: a grade cell's id in the notebook (or that id with
    ``-comment`` or ``_extra_credit``: a heading ``# causal-square`` would take the score box of
    the test cell ``causal-square``) or formgrader's own (:data:`FORMGRADER_IDS`);

  any other cell, and every raw cell, is shown as the text the student wrote, in a code block, so
  the instructor still reads it;
- outputs keep their text (streams, errors, plain-text results) and PNG and JPEG images, nothing
  else (no HTML, JavaScript, SVG, widget views, output metadata);
- a cell keeps its nbgrader marks and tags made of plain characters, a markdown cell its image
  attachments; the notebook keeps only its kernel (widget state, titles and the rest go).
"""

from __future__ import annotations

import html.parser
import re

import nbformat

__all__ = ["sanitize_notebook", "safe_markdown", "as_text", "renders_safely", "RENDERER_MAKES", "MATHJAX_STYLED",
           "FORMGRADER_IDS"]

AS_TEXT_NOTE = "*As written (this cell holds HTML or an address that is not shown as a page here):*"
_PLAIN = re.compile(r"[\w .:+-]*")  # a string no HTML context can read as markup
_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
_BASE64 = re.compile(r"[A-Za-z0-9+/=\s]*")
_IMAGES = ("image/png", "image/jpeg", "image/gif")

_ANY = re.compile(r".*", re.S)  # text the renderer escaped (an address is checked on its own)
_ALIGN = {"style": re.compile(r"text-align:(left|center|right)")}
# tag -> attribute -> its value, for everything nbconvert's markdown renderer (mistune with its
# plugins, and Pygments for code) makes of markdown alone; its mermaid block copies the student's text
# as it is, so a <div class="jp-Mermaid"> is not here.
RENDERER_MAKES = {
    **{tag: {} for tag in ("p", "em", "strong", "del", "br", "hr", "blockquote", "ul", "dl", "dt", "dd",
                           "table", "thead", "tbody", "tr", "pre")},
    **{f"h{level}": {"id": _ANY} for level in range(1, 7)},
    "a": {"href": _ANY, "title": _ANY, "class": re.compile("anchor-link")},
    "img": {"src": _ANY, "alt": _ANY, "title": _ANY},
    "ol": {"start": re.compile(r"\d+")},
    "li": {"class": re.compile("task-list-item")},
    "input": {"class": re.compile("task-list-item-checkbox"), "type": re.compile("checkbox"),
              "disabled": re.compile(""), "checked": re.compile("")},
    "th": _ALIGN, "td": _ALIGN,
    "code": {"class": re.compile(r"language-[^\s\"'<>&]+")},
    "div": {"class": re.compile("highlight")},
    "span": {"class": re.compile(r"[a-z][a-z0-9]{0,2}")},  # Pygments' token classes (k, nf, s1...)
}
# MathJax 2.7 commands (with its Safe extension, as formgrader loads it) that give maths a style, a
# link, an id, a class, a font, an attribute, a tooltip, an extension or a new macro.
MATHJAX_STYLED = re.compile(
    r"\\(style|bbox|href|class|cssId|require|unicode|mmlToken|def|edef|gdef|xdef|global|let|newcommand|"
    r"renewcommand|providecommand|newenvironment|renewenvironment|DeclareMathOperator|texttip|mathtip|"
    r"toggle|FormatError)(?![A-Za-z])")
# ids formgrader's own page and scripts use; a grade cell's score, extra credit and comment boxes
# are its grade id, grade id + "_extra_credit" and grade id + "-comment"
FORMGRADER_IDS = frozenset({"notebook", "notebook-container", "statusmessage"})


def _render(source: str, attachments: dict, escape: bool) -> str:
    """``source`` as nbconvert's HTML exporter renders a markdown cell (its markdown2html, with the
    exporter's defaults), raw HTML kept or escaped."""
    from nbconvert.filters.markdown_mistune import IPythonRenderer, MarkdownWithMath

    renderer = IPythonRenderer(escape=escape, attachments=attachments, embed_images=False, path="",
                               anchor_link_text="¶", exclude_anchor_links=False)
    return MarkdownWithMath(renderer=renderer).render(source)


def _safe_address(attribute: str, value: str) -> bool:
    address = re.sub(r"[\x00-\x20]", "", value).lower()  # as a browser reads it (entities are decoded)
    if attribute == "src":  # an image: only one embedded in the page (no request, no script)
        return re.fullmatch(r"data:image/(png|jpeg|gif);base64,[a-z0-9+/=]*", address) is not None
    scheme = re.match(r"([a-z][a-z0-9+.-]*):", address)
    return scheme is None or scheme.group(1) in ("http", "https", "mailto")


class _Rendered(html.parser.HTMLParser):
    """A rendered cell: what in it the renderer does not make (:data:`RENDERER_MAKES`), its ids,
    and its text outside ``pre`` and ``code`` (what MathJax reads)."""

    def __init__(self, page: str):
        super().__init__(convert_charrefs=True)
        self.foreign, self.ids, self.text, self._code = [], [], [], 0
        self.feed(page)
        self.close()

    def handle_startendtag(self, tag, attrs):
        allowed = RENDERER_MAKES.get(tag)
        if allowed is None:
            self.foreign.append(tag)
            return
        for name, value in attrs:
            value = value or ""
            if name not in allowed or not allowed[name].fullmatch(value) or \
                    (name in ("href", "src") and not _safe_address(name, value)):
                self.foreign.append(f"{tag} {name}={value!r}")
            elif name == "id":
                self.ids.append(value)

    def handle_starttag(self, tag, attrs):
        self.handle_startendtag(tag, attrs)
        if tag in ("pre", "code"):
            self._code += 1

    def handle_endtag(self, tag):
        if tag in ("pre", "code") and self._code:
            self._code -= 1

    def handle_data(self, data):
        if not self._code:
            self.text.append(data)


def renders_safely(source: str, attachments: dict | None = None, reserved_ids=frozenset()) -> bool:
    """Whether nbconvert renders ``source`` with nothing but what its renderer makes of markdown,
    no address but links and embedded images, no maths MathJax would style, and no heading whose
    id is formgrader's or in ``reserved_ids`` (see the module)."""
    attachments = attachments or {}
    try:
        page = _render(source, attachments, escape=False)
        escaped = _render(source, attachments, escape=True)
    except Exception:  # e.g. an image from an attachment the cell does not have
        return False
    if page != escaped:
        return False  # the renderer copied some of it as HTML
    rendered = _Rendered(page)
    text = "".join(rendered.text)
    return not rendered.foreign and not MATHJAX_STYLED.search(text) and "url(" not in text.lower() \
        and not set(rendered.ids) & (FORMGRADER_IDS | set(reserved_ids))


def as_text(source: str) -> str:
    """Markdown that shows ``source`` as it is written: a code block whose fence no run of
    backticks in it can close."""
    longest = max((len(run) for run in re.findall(r"`+", source)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{AS_TEXT_NOTE}\n\n{fence}\n{source}\n{fence}"


def safe_markdown(source: str, attachments: dict | None = None, reserved_ids=frozenset()) -> str:
    """``source`` if it renders safely, else the same text shown as written."""
    if renders_safely(source, attachments, reserved_ids):
        return source
    text = as_text(source)
    return text if renders_safely(text, reserved_ids=reserved_ids) else "*This cell could not be shown safely.*"


def _reserved_ids(nb: nbformat.NotebookNode) -> set[str]:
    """The ids formgrader gives the grade boxes of ``nb``'s grade cells (see :data:`FORMGRADER_IDS`)."""
    found = {str(cell["metadata"]["nbgrader"].get("grade_id")) for cell in nb.cells
             if isinstance(cell.get("metadata"), dict) and isinstance(cell["metadata"].get("nbgrader"), dict)}
    return {f"{grade_id}{suffix}" for grade_id in found for suffix in ("", "-comment", "_extra_credit")}


def _text(value) -> str:
    if isinstance(value, list):
        return "".join(str(v) for v in value)
    return value if isinstance(value, str) else str(value)


def _output(output) -> nbformat.NotebookNode | None:
    kind = output.get("output_type")
    if kind == "stream":
        name = "stderr" if output.get("name") == "stderr" else "stdout"
        return nbformat.v4.new_output("stream", name=name, text=_text(output.get("text", "")))
    if kind == "error":
        trace = output.get("traceback", [])
        return nbformat.v4.new_output("error", ename=_text(output.get("ename", "")),
                                      evalue=_text(output.get("evalue", "")),
                                      traceback=[_text(t) for t in trace] if isinstance(trace, list) else [])
    if kind not in ("execute_result", "display_data"):
        return None
    found = output.get("data", {}) if isinstance(output.get("data"), dict) else {}
    data = {"text/plain": _text(found["text/plain"])} if "text/plain" in found else {}
    for mime in ("image/png", "image/jpeg"):
        if mime in found and _BASE64.fullmatch(_text(found[mime])):
            data[mime] = _text(found[mime])
    if not data:
        return None
    if kind == "display_data":
        return nbformat.v4.new_output("display_data", data=data)
    count = output.get("execution_count")
    return nbformat.v4.new_output("execute_result", data=data,
                                  execution_count=count if type(count) is int else None)


def _plain(value) -> bool:
    return value is None or type(value) in (bool, int, float) or (isinstance(value, str) and _PLAIN.fullmatch(value))


def _metadata(metadata) -> dict:
    kept = {}
    marks = metadata.get("nbgrader")
    if isinstance(marks, dict):
        kept["nbgrader"] = {k: v for k, v in marks.items() if _PLAIN.fullmatch(str(k)) and _plain(v)}
    tags = [t for t in metadata.get("tags", []) if isinstance(t, str) and _PLAIN.fullmatch(t) and " " not in t] \
        if isinstance(metadata.get("tags"), list) else []
    if tags:
        kept["tags"] = tags
    return kept


def _attachments(cell) -> dict:
    found = cell.get("attachments")
    if not isinstance(found, dict):
        return {}
    return {name: {mime: _text(data) for mime, data in bundle.items()
                   if mime in _IMAGES and _BASE64.fullmatch(_text(data))}
            for name, bundle in found.items() if isinstance(name, str) and isinstance(bundle, dict)}


def sanitize_notebook(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """The notebook, in place, made safe to show as HTML (see the module)."""
    cells, reserved = [], _reserved_ids(nb)
    for index, cell in enumerate(nb.cells):
        metadata = _metadata(cell.get("metadata", {}))
        source = _text(cell.get("source", ""))
        cell_id = cell.get("id")
        cell_id = cell_id if isinstance(cell_id, str) and _ID.fullmatch(cell_id) else f"cell-{index}"
        if cell.get("cell_type") == "code":
            count = cell.get("execution_count")
            new = nbformat.v4.new_code_cell(source, metadata=metadata,
                                            execution_count=count if type(count) is int else None)
            new.outputs = [o for o in (_output(o) for o in cell.get("outputs", []) if isinstance(o, dict)) if o]
        elif cell.get("cell_type") == "markdown":
            attachments = {k: v for k, v in _attachments(cell).items() if v}
            new = nbformat.v4.new_markdown_cell(safe_markdown(source, attachments, reserved), metadata=metadata)
            if attachments:
                new.attachments = attachments
        else:  # a raw cell (nbconvert copies one into the page as it is), or anything else
            new = nbformat.v4.new_markdown_cell(safe_markdown(as_text(source), reserved_ids=reserved),
                                                metadata=metadata)
        new.id = cell_id
        cells.append(new)
    nb.cells = cells
    kernel = nb.metadata.get("kernelspec", {})
    language = nb.metadata.get("language_info", {})
    metadata = {}
    kernel = {k: v for k, v in kernel.items() if k in ("name", "display_name", "language")
              and isinstance(v, str) and _plain(v)} if isinstance(kernel, dict) else {}
    if "name" in kernel and "display_name" in kernel:
        metadata["kernelspec"] = kernel
    if isinstance(language, dict) and isinstance(language.get("name"), str) and _plain(language["name"]):
        metadata["language_info"] = {"name": language["name"]}
    nb.metadata = nbformat.from_dict(metadata)
    return nb

"""nbgrader preprocessors that the course's ``nbgrader_config.py`` puts in nbgrader's pipelines.

- :class:`SandboxedGrading` replaces nbgrader's ``Execute`` in ``autograde``: the submission's code
  runs in a bubblewrap sandbox (:mod:`attnbook_classroom.grading.sandbox`), the results are compared with the
  references outside it, and each test cell gets an error output (no points) or a line saying it
  passed, which nbgrader's own ``SaveAutoGrades`` turns into the gradebook's scores. So
  ``nbgrader autograde ASSIGNMENT --student ID --force`` regrades one student with the same
  isolation as ``make grade``, which only computes the verdicts ahead, in parallel.
- :class:`RestoreLockedCells` is nbgrader's ``OverwriteCells`` without the false "checksum has
  changed" warning for a test cell whose only difference is its removed hidden tests.
- :class:`HideHiddenTests` removes hidden tests from the feedback pages (from code cells only).
- :class:`ShowAsData` makes what a student wrote safe to show (:mod:`.sanitize`): last in
  ``autograde``, so that formgrader and the feedback pages show it as data, never as markup or script.
  It judges a markdown cell by the page nbconvert makes of its text, so nothing after it rewrites a
  markdown cell's text: removing lines could open a code fence (a "BEGIN HIDDEN TESTS" line in
  markdown), and maths written into the markdown as MathML could close a code span.
- :class:`FeedbackExporter` is nbconvert's ``HTMLExporter`` whose compiled page templates are kept
  for the life of the process, so that a grading worker compiles them once, not once per page; its
  pages run no script and request nothing: their maths is MathML, written by the renderer
  (:class:`MathMLRenderer`) as it renders the markdown, never into the markdown.
"""

from __future__ import annotations

import os
import pathlib
import re

import jinja2
from nbconvert.exporters import HTMLExporter, TemplateExporter
from nbconvert.filters.highlight import Highlight2HTML
from nbconvert.filters.markdown_mistune import IPythonRenderer, MarkdownWithMath
from nbconvert.filters.widgetsdatatypefilter import WidgetsDataTypeFilter
from nbgrader.preprocessors import ClearHiddenTests, NbGraderPreprocessor, OverwriteCells
from traitlets import Bool, Float, Integer, Unicode

from attnbook_classroom.grading.submission import Submission, grade_in_sandbox
from attnbook_classroom.course.folder import link_problem, read_secret, source_cells, verdict_cache
from attnbook_classroom.course.notebooks import REPO
from attnbook_classroom.course.sanitize import sanitize_notebook

__all__ = ["SandboxedGrading", "RestoreLockedCells", "HideHiddenTests", "ShowAsData", "FeedbackExporter",
           "MathMLRenderer", "mathml", "TypesetMaths", "scrubbed_paths", "FEEDBACK_POLICY"]


def scrubbed_paths(root: pathlib.Path) -> list[str]:
    """Paths that never appear in a student's feedback (the course folder, the book, the home)."""
    paths = {str(root), os.path.realpath(root), str(REPO), os.path.realpath(REPO), os.path.expanduser("~")}
    return sorted((p for p in paths if len(p) > 1), key=len, reverse=True)


def submission_for(nb, root: pathlib.Path, student: str, assignment: str, notebook: str,
                   cell_limit: float, total_limit: float) -> Submission:
    return Submission(nb, secret=read_secret(root), student=student, assignment=assignment,
                      source_cells=source_cells(root, assignment, notebook), cell_limit=cell_limit,
                      total_limit=total_limit)


class SandboxedGrading(NbGraderPreprocessor):
    """Grade the notebook's test cells from a sandboxed run of its code (see the module)."""

    course_root = Unicode("", help="The course folder (default: the gradebook's folder).").tag(config=True)
    cell_timeout = Float(10.0, help="Seconds allowed to each code cell and each test cell.").tag(config=True)
    notebook_timeout = Float(60.0, help="Seconds allowed to all of one notebook.").tag(config=True)
    student_timeout = Float(180.0, help="Seconds allowed to all of one student's notebooks in one run of "
                            "make grade.").tag(config=True)
    max_notebook_bytes = Integer(16_000_000, help="make grade does not grade a larger notebook.").tag(config=True)
    max_cells = Integer(1000, help="make grade does not grade a notebook with more cells.").tag(config=True)

    def preprocess(self, nb, resources):
        info = resources["nbgrader"]
        root = pathlib.Path(self.course_root or info["db_url"].removeprefix("sqlite:///")).resolve()
        if root.suffix == ".db":
            root = root.parent
        problem = link_problem(root / "submitted" / info["student"] / info["assignment"],
                               f"submitted/{info['student']}/{info['assignment']}")
        if problem:  # nbgrader has copied the folder following links: grade nothing of it
            raise ValueError(f"not graded: {problem}")
        sub = submission_for(nb, root, info["student"], info["assignment"], info["notebook"],
                             self.cell_timeout, self.notebook_timeout)
        cache = verdict_cache(root)
        verdicts = cache.get(sub.key())
        if verdicts is None:
            verdicts = grade_in_sandbox([sub], forbidden=[root])[0]
            cache.put(sub.key(), verdicts)
        verdicts.apply(nb, scrub=scrubbed_paths(root))
        for message in verdicts.failures():
            self.log.warning("%s/%s: %s", info["student"], info["assignment"], message)
        return nb, resources


class RestoreLockedCells(OverwriteCells):
    """nbgrader's OverwriteCells, quiet when a locked cell differs only by its hidden tests."""

    def preprocess_cell(self, cell, resources, cell_index):
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        if grade_id is not None:
            try:
                source_cell = self.gradebook.find_source_cell(grade_id, self.notebook_id, self.assignment_id)
            except Exception:
                source_cell = None
            if source_cell is not None and source_cell.locked:
                released = cell.copy()
                released.source = source_cell.source
                ClearHiddenTests(enforce_metadata=False)._remove_hidden_test_region(released)
                if cell.source == released.source:
                    cell.source = source_cell.source  # what the student received: restore silently
        return super().preprocess_cell(cell, resources, cell_index)


class HideHiddenTests(ClearHiddenTests):
    """ClearHiddenTests for feedback pages (it runs on autograded notebooks), on code cells only:
    hidden tests are code, and a markdown cell stays as :class:`ShowAsData` left it."""

    enforce_metadata = Bool(False).tag(config=True)

    def preprocess_cell(self, cell, resources, index):
        if cell.cell_type != "code":
            return cell, resources
        return super().preprocess_cell(cell, resources, index)


class ShowAsData(NbGraderPreprocessor):
    """What a student wrote, made safe to show as HTML (:func:`.sanitize.sanitize_notebook`)."""

    def preprocess(self, nb, resources):
        return sanitize_notebook(nb), resources


def mathml(tex: str, block: bool) -> str | None:
    """``tex`` as MathML, which browsers draw without a script or a network, on one line; None when
    it cannot be converted."""
    from docutils.utils.math import latex2mathml

    try:
        xml = latex2mathml.tex2mathml(tex.strip(), as_block=block)
    except Exception:
        return None
    return " ".join(line.strip() for line in xml.splitlines())


class MathMLRenderer(IPythonRenderer):
    """nbconvert's markdown renderer, whose maths (what its parser reads as maths: ``$...$``,
    ``$$...$$``, ``\\(...\\)``, ``\\[...\\]``, ``\\begin{...}``) is MathML: HTML that the renderer writes
    into the page, never markdown parsed again. Maths that cannot be converted is the renderer's own
    (TeX, escaped)."""

    def inline_math(self, body):
        return mathml(body, block=False) or super().inline_math(body)

    def block_math(self, body):
        return mathml(body, block=True) or super().block_math(body)

    def latex_environment(self, name, body):
        return mathml(f"\\begin{{{name}}}{body}\\end{{{name}}}", block=True) or super().latex_environment(name, body)


class TypesetMaths(NbGraderPreprocessor):
    """Nothing: the feedback exporter typesets maths as it renders (:class:`MathMLRenderer`). Kept so
    that a course folder whose ``nbgrader_config.py`` still names it generates its feedback."""

    def preprocess(self, nb, resources):
        return nb, resources


FEEDBACK_STYLE = """<style>
/* attnbook: messages wrap instead of running off the page; MathML at the text's size */
.output_subarea pre, .jp-OutputArea-output pre, .jp-RenderedText pre {
  white-space: pre-wrap !important; overflow-wrap: anywhere !important; }
math { font-size: 1.05em; }
</style>
"""


class _CompiledTemplates(jinja2.BytecodeCache):
    """Jinja's compiled templates, kept in memory (a bucket is reused only for the same source)."""

    def __init__(self):
        self._code: dict[str, bytes] = {}

    def load_bytecode(self, bucket):
        code = self._code.get(bucket.key)
        if code is not None:
            bucket.bytecode_from_string(code)  # checks the source's checksum; stale code is dropped

    def dump_bytecode(self, bucket):
        self._code[bucket.key] = bucket.bytecode_to_string()


_TEMPLATES = _CompiledTemplates()


# A feedback page is read offline and needs no script: the browser runs none of it and fetches nothing
# (its styles are in the page, its maths MathML, its images embedded).
FEEDBACK_POLICY = ("<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
                   "style-src 'unsafe-inline'; img-src data:; font-src data:\">")
_SCRIPT = re.compile(r"<script\b.*?</script\s*>", re.S | re.I)
_IMAGE_WITHOUT_ALT = re.compile(r"<img\b(?![^>]*\balt=)", re.I)
_FOCUSABLE = re.compile(r'<div class="[^"]*\b(?:jp-Cell-inputWrapper|jp-OutputArea-output)\b[^"]*"')


class FeedbackExporter(HTMLExporter):
    """nbgrader's feedback exporter (``HTMLExporter``), compiling each template once per process,
    with maths as MathML (:class:`MathMLRenderer`), outputs that wrap (:data:`FEEDBACK_STYLE`), no
    script (nbgrader's template loads MathJax and its configuration from a CDN: the maths is MathML
    already) and a policy that forbids the browser any script and any request (:data:`FEEDBACK_POLICY`)."""

    def _create_environment(self):
        environment = super()._create_environment()
        environment.bytecode_cache = _TEMPLATES
        return environment

    def _page(self, nb, resources=None, **kw):
        """``HTMLExporter.from_notebook_node`` with its last step done on the text: every image
        without alternative text gets nbconvert's, every input and output of a cell is focusable.
        (nbconvert parses and rewrites the whole page with BeautifulSoup for these two edits: a
        third of the time of recording a graded notebook, measured.)"""
        langinfo = nb.metadata.get("language_info", {})
        lexer = langinfo.get("pygments_lexer", langinfo.get("name", None))
        resources = self._init_resources(resources)
        self.register_filter("highlight_code", self.filters.get("highlight_code", Highlight2HTML(
            pygments_lexer=lexer, parent=self)))
        self.register_filter("filter_data_type", WidgetsDataTypeFilter(
            notebook_metadata=self._nb_metadata, parent=self, resources=resources))
        html, resources = TemplateExporter.from_notebook_node(self, nb, resources, **kw)
        html = _IMAGE_WITHOUT_ALT.sub(r'\g<0> alt="No description has been provided for this image"', html)
        return _FOCUSABLE.sub(r'\g<0> tabindex="0"', html), resources

    @jinja2.pass_context
    def markdown2html(self, context, source):
        """A markdown cell as HTMLExporter renders it, its maths as MathML."""
        cell = context.get("cell", {})
        path = context.get("resources", {}).get("metadata", {}).get("path", "")
        renderer = MathMLRenderer(escape=False, attachments=cell.get("attachments", {}), embed_images=self.embed_images,
                                  path=path, anchor_link_text=self.anchor_link_text,
                                  exclude_anchor_links=self.exclude_anchor_links, **self.lexer_options)
        return MarkdownWithMath(renderer=renderer).render(source)

    def from_notebook_node(self, nb, resources=None, **kw):
        html, resources = self._page(nb, resources, **kw)
        html = re.sub(r"<head\b[^>]*>", lambda head: head.group(0) + "\n" + FEEDBACK_POLICY, html, count=1)
        return _SCRIPT.sub("", html).replace("</head>", FEEDBACK_STYLE + "</head>", 1), resources

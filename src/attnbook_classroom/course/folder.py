"""The course folder: nbgrader's configuration, the course's secret, the roster and the due dates.

Layout (nbgrader's, plus three files of the book's)::

    ROOT/nbgrader_config.py         written here; your own settings go in nbgrader_config_local.py
    ROOT/course_secret              random, made once, readable by you only: seeds the hidden tests
    ROOT/students.csv               optional roster: id,first_name,last_name,email
    ROOT/due_dates.csv              optional: assignment,duedate (e.g. 07_masking,2027-03-01 17:00:00 UTC)
    ROOT/instructor/discussion.md   the discussion questions with their model answers (never released)
    ROOT/source/ release/ submitted/ autograded/ feedback/ gradebook.db   (nbgrader's)
    ROOT/.grading/                  cached verdicts and what was graded when
    ROOT/grades.csv, ROOT/summary.txt
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import functools
import json
import os
import pathlib
import secrets
import stat
import sys

import nbformat

from attnbook_classroom.course.notebooks import REPO

__all__ = ["COURSE_ID", "DEFAULT_ROOT", "use_venv_bin", "write_config", "ensure_secret", "read_secret",
           "roster", "due_dates", "config", "limits", "api", "source_cells", "verdict_cache", "private_files",
           "make_private", "link_problem", "Limits", "run_nbgrader", "run_formgrader"]

COURSE_ID = "attention-book"
DEFAULT_ROOT = REPO / "_build" / "course"
CONFIG_MARK = "# Written by `python -m attnbook_classroom.course assignments`"


def use_venv_bin() -> None:
    """nbgrader runs ``alembic`` in a subprocess: put this Python's scripts first on ``PATH``."""
    bin_dir = str(pathlib.Path(sys.executable).parent)
    path = os.environ.get("PATH", "")
    if bin_dir not in path.split(os.pathsep):
        os.environ["PATH"] = bin_dir + os.pathsep + path


@contextlib.contextmanager
def private_files():
    """Files and folders made inside are readable by their owner only (umask 077)."""
    old = os.umask(0o077)
    try:
        yield
    finally:
        os.umask(old)


def make_private(root: pathlib.Path) -> None:
    """Create the course folder readable by its owner only, or close an existing one that is not."""
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    if root.stat().st_mode & 0o077:
        print(f"note: {root} was readable by others; it is now readable by you only (chmod 700)")
        root.chmod(0o700)


def link_problem(folder: pathlib.Path, where: str = "") -> str | None:
    """Why ``folder`` (a submission) must not be graded: it, or anything in it, is a symbolic link
    or not a regular file or folder; None when it holds only plain files and folders. Nothing is
    followed."""
    name = where or folder.name
    try:
        st = os.lstat(folder)
    except OSError as exc:
        return f"{name} cannot be read ({exc.strerror})"
    if stat.S_ISLNK(st.st_mode):
        return f"{name} is a symbolic link (to {os.readlink(folder)}); it is not followed"
    if not stat.S_ISDIR(st.st_mode):
        return f"{name} is not a folder"
    for base, dirs, files in os.walk(folder, followlinks=False):
        for entry in dirs + files:
            path = pathlib.Path(base) / entry
            mode = os.lstat(path).st_mode
            relative = path.relative_to(folder.parent)
            if stat.S_ISLNK(mode):
                return f"{relative} is a symbolic link (to {os.readlink(path)}); it is not followed"
            if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
                return f"{relative} is not a regular file (a pipe, a socket or a device)"
    return None


def write_config(root: pathlib.Path, exchange: pathlib.Path) -> None:
    """Write ``nbgrader_config.py`` (unless it is one of the instructor's own)."""
    path = root / "nbgrader_config.py"
    if path.exists() and not path.read_text().startswith(CONFIG_MARK):
        print(f"note: {path} is not ours; left as it is")
        return
    path.write_text(f"""{CONFIG_MARK}: nbgrader's settings for a course
# built from the attention book's chapters. Rewritten by that command; put settings of your own (late
# penalties, another exchange) in nbgrader_config_local.py next to this file.
import os

c = get_config()  # noqa: F821
_root = os.path.dirname(os.path.abspath(__file__))
c.CourseDirectory.course_id = {COURSE_ID!r}
c.CourseDirectory.root = _root
c.Exchange.root = {str(exchange)!r}
# Collection never follows a link nor believes a folder's name (attnbook_classroom.course.exchange):
# a submission is its owner's, written when the file system says; anything else is refused and
# listed in .grading/refused.json. Feedback is released for every student it can be, the others listed.
c.ExchangeFactory.collect = "attnbook_classroom.course.exchange.SafeCollect"
c.ExchangeFactory.release_feedback = "attnbook_classroom.course.exchange.RobustReleaseFeedback"

# Autograding: instead of executing the notebook in a kernel, run the student's code in a
# bubblewrap sandbox and compare its results with the references outside it (attnbook_classroom.course.plugins).
c.Autograde.sanitize_preprocessors = [
    "nbgrader.preprocessors.ClearOutput", "nbgrader.preprocessors.DeduplicateIds",
    "nbgrader.preprocessors.OverwriteKernelspec", "attnbook_classroom.course.plugins.RestoreLockedCells",
    "nbgrader.preprocessors.CheckCellMetadata"]
# (nbgrader's CheckCellMetadata validates the metadata in the first pass; nothing in the second
# pass changes it, so it is not validated twice.)
c.Autograde.autograde_preprocessors = [
    "attnbook_classroom.course.plugins.SandboxedGrading", "nbgrader.preprocessors.IgnorePattern",
    "nbconvert.preprocessors.ClearMetadataPreprocessor", "nbgrader.preprocessors.LimitOutput",
    "nbgrader.preprocessors.SaveAutoGrades", "nbgrader.preprocessors.AssignLatePenalties",
    "attnbook_classroom.course.plugins.ShowAsData"]
# (ShowAsData, last: what the student wrote is shown as data in formgrader and on the feedback pages:
# no HTML of theirs, no script, no address but links and embedded images.)
c.SandboxedGrading.course_root = _root
c.OverwriteCells.add_missing_cells = True  # a test cell a student deleted is put back and graded
# What a student's code may take when graded (the exercises' cells take under 2 s each): a code
# that never ends costs the class at most these.
c.SandboxedGrading.cell_timeout = 10.0  # seconds per cell and per test cell
c.SandboxedGrading.notebook_timeout = 60.0  # seconds for all of one notebook
c.SandboxedGrading.student_timeout = 180.0  # seconds for all of one student's notebooks in one make grade
c.SandboxedGrading.max_notebook_bytes = 16_000_000  # a larger notebook is not graded (make grade)
c.SandboxedGrading.max_cells = 1000  # nor one with more cells
# Feedback pages never show the hidden tests' code, nor run a script or request anything.
# Their maths is MathML (read offline, without MathJax; the exporter writes it), their messages wrap.
# Nothing after ShowAsData rewrites a markdown cell (it judged the page that cell's text makes).
c.GenerateFeedback.preprocessors = [
    "attnbook_classroom.course.plugins.ShowAsData",  # also for notebooks autograded before it existed
    "nbgrader.preprocessors.GetGrades", "nbconvert.preprocessors.CSSHTMLHeaderPreprocessor",
    "attnbook_classroom.course.plugins.HideHiddenTests"]
c.GenerateFeedback.exporter_class = "attnbook_classroom.course.plugins.FeedbackExporter"
# Late submissions are recorded and listed in grades.csv; set "zero" here (or in the local file)
# to give them no points, or write a LateSubmissionPlugin of your own.
c.LateSubmissionPlugin.penalty_method = "none"

_local = os.path.join(_root, "nbgrader_config_local.py")
if os.path.exists(_local):
    load_subconfig(_local)  # noqa: F821
""")


def ensure_secret(root: pathlib.Path) -> None:
    """Create the course's secret once (readable by its owner only)."""
    path = root / "course_secret"
    if not path.exists():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32) + "\n")


def read_secret(root: pathlib.Path) -> bytes:
    path = pathlib.Path(root) / "course_secret"
    if not path.exists():
        raise SystemExit(f"{path} is missing: run `make assignments` (or python -m attnbook_classroom.course "
                         "assignments) to set the course up, and keep that file out of any repository.")
    return bytes.fromhex(path.read_text().strip())


def roster(root: pathlib.Path) -> list[dict] | None:
    """The students of ``students.csv`` (id, first_name, last_name, email), or None without one."""
    path = pathlib.Path(root) / "students.csv"
    if not path.exists():
        return None
    with open(path, newline="") as f:
        rows = [{k.strip(): (v or "").strip() for k, v in row.items() if k} for row in csv.DictReader(f)]
    return [r for r in rows if r.get("id")]


def due_dates(root: pathlib.Path) -> dict[str, str]:
    """assignment -> due date, from ``due_dates.csv`` (columns assignment,duedate)."""
    path = pathlib.Path(root) / "due_dates.csv"
    if not path.exists():
        return {}
    with open(path, newline="") as f:
        return {row["assignment"].strip(): row["duedate"].strip() for row in csv.DictReader(f)
                if row.get("assignment") and row.get("duedate")}


def config(root: pathlib.Path):
    """The course's nbgrader configuration (its nbgrader_config.py and the local file it loads)."""
    from traitlets.config import Config, PyFileConfigLoader

    if not (pathlib.Path(root) / "nbgrader_config.py").exists():
        return Config()
    return PyFileConfigLoader("nbgrader_config.py", path=str(root)).load_config()


@dataclasses.dataclass(frozen=True)
class Limits:
    """What grading allows a submission (``c.SandboxedGrading.*`` in the course's configuration)."""

    cell: float = 10.0  # seconds for each code cell and each test cell (the exercises' take under 2)
    notebook: float = 60.0  # seconds for all of one notebook
    student: float = 180.0  # seconds for all of one student's notebooks in one run of make grade
    notebook_bytes: int = 16_000_000  # a larger notebook is not read
    cells: int = 1000  # a notebook with more cells is not read


def limits(root: pathlib.Path) -> Limits:
    """The course's grading limits (its nbgrader_config.py and the local file it loads)."""
    settings = config(root).SandboxedGrading
    default = Limits()
    return Limits(float(settings.get("cell_timeout", default.cell)),
                  float(settings.get("notebook_timeout", default.notebook)),
                  float(settings.get("student_timeout", default.student)),
                  int(settings.get("max_notebook_bytes", default.notebook_bytes)),
                  int(settings.get("max_cells", default.cells)))


def api(root: pathlib.Path, staged: bool = False):
    """nbgrader's API for the course in ``root``, configured by its nbgrader_config.py; with
    ``staged``, its autograde reads the submissions as ``make grade`` staged them
    (:mod:`attnbook_classroom.course.stage`)."""
    from nbgrader.apps import NbGraderAPI
    from nbgrader.coursedir import CourseDirectory

    from attnbook_classroom.course.stage import STAGED

    config_ = config(root)
    config_.CourseDirectory.root = str(root)
    config_.CourseDirectory.course_id = COURSE_ID
    if staged:
        config_.CourseDirectory.submitted_directory = STAGED
    return NbGraderAPI(coursedir=CourseDirectory(config=config_), config=config_)


def source_cells(root: pathlib.Path, assignment: str, notebook: str) -> dict[str, dict]:
    """grade id -> the instructor's source, locked flag, tags and whether it is a test cell, from
    ``source/``, in the notebook's order."""
    path = pathlib.Path(root) / "source" / assignment / f"{notebook}.ipynb"
    return _source_cells(str(path), path.stat().st_mtime_ns)


@functools.lru_cache(maxsize=64)
def _source_cells(path: str, mtime: int) -> dict[str, dict]:
    nb = nbformat.read(path, as_version=4)
    cells = {}
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        if "grade_id" in meta:
            cells[meta["grade_id"]] = {"source": cell.source, "locked": bool(meta.get("locked")),
                                       "tags": list(cell.metadata.get("tags", [])),
                                       "test": bool(cell.cell_type == "code" and meta.get("grade")
                                                    and not meta.get("solution"))}
    return cells


class verdict_cache:
    """Verdicts of graded submissions, by :meth:`Submission.key`, in ``ROOT/.grading/verdicts``."""

    def __init__(self, root: pathlib.Path):
        self.folder = pathlib.Path(root) / ".grading" / "verdicts"

    def get(self, key: str):
        from attnbook_classroom.grading.submission import Verdicts

        path = self.folder / f"{key}.json"
        return Verdicts.from_json(path.read_text()) if path.exists() else None

    def put(self, key: str, verdicts) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        # a file of this writer's own: two workers may put the same key at once (two students who
        # hand in the same notebook), and each must replace the entry whole
        tmp = self.folder / f"{key}.{os.getpid()}.{secrets.token_hex(8)}.tmp"
        tmp.write_text(verdicts.to_json())
        tmp.replace(self.folder / f"{key}.json")


def load_state(root: pathlib.Path) -> dict:
    path = pathlib.Path(root) / ".grading" / "graded.json"
    return json.loads(path.read_text()) if path.exists() else {}


def save_state(root: pathlib.Path, state: dict) -> None:
    path = pathlib.Path(root) / ".grading" / "graded.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(state, indent=1, sort_keys=True))


def run_nbgrader(root: pathlib.Path, arguments: list[str]) -> int:
    """Run ``nbgrader ARGUMENTS`` as the course's instructor: in the course folder (so that its
    configuration applies), with this environment's scripts on the PATH (nbgrader runs
    ``alembic``), and with files made readable by you only. Returns its exit status."""
    root = pathlib.Path(root).resolve()
    if not (root / "nbgrader_config.py").is_file():
        raise SystemExit(f"{root} is not a course folder: run `make assignments` first")
    arguments = [a for a in arguments if a != "--"]
    if not arguments:
        raise SystemExit("usage: python -m attnbook_classroom.course nbgrader COMMAND [ARGUMENTS]")
    from nbgrader.apps.nbgraderapp import NbGraderApp

    command = arguments[0]
    if command in ("formgrader", "formgrade"):
        raise SystemExit("nbgrader has no `formgrader` command (since nbgrader 0.7 formgrader is a Jupyter "
                         "server extension): run `make formgrader` (python -m attnbook_classroom.course "
                         "formgrader), which starts JupyterLab in the course folder with it, and open its "
                         "Formgrader page")
    if not command.startswith("-") and command not in NbGraderApp.subcommands:
        raise SystemExit(f"nbgrader has no command {command!r} (nbgrader would print 'No command given' and "
                         f"exit 0); its commands: {', '.join(sorted(NbGraderApp.subcommands))}")

    use_venv_bin()
    os.chdir(root)
    with private_files():
        try:
            NbGraderApp.launch_instance(argv=arguments)
        except SystemExit as exc:
            return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return 0


def run_formgrader(root: pathlib.Path, arguments: list[str]) -> int:
    """JupyterLab in the course folder, for nbgrader's formgrader (a Jupyter server extension, at
    ``/formgrader``): on 127.0.0.1 only, with this environment's nbgrader extensions and the course's
    configuration, files made readable by you only. ``arguments`` are JupyterLab's (e.g.
    ``--port=8890``). As root, JupyterLab refuses to start unless ``--allow-root`` is among them."""
    root = pathlib.Path(root).resolve()
    if not (root / "nbgrader_config.py").is_file():
        raise SystemExit(f"{root} is not a course folder: run `make assignments` first")
    arguments = [a for a in arguments if a != "--"]
    if os.geteuid() == 0 and "--allow-root" not in arguments:
        raise SystemExit(
            "formgrader: you are root, and a Jupyter server run as root gives whoever holds its token a "
            "root shell. Better: run the course as a grader account of its own (see the page's \"A class "
            "on a shared server\"). To start it as root all the same: make formgrader ALLOW_ROOT=1 "
            "(JupyterLab's --allow-root)")
    from jupyterlab.labapp import LabApp

    use_venv_bin()
    os.chdir(root)
    argv = ["--ServerApp.ip=127.0.0.1", f"--ServerApp.root_dir={root}",
            "--ServerApp.jpserver_extensions=nbgrader.server_extensions.formgrader=True",
            "--LabApp.default_url=/formgrader", *arguments]
    with private_files():
        try:
            LabApp.launch_instance(argv=argv)
        except SystemExit as exc:
            return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return 0

"""Build an nbgrader course from the book's chapters, and grade the submissions.

    python -m attnbook.course assignments [--root _build/course] [chapters/NAME.ipynb ...]
    python -m attnbook.course grade [--root _build/course]

``assignments`` copies every chapter notebook listed in ``_toc.yml`` (or the notebooks given) to
``ROOT/source/<chapter>/<chapter>.ipynb`` and runs nbgrader's ``generate_assignment`` on each, so
the student versions (no solutions, no hidden tests, no outputs) land in
``ROOT/release/<chapter>/``.

``grade`` autogrades every ``ROOT/submitted/<student>/<chapter>/<chapter>.ipynb``, writes the
feedback pages to ``ROOT/feedback/<student>/<chapter>/`` and exports every score to
``ROOT/grades.csv``.

nbgrader runs ``alembic`` in a subprocess, so the directory of this Python's scripts is put in
front of ``PATH`` first.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import sys

__all__ = ["COURSE_ID", "toc_chapters", "graded_cells", "build_assignments", "grade", "export_csv"]

COURSE_ID = "attention-book"
REPO = pathlib.Path(__file__).resolve().parents[2]
DEFAULT_ROOT = REPO / "_build" / "course"


def _use_venv_bin() -> None:
    bin_dir = str(pathlib.Path(sys.executable).parent)
    path = os.environ.get("PATH", "")
    if bin_dir not in path.split(os.pathsep):
        os.environ["PATH"] = bin_dir + os.pathsep + path


def toc_files(toc_path: pathlib.Path = REPO / "_toc.yml") -> list[str]:
    """Every page of ``_toc.yml`` (the root, then each ``file:``) in reading order, without suffix."""
    import yaml

    toc = yaml.safe_load(pathlib.Path(toc_path).read_text())
    files: list[str] = [toc["root"]] if "root" in toc else []

    def walk(node):
        if isinstance(node, dict):
            if "file" in node:
                files.append(node["file"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk({key: value for key, value in toc.items() if key != "root"})
    return files


def toc_chapters(repo: pathlib.Path = REPO) -> list[pathlib.Path]:
    """The chapter notebooks listed in ``_toc.yml``, in reading order."""
    return [repo / f"{f}.ipynb" for f in toc_files(repo / "_toc.yml") if (repo / f"{f}.ipynb").exists()]


def graded_cells(notebook: pathlib.Path) -> list[dict]:
    """The nbgrader metadata of every graded or solution cell of a notebook."""
    nb = json.loads(pathlib.Path(notebook).read_text())
    return [c["metadata"]["nbgrader"] for c in nb["cells"] if "nbgrader" in c.get("metadata", {})]


def _api(root: pathlib.Path):
    from nbgrader.apps import NbGraderAPI
    from nbgrader.coursedir import CourseDirectory
    from traitlets.config import Config

    config = Config()
    config.CourseDirectory.root = str(root)
    config.CourseDirectory.course_id = COURSE_ID
    config.ExecutePreprocessor.timeout = 300
    return NbGraderAPI(coursedir=CourseDirectory(config=config), config=config)


def _write_config(root: pathlib.Path) -> None:
    (root / "nbgrader_config.py").write_text(
        "# nbgrader configuration of the course built from the attention book's chapters.\n"
        "c = get_config()  # noqa: F821\n"
        f"c.CourseDirectory.course_id = {COURSE_ID!r}\n"
        "import os\n"
        "c.CourseDirectory.root = os.path.dirname(os.path.abspath(__file__))\n"
        "c.ExecutePreprocessor.timeout = 300\n"
    )


def _check(result: dict, what: str) -> None:
    if not result.get("success"):
        sys.stderr.write(result.get("log", "") + "\n" + result.get("error", "") + "\n")
        raise SystemExit(f"nbgrader failed: {what}")


def build_assignments(root: pathlib.Path = DEFAULT_ROOT,
                      notebooks: list[pathlib.Path] | None = None) -> list[pathlib.Path]:
    """Create the course under ``root`` and generate the student version of every chapter.

    Returns the released notebooks, one per chapter.
    """
    _use_venv_bin()
    root = pathlib.Path(root).resolve()
    notebooks = [pathlib.Path(n).resolve() for n in (notebooks or toc_chapters())]
    root.mkdir(parents=True, exist_ok=True)
    _write_config(root)
    api = _api(root)
    released = []
    for nb in notebooks:
        name = nb.stem
        if not any(c.get("grade") for c in graded_cells(nb)):
            print(f"note: {nb.name} has no autograded cell yet; releasing it as it is")
        source = root / "source" / name
        if source.exists():
            shutil.rmtree(source)
        source.mkdir(parents=True)
        shutil.copy2(nb, source / f"{name}.ipynb")
        _check(api.generate_assignment(name, force=True), f"generate_assignment {name}")
        released.append(root / "release" / name / f"{name}.ipynb")
        print(f"released {released[-1].relative_to(root)}")
    return released


def grade(root: pathlib.Path = DEFAULT_ROOT, feedback: bool = True) -> pathlib.Path:
    """Autograde every submission under ``root/submitted`` and export the scores to a CSV.

    Returns the path of the CSV (``root/grades.csv``).
    """
    _use_venv_bin()
    root = pathlib.Path(root).resolve()
    submitted = root / "submitted"
    if not submitted.is_dir():
        raise SystemExit(f"no submissions: put them in {submitted}/<student>/<chapter>/<chapter>.ipynb")
    api = _api(root)
    for student in sorted(p for p in submitted.iterdir() if p.is_dir()):
        for assignment in sorted(p for p in student.iterdir() if p.is_dir()):
            _check(api.autograde(assignment.name, student.name, force=True),
                   f"autograde {assignment.name} for {student.name}")
            if feedback:
                _check(api.generate_feedback(assignment.name, student.name, force=True),
                       f"generate_feedback {assignment.name} for {student.name}")
            print(f"graded {student.name}/{assignment.name}")
    csv = root / "grades.csv"
    export_csv(root, csv)
    print(f"scores: {csv}")
    return csv


def export_csv(root: pathlib.Path, csv: pathlib.Path) -> None:
    """Write every score of the gradebook to ``csv`` with nbgrader's own CSV exporter
    (what ``nbgrader export`` does, without starting another process)."""
    from nbgrader.api import Gradebook
    from nbgrader.plugins import CsvExportPlugin

    with Gradebook(f"sqlite:///{root / 'gradebook.db'}", course_id=COURSE_ID) as gradebook:
        CsvExportPlugin(to=str(csv)).export(gradebook)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m attnbook.course", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    a = sub.add_parser("assignments", help="build the course and generate the student versions")
    a.add_argument("--root", type=pathlib.Path, default=DEFAULT_ROOT)
    a.add_argument("notebooks", nargs="*", type=pathlib.Path,
                   help="chapter notebooks (default: every notebook in _toc.yml)")
    g = sub.add_parser("grade", help="autograde ROOT/submitted and export ROOT/grades.csv")
    g.add_argument("--root", type=pathlib.Path, default=DEFAULT_ROOT)
    g.add_argument("--no-feedback", action="store_true", help="skip the HTML feedback pages")
    args = parser.parse_args(argv)
    if args.command == "assignments":
        build_assignments(args.root, args.notebooks or None)
    else:
        grade(args.root, feedback=not args.no_feedback)


if __name__ == "__main__":
    main()

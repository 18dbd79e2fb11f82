"""python -m attnbook_classroom.course: see the package's docstring."""

from __future__ import annotations

import argparse
import pathlib

from attnbook_classroom.course import __doc__ as DOC
from attnbook_classroom.course.folder import DEFAULT_ROOT, run_formgrader, run_nbgrader


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m attnbook_classroom.course", description=DOC.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    a = sub.add_parser("assignments", help="set the course up and release the exercise notebooks")
    a.add_argument("--root", type=pathlib.Path, default=DEFAULT_ROOT)
    a.add_argument("--exchange", type=pathlib.Path, default=None,
                   help="nbgrader's exchange folder (default: ROOT/../exchange)")
    a.add_argument("notebooks", nargs="*", type=pathlib.Path,
                   help="chapter notebooks (default: every notebook in _toc.yml)")
    g = sub.add_parser("grade", help="grade new or changed submissions; write grades.csv and summary.txt")
    g.add_argument("--root", type=pathlib.Path, default=DEFAULT_ROOT)
    g.add_argument("--student", action="append", help="only this student (repeatable)")
    g.add_argument("--assignment", action="append", help="only this assignment (repeatable)")
    g.add_argument("--force", action="store_true", help="regrade even unchanged submissions")
    g.add_argument("--no-feedback", action="store_true", help="skip the HTML feedback pages")
    g.add_argument("--workers", type=int, default=None, help="students graded at a time")
    e = sub.add_parser("export", help="write grades.csv from the gradebook")
    e.add_argument("--root", type=pathlib.Path, default=DEFAULT_ROOT)
    n = sub.add_parser("nbgrader", help="run an nbgrader command in the course folder (e.g. collect 07_masking)")
    n.add_argument("--root", type=pathlib.Path, default=DEFAULT_ROOT)
    n.add_argument("arguments", nargs=argparse.REMAINDER, help="nbgrader's command and its arguments")
    f = sub.add_parser("formgrader", help="JupyterLab in the course folder on 127.0.0.1, for nbgrader's formgrader")
    f.add_argument("--root", type=pathlib.Path, default=DEFAULT_ROOT)
    f.add_argument("arguments", nargs=argparse.REMAINDER, help="JupyterLab's options (e.g. --port=8890)")
    s = sub.add_parser("student-env", help="the students' nbgrader environment, usable by every account")
    s.add_argument("--prefix", type=pathlib.Path, required=True, help="its folder, outside any private home")
    s.add_argument("--python", default=None, help="a Python every account can run (default /usr/bin/python3)")
    s.add_argument("--exchange", type=pathlib.Path, default=None, help="the course's exchange, written into its "
                   "nbgrader configuration")
    args = parser.parse_args(argv)
    if args.command == "assignments":
        from attnbook_classroom.course.assign import build_assignments

        build_assignments(args.root, args.notebooks or None, args.exchange)
    elif args.command == "grade":
        from attnbook_classroom.course.grade import grade

        grade(args.root, students=args.student, assignments=args.assignment, force=args.force,
              feedback=not args.no_feedback, workers=args.workers)
    elif args.command == "nbgrader":
        raise SystemExit(run_nbgrader(args.root, args.arguments))
    elif args.command == "formgrader":
        raise SystemExit(run_formgrader(args.root, args.arguments))
    elif args.command == "student-env":
        from attnbook_classroom.course.student_env import DEFAULT_PYTHON, make_student_env

        make_student_env(args.prefix, args.python or DEFAULT_PYTHON, args.exchange)
    else:
        from attnbook_classroom.course.gradebook import export_csv

        print(export_csv(args.root.resolve()))


if __name__ == "__main__":
    main()

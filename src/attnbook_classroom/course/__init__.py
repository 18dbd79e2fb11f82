"""An nbgrader course from the book's chapters: exercise notebooks, sandboxed grading, grades.csv.

    python -m attnbook_classroom.course assignments [--root _build/course] [--exchange DIR] [chapters/NAME.ipynb ...]
    python -m attnbook_classroom.course grade [--root _build/course] [--student ID ...] [--assignment NAME ...] [--force]
    python -m attnbook_classroom.course export [--root _build/course]
    python -m attnbook_classroom.course nbgrader [--root _build/course] COMMAND [ARGUMENTS ...]
    python -m attnbook_classroom.course formgrader [--root _build/course] [-- JupyterLab's options ...]
    python -m attnbook_classroom.course student-env --prefix DIR [--python /usr/bin/python3] [--exchange DIR]

``assignments`` sets up the course folder (nbgrader's configuration, the course's secret, the
roster and due dates, and the discussion questions' model answers in ``instructor/``) and releases the *exercise notebook* of every chapter in ``_toc.yml`` (or of
the notebooks given): the chapter's ``## Exercises`` section with what it needs, never its
training runs. ``grade`` grades new and changed submissions, each student's code in a bubblewrap
sandbox, writes the gradebook, the feedback pages, ``grades.csv`` and ``summary.txt``. ``nbgrader``
runs one of nbgrader's commands in the course folder; ``formgrader`` starts JupyterLab there with
nbgrader's formgrader (hand grading), on 127.0.0.1; ``student-env`` makes the students' environment
on a shared server (:mod:`attnbook_classroom.course.student_env`). See the book's appendix on
running a class (chapters/appendix_classroom.md).

The chapters are read through the build's readers (:mod:`bookbuild.notebooks`): for the book's
other editions, :func:`bookbuild.notebooks.student_exercise_cells` gives the student form of a
chapter's exercises.
"""

# Light to import (nbgrader loads this package's exchange classes and preprocessors in commands
# that never grade): what grades imports torch when it runs.
from attnbook_classroom.course.assign import build_assignments
from attnbook_classroom.course.folder import COURSE_ID, DEFAULT_ROOT
from attnbook_classroom.course.grade import grade
from attnbook_classroom.course.gradebook import export_csv
from attnbook_classroom.course.notebooks import exercise_notebook, graded_cells

__all__ = ["COURSE_ID", "DEFAULT_ROOT", "build_assignments", "grade", "export_csv", "exercise_notebook",
           "graded_cells"]

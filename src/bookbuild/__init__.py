"""The book's build-time code: the readers of the book's notebooks (:mod:`bookbuild.notebooks`) and
the runnable edition's builder (:mod:`bookbuild.runnable`).

It imports the library's tooling (``attnbook_tools``) and nothing of the classroom; the classroom's
course (``attnbook_classroom.course``) reads the chapters through it.
"""

"""attnbook_classroom: the exercises' checks and the nbgrader course.

- :mod:`.grading`: ``check(exercise_id, fn)`` compares a student's function with the library and
  names the mistake; the sandbox that runs submitted code when a class is graded;
- :mod:`.course`: the nbgrader course (``make assignments``, ``make grade``).

It imports the library and the tooling; nothing imports it but the notebooks' exercise cells.
"""

"""attnbook_tools: what the book's notebooks use around the library, never part of the lesson.

- :mod:`.notebook`: a chapter's setup, ``glue`` and ``claim`` (a result stated and asserted);
- :mod:`.measure` and :mod:`.bench`: the one timing and memory API, and ``make bench``;
- :mod:`.plots`, :mod:`.widgets`, :mod:`.diagrams`: figures, controls and drawn diagrams;
- :mod:`.datafiles`: the shipped files of ``data/``, verified against their digests;
- :mod:`.experiments`, :mod:`.ablations`, :mod:`.dates_model`, :mod:`.dropout_study`: the runs that
  write ``data/`` and read it back.

It imports the library (:mod:`attnbook`), never the classroom.
"""

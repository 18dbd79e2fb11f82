"""The runnable edition's checks, for a student who experiments.

Each chapter asserts what its text says in folded check cells (first line ``# Check: ...``). In the
book's own edition a check that fails stops the notebook: the book must not print a claim its code
no longer supports. In the runnable edition a student changes the inputs, the settings and the
code on purpose, and the book's claims are about the book's run, not a rule every run must follow.
There each check cell runs its unchanged code inside ``with playground_check():``: when an assertion
fails, the cell prints a note in plain words (what the check expected, what the student's run gave,
that this is expected after a change) and the notebook runs on.

Under ``ATTNBOOK_STRICT_CHECKS=1`` (``make nbval-runnable`` sets it) a failing check raises as in the
book's edition, so the tests still fail on any claim the shipped code no longer supports.
"""

from __future__ import annotations

import linecache
import os
import sys
import textwrap
import traceback
from contextlib import contextmanager

__all__ = ["STRICT_ENV", "playground_check", "strict_checks"]

STRICT_ENV = "ATTNBOOK_STRICT_CHECKS"


def strict_checks() -> bool:
    """True when ``ATTNBOOK_STRICT_CHECKS`` is set to anything but empty or ``0``: checks then raise."""
    return os.environ.get(STRICT_ENV, "").strip() not in ("", "0")


def _failing_line(exc: BaseException) -> str:
    """The statement of the check cell that failed (the outermost frame of the traceback), all of
    its lines, indented as one block."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename != __file__]
    if not frames:
        return ""
    frame = frames[0]
    last = getattr(frame, "end_lineno", None) or frame.lineno
    lines = [linecache.getline(frame.filename, n).rstrip() for n in range(frame.lineno, last + 1)]
    if not any(lines):
        return (frame.line or "").strip()
    return textwrap.dedent("\n".join(lines)).strip("\n")


def _note(exc: AssertionError) -> str:
    said = str(exc).strip() or "(the check gives no message)"
    line = _failing_line(exc)
    lines = ["This check does not hold for your run" + (":" if line else ".")]
    lines += [f"    {piece}" for piece in line.splitlines()]
    lines += textwrap.wrap(f"Your run gave: {said}", width=96, subsequent_indent="    ")
    lines += [""]
    lines += textwrap.wrap(
        "The book's text, and the outputs this notebook came with, are from the book's own run, and this "
        "check tests what the text says about that run. After you change an input, a setting or the code, "
        "a check that no longer holds is expected. The rest of this check was skipped; the notebook runs "
        "on. For the book's numbers again, undo your change and run the notebook from the top. If you "
        "changed nothing, the book has a bug: please report it with this note.", width=96)
    return "\n".join(lines)


@contextmanager
def playground_check():
    """Run a check cell's assertions; if one fails, print what it expected and what this run gave,
    and carry on (raise instead under ``ATTNBOOK_STRICT_CHECKS=1``). Only ``AssertionError`` is
    softened: any other error is a real error and stops the notebook as usual.

        with playground_check():
            claim("fig-00-temperature", (w.max(-1).values > 0.9).all(), f"largest weights {w.max(-1).values}")
    """
    try:
        yield
    except AssertionError as exc:
        if strict_checks():
            raise
        print(_note(exc), file=sys.stdout)

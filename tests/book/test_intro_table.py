"""The intro's table of reading times is computed, not typed from memory.

The intro says how its estimates are made: the words of the prose and of the code shown, at 200
words a minute, folded checks and solutions left out. This test counts them the same way and
requires each row to say that number of minutes (rounded to the nearest minute), so the table
follows the chapters when they grow. The running times are measured by executing the chapters and
are not recomputed here.
"""

from __future__ import annotations

import pathlib
import re

import pytest

from test_notebooks import ENTRIES, notebook_or_none, tags
from toc_notebooks import ROOT

WORDS_A_MINUTE = 200
_ROW = re.compile(r"^\|\s*\{doc\}`(?P<doc>[^`]+)`\s*\|[^|]*\|\s*(?P<minutes>\d+) min\s*\|", re.M)


def words_read(nb) -> int:
    """Words of the prose and of the code a reader sees: folded and removed cells, and the
    exercises' solutions, left out."""
    count = 0
    for cell in nb.cells:
        if tags(cell) & {"hide-input", "hide-cell", "remove-cell", "remove-input"}:
            continue
        if cell.cell_type == "code" and cell.metadata.get("nbgrader", {}).get("solution"):
            continue
        count += len(cell.source.split())
    return count


def reading_minutes(nb) -> int:
    return round(words_read(nb) / WORDS_A_MINUTE)


def table() -> dict[str, int]:
    return {m.group("doc"): int(m.group("minutes")) for m in _ROW.finditer((ROOT / "chapters/intro.md").read_text())}


CHAPTERS = [e for e in ENTRIES if re.match(r"\d", e.split("/")[-1])]


@pytest.mark.parametrize("entry", CHAPTERS, ids=[e.split("/")[-1] for e in CHAPTERS])
def test_the_intro_states_each_chapters_reading_time(entry):
    nb = notebook_or_none(entry)
    if nb is None:
        pytest.skip(f"{entry} is not a notebook")
    name = entry.split("/")[-1]
    rows = table()
    assert name in rows, f"chapters/intro.md: no row for {name} in the table of reading times"
    expected = reading_minutes(nb)
    assert rows[name] == expected, (
        f"chapters/intro.md says {name} takes {rows[name]} min to read; its {words_read(nb)} words "
        f"at {WORDS_A_MINUTE} a minute take {expected} min: update the table")


def test_nbval_takes_every_chapter_longest_first():
    """`make nbval` runs the chapters longest first by the intro's running times: the same chapters
    as the reading order, none left out, and each stated time no longer than the one before."""
    import subprocess
    import sys

    script = ROOT / "tests" / "toc_notebooks.py"
    reading = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, check=True).stdout.split()
    longest = subprocess.run([sys.executable, str(script), "--longest-first"], capture_output=True, text=True,
                             check=True).stdout.split()
    assert sorted(longest) == sorted(reading) and len(longest) == len(reading)
    from toc_notebooks import running_seconds

    seconds = running_seconds()
    stated = [seconds[pathlib.Path(p).stem] for p in longest]  # every chapter has a stated time
    assert stated == sorted(stated, reverse=True), stated

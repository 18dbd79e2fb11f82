"""Print the chapter notebooks listed in _toc.yml, in reading order, or with ``--longest-first`` in
order of the running time the intro's table states, longest first (what `make nbval` uses: its two
workers each take the next notebook when they finish one, so starting with the longest keeps one
worker from running the longest alone at the end)."""

from __future__ import annotations

import pathlib
import re
import sys

from bookbuild.notebooks import toc_chapters, toc_files as _toc_files

ROOT = pathlib.Path(__file__).resolve().parents[1]


def toc_files(toc_path: pathlib.Path = ROOT / "_toc.yml") -> list[str]:
    """Every `file:` (and the root) in _toc.yml, in order, without suffix."""
    return _toc_files(toc_path)


def toc_notebooks() -> list[pathlib.Path]:
    return toc_chapters(ROOT)


def running_seconds(intro: pathlib.Path = ROOT / "chapters" / "intro.md") -> dict[str, int]:
    """The running time, in seconds, that the intro's table states for each chapter."""
    rows = re.findall(r"^\| \{doc\}`([^`]+)` \|[^|]*\|[^|]*\| (\d+) s \|$", intro.read_text(encoding="utf-8"), re.M)
    return {name: int(seconds) for name, seconds in rows}


if __name__ == "__main__":
    paths = toc_notebooks()
    if "--longest-first" in sys.argv[1:]:
        seconds = running_seconds()
        paths = sorted(paths, key=lambda p: -seconds.get(p.stem, 0))  # stable: ties keep reading order
    if not paths:
        sys.exit("no notebook is listed in _toc.yml")
    print(" ".join(str(p.relative_to(ROOT)) for p in paths))

"""Print the chapter notebooks listed in _toc.yml, in reading order (used by `make nbval`)."""

from __future__ import annotations

import pathlib
import sys

from bookbuild.notebooks import toc_chapters, toc_files as _toc_files

ROOT = pathlib.Path(__file__).resolve().parents[1]


def toc_files(toc_path: pathlib.Path = ROOT / "_toc.yml") -> list[str]:
    """Every `file:` (and the root) in _toc.yml, in order, without suffix."""
    return _toc_files(toc_path)


def toc_notebooks() -> list[pathlib.Path]:
    return toc_chapters(ROOT)


if __name__ == "__main__":
    paths = toc_notebooks()
    if not paths:
        sys.exit("no notebook is listed in _toc.yml")
    print(" ".join(str(p.relative_to(ROOT)) for p in paths))

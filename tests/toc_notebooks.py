"""Print the chapter notebooks listed in _toc.yml, in reading order (used by `make nbval`)."""

from __future__ import annotations

import pathlib
import sys

import yaml

ROOT = pathlib.Path(__file__).resolve().parents[1]


def toc_files(toc_path: pathlib.Path = ROOT / "_toc.yml") -> list[str]:
    """Every `file:` (and the root) in _toc.yml, in order, without suffix."""
    toc = yaml.safe_load(toc_path.read_text())
    found = [toc["root"]]

    def walk(node):
        if isinstance(node, dict):
            if "file" in node:
                found.append(node["file"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk({k: v for k, v in toc.items() if k != "root"})
    return found


def toc_notebooks() -> list[pathlib.Path]:
    notebooks = []
    for entry in toc_files():
        path = ROOT / f"{entry}.ipynb"
        if path.exists():
            notebooks.append(path)
    return notebooks


if __name__ == "__main__":
    paths = toc_notebooks()
    if not paths:
        sys.exit("no notebook is listed in _toc.yml")
    print(" ".join(str(p.relative_to(ROOT)) for p in paths))

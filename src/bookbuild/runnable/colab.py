"""The first cell of every runnable notebook: in Colab it fetches the book and installs its package,
with the packages the chapter imports beyond it (:data:`STUDENT_PACKAGES`, at requirements.txt's pins)."""

from __future__ import annotations

import ast
import pathlib

import nbformat

from bookbuild.notebooks import python_of
from bookbuild.runnable.book import Book, RunnableError

__all__ = ["STUDENT_PACKAGES", "chapter_packages", "install_cell"]

# Packages some chapters import beyond the library's `book` extra; pyproject.toml's `lab` extra
# (make lab, Binder) carries them, and a chapter's Colab cell installs the ones it imports, at the
# versions requirements.txt pins. tests/build/test_runnable.py keeps this list, the chapters' imports and
# the `lab` extra in step.
STUDENT_PACKAGES = ("pytest", "transformers")


def _pins(root: pathlib.Path) -> dict[str, str]:
    """requirements.txt's pins, name -> ``name==version``."""
    pins, path = {}, pathlib.Path(root) / "requirements.txt"
    for line in (path.read_text(encoding="utf-8").splitlines() if path.is_file() else []):
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            pins[line.split("==", 1)[0].strip().lower()] = line
    return pins


def chapter_packages(nb: nbformat.NotebookNode) -> list[str]:
    """The packages of :data:`STUDENT_PACKAGES` that the chapter's code cells import."""
    imported = set()
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        for node in ast.walk(python_of(cell.source)):
            if isinstance(node, ast.Import):
                imported |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                imported.add(node.module.split(".")[0])
    return [p for p in STUDENT_PACKAGES if p in imported]


def install_cell(book: Book, packages: list[str] = ()) -> nbformat.NotebookNode:
    """The first cell of every runnable notebook: in Colab it clones the book's repository (the
    address in ``_config.yml``) and installs its package, with the ``packages`` the chapter imports
    beyond it (at requirements.txt's pins); elsewhere it checks that the package is importable and
    says how to install it if not."""
    folder = "/content/" + book.repository_url.rsplit("/", 1)[-1]
    pins = _pins(book.root)
    missing = [p for p in packages if p not in pins]
    if missing:
        raise RunnableError(f"requirements.txt pins no version of {', '.join(missing)}, which a chapter imports")
    torch = pins.get("torch", "torch==?").split("==", 1)[1]
    more = "".join(f', "{pins[p]}"' for p in packages)
    more = ("\n    # what this chapter imports besides, at the book's pins\n"
            f'    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet"{more}],\n'
            "                   check=True)" if packages else "")
    source = f'''# In Google Colab, run this cell first: it fetches the book and installs its package.
# Anywhere else (JupyterLab, Binder, Jupyter) it only checks that the package is installed.
import sys

if "google.colab" in sys.modules:
    import os
    import subprocess

    BOOK = "{folder}"
    if not os.path.isdir(BOOK):
        subprocess.run(["git", "clone", "--depth", "1", "--branch", "{book.branch}",
                        "{book.repository_url}", BOOK], check=True)
    # the book's package without its dependencies: Colab's own torch, numpy and plotting packages
    # serve it (its pin, torch=={torch}, would replace Colab's torch)
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "-e", BOOK],
                   check=True){more}
    sys.path.insert(0, os.path.join(BOOK, "src"))
else:
    try:
        import attnbook  # noqa: F401
    except ImportError:
        raise ImportError("the book's package is not installed: in the book's folder run "
                          "`pip install -c requirements.txt -e '.[lab]'` (see README.md)") from None'''
    cell = nbformat.v4.new_code_cell(source, id="install-the-book")
    cell.metadata["tags"] = ["colab-install"]
    return cell

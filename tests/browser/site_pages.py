"""What the browser tests look at: which pages, which browser, and the known noise they tolerate."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SITE = ROOT / "_build" / "html"
SCREENSHOTS = ROOT / "_build" / "screenshots"
CHROMIUM = Path(os.environ.get("CHROMIUM", "/usr/bin/chromium"))
# The table of contents whose pages are checked (another one only for trying a partial book).
TOC = Path(os.environ.get("BOOK_TOC", ROOT / "_toc.yml"))
IN_CI = os.environ.get("CI", "").strip().lower() == "true"
INSTALL_HINT = "install Debian's Chromium with `apt-get install -y chromium` (as root)"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
VIEWPORT = {"width": 1280, "height": 900}
TIMEOUT_MS = 15_000

sys.path.insert(0, str(ROOT / "tests"))
from toc_notebooks import toc_files  # noqa: E402

# What the browser may report without failing a test: exactly the known noise of Jupyter Book 1 pages.
KNOWN_CONSOLE_NOISE = [
    # sphinx-thebe's script declares the same constant twice on every page.
    re.compile(r"^Identifier 'THEBE_JS_URL' has already been declared$"),
    # pydata-sphinx-theme reads an empty theme mode from local storage, then falls back to "auto".
    re.compile(r"^Got invalid theme mode: \. Resetting to auto\.$"),
    # The widget manager calls MathJax 2's MathJax.Hub.Queue; the site runs MathJax 3 (no Hub).
    re.compile(r"^Cannot read properties of undefined \(reading 'Queue'\)$"),
]
# The widget manager's icon fonts (Font Awesome, webpack-hashed names) may be missing.
WIDGET_FONT = re.compile(r"/[0-9a-f]{20}\.(?:woff2?|ttf|eot|svg)(?:\?.*)?$")


# --- which pages -------------------------------------------------------------------------------


def toc_entries() -> list[str]:
    """The documents listed in the table of contents, root first (e.g. 'chapters/intro')."""
    return toc_files(TOC)


def toc_pages() -> list[str]:
    return [f"{entry}.html" for entry in toc_entries()]


def all_pages() -> list[str]:
    """Every page a reader can open: the chapters in the table of contents, search and index."""
    return toc_pages() + ["search.html", "genindex.html"]


def notebook_for(page: str) -> Path | None:
    path = ROOT / (page.removesuffix(".html") + ".ipynb")
    return path if path.is_file() else None


def stored_widget_views(page: str) -> int:
    """How many widget views the page's notebook stores with a saved state (0 for other pages)."""
    notebook = notebook_for(page)
    if notebook is None:
        return 0
    nb = json.loads(notebook.read_text())
    state = nb.get("metadata", {}).get("widgets", {}).get("application/vnd.jupyter.widget-state+json", {})
    models = set(state.get("state", {}))
    views = 0
    for cell in nb["cells"]:
        tags = cell.get("metadata", {}).get("tags", [])
        if cell["cell_type"] != "code" or {"remove-output", "remove-cell"} & set(tags):
            continue
        for output in cell.get("outputs", []):
            view = output.get("data", {}).get("application/vnd.jupyter.widget-view+json")
            if view and view.get("model_id") in models:
                views += 1
    return views

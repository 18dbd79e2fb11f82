"""What the browser tests look at: which pages, which browser, and what each page stores."""

from __future__ import annotations

import functools
import http.server
import json
import os
import re
import sys
import threading
from contextlib import contextmanager
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
PHONE = {"width": 390, "height": 844}  # a phone's screen in CSS pixels (iPhone 12 to 15)
TIMEOUT_MS = 15_000

sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "book"))  # test_cells
sys.path.insert(0, str(ROOT / "tests" / "build"))  # site_fixture
sys.path.insert(0, str(ROOT / "src" / "site-assets"))
from controls import control_states, control_views  # noqa: E402
from toc_notebooks import toc_files  # noqa: E402

# What the browser may report without failing a test: nothing. (The duplicated THEBE_JS_URL, the
# widget manager's MathJax 2 call and the theme's empty mode were fixed where they came from:
# src/site-assets/book_pages.py, vendor.py and _config.yml's html_context.)
KNOWN_CONSOLE_NOISE: list[re.Pattern] = []


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 - the base class's name
        pass


@contextmanager
def serve(directory: Path):
    """``directory`` served on 127.0.0.1, on a free port; yields the base address."""
    handler = functools.partial(_QuietHandler, directory=str(directory))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


# --- which pages -------------------------------------------------------------------------------


def toc_entries() -> list[str]:
    """The documents listed in the table of contents, root first (e.g. 'chapters/intro')."""
    return toc_files(TOC)


def toc_pages() -> list[str]:
    return [f"{entry}.html" for entry in toc_entries()]


def chapters_with_notebooks() -> list[str]:
    return [page for page in toc_pages() if notebook_for(page) is not None]


def all_pages() -> list[str]:
    """Every page a reader can open: the chapters in the table of contents, search and index."""
    return toc_pages() + ["search.html", "genindex.html"]


def notebook_for(page: str) -> Path | None:
    path = ROOT / (page.removesuffix(".html") + ".ipynb")
    return path if path.is_file() else None


def _read(notebook: Path):
    import nbformat

    return nbformat.read(notebook, as_version=4)


def stored_controls(page: str) -> dict[str, list[dict]]:
    """The precomputed controls (attnbook_tools.widgets.explore) the page's notebook stores: id -> settings."""
    notebook = notebook_for(page)
    return control_states(_read(notebook)) if notebook is not None else {}


def stored_widget_views(page: str) -> int:
    """How many widget views the page's notebook stores with a saved state and the site shows: all
    but the ipywidgets controls, which need a kernel (0 for other pages)."""
    notebook = notebook_for(page)
    if notebook is None:
        return 0
    nb = json.loads(notebook.read_text())
    state = nb.get("metadata", {}).get("widgets", {}).get("application/vnd.jupyter.widget-state+json", {})
    models = set(state.get("state", {})) - control_views(_read(notebook))
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


CHAPTERS_WITH_NOTEBOOKS = chapters_with_notebooks()

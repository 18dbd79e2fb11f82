"""Sphinx extension: a chapter's launch and download buttons give its runnable edition.

The book theme builds the Colab and Binder links, and the ``.ipynb`` download button, from the page's
own path (``chapters/<name>.ipynb``: the source, with its solutions). For every page that has a
runnable edition (``chapters/runnable/<name>.ipynb``, made by ``python -m bookbuild.runnable build``)
this points the launch links at that file in the repository, and the download button at a copy of
it served with the site (``_downloads/runnable/<name>.ipynb``). Pages without one are left alone.

Sphinx also copies each page's source into ``_sources/``: for a chapter, the notebook with its
solutions and nbgrader's hidden tests. No button leads there any more, and the website shows no
hidden test (src/site-assets/exercises.py), so those copies are deleted.
"""

from __future__ import annotations

import shutil
from pathlib import Path, PurePosixPath

EDITION = "chapters/runnable"
DOWNLOADS = "_downloads/runnable"


def runnable_edition(srcdir: str | Path, pagename: str) -> Path | None:
    """The runnable edition of a page, if it has one."""
    path = Path(srcdir) / EDITION / f"{PurePosixPath(pagename).name}.ipynb"
    return path if (Path(srcdir) / f"{pagename}.ipynb").is_file() and path.is_file() else None


def _retarget(app, pagename, templatename, context, doctree) -> None:
    edition = runnable_edition(app.srcdir, pagename)
    if edition is None:
        return
    docs = app.config.html_theme_options.get("path_to_docs", "").strip("/")
    prefix = f"{docs}/" if docs else ""
    source, runnable = f"{prefix}{pagename}.ipynb", f"{prefix}{EDITION}/{edition.name}"
    download = f"{context['pathto'](DOWNLOADS, 1)}/{edition.name}"
    for group in context.get("header_buttons", []):
        for button in group.get("buttons", []):
            url = button.get("url", "")
            if group.get("label") == "launch-buttons" and source in url:
                button["url"] = url.replace(f"/{source}", f"/{runnable}")
            elif button.get("label") in ("download-source-button", "download-notebook-button"):
                button["url"] = download
                button["tooltip"] = "Download the runnable notebook"


def _copy_downloads(app, exception) -> None:
    if exception is not None or app.builder.format != "html":
        return
    target = Path(app.outdir) / DOWNLOADS
    target.mkdir(parents=True, exist_ok=True)
    for docname in sorted(app.env.found_docs):
        edition = runnable_edition(app.srcdir, docname)
        if edition is not None:
            shutil.copyfile(edition, target / edition.name)
            (Path(app.outdir) / "_sources" / f"{docname}.ipynb").unlink(missing_ok=True)


def setup(app):
    # After the theme's own buttons (priority 501), before the page is written.
    app.connect("html-page-context", _retarget, priority=600)
    app.connect("build-finished", _copy_downloads)
    return {"parallel_read_safe": True, "parallel_write_safe": True}

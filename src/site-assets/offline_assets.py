"""Sphinx extension: serve MathJax and the widget manager from `_vendor/`, or fall back to the CDNs.

`_config.yml` points `mathjax_path` and `nb_ipywidgets_js` at the copies that `vendor.py` puts in
`_vendor/` (served as `_static/...`). When `_vendor/` is incomplete (no npm on this machine), this
extension swaps in the CDN addresses instead, so the book still builds and shows maths and widgets
when the reader is online.
"""

from __future__ import annotations

from pathlib import Path

from sphinx.util import logging

logger = logging.getLogger(__name__)

VENDOR = "_vendor"
REQUIRED = ["mathjax/tex-mml-chtml.js", "widgets/require.js", "widgets/paths.js", "widgets/embed-amd.js"]
# Added to every page when the site serves its own MathJax; acts on the search page only.
SEARCH_MATHS = "search-maths.js"
CDN_MATHJAX = "https://cdn.jsdelivr.net/npm/mathjax@3.2.2/es5/tex-mml-chtml.js"
CDN_WIDGETS = {
    "https://cdn.jsdelivr.net/npm/requirejs@2.3.8/require.js": {},
    "https://cdn.jsdelivr.net/npm/@jupyter-widgets/html-manager@1.0.15/dist/embed-amd.js": {
        "data-jupyter-widgets-cdn": "https://cdn.jsdelivr.net/npm/",
        "crossorigin": "anonymous",
    },
}


def vendored(confdir: str | Path) -> bool:
    folder = Path(confdir) / VENDOR
    return all((folder / name).is_file() for name in REQUIRED)


def _use_cdn_when_not_vendored(app, config) -> None:
    if vendored(app.confdir):
        if (Path(app.confdir) / VENDOR / SEARCH_MATHS).is_file():
            app.add_js_file(SEARCH_MATHS)
        return
    logger.info(
        f"offline_assets: {VENDOR}/ is missing (run `make book` with npm installed); "
        "MathJax and the widget manager will load from their CDNs"
    )
    config.html_static_path = [p for p in config.html_static_path if Path(p).name != VENDOR]
    config.mathjax_path = CDN_MATHJAX
    config.nb_ipywidgets_js = dict(CDN_WIDGETS)


def setup(app):
    app.connect("config-inited", _use_cdn_when_not_vendored)
    return {"parallel_read_safe": True, "parallel_write_safe": True}

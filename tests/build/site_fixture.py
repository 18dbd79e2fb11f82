"""A two-page website built with the book's own Sphinx extensions, for testing them on known input.

The chapter page, ``chapters/03_demo``, holds what the book's chapters hold once they use the
controls: a control made by ``attnbook_tools.widgets.explore`` (a slider and a dropdown, six settings
stored as images), a stored ipywidgets slider (which needs a kernel, so the site must leave it
out), a stored progress bar (not a control: it stays), two captioned figures (numbered 3.1
and 3.2) and a check cell (folded behind "Show the check"). tests/build/test_site_extensions.py reads
the HTML; tests/browser/test_controls.py moves the control in Chromium.
"""

from __future__ import annotations

import base64
import subprocess
import sys
import textwrap
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[2]
CONTROL_ID = "ctl-demo"
SLIDER_MODEL = "a" * 32
PROGRESS_MODEL = "b" * 32


def draw_demo(ax, D, kind="unscaled"):
    """Bars whose heights depend on both settings, so that every setting looks different."""
    heights = [(D * (k + 1)) % 5 + 1 for k in range(4)] if kind == "unscaled" else [1, 2, 3, D % 4 + 1]
    ax.bar(range(4), heights, label=kind)
    ax.set(title=f"D = {D}, {kind} scores", xlabel="key", ylabel="weight")


def demo_explorer():
    from attnbook_tools.widgets import Explorer, dropdown, slider

    return Explorer(
        draw_demo,
        slider("D", [1, 4, 16], value=4, label="width D"),
        dropdown("kind", ["unscaled", "scaled"], label="score"),
        alt=lambda D, kind: f"Four bars: the {kind} weights at width D = {D}.",
        name=CONTROL_ID, figsize=(4.0, 3.0),
    )


def _widget_state() -> dict:
    base = {"model_module": "@jupyter-widgets/controls", "model_module_version": "2.0.0"}
    return {"state": {
        SLIDER_MODEL: {**base, "model_name": "IntSliderModel", "state": {"value": 3, "min": 0, "max": 5}},
        PROGRESS_MODEL: {**base, "model_name": "FloatProgressModel", "state": {"value": 1.0, "max": 1.0}},
    }, "version_major": 2, "version_minor": 0}


def _view(model_id: str):
    return nbformat.v4.new_output("display_data", data={
        "application/vnd.jupyter.widget-view+json": {"model_id": model_id, "version_major": 2, "version_minor": 0}})


def _png_output():
    import matplotlib.pyplot as plt

    from attnbook_tools.plots import png_bytes

    fig, ax = plt.subplots(figsize=(3, 2))
    ax.plot([0, 1], [1, 0])
    data = base64.b64encode(png_bytes(fig)).decode()
    plt.close(fig)
    return data


def demo_notebook() -> nbformat.NotebookNode:
    v4 = nbformat.v4
    states = [nbformat.from_dict(output) for output in demo_explorer().state_outputs()]
    figure = _png_output()
    glued = lambda key: v4.new_output(  # noqa: E731
        "display_data", data={"application/papermill.record/image/png": figure},
        metadata={"scrapbook": {"name": key, "mime_prefix": "application/papermill.record/"}})
    nb = v4.new_notebook(cells=[
        v4.new_markdown_cell("# 3. Demo\n\nA page with one control."),
        v4.new_code_cell('glue("fig-demo-a", fig)\nglue("fig-demo-b", fig)', execution_count=1,
                         outputs=[glued("fig-demo-a"), glued("fig-demo-b")]),
        v4.new_markdown_cell("```{glue:figure} fig-demo-a\n:name: fig-demo-a\n:alt: A line.\nThe first figure.\n```\n\n"
                             "```{glue:figure} fig-demo-b\n:name: fig-demo-b\n:alt: A line.\nThe second figure.\n```"),
        v4.new_code_cell("explore(draw_demo, slider('D', ...), dropdown('kind', ...), alt=...)",
                         execution_count=2, outputs=states),
        v4.new_code_cell("widgets.interact(show, n=(0, 5))", execution_count=3, outputs=[_view(SLIDER_MODEL)]),
        v4.new_code_cell("for _ in tqdm(range(3)): pass", execution_count=4, outputs=[_view(PROGRESS_MODEL)]),
        v4.new_code_cell("# Check: the line falls\nclaim('fig-demo-a', True)", execution_count=5,
                         metadata={"tags": ["hide-input"]}),
    ])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": _widget_state()}
    return nb


CONF = """
import sys
sys.path.insert(0, {assets!r})
extensions = ["myst_nb", "controls", "book_pages"]
nb_execution_mode = "off"
nb_ipywidgets_js = {{}}  # nothing from a CDN
numfig = True
numfig_format = {{"figure": "Figure %s"}}
html_theme = "basic"
suppress_warnings = ["mystnb.unknown_mime_type"]
exclude_patterns = ["_build"]
"""


def build_demo_site(where: Path) -> Path:
    """Write the demo's sources under ``where`` and build them; return the HTML folder."""
    source = where / "source"
    (source / "chapters").mkdir(parents=True, exist_ok=True)
    (source / "conf.py").write_text(CONF.format(assets=str(ROOT / "src" / "site-assets")))
    (source / "index.md").write_text(textwrap.dedent("""\
        # Demo book

        ```{toctree}
        chapters/03_demo
        ```
        """))
    nbformat.write(demo_notebook(), source / "chapters" / "03_demo.ipynb")
    html = where / "html"
    subprocess.run([sys.executable, "-m", "sphinx", "-b", "html", "-W", "-q", "-E", str(source), str(html)],
                   check=True, cwd=where)
    return html

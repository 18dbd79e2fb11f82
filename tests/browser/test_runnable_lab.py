"""The runnable edition in a real JupyterLab, started by `make lab`, driven in headless Chromium.

That every runnable notebook runs top to bottom in the student's environment is proved by
`make nbval-runnable`, which runs each one in a kernel of `.venv-lab`; this test checks what only a
browser shows. `make lab` (as root too: it adds `--allow-root` itself) copies the edition into a
fresh working folder and serves JupyterLab on 127.0.0.1 (a free port, a token). The test opens chapter 0, checks that its stored outputs show before anything
runs (every image the file stores, captions, glued numbers), runs every cell, then moves the
temperature slider of its control (an `attnbook_tools.widgets.explore` control: an ipywidgets VBox of a
SelectionSlider above an ipywidgets Image shown from a blob URL), with the keyboard and then with
the mouse, and checks each time that the kernel redrew the image: the PNG bytes behind the blob
URL change visibly, and the image's description under it names the new setting. Every request to anything
but the local server is blocked and recorded.
"""

from __future__ import annotations

import base64
import io
import os
import secrets
import time
import urllib.request

import nbformat
import pytest
from jupyter_serving import free_port, serving
from site_pages import ROOT, SCREENSHOTS, VIEWPORT

NOTEBOOK = "00_attention_at_a_glance.ipynb"
START_TIMEOUT_S = 120
RUN_TIMEOUT_MS = 180_000
LAB_TIMEOUT_MS = 60_000  # JupyterLab loads a large bundle; a shared CI machine can be slow
CHANGED = 0.02  # a redrawn figure differs visibly in more than 2% of its pixels
EDITED = "01_seq2seq_bottleneck.ipynb"  # already in the working folder, with the student's work in it
EDITED_TEXT = nbformat.writes(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("my_answer = 42")]))


KERNEL_IDLE = """() => { const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;
                         return w && w.sessionContext && w.sessionContext.kernelDisplayStatus === 'idle'; }"""
# The bytes behind an <img>'s src (a blob: URL made by the widget), base64-encoded.
IMAGE_BYTES = """async img => {
    const bytes = new Uint8Array(await (await fetch(img.src)).arrayBuffer());
    let text = '';
    for (let i = 0; i < bytes.length; i += 0x8000) text += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
    return btoa(text);
}"""


def _pixels(png: bytes):
    import matplotlib.image

    return matplotlib.image.imread(io.BytesIO(png), format="png")


def _changed_fraction(before: bytes, after: bytes) -> float:
    """The fraction of pixels that differ visibly between two PNGs (1.0 if their sizes differ)."""
    a, b = _pixels(before), _pixels(after)
    if a.shape != b.shape:
        return 1.0
    return float((abs(a - b).max(axis=-1) > 0.1).mean())


def _stored_images(path) -> int:
    """How many images the notebook file stores as outputs (what JupyterLab shows before a run)."""
    nb = nbformat.read(path, as_version=4)
    return sum(1 for c in nb.cells if c.cell_type == "code" for o in c.outputs
               if any(k.startswith("image/") for k in o.get("data", {})))


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """`make lab` on a fresh working folder: (base URL, token, working folder)."""
    work = tmp_path_factory.mktemp("workspace")
    (work / EDITED).write_text(EDITED_TEXT)  # a notebook the student already has, edited
    state = tmp_path_factory.mktemp("jupyter-state")
    port, token = free_port(), secrets.token_hex(16)
    args = (f"--port={port} --no-browser --IdentityProvider.token={token} --LabApp.expose_app_in_browser=True "
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate")
    env = dict(os.environ, JUPYTER_RUNTIME_DIR=str(state / "runtime"),
               JUPYTERLAB_WORKSPACES_DIR=str(state / "workspaces"), JUPYTERLAB_SETTINGS_DIR=str(state / "settings"))
    # Every cell stays in the page (JupyterLab otherwise renders only the cells in view).
    settings = state / "settings" / "@jupyterlab" / "notebook-extension"
    settings.mkdir(parents=True)
    (settings / "tracker.jupyterlab-settings").write_text('{"windowingMode": "none"}')
    # No "get notified about Jupyter news?" prompt over the page (it would also fetch from outside).
    notifications = state / "settings" / "@jupyterlab" / "apputils-extension"
    notifications.mkdir(parents=True)
    (notifications / "notification.jupyterlab-settings").write_text('{"fetchNews": "false"}')
    command = ["make", "--no-print-directory", "lab", f"LAB_DIR={work}", f"LAB_ARGS={args}"]
    with serving(command, port=port, token=token, log=state / "lab.log", what="`make lab`",
                 timeout=START_TIMEOUT_S, cwd=ROOT, env=env) as base:
        yield base + "/", token, work


def test_make_lab_copies_the_edition_without_overwriting(lab):
    _, _, work = lab
    assert sorted(p.name for p in work.glob("*.ipynb")) == sorted(p.name for p in (ROOT / "chapters/runnable").glob("*.ipynb"))
    assert (work / NOTEBOOK).read_bytes() == (ROOT / "chapters/runnable" / NOTEBOOK).read_bytes()
    assert (work / EDITED).read_text() == EDITED_TEXT, f"`make lab` overwrote the student's {EDITED}"


class _Control:
    """Chapter 0's temperature control as JupyterLab shows it once its cell has run."""

    def __init__(self, page):
        self.page = page
        box = page.locator(".jp-OutputArea-output .widget-vbox:has(.widget-hslider):has(img.widget-image)")
        self.box = box.first
        self.slider = self.box.locator(".widget-hslider").first
        self.image = self.box.locator("img.widget-image").first
        self.description = self.box.locator(".attnbook-description").first

    def readout(self) -> str:
        return self.slider.locator(".widget-readout").first.inner_text().strip()

    def png(self) -> bytes:
        return base64.b64decode(self.image.evaluate(IMAGE_BYTES))

    def redrawn(self, before: bytes, setting: str) -> tuple[bytes, float, str]:
        """Wait until the kernel has redrawn the image for ``setting`` (its description names it):
        (the new PNG, the fraction of pixels that changed, the description)."""
        deadline = time.monotonic() + RUN_TIMEOUT_MS / 1000
        while True:
            title = self.description.inner_text()
            after = self.png()
            changed = _changed_fraction(before, after)
            if (f"scale {setting};" in title and changed > CHANGED) or time.monotonic() > deadline:
                return after, changed, title
            self.page.wait_for_timeout(300)


def test_a_runnable_notebook_runs_in_jupyterlab_and_its_slider_redraws_the_figure(lab, browser):
    base, token, work = lab
    context = browser.new_context(viewport=VIEWPORT, service_workers="block")
    context.set_default_timeout(LAB_TIMEOUT_MS)
    outside: list[str] = []

    def route(route):
        if route.request.url.startswith(base) or route.request.url.startswith(("data:", "blob:")):
            route.continue_()
        else:
            outside.append(route.request.url)
            route.abort("blockedbyclient")

    context.route("**/*", route)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    stored = _stored_images(work / NOTEBOOK)
    try:
        page.goto(f"{base}lab/tree/{NOTEBOOK}?token={token}", wait_until="domcontentloaded")
        notebook = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook")
        notebook.wait_for()
        # Before anything runs, every image the file stores is shown (the figures the text
        # discusses, the still of the control), with the figures' captions ...
        assert stored >= 3, f"{NOTEBOOK} stores {stored} images: its two figures and its control's still"
        page.wait_for_function(
            "n => document.querySelectorAll('.jp-Notebook .jp-OutputArea-output img').length === n", arg=stored)
        page.wait_for_function(
            "() => document.querySelector('.jp-Notebook').innerText.includes('Description of the figure')")
        text = notebook.inner_text()
        assert "Figure 0.1." in text and "0.78" in text  # a caption, and a glued number in the prose
        assert "This notebook is yours to change." in text  # what its checks do, under the title
        for raw in ("{glue", "{numref}", "{doc}", ":::", "```{"):
            assert raw not in text, f"{raw} is shown in JupyterLab"
        # ... then every cell runs.
        page.wait_for_function(KERNEL_IDLE, timeout=RUN_TIMEOUT_MS)
        page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
        page.locator(".lm-Menu-itemLabel", has_text="Run All Cells").first.click()
        # Run All stops at the first exercise, which is left to the student (nbgrader's stub) ...
        page.wait_for_function(
            "() => [...document.querySelectorAll('.jp-OutputArea-output')].some(o => o.innerText.includes('Traceback'))",
            timeout=RUN_TIMEOUT_MS)
        page.wait_for_function(KERNEL_IDLE, timeout=RUN_TIMEOUT_MS)
        first_error = page.evaluate(
            """() => [...document.querySelectorAll('.jp-Notebook .jp-Cell')].findIndex(
                       c => [...c.querySelectorAll('.jp-OutputArea-output')].some(o => o.innerText.includes('Traceback')))""")
        exercises = page.evaluate(
            """() => [...document.querySelectorAll('.jp-Notebook .jp-Cell')]
                       .findIndex(c => c.innerText.includes('Exercise 0.1'))""")
        assert first_error > exercises >= 0, f"a cell before the exercises failed (cell {first_error})"
        # ... and the control is live: the still the file stored was replaced by the widget.
        control = _Control(page)
        control.image.wait_for()
        page.wait_for_function("img => img.src.startsWith('blob:')", arg=control.image.element_handle())
        assert control.readout() == "0.71", f"the slider starts at {control.readout()!r}, not at scale 0.71"
        first = control.png()
        assert first[:8] == b"\x89PNG\r\n\x1a\n"
        # The keyboard moves the slider to its right end (scale 10): the kernel redraws the image.
        control.slider.scroll_into_view_if_needed()
        control.slider.locator(".noUi-handle").first.focus()
        for _ in range(5):
            page.keyboard.press("ArrowRight")
        hot, changed, title = control.redrawn(first, "10.00")
        assert control.readout() == "10.00", f"the keyboard did not move the slider: 0.71 -> {control.readout()}"
        assert "scale 10.00;" in title, f"the image's description does not name the new setting: {title!r}"
        assert changed > CHANGED, f"the image hardly changed ({changed:.1%} of its pixels)"
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        control.box.screenshot(path=str(SCREENSHOTS / "lab__00_attention_at_a_glance__scale_10.png"))
        # The mouse drags the handle to the left end of the track (scale 0.10): redrawn again.
        handle = control.slider.locator(".noUi-handle").first.bounding_box()
        track = control.slider.locator(".noUi-base, .noUi-target").first.bounding_box()
        page.mouse.move(handle["x"] + handle["width"] / 2, handle["y"] + handle["height"] / 2)
        page.mouse.down()
        page.mouse.move(track["x"] - 20, handle["y"] + handle["height"] / 2, steps=10)
        page.mouse.up()
        cold, changed, title = control.redrawn(hot, "0.10")
        assert control.readout() == "0.10", f"the mouse did not move the slider: 10.00 -> {control.readout()}"
        assert "scale 0.10;" in title, f"the image's description does not name the new setting: {title!r}"
        assert changed > CHANGED, f"the image hardly changed ({changed:.1%} of its pixels)"
        control.box.screenshot(path=str(SCREENSHOTS / "lab__00_attention_at_a_glance__scale_0.1.png"))
        page.screenshot(path=str(SCREENSHOTS / "lab__00_attention_at_a_glance.png"), full_page=False)
    finally:
        context.close()
    assert not outside, f"JupyterLab requested outside addresses: {outside[:5]}"
    assert not errors, f"uncaught errors in JupyterLab: {errors[:5]}"

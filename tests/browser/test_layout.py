"""The page's widths, measured in Chromium: wide maths scrolls instead of being cut off, no code
block scrolls sideways, the controls fit a phone's screen, and the widths the unit tests assume are
the site's.

The narrowest desktop layout is a 1200-pixel window with both sidebars (below that the left
sidebar folds away and the column grows). There a figure is shown at most
attnbook_tools.plots.PAGE_FIGURE_WIDTH_PX wide and a code block holds tests/book/test_cells.SITE_CODE_COLUMNS
characters; the figure-legibility and line-length checks use those numbers.
"""

from __future__ import annotations

import pytest
from site_pages import CHAPTERS_WITH_NOTEBOOKS, VIEWPORT, stored_controls, toc_pages
from test_controls import assert_clicks_select_the_nearest_setting, click_sweep

from attnbook_tools.plots import PAGE_FIGURE_WIDTH_PX
from test_cells import SITE_CODE_COLUMNS

NARROWEST_DESKTOP = {"width": 1200, "height": 900}
WIDE_MATHS_WIDTH = 1300  # where chapter 9's online-softmax equation used to be cut off
PHONE = {"width": 360, "height": 800}


@pytest.fixture
def narrow(visit):
    """A visited page, resized to the narrowest desktop layout for the test, then restored."""
    resized = []

    def at_narrowest(name):
        page = visit(name).page
        page.set_viewport_size(NARROWEST_DESKTOP)
        page.wait_for_timeout(100)
        resized.append(page)
        return page

    yield at_narrowest
    for page in resized:
        page.set_viewport_size({"width": 1280, "height": 900})


def test_layout_widths_are_those_the_unit_tests_assume(narrow):
    """A figure wider than the column is shown PAGE_FIGURE_WIDTH_PX wide; a code block holds at
    least SITE_CODE_COLUMNS characters (at least: another monospace font may be narrower)."""
    page = narrow(next(p for p in CHAPTERS_WITH_NOTEBOOKS if "03_" in p))
    measured = page.evaluate(
        """() => {
            const figure = document.querySelector('figure');
            const probe = document.createElement('img');
            probe.style.width = '5000px'; probe.style.maxWidth = '100%';
            probe.src = figure.querySelector('img').src;
            figure.appendChild(probe);
            const figureWidth = probe.getBoundingClientRect().width; probe.remove();
            const pre = document.querySelector('div.cell_input pre');
            const style = getComputedStyle(pre);
            const span = document.createElement('span');
            span.style.whiteSpace = 'pre'; span.textContent = 'x'.repeat(200);
            pre.appendChild(span);
            const charWidth = span.getBoundingClientRect().width / 200; span.remove();
            const text = pre.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);
            return {figureWidth, columns: Math.floor(text / charWidth + 1e-6)};
        }"""
    )
    assert measured["figureWidth"] == pytest.approx(PAGE_FIGURE_WIDTH_PX, abs=1), (
        f"figures are shown {measured['figureWidth']} px wide at most, not {PAGE_FIGURE_WIDTH_PX}: "
        "update attnbook_tools.plots.PAGE_FIGURE_WIDTH_PX")
    assert measured["columns"] >= SITE_CODE_COLUMNS, (
        f"a code block holds {measured['columns']} characters, fewer than tests/book/test_cells.SITE_CODE_COLUMNS")


@pytest.mark.parametrize("name", toc_pages())
def test_wide_maths_scrolls_instead_of_being_cut_off(visit, name):
    """At 1300 px every display equation fits its column, or scrolls sideways (with a scroll bar)
    so that its right end can be reached."""
    page = visit(name).page
    page.set_viewport_size({"width": WIDE_MATHS_WIDTH, "height": 900})
    page.wait_for_timeout(100)
    try:
        equations = page.evaluate(
            """() => [...document.querySelectorAll('mjx-container[display="true"]')].map(m => {
                const style = getComputedStyle(m);
                const before = m.scrollLeft;
                m.scrollLeft = m.scrollWidth;
                const box = m.getBoundingClientRect();
                const maths = m.querySelector('mjx-math').getBoundingClientRect();
                const column = m.closest('article').getBoundingClientRect();
                const result = {text: m.textContent.slice(0, 40), overflow: m.scrollWidth > m.clientWidth + 1,
                    scrolls: ['auto', 'scroll'].includes(style.overflowX),
                    endReachable: maths.right <= box.right + 1,
                    insideColumn: box.right <= column.right + 1,
                    scrollbar: m.offsetHeight - m.clientHeight};
                m.scrollLeft = before;
                return result;
            })"""
        )
    finally:
        page.set_viewport_size({"width": 1280, "height": 900})
    for eq in equations:
        assert eq["insideColumn"], f"{name}: an equation runs out of the column: {eq}"
        if eq["overflow"]:
            assert eq["scrolls"] and eq["endReachable"], f"{name}: a wide equation is cut off: {eq}"


@pytest.mark.parametrize("name", CHAPTERS_WITH_NOTEBOOKS)
def test_no_code_block_scrolls_sideways(narrow, name):
    """In the narrowest desktop layout no code cell, printed output or shown package source is
    wider than its block."""
    page = narrow(name)
    wide = page.evaluate(
        """() => [...document.querySelectorAll('article pre')]
            .filter(pre => pre.offsetParent !== null)
            .filter(pre => !pre.closest('details:not([open])'))  // folded checks: tests/book/test_cells.py
            .filter(pre => pre.scrollWidth > pre.clientWidth + 1)
            .map(pre => pre.textContent.split('\\n')
                .reduce((a, b) => (b.length > a.length ? b : a), '').slice(0, 70))"""
    )
    assert not wide, f"{name}: code blocks that scroll sideways at 1200 px, their longest lines: {wide}"


@pytest.mark.parametrize("name", [page for page in CHAPTERS_WITH_NOTEBOOKS if stored_controls(page)])
def test_controls_fit_a_phone_screen(visit, name):
    """At 360 px every control's label, input and value stay inside the control's block, the block
    inside the screen, and a click anywhere on a slider still selects the nearest setting."""
    page = visit(name).page
    page.set_viewport_size(PHONE)
    try:
        page.wait_for_timeout(100)
        outside = page.evaluate(
            """() => [...document.querySelectorAll('.attnbook-control')].flatMap(block => {
                const edge = Math.min(block.getBoundingClientRect().right, window.innerWidth);
                const parts = block.querySelectorAll(
                    '.attnbook-control-inputs :is(label, input, select, output)');
                return [block, ...parts]
                    .filter(e => e.getBoundingClientRect().right > edge + 1)
                    .map(e => `${block.id}: a ${e.tagName.toLowerCase()} ends at `
                              + `${Math.round(e.getBoundingClientRect().right)} px, the edge is at ${edge} px`);
            })"""
        )
        assert not outside, f"{name}: controls wider than a phone's screen: {outside}"
        for control_id, settings in stored_controls(name).items():
            inputs = page.locator(f"#{control_id} [data-control]")
            for i, spec in enumerate(settings[0]["controls"]):
                if spec["kind"] == "slider":
                    chosen = click_sweep(page, inputs.nth(i))
                    assert_clicks_select_the_nearest_setting(control_id, chosen, len(spec["labels"]))
    finally:
        page.set_viewport_size(VIEWPORT)

"""Every page on a phone (390 CSS pixels wide) and on a desktop (1280): nothing wider than the screen,
display maths that can be scrolled to its end, and figures whose smallest text is still legible.

A figure is shrunk to the column on a phone. Its smallest text is then
``smallest_text.png_px * shown width / PNG width`` CSS pixels high (the font size), which must be
at least attnbook_tools.plots.legibility.MIN_PHONE_TEXT_PX. ``smallest_text`` is in the legibility
report that attnbook_tools.notebook.glue (and widgets.explore) store with each figure. A figure
stored before the report measured it only has the desktop guarantee (no text under 8 CSS points,
10.7 CSS pixels, at its desktop width): it passes when that bound is enough, and is otherwise
reported, with the bound, until its chapter is executed again.

The first screen of every page at both widths is kept in _build/screenshots/ (conftest.py).
"""

from __future__ import annotations

import hashlib
from base64 import b64decode

import pytest
from site_pages import PHONE, VIEWPORT, _read, all_pages, notebook_for, toc_pages

from attnbook_tools.plots.legibility import MIN_PHONE_TEXT_PX, MIN_TEXT_PT, PHONE_FIGURE_WIDTH_PX, shown_text_px
PAGES = all_pages()
CHAPTERS = [page for page in toc_pages() if notebook_for(page) is not None]
CSS_PX_PER_PT = 4 / 3

# Elements of the article that end right of the screen, and are not inside a box that scrolls
# sideways (a code block, a wide equation) and itself ends on the screen.
OUTSIDE_THE_SCREEN = """() => {
    const width = document.documentElement.clientWidth;
    const inScroller = e => {
        for (let a = e.parentElement; a && a !== document.body; a = a.parentElement) {
            if (['auto', 'scroll'].includes(getComputedStyle(a).overflowX)
                && a.getBoundingClientRect().right <= width + 1) return true;
        }
        return false;
    };
    const article = document.querySelector('article.bd-article') || document.querySelector('main') || document.body;
    const outside = [...article.querySelectorAll('*')].filter(e => {
        const box = e.getBoundingClientRect();
        return box.width > 0 && box.height > 0 && box.right > width + 1 && !inScroller(e);
    });
    // the innermost ones say what is too wide
    const innermost = outside.filter(e => !outside.some(o => o !== e && e.contains(o)));
    return {width, pageWidth: document.scrollingElement.scrollWidth,
            outside: innermost.slice(0, 8).map(e =>
                `<${e.tagName.toLowerCase()} class="${e.className}"> ends at `
                + `${Math.round(e.getBoundingClientRect().right)} px: ${(e.textContent || e.src || '').trim().slice(0, 60)}`)};
}"""

DISPLAY_MATHS = """() => [...document.querySelectorAll(
        'mjx-container[display="true"], mjx-container.attnbook-wide-inline')]
    .filter(m => m.getBoundingClientRect().width > 0).map(m => {
        const before = m.scrollLeft;
        m.scrollLeft = m.scrollWidth;
        const box = m.getBoundingClientRect();
        const maths = m.querySelector('mjx-math').getBoundingClientRect();
        const result = {text: m.textContent.slice(0, 40), overflow: m.scrollWidth > m.clientWidth + 1,
            scrolls: ['auto', 'scroll'].includes(getComputedStyle(m).overflowX),
            endReachable: maths.right <= box.right + 1, onScreen: box.right <= window.innerWidth + 1};
        m.scrollLeft = before;
        return result;
    })"""

# Every image of the article: its file, natural width and shown width. The settings of a control
# that are hidden until chosen are shown for the measurement, then hidden again.
IMAGES = """() => {
    const hidden = [...document.querySelectorAll('.attnbook-state-hidden')];
    hidden.forEach(e => e.classList.remove('attnbook-state-hidden'));
    const images = [...document.querySelectorAll('article img')].map(img => ({
        src: img.getAttribute('src'), natural: img.naturalWidth,
        shown: img.getBoundingClientRect().width}));
    hidden.forEach(e => e.classList.add('attnbook-state-hidden'));
    return images;
}"""

# The width a figure may take in the column: a very wide image, shrunk to fit.
FIGURE_COLUMN = """() => {
    const figure = document.querySelector('figure');
    const probe = document.createElement('img');
    probe.style.width = '5000px'; probe.style.maxWidth = '100%';
    probe.src = figure.querySelector('img').src;
    figure.appendChild(probe);
    const width = probe.getBoundingClientRect().width; probe.remove();
    return width;
}"""


@pytest.mark.parametrize("width", ["phone", "desktop"])
@pytest.mark.parametrize("name", PAGES)
def test_nothing_is_wider_than_the_screen(visit, visit_phone, name, width):
    """The page does not scroll sideways and no text, code, maths or image of the article runs off
    the screen (long inline code wraps; code blocks and wide equations scroll in their own box)."""
    page = (visit_phone if width == "phone" else visit)(name).page
    found = page.evaluate(OUTSIDE_THE_SCREEN)
    assert found["pageWidth"] <= found["width"] + 1, (
        f"{name} at {width} width: the page is {found['pageWidth']} px wide on a {found['width']} px screen; "
        f"too wide: {found['outside']}")
    assert not found["outside"], f"{name} at {width} width: runs off the screen: {found['outside']}"


@pytest.mark.parametrize("name", PAGES)
def test_display_maths_is_not_cut_off_on_a_phone(visit_phone, name):
    """Display maths, and inline maths too wide for a phone's line (src/site-assets/web/attnbook-maths.js),
    fits the screen or scrolls sideways to its end."""
    for eq in visit_phone(name).page.evaluate(DISPLAY_MATHS):
        assert eq["onScreen"], f"{name}: an equation runs off a phone's screen: {eq}"
        if eq["overflow"]:
            assert eq["scrolls"] and eq["endReachable"], f"{name}: a wide equation is cut off on a phone: {eq}"


@pytest.mark.parametrize("name", PAGES)
def test_inline_code_wraps(visit_phone, name):
    """Inline code in the prose may break anywhere, so that a long name cannot push the page wider."""
    rigid = visit_phone(name).page.evaluate(
        """() => [...document.querySelectorAll('article code')].filter(c => !c.closest('pre'))
            .filter(c => getComputedStyle(c).overflowWrap !== 'anywhere').map(c => c.textContent.slice(0, 40))""")
    assert not rigid, f"{name}: inline code that cannot wrap: {rigid[:5]}"


def test_figure_column_on_a_phone(visit_phone):
    """The widest a figure is shown on a 390-pixel phone, as attnbook_tools.plots.legibility says."""
    page = visit_phone(next(p for p in CHAPTERS if "03_" in p)).page
    width = page.evaluate(FIGURE_COLUMN)
    print(f"figure column at {PHONE['width']} px: {width} CSS px")
    assert width == pytest.approx(PHONE_FIGURE_WIDTH_PX, abs=1), (
        f"on a {PHONE['width']}-pixel phone figures are shown {width} px wide at most, not "
        f"{PHONE_FIGURE_WIDTH_PX}: update attnbook_tools.plots.legibility.PHONE_FIGURE_WIDTH_PX")


def stored_figures(name: str) -> dict[str, tuple[str, dict | None]]:
    """SHA-256 of each stored figure's PNG (MyST-NB names the image file after it) -> (its key: glue
    name or control id, its legibility report or None)."""
    found = {}
    for index, cell in enumerate(_read(notebook_for(name)).cells):
        for output in cell.get("outputs", []) if cell.cell_type == "code" else []:
            attnbook = output.get("metadata", {}).get("attnbook", {})
            control = attnbook.get("control")
            for mime, data in output.get("data", {}).items():
                if not mime.endswith("image/png"):
                    continue
                sha = hashlib.sha256(b64decode(data)).hexdigest()
                if control:
                    found[sha] = (control["id"], control.get("figure"))
                else:
                    key = output.get("metadata", {}).get("scrapbook", {}).get("name") or f"image of cell {index}"
                    found[sha] = (key, attnbook.get("figure"))
    return found


def phone_text(report: dict | None, shown: float, natural: int) -> tuple[float | None, bool]:
    """(font size in CSS px of the figure's smallest text as shown, measured) or, for a report stored
    before the smallest text was measured, (the least it can be, False)."""
    if report is None:
        return None, False
    size = shown_text_px(report, shown)
    if size is not None:
        return size, True
    if report.get("problems"):
        return None, False
    # the desktop guarantee: no text under MIN_TEXT_PT CSS points when shown page_px wide
    return MIN_TEXT_PT * CSS_PX_PER_PT * shown / report["page_px"], False


def phone_figure_violations(name: str, images: list[dict]) -> dict[str, str]:
    stored = stored_figures(name)
    found: dict[str, tuple[float | None, str]] = {}
    for image in images:
        sha = image["src"].rsplit("/", 1)[-1].rsplit(".", 1)[0]
        if sha not in stored:
            continue  # not a figure of the notebook (a logo, an icon)
        key, report = stored[sha]
        if image["shown"] <= 0:
            message = f"{key}: not shown on a phone (inside a folded block?), cannot be measured"
            found[key] = (None, message)
            continue
        size, measured = phone_text(report, image["shown"], image["natural"])
        if measured and size >= MIN_PHONE_TEXT_PX - 1e-9:
            continue
        if not measured and size is not None and size >= MIN_PHONE_TEXT_PX - 1e-9:
            continue  # the desktop guarantee is enough
        shown = f"shown {image['shown']:.0f} of {image['natural']} px"
        if report is None:
            message = f"{key}: stored without a legibility report ({shown})"
        elif measured:
            smallest = report["smallest_text"]
            message = (f"{key}: smallest text ({smallest['role']} {smallest['text']!r}) {size:.1f} px on a phone, "
                       f"under {MIN_PHONE_TEXT_PX:g} px ({shown})")
        elif size is None:
            message = f"{key}: its report lists problems: {report['problems'][:1]}"
        else:
            message = (f"{key}: smallest text at least {size:.1f} px on a phone, not shown to reach "
                       f"{MIN_PHONE_TEXT_PX:g} px ({shown}); stored before the report measured its smallest text: "
                       "execute the chapter again (make execute)")
        if key not in found or (size or 0) < (found[key][0] or 0):
            found[key] = (size, message)
    return {key: message for key, (_size, message) in found.items()}


@pytest.mark.parametrize("name", CHAPTERS)
def test_figure_text_is_legible_on_a_phone(visit_phone, name):
    """Every figure's smallest text is at least MIN_PHONE_TEXT_PX (8) CSS pixels on a phone."""
    images = visit_phone(name).page.evaluate(IMAGES)
    entry = "chapters/" + name.removesuffix(".html").split("/")[-1]
    found = phone_figure_violations(name, images)
    assert not found, "\n".join([f"{entry}: {len(found)} figure(s) not legible on a phone:"]
                                + [f"  - {message}" for message in found.values()])


def test_screenshots_at_both_widths(visit, visit_phone):
    """The first screen of a page at 1280 and at 390 pixels is kept (conftest.py names them)."""
    from site_pages import SCREENSHOTS

    name = PAGES[0]
    visit(name), visit_phone(name)
    stem = name.removesuffix(".html").replace("/", "__")
    for suffix, viewport in (("", VIEWPORT), (f"@{PHONE['width']}", PHONE)):
        shot = SCREENSHOTS / f"{stem}{suffix}.png"
        assert shot.is_file(), shot
        assert int.from_bytes(shot.read_bytes()[16:20], "big") == viewport["width"], f"{shot} is not {viewport}"


def test_phone_text_from_a_report():
    """Measured: the smallest text scaled to the shown width. Stored before the measurement: the
    desktop guarantee (8 CSS pt at page_px) scaled the same way, which is only a lower bound."""
    measured = {"png_px": [600, 300], "page_px": 600, "problems": [],
                "smallest_text": {"png_px": 15.0, "role": "tick label", "text": "0.5"}}
    assert phone_text(measured, 342, 600) == (pytest.approx(15.0 * 342 / 600), True)
    old = {"png_px": [600, 300], "page_px": 600, "problems": []}
    assert phone_text(old, 342, 600) == (pytest.approx(8 * 4 / 3 * 342 / 600), False)  # 6.1: not enough
    small = {"png_px": [400, 300], "page_px": 400, "problems": []}
    size, is_measured = phone_text(small, 342, 400)
    assert not is_measured and size >= MIN_PHONE_TEXT_PX  # 9.1: the bound is enough
    assert phone_text({**old, "problems": ["tick label ..."]}, 342, 600) == (None, False)
    assert phone_text(None, 342, 600) == (None, False)

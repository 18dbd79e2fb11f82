"""The built website, page by page, in headless Chromium with no network beyond 127.0.0.1.

Run after the site build (`make test` does: build, then these). Every page listed in _toc.yml, plus
the search and index pages, is loaded once; each test below looks at one aspect of one page.
"""

from __future__ import annotations

import json
import re
from urllib.parse import urljoin, urlsplit

import pytest
import yaml
from site_pages import KNOWN_CONSOLE_NOISE, ROOT, SITE, all_pages, notebook_for, stored_widget_views, toc_pages

from book_pages import chapter_number  # src/site-assets, on the path through site_pages

PAGES = all_pages()
CHAPTERS = toc_pages()
NOTEBOOK_PAGES = [p for p in CHAPTERS if notebook_for(p) is not None]
CONFIG = yaml.safe_load((ROOT / "_config.yml").read_text())
REPOSITORY = urlsplit(CONFIG["repository"]["url"]).path.strip("/")  # owner/name
BRANCH = CONFIG["repository"].get("branch", "main")

# TeX that MathJax should have turned into maths: a control word (\frac, \sqrt, \mathbf, ...),
# display dollars, or \( \[ delimiters. Code (pre, code) is left out: there a backslash is code.
RAW_TEX = re.compile(r"\\[A-Za-z]{2,}|\$\$|\\\(|\\\[")
VISIBLE_TEXT_WITHOUT_CODE = """() => {
    const body = document.querySelector('main') || document.body;
    const clone = body.cloneNode(true);
    clone.querySelectorAll('pre, code, script, style, textarea, mjx-container, .highlight')
        .forEach(e => e.remove());
    return clone.textContent;
}"""


def test_config_serves_maths_and_widgets_from_the_site():
    """MathJax 3 and the widget manager are pinned in the lock file and served from _vendor/."""
    config = CONFIG["sphinx"]["config"]
    assert "_vendor" in config["html_static_path"]
    assert config["mathjax_path"] == "mathjax/tex-mml-chtml.js"
    assert list(config["nb_ipywidgets_js"]) == ["widgets/require.js", "widgets/paths.js", "widgets/embed-amd.js"]
    lock = json.loads((ROOT / "src/site-assets/package-lock.json").read_text())["packages"]
    assert lock["node_modules/mathjax"]["version"].startswith("3.")
    assert "node_modules/requirejs" in lock and "node_modules/@jupyter-widgets/html-manager" in lock
    page = (SITE / CHAPTERS[0]).read_text()
    assert 'src="../_static/mathjax/tex-mml-chtml.js' in page, "the built site does not serve MathJax itself"


def test_every_built_page_is_checked():
    """The pages under test are the pages the build made: none is missing, none is left out."""
    built = {
        p.relative_to(SITE).as_posix()
        for p in SITE.rglob("*.html")
        if not p.relative_to(SITE).parts[0].startswith("_") and p.name != "index.html"
    }
    listed = set(PAGES)
    assert not listed - built, f"listed in the table of contents but not built: {sorted(listed - built)}"
    assert not built - listed, f"built but not checked (not in the table of contents?): {sorted(built - listed)}"


def test_index_leads_to_the_first_page(browser_context, base_url, blocked):
    page = browser_context.new_page()
    try:
        before = len(blocked)
        page.goto(base_url, wait_until="load")
        page.wait_for_url(base_url + CHAPTERS[0], timeout=10_000)
        assert blocked[before:] == []
    finally:
        page.close()


@pytest.mark.parametrize("name", PAGES)
def test_requests_stay_local_and_succeed(visit, name):
    report = visit(name)
    assert not report.outside, f"{name} asked for addresses beyond 127.0.0.1: {report.outside}"
    assert not report.failed, f"{name}: failed requests: {report.failed}"


@pytest.mark.parametrize("name", PAGES)
def test_no_console_errors(visit, name):
    report = visit(name)
    assert not report.console_errors, f"{name}: console errors: {report.console_errors}"


@pytest.mark.parametrize("name", PAGES)
def test_maths_is_typeset(visit, name):
    page = visit(name).page
    counts = page.evaluate(
        """() => {
            const maths = [...document.querySelectorAll('.math')];
            return {maths: maths.length,
                    untypeset: maths.filter(m => !m.querySelector('mjx-container'))
                                    .map(m => m.textContent.slice(0, 60)),
                    typeset: document.querySelectorAll('mjx-container').length};
        }"""
    )
    assert not counts["untypeset"], f"{name}: maths left as TeX: {counts['untypeset'][:5]}"
    if counts["maths"]:
        assert counts["typeset"] >= counts["maths"]
    raw = sorted(set(RAW_TEX.findall(page.evaluate(VISIBLE_TEXT_WITHOUT_CODE))))
    assert not raw, f"{name}: raw TeX visible in the text: {raw}"


@pytest.mark.parametrize("name", PAGES)
def test_every_image_loaded(visit, name):
    broken = visit(name).page.evaluate(
        """() => [...document.images]
            .filter(img => !(img.complete && img.naturalWidth > 0))
            .map(img => img.currentSrc || img.src)"""
    )
    assert not broken, f"{name}: images that did not load: {broken}"


@pytest.mark.parametrize("name", PAGES)
def test_every_image_has_alt_text(visit, name):
    """Every image a reader can see, figures, controls' settings and widgets' images alike."""
    missing = visit(name).page.evaluate(
        """() => [...document.querySelectorAll('main img, article img')]
            .filter(img => !(img.getAttribute('alt') || '').trim() || /\\.png$/.test(img.getAttribute('alt')))
            .map(img => img.currentSrc || img.src)"""
    )
    assert not missing, f"{name}: images without alt text: {missing}"


@pytest.mark.parametrize("name", PAGES)
def test_no_control_needs_a_kernel(visit, name):
    """No ipywidgets slider, dropdown or button is on a page: without a kernel it would do nothing."""
    controls = visit(name).page.evaluate(
        """() => [...document.querySelectorAll(
                '.jupyter-widgets input, .jupyter-widgets select, .jupyter-widgets button, .widget-slider')]
            .filter(e => e.offsetParent !== null).map(e => e.outerHTML.slice(0, 120))"""
    )
    assert not controls, f"{name}: ipywidgets controls that need a kernel: {controls}"


@pytest.mark.parametrize("name", CHAPTERS)
def test_figures_are_numbered_with_caption_and_alt_text(visit, name):
    chapter = chapter_number(name.removesuffix(".html"))
    figures = visit(name).page.evaluate(
        """() => [...document.querySelectorAll('figure')].map(f => ({
            id: f.id || (f.querySelector('[id]') || {}).id || '',
            number: (f.querySelector('figcaption .caption-number') || {}).textContent || '',
            caption: ((f.querySelector('figcaption') || {}).textContent || '').trim(),
            alts: [...f.querySelectorAll('img')].map(img => img.getAttribute('alt') || ''),
        }))"""
    )
    numbers = []
    for figure in figures:
        match = re.match(r"Figure ([\w]+)\.(\d+)", figure["number"])
        assert match, f"{name}: figure without a number: {figure}"
        numbers.append((match.group(1), int(match.group(2))))
        assert len(figure["caption"]) > len(figure["number"]) + 3, f"{name}: figure without a caption: {figure}"
        assert figure["alts"] and all(alt.strip() and not alt.endswith(".png") for alt in figure["alts"]), (
            f"{name}: figure image without alt text: {figure}"
        )
    if figures:  # Figure 3.1, 3.2, ... in the order of the page: numbered within the chapter
        assert chapter is not None, f"{name}: figures on a page that is not a numbered chapter"
        assert numbers == [(chapter, i) for i in range(1, len(figures) + 1)], f"{name}: figure numbers {numbers}"


@pytest.mark.parametrize("name", NOTEBOOK_PAGES)
def test_stored_widgets_are_rendered(visit, name):
    expected = stored_widget_views(name)
    if not expected:
        pytest.skip(f"{name}: its notebook stores no widget state")
    views = visit(name).page.evaluate(
        """() => [...document.querySelectorAll('script[type="application/vnd.jupyter.widget-view+json"]')]
            .map(s => {
                const w = s.parentElement.querySelector('.jupyter-widgets');
                const box = w ? w.getBoundingClientRect() : null;
                return {rendered: !!w, height: box ? box.height : 0,
                        error: !!s.parentElement.querySelector('.jupyter-widgets-error-widget, .widget-error')};
            })"""
    )
    assert len(views) >= expected, f"{name}: {expected} widget views stored, {len(views)} on the page"
    assert all(v["rendered"] for v in views), f"{name}: widgets not rendered: {views}"
    assert all(v["height"] > 0 for v in views), f"{name}: a widget has no height: {views}"
    assert not any(v["error"] for v in views), f"{name}: the widget manager drew an error: {views}"


@pytest.mark.parametrize("name", NOTEBOOK_PAGES)
def test_launch_buttons(visit, name):
    """Colab and Binder links to this chapter's runnable edition in the repository named in _config.yml."""
    assert CONFIG["launch_buttons"].get("colab_url") and CONFIG["launch_buttons"].get("binderhub_url")
    source = f"chapters/runnable/{notebook_for(name).name}"
    hrefs = visit(name).page.eval_on_selector_all("a[href]", "links => links.map(a => a.href)")
    colab = f"https://colab.research.google.com/github/{REPOSITORY}/blob/{BRANCH}/{source}"
    binder = f"https://mybinder.org/v2/gh/{REPOSITORY}/{BRANCH}?urlpath=tree/{source}"
    assert colab in hrefs, f"{name}: no Colab launch button ({colab})"
    assert binder in hrefs, f"{name}: no Binder launch button ({binder})"


@pytest.mark.parametrize("name", CHAPTERS)
def test_hidden_cells_are_collapsed_behind_a_toggle(visit, name):
    page = visit(name).page
    toggles = page.locator(".tag_hide-input details, .tag_hide-cell details, .tag_hide-output details")
    if not toggles.count():
        pytest.skip(f"{name}: no hidden cell")
    for i in range(toggles.count()):
        details = toggles.nth(i)
        content = details.locator(":scope > :not(summary)").first
        assert details.get_attribute("open") is None, f"{name}: hidden cell {i} starts open"
        assert not content.is_visible(), f"{name}: hidden cell {i} is visible before the toggle"
    details = toggles.first
    details.locator("summary").first.click()
    assert details.locator(":scope > :not(summary)").first.is_visible(), f"{name}: the toggle does not open"
    details.locator("summary").first.click()  # closed again, as the reader found it


@pytest.mark.parametrize("name", CHAPTERS)
def test_each_fold_is_announced_by_its_own_prompt(visit, name):
    """A screen reader names each fold (a check, a solution, hidden code) by the prompt it shows:
    the accessible name of its summary contains the visible text (axe's label-content-name-mismatch),
    not one label for every fold."""
    from playwright.sync_api import expect

    page = visit(name).page
    summaries = page.locator("details > summary")
    folds = [summaries.nth(i) for i in range(summaries.count())]
    folds = [s for s in folds if s.is_visible()]
    if not folds:
        pytest.skip(f"{name}: no fold")
    for i, summary in enumerate(folds):
        visible = " ".join(summary.inner_text().split())
        assert visible, f"{name}: fold {i} shows no prompt"
        label = summary.get_attribute("aria-label")
        assert label is None or visible in label, f"{name}: fold {i} shows {visible!r} but is named {label!r}"
        expect(summary).to_have_accessible_name(re.compile(re.escape(visible)), timeout=2_000)


@pytest.mark.parametrize("name", CHAPTERS)
def test_sidebar_reaches_every_chapter(visit, name):
    report = visit(name)
    hrefs = report.page.eval_on_selector_all(
        ".bd-sidebar-primary nav a[href]", "links => links.map(a => a.href)"
    )
    reached = {urlsplit(urljoin(report.url, h)).path.lstrip("/") for h in hrefs}
    reached = {p if p else "index.html" for p in reached}
    missing = [p for p in CHAPTERS[1:] if p not in reached]  # the root page is the logo/home link
    assert not missing, f"{name}: the sidebar does not link {missing}"


@pytest.mark.parametrize("name", CHAPTERS)
def test_one_search_field(visit, name):
    """The book theme's search field in the sidebar, and no second one in a top bar."""
    fields = visit(name).page.locator(".search-button-field")
    visible = [i for i in range(fields.count()) if fields.nth(i).is_visible()]
    assert len(visible) == 1, f"{name}: {len(visible)} visible search fields"


@pytest.mark.parametrize("name", NOTEBOOK_PAGES)
def test_chapters_with_symbols_link_the_notation_page(visit, name):
    page = visit(name).page
    if not page.locator("article .math").count():
        pytest.skip(f"{name}: no maths")
    links = page.eval_on_selector_all("article a[href]", "links => links.map(a => a.href)")
    assert any(urlsplit(h).path.endswith("/notation.html") for h in links), f"{name}: no link to the notation page"


def test_bibliography_lists_the_papers(visit):
    name = next((p for p in CHAPTERS if p.endswith("bibliography.html")), None)
    if name is None:
        pytest.skip("no bibliography page in the table of contents")
    text = visit(name).page.locator("article").inner_text()
    for author in ("Bahdanau", "Luong", "Vaswani"):
        assert author in text, f"{name} does not list {author}"


@pytest.mark.parametrize("name", CHAPTERS)
def test_citations_link_to_bibliography_entries(visit, name):
    report = visit(name)
    targets = report.page.eval_on_selector_all(
        "article a[href*='bibliography.html#']", "links => links.map(a => a.href)"
    )
    if not targets:
        pytest.skip(f"{name}: cites nothing")
    bibliography = next(p for p in CHAPTERS if p.endswith("bibliography.html"))
    ids = set(visit(bibliography).page.eval_on_selector_all("[id]", "els => els.map(e => e.id)"))
    dangling = sorted({t for t in targets if urlsplit(t).fragment not in ids})
    assert not dangling, f"{name}: citations to missing bibliography entries: {dangling}"


def test_search_finds_softmax(browser_context, base_url, blocked):
    """The search page finds "softmax", its snippets show typeset maths, and nothing leaves 127.0.0.1."""
    page = browser_context.new_page()
    errors = []
    page.on("console", lambda m: m.type == "error" and errors.append(m.text))
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        before = len(blocked)
        page.goto(base_url + "search.html?q=softmax", wait_until="load")
        results = page.locator("#search-results ul.search li")
        results.first.wait_for(state="visible", timeout=15_000)
        assert results.count() > 0
        linked = results.locator("a").evaluate_all("links => links.map(a => a.href)")
        assert linked and all(h.startswith(base_url) for h in linked), f"search results link {linked}"
        page.wait_for_load_state("networkidle")
        page.wait_for_timeout(500)  # the last snippets are typeset
        text = page.evaluate(
            """() => { const r = document.getElementById('search-results').cloneNode(true);
                       r.querySelectorAll('mjx-container').forEach(e => e.remove());
                       return r.textContent; }"""
        )
        # a snippet may cut a formula in two; a whole \(...\) left in the text was not typeset
        assert not re.findall(r"\\\(.{1,80}?\\\)", text), f"raw TeX in the search results: {text[:500]}"
        assert blocked[before:] == []
        assert not [e for e in errors if not any(p.search(e) for p in KNOWN_CONSOLE_NOISE)], errors
    finally:
        page.close()

"""Fixtures for the browser tests: the built site served on 127.0.0.1, and headless Chromium.

Every page is loaded once (the `visit` fixture caches it) with every request outside the local
server blocked and recorded, every console error and failed response recorded, maths typeset and
widgets rendered before the page is looked at; a screenshot of its first screen goes to
_build/screenshots/ (of the whole page with FULL_SCREENSHOTS=1, which adds about 3 s a page).
`visit` loads pages in a 1280-pixel window, `visit_phone` in a phone's 390 (screenshots
named ...@390.png).

Chromium is Debian's (/usr/bin/chromium, `apt-get install -y chromium`), driven by the Python
`playwright` package; `playwright install` is never needed. Without it these tests are skipped,
except under CI=true, where a missing browser is a failure.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from site_pages import (
    CHROMIUM,
    FLAGS,
    IN_CI,
    INSTALL_HINT,
    KNOWN_CONSOLE_NOISE,
    PHONE,
    SCREENSHOTS,
    SITE,
    TIMEOUT_MS,
    VIEWPORT,
    serve,
)


# --- the server and the browser ----------------------------------------------------------------


@pytest.fixture(scope="session")
def site() -> Path:
    if not (SITE / "index.html").is_file():
        pytest.fail(f"no built site in {SITE}: run `make build` (or `make book`) first", pytrace=False)
    return SITE


@pytest.fixture(scope="session")
def base_url(site: Path):
    """The built site served on 127.0.0.1, on a free port, for the whole session."""
    with serve(site) as url:
        yield url


def _browser_missing(reason: str):
    message = f"{reason}: {INSTALL_HINT}; these browser tests need it."
    if IN_CI:
        pytest.fail(f"{message} (CI=true: a missing browser is a failure)", pytrace=False)
    pytest.skip(message)


@pytest.fixture(scope="session")
def browser():
    if not CHROMIUM.is_file():
        _browser_missing(f"no Chromium at {CHROMIUM}")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:  # pragma: no cover - requirements.txt pins it
        _browser_missing("the Python package playwright is not installed (pip install -r requirements.txt)")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=FLAGS)
        yield browser
        browser.close()


@dataclass
class PageReport:
    """A loaded page and what happened while it loaded."""

    name: str
    url: str
    page: object  # playwright Page, still open
    outside: list[str] = field(default_factory=list)  # requests to anything but the local server
    failed: list[str] = field(default_factory=list)  # local requests that failed or got status >= 400
    console_errors: list[str] = field(default_factory=list)  # not known noise
    noise: list[str] = field(default_factory=list)  # allowed noise (none today), for the record


def _is_local(url: str, base: str) -> bool:
    return url.startswith(base) or url.startswith(("data:", "blob:", "about:"))


@pytest.fixture(scope="session")
def blocked() -> list[str]:
    """Every request to anything but the local server, in order (they are all blocked)."""
    return []


def _new_context(browser, base_url, blocked, viewport):
    context = browser.new_context(viewport=viewport, service_workers="block")
    context.set_default_timeout(TIMEOUT_MS)

    def route(route):
        if _is_local(route.request.url, base_url):
            route.continue_()
        else:
            blocked.append(route.request.url)
            route.abort("blockedbyclient")

    context.route("**/*", route)
    return context


@pytest.fixture(scope="session")
def browser_context(browser, base_url, blocked):
    context = _new_context(browser, base_url, blocked, VIEWPORT)
    yield context
    context.close()


@pytest.fixture(scope="session")
def phone_context(browser, base_url, blocked):
    """A window as wide as a phone's screen (PHONE: 390 CSS pixels)."""
    context = _new_context(browser, base_url, blocked, PHONE)
    yield context
    context.close()


def _settle(page) -> None:
    """Wait until maths is typeset, widgets are drawn and images are loaded (or time is up)."""
    page.evaluate(
        """async () => {
            if (window.MathJax && MathJax.startup && MathJax.startup.promise) {
                await MathJax.startup.promise;
            }
            await document.fonts.ready;
        }"""
    )
    views = 'script[type="application/vnd.jupyter.widget-view+json"]'
    if page.locator(views).count():
        try:
            page.wait_for_function(
                f"""() => [...document.querySelectorAll('{views}')]
                    .every(s => s.parentElement.querySelector('.jupyter-widgets'))""",
                timeout=TIMEOUT_MS,
            )
        except Exception:  # the widget test reports what is missing
            pass
    try:
        page.wait_for_function(
            "() => [...document.images].every(img => img.complete)", timeout=TIMEOUT_MS
        )
    except Exception:  # the image test reports what is missing
        pass
    page.wait_for_timeout(150)  # late console messages of the widget manager


def _visitor(context, base_url, blocked, screenshot_suffix: str):
    """(load, reports): load('chapters/x.html') -> PageReport, each page loaded once in ``context``;
    the first screen's screenshot is named after the page, plus ``screenshot_suffix``."""
    reports: dict[str, PageReport] = {}
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)

    def load(name: str) -> PageReport:
        if name in reports:
            return reports[name]
        url = base_url + name
        page = context.new_page()
        report = PageReport(name=name, url=url, page=page)
        blocked_before = len(blocked)

        def on_console(message):
            if message.type != "error":
                return
            text = message.text
            where = (message.location or {}).get("url", "")
            if any(p.search(text) for p in KNOWN_CONSOLE_NOISE):
                report.noise.append(text)
            elif text.startswith("Failed to load resource") and not _is_local(where, base_url):
                pass  # a blocked outside request: reported by the request test
            else:
                report.console_errors.append(f"{text} ({where})" if where else text)

        def on_page_error(error):
            text = str(getattr(error, "message", error))
            if any(p.search(text) for p in KNOWN_CONSOLE_NOISE):
                report.noise.append(text)
            else:
                report.console_errors.append(f"uncaught: {text}")

        def on_response(response):
            if response.status >= 400:
                report.failed.append(f"{response.status} {response.url}")

        def on_request_failed(request):
            if _is_local(request.url, base_url):
                report.failed.append(f"{request.failure} {request.url}")

        page.on("console", on_console)
        page.on("pageerror", on_page_error)
        page.on("response", on_response)
        page.on("requestfailed", on_request_failed)
        response = page.goto(url, wait_until="load")
        if response is None or not response.ok:
            report.failed.append(f"{response.status if response else 'no response'} {url}")
        _settle(page)
        report.outside = blocked[blocked_before:]
        shot = SCREENSHOTS / (name.removesuffix(".html").replace("/", "__") + screenshot_suffix + ".png")
        page.screenshot(path=str(shot), full_page=os.environ.get("FULL_SCREENSHOTS") == "1")
        reports[name] = report
        return report

    return load, reports


@pytest.fixture(scope="session")
def visit(browser_context, base_url, blocked):
    """visit('chapters/x.html') -> PageReport in a 1280-pixel window; each page is loaded once per
    session (screenshot: _build/screenshots/chapters__x.png)."""
    load, reports = _visitor(browser_context, base_url, blocked, "")
    yield load
    for report in reports.values():
        report.page.close()


@pytest.fixture(scope="session")
def visit_phone(phone_context, base_url, blocked):
    """visit_phone('chapters/x.html') -> PageReport in a phone-wide window (390 CSS pixels); each
    page is loaded once per session (screenshot: _build/screenshots/chapters__x@390.png)."""
    load, reports = _visitor(phone_context, base_url, blocked, f"@{PHONE['width']}")
    yield load
    for report in reports.values():
        report.page.close()

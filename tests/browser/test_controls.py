"""The chapters' controls work on the website without a kernel: every input, moved to each of its
settings with the mouse and then from the keyboard, shows the image stored for the chosen setting,
and the figure's alt text follows; a click anywhere on a slider's track selects the nearest setting.

Clicks go where a reader can see them: Playwright's mouse works in the viewport's coordinates, so a
slider further down the page is scrolled into view first (a click at coordinates below the viewport
lands nowhere, and the slider keeps its setting).

The mechanism is tested on a small site built here with the book's own extensions
(tests/build/site_fixture.py: a slider and a dropdown, six settings); every control the real chapters
store (attnbook_tools.widgets.explore) is then moved on the built book the same way.
"""

from __future__ import annotations

import hashlib
import itertools
from pathlib import PurePosixPath
from urllib.parse import urlparse

import pytest
from site_pages import CHAPTERS_WITH_NOTEBOOKS, serve, stored_controls

from site_fixture import CONTROL_ID, build_demo_site, demo_explorer


def visible_image(block):
    """(src, alt) of the one image the control shows."""
    shown = block.locator(".attnbook-control-state:visible img")
    assert shown.count() == 1, f"{shown.count()} images shown at once"
    return shown.get_attribute("src"), shown.get_attribute("alt")


def expected_alt(settings: list[dict], indices: list[int]) -> str:
    return next(s["alt"] for s in settings if s["indices"] == indices)


SWEEP_STEP_PX = 3  # the click sweep's pitch: a slider's stretches are 20 px or more wide


def click_sweep(page, field) -> list[int]:
    """The setting a click selects every SWEEP_STEP_PX pixels across the slider, left to right, and
    at its last pixel (the slider is first scrolled into view: a click lands where the reader sees
    the track)."""
    field.scroll_into_view_if_needed()
    box = field.bounding_box()
    y = box["y"] + box["height"] / 2
    width = int(box["width"])
    # The slider's value is read in the page as each next click begins (a listener that runs before
    # any other), i.e. once the previous click and everything it set off are done, and after the
    # last click: the values a reader sees between clicks, without a round trip per click.
    field.evaluate("""(el) => {
        const seen = [];
        const record = () => seen.push(el.value);
        window.addEventListener('pointerdown', record, {capture: true});
        window.__attnbookSweep = () => {
            window.removeEventListener('pointerdown', record, {capture: true});
            return [...seen.slice(1), el.value];
        };
    }""")
    xs = [*range(0, width - 1, SWEEP_STEP_PX), width - 1]
    for dx in xs:
        page.mouse.click(box["x"] + dx + 0.5, y)
    chosen = [int(value) for value in page.evaluate("() => window.__attnbookSweep()")]
    assert len(chosen) == len(xs), f"{len(xs)} clicks, {len(chosen)} seen by the page"
    return chosen


def assert_clicks_select_the_nearest_setting(control_id: str, chosen: list[int], count: int) -> None:
    """A click anywhere on the track selects the nearest setting: left to right the settings come in
    order, each once, and every inner setting owns an equal stretch of the track (the settings sit
    evenly spaced, each owning the half-spaces to its neighbours); the two ends own the rest.
    Stretches are counted in clicks of the sweep, so equal means within two clicks."""
    runs = [(value, len(list(group))) for value, group in itertools.groupby(chosen)]
    assert [value for value, _ in runs] == list(range(count)), (
        f"{control_id}: clicks from left to right select {[value for value, _ in runs]}")
    inner = [width for _, width in runs[1:-1]]
    if inner:
        assert max(inner) - min(inner) <= 2, f"{control_id}: unequal stretches of the track: {runs}"
        assert min(runs[0][1], runs[-1][1]) >= min(inner) / 2 - 1, f"{control_id}: an end is hard to hit: {runs}"


def move_every_input(page, control_id: str, settings: list[dict]) -> None:
    """Move each input to every one of its settings, with the mouse and then from the keyboard.
    After each move exactly one image is shown, it is another image than before, it is the image
    stored for the chosen setting, and its alt text is the one stored for that setting."""
    block = page.locator(f"#{control_id}")
    assert "attnbook-ready" in (block.get_attribute("class") or ""), f"{control_id}: the script did not wire it"
    inputs = block.locator("[data-control]")
    specs = settings[0]["controls"]
    assert inputs.count() == len(specs)
    stored = {tuple(s["indices"]): s for s in settings}

    def current():
        return [int(inputs.nth(i).input_value()) for i in range(inputs.count())]

    def check_shown(before, how):
        """The image of the chosen setting is the one shown; it differs from ``before``."""
        src, alt = visible_image(block)
        setting = stored[tuple(current())]
        assert PurePosixPath(urlparse(src).path).stem == setting["sha"], (
            f"{control_id}: after {how} the image shown ({src}) is not the one of setting {current()}")
        assert src != before, f"{control_id}: {how} did not change the figure"
        assert alt == setting["alt"], f"{control_id}: after {how} the alt text is {alt!r}"
        return src

    for i, spec in enumerate(specs):
        field = inputs.nth(i)
        label = page.evaluate("(el) => [...el.labels].map(l => l.textContent).join(' ')", field.element_handle())
        assert label.strip() == spec["label"], f"{control_id}: input {i} is labelled {label!r}"
        count = len(spec["labels"])
        slider = spec["kind"] == "slider"
        src = visible_image(block)[0]
        # mouse: every other setting in turn, then back to the one it had
        start = current()[i]
        for target in [*(t for t in range(count) if t != start), start]:
            if slider:  # a click in the middle of the target's stretch of the track
                box = field.bounding_box()
                field.click(position={"x": (target + 0.5) * box["width"] / count, "y": box["height"] / 2})
                how = f"a click on the slider at setting {target}"
            else:  # a native menu's pop-up is not part of the page: choose the option as a click does
                field.select_option(str(target))
                how = f"choosing option {target}"
            assert current()[i] == target, f"{control_id}: {how} selected {current()[i]}"
            src = check_shown(src, how)
            if slider:
                assert field.get_attribute("aria-valuetext") == spec["labels"][target]
        # keyboard: arrow keys down to the first setting, then up through every setting to the last
        back, forward = ("ArrowLeft", "ArrowRight") if slider else ("ArrowUp", "ArrowDown")
        field.focus()
        for key, target in [*((back, t) for t in range(start - 1, -1, -1)),
                            *((forward, t) for t in range(1, count))]:
            page.keyboard.press(key)
            how = f"the key {key} (towards setting {target})"
            assert current()[i] == target, f"{control_id}: {how} selected {current()[i]}"
            src = check_shown(src, how)
            if slider:
                assert field.get_attribute("aria-valuetext") == spec["labels"][target]
        if slider:
            assert_clicks_select_the_nearest_setting(control_id, click_sweep(page, field), count)


@pytest.fixture(scope="module")
def demo_site(tmp_path_factory):
    return build_demo_site(tmp_path_factory.mktemp("demo-site"))


@pytest.fixture(scope="module")
def demo_page(browser, demo_site):
    with serve(demo_site) as base:
        context = browser.new_context(viewport={"width": 1280, "height": 900}, service_workers="block")
        context.route("**/*", lambda r: r.continue_() if r.request.url.startswith(base) else r.abort())
        page = context.new_page()
        errors = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.on("console", lambda m: m.type == "error" and errors.append(m.text))
        page.goto(base + "chapters/03_demo.html", wait_until="load")
        yield page, errors
        context.close()


def _demo_settings():
    explorer = demo_explorer()
    specs = [c.spec() for c in explorer.controls]
    return [{"alt": explorer.alt_text(**s), "indices": explorer.indices(s), "controls": specs,
             "sha": hashlib.sha256(explorer.png(**s)).hexdigest()} for s in explorer.settings]


def test_demo_control_moves_with_mouse_and_keyboard(demo_page):
    page, errors = demo_page
    settings = _demo_settings()
    src, alt = visible_image(page.locator(f"#{CONTROL_ID}"))
    assert alt == expected_alt(settings, [1, 0])  # the initial setting: D = 4, unscaled
    move_every_input(page, CONTROL_ID, settings)
    assert not errors, errors


def test_demo_control_without_script_shows_the_initial_setting(browser, demo_site):
    with serve(demo_site) as base:
        context = browser.new_context(java_script_enabled=False)
        try:
            page = context.new_page()
            page.goto(base + "chapters/03_demo.html", wait_until="load")
            block = page.locator(f"#{CONTROL_ID}")
            assert not block.locator(".attnbook-control-inputs").is_visible()  # inputs that could do nothing
            assert visible_image(block)[1] == expected_alt(_demo_settings(), [1, 0])
        finally:
            context.close()


@pytest.mark.parametrize("name", CHAPTERS_WITH_NOTEBOOKS)
def test_every_control_of_the_book_moves(visit, name):
    controls = stored_controls(name)
    if not controls:
        pytest.skip(f"{name}: no precomputed control (attnbook_tools.widgets.explore) on this page")
    page = visit(name).page
    for control_id, settings in controls.items():
        move_every_input(page, control_id, settings)

"""The book's Sphinx extensions (src/site-assets/) on a small known site (tests/site_fixture.py),
and the patch the website's widget manager gets (src/site-assets/vendor.py)."""

from __future__ import annotations

import html
import json
import re
import sys
from pathlib import Path

import matplotlib
import pytest

matplotlib.use("Agg")

from site_fixture import CONTROL_ID, PROGRESS_MODEL, ROOT, SLIDER_MODEL, build_demo_site, demo_explorer  # noqa: E402

sys.path.insert(0, str(ROOT / "src" / "site-assets"))
import book_pages  # noqa: E402
import vendor  # noqa: E402


@pytest.fixture(scope="module")
def page(tmp_path_factory) -> str:
    site = build_demo_site(tmp_path_factory.mktemp("demo"))
    return (site / "chapters" / "03_demo.html").read_text()


def _block(page: str) -> str:
    start = page.index(f'id="{CONTROL_ID}"')
    return page[start:page.index("</section>", start)]


def test_the_control_has_labelled_inputs(page):
    block = _block(page)
    assert re.search(r'<label for="ctl-demo-D">width D</label>', block)
    assert re.search(r'<input type="range" id="ctl-demo-D" data-control="0" min="0" max="2" step="1" value="1" '
                     r'aria-valuetext="4">', block)
    assert '<label for="ctl-demo-kind">score</label>' in block
    assert re.search(r'<select id="ctl-demo-kind" data-control="1"><option value="0" selected>unscaled</option>'
                     r'<option value="1">scaled</option></select>', block)


def test_every_setting_is_an_image_with_its_alt_text_in_order(page):
    block = _block(page)
    explorer = demo_explorer()
    alts = [html.unescape(a) for a in re.findall(r'<img alt="([^"]*)"', block)]
    assert alts == [explorer.alt_text(**s) for s in explorer.settings]
    states = json.loads(re.search(r'class="attnbook-control-states">(.*?)</script>', block).group(1))
    assert states["states"] == [explorer.indices(s) for s in explorer.settings]
    assert states["labels"] == [["1", "4", "16"], ["unscaled", "scaled"]]
    shown = re.findall(r'<div class="attnbook-control-state( attnbook-state-hidden)? [^"]*"', block)
    assert [hidden == "" for hidden in shown] == [s == explorer.initial for s in explorer.settings]


def test_a_stored_ipywidgets_control_is_left_out_and_a_progress_bar_kept(page):
    views = re.findall(r'widget-view\+json">(.*?)</script>', page)
    assert [json.loads(v)["model_id"] for v in views] == [PROGRESS_MODEL]
    assert SLIDER_MODEL not in "".join(views)


def test_figures_are_numbered_within_the_chapter(page):
    assert re.findall(r'caption-number">Figure ([\d.]+) ', page) == ["3.1", "3.2"]


def test_check_cells_fold_behind_show_the_check(page):
    assert page.count("Show the check") == 1
    check = page.index("Show the check")
    assert "# Check: the line falls" in page[check:check + 2000]


@pytest.mark.parametrize("docname,number", [
    ("chapters/03_scaled_dot_product", "3"), ("chapters/05b_four_scores", "5b"),
    ("chapters/00_attention_at_a_glance", "0"), ("chapters/notation", None), ("chapters/intro", None),
])
def test_chapter_number_from_the_file_name(docname, number):
    assert book_pages.chapter_number(docname) == number


def test_each_inline_script_once():
    from sphinx.builders.html._assets import _JavaScript

    body = {"body": "const THEBE_JS_URL = 1"}
    scripts = [_JavaScript(None, **body), _JavaScript("a.js"), _JavaScript("", **body), _JavaScript("a.js")]
    context = {"script_files": scripts}
    book_pages.one_copy_of_each_script(None, "p", "page.html", context, None)
    assert [(s.filename, s.attributes) for s in context["script_files"]] == [(None, body), ("a.js", {})]


def test_widget_manager_patch_calls_mathjax_3():
    call = 'void 0!==window.MathJax&&MathJax.Hub.Queue(["Typeset",MathJax.Hub,e])'
    source = ";".join([call, call.replace(",e]", ",t]"), call.replace(",e]", ",n]")])
    patched = vendor.patch_widget_manager(source)
    assert "MathJax.typesetPromise([e])" in patched and "MathJax.typesetPromise([n])" in patched
    assert patched.count('MathJax.Hub?MathJax.Hub.Queue(["Typeset"') == 3
    with pytest.raises(SystemExit, match="found 1"):
        vendor.patch_widget_manager(call)


def test_served_widget_manager_is_patched():
    served = ROOT / "_vendor" / "widgets" / "embed-amd.js"
    if not served.is_file():
        pytest.skip("_vendor/ is not built here (make vendor)")
    text = served.read_text(encoding="utf-8")
    calls = text.count('MathJax.Hub.Queue(["Typeset"')
    guarded = text.count('MathJax.Hub?MathJax.Hub.Queue(["Typeset"')
    assert calls == guarded == vendor.MATHJAX2_TYPESET_COPIES  # MathJax 2's call only where MathJax.Hub exists
    assert text.count("MathJax.typesetPromise&&MathJax.typesetPromise(") == vendor.MATHJAX2_TYPESET_COPIES


def test_config_loads_the_extensions():
    import yaml

    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    assert {"controls", "book_pages"} <= set(config["sphinx"]["local_extensions"])
    assert config["sphinx"]["config"]["html_context"]["default_mode"] == "auto"
    assert Path(ROOT / "src" / "site-assets" / "web" / "attnbook-controls.js").is_file()

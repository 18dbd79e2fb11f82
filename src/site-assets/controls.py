"""Sphinx extension: the chapters' controls on a website without a kernel.

A chapter's ``attnbook_tools.widgets.explore(...)`` stores, when the book executes the notebook, one
``image/png`` output per setting, each with ``metadata["attnbook"]["control"]`` (its control's id,
the option indices of its setting, its alt text and the controls' description). While a page is
read, this extension finds those images in the page (MyST-NB names each image file after the
SHA-256 of its bytes), gives each its alt text, and gathers the images of one control into a block
with labelled inputs (a range input per slider, a select per dropdown); web/attnbook-controls.js
shows the image of the chosen setting. Without JavaScript the initial setting's image is shown.

A stored ipywidgets control (a slider, dropdown, toggle button ... of an ``interact`` or of the mask
editor) cannot work without a kernel, so it is left out of the page; widgets that control nothing
(progress bars) stay.
"""

from __future__ import annotations

import hashlib
import html
import json
import re
from base64 import b64decode
from pathlib import Path

import nbformat
from docutils import nodes
from sphinx.util import logging

logger = logging.getLogger(__name__)

WEB = Path(__file__).resolve().parent / "web"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
# ipywidgets models a reader would operate; a view that contains one is a control.
CONTROL_MODEL = re.compile(
    r"^(?:\w*Slider|Dropdown|Select|SelectMultiple|ToggleButtons?|Checkbox|RadioButtons|Text|Textarea|"
    r"Password|Combobox|Button|ColorPicker|DatePicker|DatetimePicker|TimePicker|NaiveDatetimePicker|Play|"
    r"\w*Text|TagsInput|ColorsInput|FloatsInput|IntsInput|FileUpload)Model$"
)
MODEL_REFERENCE = re.compile(r"IPY_MODEL_([0-9a-f]+)")


# --- what a notebook stores ------------------------------------------------------------------


def control_states(nb) -> dict[str, list[dict]]:
    """control id -> its stored states, in order: each {"sha": SHA-256 of the PNG, "alt", "indices",
    "controls", "cell": cell index}."""
    found: dict[str, list[dict]] = {}
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        for output in cell.get("outputs", []):
            info = output.get("metadata", {}).get("attnbook", {}).get("control")
            png = output.get("data", {}).get("image/png")
            if not info or not png:
                continue
            sha = hashlib.sha256(b64decode(png)).hexdigest()
            found.setdefault(info["id"], []).append({
                "sha": sha, "alt": info["alt"], "indices": list(info["indices"]),
                "controls": info["controls"], "cell": index,
            })
    return found


def control_views(nb) -> set[str]:
    """Model ids of the stored widget views that contain a control a reader would operate."""
    state = nb.metadata.get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})

    def is_control(model_id: str, seen: set[str]) -> bool:
        if model_id in seen or model_id not in state:
            return False
        seen.add(model_id)
        model = state[model_id]
        if CONTROL_MODEL.match(model.get("model_name", "")):
            return True
        children = MODEL_REFERENCE.findall(json.dumps(model.get("state", {}).get("children", [])))
        return any(is_control(child, seen) for child in children)

    views = set()
    for cell in nb.cells:
        for output in cell.get("outputs", []) if cell.cell_type == "code" else []:
            view = output.get("data", {}).get(WIDGET_VIEW)
            if view and is_control(view.get("model_id", ""), set()):
                views.add(view["model_id"])
    return views


# --- the page --------------------------------------------------------------------------------


def _bundles(doctree):
    """Every MyST-NB output bundle of the page (one per display_data / execute_result output)."""
    return [n for n in doctree.findall(nodes.container) if n.get("nb_element") == "mime_bundle"]


def _model_id(bundle) -> str | None:
    for raw in bundle.findall(nodes.raw):
        if WIDGET_VIEW in raw.astext():
            match = re.search(r'"model_id":\s*"([0-9a-f]+)"', raw.astext())
            if match:
                return match.group(1)
    return None


def control_markup(control_id: str, states: list[dict]) -> str:
    """The inputs of one control (hidden until web/attnbook-controls.js has wired them)."""
    specs = states[0]["controls"]
    parts = [f'<div class="attnbook-control-inputs" role="group" aria-label="{html.escape(control_id)}">']
    for index, spec in enumerate(specs):
        input_id = f"{control_id}-{spec['name']}"
        label = html.escape(spec["label"])
        value = spec["value"]
        parts.append('<div class="attnbook-control-input">')
        parts.append(f'<label for="{html.escape(input_id)}">{label}</label>')
        if spec["kind"] == "slider":
            parts.append(
                f'<input type="range" id="{html.escape(input_id)}" data-control="{index}" min="0" '
                f'max="{len(spec["labels"]) - 1}" step="1" value="{value}" '
                f'aria-valuetext="{html.escape(spec["labels"][value])}">'
                f'<output for="{html.escape(input_id)}">{html.escape(spec["labels"][value])}</output>'
            )
        else:
            options = "".join(
                f'<option value="{i}"{" selected" if i == value else ""}>{html.escape(text)}</option>'
                for i, text in enumerate(spec["labels"])
            )
            parts.append(f'<select id="{html.escape(input_id)}" data-control="{index}">{options}</select>')
        parts.append("</div>")
    parts.append("</div>")
    return "".join(parts)


def transform_page(app, doctree) -> None:
    """doctree-read: controls from precomputed states; stored ipywidgets controls left out."""
    docname = app.env.docname
    source = Path(app.env.doc2path(docname))
    if source.suffix != ".ipynb":
        return
    nb = nbformat.read(source, as_version=4)
    views = control_views(nb)
    states = control_states(nb)
    by_sha: dict[str, list[tuple[str, int]]] = {}  # two settings may draw the same picture
    for control_id, found in states.items():
        for i, state in enumerate(found):
            by_sha.setdefault(state["sha"], []).append((control_id, i))
    groups: dict[str, list[tuple[int, nodes.Element]]] = {}
    for bundle in _bundles(doctree):
        if _model_id(bundle) in views:
            bundle.parent.remove(bundle)
            continue
        for image in bundle.findall(nodes.image):
            sha = Path(image["uri"]).stem
            if by_sha.get(sha):
                control_id, i = by_sha[sha].pop(0)
                groups.setdefault(control_id, []).append((i, bundle))
                break
    for control_id, found in groups.items():
        expected = states[control_id]
        if sorted(i for i, _ in found) != list(range(len(expected))):
            logger.warning(f"controls: {docname}: control {control_id!r} stores {len(expected)} states but "
                           f"{len(found)} are on the page", location=docname)
            continue
        specs = expected[0]["controls"]
        initial = [spec["value"] for spec in specs]
        block = nodes.container(classes=["attnbook-control"], ids=[control_id])
        first = found[0][1]
        first.parent.insert(first.parent.index(first), block)
        block += nodes.raw("", control_markup(control_id, expected), format="html")
        for i, bundle in sorted(found, key=lambda pair: pair[0]):
            bundle.parent.remove(bundle)
            state = expected[i]
            hidden = [] if state["indices"] == initial else ["attnbook-state-hidden"]
            wrapper = nodes.container(classes=["attnbook-control-state", *hidden])
            wrapper["ids"] = [f"{control_id}-state-{i}"]
            for image in bundle.findall(nodes.image):
                image["alt"] = state["alt"]
            wrapper += bundle
            block += wrapper
        description = {"states": [state["indices"] for state in expected],
                       "labels": [spec["labels"] for spec in specs]}
        block.insert(1, nodes.raw(
            "", '<script type="application/json" class="attnbook-control-states">'
                f'{_script_json(description)}</script>', format="html"))


def _script_json(value) -> str:
    """JSON that is safe inside a <script> element."""
    return json.dumps(value).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _static_path(app, config) -> None:
    config.html_static_path.append(str(WEB))


def setup(app):
    app.connect("config-inited", _static_path)
    app.connect("doctree-read", transform_page)
    app.add_css_file("attnbook-site.css")
    app.add_js_file("attnbook-controls.js", defer="defer")
    # the site's styles (attnbook-site.css) are the controls' and the page's: inline maths too wide
    # for a phone's line scrolls in its own box
    app.add_js_file("attnbook-maths.js", defer="defer")
    return {"parallel_read_safe": True, "parallel_write_safe": True}

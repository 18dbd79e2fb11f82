"""Is a figure legible on the book's page? The page's geometry, and fonts, overlaps and colours
measured on the figure as the notebook stores it.

A figure is shown on the website at most :data:`PAGE_FIGURE_WIDTH_PX` CSS pixels wide, scaled
down when its PNG is wider. Figures are stored at :data:`FIGURE_DPI` with a margin of
:data:`PNG_PAD_INCHES`, so the page's column is :data:`COLUMN_INCHES` = PAGE_FIGURE_WIDTH_PX /
FIGURE_DPI - 2 PNG_PAD_INCHES inches: a figure laid out that wide (the diagrams are) is shown at its
own size. :func:`figure_problems` reports every text that would
be smaller than :data:`MIN_TEXT_PT` on the page, every pair of texts that overlap, and every pair
of labelled series that differ only in hue; :func:`attnbook_tools.notebook.glue` stores that report with
each figure (:func:`figure_report`), and the book's tests require it to be empty.
:func:`legibility_problems` adds, for a figure placed by hand, every text that runs off it.

On a phone (390 CSS pixels) a figure is shrunk further, to at most :data:`PHONE_FIGURE_WIDTH_PX`.
The report keeps the figure's :func:`smallest_text`; tests/browser/test_small_screens.py scales it to
the width the figure is shown at (:func:`shown_text_px`) and requires :data:`MIN_PHONE_TEXT_PX`.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import struct
import warnings

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure

__all__ = [
    "PAGE_FIGURE_WIDTH_PX", "FIGURE_DPI", "PNG_PAD_INCHES", "COLUMN_INCHES", "MIN_TEXT_PT", "png_bytes", "png_size",
    "figure_problems", "figure_report", "legibility_problems", "smallest_text", "MIN_PHONE_TEXT_PX", "PHONE_FIGURE_WIDTH_PX",
    "shown_text_px",
]

# The widest a figure is shown on the website, in CSS pixels: the article column of the narrowest
# desktop layout (a 1200-pixel window with both sidebars), measured in Chromium;
# tests/browser/test_layout.py measures it again and fails when the theme changes it.
PAGE_FIGURE_WIDTH_PX = 608
FIGURE_DPI = 100  # the dots per inch of every stored figure (attnbook_tools.notebook.setup sets the same)
PNG_PAD_INCHES = 0.1  # the margin a stored PNG keeps around the figure's content (bbox_inches="tight")
# The widest figure that is shown at its own size, margins included: 5.88 in. Diagrams are laid out
# this wide, so their points are the page's points (times 100/96 CSS px per px).
COLUMN_INCHES = PAGE_FIGURE_WIDTH_PX / FIGURE_DPI - 2 * PNG_PAD_INCHES
MIN_TEXT_PT = 8.0  # smallest text size on the page, in CSS points (1 pt = 1/72 in = 4/3 CSS px)
_CSS_PX_PER_INCH = 96.0
# On a phone (a 390-pixel screen) a figure is shrunk to the column (tests/browser/test_small_screens.py
# measures it); its smallest text must still be this many CSS pixels high (its font size).
MIN_PHONE_TEXT_PX = 8.0
# The widest a figure is shown on such a phone, in CSS pixels, measured in Chromium.
PHONE_FIGURE_WIDTH_PX = 342  # the article less its margins and the figure's own (not 358)
MIN_LIGHTNESS_GAP = 20.0  # CIE L*: two fills this far apart stay apart in greyscale


def png_bytes(fig: Figure) -> bytes:
    """The figure as the notebook stores it: a PNG at the figure's dpi, cropped to its content
    (what IPython's inline backend and ``glue`` write)."""
    buffer = io.BytesIO()
    with _layout_kept(fig):
        fig.savefig(buffer, format="png", dpi=fig.dpi, bbox_inches="tight", pad_inches=PNG_PAD_INCHES,
                    facecolor=fig.get_facecolor(), edgecolor=fig.get_edgecolor())
    return buffer.getvalue()


@contextlib.contextmanager
def _layout_kept(fig: Figure):
    """Measure or save ``fig`` without changing its layout: a figure drawn with no layout engine
    (a diagram placed by hand) must not leave with the tight layout that ``figure.autolayout``
    would give it, which warns on every later display."""
    engine = fig.get_layout_engine()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_NO_TIGHT_LAYOUT)
        try:
            yield
        finally:
            if engine is None and fig.get_layout_engine() is not None:
                fig.set_layout_engine("none")


_NO_TIGHT_LAYOUT = "This figure includes Axes that are not compatible with tight_layout"


def png_size(data: bytes) -> tuple[int, int]:
    """(width, height) in pixels, read from a PNG's header."""
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("png_size: `data` is not a PNG")
    return struct.unpack(">II", data[16:24])


def _lightness(color) -> float:
    """CIE L* (0 black .. 100 white) of a matplotlib colour: how light it looks in greyscale."""
    from matplotlib.colors import to_rgb

    rgb = np.asarray(to_rgb(color))
    linear = np.where(rgb <= 0.04045, rgb / 12.92, ((rgb + 0.055) / 1.055) ** 2.4)
    y = float(linear @ [0.2126, 0.7152, 0.0722])
    f = y ** (1 / 3) if y > 216 / 24389 else (24389 / 27 * y + 16) / 116
    return 116 * f - 16


def _text_roles(fig: Figure) -> tuple[dict[int, str], set[int]]:
    """(id(text) -> what the text is: tick label, axis label, title or legend (else "text"),
    ids of the tick labels that are not drawn: those of ticks outside the axis's view)."""
    roles: dict[int, str] = {}
    undrawn: set[int] = set()
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            drawn = {id(t) for tick in axis._update_ticks() for t in (tick.label1, tick.label2)}
            for tick in axis.get_major_ticks() + axis.get_minor_ticks():
                for label in (tick.label1, tick.label2):
                    roles[id(label)] = "tick label"
                    if id(label) not in drawn:
                        undrawn.add(id(label))
            roles[id(axis.label)] = "axis label"
            roles[id(axis.get_offset_text())] = "tick label"
        for title in (ax.title, getattr(ax, "_left_title", None), getattr(ax, "_right_title", None)):
            if title is not None:
                roles[id(title)] = "title"
        legend = ax.get_legend()
        if legend is not None:
            for text in legend.get_texts():
                roles[id(text)] = "legend"
            roles[id(legend.get_title())] = "legend"
    for name, role in (("_suptitle", "title"), ("_supxlabel", "axis label"), ("_supylabel", "axis label")):
        text = getattr(fig, name, None)
        if text is not None:
            roles[id(text)] = role
    return roles, undrawn


def _texts(fig: Figure, renderer):
    """(text, role, box on the canvas) for every visible, non-empty text of the figure."""
    from matplotlib.text import Text

    roles, hidden = _text_roles(fig)
    hidden |= {id(t) for ax in fig.axes if not ax.get_visible() for t in ax.findobj(Text)}  # unused panels
    hidden |= {id(t) for ax in fig.axes if not ax.axison  # axes drawn without axis lines (a diagram's board)
               for axis in (ax.xaxis, ax.yaxis) for t in axis.findobj(Text)}
    found = []
    for text in fig.findobj(Text):
        if not text.get_visible() or not text.get_text().strip() or id(text) in hidden:
            continue
        box = text.get_window_extent(renderer)
        if box.width > 0 and box.height > 0:
            found.append((text, roles.get(id(text), "text"), box))
    return found


def _series_styles(ax: Axes):
    """(label, colour, what else tells it apart) for each labelled series of an axes."""
    from matplotlib.collections import PolyCollection
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    handles, labels = ax.get_legend_handles_labels()
    found = []
    for handle, label in zip(handles, labels):
        if isinstance(handle, Line2D):
            marker = handle.get_marker() if handle.get_marker() not in (None, "None", "", " ") else None
            found.append((label, handle.get_color(), ("line", str(handle.get_linestyle()), marker)))
        elif isinstance(handle, Patch):
            found.append((label, handle.get_facecolor(), ("fill", handle.get_hatch())))
        elif isinstance(handle, PolyCollection):
            face = handle.get_facecolor()
            found.append((label, face[0] if len(face) else "none", ("fill", handle.get_hatch())))
    return found


def figure_problems(
    fig: Figure, width_px: float = PAGE_FIGURE_WIDTH_PX, min_pt: float = MIN_TEXT_PT, png_width: int | None = None
) -> list[str]:
    """What makes ``fig`` hard to read on the website; an empty list when nothing does.

    The figure is measured as the notebook stores it (:func:`png_bytes`) and shown at most
    ``width_px`` CSS pixels wide. Reported:

    - text smaller than ``min_pt`` CSS points once shown (per kind: tick labels, axis labels,
      titles, legends, other text), with the size it would need;
    - texts whose boxes overlap (tick labels running into each other, a title over a label);
    - labelled series of one axes that differ only in hue: same line style and marker (or same
      hatch for fills) and a lightness gap under 20 CIE L*, so that they merge in greyscale.

    ``png_width`` is the stored PNG's width when the caller has rendered it already.
    """
    if png_width is None:
        png_width, _ = png_size(png_bytes(fig))
    scale = min(1.0, width_px / png_width)
    with _layout_kept(fig):
        fig.canvas.draw()  # lay the figure out as it was saved (tight layout, ticks)
    renderer = fig.canvas.get_renderer()
    problems = []

    # sizes: points in the figure -> CSS points on the page
    to_page = fig.dpi / _CSS_PX_PER_INCH * scale
    smallest: dict[str, tuple[float, str]] = {}
    texts = _texts(fig, renderer)
    for text, role, _box in texts:
        size = text.get_fontsize() * to_page
        if role not in smallest or size < smallest[role][0]:
            smallest[role] = (size, text.get_text())
    for role, (size, example) in sorted(smallest.items()):
        if size < min_pt - 1e-9:
            needed = min_pt / to_page
            problems.append(
                f"{role} {example!r} is {size:.1f} pt on the page (under {min_pt:g} pt): the figure is "
                f"{png_width} px wide and shown at {min(png_width, width_px):.0f} px; use at least "
                f"{needed:.1f} pt in the figure or make it narrower"
            )

    # overlaps between texts (boxes shrunk by one pixel, so that touching is not overlapping)
    if texts:
        boxes = np.array([[b.x0 + 1, b.y0 + 1, b.x1 - 1, b.y1 - 1] for _, _, b in texts])
        overlap_x = np.minimum(boxes[:, None, 2], boxes[None, :, 2]) > np.maximum(boxes[:, None, 0], boxes[None, :, 0])
        overlap_y = np.minimum(boxes[:, None, 3], boxes[None, :, 3]) > np.maximum(boxes[:, None, 1], boxes[None, :, 1])
        pairs = np.argwhere(np.triu(overlap_x & overlap_y, k=1))
        for i, j in pairs[:5]:
            (a, role_a, _), (b, role_b, _) = texts[i], texts[j]
            problems.append(f"{role_a} {a.get_text()!r} overlaps {role_b} {b.get_text()!r}")
        if len(pairs) > 5:
            problems.append(f"... and {len(pairs) - 5} more overlapping pairs of texts")

    # series that only hue tells apart
    for ax in fig.axes:
        series = _series_styles(ax)
        for (label_a, color_a, kind_a), (label_b, color_b, kind_b) in itertools.combinations(series, 2):
            if kind_a != kind_b:
                continue
            gap = abs(_lightness(color_a) - _lightness(color_b))
            if gap < MIN_LIGHTNESS_GAP:
                problems.append(
                    f"{label_a!r} and {label_b!r} differ only in hue "
                    f"(same {'style' if kind_a[0] == 'line' else 'hatch'}, "
                    f"lightness gap {gap:.0f} L* < {MIN_LIGHTNESS_GAP:g}): give them different line styles, "
                    "markers or hatches"
                )
    return problems


def smallest_text(fig: Figure) -> dict | None:
    """The smallest text of ``fig`` as the notebook stores it: ``{"png_px": its font size in the
    stored PNG's pixels, "role": tick label, axis label, title, legend or text, "text": the text}``;
    None for a figure without text. Shown ``w`` CSS pixels wide, a PNG ``W`` pixels wide shows that
    text ``png_px * w / W`` CSS pixels high (:func:`shown_text_px`)."""
    with _layout_kept(fig):
        fig.canvas.draw()
    found = None
    for text, role, _box in _texts(fig, fig.canvas.get_renderer()):
        size = text.get_fontsize() * fig.dpi / 72.0
        if found is None or size < found["png_px"]:
            found = {"png_px": round(size, 3), "role": role, "text": text.get_text()[:40]}
    return found


def shown_text_px(report: dict, shown_width: float) -> float | None:
    """The font size, in CSS pixels, of a figure's smallest text when its stored PNG is shown
    ``shown_width`` CSS pixels wide; ``report`` is a :func:`figure_report`. None when the report
    was stored before it measured the smallest text, or the figure has none."""
    smallest = report.get("smallest_text")
    if not smallest:
        return None
    return smallest["png_px"] * shown_width / report["png_px"][0]


def figure_report(fig: Figure, width_px: float = PAGE_FIGURE_WIDTH_PX, png: bytes | None = None) -> dict:
    """What :func:`attnbook_tools.notebook.glue` stores with a figure: its stored width, the width it is
    shown at on the website, :func:`figure_problems`, and its :func:`smallest_text` (for the
    website's phone layout, where the figure is shrunk further). ``png``: the figure's
    :func:`png_bytes`, when the caller has them already."""
    png_width, png_height = png_size(png if png is not None else png_bytes(fig))
    return {
        "png_px": [png_width, png_height],
        "page_px": min(png_width, width_px),
        "min_pt": MIN_TEXT_PT,
        "problems": figure_problems(fig, width_px, png_width=png_width),
        "smallest_text": smallest_text(fig),
    }


def legibility_problems(fig: Figure, width_px: float = PAGE_FIGURE_WIDTH_PX) -> list[str]:
    """:func:`figure_problems`, and every text that runs off the figure: for a figure whose texts
    are placed by hand (a diagram), where the stored PNG would otherwise grow to hold a stray label
    and shrink everything else on the page."""
    problems = figure_problems(fig, width_px)
    renderer = fig.canvas.get_renderer()
    inside = fig.bbox.padded(1.0)
    for text, _role, box in _texts(fig, renderer):
        if not (inside.x0 <= box.x0 and box.x1 <= inside.x1 and inside.y0 <= box.y0 and box.y1 <= inside.y1):
            problems.append(f"{text.get_text()!r} runs off the figure")
    return problems

"""The drawing board of every diagram: each box, arrow and grid of cells is drawn and recorded at once.

A diagram function draws only through a :class:`Canvas`. Every call draws on the figure and adds
the same thing to the :class:`Description`, so the description (which a notebook cell prints and
asserts, and from which the alt text is made) lists what the figure shows. :meth:`Canvas.finish`
refuses a figure whose text would be illegible on the page
(:func:`legibility_problems`).

Coordinates are inches: the one axes covers the whole figure with one data unit per inch, so a
layout reads as a page would.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import matplotlib.pyplot as plt
from matplotlib import colormaps
from matplotlib.colors import to_rgb
from matplotlib.collections import PatchCollection
from matplotlib.figure import Figure
from matplotlib.layout_engine import PlaceHolderLayoutEngine
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Rectangle
from matplotlib.text import Text

from attnbook_tools.diagrams.description import Arrow, Box, Description, Grid, _letters, _tuple_text
from attnbook_tools.plots.legibility import (
    COLUMN_INCHES, FIGURE_DPI, MIN_PHONE_TEXT_PX, PHONE_FIGURE_WIDTH_PX, PNG_PAD_INCHES, legibility_problems,
)

__all__ = ["Style", "Canvas", "luminance", "ramp"]

# On a phone a diagram laid out on the page's column (608 px stored) is shown 342 px wide: text of
# SMALL_POINTS (14.6 px in the PNG) is then 8.2 CSS px, just above the 8 px the book requires.
TITLE_POINTS, LABEL_POINTS, SMALL_POINTS = 12.0, 11.0, 10.5
INK = "#1a1a1a"


def luminance(color: str | tuple) -> float:
    """Relative luminance (0 black .. 1 white) of a colour, as WCAG defines it."""
    def linear(c: float) -> float:
        return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4
    r, g, b = (linear(c) for c in to_rgb(color))
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


@dataclass(frozen=True)
class Style:
    """How a box or a cell is filled. Categories that a reader must tell apart differ in lightness
    or in hatching, never in hue alone, and carry a name for the legend."""

    face: str
    hatch: str = ""
    name: str = ""

    @property
    def ink(self) -> str:
        """Text colour that reads on this face: white on dark fills, near-black on light ones."""
        return "#ffffff" if luminance(self.face) < 0.3 else INK


TENSOR = Style("#ffffff", name="tensor")
PARAM = Style("#d9d9d9", name="weights")
OP = Style("#fbe3a3", name="operation")  # light: ops are told apart by rounded corners and labels
_HATCHES = ("", "////", "....", "xxxx", "\\\\\\\\", "++++")


def ramp(n: int, low: float = 0.2, high: float = 0.95) -> list[Style]:
    """``n`` styles of clearly different lightness (cividis, which reads the same with any colour
    vision) and, from the second on, different hatching; for categories such as heads or tiles."""
    cmap = colormaps["cividis"]
    stops = [high] if n == 1 else [low + (high - low) * i / (n - 1) for i in range(n)]
    return [Style(_hex(cmap(s)), _HATCHES[i % len(_HATCHES)]) for i, s in enumerate(stops)]


def _hex(rgba) -> str:
    return "#" + "".join(f"{round(255 * c):02x}" for c in rgba[:3])


class Canvas:
    """A figure ``width`` x ``height`` inches with a title, on which every drawn box, arrow and
    grid is also recorded for the :class:`Description`. The width is the page's column
    (:data:`attnbook_tools.plots.COLUMN_INCHES`) unless given: the figure is then shown at its own size,
    and its points are the page's."""

    def __init__(self, where: str, title: str, height: float, width: float = COLUMN_INCHES) -> None:
        self.where, self.title = where, title
        self.width, self.height = width, height
        self.fig = plt.figure(figsize=(width, height), dpi=FIGURE_DPI, layout="none")
        # An explicit "no layout" engine: with no engine at all, every save with bbox_inches="tight"
        # hands the figure matplotlib's tight layout (figure.autolayout), which warns on a canvas.
        self.fig.set_layout_engine(PlaceHolderLayoutEngine(adjust_compatible=True, colorbar_gridspec=True))
        ax = self.fig.add_axes((0.0, 0.0, 1.0, 1.0))
        ax.set_xlim(0, width)
        ax.set_ylim(0, height)
        ax.axis("off")
        self.ax = ax
        self.boxes: dict[str, Box] = {}
        self.arrows: list[Arrow] = []
        self.grids: dict[str, Grid] = {}
        self._frames: dict[str, tuple[float, float, float, float]] = {}  # name -> x0, y0, w, h
        self._inside: list[tuple[Text, float]] = []  # texts that must fit in a box or cell this wide
        self._labels_inside: set[str] = set()  # frames that hold free text on purpose (a frame around a group)
        self.text(width / 2, height - 0.08, title, size=TITLE_POINTS, weight="bold", va="top")

    # ------------------------------------------------------------------ primitives
    def text(self, x: float, y: float, s: str, *, size: float = LABEL_POINTS, ha: str = "center",
             va: str = "center", color: str = INK, **kwargs) -> Text:
        return self.ax.text(x, y, s, fontsize=size, ha=ha, va=va, color=color, **kwargs)

    def box(self, name: str, label: str, center: tuple[float, float], size: tuple[float, float], *,
            shape: Sequence[int] | None = None, letters: str | Sequence[str] | None = None,
            kind: str = "tensor", style: Style | None = None, show_shape: bool = True,
            record: bool = True, tex: str | None = None, compact: bool = False) -> Box:
        """Draw a box with its label and, below it, the shape in letters and in numbers; record it
        (unless ``record`` is False: a part of a tensor that is recorded whole). ``tex`` is drawn in
        place of the label (mathtext such as ``$q = x W_q^\\top$``); the description keeps the label.
        ``compact`` writes the shape on one line, ``(B, L, E) = (2, 5, 16)``.

        ``kind`` is "tensor" (square corners, white), "param" (square, grey) or "op" (rounded)."""
        shape = None if shape is None else tuple(int(n) for n in shape)
        letters = _letters(letters)
        if shape is not None and letters is not None and len(shape) != len(letters):
            raise ValueError(f"{self.where}: box {name!r} has shape {shape} but letters {letters}")
        if name in self._frames:
            raise ValueError(f"{self.where}: two boxes are named {name!r}")
        style = style or {"tensor": TENSOR, "param": PARAM, "op": OP}[kind]
        (cx, cy), (w, h) = center, size
        corner = "round,pad=0,rounding_size=0.08" if kind == "op" else "square,pad=0"
        self.ax.add_artist(FancyBboxPatch((cx - w / 2, cy - h / 2), w, h, boxstyle=corner, facecolor=style.face,
                                         edgecolor=INK, linewidth=1.0, hatch=style.hatch or None))
        box = Box(name, label, shape, letters, kind)
        lines = [(tex or label, LABEL_POINTS)]
        if show_shape and compact and box.shape_text():
            lines.append((box.shape_text(), SMALL_POINTS))
        elif show_shape:
            lines += [(_tuple_text(x), SMALL_POINTS) for x in (letters, shape) if x is not None]
        gaps = [0.2 if "$" in line else 0.16 for line, _ in lines[:-1]]  # mathtext stands taller
        y = cy + sum(gaps) / 2
        for i, (line, size_pt) in enumerate(lines):
            self._inside.append((self.text(cx, y, line, size=size_pt, color=style.ink), w))
            y -= gaps[i] if i < len(gaps) else 0.0
        if record:
            self.boxes[name] = box
        self._frames[name] = (cx - w / 2, cy - h / 2, w, h)
        return box

    def tensor_label(self, name: str, label: str, x: float, y: float, *, shape: Sequence[int],
                     letters: str | Sequence[str], ha: str = "center", va: str = "center") -> Box:
        """Write the label over ``(letters) = (shape)`` at (x, y), for a tensor drawn as cells or as one
        box per position; record it as one box."""
        if name in self.boxes:
            raise ValueError(f"{self.where}: two boxes are named {name!r}")
        record = Box(name, label, tuple(int(n) for n in shape), _letters(letters), "tensor")
        self.text(x, y, f"{label}\n{record.shape_text()}", size=SMALL_POINTS, ha=ha, va=va, linespacing=1.3)
        self.boxes[name] = record
        return record

    def frame(self, name: str, x0: float, y0: float, w: float, h: float) -> None:
        """Make a region (for example one cell of a grid) a target for :meth:`arrow`."""
        self._frames[name] = (x0, y0, w, h)

    def _anchor(self, end: str | tuple[float, float], toward: tuple[float, float]) -> tuple[float, float]:
        if not isinstance(end, str):
            return end
        x0, y0, w, h = self._frames[end]
        cx, cy = x0 + w / 2, y0 + h / 2
        dx, dy = toward[0] - cx, toward[1] - cy
        if dx == 0 and dy == 0:
            return cx, cy
        t = min(w / 2 / abs(dx) if dx else math.inf, h / 2 / abs(dy) if dy else math.inf)
        return cx + t * dx, cy + t * dy

    def _center(self, end: str | tuple[float, float]) -> tuple[float, float]:
        if not isinstance(end, str):
            return end
        x0, y0, w, h = self._frames[end]
        return x0 + w / 2, y0 + h / 2

    def arrow(self, start: str | tuple[float, float], end: str | tuple[float, float], *, label: str = "",
              strength: float | None = None, label_xy: tuple[float, float] | None = None,
              record_as: tuple[str, str] | None = None, record: bool = True, rad: float = 0.0,
              color: str = INK, label_ha: str = "center") -> Arrow:
        """Draw an arrow between two boxes (edge to edge) or points; a ``strength`` in [0, 1] sets
        its width. ``label`` is written at ``label_xy`` (default: the middle), aligned by ``label_ha``. ``record_as`` names
        the two ends in the description when they are points; ``record=False`` draws one of many
        arrows that :meth:`link` records as one."""
        a = self._anchor(start, self._center(end))
        b = self._anchor(end, self._center(start))
        width = 1.0 if strength is None else 0.4 + 3.6 * strength
        self.ax.add_artist(FancyArrowPatch(a, b, arrowstyle="-|>", mutation_scale=9 + 3 * (width > 2),
                                          linewidth=width, color=color, shrinkA=1, shrinkB=1,
                                          connectionstyle=f"arc3,rad={rad}"))
        if label:
            x, y = label_xy or ((a[0] + b[0]) / 2, (a[1] + b[1]) / 2)
            self.text(x, y, label, size=SMALL_POINTS, ha=label_ha,
                      bbox={"boxstyle": "square,pad=0.1", "facecolor": "white", "edgecolor": "none"})
        names = record_as or tuple(s if isinstance(s, str) else f"({s[0]:.1f}, {s[1]:.1f})" for s in (start, end))
        arrow = Arrow(names[0], names[1], label, None if strength is None else float(strength))
        if record:
            self.arrows.append(arrow)
        return arrow

    def link(self, start: str, end: str, label: str = "") -> Arrow:
        """Record one arrow for a bundle drawn with ``arrow(..., record=False)`` (one per position)."""
        arrow = Arrow(start, end, label)
        self.arrows.append(arrow)
        return arrow

    def cells(self, name: str, top_left: tuple[float, float], cell: tuple[float, float],
              values: Sequence[Sequence[Any]], styles: Mapping[Any, Style], *,
              meaning: Mapping[Any, str], symbols: Mapping[Any, str],
              rows: Sequence[str] | None = None, cols: Sequence[str] | None = None,
              texts: Sequence[Sequence[str]] | None = None, record: bool = True) -> Grid:
        """Draw a grid of cells styled by value (row 0 at the top); record it as a :class:`Grid`.

        ``texts`` writes a string into each cell; ``rows``/``cols`` name the rows and columns in the
        description (draw visible labels with :meth:`text`)."""
        x0, y0 = top_left
        w, h = cell
        groups: dict[Style, list[Rectangle]] = {}  # one collection per style: fast to draw
        for i, row in enumerate(values):
            for j, value in enumerate(row):
                style = styles[value]
                groups.setdefault(style, []).append(Rectangle((x0 + j * w, y0 - (i + 1) * h), w, h))
                if texts is not None and texts[i][j]:
                    t = self.text(x0 + (j + 0.5) * w, y0 - (i + 0.5) * h, texts[i][j], size=SMALL_POINTS,
                                  color=style.ink)
                    self._inside.append((t, w))
        for style, rects in groups.items():
            self.ax.add_collection(PatchCollection(rects, facecolor=style.face, edgecolor=INK, linewidth=0.6,
                                                   hatch=style.hatch or None), autolim=False)
        grid = self.record_grid(name, values, meaning=meaning, symbols=symbols, rows=rows, cols=cols,
                                record=record)
        self.frame(name, x0, y0 - len(values) * h, w * (len(values[0]) if values else 0), len(values) * h)
        return grid

    def record_grid(self, name: str, values: Sequence[Sequence[Any]], *, meaning: Mapping[Any, str],
                    symbols: Mapping[Any, str], rows: Sequence[str] | None = None,
                    cols: Sequence[str] | None = None, record: bool = True) -> Grid:
        """Record a grid drawn another way (for example one row standing for L identical rows)."""
        grid = Grid(name, tuple(tuple(r) for r in values),
                    tuple(rows if rows is not None else (str(i) for i in range(len(values)))),
                    tuple(cols if cols is not None else (str(j) for j in range(len(values[0]) if values else 0))),
                    dict(meaning), dict(symbols))
        if record:
            self.grids[name] = grid
        return grid

    def legend(self, items: Sequence[Style], x: float, y: float, *, gap: float = 0.25) -> float:
        """Swatches with their names in one row starting at (x, y); returns the x where it ends."""
        for style in items:
            self.ax.add_artist(Rectangle((x, y - 0.08), 0.22, 0.16, facecolor=style.face, edgecolor=INK,
                                         linewidth=0.6, hatch=style.hatch or None))
            t = self.text(x + 0.3, y, style.name, size=SMALL_POINTS, ha="left")
            x += 0.3 + self._width(t) + gap
        return x

    def _width(self, t: Text) -> float:
        """A text's width in inches (data units)."""
        renderer = self.fig.canvas.get_renderer()
        return t.get_window_extent(renderer).width / self.fig.dpi

    def _phone_problems(self) -> list[str]:
        """Text that a phone, which shows the stored PNG (the canvas and its margins) at most
        PHONE_FIGURE_WIDTH_PX CSS pixels wide, would draw under MIN_PHONE_TEXT_PX."""
        png_px = (self.width + 2 * PNG_PAD_INCHES) * FIGURE_DPI
        shown = min(1.0, PHONE_FIGURE_WIDTH_PX / png_px)
        problems = []
        for t in self.ax.texts:
            if t.get_visible() and t.get_text().strip():
                size = t.get_fontsize() * FIGURE_DPI / 72.0 * shown
                if size < MIN_PHONE_TEXT_PX - 1e-9:
                    problems.append(f"{t.get_text()!r} is {size:.1f} CSS px on a phone (under {MIN_PHONE_TEXT_PX:g})")
        return problems

    def _overlaps(self, renderer) -> list[str]:
        """A label written over a box, cell or arrow it does not belong to: every text must lie
        inside the box it was written in (recorded by ``_inside``) or clear of every box."""
        inside = {id(t) for t, _ in self._inside}
        problems = []
        to_inches = self.fig.dpi
        for t in self.ax.texts:
            if id(t) in inside or not t.get_visible() or not t.get_text().strip():
                continue
            box = t.get_window_extent(renderer)
            x0, y0, x1, y1 = (box.x0 / to_inches, box.y0 / to_inches, box.x1 / to_inches, box.y1 / to_inches)
            for name, (fx, fy, fw, fh) in self._frames.items():
                if name in self._labels_inside:
                    continue
                if min(x1, fx + fw) - max(x0, fx) > 0.02 and min(y1, fy + fh) - max(y0, fy) > 0.02:
                    problems.append(f"{t.get_text()!r} overlaps {name!r}")
        return problems

    # ------------------------------------------------------------------ the result
    def finish(self, summary: str, facts: Mapping[str, Any] | None = None) -> tuple[Figure, Description]:
        """Check that every text is legible at the column width and return ``(figure, description)``."""
        problems = legibility_problems(self.fig)
        renderer = self.fig.canvas.get_renderer()
        for t, width in self._inside:
            if t.get_window_extent(renderer).width / self.fig.dpi > width - 0.04:
                problems.append(f"{t.get_text()!r} is wider than its box or cell")
        problems += self._phone_problems()
        problems += self._overlaps(renderer)
        if problems:
            plt.close(self.fig)
            raise ValueError(f"{self.where}: the diagram would not be legible at the book's column width "
                             f"({len(problems)} problem(s), e.g. {problems[0]}); draw fewer or shorter items")
        return self.fig, Description(self.title, summary, dict(self.boxes), list(self.arrows),
                                     dict(self.grids), dict(facts or {}))

"""The drawing board of every diagram: each box, arrow and grid of cells is drawn and recorded at once.

A diagram function draws only through a :class:`Canvas`. Every call draws on the figure and adds
the same thing to the :class:`Description`, so the description (which a notebook cell prints and
asserts, and from which the alt text is made) lists what the figure shows. :meth:`Canvas.finish`
refuses a figure whose text would be illegible at the book's column width
(:func:`legibility_problems`).

Coordinates are inches: the one axes covers the whole figure with one data unit per inch, so a
layout reads as a page would.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import matplotlib.pyplot as plt
import torch
from matplotlib import colormaps
from matplotlib.colors import to_rgb
from matplotlib.collections import PatchCollection
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Rectangle
from matplotlib.text import Text

__all__ = [
    "COLUMN_INCHES", "MIN_POINTS", "Style", "Box", "Arrow", "Grid", "Description", "Canvas",
    "legibility_problems", "luminance", "ramp",
]

COLUMN_INCHES = 7.2  # the book's text column, about 720 px at the figures' 100 dpi
MIN_POINTS = 8.0  # the smallest font a figure may show at the column width
TITLE_POINTS, LABEL_POINTS, SMALL_POINTS = 11.0, 9.0, 8.0
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


def _letters(letters: str | Sequence[str] | None) -> tuple[str, ...] | None:
    if letters is None:
        return None
    if isinstance(letters, str):
        return tuple(part.strip() for part in letters.strip("()").split(","))
    return tuple(letters)


def _tuple_text(items: Sequence) -> str:
    return "(" + ", ".join(str(i) for i in items) + ("," if len(items) == 1 else "") + ")"


@dataclass(frozen=True)
class Box:
    """A labelled box: a tensor (with its real shape and the shape's letters), a weight matrix or
    an operation."""

    name: str
    label: str
    shape: tuple[int, ...] | None = None
    letters: tuple[str, ...] | None = None
    kind: str = "tensor"

    def shape_text(self) -> str:
        """``(B, H, L, D) = (2, 4, 5, 4)``, or just one of the two."""
        parts = [_tuple_text(x) for x in (self.letters, self.shape) if x is not None]
        return " = ".join(parts)

    def spec(self) -> str:
        """The label and the shape: ``q (B, H, L, D) = (2, 4, 5, 4)``."""
        return f"{self.label} {self.shape_text()}".strip()


@dataclass(frozen=True)
class Arrow:
    """An arrow from one box (or point) to another; ``strength`` is drawn as its width."""

    start: str
    end: str
    label: str = ""
    strength: float | None = None


@dataclass(frozen=True)
class Grid:
    """A grid of cells, one value per cell (for example True where a query may attend); ``meaning``
    says what each value stands for, ``symbols`` how the text rendering writes it."""

    name: str
    values: tuple[tuple[Any, ...], ...]
    rows: tuple[str, ...]
    cols: tuple[str, ...]
    meaning: Mapping[Any, str]
    symbols: Mapping[Any, str]

    @property
    def shape(self) -> tuple[int, int]:
        return len(self.values), len(self.values[0]) if self.values else 0

    def as_tensor(self) -> torch.Tensor:
        """The values as a tensor (bool, int or float)."""
        return torch.tensor([list(row) for row in self.values])

    def text(self) -> str:
        legend = ", ".join(f"{self.symbols[v]} {m}" for v, m in self.meaning.items())
        width = max((len(r) for r in self.rows), default=0)
        lines = [f"{self.name} {self.shape[0]} x {self.shape[1]} ({legend}):"]
        for label, row in zip(self.rows, self.values):
            lines.append(f"  {label:>{width}} " + " ".join(self.symbols[v] for v in row))
        return "\n".join(lines)


@dataclass
class Description:
    """What a diagram draws, as data: assert it in a notebook cell, print it as the cell's output
    (nbval compares that text; it never compares images), and use :meth:`alt_text` as the figure's
    alt text."""

    title: str
    summary: str
    boxes: dict[str, Box] = field(default_factory=dict)
    arrows: list[Arrow] = field(default_factory=list)
    grids: dict[str, Grid] = field(default_factory=dict)
    facts: dict[str, Any] = field(default_factory=dict)

    def alt_text(self) -> str:
        """One line for the figure's ``:alt:``: the title, what it shows, and every shape drawn."""
        shapes = "; ".join(b.spec() for b in self.boxes.values() if b.shape)
        text = f"Diagram: {self.title}. {self.summary}"
        return f"{text} Shapes: {shapes}." if shapes else text

    def text(self) -> str:
        lines = [f"diagram: {self.title}"]
        if self.boxes:
            lines.append("boxes:")
            width = max(len(b.name) for b in self.boxes.values())
            lines += [f"  {b.name:<{width}}  {b.spec()}" for b in self.boxes.values()]
        if self.arrows:
            lines.append("arrows:")
            for a in self.arrows:
                extra = "" if a.strength is None else f" (strength {a.strength:.2f})"
                lines.append(f"  {a.start} -> {a.end}" + (f": {a.label}" if a.label else "") + extra)
        lines += [g.text() for g in self.grids.values()]
        for key, value in self.facts.items():
            if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
                lines.append(f"{key}:")  # a table: one row a line
                lines += ["  " + ", ".join(f"{k} {_fact(v)}" for k, v in row.items()) for row in value]
            else:
                lines.append(f"{key}: {_fact(value)}")
        lines.append(f"alt text: {self.alt_text()}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.text()


def _fact(value: Any) -> str:
    if isinstance(value, range):
        return f"{value.start}-{value.stop - 1}"
    if isinstance(value, float):
        return f"{value:.4f}"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_fact(v)}" for k, v in value.items()) + "}"
    return str(value)


def _visible_texts(fig: Figure) -> list[Text]:
    texts: list[Text] = list(fig.texts)
    for ax in fig.axes:
        texts += list(ax.texts) + [ax.title, ax._left_title, ax._right_title]
        if ax.axison:
            texts += [ax.xaxis.label, ax.yaxis.label]
            texts += list(ax.get_xticklabels()) + list(ax.get_yticklabels())
        legend = ax.get_legend()
        if legend is not None:
            texts += list(legend.get_texts()) + [legend.get_title()]
    return [t for t in texts if t.get_visible() and t.get_text().strip()]


def legibility_problems(fig: Figure, *, column_inches: float = COLUMN_INCHES,
                        min_points: float = MIN_POINTS) -> list[str]:
    """Every reason ``fig`` would be hard to read on a page whose column is ``column_inches`` wide:
    a text smaller than ``min_points`` once a wider figure is scaled down to the column, two texts
    that overlap or come closer than 2 px, a text that runs off the figure. Draws the figure to
    measure the texts.

    Works on any matplotlib figure (tick labels and legends included).
    """
    fig.draw_without_rendering()  # lays out every text (tick labels included) without rasterising
    renderer = fig.canvas.get_renderer()
    scale = min(1.0, column_inches / fig.get_figwidth())
    texts = _visible_texts(fig)
    problems = []
    for t in texts:
        if t.get_fontsize() * scale < min_points - 1e-9:
            problems.append(f"{t.get_text()!r} is {t.get_fontsize() * scale:.1f} pt at the column width "
                            f"(at least {min_points:g} pt)")
    boxes = [t.get_window_extent(renderer) for t in texts]
    inside = fig.bbox.padded(1.0)
    for t, b in zip(texts, boxes):
        if not (inside.x0 <= b.x0 and b.x1 <= inside.x1 and inside.y0 <= b.y0 and b.y1 <= inside.y1):
            problems.append(f"{t.get_text()!r} runs off the figure")
    for i in range(len(texts)):
        for j in range(i + 1, len(texts)):
            a, b = boxes[i], boxes[j]
            if min(a.x1, b.x1) - max(a.x0, b.x0) > -2 and min(a.y1, b.y1) - max(a.y0, b.y0) > -2:
                problems.append(f"{texts[i].get_text()!r} overlaps {texts[j].get_text()!r}")
    return problems


class Canvas:
    """A figure ``width`` x ``height`` inches with a title, on which every drawn box, arrow and
    grid is also recorded for the :class:`Description`."""

    def __init__(self, where: str, title: str, width: float, height: float) -> None:
        self.where, self.title = where, title
        self.width, self.height = width, height
        self.fig = plt.figure(figsize=(width, height), layout="none")
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
              color: str = INK) -> Arrow:
        """Draw an arrow between two boxes (edge to edge) or points; a ``strength`` in [0, 1] sets
        its width. ``label`` is written at ``label_xy`` (default: the middle). ``record_as`` names
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
            self.text(x, y, label, size=SMALL_POINTS,
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

    # ------------------------------------------------------------------ the result
    def finish(self, summary: str, facts: Mapping[str, Any] | None = None) -> tuple[Figure, Description]:
        """Check that every text is legible at the column width and return ``(figure, description)``."""
        problems = legibility_problems(self.fig)
        renderer = self.fig.canvas.get_renderer()
        for t, width in self._inside:
            if t.get_window_extent(renderer).width / self.fig.dpi > width - 0.04:
                problems.append(f"{t.get_text()!r} is wider than its box or cell")
        if problems:
            plt.close(self.fig)
            raise ValueError(f"{self.where}: the diagram would not be legible at the book's column width "
                             f"({len(problems)} problem(s), e.g. {problems[0]}); draw fewer or shorter items")
        return self.fig, Description(self.title, summary, dict(self.boxes), list(self.arrows),
                                     dict(self.grids), dict(facts or {}))

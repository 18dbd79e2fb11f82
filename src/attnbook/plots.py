"""Figures for the book. Every function returns a matplotlib Figure and never calls plt.show().

Palettes: :data:`PALETTE` (the Okabe-Ito colours, colour-blind safe) for lines, paired with
:data:`LINESTYLES` so that two series never differ in hue alone; "cividis" for heatmaps (its
lightness grows monotonically, so it reads in greyscale too).

Legibility: a figure is shown on the website at most :data:`PAGE_FIGURE_WIDTH_PX` CSS pixels wide,
scaled down when its PNG is wider. :func:`figure_problems` reports every text that would then be
smaller than :data:`MIN_TEXT_PT`, every pair of texts that overlap, and every pair of labelled
series that differ only in hue; :func:`attnbook.notebook.glue` stores that report with each
figure, and the book's tests require it to be empty.

Seeds: :func:`accuracy_by_length` and :func:`loss_curves` take one run per name, or a list of runs
(one per seed) that they draw as the mean with a min-max band (:func:`plot_runs`).

Shapes:
    heatmap: weights (L, S) -> a figure with L rows (y_labels) and S columns (x_labels)
"""

from __future__ import annotations

import contextlib
import io
import itertools
import struct
import warnings
from collections.abc import Mapping, Sequence

import matplotlib.pyplot as plt
import numpy as np
import seaborn as sns
from cycler import cycler
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

__all__ = [
    "heatmap", "accuracy_by_length", "loss_curves", "plot_runs", "figure_problems", "png_bytes",
    "figure_report", "png_size", "style_cycle", "PALETTE", "LINESTYLES", "MARKERS", "PAGE_FIGURE_WIDTH_PX",
    "MIN_TEXT_PT",
]

# The widest a figure is shown on the website, in CSS pixels: the article column of the narrowest
# desktop layout (a 1200-pixel window with both sidebars), measured in Chromium;
# tests/browser/test_layout.py measures it again and fails when the theme changes it.
PAGE_FIGURE_WIDTH_PX = 608
MIN_TEXT_PT = 8.0  # smallest text size on the page, in CSS points (1 pt = 1/72 in = 4/3 CSS px)
_CSS_PX_PER_INCH = 96.0
MIN_LIGHTNESS_GAP = 20.0  # CIE L*: two fills this far apart stay apart in greyscale

# Okabe & Ito's colour-blind-safe colours, ordered so that the first four also differ in lightness
# from their neighbours (CIE L* 46, 71, 0, 70): two or three filled series stay apart in greyscale.
PALETTE = ["#0072B2", "#E69F00", "#000000", "#56B4E9", "#D55E00", "#F0E442", "#009E73", "#CC79A7"]
LINESTYLES = ["-", "--", ":", "-.", (0, (5, 1, 1, 1, 1, 1)), (0, (1, 3)), (0, (8, 2)), (0, (3, 1, 1, 1))]
MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*"]


def style_cycle() -> cycler:
    """The book's property cycle: each series gets its own colour and its own line style."""
    return cycler(color=PALETTE) + cycler(linestyle=LINESTYLES)


def _style(index: int) -> dict:
    return {"color": PALETTE[index % len(PALETTE)], "linestyle": LINESTYLES[index % len(LINESTYLES)],
            "marker": MARKERS[index % len(MARKERS)]}


def _as_2d_array(weights, where: str) -> np.ndarray:
    try:
        array = np.asarray(weights.detach().cpu() if hasattr(weights, "detach") else weights, dtype=float)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{where}: `weights` must be a 2-D tensor or array of numbers; got "
                        f"{type(weights).__name__}") from exc
    if array.ndim != 2:
        raise ValueError(f"{where}: `weights` must be 2-D (L, S); got shape {array.shape}")
    return array


def heatmap(
    weights,
    x_labels: Sequence[str] | None = None,
    y_labels: Sequence[str] | None = None,
    ax: Axes | None = None,
    title: str = "Attention weights",
    xlabel: str = "source token (key)",
    ylabel: str = "output step (query)",
    cmap: str = "cividis",
    annotate: bool = False,
    vmax: float | None = 1.0,
) -> Figure:
    """Draw attention weights as a heatmap: one row per query, one column per key.

    Args:
        weights: a 2-D tensor or array (L, S), e.g. one output's weights from greedy decoding.
        x_labels, y_labels: the tokens along the columns (S) and rows (L).
        ax: draw into this axes; a new figure is made when None.
        annotate: write each weight into its cell (for small examples).
        vmax: top of the colour scale (1.0 by default, so heatmaps compare across figures).

    Shapes:
        weights (L, S), x_labels S strings, y_labels L strings
    """
    array = _as_2d_array(weights, "heatmap")
    L, S = array.shape
    for name, labels, n in (("x_labels", x_labels, S), ("y_labels", y_labels, L)):
        if labels is not None and len(labels) != n:
            raise ValueError(f"heatmap: `{name}` must have {n} entries to match `weights` of shape "
                             f"{array.shape}; got {len(labels)}")
    if ax is None:  # at most 6 inches wide, so that the text stays legible on the page
        cell = (0.6, 0.4) if annotate else (0.3, 0.28)  # inches per column and per row
        fig, ax = plt.subplots(figsize=(min(6.0, max(3.0, cell[0] * S + 1.8)), min(5.0, max(2.5, cell[1] * L + 1.2))))
    else:
        fig = ax.figure
    sns.heatmap(
        array, ax=ax, cmap=cmap, vmin=0.0, vmax=vmax, square=False, annot=annotate,
        fmt=".2f" if annotate else "",
        xticklabels=list(x_labels) if x_labels is not None else "auto",
        yticklabels=list(y_labels) if y_labels is not None else "auto",
        cbar_kws={"label": "weight"},
    )
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.tick_params(axis="x", labelrotation=0)
    ax.tick_params(axis="y", labelrotation=0)
    _thin_ticklabels(ax)
    return fig


def _thin_ticklabels(ax: Axes) -> None:
    """Label every k-th tick of each axis, with the smallest k at which the labels do not overlap."""
    renderer = ax.figure.canvas.get_renderer()
    for axis, along in ((ax.xaxis, 0), (ax.yaxis, 1)):
        labels = [t for t in axis.get_ticklabels() if t.get_text()]
        if len(labels) < 2:
            continue
        boxes = [t.get_window_extent(renderer) for t in labels]
        for step in range(1, len(labels)):
            kept = boxes[::step]
            gaps = [(b.x0 - a.x1) if along == 0 else (a.y0 - b.y1) for a, b in zip(kept, kept[1:])]
            if along == 1 and gaps and gaps[0] < 0:  # y tick labels may run downwards
                gaps = [b.y0 - a.y1 for a, b in zip(kept, kept[1:])]
            if min(gaps) >= 2:
                break
        for index, label in enumerate(labels):
            label.set_visible(index % step == 0)


def plot_runs(ax: Axes, x, runs, label: str, index: int = 0, spread: str = "band", markersize: float = 4):
    """Draw one series that was measured once per seed: the mean over the runs as a line, and the
    spread between seeds as a min-max band (``spread="band"``), every run as a thin line
    (``"runs"``), or both (``"both"``). One run is drawn as a plain line.

    ``index`` picks the series' colour, line style and marker from the book's palette.

    Shapes:
        x (N,), runs (R, N) or (N,) -> one line of N points (the mean over the R runs)
    """
    if spread not in ("band", "runs", "both"):
        raise ValueError(f"plot_runs: `spread` must be 'band', 'runs' or 'both'; got {spread!r}")
    values = np.asarray(runs, dtype=float)
    x = np.asarray(x, dtype=float)
    if values.ndim == 1:
        values = values[None, :]
    if values.ndim != 2 or values.shape[1] != x.shape[0]:
        raise ValueError(f"plot_runs: `runs` must be (R, N) or (N,) with N = len(x) = {x.shape[0]}; "
                         f"got shape {np.asarray(runs, dtype=float).shape}")
    style = _style(index)
    n_runs = values.shape[0]
    if n_runs == 1:
        shown = label
    elif spread == "runs":
        shown = f"{label} (mean; thin: each of {n_runs} seeds)"
    else:
        shown = f"{label} (mean; band: lowest to highest of {n_runs} seeds)"
    line, = ax.plot(x, values.mean(axis=0), label=shown, markersize=markersize, **style)
    if n_runs > 1 and spread in ("band", "both"):  # the band has the line's colour; the line's label names it
        ax.fill_between(x, values.min(axis=0), values.max(axis=0), color=style["color"], alpha=0.2,
                        linewidth=0)
    if n_runs > 1 and spread in ("runs", "both"):
        for run in values:
            ax.plot(x, run, color=style["color"], linestyle=style["linestyle"], linewidth=0.6, alpha=0.6)
    return line


def _runs(value, keys: Sequence[str]):
    """One evaluation (an object or a dict with the given keys) or a list of them -> a list."""
    if isinstance(value, Mapping) or any(hasattr(value, k) for k in keys):
        return [value]
    return list(value)


def _get(evaluation, key):
    return evaluation[key] if isinstance(evaluation, Mapping) else getattr(evaluation, key)


def accuracy_by_length(
    results: Mapping[str, object],
    metric: str = "exact",
    ax: Axes | None = None,
    title: str = "Exact-match accuracy against source length",
    ylabel: str | None = None,
    spread: str = "band",
) -> Figure:
    """Accuracy against source length, one line per model.

    Args:
        results: model name -> an :class:`attnbook.train.Evaluation` (or anything with
            ``lengths`` and ``exact``/``token`` lists, or such a dict), or a list of them, one per
            seed: then the line is the mean over the seeds and ``spread`` says how the seeds'
            spread is shown (see :func:`plot_runs`).
        metric: "exact" (whole output right) or "token" (per-token accuracy).

    Shapes:
        each result: lengths (N,), values (N,)
    """
    if metric not in ("exact", "token"):
        raise ValueError(f"accuracy_by_length: `metric` must be 'exact' or 'token'; got {metric!r}")
    if not isinstance(results, Mapping) or not results:
        raise ValueError("accuracy_by_length: `results` must be a non-empty dict of name -> evaluation; "
                         f"got {type(results).__name__}")
    if ax is None:
        fig, ax = plt.subplots(figsize=(6.4, 3.8))
    else:
        fig = ax.figure
    for index, (name, value) in enumerate(results.items()):
        runs = _runs(value, ("lengths", metric))
        lengths = _get(runs[0], "lengths")
        if any(list(_get(run, "lengths")) != list(lengths) for run in runs):
            raise ValueError(f"accuracy_by_length: the runs of {name!r} were evaluated on different lengths")
        plot_runs(ax, lengths, [_get(run, metric) for run in runs], name, index=index, spread=spread)
    ax.set_ylim(-0.03, 1.03)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_title(title)
    ax.set_xlabel("source length (digits)")
    ax.set_ylabel(ylabel or ("exact-match accuracy" if metric == "exact" else "token accuracy"))
    ax.legend(frameon=False)
    return fig


def loss_curves(
    losses: Mapping[str, Sequence[float]],
    every: int = 1,
    ax: Axes | None = None,
    title: str = "Training loss",
    window: int = 1,
    spread: str = "band",
) -> Figure:
    """Training loss against step, one line per run; ``every`` is the step spacing of the
    stored losses and ``window`` a running-mean width in stored points. A name may map to a list
    of runs (one per seed, of equal length): the line is then their mean, with their spread
    (see :func:`plot_runs`).

    Shapes:
        each run: losses (N,) -> one line of N - window + 1 points
    """
    if not isinstance(losses, Mapping) or not losses:
        raise ValueError("loss_curves: `losses` must be a non-empty dict of name -> list of losses")
    if ax is None:
        fig, ax = plt.subplots(figsize=(6.4, 3.6))
    else:
        fig = ax.figure
    for index, (name, values) in enumerate(losses.items()):
        runs = np.asarray(values, dtype=float)
        runs = runs[None, :] if runs.ndim == 1 else runs
        if window > 1:
            runs = np.stack([np.convolve(run, np.ones(window) / window, mode="valid") for run in runs])
        steps = np.arange(runs.shape[1]) * every + every * (window - 1)
        plot_runs(ax, steps, runs, name, index=index, spread=spread, markersize=0)
    ax.set_title(title)
    ax.set_xlabel("training step")
    ax.set_ylabel("cross-entropy loss")
    ax.set_yscale("log")
    ax.legend(frameon=False)
    return fig


# --- legibility ------------------------------------------------------------------------------


def png_bytes(fig: Figure) -> bytes:
    """The figure as the notebook stores it: a PNG at the figure's dpi, cropped to its content
    (what IPython's inline backend and ``glue`` write)."""
    buffer = io.BytesIO()
    with _layout_kept(fig):
        fig.savefig(buffer, format="png", dpi=fig.dpi, bbox_inches="tight",
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


def figure_report(fig: Figure, width_px: float = PAGE_FIGURE_WIDTH_PX, png: bytes | None = None) -> dict:
    """What :func:`attnbook.notebook.glue` stores with a figure: its stored width, the width it is
    shown at on the website, and :func:`figure_problems`. ``png``: the figure's
    :func:`png_bytes`, when the caller has them already."""
    png_width, png_height = png_size(png if png is not None else png_bytes(fig))
    return {
        "png_px": [png_width, png_height],
        "page_px": min(png_width, width_px),
        "min_pt": MIN_TEXT_PT,
        "problems": figure_problems(fig, width_px, png_width=png_width),
    }

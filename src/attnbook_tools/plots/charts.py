"""The book's charts: attention heatmaps, accuracy against length, loss curves, seed spreads.

Every function returns a matplotlib Figure and never calls plt.show().

Palettes: :data:`PALETTE` (the Okabe-Ito colours, colour-blind safe) for lines, paired with
:data:`LINESTYLES` so that two series never differ in hue alone; "cividis" for heatmaps (its
lightness grows monotonically, so it reads in greyscale too).

Seeds: :func:`accuracy_by_length` and :func:`loss_curves` take one run per name, or a list of runs
(one per seed) that they draw as the mean with a min-max band (:func:`plot_runs`).

Shapes:
    heatmap: weights (L, S) -> a figure with L rows (y_labels) and S columns (x_labels)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import matplotlib.pyplot as plt
import numpy as np
import seaborn as sns
from cycler import cycler
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.axis import Axis
from matplotlib.ticker import LogFormatter, MaxNLocator

__all__ = [
    "heatmap", "accuracy_by_length", "loss_curves", "plot_runs", "style_cycle", "plain_log_ticks", "PALETTE",
    "LINESTYLES", "MARKERS",
]

# Okabe & Ito's colour-blind-safe colours, ordered so that the first four also differ in lightness
# from their neighbours (CIE L* 46, 71, 0, 70): two or three filled series stay apart in greyscale.
PALETTE = ["#0072B2", "#E69F00", "#000000", "#56B4E9", "#D55E00", "#F0E442", "#009E73", "#CC79A7"]
LINESTYLES = ["-", "--", ":", "-.", (0, (5, 1, 1, 1, 1, 1)), (0, (1, 3)), (0, (8, 2)), (0, (3, 1, 1, 1))]
MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*"]


def style_cycle() -> cycler:
    """The book's property cycle: each series gets its own colour and its own line style."""
    return cycler(color=PALETTE) + cycler(linestyle=LINESTYLES)


class _PlainLogFormatter(LogFormatter):
    """Log-axis tick labels as plain numbers (0.5, 2, 300, 1,000), never 2×10⁰, 3×10² or 2⁻¹⁷;
    which ticks get a label is matplotlib's choice, as for its own log formatter."""

    def _num_to_string(self, x, vmin, vmax):
        if x >= 1 and float(x).is_integer():
            return f"{x:,.0f}"
        if x < 1e-3:  # 0.00001 is hard to count: a power of ten, 10⁻⁵ (other ticks there stay unlabelled)
            exponent = np.log10(x)
            return f"$10^{{{round(exponent)}}}$" if abs(exponent - round(exponent)) < 1e-9 else ""
        return f"{x:.3g}"


def plain_log_ticks(where: Axes | Axis) -> None:
    """Label the log-scaled axes of ``where`` (an axes: both of its axes that are log-scaled; or
    one axis) with plain numbers, major and minor ticks alike."""
    axes = [where] if isinstance(where, Axis) else [where.xaxis, where.yaxis]
    for axis in axes:
        if axis.get_scale() != "log":
            continue
        axis.set_major_formatter(_PlainLogFormatter(base=axis.get_transform().base))
        axis.set_minor_formatter(_PlainLogFormatter(base=axis.get_transform().base, labelOnlyBase=False))


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
    plain_log_ticks(ax.yaxis)
    ax.legend(frameon=False)
    return fig
